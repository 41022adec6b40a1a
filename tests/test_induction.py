"""The induction measure (studies/induction.py) on hand-built models whose answer is known."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxillusions import model
from jaxillusions.report import load_results, results, tables
from jaxillusions.runtime import schema
from jaxillusions.runtime.tensorboard import SweepWriter, read_scalars
from jaxillusions.studies import induction
from jaxillusions.tasks.code_completion import lexer
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


def test_too_long_for_the_model_is_refused():
    cfg, params = copier(max_len=2 * L)
    with pytest.raises(ValueError, match="max_len"):
        measure(cfg, stack(params))


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
    gap = induction.identifier_gap(load_results(str(tmp_path / "results.csv"),
                                                splits=["iid", "deeper"]))
    assert len(gap) == 4
    by = gap.set_index(["seed", "split"])
    assert by.loc[(0, "iid"), "repeat_minus_first"] == pytest.approx(0.3)
    assert by.loc[(1, "deeper"), "repeat_minus_first"] == pytest.approx(-0.05)
    assert (by["n_first"] == 40).all() and (by["n_repeat"] == 90).all()
    with pytest.raises(ValueError, match="no category rows"):
        induction.identifier_gap(load_results(str(tmp_path / "results.csv"),
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
    out = induction.head_predicts_gap(df, per_seed).set_index("split")
    assert list(out["method"]) == ["svd", "svd"]
    assert out.loc["deeper", "rho"] == pytest.approx(1.0)  # gap 0.005 * seed
    assert out.loc["other_language", "rho"] == pytest.approx(-1.0)  # gap 0.4 - 0.01 * seed
    assert (out["n_seeds"] == 16).all()
    assert out.loc["deeper", "rho_low"] == pytest.approx(1.0)  # every resample is monotone
    few = induction.head_predicts_gap(df[df["seed"] < 8], per_seed).set_index("split")
    assert few.loc["deeper", "rho"] == pytest.approx(1.0) and np.isnan(few.loc["deeper", "rho_low"])
    assert out.loc["deeper", "p_value"] < 0.01
    with pytest.raises(ValueError, match="strength='nope'"):
        induction.head_predicts_gap(df, per_seed, strength="nope")
