"""Sparse dictionaries against low-rank proxies across seeds (studies/dictionaries.py): equal
in-distribution faithfulness, quality as a predictor of the gap, and seed dependence."""

import math
import os

import jax
import numpy as np
import pandas as pd
import pytest
from conftest import planted_dictionary

from jaxillusions.pipeline import validate
from jaxillusions.report import load_results, stats
from jaxillusions.runtime import schema
from jaxillusions.studies import dictionaries
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


def test_two_sae_seeds_agree_on_a_planted_dictionary(users_compile_level):
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
    # The SAE's cosine is signed: the bounded interval of (cosine + 1) / 2, mapped back.
    low_high = 2 * np.array(stats.bounded_interval(np.array([0.875, 0.625, 0.875]))) - 1
    assert (row["mean_cos"], row["mean_cos_low"], row["mean_cos_high"]) == pytest.approx(
        low_high)


@pytest.mark.parametrize("method, cosines, low_bound", [
    ("svd", (1.0, 0.95, 0.999, 0.98), 0.0),  # |cosine| in [0, 1]
    ("sae", (1.0, 0.95, 0.999, 0.98), -1.0),  # signed, in [-1, 1]
    ("sae", (-0.2, 0.1, -0.05, 0.3), -1.0)])  # below 0 allowed
def test_seed_match_cosine_intervals_stay_in_the_cosines_range(method, cosines, low_bound):
    """Was: a Student-t interval of the matched cosines, 0.987 [0.916, 1.058] on a tiny run,
    beyond the cosine's range, where the docstring promised a bounded one."""
    per_seed = [{"seed": s, "site": "k", "method": method, "size": 8, "width": 8, "k": 2,
                 "head": 0, "n_directions": 8, "share": 0.5, "mean_cos": c}
                for s, c in enumerate(cosines)]
    (row,) = dictionaries.seed_match_summary(per_seed)
    mean, low, high = row["mean_cos"], row["mean_cos_low"], row["mean_cos_high"]
    assert mean == pytest.approx(np.mean(cosines))
    assert low_bound <= low < mean < high <= 1, (low, mean, high)
    if max(cosines) == 1.0:  # the case the plain t interval got wrong
        assert stats.t_interval(np.array(cosines))[2] > 1


@pytest.mark.slow
def test_a_sweep_with_sae_writes_the_dictionary_tables(tiny_sweep, sae_sweep):
    # Without sae (the shared tiny sweep: svd and one-hot attention) there is none.
    assert not [f for f in os.listdir(tiny_sweep) if f.startswith("dictionaries")]
    # With it (conftest.sae_sweep: svd and sae of widths 4 and 8 on iid and unseen_depth, two
    # heads, dictionaries.match_seeds=1).
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


def test_dictionaries_match_seeds_is_a_validated_analysis_key(config):

    config.dictionaries.match_seeds = -1
    with pytest.raises(ValueError, match=r"dictionaries.match_seeds=-1.*>= 0"):
        validate.validate(config)
    config.dictionaries.match_seeds = 0
    validate.validate(config)
    assert validate.parse({}).is_analysis_key("dictionaries.match_seeds")
    # 0: no seed-match analysis, before any collection (nothing else is looked at).
    from jaxillusions.faithfulness.fit import FittedProxy
    from jaxillusions.faithfulness.specs import ProxySpec

    sae = FittedProxy(ProxySpec("sae", ("blocks.1.attn.k",)), {})
    assert dictionaries.seed_match_tables(None, None, [0, 1], None, None, [sae], config) == {}


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


# ---------------------------------------------------------------------------------------------
# Ratio metrics only where defined (faithfulness/dictionary_metrics.py,
# faithfulness.evaluate.JSD_MIN_POSITIONS)

SPLITS = ("iid", "unseen_depth", "longer")


