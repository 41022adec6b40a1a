"""Population statistics over seeds: paired gaps with intervals, and what the papers did not ask.

The unit of evidence is the seed. Two conditions measured on the same seeds (a baseline split
and an OOD split, a proxy and its original model) are compared through per-seed differences,
summarised by their mean, a Student-t 95% interval, a percentile bootstrap 95% interval (fixed
random seed: reruns give the same numbers; only from MIN_BOOTSTRAP_SEEDS seeds up, NaN below,
where a percentile bootstrap over so few seeds is narrower than the t interval) and the number
of seeds whose difference is positive.

Small n: Spearman p-values come from the permutation distribution (exact, over all n!
pairings, up to n = 7; 9,999 fixed-seed random pairings above), never from the asymptotic
approximation (which gives p = 0 for a perfect ranking of 4 seeds; the exact p is 2/24); so do
the sign-flip p-values of paired differences (`sign_flip_p`: exact up to n = 13).

Bounded quantities (accuracy, same_pred, JSD: all in [0, 1]) get `bounded_interval`: a Student-t
interval of the per-seed values on the logit scale, mapped back, so it never leaves [0, 1].

Practical significance: RESOLUTION[metric] is the smallest difference the report treats as real
(float32 rounding of a mean over thousands of positions is orders of magnitude below it); an
interval is flagged only when it excludes 0 by more than that (`verdict`).

Sign convention for gaps: positive always means "less faithful out of distribution":
baseline - split for same_pred, accuracies, ce_score and kl_score, split - baseline for JSD,
its quantiles and fvu.

Input rows are the tidy rows of `faithfulness.evaluate` / results.csv; only `breakdown == "all"`
rows are used.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence

import numpy as np

from jaxillusions.runtime.schema import DICTIONARY_METRICS, PROPORTIONS

# SciPy (about 1 s to import) is imported in the functions that use it: every launch imports
# this module, and only the reports compute statistics, so `--help` and a bad input's one-line
# error do not wait for it.

CONFIDENCE = 0.95
NUM_BOOTSTRAP = 4000
BOOTSTRAP_SEED = 0
# Percentile-bootstrap intervals over seeds only from this many seeds (at 4 seeds they are
# narrower than the t interval, and for Spearman rho often a single point).
MIN_BOOTSTRAP_SEEDS = 16
NUM_PERMUTATIONS = 9999  # Spearman p-values: exact up to n = 7 (7! = 5040 <= 9999 pairings)
# Pairings per batch of a Spearman null: scipy draws the same pairings whatever the batch;
# 1,000 x 8 pairs x 32 seeds fit the cache where all 9,999 at once did not (1.5x faster).
PERMUTATION_BATCH = 1000
# Smallest difference the report calls real, per metric: 0.001 of a proportion (one position
# in a thousand), 1e-4 bits of JSD. Float32 rounding of these means is below 1e-6.
RESOLUTION = {"same_pred": 1e-3, "acc": 1e-3, "acc_proxy": 1e-3, "acc_original": 1e-3,
              "diff": 1e-3, "jsd": 1e-4, "jsd_p95": 1e-4, "jsd_p99": 1e-4,
              "fvu": 1e-3, "ce_score": 1e-3, "kl_score": 1e-3}
_LOGIT_EPS = 1e-6  # per-seed proportions are clipped to [eps, 1 - eps] before the logit
# The dictionary metrics (faithfulness/dictionary_metrics.py) last: only vector proxies have them.
GAP_METRICS = ("same_pred", "jsd", "jsd_p95", "jsd_p99", "fvu", "ce_score", "kl_score")
LOWER_IS_FAITHFUL = ("jsd", "jsd_p95", "jsd_p99", "fvu")  # gap = split - baseline for these
# Why a cell of a derived metric is left empty (NaN) on an `all` row that should have it: the
# rules of faithfulness.evaluate.JSD_MIN_POSITIONS and dictionary_metrics.DENOMINATOR_MARGIN
# (x 1000).
UNDEFINED_WHY = {
    "jsd_p95": "the split has fewer than 20 evaluated positions (none would lie beyond p95)",
    "jsd_p99": "the split has fewer than 100 evaluated positions (none would lie beyond p99)",
    "fvu": "the site's variance on the split is not 1000x its float32 rounding (near-constant)",
    "ce_score": "the zero-ablation denominator CE_zero - CE_original is not positive or not "
                "1000x its float32 rounding",
    "kl_score": "the zero-ablation denominator KL_zero is not 1000x its float32 rounding",
}
SUMMARY_COLUMNS = ("ci_low", "ci_high", "n_seeds", "seeds_positive", "boot_low", "boot_high")
GAP_COLUMNS = ("site", "method", "size", "split", "metric", "gap") + SUMMARY_COLUMNS[:4] + (
    "baseline", "baseline_mean") + SUMMARY_COLUMNS[4:]
PROXY_COLUMNS = ("site", "method", "size", "split", "diff") + SUMMARY_COLUMNS
CORRELATION_COLUMNS = ("site", "method", "size", "split", "metric", "predictor", "baseline",
                       "n_seeds", "rho", "rho_low", "rho_high", "p_value", "rho_ood",
                       "rho_ood_low", "rho_ood_high", "rho_model", "p_model", "rho_partial",
                       "p_partial")
MIN_SIZE_COLUMNS = ("seed", "site", "method", "split", "threshold", "min_size", "max_size")


@functools.cache
def _t_quantile(probability: float, df: int) -> float:
    import scipy.stats  # noqa: PLC0415 - not at a launch's start

    # Reports ask for the same few quantiles hundreds of thousands of times, and each scipy call
    # costs ~50 us; the value is the same float either way.
    return float(scipy.stats.t.ppf(probability, df))


def t_half_width(values: np.ndarray, axis: int = 0, confidence: float = CONFIDENCE
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Mean over `axis` (seeds) ignoring NaN, and the Student-t interval half-width
    t_{n-1} * s / sqrt(n) (n = non-NaN entries; NaN half-width when n < 2: no spread estimate,
    so plots show no bar; both NaN when n == 0). The one Student-t helper of the project."""
    v = np.asarray(values, dtype=np.float64)
    ok = ~np.isnan(v)
    n = ok.sum(axis=axis)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(ok, v, 0.0).sum(axis=axis) / n
        dev = np.where(ok, v - np.expand_dims(mean, axis), 0.0)
        var = (dev**2).sum(axis=axis) / (n - 1)
        df = np.maximum(n - 1, 1)
        if np.ndim(df) == 0:
            t = _t_quantile(0.5 + confidence / 2, int(df))
        else:
            dfs, where = np.unique(df, return_inverse=True)
            t = np.array([_t_quantile(0.5 + confidence / 2, int(d)) for d in dfs])
            t = t[where].reshape(df.shape)
        half = t * np.sqrt(var / n)
    return mean, np.where(n > 1, half, np.nan)


