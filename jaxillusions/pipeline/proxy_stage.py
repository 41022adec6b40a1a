"""The proxy stage of the main job: every proxy family fitted on the training split and
evaluated on every evaluation split, each family saved in stamped stage files of its own
(proxies/<i>_<method>_<target>.msgpack and ..._rows.json), so that a relaunch resumes and a
changed analysis setting refits only the families it affects.
"""

from __future__ import annotations

import dataclasses
import json
import time

import jax
import numpy as np
from flax import serialization

from jaxillusions import tasks
from jaxillusions.faithfulness.collect import Chunking, collect, collection_groups
from jaxillusions.faithfulness.evaluate import EvalOptions, evaluate, make_eval_set
from jaxillusions.faithfulness.fit import FittedProxy, fit_one
from jaxillusions.faithfulness.specs import labels_for, specs_from_config
from jaxillusions.report import proxy_sizes
from jaxillusions.runtime import schema, stages, timing, watchdog
from jaxillusions.studies import fit_shift
from jaxillusions.studies.stage import PROXIES, TRAINED, Context, ProxyResults, Stage


def with_proxies(settings) -> bool:
    """With proxies (proxies.methods): the weight groups' stages work on their results."""
    return bool(settings.proxies.methods)


def _proxies(ctx: Context) -> Context:
    """Fits every proxy on the training split (resumable per family) and evaluates its
    faithfulness on every evaluation split (resumable per family): makes Context.proxies."""
    pc = ctx.settings.proxies
    specs = specs_from_config(pc, ctx.model_cfg)
    fitted, fit_stamps = _fit(ctx, specs)
    families = [FittedProxy(spec, f) for spec, f in zip(specs, fitted, strict=True)]
    eval_set = make_eval_set(ctx.splits, pc.eval_splits, tasks.get(ctx.settings))
    rows = _evaluate(ctx, specs, fit_stamps, families, eval_set)
    return dataclasses.replace(ctx, proxies=ProxyResults(
        specs=specs, fitted=fitted, fit_stamps=fit_stamps, families=families, eval_set=eval_set,
        rows=rows))


def _fit(ctx: Context, specs: list) -> tuple[list, list[str]]:
    """(fitted params per family, their stage stamps): one stage file per proxy family.
    Statistics are collected together for the families of a collection group
    (collection_groups) whenever one of them still needs fitting; a family's stamp
    names its group's sites, so adding a method with its own targets (proxies.<method>_targets)
    refits only that method."""
    config, files, say, pc = ctx.settings, ctx.files, ctx.say, ctx.settings.proxies
    chunking = Chunking(pc.seed_chunk_size, say)  # seeds per call
    groups = collection_groups(specs)
    collected_sites = {i: sorted({s for j in group for s in specs[j].sites})
                       for group in groups for i in group}
    fit_stamps = [stages.stamp(spec=spec, index=i, seed=config.seed,
                               sites=collected_sites.get(i, []), samples=pc.kmeans_samples,
                               batch=pc.collect_batch_size, **fit_shift.fit_stamp(config))
                  for i, spec in enumerate(specs)]
    fitted = [files.load(files.path(i, spec, ".msgpack"), fit_stamps[i], stages.read_msgpack,
                         lambda value, spec=spec: _fitted_shape(value, spec, len(ctx.seeds)))
              for i, spec in enumerate(specs)]
    todo = [i for i, f in enumerate(fitted) if f is None]
    if todo:
        # The milestone once: in the first group of members, and where training ran.
        milestone = ("training done; " if not config.model.pretrained
                     and (ctx.members is None or 0 in ctx.members) else "")
        say(f"[{time.perf_counter() - ctx.start:.0f}s] {milestone}fitting {len(todo)} proxy "
            f"families on the training split ({len(ctx.splits['train'].tokens)} sentences)")
    done = 0
    for group in [[i for i, s in enumerate(specs) if s.module.STATISTIC is None], *groups]:
        if not set(group) & set(todo):
            continue
        stats = {}
        if specs[group[0]].module.STATISTIC is not None:  # the whole group, as in one run
            with timing.stage("collection"):
                watchdog.progress("collecting activations for "
                                  + ", ".join(f"{specs[i].method} on {specs[i].target}"
                                              for i in group))
                data = fit_shift.fit_data(ctx.splits, "train", config)
                stats = collect(
                    ctx.params, data, ctx.model_cfg, [specs[i] for i in group],
                    num_samples=pc.kmeans_samples, batch_size=pc.collect_batch_size,
                    labels=labels_for([specs[i] for i in group], config, data),
                    chunking=chunking)
        for i in (i for i in group if i in todo):
            say(f"  fitting [{done + 1}/{len(todo)}] {specs[i].method} on {specs[i].target}",
                flush=True)
            watchdog.progress(f"fitting {specs[i].method} on {specs[i].target}")
            with timing.stage("fitting"):
                proxy = fit_one(specs[i], i, stats, jax.random.PRNGKey(config.seed),
                                len(ctx.seeds), chunking=chunking)
                fitted[i] = jax.tree.map(np.asarray, proxy.params)
            stages.write(files.path(i, specs[i], ".msgpack"), serialization.msgpack_serialize(
                {"stamp": fit_stamps[i], "value": fitted[i]}), "proxy fitting")
            done += 1
            stages.stop_if_signalled(
                f"while fitting proxies; {done} of {len(todo)} families fitted and saved in "
                f"{files.dir}; relaunch the same command to resume")
        del stats
    return fitted, fit_stamps


