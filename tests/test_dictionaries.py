"""Sparse dictionaries against low-rank proxies across seeds (analysis/dictionaries.py): equal
in-distribution faithfulness, quality as a predictor of the gap, and seed dependence."""

import os

import jax
import numpy as np
import pandas as pd
import pytest
from conftest import planted_dictionary

from jaxillusions import settings as run_settings
from jaxillusions.analysis import dictionaries, load_results, stats
from jaxillusions.tasks import dyck


def _row(seed, method, size, split, same_pred, jsd=0.1, **extra):
    return {"seed": seed, "site": "blocks.1.attn.k", "method": method, "size": size,
            "split": split, "breakdown": "all", "bin": -1, "n": 100, "same_pred": same_pred,
            "jsd": jsd, **extra}


def _equal_id_rows():
    """Per seed: SVD rank 2 at iid same_pred 0.9; SAE widths 8 and 16 at 0.7 and 0.9 + 0.01 s,
    so rank 2 matches width 16 on every seed. On `ood` the SVD drops 0.1 + 0.01 s, the SAE
    0.3 - 0.02 s (JSD rises by 0.05 for SVD, 0.02 for the SAE). A jsd-less breakdown row and
    a second site that must not be mixed in."""
    rows = []
    for s in range(5):
        rows += [_row(s, "svd", 2, "iid", 0.9, jsd=0.1),
                 _row(s, "svd", 2, "ood", 0.9 - (0.1 + 0.01 * s), jsd=0.15),
                 _row(s, "sae", 8, "iid", 0.7, jsd=0.1), _row(s, "sae", 8, "ood", 0.1, jsd=0.5),
                 _row(s, "sae", 16, "iid", 0.9 + 0.01 * s, jsd=0.1),
                 _row(s, "sae", 16, "ood", 0.9 + 0.01 * s - (0.3 - 0.02 * s), jsd=0.12),
                 {**_row(s, "sae", 16, "ood", 0.0), "breakdown": "depth", "bin": 1},
                 {**_row(s, "sae", 8, "iid", 0.9), "site": "blocks.0.attn.k"}]
    return rows


def test_equal_id_compares_the_matched_sae_on_every_seed():
    (same_pred, jsd) = sorted(dictionaries.equal_id(pd.DataFrame(_equal_id_rows())),
                              key=lambda r: r["metric"] != "same_pred")
    diffs = np.array([(0.3 - 0.02 * s) - (0.1 + 0.01 * s) for s in range(5)])
    expected = stats.paired_summary(diffs)
    assert (same_pred["site"], same_pred["rank"], same_pred["split"]) == ("blocks.1.attn.k", 2,
                                                                          "ood")
    assert same_pred["dictionary_sizes"] == "16:5" and same_pred["n_seeds"] == 5
    assert same_pred["diff"] == pytest.approx(diffs.mean())
    for key in stats.SUMMARY_COLUMNS:
        assert same_pred[key] == pytest.approx(expected[key], nan_ok=True), key
    assert same_pred["id_max_abs_diff"] == pytest.approx(0.04)
    assert same_pred["id_dictionary"] == pytest.approx(0.92)
    assert same_pred["gap_reference"] == pytest.approx(0.12)
    # JSD gaps are split - baseline: the SAE's 0.02 against the SVD's 0.05.
    assert jsd["diff"] == pytest.approx(0.02 - 0.05) and jsd["seeds_positive"] == 0


def test_equal_id_ties_go_to_the_smaller_size_and_missing_methods_give_nothing():
    rows = [_row(0, "svd", 1, "iid", 0.5), _row(0, "svd", 1, "ood", 0.4),
            _row(0, "sae", 4, "iid", 0.6), _row(0, "sae", 4, "ood", 0.6),
            _row(0, "sae", 2, "iid", 0.4), _row(0, "sae", 2, "ood", 0.0)]
    # Seed 1 has no SAE value in distribution (a diverged seed): it is left out, not matched.
    rows_nan = rows + [_row(1, "svd", 1, "iid", 0.5), _row(1, "svd", 1, "ood", 0.4),
                       _row(1, "sae", 2, "iid", np.nan), _row(1, "sae", 2, "ood", 0.0)]
    (row,) = dictionaries.equal_id(rows_nan, metrics=("same_pred",))
    assert row["dictionary_sizes"] == "2:1" and row["diff"] == pytest.approx(0.4 - 0.1)
    assert row["n_seeds"] == 1
    assert dictionaries.equal_id([r for r in rows if r["method"] == "svd"]) == []
    with pytest.raises(ValueError, match=r"lack the columns \['breakdown'\]"):
        dictionaries.equal_id(pd.DataFrame(rows).drop(columns="breakdown"))


