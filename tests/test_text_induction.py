"""The induction study (studies/induction.py) on the text task (tasks/text.py): the hook
special_tokens reads the run's tokenizer (its special tokens, the BOS), the random tokens are
the tokenizer's ids and never a special one, also where a checkpoint's embedding has more rows
than the tokenizer has ids (as Pythia's), and the main job's stage runs on imported tiny GPT-NeoX
checkpoints (the helpers of tests/test_text_task.py: a BPE tokenizer trained here, checkpoints
saved with `transformers`)."""

import pathlib

import jax
import numpy as np
import pytest

pytest.importorskip("tokenizers")

from test_text_task import SOURCES, _neox, _tokenizer  # noqa: E402

from jaxillusions import configs, model  # noqa: E402
from jaxillusions.pipeline import sweep, validate  # noqa: E402
from jaxillusions.report import tables  # noqa: E402
from jaxillusions.studies import induction  # noqa: E402
from jaxillusions.tasks import PAD, _text_copying, text  # noqa: E402

SPECIALS = ("<|pad|>", "<|endoftext|>", "<|mask|>")
PADDING = 20  # rows the checkpoints' embedding has beyond the tokenizer's ids


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """{name: path}: train.txt (four task modules, joined by <|endoftext|>), a BPE tokenizer
    with three special tokens and one added non-special token, and, when torch and
    transformers are installed, two tiny GPT-NeoX checkpoints whose embedding has PADDING rows
    more than the tokenizer's ids."""
    root = tmp_path_factory.mktemp("text_induction")
    out = {"train": str(root / "train.txt"), "tokenizer": str(root / "tokenizer.json"),
           "cache": str(root / "cache"), "root": root}
    pathlib.Path(out["train"]).write_text("\n<|endoftext|>\n".join(
        p.read_text() for p in SOURCES[:4]))
    tok = _tokenizer([out["train"]], out["tokenizer"], specials=SPECIALS)
    # An added token that is text (as Pythia's runs of spaces), not special.
    assert tok.add_tokens(["    "]) == 1
    tok.save(out["tokenizer"])
    out["vocab"] = tok.get_vocab_size()
    return out


def _data(made, **keys) -> text.Data:
    return text.Data(files={"train": (made["train"],)}, tokenizer=made["tokenizer"], **keys)


def test_special_tokens_are_the_tokenizers_specials_pad_and_the_bos(made):
    tok = text.tokenizer(_data(made))
    ids = {t: tok.token_to_id(t) for t in (*SPECIALS, "    ")}
    special = text.special_tokens(_data(made))
    # auto: <|endoftext|> starts the rows; every special token and PAD (id 0) are excluded.
    assert special.bos == ids["<|endoftext|>"]
    assert set(special.exclude) == {PAD, *(ids[t] for t in SPECIALS)}
    assert ids["    "] not in special.exclude  # an added token that is text is drawn
    assert special.pool == tuple(range(made["vocab"]))  # the tokenizer's ids, no more
    # No BOS: the rows start with text, and the special tokens are still never drawn.
    none = text.special_tokens(_data(made, bos=""))
    assert none.bos is None and set(none.exclude) == set(special.exclude)
    # A BOS that is an ordinary token is excluded too.
    word = 100  # a merge of the BPE
    chosen = text.special_tokens(_data(made, bos=tok.id_to_token(word)))
    assert chosen.bos == word and set(chosen.exclude) == set(special.exclude) | {word}
    # The study reads the run's data: the text task's tokens through induction.task_tokens.
    settings = validate.parse(_config(made, ()))
    assert induction.task_tokens(settings) == special
    with pytest.raises(ValueError, match=r"^data.tokenizer: not set"):
        induction.task_tokens("text")  # a name alone: the default data.*, no tokenizer


def test_the_drawn_tokens_are_the_tokenizers_even_where_the_embedding_is_larger(made):
    special = text.special_tokens(_data(made))
    vocab = made["vocab"]
    embedding = vocab + PADDING  # the model's vocab_size, as Pythia's 50304 for 50277 ids
    allowed = sorted(set(range(vocab)) - set(special.exclude))
    np.testing.assert_array_equal(induction.drawable(embedding, special), allowed)
    # Every drawable id once per row (length = all of them): exactly the allowed ones.
    tokens = np.asarray(induction.repeated_tokens(jax.random.key(0), embedding, len(allowed), 8,
                                                  special))
    assert (tokens[:, 0] == special.bos).all()
    for row in tokens[:, 1:]:
        assert sorted(row[:len(allowed)]) == allowed
    with pytest.raises(ValueError, match=rf"must be in \[2, {len(allowed)}\]"):
        induction.repeated_tokens(jax.random.key(0), embedding, len(allowed) + 1, 1, special)
    cfg = model.ModelConfig(vocab_size=embedding, max_len=4 * vocab, n_layers=1, n_heads=1,
                            d_model=8)
    assert induction.default_length(cfg, special) == len(allowed) // 2


def _config(made, pretrained, **keys):
    config = configs.defaults("text")
    config.cpu_devices = 0
    config.data.files = {"train": (made["train"],)}
    config.data.tokenizer = made["tokenizer"]
    config.data.window = 32
    config.data.max_rows = 16
    config.data.cache_dir = made["cache"]
    config.model.pretrained = tuple(pretrained)
    config.proxies.methods = ()  # the induction stage alone after the (skipped) training
    config.proxies.eval_splits = ("iid",)
    config.induction.enabled = True
    config.induction.batch = 8
    config.figures = "none"
    for key, value in keys.items():
        section, name = key.split(".")
        config[section][name] = value
    return config


