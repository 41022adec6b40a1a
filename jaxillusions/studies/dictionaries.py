"""Sparse dictionaries against low-rank proxies, across seeds (beyond the papers).

Three questions, each a pure function of results rows or activations:

equal_id           At equal in-distribution faithfulness, is a sparse dictionary a better OOD
                   proxy than a low-rank one? Per seed and SVD rank, the SAE size (width, k) of
                   the same seed and site whose baseline same_pred is closest; the per-seed
                   difference of their gaps (SAE gap - SVD gap) on every OOD split, paired over
                   seeds (stats.paired_summary). Positive: the SAE loses more out of
                   distribution than the SVD that is as faithful in distribution.
quality_predicts_gap
                   Does a dictionary's own quality predict its OOD failure? Spearman rho across
                   seeds of in-distribution fvu and dead fraction with the gap, with the bootstrap
                   interval and permutation p-value of stats.spearman_interval (the test of
                   id_predicts_gap.csv).
sae_seed_match, svd_seed_match
                   How seed-dependent are the dictionaries? Two SAEs fitted on the same
                   activations with two keys, and the SVD bases of two disjoint halves of the
                   activations: directions matched one to one (Hungarian,
                   scipy.optimize.linear_sum_assignment on |cosine|), and the share of matched
                   pairs with cosine > 0.9 (SAE: signed, since codes are >= 0 and a flipped
                   decoder row is another latent; SVD: |cosine|, a singular vector's sign is
                   arbitrary).

Gaps follow report/stats.py: positive = less faithful on the split than on the baseline.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import types
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np

from jaxillusions import tasks
from jaxillusions.config.fields import INT, nonnegative, setting
from jaxillusions.proxies import sae, svd
from jaxillusions.report import stats, tables
from jaxillusions.runtime import schema, stages
from jaxillusions.studies.stage import PROXIES, Stage

if TYPE_CHECKING:  # for annotations (pandas is imported where used)
    import pandas as pd

    from jaxillusions.faithfulness.fit import FittedProxy

THRESHOLD = 0.9  # a matched pair "agrees" above this cosine (Paulo & Belrose 2025)
EQUAL_ID_COLUMNS = ("site", "rank", "split", "metric", "reference", "dictionary", "matched_on",
                    "baseline", "id_reference", "id_dictionary", "id_max_abs_diff",
                    "gap_reference", "gap_dictionary", "diff") + stats.SUMMARY_COLUMNS + (
                        "dictionary_sizes",)
QUALITY_COLUMNS = ("site", "method", "size", "split", "metric", "predictor", "predictor_split",
                   "predictor_mean", "baseline", "n_seeds", "rho", "rho_low", "rho_high",
                   "p_value")
SEED_MATCH_COLUMNS = ("site", "method", "size", "width", "k", "n_directions", "threshold",
                      "n_seeds", "share", "share_low", "share_high", "mean_cos", "mean_cos_low",
                      "mean_cos_high")
SEED_MATCH_SEED_COLUMNS = ("seed", "site", "method", "size", "width", "k", "head",
                           "n_directions", "share", "mean_cos")


def _frame(rows: pd.DataFrame | Iterable[dict]) -> pd.DataFrame:
    import pandas as pd  # noqa: PLC0415 - not at a launch's start
    df = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))
    missing = {"seed", "site", "method", "size", "split", "breakdown"} - set(df.columns)
    if missing:
        raise ValueError(f"results rows lack the columns {sorted(missing)}")
    df = schema.one_group(df[df["breakdown"].astype(str) == "all"], "dictionaries")
    # Plain strings: analysis.load_results' categories would add empty groups to groupby.
    return df.astype({c: str for c in ("site", "method", "split", "breakdown")})


def _gaps(df: pd.DataFrame, baseline: str, metrics: Sequence[str]) -> pd.DataFrame:
    """Long frame (seed, site, method, size, split, metric, gap) for every split != baseline."""
    import pandas as pd  # noqa: PLC0415 - not at a launch's start
    keys = ["seed", "site", "method", "size"]
    base = df[df["split"] == baseline].set_index(keys)
    other = df[df["split"] != baseline]
    out = []
    for metric in metrics:
        b = base[metric].rename("b")
        merged = other[[*keys, "split", metric]].join(b, on=keys, how="inner")
        gap = stats.signed_gap(merged["b"].to_numpy(), merged[metric].to_numpy(), metric)
        out.append(merged[[*keys, "split"]].assign(metric=metric, gap=gap))
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame()


def equal_id(rows: pd.DataFrame | Iterable[dict], *, baseline: str = "iid",
             reference: str = "svd", dictionary: str = "sae", match_on: str = "same_pred",
             metrics: Sequence[str] = ("same_pred", "jsd"),
             in_distribution: Sequence[str] = ("iid",)) -> list[dict]:
    """Per (site, reference rank, OOD split, metric): the paired difference over seeds of the
    gaps of the dictionary size matched to that rank on `baseline` `match_on` (per seed, the
    closest; ties go to the smaller size) and of the rank itself (columns EQUAL_ID_COLUMNS;
    diff = dictionary gap - reference gap, positive: the dictionary is the worse OOD proxy).
    id_max_abs_diff: the largest per-seed |match_on difference| on the baseline (how equal the
    match is); dictionary_sizes: 'size:seeds' of the matched sizes."""
    df = _frame(rows)
    base = df[df["split"] == baseline]
    ref = base[base["method"] == reference][["seed", "site", "size", match_on]]
    dic = base[base["method"] == dictionary][["seed", "site", "size", match_on]]
    if ref.empty or dic.empty:
        return []
    pairs = ref.merge(dic, on=["seed", "site"], suffixes=("_ref", "_dic"))
    pairs["dist"] = (pairs[f"{match_on}_ref"] - pairs[f"{match_on}_dic"]).abs()
    pairs = pairs[np.isfinite(pairs["dist"])]  # a seed without a value cannot be matched
    matched = (pairs.sort_values(["seed", "site", "size_ref", "dist", "size_dic"])
               .groupby(["seed", "site", "size_ref"]).head(1))
    gaps = _gaps(df[df["method"].isin([reference, dictionary])], baseline, metrics)
    gaps = gaps[~gaps["split"].isin(in_distribution)]  # the task's (tasks.<name>.IN_DISTRIBUTION)
    lookup = gaps.set_index(["seed", "site", "method", "size", "split", "metric"])["gap"].to_dict()
    out = []
    for (site, rank), m in matched.groupby(["site", "size_ref"]):
        mine = gaps[(gaps["site"] == site) & (gaps["method"] == reference)
                    & (gaps["size"] == rank)]
        for split in sorted(mine["split"].unique()):
            for metric in metrics:
                g_ref = np.array([lookup.get((seed, site, reference, rank, split, metric),
                                             math.nan) for seed in m["seed"]])
                g_dic = np.array([lookup.get((seed, site, dictionary, size, split, metric),
                                             math.nan)
                                  for seed, size in zip(m["seed"], m["size_dic"], strict=True)])
                ok = np.isfinite(g_dic - g_ref)
                summary = stats.paired_summary(g_dic - g_ref)
                used = m[ok]
                counts = used["size_dic"].value_counts().sort_index()
                out.append({
                    "site": site, "rank": int(rank), "split": split, "metric": metric,
                    "reference": reference, "dictionary": dictionary, "matched_on": match_on,
                    "baseline": baseline,
                    "id_reference": float(used[f"{match_on}_ref"].mean()),
                    "id_dictionary": float(used[f"{match_on}_dic"].mean()),
                    "id_max_abs_diff": float(used["dist"].max()) if len(used) else math.nan,
                    "gap_reference": float(g_ref[ok].mean()) if ok.any() else math.nan,
                    "gap_dictionary": float(g_dic[ok].mean()) if ok.any() else math.nan,
                    "diff": summary["mean"], **{k: summary[k] for k in stats.SUMMARY_COLUMNS},
                    "dictionary_sizes": " ".join(f"{s}:{c}" for s, c in counts.items())})
    return out


def quality_predicts_gap(rows: pd.DataFrame | Iterable[dict], *, baseline: str = "iid",
                         predictor_split: str | None = None,
                         predictors: Sequence[str] = ("fvu", "dead"),
                         metrics: Sequence[str] = ("same_pred", "jsd"),
                         methods: Sequence[str] | None = None,
                         in_distribution: Sequence[str] = ("iid",)) -> list[dict]:
    """Per (site, method, size, OOD split, metric, predictor): Spearman rho across seeds of the
    predictor (a dictionary quality column of results.csv) on `predictor_split` with the gap
    (columns QUALITY_COLUMNS). predictor_split defaults, as in stats.id_predicts_gap, to
    iid_with_train when it was evaluated (an independent in-distribution sample: the predictor
    and the gap then share no sampling noise), else the baseline. Groups where the predictor is
    undefined (NaN on every seed, e.g. dead for SVD) are left out; a constant predictor gives
    rho NaN."""
    df = _frame(rows)
    missing = [p for p in predictors if p not in df.columns]
    if missing:
        raise ValueError(f"results rows lack the predictor columns {missing}")
    if methods is not None:
        df = df[df["method"].isin(methods)]
    if predictor_split is None:
        predictor_split = next((s for s in in_distribution  # another in-distribution sample
                                if s != baseline and (df["split"] == s).any()), baseline)
    keys = ["seed", "site", "method", "size"]
    pred = df[df["split"] == predictor_split].set_index(keys)[list(predictors)]
    gaps = _gaps(df, baseline, metrics)
    if gaps.empty:
        return []
    gaps = gaps[~gaps["split"].isin((*in_distribution, predictor_split))].join(pred, on=keys,
                                                                                how="inner")
    out = []
    for (site, method, size, split, metric), g in gaps.groupby(
            ["site", "method", "size", "split", "metric"]):
        for predictor in predictors:
            ok = g[np.isfinite(g[predictor]) & np.isfinite(g["gap"])].sort_values("seed")
            if ok.empty:
                continue
            rho, low, high, p = stats.spearman_interval(ok[predictor].to_numpy(),
                                                        ok["gap"].to_numpy())
            out.append({"site": site, "method": method, "size": int(size), "split": split,
                        "metric": metric, "predictor": predictor,
                        "predictor_split": predictor_split,
                        "predictor_mean": float(ok[predictor].mean()), "baseline": baseline,
                        "n_seeds": len(ok), "rho": rho, "rho_low": low, "rho_high": high,
                        "p_value": p})
    return out


# ---------------------------------------------------------------------------------------------
# Seed dependence: matched directions.


@jax.jit
def _cosines(a: jax.Array, b: jax.Array) -> jax.Array:
    """a [B, n, F], b [B, m, F] -> cosine matrices [B, n, m] (rows of zero norm: 0)."""
    def unit(x):
        return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), 1e-12)

    return jax.vmap(lambda x, y: jnp.matmul(unit(x), unit(y).T,
                                            precision=jax.lax.Precision.HIGHEST))(a, b)


def matched_cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Directions a [B, n, F], b [B, m, F] -> cosines [B, min(n, m)] of the one-to-one matching
    that maximises the total |cosine| (Hungarian), signed, per batch element."""
    import scipy.optimize  # noqa: PLC0415 - not at a launch's start
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    if a.ndim != 3 or b.ndim != 3 or a.shape[0] != b.shape[0] or a.shape[2] != b.shape[2]:
        raise ValueError(f"directions of shapes {a.shape} and {b.shape}: expected [B, n, F] "
                         "and [B, m, F]")
    cos = np.asarray(_cosines(a, b))
    out = np.empty((len(cos), min(a.shape[1], b.shape[1])), np.float64)
    for i, c in enumerate(cos):
        rows, cols = scipy.optimize.linear_sum_assignment(np.abs(c), maximize=True)
        out[i] = c[rows, cols]
    return out