def t_interval(values: np.ndarray, confidence: float = CONFIDENCE,
               bounds: tuple[float, float] = (-math.inf, math.inf)) -> tuple[float, float, float]:
    """(mean, low, high): Student-t interval of the mean of finite `values` (NaN if n < 2),
    clipped to `bounds`, the range the mean can take (e.g. (-1, 1) for a difference of two
    shares: at 2 seeds t is 12.7, and the interval ran to [-1.708, +1.951])."""
    v = np.asarray(values, np.float64)
    v = v[np.isfinite(v)]
    if len(v) == 0:
        return math.nan, math.nan, math.nan
    mean, half = (float(x) for x in t_half_width(v, confidence=confidence))
    return mean, max(mean - half, bounds[0]), min(mean + half, bounds[1])


def bounded_interval(values: np.ndarray, confidence: float = CONFIDENCE,
                     counts: np.ndarray | None = None) -> tuple[float, float, float]:
    """(mean, low, high) of per-seed proportions in [0, 1]: the arithmetic mean, and a
    Student-t interval of the mean logit mapped back, so that low >= 0 and high <= 1. With
    `counts` (each value a share of that many positions) a value is taken as (v n + 1/2) /
    (n + 1) on the logit scale (the empirical logit), so that a seed at exactly 0 or 1 counts
    as half a position from it; without, values are clipped to [1e-6, 1 - 1e-6] (then one seed
    at 1.0 among 0.997s stretched the interval of a proportion down to 0.8). Identical values
    (all seeds 1.0, say) give the point interval; the interval is widened to contain the mean
    if the logit scale's skew put it outside."""
    v = np.asarray(values, np.float64)
    n = None if counts is None else np.asarray(counts, np.float64)[np.isfinite(v)]
    v = v[np.isfinite(v)]
    if len(v) == 0:
        return math.nan, math.nan, math.nan
    mean = float(v.mean())
    if len(v) < 2:
        return mean, math.nan, math.nan
    if np.ptp(v) == 0:
        return mean, mean, mean
    import scipy.special  # noqa: PLC0415 - not at a launch's start

    shares = np.clip(v, _LOGIT_EPS, 1 - _LOGIT_EPS) if n is None else (v * n + 0.5) / (n + 1)
    _, low, high = t_interval(scipy.special.logit(shares), confidence)
    low, high = float(scipy.special.expit(low)), float(scipy.special.expit(high))
    return mean, min(low, mean), max(high, mean)


