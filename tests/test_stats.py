import math

import numpy as np
import pytest
import scipy.stats

from jaxillusions.report import stats, tables


def row(seed, split, *, site="blocks.1.attn.k", method="svd", size=2, breakdown="all", **values):
    base = {"seed": seed, "site": site, "method": method, "size": size, "split": split,
            "breakdown": breakdown, "bin": "", "n": 100, "jsd": 0.01, "same_pred": 0.99,
            "acc_original": 0.95, "acc_proxy": 0.95, "jsd_p95": 0.05, "jsd_p99": 0.1}
    return {**base, **values}


# A hand-built population: same_pred on iid and on unseen_depth for 8 seeds, seed 7 has no
# unseen_depth row (so it is not paired), and a depth-breakdown row that must be ignored.
IID = [0.99, 0.98, 0.995, 0.97, 0.985, 0.99, 0.975, 0.96]
OOD = [0.95, 0.97, 0.990, 0.90, 0.985, 0.93, 0.980]
JSD_IID = [0.010, 0.020, 0.005, 0.030, 0.010, 0.012, 0.020, 0.5]
JSD_OOD = [0.050, 0.030, 0.004, 0.090, 0.011, 0.060, 0.015]


def population():
    rows = [row(s, "iid", same_pred=v, jsd=j, jsd_p99=3 * j) for s, (v, j) in
            enumerate(zip(IID, JSD_IID, strict=True))]
    rows += [row(s, "unseen_depth", same_pred=v, jsd=j, jsd_p99=3 * j) for s, (v, j) in
             enumerate(zip(OOD, JSD_OOD, strict=True))]
    rows.append(row(0, "unseen_depth", breakdown="depth", same_pred=0.0, jsd=1.0))
    return rows


def test_paired_gap_interval_and_seed_count_match_scipy():
    (gap,) = [g for g in stats.gaps(population()) if g["metric"] == "same_pred"]
    diffs = np.array(IID[:7]) - np.array(OOD)  # seed 7 is not paired
    low, high = scipy.stats.t.interval(0.95, len(diffs) - 1, loc=diffs.mean(),
                                       scale=scipy.stats.sem(diffs))
    assert gap["n_seeds"] == 7 and gap["baseline"] == "iid" and gap["split"] == "unseen_depth"
    assert gap["gap"] == pytest.approx(diffs.mean(), abs=1e-12)
    assert (gap["ci_low"], gap["ci_high"]) == pytest.approx((low, high), abs=1e-12)
    assert gap["seeds_positive"] == int((diffs > 0).sum()) == 5  # one tie, one negative
    assert gap["baseline_mean"] == pytest.approx(np.mean(IID[:7]))
    # 7 seeds: too few for a percentile bootstrap (NaN, "n too small" in the report).
    assert math.isnan(gap["boot_low"]) and math.isnan(gap["boot_high"])
    # From MIN_BOOTSTRAP_SEEDS seeds: reproducible, around the mean, near the t interval.
    many = np.resize(diffs, stats.MIN_BOOTSTRAP_SEEDS) + np.linspace(0, 0.01, 16)
    boot = stats.paired_summary(many)
    assert stats.paired_summary(many) == boot
    assert boot["boot_low"] < many.mean() < boot["boot_high"]
    assert boot["boot_high"] - boot["boot_low"] == pytest.approx(
        boot["ci_high"] - boot["ci_low"], rel=0.5)
    assert math.isnan(stats.paired_summary(many[:-1])["boot_low"])