def _hand_built_sums():
    """The device sums of dictionary_metrics.seed_sums/size_sums for 3 seeds, one size, 3 splits of
    1000 evaluated positions (and tokens), one site of 4 features, as float32 like the device's:
      iid:          CE original 0.5, zero 1.5, proxy 0.7 (ce_score 0.8); KL zero 0.4, proxy 0.1
      unseen_depth: zeroing the site LOWERS the loss (CE zero 0.45 < 0.5): ce_score undefined
      longer:       seed 0's CE zero exceeds the original by 1e-6 nats (float32 rounding of a
                    mean of 0.5 over 1000 positions is about 4e-6): undefined; seeds 1 and 2 as
                    iid but CE proxy 0.9 (ce_score 0.6).
    The site has mean 2 and variance 1 per feature (fvu = err / variance = 0.25), except on
    longer for seed 2, where it is near-constant (variance 1e-6: below the float32 rounding of
    its sums of squares, about 4000 * eps * sqrt(1000) = 0.015)."""
    n, s, k, d = 1000.0, 3, 3, 4
    ce_original = np.full((s, k), 0.5)
    ce_zero = np.array([[1.5, 0.45, 0.5 + 1e-6], [1.5, 0.45, 1.5], [1.5, 0.45, 1.5]])
    ce_proxy = np.array([[0.7, 0.6, 0.9]] * s)[:, None]
    variance = np.ones((s, k))
    variance[2, 2] = 1e-6
    f32 = {"count": np.full((s, k), n), "evaluated": np.full((s, k), n),
           "ce_original": ce_original * n, "ce_zero": ce_zero * n,
           "kl_zero": np.full((s, k), 0.4 * n),
           "sum/x": np.full((s, k, d), 2.0 * n),
           "sumsq/x": ((4.0 + variance) * n)[..., None].repeat(d, -1)}
    size = {"ce_proxy": ce_proxy * n, "kl_proxy": np.full((s, 1, k), 0.1 * n),
            "err/x": np.full((s, 1, k), 0.25 * d * n)}
    as32 = {key: np.asarray(v, np.float32) for key, v in f32.items()}
    return as32, {key: np.asarray(v, np.float32) for key, v in size.items()}


def _hand_built_rows():
    from jaxillusions.faithfulness import dictionary_metrics

    spec = type("Spec", (), {"sites": ("x",)})()
    seed, size = _hand_built_sums()
    values = dictionary_metrics.columns(spec, {}, seed, size)  # [S, R, K, C]
    rows = []
    for s in range(3):
        for k, split in enumerate(SPLITS):
            rows.append({"seed": s, "site": "blocks.1.mlp.out", "method": "transcoder",
                         "size": 16, "split": split, "breakdown": "all", "bin": "", "n": 1000,
                         "jsd": 0.01, "same_pred": 0.9, "acc_original": 0.8,
                         "acc_proxy": 0.8, "jsd_p95": 0.05, "jsd_p99": 0.1,
                         **dict(zip(schema.DICTIONARY_METRICS, values[s, 0, k].tolist(),
                                    strict=True))})
    return rows


