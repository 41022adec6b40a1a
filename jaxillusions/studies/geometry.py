"""The sweep's geometry and repair stage (studies/geometry.py), run after the proxy evaluation
when geometry.enabled is true or geometry.repair_sentences is not empty.

    run(params, healthy, seeds, splits, model_cfg, shared, fit_stamps, rows, config, workdir,
        files, say)

1. Moments (faithfulness.collect, the training collection's code and chunking) of the SVD
   proxies' sites on the training split, on every evaluation split and on the first M sentences
   of each OOD split's fit half (fit_shift.halves), for every M of geometry.repair_sentences:
   one stage file, proxies/geometry_moments.msgpack.
2. geometry.csv and geometry_predicts_gap.csv (per svd/pca method: its centring) from them.
3. Repair, per svd/pca family: the train-fitted proxy, and each refit and rotation, evaluated on
   each OOD split's evaluation half in one batched call per split (the variants on the size axis):
   one stage file of rows per family (proxies/<i>_<method>_<target>_repair_rows.json); then
   repair.csv and figures/repair_<method>.png.
Stage files carry the settings they were computed with (the sweep's stamps): a change recomputes
only what it affects.

Why a proxy fails out of distribution: subspace geometry, and repair with a few OOD samples.

Everything here works on the second moments that the SVD proxy is fitted from
(`proxies.svd.moments`: gram, total, count per seed and head), so the subspaces are the SVD
proxy's own, centred as it centres (`proxies.svd_center`; PCA always):

* `geometry` - per rank r, the principal angles between the top-r subspace of the training
  activations and that of a split (scipy.linalg.subspace_angles semantics, from the SVD of
  U_a^T U_b), and the share of the split's activation energy outside the train-fitted rank-r
  subspace (the energy that the rank-r proxy removes from that split: the proxy maps x to
  mean + P_r (x - mean), so its error is (I - P_r)(x - mean)).
* `repaired` - the rank-r proxy refitted on M unlabelled sentences of a split, and the
  train-fitted basis rotated onto that split's rank-r subspace (an orthogonal Procrustes rotation
  of the ambient space, scipy.linalg.orthogonal_procrustes semantics; the training mean is kept).
  For a rank-r projection the rotated basis spans the split's rank-r subspace, so the two differ
  only in the mean: uncentred SVD gives the same proxy both ways (the sweep evaluates the
  rotation for centred proxies only).
* Tables: geometry.csv rows, geometry_predicts_gap.csv (Spearman rho of each geometric quantity
  with the seed's gap, beside `stats.id_predicts_gap`'s in-distribution predictor) and
  repair.csv (the share of the gap closed against M, paired per seed), and the repair figure.

All of it is batched over seeds and heads with jax.vmap, ranks and sample counts included.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import types
from collections import defaultdict
from collections.abc import Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import serialization

from jaxillusions import tasks
from jaxillusions.config.fields import BOOL, INTS, setting
from jaxillusions.faithfulness import dictionary_metrics
from jaxillusions.faithfulness.collect import Chunking, collect
from jaxillusions.faithfulness.evaluate import EvalOptions, evaluate, make_eval_set
from jaxillusions.faithfulness.fit import FittedProxy
from jaxillusions.faithfulness.specs import ProxySpec
from jaxillusions.report import figures, stats, tables
from jaxillusions.runtime import distributed, linalg, stages
from jaxillusions.studies import fit_shift
from jaxillusions.studies.stage import PROXIES, Context, Stage

_HI = jax.lax.Precision.HIGHEST


QUANTITIES = ("angle_max", "sin2_mean", "energy_outside")


VARIANTS = ("refit", "rotate")


GEOMETRY_COLUMNS = ("seed", "site", "head", "method", "split", "rank", *QUANTITIES)


PREDICTS_COLUMNS = ("site", "method", "size", "split", "metric", "predictor", "baseline",
                    "n_seeds", "rho", "rho_low", "rho_high", "p_value", "id_predictor",
                    "id_rho", "id_rho_low", "id_rho_high", "id_p_value")


REPAIR_COLUMNS = ("site", "method", "size", "split", "variant", "sentences", "metric", "baseline",
                  "gap_eval_half", "gap_eval_half_repaired", "closed", "closed_low",
                  "closed_high", "n_seeds", "seeds_positive", "share", "share_low", "share_high",
                  "share_boot_low", "share_boot_high", "n_seeds_share")


CENTERED = {"svd": None, "pca": True}  # None: proxies.svd_center decides


def center_of(method: str, svd_center: bool) -> bool:
    """Whether `method` (svd or pca) centres its activations."""
    fixed = CENTERED[method]
    return svd_center if fixed is None else fixed


def _basis(moments: dict, center: bool) -> tuple[jax.Array, jax.Array]:
    """(mean [F], eigenbasis [F, F] by decreasing eigenvalue) exactly as proxies.svd.fit
    computes them (the proxy's own subspaces)."""
    from jaxillusions.proxies import svd  # noqa: PLC0415 - proxies sit beside analysis

    f = moments["total"].shape[-1]
    params = svd.fit(moments, (f,), center=center)
    return params["mean"][0], params["basis"][0]


def subspace_angles(a: jax.Array, b: jax.Array, rank: jax.Array) -> jax.Array:
    """Principal angles (radians, decreasing; NaN past `rank`) between the spans of the first
    `rank` columns of the orthonormal a, b [F, F]: scipy.linalg.subspace_angles's formulas
    (cosines from the SVD of A^T B, sines from that of B - A A^T B, each where it is accurate),
    with the columns past `rank` masked to zero so that every rank is one traced program."""
    f = a.shape[-1]
    keep = jnp.arange(f) < rank
    a, b = a * keep, b * keep
    cross = jnp.matmul(a.T, b, precision=_HI)
    sigma = linalg.svd(cross, compute_uv=False)  # decreasing; first `rank` are the cosines
    sines = linalg.svd(b - jnp.matmul(a, cross, precision=_HI), compute_uv=False)
    ascending = sigma[jnp.where(keep, rank - 1 - jnp.arange(f), 0)]  # sigma[::-1] of the block
    theta = jnp.where(sigma**2 >= 0.5, jnp.arcsin(jnp.clip(sines, -1.0, 1.0)),
                      jnp.arccos(jnp.clip(ascending, -1.0, 1.0)))
    return jnp.where(keep, theta, jnp.nan)


def outside_energy(moments: dict, mean: jax.Array, basis: jax.Array, rank: jax.Array
                   ) -> jax.Array:
    """Share of the energy of the activations (`moments`) about `mean` that lies outside the
    span of the first `rank` columns of `basis`: E|(I - P)(x - mean)|^2 / E|x - mean|^2; NaN
    where that energy (a centred proxy: the split's variance about the training mean) is not
    dictionary_metrics.DENOMINATOR_MARGIN times its float32 rounding, as fvu: the sums of squares
    carry about eps * sqrt(n) of themselves, and subtracting the mean's terms cancels them."""
    count = jnp.maximum(moments["count"], 1.0)
    own = moments["total"] / count
    second = (moments["gram"] / count - jnp.outer(own, mean) - jnp.outer(mean, own)
              + jnp.outer(mean, mean))
    kept = basis * (jnp.arange(basis.shape[-1]) < rank)
    inside = jnp.trace(jnp.matmul(kept.T, jnp.matmul(second, kept, precision=_HI),
                                  precision=_HI))
    total = jnp.trace(second)
    rounding = dictionary_metrics.EPS32 * (3 * jnp.sqrt(count) + 1) * (
        jnp.trace(moments["gram"]) / count + jnp.dot(mean, mean))
    return jnp.where(total > dictionary_metrics.DENOMINATOR_MARGIN * rounding, 1.0 - inside / total,
                     jnp.nan)


def _geometry_one(train: dict, split: dict, ranks: tuple[int, ...], center: bool) -> dict:
    mean, base = _basis(train, center)
    _, other = _basis(split, center)

    def at_rank(r):
        theta = subspace_angles(base, other, r)
        return {"angles": theta, "angle_max": jnp.nanmax(theta),
                "sin2_mean": jnp.nanmean(jnp.sin(theta) ** 2),
                "energy_outside": outside_energy(split, mean, base, r)}

    return jax.vmap(at_rank)(jnp.minimum(jnp.asarray(ranks), base.shape[-1]))


@functools.partial(jax.jit, static_argnames=("ranks", "center"))
def geometry(train: dict, splits: dict, *, ranks: tuple[int, ...], center: bool) -> dict:
    """train moments (leaves [S, G, ...]) and the splits' moments ([S, G, P, ...], P splits) ->
    {"angles": [S, G, P, R, F], "angle_max", "sin2_mean", "energy_outside": [S, G, P, R]}."""
    per_split = jax.vmap(_geometry_one, in_axes=(None, 0, None, None))
    return jax.vmap(jax.vmap(lambda t, s: per_split(t, s, ranks, center)))(train, splits)


def procrustes(a: jax.Array, b: jax.Array) -> jax.Array:
    """The orthogonal R minimizing |a R - b|_F (scipy.linalg.orthogonal_procrustes's R)."""
    u, _, vt = linalg.svd(jnp.matmul(a.T, b, precision=_HI))
    return jnp.matmul(u, vt, precision=_HI)


def _repaired_one(train: dict, ood: dict, sizes: tuple[int, ...], center: bool) -> dict:
    """{"refit": svd params [R, ...], "rotate": svd params [R, ...]} for one seed and head."""
    from jaxillusions.proxies import svd  # noqa: PLC0415

    refit = svd.fit(ood, sizes, center=center)
    mean, base = _basis(train, center)
    _, other = _basis(ood, center)
    f = base.shape[-1]
    ranks = jnp.minimum(jnp.asarray(sizes), f)

    def rotated(r):
        keep = jnp.arange(f) < r
        # Rows = the rank-r bases: A^T R ~ B^T, so R^T maps the training subspace onto the
        # split's; the whole training basis turns with it (its columns past r are masked).
        turn = procrustes((base * keep).T, (other * keep).T)
        return jnp.matmul(turn.T, base, precision=_HI)

    rotate = {"mean": jnp.broadcast_to(mean, (len(sizes), f)), "basis": jax.vmap(rotated)(ranks),
              "mask": refit["mask"]}
    return {"refit": refit, "rotate": rotate}


@functools.partial(jax.jit, static_argnames=("sizes", "center"))
def repaired(train: dict, ood: dict, *, sizes: tuple[int, ...], center: bool) -> dict:
    """train moments ([S, G, ...]) and OOD sample moments ([S, G, M, ...], one per sample count)
    -> {"refit"|"rotate": svd params with leaves [S, G, M, R, ...]}."""
    per_sample = jax.vmap(_repaired_one, in_axes=(None, 0, None, None))
    return jax.vmap(jax.vmap(lambda t, o: per_sample(t, o, sizes, center)))(train, ood)


def geometry_rows(values: dict, seeds: Sequence[int], healthy, site: str, method: str,
                  splits: Sequence[str], ranks: Sequence[int]) -> list[dict]:
    """geometry.csv rows from `geometry`'s output for one site and method (healthy seeds)."""
    out = []
    a = {q: np.asarray(values[q], np.float64) for q in QUANTITIES}
    for s, seed in enumerate(seeds):
        if healthy is not None and not healthy[s]:
            continue
        for g in range(a["angle_max"].shape[1]):
            for p, split in enumerate(splits):
                for r, rank in enumerate(ranks):
                    out.append({"seed": int(seed), "site": site, "head": g, "method": method,
                                "split": split, "rank": int(rank),
                                **{q: float(a[q][s, g, p, r]) for q in QUANTITIES}})
    return out


def ood_splits(splits: Iterable[str], baseline: str, in_distribution: Sequence[str]) -> list[str]:
    """The splits other than the baseline and the task's in-distribution ones."""
    return [s for s in splits if s != baseline and s not in in_distribution]


def geometry_predicts_gap(geometry_table: Sequence[dict], rows: Sequence[dict],
                          baseline: str = "iid", metrics: Sequence[str] = ("same_pred", "jsd"),
                          in_distribution: Sequence[str] = ("iid",)) -> list[dict]:
    """Across seeds, per (site, method, rank, OOD split, metric) and geometric quantity: the
    Spearman rho (stats.spearman_interval: bootstrap interval, permutation p) between the
    quantity (mean over heads) and the seed's gap (stats.signed_gap, baseline vs split, as in
    gaps.csv), beside the in-distribution predictor's rho of id_predicts_gap.csv on the same
    proxy, split and metric. Single-site targets only (geometry is per site). `in_distribution`:
    the task's in-distribution splits (tasks.<name>.IN_DISTRIBUTION), which get no rows."""
    table = stats.by_seed(rows)
    ids = {(r["site"], r["method"], r["size"], r["split"], r["metric"]): r
           for r in stats.id_predicts_gap(rows, baseline=baseline, metrics=metrics,
                                          in_distribution=in_distribution)}
    per_seed: dict[tuple, dict[int, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for g in geometry_table:
        per_seed[(g["site"], g["method"], g["rank"], g["split"])][g["seed"]].append(g)
    out = []
    for (site, method, rank, split), by_seed in sorted(per_seed.items()):
        base, other = table.get((site, method, rank, baseline)), table.get(
            (site, method, rank, split))
        if (split not in ood_splits([split], baseline, in_distribution) or base is None
                or other is None):
            continue
        seeds = sorted(set(by_seed) & set(base) & set(other))
        for metric in metrics:
            gap = stats.signed_gap(np.array([base[s][metric] for s in seeds]),
                                   np.array([other[s][metric] for s in seeds]), metric)
            known = ids.get((site, method, rank, split, metric), {})
            for quantity in QUANTITIES:
                x = np.array([np.mean([g[quantity] for g in by_seed[s]]) for s in seeds])
                ok = np.isfinite(x) & np.isfinite(gap)  # energy_outside may be undefined
                rho, low, high, p = stats.spearman_interval(x[ok], gap[ok])
                out.append({"site": site, "method": method, "size": rank, "split": split,
                            "metric": metric, "predictor": quantity, "baseline": baseline,
                            "n_seeds": int(ok.sum()), "rho": rho, "rho_low": low,
                            "rho_high": high, "p_value": p,
                            "id_predictor": known.get("predictor", ""),
                            **{f"id_{k}": known.get(k, math.nan)
                               for k in ("rho", "rho_low", "rho_high", "p_value")}})
    return out


def repair_table(repair_rows: Sequence[dict], rows: Sequence[dict], baseline: str = "iid",
                 metrics: Sequence[str] = ("same_pred", "jsd")) -> list[dict]:
    """repair.csv: per (site, method, size, split, variant, M, metric), paired over seeds.

    `repair_rows`: faithfulness rows on the split's evaluation half, with the extra columns
    variant ("train" for the train-fitted proxy, "refit", "rotate") and sentences (M; 0 for
    "train"). Per seed, gap_eval_half = signed_gap(baseline faithfulness of the train-fitted
    proxy in results.csv, faithfulness on the split's evaluation half) for the train-fitted
    proxy, gap_eval_half_repaired the same for the repaired one (named apart from gaps.csv's
    `gap`, which is on whole splits); closed = their difference (stats.paired_summary: t and
    bootstrap intervals); share = closed / gap_eval_half per seed, on the seeds whose
    gap_eval_half exceeds stats.RESOLUTION (n_seeds_share)."""
    table = stats.by_seed(rows)
    halves: dict[tuple, dict[int, dict]] = defaultdict(dict)
    for r in repair_rows:
        if r["breakdown"] == "all":
            halves[(r["site"], r["method"], r["size"], r["split"], r["variant"],
                    r["sentences"])][r["seed"]] = r
    out = []
    for (site, method, size, split, variant, m), repaired_ in sorted(halves.items()):
        train_half = halves.get((site, method, size, split, "train", 0))
        base = table.get((site, method, size, baseline))
        if variant == "train" or train_half is None or base is None:
            continue
        seeds = sorted(set(repaired_) & set(train_half) & set(base))
        for metric in metrics:
            b = np.array([base[s][metric] for s in seeds])
            gap = stats.signed_gap(b, np.array([train_half[s][metric] for s in seeds]), metric)
            fixed = stats.signed_gap(b, np.array([repaired_[s][metric] for s in seeds]), metric)
            closed = stats.paired_summary(gap - fixed)
            real = gap > stats.RESOLUTION.get(metric, 0.0)
            share = stats.paired_summary(np.where(real, (gap - fixed) / np.where(real, gap, 1),
                                                  np.nan))
            out.append({"site": site, "method": method, "size": size, "split": split,
                        "variant": variant, "sentences": m, "metric": metric,
                        "baseline": baseline,
                        "gap_eval_half": float(np.mean(gap)) if seeds else math.nan,
                        "gap_eval_half_repaired": float(np.mean(fixed)) if seeds else math.nan,
                        "closed": closed["mean"], "closed_low": closed["ci_low"],
                        "closed_high": closed["ci_high"], "n_seeds": closed["n_seeds"],
                        "seeds_positive": closed["seeds_positive"], "share": share["mean"],
                        "share_low": share["ci_low"], "share_high": share["ci_high"],
                        "share_boot_low": share["boot_low"],
                        "share_boot_high": share["boot_high"],
                        "n_seeds_share": share["n_seeds"]})
    return out


def repair_figure(table: Sequence[dict], method: str, splits: Sequence[str],
                  metric: str = "same_pred"):
    """The share of the gap closed against M (log2 axis), one panel per (target, rank) whose
    train-fitted gap is real on some split, one colour per split (figures.split_style), refit
    solid and rotate dashed, 95% t intervals over seeds. Returns the matplotlib Figure."""
    from jaxillusions.report import figures  # noqa: PLC0415 - matplotlib only for figures

    table = [t for t in table if t["method"] == method and t["metric"] == metric]
    real = stats.RESOLUTION.get(metric, 0.0)
    panels = sorted({(t["site"], t["size"]) for t in table if t["gap_eval_half"] > real},
                    key=lambda p: (figures.ordered_sites([t["site"] for t in table]).index(p[0]),
                                   p[1]))
    fig, axes = figures._grid(max(len(panels), 1), (3.6, 2.9))  # noqa: SLF001 - same grid
    ms = sorted({t["sentences"] for t in table})
    for ax, (site, size) in zip(axes, panels, strict=False):
        ax.axhline(0, color="0.4", lw=0.8)
        ax.axhline(1, color="0.4", lw=0.8, ls=":")
        for split in [s for s in splits if any(t["split"] == s for t in table)]:
            for v, variant in enumerate(VARIANTS):
                line = sorted((t for t in table if (t["site"], t["size"], t["split"],
                                                    t["variant"]) == (site, size, split,
                                                                      variant)),
                              key=lambda t: t["sentences"])
                if not line:
                    continue
                x = np.array([t["sentences"] for t in line], float)
                mean = np.array([t["share"] for t in line], float)
                err = np.nan_to_num(np.clip(np.stack(
                    [mean - np.array([t["share_low"] for t in line], float),
                     np.array([t["share_high"] for t in line], float) - mean]), 0, None))
                ax.errorbar(x * 2 ** (0.08 * (2 * v - 1)), mean, yerr=err, ms=4, lw=1.2,
                            capsize=2, elinewidth=0.9, ls=("-", "--")[v],
                            label=f"{split}, {variant}", **figures.split_style(split, splits))
        ax.set_title(f"{site}, rank {size}")
        ax.set_ylabel(f"share of {metric} gap closed")
        ax.grid(alpha=0.3)
        figures._log2_axis(ax, ms, "OOD sentences M")  # noqa: SLF001
    handles, labels = axes[0].get_legend_handles_labels()
    figures._legend_below(fig, handles, labels)  # noqa: SLF001
    n = max((t["n_seeds"] for t in table), default=0)
    figures._title(fig, f"{method}: share of the OOD gap closed by M unlabelled split sentences, "  # noqa: SLF001
                        f"mean, 95% t CI over {n} seeds")
    fig.tight_layout(rect=(0, 0.06, 1, 0.95))
    return fig


METHODS = tuple(CENTERED)  # the projection proxies this stage measures and repairs


MOMENTS_FILE = "geometry_moments.msgpack"


def enabled(config) -> bool:
    """With geometry.enabled or geometry.repair_sentences (subspace geometry, repair)."""
    gc = config.geometry
    return bool(gc.enabled or gc.repair_sentences)


def run(ctx: Context) -> Context:
    """The stage (module docstring), on a weight group's context: its parameters and the proxy
    stage's results (`shared`: the FittedProxy list, `fit_stamps` their stage stamps, `rows`
    the evaluation rows). Writes geometry.csv, geometry_predicts_gap.csv and repair.csv."""
    params, healthy, seeds, splits = ctx.params, ctx.healthy, ctx.seeds, ctx.splits
    model_cfg, config, workdir, files, say = (ctx.model_cfg, ctx.settings, ctx.directory,
                                              ctx.files, ctx.say)
    shared, fit_stamps, rows = ctx.proxies.families, ctx.proxies.fit_stamps, ctx.proxies.rows
    pc, task = config.proxies, tasks.get(config)
    baseline = pc.gap_baseline
    counts = config.geometry.repair_sentences
    families = [(i, p) for i, p in enumerate(shared) if p.spec.method in METHODS]
    if not families:
        return ctx
    sites = tuple(sorted({s for _, p in families for s in p.spec.sites}))
    evals = list(pc.eval_splits)
    ood = ood_splits(evals, baseline, task.IN_DISTRIBUTION)
    # The halves of fit_shift.py (the fit half in permutation order: its first M sentences are
    # a random sample), so a sentence is never both repaired on and evaluated.
    halves = {s: fit_shift.halves(len(splits[s].tokens), config.seed) for s in ood}
    short = [s for s in ood if counts and max(counts) > len(halves[s][0])]
    if short:  # a task whose split sizes validate could not know (code: num_eval -1)
        raise ValueError(f"geometry.repair_sentences={counts}: split {short[0]} has "
                         f"{len(halves[short[0]][0])} sentences in its fit half; at most that")
    chunking = Chunking(pc.seed_chunk_size, say)

    # 1. Moments.
    sets = {"train": task.view(splits["train"]).tokens}
    sets.update({s: task.view(splits[s]).tokens for s in evals})
    for s in ood if counts else ():
        for m in counts:
            sets[f"{s}/fit{m}"] = task.view(splits[s]).tokens[halves[s][0][:m]]
    moments_stamp = stages.stamp(sites=sites, sets=sorted(sets), seed=config.seed,
                           batch=pc.collect_batch_size, counts=counts)
    path = os.path.join(files.dir, MOMENTS_FILE)
    moments = files.load(path, moments_stamp, stages.read_msgpack)
    if moments is None:
        spec = ProxySpec("svd", sites)
        say(f"geometry: collecting moments of {len(sites)} sites on {len(sets)} sentence sets")
        moments = {name: {s: v["moments"] for s, v in collect(
            params, types.SimpleNamespace(tokens=tokens), model_cfg, [spec], num_samples=0,
            batch_size=pc.collect_batch_size, chunking=chunking).items()}
            for name, tokens in sets.items()}
        stages.write(path, serialization.msgpack_serialize(
            {"stamp": moments_stamp, "value": moments}), "geometry")

    def stacked(names, site):
        return jax.tree.map(lambda *x: np.stack(x, axis=2), *[moments[n][site] for n in names])

    # 2. Geometry.
    methods = list(dict.fromkeys(p.spec.method for _, p in families))
    geo = []
    for method in methods:
        center = center_of(method, pc.svd_center)
        ranks = tuple(sorted({r for _, p in families if p.spec.method == method
                              for r in p.spec.sizes}))
        for site in sites:
            values = geometry(moments["train"][site], stacked(evals, site),
                                       ranks=ranks, center=center)
            geo += geometry_rows(jax.device_get(values), seeds, healthy, site, method,
                                          evals, ranks)
    reports = {"geometry": (geo, GEOMETRY_COLUMNS),
               "geometry_predicts_gap": (geometry_predicts_gap(
                   geo, rows, baseline, in_distribution=task.IN_DISTRIBUTION),
                                         PREDICTS_COLUMNS)}

    # 3. Repair.
    if counts:
        repair_rows = []
        for n, (i, proxy) in enumerate(families, 1):
            spec = proxy.spec
            stamp = stages.stamp(fit=fit_stamps[i], moments=moments_stamp,
                           splits=ood, batch=pc.eval_batch_size)
            path = files.path(i, spec, "_repair_rows.json")
            family = files.load(path, stamp, stages.read_json)
            if family is None:
                family = _repair_family(ctx, proxy, moments, ood, halves)
                stages.write(path, json.dumps({"stamp": stamp, "value": family}), "repair")
            say(f"  repair [{n}/{len(families)}] {spec.method} on {spec.target}: M "
                f"{list(counts)} on the evaluation halves of {', '.join(ood)}", flush=True)
            repair_rows += family
        table = repair_table(repair_rows, rows, baseline)
        reports["repair"] = (table, REPAIR_COLUMNS)
    if not distributed.is_main():
        return ctx
    for name, (table_rows, columns) in reports.items():
        tables.write_csv(table_rows, os.path.join(workdir, f"{name}.csv"), columns)
    if counts:
        for method in methods:
            fig = repair_figure(reports["repair"][0], method, evals)
            figures.save(fig, os.path.join(workdir, "figures", f"repair_{method}.png"))
    best = _headline(reports["geometry_predicts_gap"][0])
    if best:
        say(best)
    return ctx


def _repair_family(ctx: Context, proxy, moments: dict, ood: list[str],
                   halves: dict) -> list[dict]:
    """Rows of the train-fitted proxy and of its refits and rotations on each OOD split's
    evaluation half (the group of `ctx`); the variants go on the size axis of one evaluation
    per split."""
    config, splits = ctx.settings, ctx.splits
    pc, spec, task = config.proxies, proxy.spec, tasks.get(config)
    counts = config.geometry.repair_sentences
    center = center_of(spec.method, pc.svd_center)
    # Uncentred, the rotated basis spans the refit's subspace with the same (zero) mean: the
    # same proxy (analysis/py), so only the refit is evaluated.
    variants = VARIANTS if center else ("refit",)
    sizes, out = spec.sizes, []
    for split in ood:
        per_site = {}
        for site in spec.sites:
            names = [f"{split}/fit{m}" for m in counts]
            fixed = repaired(moments["train"][site], jax.tree.map(
                lambda *x: np.stack(x, axis=2), *[moments[n][site] for n in names]),
                sizes=sizes, center=center)
            # [S, G, R] train-fitted, then per variant and M: [S, G, M * R] -> size axis.
            parts = [proxy.params[site]] + [
                jax.tree.map(lambda x: np.asarray(x).reshape(*x.shape[:2], -1, *x.shape[4:]),
                             fixed[v]) for v in variants]
            per_site[site] = jax.tree.map(
                lambda *x: np.concatenate([np.asarray(a, np.float32) for a in x], axis=2),
                *parts)
        labels = [("train", 0, r) for r in sizes] + [
            (v, m, r) for v in variants for m in counts for r in sizes]
        wide = ProxySpec(spec.method, spec.sites, tuple(range(len(labels))), spec.options)
        half = tasks.subset(splits[split], halves[split][1])
        eval_set = make_eval_set({split: half}, [split], task)
        got = evaluate(ctx.params, ctx.model_cfg, eval_set, [FittedProxy(wide, per_site)],
                       batch_size=pc.eval_batch_size, seeds=ctx.seeds, healthy=ctx.healthy,
                       options=EvalOptions(chunking=Chunking(pc.seed_chunk_size, ctx.say)))
        for row in got:
            if row["breakdown"] != "all":
                continue
            variant, m, size = labels[row["size"]]
            out.append({**row, "size": size, "variant": variant, "sentences": m})
    return out


def _headline(table: list[dict]) -> str:
    """One line: how often a geometric quantity predicts the gap more strongly than the
    in-distribution predictor (|rho| larger), over the proxy-split-metric cells."""
    cells = [t for t in table if np.isfinite(t["rho"]) and np.isfinite(t["id_rho"])]
    if not cells:
        return ""
    parts = []
    for q in QUANTITIES:
        mine = [t for t in cells if t["predictor"] == q]
        wins = sum(abs(t["rho"]) > abs(t["id_rho"]) for t in mine)
        parts.append(f"{q} {wins}/{len(mine)}")
    return ("geometry vs in-distribution faithfulness as a predictor of a seed's gap "
            f"(|Spearman rho| larger): {', '.join(parts)} (geometry_predicts_gap.csv)")


@dataclasses.dataclass(frozen=True)
class Geometry:
    """Subspace geometry of the SVD proxies and their repair (jaxillusions/studies/geometry.py)."""

    enabled: bool = setting(False, BOOL, "true or false",
                            doc="principal angles and outside energy of the SVD subspaces")
    repair_sentences: tuple[int, ...] = setting(
        (), INTS, "distinct sentence counts >= 1, or () for no repair",
        lambda v, s: all(m >= 1 for m in v),
        "refit / rotate each proxy with M unlabelled OOD sentences")


def check(config, model_cfg) -> list[str]:
    """geometry.enabled / repair_sentences need an SVD proxy, and M within a split's fit half
    (one-line ValueError at the door)."""
    del model_cfg
    gc = config.geometry
    if not enabled(config):
        return []
    key = "repair_sentences" if gc.repair_sentences else "enabled"
    if not any(m in METHODS for m in config.proxies.methods):
        raise ValueError(f"geometry.{key}={getattr(gc, key)!r}: needs svd or pca in "
                         f"proxies.methods (now {tuple(config.proxies.methods)})")
    counts, per_split = gc.repair_sentences, getattr(config.data, "num_eval", None)
    if counts and per_split is not None and per_split > 0 and max(counts) > (per_split + 1) // 2:
        raise ValueError(f"geometry.repair_sentences={counts}: must be at most "
                         f"{(per_split + 1) // 2}, the fit half of a split of data.num_eval="
                         f"{per_split} sentences")
    return []


# The main job's stage (job.PIPELINE): per weight group, after the proxies.
STAGE = Stage("geometry", run, enabled=enabled, keys=("geometry.*", "proxies.*"),
              outputs=("geometry.csv", "geometry_predicts_gap.csv", "repair.csv"),
              section=Geometry, check=check, needs=(PROXIES,))
