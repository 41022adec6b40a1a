"""The sweep's geometry and repair stage (analysis/geometry.py), run after the proxy evaluation
when proxies.geometry is true or proxies.repair_sentences is not empty.

    run(params, healthy, seeds, splits, model_cfg, shared, fit_stamps, rows, config, workdir,
        files, say)

1. Moments (faithfulness.collect, the training collection's code and chunking) of the SVD
   proxies' sites on the training split, on every evaluation split and on the first M sentences
   of each OOD split's fit half (fit_shift.halves), for every M of proxies.repair_sentences:
   one stage file, proxies/geometry_moments.msgpack.
2. geometry.csv and geometry_predicts_gap.csv (per svd/pca method: its centring) from them.
3. Repair, per svd/pca family: the train-fitted proxy, and each refit and rotation, evaluated on
   each OOD split's evaluation half in one batched call per split (the variants on the size axis):
   one stage file of rows per family (proxies/<i>_<method>_<target>_repair_rows.json); then
   repair.csv and figures/repair_<method>.png.
Stage files carry the settings they were computed with (the sweep's stamps): a change recomputes
only what it affects.
"""

from __future__ import annotations

import json
import os
import types

import jax
import numpy as np
from flax import serialization

from jaxillusions import distributed, faithfulness, fit_shift, stages, tasks
from jaxillusions.analysis import figures, geometry, tables

METHODS = tuple(geometry.CENTERED)  # the projection proxies this stage measures and repairs
MOMENTS_FILE = "geometry_moments.msgpack"


def enabled(config) -> bool:
    """With proxies.geometry or proxies.repair_sentences (subspace geometry, repair)."""
    pc = config.proxies
    return bool(pc.geometry or pc.repair_sentences)


def run(ctx: stages.Context) -> stages.Context:
    """The stage (module docstring), on a weight group's context: its parameters and the proxy
    stage's results (`shared`: the FittedProxy list, `fit_stamps` their stage stamps, `rows`
    the evaluation rows). Writes geometry.csv, geometry_predicts_gap.csv and repair.csv."""
    params, healthy, seeds, splits = ctx.params, ctx.healthy, ctx.seeds, ctx.splits
    model_cfg, config, workdir, files, say = (ctx.model_cfg, ctx.settings, ctx.directory,
                                              ctx.files, ctx.say)
    shared, fit_stamps, rows = (ctx.results[k] for k in ("shared", "fit_stamps", "rows"))
    pc, task = config.proxies, tasks.get(config)
    baseline = pc.gap_baseline
    counts = pc.repair_sentences
    families = [(i, p) for i, p in enumerate(shared) if p.spec.method in METHODS]
    if not families:
        return ctx
    sites = tuple(sorted({s for _, p in families for s in p.spec.sites}))
    evals = list(pc.eval_splits)
    ood = geometry.ood_splits(evals, baseline, task.IN_DISTRIBUTION)
    # The halves of fit_shift.py (the fit half in permutation order: its first M sentences are
    # a random sample), so a sentence is never both repaired on and evaluated.
    halves = {s: fit_shift.halves(len(splits[s].tokens), config.seed) for s in ood}
    short = [s for s in ood if counts and max(counts) > len(halves[s][0])]
    if short:  # a task whose split sizes validate could not know (code: num_eval -1)
        raise ValueError(f"proxies.repair_sentences={counts}: split {short[0]} has "
                         f"{len(halves[short[0]][0])} sentences in its fit half; at most that")
    chunking = faithfulness.Chunking(pc.seed_chunk_size, say)

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
        spec = faithfulness.ProxySpec("svd", sites)
        say(f"geometry: collecting moments of {len(sites)} sites on {len(sets)} sentence sets")
        moments = {name: {s: v["moments"] for s, v in faithfulness.collect(
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
        center = geometry.center_of(method, pc.svd_center)
        ranks = tuple(sorted({r for _, p in families if p.spec.method == method
                              for r in p.spec.sizes}))
        for site in sites:
            values = geometry.geometry(moments["train"][site], stacked(evals, site),
                                       ranks=ranks, center=center)
            geo += geometry.geometry_rows(jax.device_get(values), seeds, healthy, site, method,
                                          evals, ranks)
    reports = {"geometry": (geo, geometry.GEOMETRY_COLUMNS),
               "geometry_predicts_gap": (geometry.geometry_predicts_gap(
                   geo, rows, baseline, in_distribution=task.IN_DISTRIBUTION),
                                         geometry.PREDICTS_COLUMNS)}

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
        table = geometry.repair_table(repair_rows, rows, baseline)
        reports["repair"] = (table, geometry.REPAIR_COLUMNS)
    if not distributed.is_main():
        return ctx
    for name, (table_rows, columns) in reports.items():
        tables.write_csv(table_rows, os.path.join(workdir, f"{name}.csv"), columns)
    if counts:
        for method in methods:
            fig = geometry.repair_figure(reports["repair"][0], method, evals)
            figures.save(fig, os.path.join(workdir, "figures", f"repair_{method}.png"))
    best = _headline(reports["geometry_predicts_gap"][0])
    if best:
        say(best)
    return ctx


def _repair_family(ctx: stages.Context, proxy, moments: dict, ood: list[str],
                   halves: dict) -> list[dict]:
    """Rows of the train-fitted proxy and of its refits and rotations on each OOD split's
    evaluation half (the group of `ctx`); the variants go on the size axis of one evaluation
    per split."""
    config, splits = ctx.settings, ctx.splits
    pc, spec, task = config.proxies, proxy.spec, tasks.get(config)
    counts = pc.repair_sentences
    center = geometry.center_of(spec.method, pc.svd_center)
    # Uncentred, the rotated basis spans the refit's subspace with the same (zero) mean: the
    # same proxy (analysis/geometry.py), so only the refit is evaluated.
    variants = geometry.VARIANTS if center else ("refit",)
    sizes, out = spec.sizes, []
    for split in ood:
        per_site = {}
        for site in spec.sites:
            names = [f"{split}/fit{m}" for m in counts]
            fixed = geometry.repaired(moments["train"][site], jax.tree.map(
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
        wide = faithfulness.ProxySpec(spec.method, spec.sites, tuple(range(len(labels))),
                                      spec.options)
        half = tasks.subset(splits[split], halves[split][1])
        eval_set = faithfulness.make_eval_set({split: half}, [split], task)
        got = faithfulness.evaluate(ctx.params, ctx.model_cfg, eval_set,
                                    [faithfulness.FittedProxy(wide, per_site)],
                                    batch_size=pc.eval_batch_size, seeds=ctx.seeds,
                                    healthy=ctx.healthy, options=faithfulness.EvalOptions(
                                        chunking=faithfulness.Chunking(pc.seed_chunk_size,
                                                                       ctx.say)))
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
    for q in geometry.QUANTITIES:
        mine = [t for t in cells if t["predictor"] == q]
        wins = sum(abs(t["rho"]) > abs(t["id_rho"]) for t in mine)
        parts.append(f"{q} {wins}/{len(mine)}")
    return ("geometry vs in-distribution faithfulness as a predictor of a seed's gap "
            f"(|Spearman rho| larger): {', '.join(parts)} (geometry_predicts_gap.csv)")


# The main job's stage (sweep.PIPELINE): per weight group, after the proxies.
STAGE = stages.Stage("geometry", run, enabled=enabled, keys=("proxies.*",),
                     outputs=("geometry.csv", "geometry_predicts_gap.csv", "repair.csv"))