def pairs_jackknife(matrix: np.ndarray, bounds: tuple[float, float] = (-math.inf, math.inf),
                    confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """(mean, low, high) of a symmetric [S, S] matrix over its S(S-1)/2 pairs of seeds i < j,
    with a Student-t interval (S - 1 degrees of freedom) from the jackknife over seeds: seed i
    left out with every pair it is in, since pairs sharing a seed are not independent (the
    interval reflects the seeds, not the pairs); clipped to `bounds`, the values' range. NaN
    mean below 2 seeds; NaN interval below 3 (one pair has no spread to estimate)."""
    m = np.asarray(matrix, np.float64)
    s = m.shape[0]
    if s < 2:
        return math.nan, math.nan, math.nan
    off = ~np.eye(s, dtype=bool)
    mean = float(m[off].mean())
    if s < 3:
        return mean, math.nan, math.nan
    loo = (m[off].sum() - 2 * np.where(off, m, 0).sum(1)) / ((s - 1) * (s - 2))
    half = _t_quantile(0.5 + confidence / 2, s - 1) * math.sqrt(
        (s - 1) / s * np.sum((loo - loo.mean()) ** 2))
    return mean, max(mean - half, bounds[0]), min(mean + half, bounds[1])


def verdict(row: dict, metric: str | None = None) -> int:
    """+1 / -1 when the row's 95% interval (ci_low, ci_high) lies above / below zero by more
    than RESOLUTION[metric] (default: the row's `metric`), else 0 (rounding is never flagged)."""
    res = RESOLUTION.get(metric or row.get("metric", ""), 0.0)
    return 1 if row["ci_low"] > res else -1 if row["ci_high"] < -res else 0


@functools.lru_cache(maxsize=8)
def _bootstrap_indices(n: int, num: int = NUM_BOOTSTRAP, seed: int = BOOTSTRAP_SEED) -> np.ndarray:
    """[num, n] resampled seed indices; the same for every call with the same n (reproducible
    and independent of the order in which groups are summarised). Drawn once per n (a report
    summarises thousands of groups of the same seeds), read-only."""
    idx = np.random.default_rng([seed, n]).integers(n, size=(num, n))
    idx.flags.writeable = False
    return idx


def paired_summary(diffs: np.ndarray, confidence: float = CONFIDENCE,
                   bounds: tuple[float, float] = (-math.inf, math.inf)) -> dict:
    """Summary of per-seed paired differences (NaN entries dropped).

    Returns mean, ci_low/ci_high (Student-t, clipped to `bounds`), boot_low/boot_high
    (percentile bootstrap over seeds; NaN below MIN_BOOTSTRAP_SEEDS seeds), n_seeds and
    seeds_positive (seeds whose difference is > 0). Differences that are the same nonzero value
    in every seed (a few positions per seed: 16/17 against 19/19 in both) have no spread to
    estimate an interval from: NaN (the bootstrap's too), never a zero-width interval read as an
    effect; all exactly 0 (the original model itself) is the point interval [0, 0].
    """
    d = np.asarray(diffs, np.float64)
    d = d[np.isfinite(d)]
    mean, low, high = t_interval(d, confidence, bounds)
    spread = not (len(d) > 1 and mean != 0 and np.ptp(d) <= 1e-9 * np.abs(d).max())  # (rounding)
    if not spread:
        low = high = math.nan
    boot_low = boot_high = math.nan
    if len(d) >= MIN_BOOTSTRAP_SEEDS and spread:
        means = d[_bootstrap_indices(len(d))].mean(axis=1)
        tail = (1 - confidence) / 2
        boot_low, boot_high = (float(x) for x in np.quantile(means, [tail, 1 - tail]))
    return {"mean": mean, "ci_low": low, "ci_high": high, "boot_low": boot_low,
            "boot_high": boot_high, "n_seeds": len(d), "seeds_positive": int((d > 0).sum())}


def by_seed(rows: Iterable[dict]) -> dict[tuple, dict[int, dict]]:
    """{(site, method, size, split): {seed: row}} for the `all` breakdown."""
    out: dict[tuple, dict[int, dict]] = defaultdict(dict)
    for r in rows:
        if r["breakdown"] == "all":
            out[(r["site"], r["method"], r["size"], r["split"])][r["seed"]] = r
    return out


def _paired(base: dict[int, dict], other: dict[int, dict], metric: str
            ) -> tuple[np.ndarray, np.ndarray]:
    """Values of `metric` on the seeds present in both, in seed order (NaN where a row lacks
    it)."""
    seeds = sorted(set(base) & set(other))
    return (np.array([base[s].get(metric, math.nan) for s in seeds], np.float64),
            np.array([other[s].get(metric, math.nan) for s in seeds], np.float64))


def signed_gap(baseline: np.ndarray, split: np.ndarray, metric: str) -> np.ndarray:
    """Per-seed gap, positive = less faithful on `split` than on the baseline."""
    return split - baseline if metric in LOWER_IS_FAITHFUL else baseline - split


def gap_bounds(metric: str) -> tuple[float, float]:
    """The range a `signed_gap` of `metric` can take, for its interval: (-1, 1) for a share
    (same_pred, accuracies), unbounded otherwise (JSD in bits)."""
    return (-1.0, 1.0) if metric in PROPORTIONS else (-math.inf, math.inf)


def gaps(rows: Iterable[dict], baseline: str = "iid",
         metrics: Sequence[str] = GAP_METRICS) -> list[dict]:
    """One row per (site, method, size, split, metric) with split != baseline: the paired gap
    over seeds (columns GAP_COLUMNS; `gap` is the mean per-seed gap, baseline_mean the
    baseline's mean on the same seeds).

    Only seeds where the metric is defined (not NaN) on both the baseline and the split enter
    (n_seeds counts them): a cell left undefined (a ratio metric whose denominator is
    rounding, a JSD quantile of too few positions, see faithfulness/dictionary_metrics.py and
    faithfulness/evaluate.py) contributes to no gap. A comparison with no such seed has no row:
    a metric that the rows do not have, or have as NaN only (the dictionary metrics of a pattern
    proxy), is left out."""
    table = by_seed(rows)
    out = []
    for (site, method, size, split), per_seed in sorted(table.items()):
        base = table.get((site, method, size, baseline))
        if split == baseline or base is None:
            continue
        for metric in metrics:
            b, s = _paired(base, per_seed, metric)
            both = np.isfinite(b) & np.isfinite(s)
            if not both.any():
                continue
            b, s = b[both], s[both]
            summary = paired_summary(signed_gap(b, s, metric), bounds=gap_bounds(metric))
            out.append({"site": site, "method": method, "size": size, "split": split,
                        "metric": metric, "gap": summary["mean"], "baseline": baseline,
                        "baseline_mean": float(b.mean()),
                        **{k: summary[k] for k in SUMMARY_COLUMNS}})
    return out


def undefined_cells(rows: Iterable[dict], gap_rows: Sequence[dict], baseline: str = "iid"
                    ) -> dict[str, dict]:
    """Per metric of UNDEFINED_WHY that some `all` row leaves empty: {"cells": `all` rows
    (seed, proxy, size, split) of the proxies that report the metric, "undefined": those NaN,
    "fewer_seeds": gaps against `baseline` over fewer seeds than the population,
    "no_gap": (proxy, size, split) with rows on both sides but no seed defined on both, hence
    no gap}. A proxy reports a dictionary metric when any of its rows has one (pattern
    proxies have none); every proxy reports the JSD quantiles. Metrics without undefined
    cells are left out."""
    table = by_seed(rows)
    num_seeds = len({seed for per_seed in table.values() for seed in per_seed})
    columns = {k for per_seed in table.values() for r in per_seed.values() for k in r}
    out = {}
    for metric in UNDEFINED_WHY:
        if metric not in columns:  # rows without the column (hand-made tables) say nothing
            continue
        families = {key[:2] for key, per_seed in table.items()
                    if metric not in DICTIONARY_METRICS or any(
                        math.isfinite(r.get(m, math.nan)) for r in per_seed.values()
                        for m in DICTIONARY_METRICS)}
        cells = [r for key, per_seed in table.items() if key[:2] in families
                 for r in per_seed.values()]
        undefined = sum(not math.isfinite(r.get(metric, math.nan)) for r in cells)
        if not undefined:
            continue
        mine = [g for g in gap_rows if g["metric"] == metric and g["baseline"] == baseline]
        have = {(g["site"], g["method"], g["size"], g["split"]) for g in mine}
        no_gap = sum(1 for key in table if key[:2] in families and key[3] != baseline
                     and (*key[:3], baseline) in table and key not in have)
        out[metric] = {"cells": len(cells), "undefined": undefined, "no_gap": no_gap,
                       "fewer_seeds": sum(g["n_seeds"] < num_seeds for g in mine)}
    return out


def proxy_vs_original(rows: Iterable[dict]) -> list[dict]:
    """acc_proxy - acc_original per (site, method, size, split), paired within each seed.
    Positive: the simplified model predicts the true next token more often than the model it
    simplifies (Friedman et al.'s observation for one-hot attention)."""
    out = []
    for (site, method, size, split), per_seed in sorted(by_seed(rows).items()):
        diff = np.array([r["acc_proxy"] - r["acc_original"] for _, r in sorted(per_seed.items())])
        summary = paired_summary(diff, bounds=(-1.0, 1.0))
        out.append({"site": site, "method": method, "size": size, "split": split,
                    "diff": summary["mean"], **{k: summary[k] for k in SUMMARY_COLUMNS}})
    return out


def _spearman_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Spearman correlation of each row pair of x, y [B, n] (NaN where a row is constant)."""
    import scipy.stats  # noqa: PLC0415 - not at a launch's start

    return _pearson_rows(scipy.stats.rankdata(x, axis=-1), scipy.stats.rankdata(y, axis=-1))


@functools.lru_cache(maxsize=8)
def _draw_counts(n: int) -> np.ndarray:
    """[NUM_BOOTSTRAP, n]: how often each resample of _bootstrap_indices(n) draws each seed."""
    idx = _bootstrap_indices(n)
    rows = np.arange(len(idx))[:, None] * n
    counts = np.bincount((rows + idx).ravel(), minlength=len(idx) * n).reshape(len(idx), n)
    counts = counts.astype(np.float64)
    counts.flags.writeable = False
    return counts


def _bootstrap_rhos(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """_spearman_rows(x[idx], y[idx]) for finite x, y [n] and idx = _bootstrap_indices(n): the
    same floats, without ranking each resample. A value drawn c times among draws of equal
    values, b draws below them, ranks b + (c + 1) / 2, so a resample's ranks of the n values
    are its draw counts [B, n] times a fixed [n, n] matrix (1 for a value below, 1/2 for an
    equal one) plus 1/2, and its sums over draws are sums over values weighted by the counts;
    all integers, halves and quarters, exact in float64 as rankdata's are."""
    counts = _draw_counts(len(x))

    def ranks(v: np.ndarray) -> np.ndarray:
        return counts @ ((v[:, None] < v[None, :]) + 0.5 * (v[:, None] == v[None, :])) + 0.5

    return _pearson_rows(ranks(x), ranks(y), counts)


def _pearson_rows(rx: np.ndarray, ry: np.ndarray, counts: np.ndarray | None = None
                  ) -> np.ndarray:
    """Pearson correlation of each row pair of rx, ry [..., n], each row the average ranks of
    n values (rankdata's; NaN where a row is constant or NaN). Ranks of n values sum to
    n (n + 1) / 2, so a centred sum of products is the plain one less n ((n + 1) / 2)^2: both
    exact in float64 (integers and halves, their products quarters), hence the same bits as
    the centred form's, in three passes that make no [..., n] temporaries (the permutation
    test's null takes NUM_PERMUTATIONS x pairs x n). `counts` [..., n]: each value's weight,
    the draws of it in a bootstrap resample (_bootstrap_rhos; n draws in all)."""
    n = rx.shape[-1]
    centre = n * ((n + 1) / 2) ** 2

    def products(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        if counts is None:
            return np.einsum("...i,...i->...", a, b) - centre
        return np.einsum("...i,...i,...i->...", counts, a, b) - centre

    with np.errstate(invalid="ignore", divide="ignore"):
        return products(rx, ry) / np.sqrt(products(rx, rx) * products(ry, ry))


def spearman_p(x: np.ndarray, y: np.ndarray) -> float | np.ndarray:
    """Two-sided permutation p-value of Spearman rho: exact (all n! pairings) when
    n! <= NUM_PERMUTATIONS, else NUM_PERMUTATIONS random pairings (fixed seed). Ranks
    commute with permutations, so each pairing's rho is the Pearson r of the ranks so paired:
    the data are ranked once, not per pairing (the same values; ranking was 90% of the time).
    x, y [n] -> a float; [B, n] -> the B p-values [B], each as its own call would give (every
    row is paired by the same permutations, drawn once: a report tests hundreds of pairs)."""
    import scipy.stats  # noqa: PLC0415 - not at a launch's start

    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    result = scipy.stats.permutation_test(
        tuple(scipy.stats.rankdata(v, axis=-1) for v in (x, y)),
        lambda a, b, axis: _pearson_rows(a, b), permutation_type="pairings", vectorized=True,
        n_resamples=NUM_PERMUTATIONS, batch=PERMUTATION_BATCH, alternative="two-sided", axis=-1,
        rng=np.random.default_rng(BOOTSTRAP_SEED))
    return float(result.pvalue) if x.ndim == 1 else np.asarray(result.pvalue, np.float64)


def partial_spearman(x: np.ndarray, y: np.ndarray, z: np.ndarray) -> tuple[float, float]:
    """(rho, p): the partial Spearman correlation of x and y given z (the Pearson r of x's and
    y's ranks, each less its least-squares line in z's ranks) and its two-sided permutation
    p-value by Freedman and Lane: y's residuals permuted and added back to its line in z, the
    partial r refitted. Exact over all n! permutations when n! <= NUM_PERMUTATIONS, else
    NUM_PERMUTATIONS random ones (fixed seed), the observed counted once: (count + 1) /
    (NUM_PERMUTATIONS + 1). NaN when a residual is zero (x or y a function of z's ranks) or
    below 4 values."""
    import scipy.stats  # noqa: PLC0415 - not at a launch's start

    n = len(x)
    if n < 4:
        return math.nan, math.nan
    rx, ry, rz = (scipy.stats.rankdata(v) for v in (x, y, z))
    design = np.stack([np.ones(n), rz], axis=1)
    residual = np.eye(n) - design @ np.linalg.pinv(design)  # I - hat matrix: symmetric
    ex, ey = residual @ rx, residual @ ry
    scale = float(rx.max()) * n * 1e-12  # ranks are at least 1
    if np.linalg.norm(ex) <= scale or np.linalg.norm(ey) <= scale:
        return math.nan, math.nan

    def partial_r(e: np.ndarray) -> np.ndarray:  # e [B, n]: residuals of permuted y's
        e = e @ residual
        return (e @ ex) / (np.linalg.norm(e, axis=-1) * np.linalg.norm(ex))

    rho = float(partial_r(ey[None])[0])
    exact, order = _orderings(n)
    count = int(np.sum(np.abs(partial_r(ey[order])) >= abs(rho) * (1 - 1e-12)))
    return rho, count / len(order) if exact else (count + 1) / (len(order) + 1)


@functools.cache
def _orderings(n: int) -> tuple[bool, np.ndarray]:
    """(exact, orderings [B, n] of range(n)): all n! when n! <= NUM_PERMUTATIONS, else
    NUM_PERMUTATIONS random ones (fixed seed); drawn once per n for every test of a report."""
    if math.factorial(n) <= NUM_PERMUTATIONS:
        order = np.array(list(itertools.permutations(range(n))))
    else:
        order = np.random.default_rng(BOOTSTRAP_SEED).permuted(
            np.broadcast_to(np.arange(n), (NUM_PERMUTATIONS, n)), axis=1)
    order.flags.writeable = False
    return math.factorial(n) <= NUM_PERMUTATIONS, order


def sign_flip_p(diffs: np.ndarray) -> float:
    """Two-sided permutation p-value of a zero mean of per-seed paired differences, each seed's
    sign flipped: exact (all 2^n sign patterns) when 2^n <= NUM_PERMUTATIONS, else
    NUM_PERMUTATIONS random patterns (fixed seed). NaN entries dropped; NaN below 2 seeds."""
    import scipy.stats  # noqa: PLC0415 - not at a launch's start

    d = np.asarray(diffs, np.float64)
    d = d[np.isfinite(d)]
    if len(d) < 2:
        return math.nan
    return float(scipy.stats.permutation_test(
        (d,), np.mean, permutation_type="samples", n_resamples=NUM_PERMUTATIONS,
        alternative="two-sided", rng=np.random.default_rng(BOOTSTRAP_SEED)).pvalue)


def _spearman_ps(pairs: Sequence[tuple[np.ndarray, np.ndarray]], chunk: int = 8
                 ) -> list[float]:
    """spearman_p of each (x, y) pair, those of one length stacked into one call per `chunk`
    pairs (the null distribution of a chunk: NUM_PERMUTATIONS x chunk x n floats)."""
    out = [math.nan] * len(pairs)
    by_length: dict[int, list[int]] = defaultdict(list)
    for i, (x, _) in enumerate(pairs):
        by_length[len(x)].append(i)
    for index in by_length.values():
        for start in range(0, len(index), chunk):
            part = index[start:start + chunk]
            ps = spearman_p(np.stack([pairs[i][0] for i in part]),
                            np.stack([pairs[i][1] for i in part]))
            for i, p in zip(part, ps, strict=True):
                out[i] = float(p)
    return out


def spearman_interval(x: np.ndarray, y: np.ndarray, confidence: float = CONFIDENCE,
                      with_p: bool = True) -> tuple[float, float, float, float]:
    """(rho, low, high, p): Spearman rho across seeds, a percentile-bootstrap interval (seeds
    resampled; resamples where either variable is constant are dropped; NaN below
    MIN_BOOTSTRAP_SEEDS seeds) and the permutation p-value (`spearman_p`; NaN if not
    `with_p`)."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return math.nan, math.nan, math.nan, math.nan
    rho = float(_spearman_rows(x, y))
    low = high = math.nan
    if len(x) >= MIN_BOOTSTRAP_SEEDS:
        idx = _bootstrap_indices(len(x))
        finite = np.isfinite(x).all() and np.isfinite(y).all()  # (rankdata propagates NaN)
        boot = _bootstrap_rhos(x, y) if finite else _spearman_rows(x[idx], y[idx])
        boot = boot[np.isfinite(boot)]
        tail = (1 - confidence) / 2
        if len(boot):
            low, high = (float(q) for q in np.quantile(boot, [tail, 1 - tail]))
    return rho, low, high, spearman_p(x, y) if with_p else math.nan


def id_predicts_gap(rows: Iterable[dict], baseline: str = "iid", predictor: str | None = None,
                    metrics: Sequence[str] = ("same_pred", "jsd"),
                    in_distribution: Sequence[str] = ("iid",)) -> list[dict]:
    """Across seeds: does a proxy's in-distribution faithfulness predict its OOD gap?

    Per (site, method, size, OOD split, metric): Spearman rho between each seed's faithfulness
    on `predictor` and its gap (baseline vs split), with a bootstrap interval; rho_ood, the
    same against the OOD faithfulness itself; and rho_model with p_model, the skeptic's
    baseline: the original model's own accuracy on `predictor` (`acc_original`, no proxy)
    against the same gap (NaN where the rows have no acc_original, or where it is constant over
    the seeds); and rho_partial with p_partial, what faithfulness tells beyond it: the partial
    Spearman correlation of faithfulness and gap given the model's accuracy
    (`partial_spearman`). `in_distribution`: the task's in-distribution
    splits (tasks.<name>.IN_DISTRIBUTION), which get no rows. By default the predictor is
    another in-distribution split than the baseline when one was evaluated (Dyck:
    `iid_with_train`): an independent sample of in-distribution sentences, so the predictor and
    the gap share no sampling noise (correlating the baseline with baseline - split would be
    positive by construction).
    """
    table = by_seed(rows)
    splits = {k[3] for k in table}
    if predictor is None:
        predictor = next((s for s in in_distribution if s != baseline and s in splits), baseline)
    out, tested = [], []  # tested: (row index, p-value column, x, gap) of each defined rho
    for (site, method, size, split), per_seed in sorted(table.items()):
        base = table.get((site, method, size, baseline))
        pred = table.get((site, method, size, predictor))
        if split in (baseline, predictor, *in_distribution) or base is None or pred is None:
            continue
        seeds = sorted(set(base) & set(per_seed) & set(pred))
        model = np.array([pred[seed].get("acc_original", math.nan) for seed in seeds],
                         np.float64)
        known = len(seeds) >= 3 and np.isfinite(model).all() and np.ptp(model) > 0
        for metric in metrics:
            x, b, s = (np.array([t[seed][metric] for seed in seeds], np.float64)
                       for t in (pred, base, per_seed))
            gap = signed_gap(b, s, metric)
            rho, low, high, _ = spearman_interval(x, gap, with_p=False)
            rho_ood, ood_low, ood_high, _ = spearman_interval(x, s, with_p=False)
            rho_model = float(_spearman_rows(model, gap)) if known and np.ptp(gap) > 0 \
                else math.nan
            rho_partial, p_partial = (partial_spearman(x, gap, model) if known and not
                                      math.isnan(rho) else (math.nan, math.nan))
            # their p-values below, with the others of their length
            tested += [(len(out), column, v, gap) for column, v, r in (
                ("p_value", x, rho), ("p_model", model, rho_model)) if not math.isnan(r)]
            out.append({"site": site, "method": method, "size": size, "split": split,
                        "metric": metric, "predictor": predictor, "baseline": baseline,
                        "n_seeds": len(seeds), "rho": rho, "rho_low": low, "rho_high": high,
                        "p_value": math.nan, "rho_ood": rho_ood, "rho_ood_low": ood_low,
                        "rho_ood_high": ood_high, "rho_model": rho_model,
                        "p_model": math.nan, "rho_partial": rho_partial,
                        "p_partial": p_partial})
    ps = _spearman_ps([(x, g) for _, _, x, g in tested])
    for (i, column, _, _), p in zip(tested, ps, strict=True):
        out[i][column] = p
    return out


def min_sizes(rows: Iterable[dict], threshold: float = 0.99, metric: str = "same_pred"
              ) -> list[dict]:
    """Per seed, sized proxy (rank or k) and split: the smallest size whose `metric` reaches
    `threshold` (NaN when no evaluated size does; max_size is the largest one evaluated)."""
    groups: dict[tuple, dict[int, float]] = defaultdict(dict)
    for r in rows:
        if r["breakdown"] == "all" and r["size"] > 0:
            groups[(r["seed"], r["site"], r["method"], r["split"])][r["size"]] = r[metric]
    out = []
    for (seed, site, method, split), by_size in sorted(groups.items()):
        reached = [size for size, v in by_size.items() if v >= threshold]
        out.append({"seed": seed, "site": site, "method": method, "split": split,
                    "threshold": threshold, "min_size": min(reached) if reached else math.nan,
                    "max_size": max(by_size)})
    return out


def min_size_distribution(per_seed: Iterable[dict]) -> dict[tuple, dict]:
    """{(site, method, split): {"n_seeds", "counts": {size or 'never': seeds}, "median"}}: the
    median is the LOWER median (an evaluated size: {1, 2, 8, 8} -> 2; reports label it so),
    counting 'never' as larger than every size (inf when at least half of the seeds never reach
    the threshold)."""
    groups: dict[tuple, list[float]] = defaultdict(list)
    for r in per_seed:
        groups[(r["site"], r["method"], r["split"])].append(r["min_size"])
    out = {}
    for key, values in groups.items():
        v = np.array([math.inf if math.isnan(x) else x for x in values])
        sizes, counts = np.unique(v, return_counts=True)
        out[key] = {"n_seeds": len(v), "median": float(np.sort(v)[(len(v) - 1) // 2]),
                    "counts": {("never" if math.isinf(s) else int(s)): int(c)
                               for s, c in zip(sizes, counts, strict=True)}}
    return out
