"""Fit proxies on other splits than `train` (proxies.fit_splits) and evaluate them everywhere.

A proxy fitted on the training split loses faithfulness out of distribution. Fitting a proxy
of the same size on the OOD split itself separates the two causes (analysis/fit_shift.py):
the part of the gap that refitting removes is tied to the fit distribution, the part that
remains is beyond what a proxy of that size can do.

    proxies.fit_splits = ("train", "unseen_depth", "longer")   # train: the reference, required
    proxies.fit_sentences = 0                                  # cap per fit (0: all)

Halves: a fit split F other than train is cut in two by a fixed permutation of its sentence
indices, drawn from a numpy generator seeded by (a constant naming this stream, config.seed, the
split's number of sentences): its even positions are the fit half, its odd positions the
evaluation half. So no sentence is both fitted on and evaluated, and the cut is the same on
every run, machine and fit split. Every proxy, the train-fitted one included, is evaluated on
the same sentences: the evaluation half of each fit split and the whole of the other
evaluation splits (the "halved evaluation set"); the paired comparisons are on equal footing.

proxies.fit_sentences caps the sentences of every fit (train included) at the first N of the
fit half in permutation order (train: of the same kind of permutation of train), a random
sample; 0 (the default) uses them all, and then the training split is used as it is, so the
train-fitted proxies and results.csv are those of a run without this module.

Only data-dependent proxies (STATISTIC not None) are refitted; the others (one-hot and uniform
attention) do not depend on the fit split and are evaluated once, as fit_split "train".

Batched as the main proxy stage (faithfulness.collect / fit_one / evaluate over seeds and
sizes), resumable per (fit split, family) with stage files under proxies/fit_<split>/, each
stamped with what it was computed with.
"""

from __future__ import annotations

import json
import os
import zlib

import jax
import numpy as np
from flax import serialization

from jaxillusions import faithfulness, proxies, stages, tasks, timing
from jaxillusions.analysis import fit_shift as fit_shift_report

_STREAM = zlib.crc32(b"jaxillusions.fit_shift.halves")  # names the halves' random stream
REFERENCE = "train"
SAMPLE_BOUNDED = ("kmeans",)  # proxies whose sizes may not exceed the vectors fitted on


def permutation(num_sentences: int, seed: int) -> np.ndarray:
    """The fixed permutation of a split's sentence indices (see the module docstring)."""
    return np.random.default_rng([_STREAM, seed, num_sentences]).permutation(num_sentences)