def share_agreeing(cosines: np.ndarray, signed: bool, threshold: float = THRESHOLD
                   ) -> np.ndarray:
    """Matched cosines [..., n] -> share of pairs above `threshold` [...] (|cosine| unless
    signed)."""
    c = cosines if signed else np.abs(cosines)
    return (c > threshold).mean(-1)


@functools.partial(jax.jit, static_argnames=("sizes", "options"))
def _fit_sae(samples: dict, keys: jax.Array, *, sizes: tuple[int, ...], options: tuple) -> dict:
    fit = functools.partial(sae.fit, sizes=sizes, **dict(options))
    return jax.vmap(jax.vmap(lambda st, k: fit(st, key=k)))(samples, keys)


def _sae_pairs(sizes: Sequence[int], options: tuple) -> list[tuple[int, int]]:
    k = dict(options)["k"]  # sae.settings always gives it
    return [(w, min(kk, w)) for w, kk in (sae.width_and_k(s, k) for s in sizes)]


def sae_seed_match(samples: dict, sizes: tuple[int, ...], options: tuple, keys_b: jax.Array,
                   *, params_a: dict | None = None, keys_a: jax.Array | None = None,
                   threshold: float = THRESHOLD) -> list[dict]:
    """SAE decoders fitted twice on the same samples {"x": [S, G, N, F], "valid": [S, G, N]}
    (seed, head): params_a (leaves [S, G, R, ...], e.g. the sweep's own fit) or a fit with
    keys_a [S, G, 2], against a fit with keys_b. One row per (seed index, head, size) with the
    share of the width's decoder rows whose matched partner has cosine > threshold, and the
    mean matched cosine."""
    if (params_a is None) == (keys_a is None):
        raise ValueError("sae_seed_match: give exactly one of params_a and keys_a")
    fit = functools.partial(_fit_sae, sizes=tuple(sizes), options=tuple(options))
    params_b = fit(samples, keys_b)
    params_a = fit(samples, keys_a) if params_a is None else params_a
    out = []
    for index, (size, (width, k)) in enumerate(zip(sizes, _sae_pairs(sizes, options),
                                                   strict=True)):
        def decoders(p, index=index, width=width):
            w = np.asarray(p["W_dec"])[:, :, index, :width]  # [S, G, width, F]
            return w.reshape(-1, *w.shape[2:])

        a, b = decoders(params_a), decoders(params_b)
        cos = matched_cosines(a, b).reshape(*np.asarray(params_b["W_dec"]).shape[:2], -1)
        share, mean = share_agreeing(cos, signed=True, threshold=threshold), cos.mean(-1)
        out += [{"seed": s, "method": "sae", "size": int(size), "width": width, "k": k,
                 "head": g, "n_directions": width, "share": float(share[s, g]),
                 "mean_cos": float(mean[s, g])}
                for s in range(cos.shape[0]) for g in range(cos.shape[1])]
    return out