def test_no_interval_from_no_spread_and_none_past_what_a_difference_of_shares_can_be():
    """Two seeds at 16/17 on iid and 19/19 on the split: the same gap in both, a zero-width
    interval that the report starred as an effect; it has no interval now. At 2 seeds t is 12.7:
    a difference of two shares had intervals such as [-1.708, +1.951]; they stop at -1 and 1.
    All exactly 0 (the original model itself) stays the exact point."""
    rows = [row(s, split, same_pred=v, jsd=j) for s in (0, 1) for split, v, j in
            (("iid", 16 / 17, 0.01 * (s + 1)), ("other_language", 1.0, 0.5 * (s + 1)))]
    gaps = {g["metric"]: g for g in stats.gaps(rows)}
    same = gaps["same_pred"]
    assert same["gap"] == pytest.approx(16 / 17 - 1) and same["n_seeds"] == 2
    assert math.isnan(same["ci_low"]) and math.isnan(same["ci_high"])
    assert not tables._verdict({**same, "diff": same["gap"]})
    cell = tables._interval_cell({**same, "diff": same["gap"]}, "diff", 3)
    assert cell.startswith("-0.059 (in every seed)") and "*" not in cell
    wide = stats.paired_summary(np.array([0.9, -0.5]), bounds=(-1.0, 1.0))
    assert (wide["ci_low"], wide["ci_high"]) == (-1.0, 1.0)
    assert stats.paired_summary(np.array([0.9, -0.5]))["ci_high"] > 1  # unbounded metrics
    jsd = gaps["jsd"]  # JSD has no such bound: its interval is the t interval
    assert jsd["ci_low"] < -1 or jsd["ci_high"] - jsd["ci_low"] > 2
    exact = stats.paired_summary(np.zeros(3))
    assert (exact["ci_low"], exact["ci_high"]) == (0.0, 0.0)
    many = stats.paired_summary(np.full(stats.MIN_BOOTSTRAP_SEEDS, 1 / 17))
    assert all(math.isnan(many[k]) for k in ("ci_low", "ci_high", "boot_low", "boot_high"))
    # The summary's sentence says so (it said "no gap beyond ±0.001 shown on any OOD split").
    text, _ = tables.statistics_report(rows, ["iid", "other_language"])
    assert ("svd on blocks.1.attn.k at size 2 is off by the same gap in every seed, so no "
            "interval, on other_language (-0.059).") in tables.summary_of(text)


def test_sign_convention_positive_means_less_faithful_out_of_distribution():
    by_metric = {g["metric"]: g for g in stats.gaps(population())}
    jsd = np.array(JSD_OOD) - np.array(JSD_IID[:7])  # JSD: split minus baseline
    assert by_metric["jsd"]["gap"] == pytest.approx(jsd.mean())
    assert by_metric["jsd"]["seeds_positive"] == int((jsd > 0).sum()) == 5
    assert by_metric["jsd_p99"]["gap"] == pytest.approx(3 * jsd.mean())
    assert by_metric["same_pred"]["gap"] > 0 and by_metric["jsd"]["gap"] > 0
    # A proxy that is MORE faithful out of distribution gets a negative gap in both metrics.
    flipped = [row(s, "iid", same_pred=0.9, jsd=0.2) for s in range(4)]
    flipped += [row(s, "longer", same_pred=0.95 + 0.01 * s, jsd=0.1 - 0.01 * s)
                for s in range(4)]
    signs = {g["metric"]: g["gap"] for g in stats.gaps(flipped)}
    assert signs["same_pred"] < 0 and signs["jsd"] < 0
    # The other baseline is named in every row.
    other = stats.gaps(flipped + [row(s, "iid_with_train") for s in range(4)],
                       baseline="iid_with_train")
    assert {g["baseline"] for g in other} == {"iid_with_train"}
    assert {g["split"] for g in other} == {"iid", "longer"}


def test_proxy_vs_original_is_paired_within_seeds():
    rows = [row(s, "unseen_depth", method="onehot_attention", size=0, acc_original=0.8 + 0.02 * s,
                acc_proxy=0.82 + 0.02 * s + 0.001 * s) for s in range(6)]
    (v,) = stats.proxy_vs_original(rows)
    diffs = 0.02 + 0.001 * np.arange(6)
    assert v["diff"] == pytest.approx(diffs.mean())
    assert v["ci_low"] > 0 and v["seeds_positive"] == 6 and v["n_seeds"] == 6
    text, _ = tables.statistics_report(rows + [row(s, "iid", method="onehot_attention", size=0)
                                               for s in range(6)], ["iid", "unseen_depth"])
    beats = text.split("Where the proxy beats the original")[1].split("\n\n")[0]
    assert "onehot_attention" in beats and "unseen_depth" in beats