def test_quality_predicts_gap_is_spearman_against_the_gap():
    rng = np.random.default_rng(0)
    fvu = rng.uniform(0.0, 0.5, 20)
    gap = fvu + rng.normal(0, 0.05, 20)  # worse reconstruction, larger gap
    rows = []
    for s in range(20):
        rows += [_row(s, "sae", 8, "iid", 0.9, fvu=fvu[s] + 9, dead=0.1),  # not the predictor
                 _row(s, "sae", 8, "iid_with_train", 0.8, fvu=fvu[s], dead=0.25),
                 _row(s, "sae", 8, "ood", 0.9 - gap[s], fvu=0.7, dead=0.5),
                 _row(s, "svd", 2, "iid", 0.9, fvu=0.2 + s, dead=np.nan),
                 _row(s, "svd", 2, "iid_with_train", 0.9, fvu=0.2 + s, dead=np.nan),
                 _row(s, "svd", 2, "ood", 0.8, fvu=0.3, dead=np.nan)]
    out = dictionaries.quality_predicts_gap(rows, metrics=("same_pred",),
                                            in_distribution=dyck.IN_DISTRIBUTION)
    by = {(r["method"], r["predictor"]): r for r in out}
    # dead is undefined for SVD: no row; constant for the SAE: rho NaN.
    assert set(by) == {("sae", "fvu"), ("sae", "dead"), ("svd", "fvu")}
    row = by[("sae", "fvu")]
    rho, low, high, p = stats.spearman_interval(fvu, gap)
    assert row["predictor_split"] == "iid_with_train" and row["split"] == "ood"
    assert (row["rho"], row["rho_low"], row["rho_high"], row["p_value"]) == pytest.approx(
        (rho, low, high, p))
    assert row["rho"] > 0.8 and row["rho_low"] > 0 and row["n_seeds"] == 20
    assert row["predictor_mean"] == pytest.approx(fvu.mean())
    assert np.isnan(by[("sae", "dead")]["rho"])
    with pytest.raises(ValueError, match=r"lack the predictor columns \['l0'\]"):
        dictionaries.quality_predicts_gap(rows, predictors=("fvu", "l0"))


def test_matched_cosines_undo_a_permutation_and_sign_flips():
    rng = np.random.default_rng(1)
    a = rng.normal(size=(3, 6, 5))
    perm = rng.permutation(6)
    signs = np.array([1, -1, 1, 1, -1, 1])[:, None]
    cos = dictionaries.matched_cosines(a, 2.0 * signs * a[:, perm])
    np.testing.assert_allclose(np.sort(np.abs(cos), -1), 1.0, atol=1e-5)
    assert (cos < 0).sum(-1).tolist() == [2, 2, 2]  # the two flipped rows, signed
    assert dictionaries.share_agreeing(cos, signed=True).tolist() == pytest.approx([4 / 6] * 3)
    assert dictionaries.share_agreeing(cos, signed=False).tolist() == [1.0] * 3
    with pytest.raises(ValueError, match="expected"):
        dictionaries.matched_cosines(a[0], a[0])


def test_unrelated_random_bases_agree_on_almost_none():
    rng = np.random.default_rng(2)
    q = [np.linalg.qr(rng.normal(size=(4, 64, 64)))[0] for _ in range(2)]
    cos = dictionaries.matched_cosines(q[0], q[1])
    assert dictionaries.share_agreeing(cos, signed=False).max() <= 0.02


def test_two_sae_seeds_agree_on_a_planted_dictionary():
    # Two "models" (seeds) x one head, each with its own planted dictionary; width = the number
    # of planted directions. Two keys per seed: most decoder rows match with cosine > 0.9.
    x = np.stack([planted_dictionary(4096, num_dirs=24, seed=s)[0]
                  for s in range(2)])[:, None]  # [S=2, G=1, N, F]
    samples = {"x": x, "valid": np.ones(x.shape[:3], bool)}
    keys = jax.random.split(jax.random.PRNGKey(0), 4).reshape(2, 2, 2)  # [S, 2 fits, key]
    options = (("k", 3), ("steps", 3000), ("lr", 3e-3), ("batch_size", 256))
    rows = dictionaries.sae_seed_match(samples, (24,), options, keys[:, 1:],
                                       keys_a=keys[:, :1])
    assert [(r["seed"], r["head"], r["width"], r["k"]) for r in rows] == [(0, 0, 24, 3),
                                                                         (1, 0, 24, 3)]
    assert min(r["share"] for r in rows) >= 0.8, rows  # measured 0.92 and 0.88
    print("planted dictionary, two SAE keys: share with cosine > 0.9 per seed",
          [round(r["share"], 3) for r in rows])
    with pytest.raises(ValueError, match="exactly one of params_a and keys_a"):
        dictionaries.sae_seed_match(samples, (24,), options, keys[:, 1:])