def halves(num_sentences: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(fit half in permutation order, evaluation half sorted): disjoint, together every index."""
    order = permutation(num_sentences, seed)
    return order[0::2], np.sort(order[1::2])


def fit_data(splits: dict, name: str, config):
    """The sentences proxies are fitted on for fit split `name`: train as it is unless capped,
    another split's fit half (capped by proxies.fit_sentences)."""
    split, cap, seed = splits[name], config.proxies.fit_sentences, config.seed
    if name == REFERENCE:
        return split if not cap else tasks.subset(split, permutation(len(split.tokens), seed)[:cap])
    index = halves(len(split.tokens), seed)[0]
    return tasks.subset(split, index[:cap] if cap else index)


def fit_stamp(config) -> dict:
    """What the train fit's stage stamp gains: nothing at the default (so the stage files of
    runs without this module stay valid), else the cap."""
    return {"fit_sentences": config.proxies.fit_sentences} if config.proxies.fit_sentences else {}


def check_config(config) -> None:
    """One-line ValueError for bad fit settings (validate runs it before any work)."""
    pc, task = config.proxies, tasks.get(config)
    names = config.proxies.fit_splits
    for name in names:
        if name not in task.SPLITS:
            other = [t for t in tasks.TASKS if name in tasks.get(t).SPLITS]
            where = f"a split of task {other[0]}, not" if other else "unknown in"
            raise ValueError(f"proxies.fit_splits: {name!r} is {where} task {task.NAME}; "
                             f"available: {', '.join(task.SPLITS)}")
    if REFERENCE not in names or len(set(names)) != len(names):
        raise ValueError(f"proxies.fit_splits={names}: must list {REFERENCE!r} (the reference "
                         "of every paired comparison) and each split once")
    cap, width = config.proxies.fit_sentences, task.widest_width(config.data)
    for method in [m for m in pc.methods if m in SAMPLE_BOUNDED] if cap else ():
        # A fit on `cap` sentences sees at most cap * width positions (vectors to cluster).
        largest = max(getattr(pc, proxies.sizes_key(proxies.get(method))))
        if cap * width < largest:
            raise ValueError(f"proxies.fit_sentences={cap}: at most {cap * width} positions "
                             f"to fit {method} on, fewer than its largest size {largest}; use "
                             f"at least {-(-largest // width)} sentences, or 0 (all)")


def enabled(config) -> bool:
    """With proxies.fit_splits beyond train (proxies fitted on other splits too)."""
    return any(s != REFERENCE for s in config.proxies.fit_splits)


def run(ctx: stages.Context) -> stages.Context:
    """The stage, on a weight group's context: adds `shift_rows`, the rows of every proxy fitted
    on every split of proxies.fit_splits (column fit_split), evaluated on the halved evaluation
    set, from the proxy stage's train fits (`specs`, `fitted`, `fit_stamps`); the report stage
    writes their tables."""
    config, params, splits, say = ctx.settings, ctx.params, ctx.splits, ctx.say
    specs, fitted, fit_stamps = (ctx.results[k] for k in ("specs", "fitted", "fit_stamps"))
    others = [s for s in config.proxies.fit_splits if s != REFERENCE]
    pc, seed = config.proxies, config.seed
    chunking = faithfulness.Chunking(pc.seed_chunk_size, say)
    files, model_cfg, seeds, healthy = ctx.files, ctx.model_cfg, ctx.seeds, ctx.healthy
    halved = {n: tasks.subset(splits[n], halves(len(splits[n].tokens), seed)[1])
              for n in pc.eval_splits if n in others}
    eval_set = faithfulness.make_eval_set({**splits, **halved}, pc.eval_splits,
                                          tasks.get(config))
    eval_stamp = dict(splits=list(pc.eval_splits), halved=sorted(halved), seed=seed,
                      batch=pc.eval_batch_size)
    train_fitted = [faithfulness.FittedProxy(s, f) for s, f in zip(specs, fitted, strict=True)]
    dependent = [i for i, s in enumerate(specs) if s.module.STATISTIC is not None]
    say(f"fit shift: fitting on {', '.join(others)} (their fit halves), evaluating every fit on "
        f"{', '.join(pc.eval_splits)} (halved: {', '.join(halved) or 'none'})")
    rows = []
    for name in (REFERENCE, *others):
        directory = os.path.join(files.dir, f"fit_{name}")
        os.makedirs(directory, exist_ok=True)
        family_fits = list(train_fitted)
        stamps = {i: fit_stamps[i] for i in range(len(specs))}
        if name != REFERENCE:
            data = fit_data(splits, name, config)
            stamps = {i: stages.stamp(train=fit_stamps[i], fit_split=name,
                                      sentences=len(data.tokens), seed=seed)
                      for i in dependent}
            family_fits = _fit(ctx, data, dependent, stamps, directory, family_fits)
        for i in sorted(stamps):
            spec = specs[i]
            path = os.path.join(directory, os.path.basename(files.path(i, spec, "_rows.json")))
            stamp = stages.stamp(fit=stamps[i], **eval_stamp)
            family = files.load(path, stamp, stages.read_json)
            if family is None:
                with timing.stage("evaluation"):
                    family = faithfulness.evaluate(
                        params, model_cfg, eval_set, [family_fits[i]],
                        batch_size=pc.eval_batch_size, seeds=seeds, healthy=healthy,
                        options=faithfulness.EvalOptions(shared=family_fits,
                                                         chunking=chunking))
                stages.write(path, json.dumps({"stamp": stamp, "value": family}),
                             "fit-shift evaluation")
            rows += [{"fit_split": name, **row} for row in family]
            stages.stop_if_signalled(
                f"while evaluating proxies fitted on {name}; the finished families are saved "
                f"in {directory}; relaunch the same command to resume")
        say(f"  fit on {name}: {len(stamps)} families evaluated", flush=True)
    return ctx.produced(shift_rows=rows)


def _fit(ctx: stages.Context, data, dependent: list[int], stamps: dict, directory: str,
         family_fits: list) -> list:
    """family_fits with the data-dependent families (indices `dependent` of the proxy stage's
    specs) fitted on `data` by the group of `ctx` (loaded from their stage files under
    `directory` where those carry `stamps`). Collected once for all families that need it."""
    config, params, model_cfg, files = ctx.settings, ctx.params, ctx.model_cfg, ctx.files
    specs, pc, out = ctx.results["specs"], config.proxies, list(family_fits)
    chunking = faithfulness.Chunking(pc.seed_chunk_size, ctx.say)
    paths = {i: os.path.join(directory, os.path.basename(files.path(i, specs[i], ".msgpack")))
             for i in dependent}
    loaded = {i: files.load(paths[i], stamps[i], stages.read_msgpack)
              for i in dependent}
    todo = [i for i in dependent if loaded[i] is None]
    if todo:
        if not len(data.tokens):
            raise ValueError(f"proxies.fit_splits: the fit half of {os.path.basename(directory)}"
                             " has no sentences")
        with timing.stage("collection"):
            stats = faithfulness.collect(params, data, model_cfg, [specs[i] for i in todo],
                                         num_samples=pc.kmeans_samples,
                                         batch_size=pc.collect_batch_size,
                                         chunking=chunking,
                                         labels=faithfulness.labels_for(
                                             [specs[i] for i in todo], config, data))
        for i in todo:
            with timing.stage("fitting"):
                # The train fit's random keys (spec index i): only the data differ.
                proxy = faithfulness.fit_one(specs[i], i, stats, jax.random.PRNGKey(config.seed),
                                             jax.tree.leaves(params)[0].shape[0],
                                             chunking=chunking)
                loaded[i] = jax.tree.map(np.asarray, proxy.params)
            stages.write(paths[i], serialization.msgpack_serialize(
                {"stamp": stamps[i], "value": loaded[i]}), "fit-shift fitting")
        del stats
    for i in dependent:
        out[i] = faithfulness.FittedProxy(specs[i], loaded[i])
    return out


def _check(settings, model_cfg) -> None:
    del model_cfg
    check_config(settings)


# The main job's stage (sweep.PIPELINE): per weight group, after the proxies; the report stage
# writes its tables (analysis/fit_shift.py).
STAGE = stages.Stage("fit_shift", run, enabled=enabled, check=_check, keys=("proxies.*",),
                     outputs=fit_shift_report.REPORTS)
