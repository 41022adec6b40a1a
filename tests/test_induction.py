"""The induction measure (studies/induction.py) on hand-built models whose answer is known."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxillusions import model, tasks
from jaxillusions.pipeline import validate
from jaxillusions.report import load_results, results, tables
from jaxillusions.runtime import schema
from jaxillusions.runtime.tensorboard import SweepWriter, read_scalars
from jaxillusions.studies import induction, stage
from jaxillusions.tasks.code_completion import copying, lexer
from jaxillusions.tasks.minimal_layer import MinimalFirstLayer

V, L, BOS = 12, 8, 1  # vocab, repeat length, BOS token (tokens 0..2 are special)
SPECIAL = (0, 1, 2)
TOKENS = induction.SpecialTokens(exclude=SPECIAL, bos=BOS)


def copier(max_len: int = 1 + 2 * L) -> tuple[model.ModelConfig, dict]:
    """A 2-layer attention-only transformer that copies, built by hand.

    Residual blocks (signed one-hots e_i - e_mirror(i), so every residual vector has mean 0 and
    the same norm, and LayerNorm only rescales): token | position | previous token. Layer 0 is a
    previous-token head (position t attends to t-1 and writes t-1's token into the "previous
    token" block); layer 1 is an induction head (a query of token x attends to the position whose
    previous token is x, and writes that position's token to the logits)."""
    P = max_len
    tok, pos, prev = 0, 2 * V, 2 * V + 2 * P  # block starts; each block is [+ half, - half]
    d = 4 * V + 2 * P
    dh = max(P, V)
    cfg = model.ModelConfig(vocab_size=V, max_len=P, n_layers=2, n_heads=1, d_model=d,
                            d_head=dh, attn_only=True, pos_encoding="learned")
    params = jax.tree.map(jnp.zeros_like, model.init_params(jax.random.key(0), cfg))

    def signed(n, start, width):
        m = np.zeros((n, d))
        m[np.arange(n), start + np.arange(n)] = 1.0
        m[np.arange(n), start + width + np.arange(n)] = -1.0
        return m

    params["embed"] = jnp.asarray(signed(V, tok, V))
    params["pos_embed"] = jnp.asarray(signed(P, pos, P))
    ones = {"scale": jnp.ones(d), "bias": jnp.zeros(d)}
    c0, c1 = math.sqrt(d / 4), math.sqrt(d / 6)  # LayerNorm gains: 4 and 6 nonzero entries
    sharp = 40.0  # attention logit of the intended key; the others get 0

    w_q0, w_k0, w_v0, w_o0 = (np.zeros((d, 1, dh)), np.zeros((d, 1, dh)),
                              np.zeros((d, 1, dh)), np.zeros((1, dh, d)))
    for p in range(P):
        w_q0[pos + p, 0, p] = sharp * math.sqrt(dh) / c0**2
        if p + 1 < P:
            w_k0[pos + p, 0, p + 1] = 1.0  # key of position p answers the query of p+1
    for v in range(V):
        w_v0[tok + v, 0, v] = 1.0
        w_o0[0, v, prev + v], w_o0[0, v, prev + V + v] = 1 / c0, -1 / c0

    w_q1, w_k1, w_v1, w_o1 = (np.zeros((d, 1, dh)), np.zeros((d, 1, dh)),
                              np.zeros((d, 1, dh)), np.zeros((1, dh, d)))
    for v in range(V):
        w_q1[tok + v, 0, v] = sharp * math.sqrt(dh) / c1**2
        w_k1[prev + v, 0, v] = 1.0
        w_v1[tok + v, 0, v] = 1.0
        w_o1[0, v, tok + v], w_o1[0, v, tok + V + v] = 10 / c1, -10 / c1

    for block, (w_q, w_k, w_v, w_o) in zip(params["blocks"], ((w_q0, w_k0, w_v0, w_o0),
                                                               (w_q1, w_k1, w_v1, w_o1)),
                                        strict=True):
        block["ln1"] = ones
        block["attn"].update(w_q=jnp.asarray(w_q), w_k=jnp.asarray(w_k), w_v=jnp.asarray(w_v),
                             w_o=jnp.asarray(w_o))
    params["ln_final"] = ones
    params["unembed"]["w"] = jnp.asarray(3.0 * np.eye(d, V))  # reads the token block's + half
    return cfg, params


def stack(*trees):
    return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def measure(cfg, params, **kw):
    return induction.induction(params, cfg, jax.random.key(7), length=L, batch=16,
                               special=TOKENS, **kw)


def test_copier_has_an_induction_head_in_layer_1_and_uses_it():
    cfg, params = copier()
    # Seed 1: the same model with its induction head's query zeroed (uniform attention there).
    blind = jax.tree.map(lambda x: x, params)
    blind["blocks"][1]["attn"]["w_q"] = jnp.zeros_like(params["blocks"][1]["attn"]["w_q"])
    out = measure(cfg, stack(params, blind), seeds=(10, 11))
    assert out.score.shape == (2, 2, 1)
    assert out.score[0, 1, 0] > 0.95  # the induction head
    assert out.score[0, 0, 0] < 0.01  # the previous-token head attends to q-1, not q-L+1
    assert out.score[1, 1, 0] == pytest.approx(out.chance, abs=1e-4)
    # The copier predicts the repeat (loss ~0) but not the first copy.
    assert out.loss_second[0] < 0.05
    assert out.loss_drop[0] > 1.0
    assert out.loss_drop[1] < out.loss_drop[0] - 1.0
    best = out.seed_rows()
    assert [r["seed"] for r in best] == [10, 11]
    assert (best[0]["best_layer"], best[0]["best_head"]) == (1, 0)
    assert len(out.rows()) == 4


def test_write_gives_csvs_and_tensorboard_scalars_per_seed(tmp_path):
    cfg, params = copier()
    uniform = jax.tree.map(lambda x: x, params)
    uniform["blocks"][1]["attn"]["w_q"] = jnp.zeros_like(params["blocks"][1]["attn"]["w_q"])
    out = measure(cfg, stack(params, uniform), seeds=(3, 5))
    with SweepWriter(str(tmp_path / "tb"), [3, 5]) as writer:
        induction.write(out, str(tmp_path), writer)
    rows = tables.read_csv(str(tmp_path / "induction.csv"))
    assert [(r["seed"], r["layer"], r["head"]) for r in rows] == [
        (3, 0, 0), (3, 1, 0), (5, 0, 0), (5, 1, 0)]
    assert rows[1]["induction_score"] == pytest.approx(out.score[0, 1, 0])
    best = tables.read_csv(str(tmp_path / "induction_seeds.csv"))
    assert [r["seed"] for r in best] == [3, 5]
    assert best[1]["loss_drop"] == pytest.approx(out.loss_drop[1], rel=1e-6)
    board = read_scalars(str(tmp_path / "tb"))
    assert board["seed_3"]["induction/max_score"][0][1] == pytest.approx(out.score[0, 1, 0])
    assert board["seed_5"]["induction/score/layer1_head0"][0][1] == pytest.approx(
        out.chance, abs=1e-4)
    assert board["seed_5"]["induction/loss_drop"][0][1] == pytest.approx(out.loss_drop[1],
                                                                          rel=1e-6)


def test_uniform_attention_scores_chance():
    cfg, params = copier()
    uniform = model.ModelConfig(**{**cfg.__dict__,
                                   "interventions": (model.UniformAttention((0, 1)),)})
    out = measure(uniform, stack(params))
    np.testing.assert_allclose(out.score[0], out.chance, rtol=1e-5)
    # Chance is the mean over the repeat of 1/(q+1): about ln(2)/L, far below a real head.
    q = 1 + L + np.arange(L)
    assert out.chance == pytest.approx(np.mean(1 / (q + 1)))
    assert out.chance < 0.1


def test_an_off_by_one_pattern_scores_zero():
    """Replacing the induction pattern by attention to the first occurrence itself (q - L, not
    q - L + 1) must not count: the score reads exactly the token after the first occurrence."""
    cfg, params = copier()
    T = 1 + 2 * L

    def first_occurrence(site, value):
        if site != "blocks.1.attn.pattern":
            return value
        q = np.arange(T)
        pattern = np.zeros((T, T))
        pattern[q, np.where(q >= 1 + L, q - L, q)] = 1.0
        return jnp.broadcast_to(jnp.asarray(pattern), value.shape)

    out = measure(cfg, stack(params), intervention=first_occurrence)
    assert out.score[0, 1, 0] == 0.0


def test_repeated_tokens_are_distinct_deterministic_and_exclude_special():
    a = induction.repeated_tokens(jax.random.key(3), V, L, 5, TOKENS)
    b = induction.repeated_tokens(jax.random.key(3), V, L, 5, TOKENS)
    np.testing.assert_array_equal(a, b)
    assert a.shape == (5, 1 + 2 * L)
    assert (a[:, 0] == BOS).all()
    np.testing.assert_array_equal(a[:, 1:1 + L], a[:, 1 + L:])
    body = np.asarray(a[:, 1:1 + L])
    assert all(len(set(row)) == L for row in body)
    assert not np.isin(body, SPECIAL).any()
    with pytest.raises(ValueError, match="length=10"):
        induction.repeated_tokens(jax.random.key(3), V, 10, 5, TOKENS)


def test_a_pool_narrows_the_draw_and_the_default_length():
    # The code task's test on identifier characters draws from a pool (less the specials).
    pool = (1, 4, 5, 6, 7, 9, 11)
    names = induction.SpecialTokens(exclude=SPECIAL, bos=BOS, pool=pool)
    np.testing.assert_array_equal(induction.drawable(V, names), [4, 5, 6, 7, 9, 11])
    a = np.asarray(induction.repeated_tokens(jax.random.key(3), V, 3, 50, names))
    body = a[:, 1:4]
    np.testing.assert_array_equal(body, a[:, 4:])
    assert np.isin(body, [4, 5, 6, 7, 9, 11]).all() and all(len(set(r)) == 3 for r in body)
    assert set(body.ravel()) == {4, 5, 6, 7, 9, 11}  # 150 draws reach every id of the pool
    cfg, _ = copier()
    assert induction.default_length(cfg, names) == 3
    with pytest.raises(ValueError, match=r"length=7: must be in \[2, 6\].*a pool of 7"):
        induction.repeated_tokens(jax.random.key(3), V, 7, 5, names)
    with pytest.raises(ValueError, match=r"ids must be in \[0, 12\)"):
        induction.drawable(V, induction.SpecialTokens(pool=(3, 12)))
    # The copier copies whatever it is given: the same head, the same use of the repeat.
    _, params = copier()
    out = induction.induction(stack(params), cfg, jax.random.key(7), length=3, batch=16,
                              special=names)
    assert out.score[0, 1, 0] > 0.95 and out.loss_drop[0] > 1.0


def test_identifier_pool_is_the_vocabularys_name_characters():
    from jaxillusions.tasks.code_completion import splits

    vocab = splits.Vocab(chars="".join(sorted("\n (),:=_abcxyz019")))  # by code point
    ids = copying.identifier_pool(vocab)
    assert vocab.decode(ids) == "019_abcxyz"
    assert all(i >= splits.NUM_SPECIAL for i in ids)
    # The test on identifier characters keeps the code task's special tokens.
    loaded = tasks.get("code").Splits()
    loaded.vocab = vocab
    names = induction.pool_special(tasks.get("code"), "identifier", loaded,
                                   induction.task_tokens("code"))
    assert names.pool == ids
    assert (names.exclude, names.bos) == (tuple(range(splits.NUM_SPECIAL)), splits.BOS)
    assert not set(induction.drawable(vocab.size, names)) & set(names.exclude)


def test_too_long_for_the_model_is_refused():
    cfg, params = copier(max_len=2 * L)
    with pytest.raises(ValueError, match="max_len"):
        measure(cfg, stack(params))


def test_a_batch_whose_probe_cannot_fit_is_refused_at_the_door():
    # Was: induction.batch=1000000000 passed the door, and after training the stage captured
    # 132 GB of tokens as constants and aborted in C++ (exit 134).
    from jaxillusions.configs import dyck_small
    from jaxillusions.training import memory, train

    config = dyck_small.get_config()
    config.cpu_devices = 0  # the test process's devices (conftest.jax_started)
    config.induction.enabled = True
    parsed = validate.parse(config)
    model_cfg = train.model_config(parsed)
    gpu = memory.Machine("gpu", 1, 60 * 2**30, 128 * 2**30, "test GPU")
    memory.check_config(parsed, model_cfg, gpu)  # the default batch, 64 rows, fits
    # Per row: its tokens; per seed trained together, every attention layer's pattern (cached
    # as float32), the float32 log-probabilities and one layer's activations.
    (term,) = [t for t in memory.plan(parsed, model_cfg, 1) if "induction" in t.what]
    mc, seeds = model_cfg, parsed.train.num_seeds

    def per_row(width):
        return width * 4 + seeds * (
            width * (mc.n_layers * mc.n_heads * width + mc.vocab_size) * 4
            + width * (max(mc.n_heads * width, mc.d_mlp) + mc.d_model) * 4)

    # The plan, below the studies' layer, counts the default length from the vocabulary less
    # one special token (the BOS): the stage's width, or up to 2 tokens more (Dyck has 3).
    width = 1 + 2 * induction.default_length(model_cfg, induction.task_tokens("dyck"))
    planned = min(1 + 2 * max(2, min((mc.vocab_size - 1) // 2, (mc.max_len - 1) // 2)),
                  mc.max_len)
    assert width <= planned <= width + 2
    assert term.num_bytes == 64 * per_row(planned)
    huge = parsed.replace(induction={"batch": 10**9})
    with pytest.raises(ValueError, match=r"^induction\.batch=1000000000: needs an estimated "
                                         r".* lower induction\.batch$") as err:
        memory.check_config(huge, model_cfg, gpu)
    assert "\n" not in str(err.value)
    memory.check_config(huge.replace(induction={"enabled": False}), model_cfg, gpu)  # no stage
    config.induction.batch = 10**9  # the door itself, on this machine
    with pytest.raises(ValueError, match=r"^induction\.batch=1000000000: "):
        validate.check(config)


def test_identifier_gap_pairs_repeat_and_first_per_seed_and_split(tmp_path):
    first, repeat = (lexer.CATEGORIES.index(c) for c in ("identifier_first",
                                                         "identifier_repeat"))
    rows = []
    for seed, (a_first, a_repeat) in enumerate([(0.5, 0.8), (0.6, 0.55)]):
        for split in ("iid", "deeper"):
            for b, acc, n in ((first, a_first, 40), (repeat, a_repeat, 90), (0, 0.9, 200)):
                rows.append({"seed": seed, "site": "", "method": "original", "size": 0,
                             "split": split, "breakdown": "category", "bin": b, "n": n,
                             "acc": acc + (split == "deeper") * 0.1})
            rows.append({"seed": seed, "site": "blocks.0.attn.k", "method": "svd", "size": 2,
                         "split": split, "breakdown": "category", "bin": repeat, "n": 90,
                         "acc": 0.1, "jsd": 0.2, "same_pred": 0.3})
    results.tables.write_csv(rows, tmp_path / "results.csv", schema.CSV)
    gap = copying.identifier_gap(load_results(str(tmp_path / "results.csv"),
                                                splits=["iid", "deeper"]))
    assert len(gap) == 4
    by = gap.set_index(["seed", "split"])
    assert by.loc[(0, "iid"), "repeat_minus_first"] == pytest.approx(0.3)
    assert by.loc[(1, "deeper"), "repeat_minus_first"] == pytest.approx(-0.05)
    assert (by["n_first"] == 40).all() and (by["n_repeat"] == 90).all()
    with pytest.raises(ValueError, match="no category rows"):
        copying.identifier_gap(load_results(str(tmp_path / "results.csv"),
                                              splits=["iid", "deeper"]), method="kmeans")


def test_random_models_vmapped_over_seeds_and_the_minimal_first_layer():
    cfg = model.ModelConfig(vocab_size=40, max_len=64, n_layers=2, n_heads=3, d_model=24)
    params = jax.vmap(lambda k: model.init_params(k, cfg))(jax.random.split(jax.random.key(1), 3))
    run = [induction.induction(params, cfg, jax.random.key(2), length=20, batch=4,
                               special=TOKENS) for _ in range(2)]
    np.testing.assert_array_equal(run[0].score, run[1].score)  # deterministic in the key
    assert run[0].score.shape == (3, 2, 3) and ((run[0].score >= 0) & (run[0].score <= 1)).all()
    assert len(run[0].rows()) == 18 and run[0].seeds == (0, 1, 2)
    # Wen et al.'s minimal first layer has no attention: its layer has no score (NaN, no rows).
    cfg = model.ModelConfig(vocab_size=7, max_len=9, n_layers=2, d_model=32, pos_encoding="none",
                            front=MinimalFirstLayer((3, 4), (5, 6), max_depth=2, depth_bins=4))
    params = jax.vmap(lambda k: model.init_params(k, cfg))(jax.random.split(jax.random.key(1), 2))
    out = induction.induction(params, cfg, jax.random.key(2), length=4, batch=4,
                              special=induction.task_tokens("dyck"))
    assert np.isnan(out.score[:, 0]).all() and not np.isnan(out.score[:, 1]).any()
    assert {r["layer"] for r in out.rows()} == {1}
    assert induction.task_tokens("code") == induction.SpecialTokens((0, 1, 2, 3), bos=1)


def test_a_diverged_seed_has_nan_scores_and_no_best_head():
    cfg, params = copier()
    diverged = jax.tree.map(lambda x: jnp.full_like(x, jnp.nan), params)
    out = measure(cfg, stack(params, diverged))
    assert np.isnan(out.score[1]).all() and np.isnan(out.max_score[1])
    assert out.max_score[0] > 0.95
    rows = out.seed_rows()
    assert (rows[1]["best_layer"], rows[1]["best_head"]) == (-1, -1)
    assert math.isnan(rows[1]["max_induction_score"]) and rows[0]["best_layer"] == 1
    assert {r["seed"] for r in out.rows()} == {0}  # a diverged seed has no head rows


def test_default_length_is_half_the_pool_and_fits_the_model():
    cfg, _ = copier()  # vocab 12, 3 special: a pool of 9; max_len 17
    assert induction.default_length(cfg, TOKENS) == 4
    short = model.ModelConfig(**{**cfg.__dict__, "max_len": 7})
    assert induction.default_length(short, TOKENS) == 3  # 1 + 2 * 3 <= 7
    no_bos = induction.SpecialTokens(exclude=SPECIAL)
    assert induction.default_length(short, no_bos) == 3 and induction.default_length(cfg) == 6


def test_head_strength_predicts_the_identifier_repeat_gap_across_seeds(tmp_path):
    """Spearman across seeds between the best head's score and the per-seed same_pred gap on
    identifier_repeat (iid minus the OOD split): +1 where the gap grows with the score, -1
    where it shrinks; other categories and the original model's rows are not read."""
    import pandas as pd

    from jaxillusions.report import stats

    repeat = lexer.CATEGORIES.index("identifier_repeat")
    rows = []
    for seed in range(16):  # stats.MIN_BOOTSTRAP_SEEDS: intervals from 16
        for split, same in (("iid", 0.9), ("deeper", 0.9 - 0.005 * seed),
                            ("other_language", 0.5 + 0.01 * seed)):
            for b, value in ((repeat, same), (0, 0.2 * (seed % 3))):  # bin 0: noise
                rows.append({"seed": seed, "site": "blocks.1.attn.k", "method": "svd",
                             "size": 2, "split": split, "breakdown": "category", "bin": b,
                             "n": 50, "acc": 0.5, "jsd": 0.1, "same_pred": value})
                rows.append({"seed": seed, "site": "", "method": "original", "size": 0,
                             "split": split, "breakdown": "category", "bin": b, "n": 50,
                             "acc": 0.5})
    results.tables.write_csv(rows, tmp_path / "results.csv", schema.CSV)
    df = load_results(str(tmp_path / "results.csv"), splits=["iid", "deeper", "other_language"])
    per_seed = pd.DataFrame({"seed": range(16), "max_induction_score": np.linspace(0.1, 0.8, 16),
                             "loss_drop": np.ones(16)})
    out = copying.head_predicts_gap(df, per_seed, stats).set_index("split")
    assert list(out["method"]) == ["svd", "svd"]
    assert out.loc["deeper", "rho"] == pytest.approx(1.0)  # gap 0.005 * seed
    assert out.loc["other_language", "rho"] == pytest.approx(-1.0)  # gap 0.4 - 0.01 * seed
    assert (out["n_seeds"] == 16).all()
    assert out.loc["deeper", "rho_low"] == pytest.approx(1.0)  # every resample is monotone
    few = copying.head_predicts_gap(df[df["seed"] < 8], per_seed, stats).set_index("split")
    assert few.loc["deeper", "rho"] == pytest.approx(1.0) and np.isnan(few.loc["deeper", "rho_low"])
    assert out.loc["deeper", "p_value"] < 0.01
    with pytest.raises(ValueError, match="strength='nope'"):
        copying.head_predicts_gap(df, per_seed, stats, strength="nope")
    # The causal strength (the best head's ablation drop, induction_seeds.csv's code columns).
    causal = per_seed.assign(ablation_drop_repeat=-per_seed["max_induction_score"])
    out = copying.head_predicts_gap(df, causal, stats, strength="ablation_drop_repeat")
    assert out.set_index("split").loc["deeper", "rho"] == pytest.approx(-1.0)


# --- The code task's analyses: attention on its repeats and head mean-ablation --------------------

REPEAT, FIRST = lexer.IDENT_REPEAT, lexer.IDENT_FIRST


def _loop_code_attention(pattern, tokens, category, pad=0):
    """The per-row loop of benchmarks/induction_curves.py (before the study vectorized it), for
    one head's pattern [N, q, k]: {measure: mean over the queries}, queries."""
    sums, n, prev = dict.fromkeys(copying.CODE_MEASURES[:-1] + ("uniform",), 0.0), 0, []
    width = tokens.shape[1]
    tri = np.tril(np.ones((width, width), bool), -2)
    for p, tok, cat in zip(pattern, tokens, category, strict=True):
        same = tok[:, None] == tok[None, :]
        match = np.zeros_like(same)
        match[1:, 1:] = same[1:, 1:] & same[:-1, :-1]
        match &= tri
        queries = np.flatnonzero((cat == REPEAT) & match.any(1))
        for t in queries:
            j = np.flatnonzero(match[t])
            sums["target_attention"] += p[t, j + 1].sum()
            sums["match_attention"] += p[t, j].sum()
            sums["before_match_attention"] += p[t, j - 1].sum()
            sums["after_target_attention"] += p[t, np.minimum(j + 2, t)].sum()
            sums["uniform"] += len(j) / (t + 1)
            sums["argmax_is_target"] += float(np.isin(p[t, : t + 1].argmax(), j + 1))
        n += len(queries)
        real = np.flatnonzero(tok[1:] != pad) + 1
        prev.append(p[real, real - 1])
    return ({**{k: v / n for k, v in sums.items()},
             "prev_token_attention": float(np.concatenate(prev).mean())}, n)


def test_vectorized_code_attention_equals_the_loop_over_rows_on_random_patterns():
    rng = np.random.default_rng(0)
    n, heads, width = 7, 2, 24
    tokens = rng.integers(4, 7, size=(n, width)).astype(np.int32)  # 3 characters: many matches
    tokens[:, 0] = BOS
    for i, length in enumerate(rng.integers(10, width, size=n)):
        tokens[i, length:] = 0  # PAD tails
    category = rng.integers(-1, len(lexer.CATEGORIES), size=(n, width))
    category[rng.random((n, width)) < 0.4] = REPEAT
    scores = rng.normal(size=(n, heads, width, width)) * 3
    scores = np.where(np.tril(np.ones((width, width), bool)), scores, -np.inf)
    pattern = np.exp(scores - scores.max(-1, keepdims=True))
    pattern /= pattern.sum(-1, keepdims=True)
    match, query = copying.repeat_queries(tokens, category, REPEAT)
    sums = copying.attention_sums(jnp.asarray(pattern, jnp.float32), match, tokens, pad=0)
    counts = copying.query_counts(match, query, tokens, pad=0)
    for h in range(heads):
        want, queries = _loop_code_attention(pattern[:, h], tokens, category)
        assert queries == int(counts["queries"]) > 20
        for k in copying.CODE_MEASURES:
            denominator = counts["real" if k == "prev_token_attention" else "queries"]
            assert float(sums[k][h] / denominator) == pytest.approx(want[k], rel=1e-5), k
        assert float(counts["uniform_sum"] / counts["queries"]) == pytest.approx(want["uniform"])


def _code_rows(batch: int = 12, key: int = 5):
    """The test's repeated sequences as code rows for the copier: tokens [B, 1 + 2L] (BOS,
    L distinct characters, the same again) and their categories (of the next token): the first
    copy's characters identifier_first, the repeat's identifier_repeat, none after the last."""
    tokens = np.array(induction.repeated_tokens(jax.random.key(key), V, L, batch, TOKENS))
    category = np.full(tokens.shape, FIRST)
    category[:, L:2 * L] = REPEAT
    category[:, 2 * L] = -1
    return tokens, category


def _view(tokens, category):
    from jaxillusions.tasks import View

    return View(tokens=tokens, evaluated=category >= 0,
                bins={"category": np.maximum(category, 0).astype(np.int32)},
                num_bins={"category": len(lexer.CATEGORIES)})


def test_the_copier_attends_to_its_repeats_in_code_and_ablating_its_induction_head_breaks_them(
        tmp_path):
    """On code rows that repeat a string, the copier's induction head (layer 1) puts its
    attention on the character after the earlier occurrence (uniform attention would put ~0.1
    there) and its previous-token head on the position before; mean-ablating the induction head
    takes identifier_repeat accuracy from ~1 to ~0 while identifier_first barely moves, which is
    what the per-seed contrast, the CSVs and the seed summary report."""
    cfg, params = copier()
    blind = jax.tree.map(lambda x: x, params)
    blind["blocks"][1]["attn"]["w_q"] = jnp.zeros_like(params["blocks"][1]["attn"]["w_q"])
    both = stack(params, blind)
    tokens, category = _code_rows()
    code = copying.code_attention(both, cfg, tokens, category, batch_size=5, seeds=(10, 11))
    assert code.queries == 12 * (L - 2)  # repeat positions L+2 .. 2L-1 have a bigram match
    target = code.values["target_attention"]
    assert target[0, 1, 0] > 0.95 and target[0, 0, 0] < 0.05
    assert code.values["prev_token_attention"][0, 0, 0] > 0.95
    assert code.uniform_on_target < 0.15 and target[1, 1, 0] == pytest.approx(
        code.uniform_on_target, rel=1e-3)  # the blind head attends uniformly

    means = copying.head_means(both, cfg, tokens, pad=0)
    ablation = copying.head_ablation(both, cfg, means, {"iid": _view(tokens, category)},
                                       labels=lexer.CATEGORIES, seeds=(10, 11))
    assert ablation.heads == ((0, 0), (1, 0))
    acc = ablation.accuracy()  # [seed, none + heads, split, category]
    assert acc[0, 0, 0, REPEAT] > 0.85  # all but the repeat's first character
    assert acc[0, 2, 0, REPEAT] < 0.2  # the induction head ablated
    assert abs(acc[0, 2, 0, FIRST] - acc[0, 0, 0, FIRST]) < 0.2
    found = dataclasses.replace(measure(cfg, both, seeds=(10, 11)),
                                analyses=copying.Analyses(code=code, ablation=ablation))
    np.testing.assert_array_equal(found.best[0], (1, 0))
    repeat, other = ablation.contrast(found.best, "iid")
    assert repeat[0] > 0.7 and repeat[0] - other[0] > 0.5
    np.testing.assert_allclose(repeat, acc[:, 0, 0, REPEAT] - acc[np.arange(2), [2, 2], 0, REPEAT])

    induction.write(found, str(tmp_path))
    seeds = tables.read_csv(str(tmp_path / "induction_seeds.csv"))
    assert list(seeds[0]) == list(induction.SEED_COLUMNS + copying.CODE_SEED_COLUMNS)
    assert seeds[0]["ablation_repeat_minus_other"] == pytest.approx(repeat[0] - other[0])
    assert seeds[0]["code_target_attention"] == pytest.approx(target[0, 1, 0])
    rows = tables.read_csv(str(tmp_path / "induction_code.csv"))
    assert list(rows[0]) == list(copying.CODE_COLUMNS) and len(rows) == 4
    assert [r["best"] for r in rows if r["seed"] == 10] == [0, 1]
    rows = tables.read_csv(str(tmp_path / "induction_ablation.csv"))
    assert list(rows[0]) == list(copying.ABLATION_COLUMNS)
    assert {r["category"] for r in rows} == {"identifier_first", "identifier_repeat"}
    assert len(rows) == 2 * 2 * 2  # seeds x heads x categories with characters, one split
    (best,) = [r for r in rows if r["seed"] == 10 and r["best"] and
               r["category"] == "identifier_repeat"]
    assert (best["layer"], best["head"], best["n"]) == (1, 0, 12 * L)
    assert best["drop"] == pytest.approx(best["acc_original"] - best["acc_ablated"])


def test_the_ablation_vmapped_over_seeds_equals_each_seed_alone():
    """head_means and head_ablation on two seeds at once give each seed's numbers as a plain
    per-seed computation does (model.forward with mean_ablation, numpy counts)."""
    cfg, params = copier()
    noisy = jax.tree.map(lambda x: x + 0.3 * jax.random.normal(jax.random.key(4), x.shape),
                         params)
    both = stack(params, noisy)
    tokens, category = _code_rows(batch=9)
    tokens[3, 12:], category[3, 11:] = 0, -1  # a shorter row: PAD is left out of the means
    means = copying.head_means(both, cfg, tokens, pad=0, batch_size=4)
    ablation = copying.head_ablation(both, cfg, means, {"iid": _view(tokens, category)},
                                       batch_size=4)
    evaluated = category >= 0
    for s in range(2):
        one = jax.tree.map(lambda x, s=s: x[s], both)
        _, cache = model.forward(one, tokens, cfg, cache=["blocks.0.attn.z", "blocks.1.attn.z"])
        real = tokens != 0
        for layer in range(2):
            z = np.asarray(cache[f"blocks.{layer}.attn.z"])[real]  # [positions, head, e]
            np.testing.assert_allclose(means[s, layer], z.mean(0), rtol=1e-4, atol=1e-6)
        for a, head in enumerate([None, (0, 0), (1, 0)]):
            mask = np.zeros((2, 1), bool)
            if head is not None:
                mask[head] = True
            logits, _ = model.forward(one, tokens, cfg,
                                      intervention=copying.mean_ablation(means[s], mask))
            right = np.asarray(logits.argmax(-1)) == np.roll(tokens, -1, 1)
            for c in (FIRST, REPEAT):
                at = evaluated & (category == c)
                assert ablation.correct[s, a, 0, c] == right[at].sum()
                assert ablation.count[0, c] == at.sum()


def test_the_headline_line_on_the_ablation_is_a_paired_difference_over_seeds():
    import pandas as pd

    from jaxillusions.report import stats

    per_seed = pd.DataFrame({"seed": [0, 1, 2, 3], "ablation_drop_repeat": [0.5, 0.6, 0.7, np.nan],
                             "ablation_drop_other": [0.1, 0.1, 0.2, np.nan]})
    line = copying.ablation_line(per_seed, induction.cell)
    mean, low, high = stats.t_interval(np.array([0.4, 0.5, 0.5]))
    assert line.startswith("Best head mean-ablated (iid, 3 seeds): accuracy drop on "
                           "identifier_repeat +0.600 [")
    assert f"paired difference {mean:+.3f} [{low:+.3f}, {high:+.3f}]" in line
    # Two seeds (t = 12.7): the interval of an accuracy drop stops at what a difference of two
    # accuracies can be (it read +0.122 [-1.708, +1.951]).
    line = copying.ablation_line(per_seed.iloc[:2].assign(ablation_drop_repeat=[0.9, -0.5]),
                                 induction.cell)
    assert "identifier_repeat +0.200 [-1.000, +1.000]" in line


def test_the_verdict_counts_heads_by_the_random_test_and_on_code():
    # Seed 0 passes both; 1 copies on code but scores 0.1 on random tokens; 2 attends on code
    # without a 1-nat loss drop; 3 diverged (NaN) and is not counted.
    score = np.array([0.5, 0.1, 0.1, np.nan])
    drop = np.array([1.5, 1.2, 0.5, np.nan])
    on_code = np.array([0.6, 0.35, 0.4, np.nan])
    assert induction.verdict(score, drop) == (
        "1 of 3 seeds by the random-token test (best-head score >= 0.3: 1, loss drop >= 1 nat: "
        "2)")
    code = {"code_target_attention": on_code}
    assert induction.verdict(score, drop, code, tasks.get("code")).endswith(
        ", 2 of 3 with its attention measured on code (on repeated identifiers' induction "
        "targets >= 0.3: 3)")


def test_the_verdict_of_the_code_task_uses_the_loss_drop_on_identifier_characters():
    # Seeds: 0 passes everything; 1 attends on code and copies identifier characters but not
    # random ones; 2 attends on code without copying either; 3 copies identifier characters
    # without attending on code; 4 diverged.
    score = np.array([0.5, 0.1, 0.1, 0.1, np.nan])
    drop = np.array([1.5, 0.8, 0.5, 0.9, np.nan])
    on_code = np.array([0.6, 0.35, 0.4, 0.2, np.nan])
    ident = (np.array([0.4, 0.35, 0.1, 0.2, np.nan]), np.array([2.0, 1.2, 0.6, 1.4, np.nan]))
    columns = {"code_target_attention": on_code, "identifier_max_score": ident[0],
               "identifier_loss_drop": ident[1]}
    assert induction.verdict(score, drop, columns, tasks.get("code")) == (
        "1 of 4 seeds by the random-token test (best-head score >= 0.3: 1, loss drop >= 1 nat: "
        "1), 2 of 4 seeds by the test on identifier characters (best-head score >= 0.3: 2, loss "
        "drop >= 1 nat: 3); code task: 2 of 4 seeds by attention on code and loss drop on "
        "identifier characters (attention on repeated identifiers' induction targets >= 0.3: "
        "3, loss drop >= 1 nat: 3)")


def _stage_context(settings, workdir, healthy):
    """A stage.Context of a run whose training left randomly initialised members."""
    from types import SimpleNamespace

    from jaxillusions.training import train

    splits, model_cfg, _ = train.build(settings)
    params = jax.vmap(lambda k: model.init_params(k, model_cfg))(
        jax.random.split(jax.random.key(0), len(healthy)))
    state = SimpleNamespace(params=params, healthy=np.asarray(healthy),
                            step=np.zeros(len(healthy), np.int32))
    return stage.Context(settings=settings, workdir=str(workdir), say=lambda *a, **k: None,
                          verbose=False, move_aside=None, splits=splits, model_cfg=model_cfg,
                          state=state)


def test_the_stage_on_a_dyck_run_writes_the_probe_alone(tmp_path, cache_dir):
    """The code analyses are the code task's: a Dyck run gets induction.csv and
    induction_seeds.csv (its columns as before), which the stage's outputs cover."""
    import fnmatch
    import os

    from conftest import checked, tiny_config

    config = tiny_config(cache_dir)
    config.induction.enabled = True
    found = induction.run(_stage_context(checked(config), tmp_path, [True, True]))
    assert found.made["induction"]["found"].analyses is None
    csvs = sorted(p for p in os.listdir(tmp_path) if p.endswith(".csv"))
    assert csvs == ["induction.csv", "induction_seeds.csv"]
    assert all(any(fnmatch.fnmatch(p, o) for p in csvs) for o in induction.OUTPUTS)
    assert list(tables.read_csv(str(tmp_path / "induction_seeds.csv"))[0]) == list(
        induction.SEED_COLUMNS)