def test_svd_halves_agree_when_the_spectrum_is_separated_and_not_when_flat():
    rng = np.random.default_rng(3)
    scales = 2.0 ** -np.arange(8)  # well-separated singular values
    separated = rng.normal(size=(2, 1, 4000, 8)) * scales
    flat = rng.normal(size=(2, 1, 4000, 8))  # isotropic: no preferred basis
    valid = np.ones((2, 1, 4000), bool)
    valid[1, 0, -500:] = False  # padding is left out of both halves
    sep = dictionaries.svd_seed_match({"x": separated, "valid": valid}, (2, 8))
    iso = dictionaries.svd_seed_match({"x": flat, "valid": valid}, (8,))
    assert all(r["share"] == 1.0 for r in sep) and len(sep) == 4
    assert max(r["share"] for r in iso) <= 0.5
    print("SVD halves, share with |cosine| > 0.9: separated", [r["share"] for r in sep],
          "isotropic", [r["share"] for r in iso])


def test_seed_match_summary_averages_heads_then_seeds():
    per_seed = [{"seed": s, "site": "k", "method": "sae", "size": 8, "width": 8, "k": 2,
                 "head": h, "n_directions": 8, "share": share, "mean_cos": share}
                for s, shares in enumerate([(0.5, 1.0), (0.25, 0.25), (1.0, 0.5)])
                for h, share in enumerate(shares)]
    (row,) = dictionaries.seed_match_summary(per_seed)
    expected = stats.bounded_interval(np.array([0.75, 0.25, 0.75]))
    assert (row["share"], row["share_low"], row["share_high"]) == pytest.approx(expected)
    assert row["n_seeds"] == 3 and row["threshold"] == 0.9
    assert (row["mean_cos"], row["mean_cos_low"], row["mean_cos_high"]) == pytest.approx(
        stats.t_interval(np.array([0.75, 0.25, 0.75])))


def test_a_sweep_with_sae_writes_the_dictionary_tables(tiny_sweep, sae_sweep):
    # Without sae (the shared tiny sweep: svd and one-hot attention) there is none.
    assert not [f for f in os.listdir(tiny_sweep) if f.startswith("dictionaries")]
    # With it (conftest.sae_sweep: svd and sae of widths 4 and 8 on iid and unseen_depth, two
    # heads, dictionary_match_seeds=1).
    workdir = sae_sweep

    def read(name):
        return pd.read_csv(os.path.join(workdir, f"dictionaries_{name}.csv")).to_dict("records")

    equal = read("equal_id")
    assert {(r["rank"], r["split"], r["metric"]) for r in equal} == {
        (rank, "unseen_depth", m) for rank in (1, 2, 4) for m in ("same_pred", "jsd")}
    assert all(r["n_seeds"] == 2 for r in equal)
    # The same from analysis.load_results' typed DataFrame (categories, an `acc` column).
    again = dictionaries.equal_id(load_results(workdir))
    assert [r["diff"] for r in again] == pytest.approx([r["diff"] for r in equal], nan_ok=True)
    summary = read("seed_match")
    assert {(r["method"], int(r["width"])) for r in summary} == {
        ("sae", 4), ("sae", 8), ("svd", 1), ("svd", 2), ("svd", 4)}  # svd_ranks (1, 2, 4)
    assert all(r["n_seeds"] == 1 and 0 <= r["share"] <= 1 for r in summary)
    per_seed = read("seed_match_per_seed")
    assert {(r["seed"], r["head"]) for r in per_seed} == {(0, 0), (0, 1)}  # first seed only
    # The SVD's top direction of the two halves of a trained model's keys agree (a large
    # leading singular value), a sanity check of the recollected sample.
    assert all(r["share"] == 1.0 for r in per_seed if r["method"] == "svd" and r["size"] == 1)


def test_dictionary_match_seeds_is_a_validated_analysis_key(config):
    from jaxillusions import validate

    config.proxies.dictionary_match_seeds = -1
    with pytest.raises(ValueError, match=r"proxies.dictionary_match_seeds=-1.*>= 0"):
        validate.validate(config)
    config.proxies.dictionary_match_seeds = 0
    validate.validate(config)
    assert run_settings.is_analysis_key("proxies.dictionary_match_seeds")
    # 0: no seed-match analysis, before any collection (nothing else is looked at).
    spec = type("Spec", (), {"method": "sae"})()
    assert dictionaries.seed_match_tables(None, None, [0, 1], None, None, [spec], [None],
                                          config) == {}


def test_results_tables_are_those_the_rows_allow():
    rows = _equal_id_rows()
    assert list(dictionaries.results_tables(rows)) == ["dictionaries_equal_id"]
    with_quality = [{**r, "fvu": 0.1 * r["seed"], "dead": 0.0} for r in rows]
    named = dictionaries.results_tables(with_quality)
    assert list(named) == ["dictionaries_equal_id", "dictionaries_quality"]
    table, columns = named["dictionaries_quality"]
    assert columns == dictionaries.QUALITY_COLUMNS and table and set(table[0]) == set(columns)
    assert dictionaries.results_tables([r for r in rows if r["method"] == "svd"]) == {}
    sae_only = dictionaries.results_tables([r for r in with_quality if r["method"] == "sae"])
    assert list(sae_only) == ["dictionaries_quality"]