@functools.partial(jax.jit, static_argnames=("center",))
def _half_bases(x: jax.Array, valid: jax.Array, *, center: bool) -> jax.Array:
    """x [S, G, N, F], valid [S, G, N] -> bases [S, G, 2, F, F] (columns by decreasing
    eigenvalue) of the first and the second half of the valid rows."""
    def one(x, valid):
        order = jnp.cumsum(valid)
        first = valid & (order <= valid.sum() // 2)
        halves = jnp.stack([first, valid & ~first])
        fit = jax.vmap(lambda v: svd.fit(svd.moments(x, v), (x.shape[-1],),
                                         center=center)["basis"][0])
        return fit(halves)

    return jax.vmap(jax.vmap(one))(x, valid)


def svd_seed_match(samples: dict, ranks: tuple[int, ...], *, center: bool = False,
                   threshold: float = THRESHOLD) -> list[dict]:
    """The SVD (PCA with center) bases of two disjoint halves of the samples {"x": [S, G, N, F],
    "valid": [S, G, N]}: per (seed index, head, rank) the share of the top-r singular vectors of
    the first half whose matched partner among the second half's top r has |cosine| >
    threshold, and the mean matched |cosine|. The halves are the first and the last valid rows
    (the sample is whole sentences in order, so at most one sentence is split)."""
    bases = np.asarray(_half_bases(jnp.asarray(samples["x"]), jnp.asarray(samples["valid"]),
                                   center=center))
    num_seeds, num_groups, _, f, _ = bases.shape
    out = []
    for rank in ranks:
        r = min(rank, f)
        a = np.swapaxes(bases[:, :, 0, :, :r], -1, -2).reshape(-1, r, f)
        b = np.swapaxes(bases[:, :, 1, :, :r], -1, -2).reshape(-1, r, f)
        cos = np.abs(matched_cosines(a, b)).reshape(num_seeds, num_groups, r)
        share = share_agreeing(cos, signed=False, threshold=threshold)
        out += [{"seed": s, "method": "svd", "size": int(rank), "width": r, "k": r, "head": g,
                 "n_directions": r, "share": float(share[s, g]),
                 "mean_cos": float(cos[s, g].mean())}
                for s in range(num_seeds) for g in range(num_groups)]
    return out


def _cosine_interval(values: np.ndarray, signed: bool) -> tuple[float, float, float]:
    """stats.bounded_interval of cosines: |cosine| in [0, 1] as they are, a signed cosine in
    [-1, 1] through (c + 1) / 2 and back."""
    if not signed:
        return stats.bounded_interval(values)
    return tuple(2 * v - 1 for v in stats.bounded_interval((np.asarray(values) + 1) / 2))


def seed_match_summary(per_seed: Iterable[dict], threshold: float = THRESHOLD) -> list[dict]:
    """Per (site, method, size): the share (and mean matched cosine) averaged over heads per
    seed, then over seeds, with stats.bounded_interval (seeds are the unit): the share and the
    SVD's |cosine| lie in [0, 1]; the SAE's signed cosine in [-1, 1], its interval that of
    (cosine + 1) / 2 mapped back. Columns SEED_MATCH_COLUMNS."""
    import pandas as pd  # noqa: PLC0415 - not at a launch's start
    df = pd.DataFrame(list(per_seed))
    if df.empty:
        return []
    keys = ["site", "method", "size", "width", "k", "n_directions"]
    by_seed = df.groupby([*keys, "seed"], as_index=False)[["share", "mean_cos"]].mean()
    out = []
    for key, g in by_seed.groupby(keys):
        share, share_low, share_high = stats.bounded_interval(g["share"].to_numpy())
        cos, cos_low, cos_high = _cosine_interval(g["mean_cos"].to_numpy(),
                                                  signed=key[1] == "sae")
        out.append({**dict(zip(keys, key, strict=True)), "threshold": threshold,
                    "n_seeds": len(g), "share": share, "share_low": share_low,
                    "share_high": share_high, "mean_cos": cos, "mean_cos_low": cos_low,
                    "mean_cos_high": cos_high})
    for row in out:
        for name in ("size", "width", "k", "n_directions"):
            row[name] = int(row[name])
    return out


# ---------------------------------------------------------------------------------------------
# The main job's reports (sweep.py calls these; each is empty for a sweep without method sae).

MATCH_SALT = 22_022  # folded into the sweep's key: the second SAE fit's keys are not the first's


def results_tables(rows: pd.DataFrame | Iterable[dict], baseline: str = "iid",
                   in_distribution: Sequence[str] = ("iid",)
                   ) -> dict[str, tuple[list[dict], tuple[str, ...]]]:
    """{file stem: (rows, columns)} of the analyses of results rows alone: dictionaries_equal_id
    (needs svd and sae rows) and dictionaries_quality (sae rows with fvu and dead columns)."""
    import pandas as pd  # noqa: PLC0415 - not at a launch's start
    df = pd.DataFrame(list(rows)) if not isinstance(rows, pd.DataFrame) else rows
    if df.empty or not (df["method"] == "sae").any():
        return {}
    out = {}
    if (df["method"] == "svd").any():
        out["dictionaries_equal_id"] = (
            equal_id(df, baseline=baseline, in_distribution=in_distribution), EQUAL_ID_COLUMNS)
    predictors = [p for p in ("fvu", "dead") if p in df.columns]
    if predictors:
        out["dictionaries_quality"] = (quality_predicts_gap(
            df, baseline=baseline, predictors=predictors, in_distribution=in_distribution),
                                       QUALITY_COLUMNS)
    return out


def _first_sentences(tokens: np.ndarray, num_samples: int, pad: int) -> np.ndarray:
    """The fewest leading sentences that hold `num_samples` non-PAD positions (all if fewer):
    faithfulness.collect samples the first positions, so the sample is the same."""
    counts = np.cumsum((np.asarray(tokens) != pad).sum(1))
    return tokens[: int(np.searchsorted(counts, num_samples)) + 1]


def seed_match_tables(params, healthy, seeds: Sequence[int], train_split, model_cfg,
                      families: Sequence[FittedProxy], config, say=print
                      ) -> dict[str, tuple[list[dict], tuple[str, ...]]]:
    """dictionaries_seed_match (summary) and dictionaries_seed_match_per_seed for the first
    dictionaries.match_seeds healthy seeds (0: none): each SAE family of `families` (the
    sweep's fit: family i's spec and params {site: [S, G, R, ...]}) against a second fit on the
    same training sample with other keys, and the SVD bases of the sample's two halves (at
    svd.settings' ranks, clipped to the site's dimension). The sample is collected again
    (faithfulness.collect, the same first proxies.kmeans_samples positions) for those seeds in
    one batched call."""
    from jaxillusions import tasks  # noqa: PLC0415 - the engine, only here
    from jaxillusions.faithfulness.collect import Chunking, collect  # noqa: PLC0415

    pc = config.proxies
    wanted = config.dictionaries.match_seeds
    indices = [i for i in range(len(seeds)) if healthy is None or healthy[i]][:wanted]
    saes = [(i, f.spec) for i, f in enumerate(families) if f.spec.method == "sae"]
    if not saes or not indices:
        return {}
    pick = np.asarray(indices)
    sub = jax.tree.map(lambda x: x[pick], params)
    tokens = _first_sentences(np.asarray(train_split.tokens), pc.kmeans_samples, tasks.PAD)
    collected = collect(
        sub, types.SimpleNamespace(tokens=tokens), model_cfg, [s for _, s in saes],
        num_samples=pc.kmeans_samples, batch_size=pc.collect_batch_size,
        chunking=Chunking(pc.seed_chunk_size, say))
    key = jax.random.fold_in(jax.random.PRNGKey(config.seed), MATCH_SALT)
    per_seed, svd_done = [], set()
    for i, spec in saes:
        for j, site in enumerate(spec.sites):
            samples = collected[site]["samples"]
            num_seeds, num_groups = samples["x"].shape[:2]
            keys = jax.random.split(jax.random.fold_in(key, 1000 * i + j),
                                    num_seeds * num_groups).reshape(num_seeds, num_groups, -1)
            params_a = jax.tree.map(lambda x: np.asarray(x)[pick], families[i].params[site])
            rows = sae_seed_match(samples, spec.sizes, spec.options, keys, params_a=params_a)
            if site not in svd_done:  # one SVD comparison per site
                dim = samples["x"].shape[-1]
                ranks, options = svd.settings(pc, dim)
                rows += svd_seed_match(samples, tuple(sorted({min(r, dim) for r in ranks})),
                                       center=dict(options)["center"])
                svd_done.add(site)
            per_seed += [{**r, "seed": int(seeds[indices[r["seed"]]]), "site": site}
                         for r in rows]
    return {"dictionaries_seed_match": (seed_match_summary(per_seed), SEED_MATCH_COLUMNS),
            "dictionaries_seed_match_per_seed": (per_seed, SEED_MATCH_SEED_COLUMNS)}


def run(ctx):
    """The main job's stage (a Context in and out): the SAE seed-match tables of
    `seed_match_tables`, written by process 0 (dictionaries_seed_match*.csv)."""
    from jaxillusions.runtime import distributed  # noqa: PLC0415

    matched = seed_match_tables(ctx.params, ctx.healthy, ctx.seeds, ctx.splits["train"],
                                ctx.model_cfg, ctx.proxies.families, ctx.settings, say=ctx.say)
    if distributed.is_main():
        _write(ctx.directory, matched)
    return ctx


def _write(directory: str, named: dict) -> None:
    """<directory>/<name>.csv of each {name: (rows, columns)}."""
    for name, (table, columns) in named.items():
        path = os.path.join(directory, f"{name}.csv")
        with stages.writing("report", path):
            tables.write_csv(table, path, columns)


def report_lines(ctx) -> list[str]:
    """The reports stage's part: dictionaries_equal_id.csv and dictionaries_quality.csv from the
    result rows (`results_tables`); no lines for gap_table.txt."""
    pc = ctx.settings.proxies
    _write(ctx.directory, results_tables(ctx.proxies.rows, pc.gap_baseline,
                                         tasks.get(ctx.settings.task).IN_DISTRIBUTION))
    return []


def enabled(settings) -> bool:
    """With the SAE proxy (proxies.methods has "sae")."""
    return "sae" in settings.proxies.methods


@dataclasses.dataclass(frozen=True)
class Dictionaries:
    """The SAE proxy's seed-dependence analysis (jaxillusions/studies/dictionaries.py)."""

    match_seeds: int = setting(8, INT, ">= 0 (0: no SAE seed-match analysis)", nonnegative,
                               "seeds of the SAE seed-dependence analysis")


# The main job's stage (job.PIPELINE): per weight group, after the proxies.
STAGE = Stage("dictionaries", run, enabled=enabled, keys=("dictionaries.*", "proxies.*"),
              outputs=("dictionaries_*.csv",), section=Dictionaries, report=report_lines,
              needs=(PROXIES,))
