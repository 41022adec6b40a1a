"""The code-completion task's wiring (jaxillusions/tasks/code/__init__.py): its view of a split,
the unigram baseline, and an end-to-end tiny sweep through the shared pipeline."""

import csv
import os
import types

import numpy as np
import pytest
from ml_collections import ConfigDict

from jaxillusions import faithfulness, sweep, tasks, validate
from jaxillusions.tasks import code as code_task

CATS = ("whitespace", "keyword", "identifier_first", "identifier_repeat", "open_bracket",
        "close_bracket", "operator", "digit", "string_or_comment")


def _split(texts, context, chars):
    """A CodeSplit-like record of `texts` with crude categories (enough for the wiring)."""
    from dataclasses import make_dataclass

    rows = len(texts)
    tokens = np.zeros((rows, context + 2), np.int32)
    category = np.full((rows, context + 2), -1, np.int8)
    depth = np.zeros((rows, context + 2), np.int32)
    for i, text in enumerate(texts):
        text = text[:context]
        tokens[i, 0] = 1
        d = 0
        for t, c in enumerate(text):
            tokens[i, t + 1] = 4 + chars.index(c) if c in chars else 3
            cat = (0 if c.isspace() else 4 if c in "([{" else 5 if c in ")]}" else
                   7 if c.isdigit() else 2 if c.isalpha() else 6)
            d += cat == 4
            category[i, t] = cat
            depth[i, t] = d
            d -= cat == 5
        tokens[i, len(text) + 1] = 2
    cls = make_dataclass("CodeSplit", ["tokens", "category", "bracket_depth", "file_id",
                                       "lengths", "language"], frozen=True, eq=False)
    return cls(tokens, category, depth, np.arange(rows, dtype=np.int32),
               np.array([min(len(t), context) for t in texts], np.int32), "python")