def test_a_negative_or_tiny_zero_ablation_denominator_leaves_the_cell_empty(tmp_path):
    """ce_score = (CE_zero - CE_proxy) / (CE_zero - CE_original) with a negative or
    rounding-sized denominator (and fvu of a constant site): the cell is empty in results.csv,
    gap_table.txt says why, and gaps.csv has no row built from it."""
    from jaxillusions.report import results, tables

    rows = _hand_built_rows()
    cell = {(r["seed"], r["split"]): r for r in rows}
    for s in range(3):
        assert cell[(s, "iid")]["ce_score"] == pytest.approx(0.8)
        assert cell[(s, "iid")]["kl_score"] == pytest.approx(0.75)
        assert math.isnan(cell[(s, "unseen_depth")]["ce_score"])  # denominator -0.05 nats
        assert cell[(s, "unseen_depth")]["kl_score"] == pytest.approx(0.75)
    assert math.isnan(cell[(0, "longer")]["ce_score"])  # denominator 1e-6 nats
    assert [cell[(s, "longer")]["ce_score"] for s in (1, 2)] == pytest.approx([0.6, 0.6])
    assert cell[(0, "longer")]["fvu"] == pytest.approx(0.25)
    assert math.isnan(cell[(2, "longer")]["fvu"])  # near-constant: its variance is rounding
    results.write_csv(rows, str(tmp_path / "results.csv"))
    written = {(r["seed"], r["split"]): r for r in _read_csv(tmp_path / "results.csv")
               if r["method"] == "transcoder"}
    assert written[("0", "unseen_depth")]["ce_score"] == "" == written[("0", "longer")]["ce_score"]
    assert written[("2", "longer")]["fvu"] == ""
    assert written[("1", "longer")]["ce_score"] != ""

    back = results.read_csv(str(tmp_path / "results.csv"))
    text, stat_tables = tables.statistics_report(back, list(SPLITS))
    assert ("  ce_score undefined in 4 of 9 cells (seed, proxy, size, split): "
            f"{stats.UNDEFINED_WHY['ce_score']}; 1 gaps over fewer seeds, 1 comparisons without "
            "a gap (no seed defined on both).") in text.splitlines()
    assert (f"  fvu undefined in 1 of 9 cells (seed, proxy, size, split): "
            f"{stats.UNDEFINED_WHY['fvu']}; 1 gaps over fewer seeds, 0 comparisons without a "
            "gap (no seed defined on both).") in text.splitlines()
    assert "kl_score undefined" not in text
    tables.write_csv(stat_tables["gaps"], str(tmp_path / "gaps.csv"), stats.GAP_COLUMNS)
    gaps = {(g["metric"], g["split"]): g for g in tables.read_csv(str(tmp_path / "gaps.csv"))
            if g["baseline"] == "iid"}
    assert ("ce_score", "unseen_depth") not in gaps  # no seed with a defined ce_score there
    assert ("kl_score", "unseen_depth") in gaps
    # On longer only the seeds defined on both sides: 1 and 2 (ce_score), 0 and 1 (fvu).
    assert (gaps[("ce_score", "longer")]["n_seeds"], gaps[("ce_score", "longer")]["gap"]) == (
        2, pytest.approx(0.8 - 0.6))
    assert gaps[("ce_score", "longer")]["baseline_mean"] == pytest.approx(0.8)
    assert gaps[("fvu", "longer")]["n_seeds"] == 2
    assert gaps[("kl_score", "longer")]["n_seeds"] == 3


def _read_csv(path):
    import csv

    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_jsd_quantiles_need_a_position_beyond_them():
    """faithfulness.evaluate._jsd_quantiles: p95 from 20 positions of a split, p99 from 100
    (n (1 - q) >= 1); below, the cell is NaN and the report names the rule."""
    from jaxillusions.faithfulness.evaluate import JSD_MIN_POSITIONS, _jsd_quantiles
    from jaxillusions.report import tables

    assert JSD_MIN_POSITIONS == {"jsd_p95": 20, "jsd_p99": 100}
    for name, n in JSD_MIN_POSITIONS.items():  # the report's reason says so
        assert f"fewer than {n} evaluated positions" in stats.UNDEFINED_WHY[name]
    jsd = np.linspace(0.0, 1.0, 19 + 99 + 100, dtype=np.float32)[None, None]  # [S, R, n]
    split_ids = np.repeat([0, 1, 2], [19, 99, 100])
    q = _jsd_quantiles(jsd, split_ids, 3)[0, 0]  # [split, (p95, p99)]
    assert np.isnan(q[0]).all()  # 19 positions: neither
    assert np.isfinite(q[1, 0]) and np.isnan(q[1, 1])  # 99: p95 only
    assert q[2] == pytest.approx(np.quantile(jsd[0, 0, 118:], [0.95, 0.99]))  # 100: both
    rows = [{**r, "jsd_p99": math.nan if r["split"] == "longer" else r["jsd_p99"]}
            for r in _hand_built_rows()]
    text, stat_tables = tables.statistics_report(rows, list(SPLITS))
    assert any(line.startswith("  jsd_p99 undefined in 3 of 9 cells") and
               stats.UNDEFINED_WHY["jsd_p99"] in line for line in text.splitlines())
    assert not [g for g in stat_tables["gaps"] if g["metric"] == "jsd_p99"
                and g["split"] == "longer"]
