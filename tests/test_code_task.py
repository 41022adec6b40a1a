"""The code-completion task's wiring (jaxillusions/tasks/code/__init__.py): its view of a split,
the unigram baseline, its config checks, and an end-to-end tiny sweep on a corpus of Python and
JavaScript files written by the test."""

import csv
import os

import numpy as np
import pytest
from ml_collections import ConfigDict

from jaxillusions import faithfulness, sweep, tasks, validate
from jaxillusions.tasks import code as code_task
from jaxillusions.tasks.code import splits as code_data

CATS = code_data.CATEGORIES


def _split(texts, width, chars=None):
    """A CodeSplit of `texts` labelled by the real lexer (vocabulary: `chars`, default the
    texts' own characters)."""
    vocab = code_data.Vocab(chars or "".join(sorted({c for t in texts for c in t})))
    tokens = np.zeros((len(texts), width), np.int32)
    category = np.full((len(texts), width), -1, np.int8)
    depth = np.zeros((len(texts), width), np.int32)
    for i, text in enumerate(texts):
        cat, dep = code_data.lexer.labels(text, "python")
        tokens[i, : len(text) + 2] = [1, *vocab.encode(text), 2]
        category[i, : len(text)], depth[i, : len(text)] = cat, dep
    return code_data.CodeSplit(tokens, category, depth, np.arange(len(texts), dtype=np.int32),
                               np.array([len(t) for t in texts], np.int32), "python")


def write_corpus(root) -> tuple[str, str]:
    """Python files (functions of varied length and bracket depth) and a JavaScript dir."""
    rng = np.random.default_rng(0)
    py, js = root / "py", root / "js"
    py.mkdir()
    js.mkdir()
    for f in range(24):
        funcs = []
        for j in range(5):
            d = int(rng.integers(1, 5))
            lines = range(1, int(rng.integers(1, 6)))
            body = "".join(f"    x{k} = x{k - 1} * {k}\n" for k in lines)
            funcs.append(f"def f{f}_{j}(x0):\n{body}    return {'h(' * d}x0{')' * d}\n")
        (py / f"m{f}.py").write_text("\n\n".join(funcs))
    for f in range(3):
        (js / f"s{f}.js").write_text("".join(
            f"function g{f}{j}(a) {{ return [a, {j}] }}\n" for j in range(4)))
    return str(py), str(js)


def code_config(root) -> ConfigDict:
    """configs/code_small.py shrunk to seconds: a tiny corpus and model, few steps."""
    from configs import code_small

    py, js = write_corpus(root)
    config = code_small.get_config()
    config.data.update(source=py, other_source=js, context=96, longer_context=160,
                       min_chars=8, num_train=-1, num_eval=-1, iid_fraction=0.3,
                       length_quantile=0.6, depth_quantile=0.7, cache_dir=str(root / "cache"))
    config.model.update(d_model=16, d_mlp=32)
    config.train.update(num_seeds=2, num_steps=30, batch_size=8, warmup_steps=5, log_every=10,
                        eval_every=30, checkpoint_every=30, eval_batch_size=32)
    config.proxies.update(methods=("svd", "onehot_attention"),
                          targets=("blocks.-1.attn.k",), svd_ranks=(1, 4), kmeans_sizes=(2, 4),
                          kmeans_samples=200, kmeans_iters=3, collect_batch_size=32,
                          eval_batch_size=32)
    return config


def test_view_evaluates_every_character_and_bins_brackets_at_closers():
    split = _split(["f(a[1])"], 10)
    view = code_task.view(split)
    # Every character is predicted (positions 0..6); the EOS target and PAD are not.
    np.testing.assert_array_equal(view.evaluated[0], [1] * 7 + [0] * 3)
    c = {name: i for i, name in enumerate(CATS)}
    np.testing.assert_array_equal(
        view.bins["category"][0, :7],
        [c["identifier_first"], c["open_bracket"], c["identifier_first"], c["open_bracket"],
         c["digit"], c["close_bracket"], c["close_bracket"]])
    # Bracket depth only at closing-bracket targets: `]` closes depth 2, `)` depth 1.
    np.testing.assert_array_equal(view.bins["bracket_depth"][0, :7], [-1] * 5 + [2, 1])
    eval_set = faithfulness.make_eval_set({"iid": split}, ["iid"], code_task)
    assert eval_set.breakdowns == ("all", "category", "bracket_depth")
    assert eval_set.per_split == (1, len(CATS), 3)
    assert (eval_set.bins[0, :5, 2] == -1).all()  # outside the bracket_depth breakdown