def test_spearman_and_bootstrap_interval():
    rng = np.random.default_rng(0)
    x = rng.normal(size=40)
    y = x + rng.normal(size=40)
    rho, low, high, p = stats.spearman_interval(x, y)
    want = scipy.stats.spearmanr(x, y)
    # n = 40: 9,999 random pairings; p = (count + 1) / 10,000, within ~3 Monte Carlo standard
    # errors (0.0015 at p = 0.02) of the asymptotic p.
    assert rho == pytest.approx(want.statistic) and p == pytest.approx(want.pvalue, abs=5e-3)
    assert 0 < low < rho < high <= 1
    assert stats.spearman_interval(x, y) == (rho, low, high, p)  # fixed bootstrap seed
    assert all(math.isnan(v) for v in stats.spearman_interval(x, np.ones(40)))
    # id_predicts_gap uses the task's other in-distribution split (Dyck: iid_with_train) as the
    # predictor when it was evaluated.
    rows = [row(s, "iid_with_train", same_pred=0.9 + 0.002 * s) for s in range(20)]
    rows += [row(s, "iid", same_pred=0.9 + 0.002 * s) for s in range(20)]
    rows += [row(s, "longer", same_pred=0.9 - 0.001 * s) for s in range(20)]
    corr = {c["metric"]: c for c in stats.id_predicts_gap(
        rows, in_distribution=("iid", "iid_with_train"))}
    assert corr["same_pred"]["predictor"] == "iid_with_train"
    assert corr["same_pred"]["rho"] == pytest.approx(1.0)  # higher id, larger gap
    assert corr["same_pred"]["rho_ood"] == pytest.approx(-1.0)
    assert corr["same_pred"]["n_seeds"] == 20
    # Every seed's model equally accurate: no baseline to compute.
    assert math.isnan(corr["same_pred"]["rho_model"]) and math.isnan(corr["same_pred"]["p_model"])


def test_the_models_own_accuracy_is_the_baseline_beside_id_faithfulness():
    """id_predicts_gap's rho_model and p_model: the original model's accuracy on the predictor
    split (no proxy) against the same gap, tested as the proxy's faithfulness is. Planted: the
    gap follows the model's accuracy and the proxy's faithfulness is noise, then the reverse."""
    rng = np.random.default_rng(1)
    n = 12
    noise = rng.permutation(n)
    rows = []
    for s in range(n):  # gap = 0.001 * s on `longer`
        rows.append(row(s, "iid", same_pred=0.99))
        rows.append(row(s, "longer", same_pred=0.99 - 0.001 * s))
        rows.append(row(s, "iid_with_train", same_pred=0.9 + 0.001 * noise[s],
                        acc_original=0.8 + 0.01 * s))
    model_predicts = next(c for c in stats.id_predicts_gap(
        rows, in_distribution=("iid", "iid_with_train")) if c["metric"] == "same_pred")
    assert model_predicts["rho_model"] == pytest.approx(1.0)
    assert model_predicts["p_model"] < 0.01 < 0.05 < model_predicts["p_value"]
    # Given the model's accuracy, the gap is its function: nothing left for faithfulness.
    assert math.isnan(model_predicts["rho_partial"]) and math.isnan(model_predicts["p_partial"])
    for r in rows:  # swap the two: faithfulness follows the gap, the model's accuracy is noise
        if r["split"] == "iid_with_train":
            s = r["seed"]
            r["same_pred"], r["acc_original"] = 0.9 - 0.001 * s, 0.8 + 0.01 * noise[s]
    faithful_predicts = next(c for c in stats.id_predicts_gap(
        rows, in_distribution=("iid", "iid_with_train")) if c["metric"] == "same_pred")
    assert faithful_predicts["rho"] == pytest.approx(-1.0)
    assert faithful_predicts["p_value"] < 0.01 < 0.05 < faithful_predicts["p_model"]
    assert faithful_predicts["rho_partial"] == pytest.approx(-1.0)
    assert faithful_predicts["p_partial"] < 0.01
    # The proxy's own p-value does not depend on the baseline tested beside it.
    alone = stats.spearman_p(np.array([0.9 - 0.001 * s for s in range(n)]),
                             np.array([0.001 * s for s in range(n)]))
    assert faithful_predicts["p_value"] == alone


def test_sign_flip_p_is_exact_at_small_n():
    # 3 positive differences: of the 8 sign patterns only all-positive and all-negative reach
    # |mean| >= 2, so p = 2/8; a NaN seed is dropped; one seed has no test.
    assert stats.sign_flip_p(np.array([1.0, 2.0, 3.0])) == pytest.approx(2 / 8)
    assert stats.sign_flip_p(np.array([1.0, 2.0, np.nan, 3.0])) == pytest.approx(2 / 8)
    assert math.isnan(stats.sign_flip_p(np.array([1.0])))
    # Differences of both signs: the statistic ties |mean| at the observed 0, every pattern
    # is as extreme.
    assert stats.sign_flip_p(np.array([1.0, -1.0])) == pytest.approx(1.0)