def fake_data(text_dir: str) -> types.SimpleNamespace:
    """A stand-in for jaxillusions.tasks.code.splits with the agreed interface."""
    defaults = {"seed": 0, "context": 48, "cache_dir": "", "source_dir": text_dir}

    def load_or_make(dc):
        texts = []
        for name in sorted(os.listdir(dc.source_dir)):
            with open(os.path.join(dc.source_dir, name)) as f:
                texts += [t for t in f.read().split("\n\n") if t.strip()]
        chars = sorted({c for t in texts[: len(texts) * 3 // 4] for c in t})
        vocab = types.SimpleNamespace(chars="".join(chars), size=4 + len(chars))
        n = len(texts) * 3 // 4
        made = {"train": _split(texts[:n], dc.context, chars),
                "iid": _split(texts[n:], dc.context, chars),
                "longer": _split(texts[n:][::-1], dc.context, chars),
                "deeper": _split(texts[:n][:8], dc.context, chars)}
        return made, vocab

    def check(dc):
        if dc.context < 8:
            raise ValueError(f"data.context={dc.context}: must be >= 8")
        return []

    return types.SimpleNamespace(
        CATEGORIES=CATS, SPLITS=code_task.SPLITS, DATA_DEFAULTS=defaults,
        check_data_config=check, load_or_make=load_or_make,
        width=lambda dc: dc.context + 2,
        CodeSplit=_split([], 1, []).__class__)


@pytest.fixture
def fake(tmp_path, monkeypatch):
    src = tmp_path / "src"
    src.mkdir()
    body = ("def add_{i}(a, b):\n    return (a + b) * {i}\n\n"
            "def nest_{i}(x):\n    return [(x[{i}], {{x: [x]}})]\n\n")
    for f in range(3):
        (src / f"m{f}.py").write_text("".join(body.format(i=10 * f + i) for i in range(6)))
    data = fake_data(str(src))
    monkeypatch.setattr(code_task, "_data", lambda: data)
    return data


def code_config(fake) -> ConfigDict:
    from configs import dyck_small

    config = dyck_small.get_config()
    config.task = "code"
    config.data = ConfigDict(dict(fake.DATA_DEFAULTS))
    for key in ("loss_on", "contrastive_weights", "max_position_offset"):
        del config.train[key]
    for key in ("first_layer", "minimal_embedding"):
        del config.model[key]
    config.proxies.eval_splits = code_task.DEFAULT_EVAL_SPLITS
    config.model.d_model, config.model.d_mlp = 16, 32
    config.train.num_seeds, config.train.num_steps = 2, 30
    config.train.batch_size = 8
    config.train.warmup_steps, config.train.log_every = 5, 10
    config.train.eval_every = config.train.checkpoint_every = 30
    config.train.eval_batch_size = 16
    config.proxies.methods = ("svd", "kmeans", "onehot_attention")
    config.proxies.targets = ("blocks.-1.attn.k",)
    config.proxies.svd_ranks = (1, 4)
    config.proxies.kmeans_sizes = (2, 4)
    config.proxies.kmeans_samples = 200
    config.proxies.kmeans_iters = 3
    config.proxies.collect_batch_size = 16
    config.proxies.eval_batch_size = 16
    return config


def test_view_evaluates_every_character_and_bins_brackets_at_closers(fake):
    split = _split(["f(a[1])"], 10, sorted("f(a[1])"))
    view = code_task.view(split)
    # Every character is predicted (positions 0..6), the EOS target and PAD are not.
    np.testing.assert_array_equal(view.evaluated[0], [1] * 7 + [0] * 5)
    np.testing.assert_array_equal(view.bins["category"][0, :7], [2, 4, 2, 4, 7, 5, 5])
    # Bracket depth only at closing-bracket targets: `]` at depth 2, `)` at depth 1.
    np.testing.assert_array_equal(view.bins["bracket_depth"][0, :7], [-1] * 5 + [2, 1])
    eval_set = faithfulness.make_eval_set({"iid": split}, ["iid"], code_task)
    assert eval_set.breakdowns == ("all", "category", "bracket_depth")
    assert eval_set.per_split == (1, len(CATS), 3)
    assert (eval_set.bins[0, :5, 2] == -1).all()


def test_unigram_baseline_counts_training_targets(fake):
    chars = sorted("ab")
    train, test = _split(["aab", "a"], 4, chars), _split(["bb"], 4, chars)
    # train targets: a a b a -> most frequent 'a' (4); smoothed p(b) = (1+1)/(4+3) over the
    # token ids seen (0..5: PAD BOS EOS UNK a b -> 6 ids).
    out = code_task.unigram(train, test)
    assert out["unigram_acc"] == 0.0
    assert out["unigram_xent"] == pytest.approx(-np.log(2 / (4 + 6)))


def test_validate_refuses_dyck_only_options_and_unknown_task(fake):
    config = code_config(fake)
    assert validate.validate(config) == []
    config.train.loss_on = "closing"
    with pytest.raises(ValueError, match="train.loss_on='closing': the code task"):
        validate.validate(config)
    config.train.loss_on = "all"
    config.data.context = 4
    with pytest.raises(ValueError, match="data.context=4"):
        validate.validate(config)
    config.task = "nope"
    with pytest.raises(ValueError, match="task='nope'"):
        validate.validate(config)
    assert tasks.get("code") is code_task


def test_tiny_code_sweep_end_to_end(fake, tmp_path):
    config = code_config(fake)
    workdir = str(tmp_path / "run")
    sweep.run(config, workdir, verbose=False)
    with open(os.path.join(workdir, "results.csv")) as f:
        rows = list(csv.DictReader(f))
    breakdowns = {r["breakdown"] for r in rows}
    assert breakdowns == {"all", "category", "bracket_depth"}
    # The empty other_language split has no rows; the others have every evaluated position.
    assert {r["split"] for r in rows} == {"iid", "longer", "deeper"}
    splits = code_task.load(config, verbose=False)
    for name in ("iid", "deeper"):
        n = [int(r["n"]) for r in rows if r["split"] == name and r["breakdown"] == "all"
             and r["method"] == "original"]
        assert set(n) == {int((splits[name].category >= 0).sum())}
        by_cat = sum(int(r["n"]) for r in rows if r["split"] == name and r["seed"] == "0"
                     and r["breakdown"] == "category" and r["method"] == "original")
        assert by_cat == n[0]
    with open(os.path.join(workdir, "gap_table.txt")) as f:
        text = f.read()
    assert "next-character accuracy" in text and "unigram_acc" in text
    assert "by category" in text
    with open(os.path.join(workdir, "baselines.csv")) as f:
        assert [r["split"] for r in csv.DictReader(f)] == ["iid", "longer", "deeper"]
    assert os.path.exists(os.path.join(workdir, "gaps_by_category.csv"))
    figs = set(os.listdir(os.path.join(workdir, "figures")))
    assert {"same_pred_by_category_svd.png", "same_pred_by_category_kmeans.png",
            "same_pred_by_category_onehot_attention.png", "attention_patterns.png"} <= figs