def test_unigram_baseline_counts_training_targets():
    train, test = _split(["aab", "a"], 6), _split(["bb"], 6, "ab")
    # Training targets a a b a: 'a' is the most frequent; ids 0..5 (PAD BOS EOS UNK a b) are
    # add-one smoothed: p(b) = (1 + 1) / (4 + 6).
    out = code_task.unigram(train, test)
    assert out["unigram_acc"] == 0.0
    assert out["unigram_xent"] == pytest.approx(-np.log(2 / 10))


def test_validate_refuses_dyck_only_options_and_bad_values(tmp_path):
    config = code_config(tmp_path)
    validate.validate(config)
    assert tasks.get(config) is code_task
    for key, value, message in (("train.loss_on", "closing", "the code task needs 'all'"),
                                ("data.iid_fraction", 1.5, "data.iid_fraction"),
                                ("task", "nope", "task='nope'")):
        bad = ConfigDict(config.to_dict())
        node, name = (bad, key) if "." not in key else (bad[key.split(".")[0]],
                                                       key.split(".")[1])
        node[name] = value
        with pytest.raises(ValueError, match=message):
            validate.validate(bad)
    bad = ConfigDict(config.to_dict())
    bad.data.num_types = 3  # a Dyck key
    with pytest.raises(ValueError, match="unknown config key data.num_types"):
        validate.validate(bad)


def test_tiny_code_sweep_end_to_end(tmp_path):
    config = code_config(tmp_path)
    workdir = str(tmp_path / "run")
    sweep.run(config, workdir, verbose=False)
    with open(os.path.join(workdir, "results.csv")) as f:
        rows = list(csv.DictReader(f))
    assert {r["breakdown"] for r in rows} == {"all", "category", "bracket_depth"}
    assert {r["split"] for r in rows} == set(config.proxies.eval_splits)
    data = code_task.load(config, verbose=False)
    for name in config.proxies.eval_splits:
        # Every character target of the split is evaluated, for every seed and proxy...
        n = {int(r["n"]) for r in rows if r["split"] == name and r["breakdown"] == "all"}
        assert n == {int((data[name].category >= 0).sum())}
        # ...and the category bins partition them; bracket_depth counts the closing brackets.
        for breakdown, mask in (("category", data[name].category >= 0),
                                ("bracket_depth", data[name].category == CATS.index(
                                    "close_bracket"))):
            counts = [int(r["n"]) for r in rows if r["split"] == name and r["seed"] == "0"
                      and r["breakdown"] == breakdown and r["method"] == "original"]
            assert sum(counts) == int(mask.sum())
    with open(os.path.join(workdir, "gap_table.txt")) as f:
        text = f.read()
    assert "next-character accuracy" in text and "unigram_acc" in text
    assert "Generalization gap in same_pred by category" in text
    with open(os.path.join(workdir, "baselines.csv")) as f:
        assert [r["split"] for r in csv.DictReader(f)] == list(config.proxies.eval_splits)
    with open(os.path.join(workdir, "gaps_by_category.csv")) as f:
        labels = {r["label"] for r in csv.DictReader(f)}
    assert labels <= set(CATS) and "close_bracket" in labels
    figs = set(os.listdir(os.path.join(workdir, "figures")))
    assert {"same_pred_by_category_svd.png", "same_pred_by_category_onehot_attention.png",
            "accuracy_by_bracket_depth_svd_blocks.1.attn.k.png", "attention_patterns.png"} <= figs