def test_bootstrap_ranks_and_stacked_p_values_equal_one_pair_at_a_time(monkeypatch):
    """The report's shortcuts give the very same floats: bootstrap rhos from draw counts equal
    the Pearson r of scipy's rankdata of each resample, centred as textbooks do (ties
    included), and p-values of stacked pairs equal one call per pair (the same permutations
    pair every row), their null drawn in batches as all at once."""
    rng = np.random.default_rng(1)
    x = rng.integers(0, 6, size=20).astype(float)  # many ties, as resamples always have
    y = rng.normal(size=20)
    idx = stats._bootstrap_indices(20)
    rx, ry = (scipy.stats.rankdata(v[idx], axis=-1) for v in (x, y))
    rx, ry = rx - rx.mean(-1, keepdims=True), ry - ry.mean(-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        textbook = (rx * ry).sum(-1) / np.sqrt((rx**2).sum(-1) * (ry**2).sum(-1))
    np.testing.assert_array_equal(stats._bootstrap_rhos(x, y), textbook)
    np.testing.assert_array_equal(stats._spearman_rows(x[idx], y[idx]), textbook)
    assert np.isnan(stats._bootstrap_rhos(x, np.ones(20))).all()  # constant: no rho
    pairs = [(rng.normal(size=n), rng.normal(size=n)) for n in (20, 20, 5, 20)]
    pairs[1] = (pairs[1][0], pairs[1][0] + 0.1 * pairs[1][1])  # a strong one: small p
    want = [stats.spearman_p(a, b) for a, b in pairs]
    assert stats._spearman_ps(pairs, chunk=2) == want
    with monkeypatch.context() as m:  # the null in one batch: scipy draws the same pairings
        m.setattr(stats, "PERMUTATION_BATCH", None)
        assert [stats.spearman_p(a, b) for a, b in pairs] == want
    assert want[1] < 0.01 < max(want)
    rho, low, high, _ = stats.spearman_interval(*pairs[0], with_p=False)
    boot = stats._spearman_rows(pairs[0][0][idx], pairs[0][1][idx])  # the former way
    tail = (1 - stats.CONFIDENCE) / 2
    assert (low, high) == tuple(np.quantile(boot[np.isfinite(boot)], [tail, 1 - tail]))


def test_min_size_per_seed_and_distribution():
    rows = []
    for seed, curve in enumerate([(0.9, 0.995, 1.0), (0.99, 1.0, 1.0), (0.9, 0.95, 0.98)]):
        rows += [row(seed, "iid", size=size, same_pred=v)
                 for size, v in zip((1, 2, 4), curve, strict=True)]
    rows.append(row(0, "iid", method="onehot_attention", size=0))  # not a sized proxy
    per_seed = stats.min_sizes(rows)
    assert [r["min_size"] for r in per_seed[:2]] == [2, 1] and math.isnan(per_seed[2]["min_size"])
    (dist,) = stats.min_size_distribution(per_seed).values()
    assert dist["counts"] == {1: 1, 2: 1, "never": 1} and dist["median"] == 2
    # An even number of seeds: the lower median, an evaluated size (not 1.5).
    (even,) = stats.min_size_distribution(per_seed[:2]).values()
    assert even["median"] == 1


def test_stat_tables_round_trip_through_csv(tmp_path):
    _, stat_tables = tables.statistics_report(population(), ["iid", "unseen_depth"])
    for name, table in stat_tables.items():
        path = str(tmp_path / f"{name}.csv")
        tables.write_csv(table, path, tables.STAT_COLUMNS[name])
        back = tables.read_csv(path)
        assert len(back) == len(table)
        for a, b in zip(table, back, strict=True):
            for k, v in a.items():
                if isinstance(v, float) and math.isnan(v):
                    assert math.isnan(b[k])
                elif isinstance(v, str):
                    assert b[k] == v
                else:
                    assert b[k] == pytest.approx(v, rel=1e-12), (name, k)


def test_a_proportion_of_exactly_1_does_not_stretch_its_interval_with_its_positions():
    """Was: values clipped to 1e-6 before the logit, so one seed at 1.0 among 0.997s (2,000
    positions each) put the lower bound near 0.8. With the positions, the empirical logit
    (p n + 1/2) / (n + 1), computed by hand here; without, the clip, as before."""
    import scipy.special

    values, n = np.array([0.997, 1.0, 0.998, 0.9965]), np.full(4, 2000.0)
    mean, low, high = stats.bounded_interval(values, counts=n)
    logits = scipy.special.logit((values * n + 0.5) / (n + 1))
    half = scipy.stats.t.ppf(0.975, 3) * logits.std(ddof=1) / 2
    assert mean == pytest.approx(values.mean())
    assert (low, high) == pytest.approx(tuple(scipy.special.expit(logits.mean() + [-half, half])))
    assert 0.98 < low < mean < high < 1  # (0.988: 4 seeds, t with 3 degrees of freedom)
    clipped = stats.bounded_interval(values)[1]
    assert clipped < 0.9  # the clip's stretch, for a value that is not a proportion of counts
    assert stats.bounded_interval(np.ones(3), counts=np.full(3, 10.0)) == (1.0, 1.0, 1.0)


def test_t_half_width_equals_scipy_for_every_seed_count():
    """The cached Student-t quantile gives scipy's value exactly, per column and per scalar."""
    rng = np.random.default_rng(0)
    values = rng.normal(size=(6, 40))
    values[rng.random(values.shape) < 0.3] = np.nan  # columns with 0..6 seeds
    n = (~np.isnan(values)).sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        expected = (scipy.stats.t.ppf(0.975, np.maximum(n - 1, 1))
                    * np.sqrt(np.nanvar(values, 0, ddof=1) / n))
    expected = np.where(n > 1, expected, np.nan)
    _, half = stats.t_half_width(values)
    np.testing.assert_array_equal(half, expected)
    for column in range(values.shape[1]):
        np.testing.assert_array_equal(stats.t_half_width(values[:, column])[1], expected[column])


def test_t_half_width_by_hand():
    v = np.array([[1.0, 2.0, 7.0, np.nan], [3.0, np.nan, np.nan, np.nan], [5.0, 6.0, np.nan, 1]])
    mean, half = stats.t_half_width(v)
    np.testing.assert_allclose(mean, [3.0, 4.0, 7.0, 1.0])
    # column 0: n=3, s=2, t(2)=4.302653; column 1: n=2, s=sqrt(8), t(1)=12.706205
    np.testing.assert_allclose(half[0], 4.302652730 * 2 / np.sqrt(3), rtol=1e-6)
    np.testing.assert_allclose(half[1], 12.706204736 * np.sqrt(8) / np.sqrt(2), rtol=1e-6)
    assert np.isnan(half[2]) and np.isnan(half[3])  # a single seed: no interval
    mean_t, half_t = stats.t_half_width(v.T, axis=1)
    np.testing.assert_array_equal(half_t[:2], half[:2])
    # Large n: t_{0.975, 99} = 1.9842170 (scipy.stats.t)
    x = np.random.default_rng(0).normal(size=100)
    _, h = stats.t_half_width(x)
    np.testing.assert_allclose(h, 1.9842170 * x.std(ddof=1) / 10, rtol=1e-6)
    all_nan_mean, all_nan_half = stats.t_half_width(np.full((3, 2), np.nan))
    assert np.isnan(all_nan_mean).all() and np.isnan(all_nan_half).all()


def test_partial_spearman_is_the_textbook_partial_of_the_ranks_with_a_permutation_p():
    """partial_spearman: rho equals the partial correlation formula on Spearman's rhos; p is
    exact (a multiple of 1/n!) up to n = 7 and Freedman-Lane's above; a relation that runs
    only through z is not called real, one beside z is; y a function of z has no partial."""
    rng = np.random.default_rng(3)
    n = 30
    z = rng.normal(size=n)
    x, y = z + rng.normal(size=n), z + rng.normal(size=n)  # related only through z
    rho, p = stats.partial_spearman(x, y, z)
    r = {k: scipy.stats.spearmanr(a, b).statistic for k, (a, b) in
         {"xy": (x, y), "xz": (x, z), "yz": (y, z)}.items()}
    want = (r["xy"] - r["xz"] * r["yz"]) / math.sqrt((1 - r["xz"] ** 2) * (1 - r["yz"] ** 2))
    assert rho == pytest.approx(want, abs=1e-12)
    assert r["xy"] > 0.3 and scipy.stats.spearmanr(x, y).pvalue < 0.05 < p  # through z only
    y_beside = y + 2 * x  # x also acts beside z
    rho, p = stats.partial_spearman(x, y_beside, z)
    assert rho > 0.5 and p < 0.001
    assert stats.partial_spearman(x, y, z) == stats.partial_spearman(x, y, z)  # fixed seed
    small = rng.normal(size=(3, 6))
    _, p = stats.partial_spearman(*small)
    assert abs(p * 720 - round(p * 720)) < 1e-9  # exact: 6! = 720 permutations
    assert all(math.isnan(v) for v in stats.partial_spearman(x, 3 * z + 1, z))
    assert all(math.isnan(v) for v in stats.partial_spearman(x[:3], y[:3], z[:3]))