def _evaluate(ctx: Context, specs: list, fit_stamps: list[str], families: list,
              eval_set) -> list[dict]:
    """The rows of every family: one stage file of rows per proxy family."""
    pc, files, say = ctx.settings.proxies, ctx.files, ctx.say
    say(f"[{time.perf_counter() - ctx.start:.0f}s] evaluating on {', '.join(pc.eval_splits)} "
        f"({len(eval_set.tokens)} sentences)")
    rows = []
    scored = {eval_set.split_names[k] for k in np.unique(eval_set.bins[..., 0][eval_set.evaluated])}
    for i, spec in enumerate(specs):
        stamp = stages.stamp(fit=fit_stamps[i], splits=list(pc.eval_splits),
                             batch=pc.eval_batch_size)
        path = files.path(i, spec, "_rows.json")
        family = files.load(path, stamp, stages.read_json, lambda value, spec=spec: _rows_shape(
            value, spec, ctx.seeds, ctx.healthy, scored))
        if family is None:
            watchdog.progress(f"evaluating {spec.method} on {spec.target}")
            with timing.stage("evaluation"):
                # All families shared, so that those of one proxy method share one program.
                family = evaluate(
                    ctx.params, ctx.model_cfg, eval_set, [families[i]],
                    batch_size=pc.eval_batch_size, seeds=ctx.seeds, healthy=ctx.healthy,
                    options=EvalOptions(shared=families,
                                        chunking=Chunking(pc.seed_chunk_size, say)))
            stages.write(path, json.dumps({"stamp": stamp, "value": family}), "proxy evaluation")
        say(f"  [{i + 1}/{len(specs)}] {spec.method} on {spec.target}: sizes "
            f"{proxy_sizes.listed(spec.method, spec.sizes)}", flush=True)
        rows += family
        stages.stop_if_signalled(
            f"while evaluating proxies; {i + 1} of {len(specs)} families evaluated and saved "
            f"in {files.dir}; relaunch the same command to resume")
    return rows


def _fitted_shape(value, spec, num_seeds: int) -> str | None:
    """Why a saved fit cannot be `spec`'s (None if it can): {site: {name: array}} for each of
    its sites, every array with a leading axis of num_seeds."""
    if not isinstance(value, dict) or set(value) != set(spec.sites):
        return f"it does not hold the sites {', '.join(spec.sites)}"
    for leaf in jax.tree.leaves(value):
        if not isinstance(leaf, np.ndarray) or leaf.ndim == 0 or len(leaf) != num_seeds:
            return f"an array of it is not one per seed ({num_seeds})"
    return None


def _rows_shape(rows, spec, seeds, healthy, scored: set[str]) -> str | None:
    """Why saved evaluation rows cannot be `spec`'s on this run (None if they can): rows of
    this family only, each with the columns of results.csv, and for every healthy seed and size
    the same bins, each once (every seed and size is scored on the same positions), among them
    one over all positions per split with evaluated positions (`scored`)."""
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        return "it is not a list of rows"
    need = (*schema.KEYS, *schema.ACCURACIES)
    cells: dict[tuple, list] = {  # (seed, size) -> its bins
        (int(seed), int(size)): [] for seed, ok in zip(seeds, healthy, strict=True) if ok
        for size in spec.sizes}
    for row in rows:
        missing = [key for key in need if key not in row]
        if missing:
            return f"a row has no {missing[0]}"
        if (row["method"], row["site"]) != (spec.method, spec.target):
            return f"a row is of {row['method']} on {row['site']}"
        if (row["seed"], row["size"]) not in cells:
            return f"a row is of seed {row['seed']}, size {row['size']}, not evaluated here"
        cells[row["seed"], row["size"]].append((row["split"], row["breakdown"], row["bin"]))
    first = set(next(iter(cells.values()), []))
    if any(len(bins) != len(first) or set(bins) != first for bins in cells.values()):
        return "its seeds and sizes do not have the same bins, each once"
    if {split for split, breakdown, _ in first if breakdown == "all"} != scored:
        return f"its splits are not {', '.join(sorted(scored))}"
    return None


STAGE = Stage(PROXIES, _proxies, enabled=with_proxies, keys=("proxies.*",),
              clocks=("collection", "fitting", "evaluation", "proxies"), needs=(TRAINED,),
              makes=(PROXIES,))