def test_the_stage_runs_on_imported_checkpoints_with_a_padded_embedding(made, monkeypatch):
    root, vocab = made["root"], made["vocab"]
    paths = [_neox(root / "ckpt" / f"seed{s}", vocab + PADDING, s) for s in (1, 2)]
    drawn = []
    real = induction.repeated_tokens

    def recorded(key, vocab_size, length, batch, special=induction.EVERY_TOKEN):
        out = real(key, vocab_size, length, batch, special)
        drawn.append((vocab_size, np.asarray(out)))
        return out

    monkeypatch.setattr(induction, "repeated_tokens", recorded)
    settings, _ = validate.check(_config(made, paths))
    workdir = root / "run"
    sweep.run(settings, str(workdir), verbose=False)
    special = text.special_tokens(settings.data)
    [(size, tokens)] = drawn  # one test: two members in one chunk
    assert size == vocab + PADDING
    length = (64 - 1) // 2  # the checkpoints' 64 positions, after the BOS
    assert tokens.shape == (8, 1 + 2 * length) and (tokens[:, 0] == special.bos).all()
    body = tokens[:, 1:]
    assert body.max() < vocab and not np.isin(body, special.exclude).any()
    np.testing.assert_array_equal(body[:, :length], body[:, length:])
    seeds = tables.read_csv(str(workdir / "induction_seeds.csv"))
    assert [int(r["seed"]) for r in seeds] == [1, 2]
    assert list(seeds[0]) == [*induction.SEED_COLUMNS, *_text_copying.TEXT_SEED_COLUMNS]
    for row in seeds:
        assert 0 <= float(row["max_induction_score"]) <= 1
        assert np.isfinite(float(row["loss_drop"]))
        # Random weights: no induction head, and no copying (loss drop about 0 nats).
        assert abs(float(row["loss_drop"])) < 0.5
        assert 0 <= float(row["text_target_attention"]) <= float(
            row["text_max_target_attention"]) <= 1
    heads = tables.read_csv(str(workdir / "induction.csv"))
    assert len(heads) == 2 * 2 * 2  # members x layers x heads
    on_text = tables.read_csv(str(workdir / "induction_text.csv"))
    assert list(on_text[0]) == list(_text_copying.TEXT_COLUMNS) and len(on_text) == 2 * 2 * 2
    assert sum(int(r["best"]) for r in on_text) == 2  # each seed's best head of the test


def test_the_attention_on_real_text_is_each_heads_mean_on_the_induction_targets():
    """copying_analyses against a direct average of the attention patterns, over two chunks of
    seeds (the last padded with a copy), with a diverged seed NaN."""
    rng = np.random.default_rng(0)
    rows = rng.integers(3, 9, (6, 16)).astype(np.int32)  # few ids: many repeats
    rows[:, 0] = 1
    rows[0, 10:] = PAD  # padding: neither a query nor a target
    split = text.annotate({"train": rows, "iid": rows}, 9)["iid"]
    cfg = model.ModelConfig(vocab_size=9, max_len=16, n_layers=2, n_heads=2, d_model=16)
    params = jax.vmap(lambda k: model.init_params(k, cfg))(jax.random.split(jax.random.key(3), 3))
    chunks = [(jax.tree.map(lambda x, i=i: x[np.asarray(i)], params), [10 + j for j in i])
              for i in ([0, 1], [2, 2])]
    diverged = np.array([False, True, False])
    found = _text_copying.copying_analyses(chunks, cfg, {"iid": split}, diverged, rows=5,
                                  split_names=["iid"], batch_size=4)
    targets = _text_copying.copy_targets(split)[:5]
    query = np.argwhere(targets >= 0)
    assert found.queries == len(query) > 10 and found.seeds == (10, 11, 12)
    assert all(split.copyable[n, t] == 1 and rows[n, targets[n, t] - 1] == rows[n, t]
               for n, t in query)
    for s in (0, 2):
        one = jax.tree.map(lambda x, s=s: x[s], params)
        _, cache = model.forward(one, rows[:5], cfg, cache=[f"blocks.{i}.attn.pattern"
                                                            for i in range(2)])
        for layer in range(2):
            pattern = np.asarray(cache[f"blocks.{layer}.attn.pattern"])
            want = np.mean([pattern[n, :, t, targets[n, t]] for n, t in query], axis=0)
            np.testing.assert_allclose(found.attention[s, layer], want, rtol=1e-5, atol=1e-6)
    assert np.isnan(found.attention[1]).all()
    assert found.uniform_on_target == pytest.approx(np.mean([1 / (t + 1) for _, t in query]))
    best = np.array([[1, 0], [-1, -1], [0, 1]])
    values = found.seed_values(best)
    assert values["text_target_attention"][0] == found.attention[0, 1, 0]
    assert values["text_max_target_attention"][2] == np.nanmax(found.attention[2])
    assert np.isnan(values["text_target_attention"][1])
    (table, columns), = found.tables(best).values()
    assert len(table) == 2 * 4 and sum(r["best"] for r in table) == 2
    # Its verdict counts the strongest heads on the text against the study's bar.
    tally = induction.Tally(2)
    columns = {"text_max_target_attention": np.array([0.5, 0.1])}
    assert _text_copying.copying_verdict(columns, tally) == (
        "; on real text (iid, copyable tokens): 1 of 2 seeds have a head with >= 0.3 of its "
        "attention on the induction target")
