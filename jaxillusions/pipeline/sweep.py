"""The main job: train a sweep of seeds, fit every proxy, evaluate faithfulness on every split.

The order of the work is one tuple, `PIPELINE`: each `stages.Stage` has a name, when it runs,
what it computes (a `stages.Context` in, the context with its results out), the
settings its results depend on and the report files it writes:

    training -> wen -> induction -> proxies -> dictionaries -> geometry -> probes -> fit_shift
             -> circuits -> reports -> figures

The first three run once per run; the rest once per weight group (one group, the workdir
itself, unless train.contrastive_weights sweeps several weights: then each weight's members go
to <workdir>/contrastive_weight_<w>, so that aggregates over seeds never mix weights), and only
with proxies (proxies.methods). A new study is a module with a `STAGE` and one line here.

Writes into the workdir: results.csv (tidy rows), gap_table.txt with gaps.csv,
proxy_vs_original.csv, id_predicts_gap.csv and min_size.csv (report/stats.py), with method sae
dictionaries_*.csv (studies/dictionaries.py), with fit_shift.splits beyond train
fit_shift_results.csv, fit_x_eval.csv and gap_decomposition.csv
(studies/fit_shift.py), with geometry.enabled or geometry.repair_sentences geometry.csv,
geometry_predicts_gap.csv and repair.csv (studies/geometry.py), figures/*.png (those the setting
`figures` chooses: the summary set by default; `complete_figures`, i.e. python -m launch.figures,
draws the rest later), TensorBoard curves and the hparams view, and the training checkpoints.

Each stage is saved as it finishes, so a relaunch of the same command resumes where the last
one stopped: training from its newest checkpoint, a stage saved whole (Stage.stamped: Wen et
al.'s, induction) from its stage file, then each proxy family's fitted parameters
(proxies/<i>_<method>_<target>.msgpack) and its evaluation rows (..._rows.json), then the
reports; a finished sweep (sweep_done.json, with the sha256 of every report it wrote) is left as
it is while its reports match their checksums, and has them written again from the stage files
otherwise. A stage file records the settings it was computed with; if an analysis setting changed
since, the stale file is moved to superseded/<time>/ (with the results it produced) and
recomputed. A damaged stage file, or one of valid JSON whose content is not what its stage
writes, is moved aside the same way and recomputed.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import glob
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

import jax
import numpy as np
from flax import serialization
from PIL import Image

from jaxillusions import faithfulness, model, tasks
from jaxillusions.config.settings import Settings
from jaxillusions.report import board, figures, results, tables
from jaxillusions.runtime import (
    checkpoint,
    distributed,
    interrupt,
    schema,
    stages,
    timing,
    watchdog,
)
from jaxillusions.runtime import tensorboard as log_lib
from jaxillusions.runtime.stages import Context, Stage
from jaxillusions.studies import circuits, dictionaries, fit_shift, geometry, induction, probes, wen
from jaxillusions.training import objective, train

DONE_FILE = "sweep_done.json"
# Settings of how the work runs, not of what it computes: a change redoes nothing.
ENGINE_KEYS = ("proxies.seed_chunk_size",)


def _stop_in_reports(workdir: str) -> None:
    """Raises interrupt.Stopped if this process received a signal while writing the reports
    (process 0 alone writes them: no collective here)."""
    interrupt.raise_if_requested(
        f"while writing the reports; results.csv and the proxy stages are saved in {workdir}; "
        "relaunch the same command to write the reports")


# --- The stages of the job itself (the studies' are in their modules) -------------------------

def _train(ctx: Context) -> Context:
    """Trains every member (train.train_sweep: resumes from the newest checkpoint)."""
    state, final_eval = train.train_sweep(ctx.settings, ctx.workdir, splits=ctx.splits,
                                          verbose=ctx.verbose, start_over=ctx.start_over)
    return dataclasses.replace(ctx, state=state, final_eval=final_eval)


def _proxies(ctx: Context) -> Context:
    """Fits every proxy on the training split (resumable per family) and evaluates its
    faithfulness on every evaluation split (resumable per family). Adds `specs`, `fitted`,
    `fit_stamps`, `shared` (the FittedProxy list), `eval_set` and the result `rows`."""
    pc = ctx.settings.proxies
    specs = faithfulness.specs_from_config(pc, ctx.model_cfg)
    fitted, fit_stamps = _fit(ctx, specs)
    shared = [faithfulness.FittedProxy(spec, f) for spec, f in zip(specs, fitted, strict=True)]
    eval_set = faithfulness.make_eval_set(ctx.splits, pc.eval_splits, tasks.get(ctx.settings))
    ctx = ctx.produced(specs=specs, fitted=fitted, fit_stamps=fit_stamps, shared=shared,
                       eval_set=eval_set)
    return ctx.produced(rows=_evaluate(ctx))


def _fit(ctx: Context, specs: list) -> tuple[list, list[str]]:
    """(fitted params per family, their stage stamps): one stage file per proxy family.
    Statistics are collected together for the families of a collection group
    (faithfulness.collection_groups) whenever one of them still needs fitting; a family's stamp
    names its group's sites, so adding a method with its own targets (proxies.<method>_targets)
    refits only that method."""
    config, files, say, pc = ctx.settings, ctx.files, ctx.say, ctx.settings.proxies
    chunking = faithfulness.Chunking(pc.seed_chunk_size, say)  # seeds per call
    groups = faithfulness.collection_groups(specs)
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
        say(f"[{time.perf_counter() - ctx.start:.0f}s] training done; fitting {len(todo)} proxy "
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
                stats = faithfulness.collect(
                    ctx.params, data, ctx.model_cfg, [specs[i] for i in group],
                    num_samples=pc.kmeans_samples, batch_size=pc.collect_batch_size,
                    labels=faithfulness.labels_for([specs[i] for i in group], config, data),
                    chunking=chunking)
        for i in (i for i in group if i in todo):
            say(f"  fitting [{done + 1}/{len(todo)}] {specs[i].method} on {specs[i].target}",
                flush=True)
            watchdog.progress(f"fitting {specs[i].method} on {specs[i].target}")
            with timing.stage("fitting"):
                proxy = faithfulness.fit_one(specs[i], i, stats, jax.random.PRNGKey(config.seed),
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


def _evaluate(ctx: Context) -> list[dict]:
    """The rows of every family: one stage file of rows per proxy family."""
    pc, files, say, r = ctx.settings.proxies, ctx.files, ctx.say, ctx.results
    specs, eval_set = r["specs"], r["eval_set"]
    say(f"[{time.perf_counter() - ctx.start:.0f}s] evaluating on {', '.join(pc.eval_splits)} "
        f"({len(eval_set.tokens)} sentences)")
    rows = []
    scored = {eval_set.split_names[k] for k in np.unique(eval_set.bins[..., 0][eval_set.evaluated])}
    for i, spec in enumerate(specs):
        stamp = stages.stamp(fit=r["fit_stamps"][i], splits=list(pc.eval_splits),
                             batch=pc.eval_batch_size)
        path = files.path(i, spec, "_rows.json")
        family = files.load(path, stamp, stages.read_json, lambda value, spec=spec: _rows_shape(
            value, spec, ctx.seeds, ctx.healthy, scored))
        if family is None:
            watchdog.progress(f"evaluating {spec.method} on {spec.target}")
            with timing.stage("evaluation"):
                # All families shared, so that those of one proxy method share one program.
                family = faithfulness.evaluate(
                    ctx.params, ctx.model_cfg, eval_set, [r["shared"][i]],
                    batch_size=pc.eval_batch_size, seeds=ctx.seeds, healthy=ctx.healthy,
                    options=faithfulness.EvalOptions(shared=r["shared"], chunking=faithfulness.
                                                     Chunking(pc.seed_chunk_size, say)))
            stages.write(path, json.dumps({"stamp": stamp, "value": family}), "proxy evaluation")
        say(f"  [{i + 1}/{len(specs)}] {spec.method} on {spec.target}: sizes "
            f"{list(spec.sizes)}", flush=True)
        rows += family
        stages.stop_if_signalled(
            f"while evaluating proxies; {i + 1} of {len(specs)} families evaluated and saved "
            f"in {files.dir}; relaunch the same command to resume")
    return rows


def _report(ctx: Context) -> Context:
    """results.csv, the statistics and tables (write_reports), the fit-shift tables; process 0."""
    if not distributed.is_main():  # process 0 writes the reports
        return ctx
    config, workdir, rows = ctx.settings, ctx.directory, ctx.results["rows"]
    with stages.writing("report", os.path.join(workdir, "results.csv")):
        results.write_csv(rows, os.path.join(workdir, "results.csv"))
    _stop_in_reports(workdir)
    data_baselines = tasks.get(config).baselines(ctx.splits, list(config.proxies.eval_splits))
    write_reports(rows, config, workdir, ctx.seeds, ctx.healthy, verbose=ctx.verbose,
                  model_cfg=ctx.model_cfg, data_baselines=data_baselines)
    if ctx.results.get("shift_rows"):
        with stages.writing("report", workdir):
            fit_shift.write_reports(ctx.results["shift_rows"], config, workdir,
                                           say=ctx.say)
    return ctx


def _figures(ctx: Context) -> Context:
    """The activation figures (the result figures are the report's); process 0."""
    if not distributed.is_main():
        return ctx
    _stop_in_reports(ctx.directory)
    write_activation_figures(ctx.params, ctx.splits, ctx.model_cfg, ctx.settings, ctx.directory,
                             ctx.seeds, ctx.healthy)
    ctx.say(f"[{time.perf_counter() - ctx.start:.0f}s] proxies done: {ctx.directory}/results.csv, "
            f"{ctx.directory}/figures/")
    return ctx


TRAINING = Stage("training", _train, scope="run")
def _with_proxies(settings) -> bool:
    """With proxies (proxies.methods): the weight groups' stages work on their results."""
    return bool(settings.proxies.methods)


PROXIES = Stage("proxies", _proxies, enabled=_with_proxies, keys=("proxies.*",),
                clocks=("collection", "fitting", "evaluation", "proxies"))
REPORTS = Stage("reports", _report, enabled=_with_proxies, keys=("proxies.*",),
                clocks=("reports", "figures"), outputs=(
    "results.csv", "gap_table.txt", "gaps.csv", "proxy_vs_original.csv", "id_predicts_gap.csv",
    "min_size.csv", "baselines.csv", "gaps_by_*.csv", "identifier_gap.csv"))
# Which figures (the setting `figures`) is not an analysis key: complete_figures draws the rest.
FIGURES = Stage("figures", _figures, enabled=_with_proxies, outputs=("figures",))

PIPELINE: tuple[Stage, ...] = (
    TRAINING, wen.STAGE, induction.STAGE, PROXIES, dictionaries.STAGE, geometry.STAGE,
    probes.STAGE, fit_shift.STAGE, circuits.STAGE, REPORTS, FIGURES)


# --- The runner ---------------------------------------------------------------------------------

def clocks(pipeline: Sequence[Stage] = PIPELINE) -> tuple[str, ...]:
    """The timing line's stage names, in the pipeline's order."""
    return tuple(dict.fromkeys(c for s in pipeline for c in (s.clocks or (s.name,))))


def _analysis_settings(config, pipeline: Sequence[Stage] = PIPELINE) -> dict:
    """The settings that define the analysis' results: those some stage's `keys` name (not
    ENGINE_KEYS, e.g. proxies.seed_chunk_size: how many seeds run at once changes no number)."""
    patterns = [k for stage in pipeline if stage.scope == "group" or stage.stamped
                for k in stage.keys]
    return {k: v for k, v in log_lib.flatten_config(config).items()
            if any(fnmatch.fnmatchcase(k, p) for p in patterns) and k not in ENGINE_KEYS}


def _stage_stamp(stage: Stage, ctx: Context) -> str:
    """A stage saved whole depends on its keys and on the trained step."""
    values = {k: v for k, v in log_lib.flatten_config(ctx.settings).items()
              if any(fnmatch.fnmatchcase(k, p) for p in stage.keys) and k not in ENGINE_KEYS}
    return stages.stamp(step=int(np.max(ctx.state.step)) if ctx.state is not None else 0,
                        **values)


def _run_stage(stage: Stage, ctx: Context) -> Context:
    """Runs one enabled stage on its context, timed; a stage saved whole (Stage.stamped) is
    skipped while its stage file carries the same stamp and its outputs are there, and otherwise
    moves them aside before it runs, and saves its stage file after."""
    directory = ctx.directory or ctx.workdir
    path, stamp = stages.stage_file(directory, stage.name), None
    if stage.stamped:
        stamp = _stage_stamp(stage, ctx)
        outputs = [os.path.join(directory, o) for o in stage.outputs]
        rel, unreadable = os.path.relpath(path, ctx.workdir), False
        try:  # why the outputs there, if any, are moved aside (None: the stage is done)
            saved = stages.read_json(path)
            why = (f"has no stage file ({rel}) to say which settings made it" if saved is None
                   else None if isinstance(saved, dict) and saved.get("stamp") == stamp
                   else stages.STALE)
        except (OSError, ValueError):
            why, unreadable = f"has an unreadable stage file ({rel})", True
        missing = [os.path.relpath(o, ctx.workdir) for o in outputs
                   if not glob.glob(glob.escape(o) if "*" not in o else o)]
        if why is None and not missing:
            ctx.say(f"{stage.name}: done before (stage file {rel})")
            return ctx
        why = why or f"belongs with {', '.join(missing)}, which is missing: the stage runs again"
        for p in [path, *outputs]:
            for found in sorted(glob.glob(p)):
                ctx.move_aside(found, "is unreadable" if unreadable and found == path else why)
    watchdog.progress(f"the {stage.name} stage")
    with timing.stage(stage.name):
        ctx = stage.run(ctx)
    if stage.stamped:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        stages.write(path, json.dumps({"stamp": stamp}), stage.name)
    return ctx


def _reports(config, workdir: str, pipeline: Sequence[Stage] = PIPELINE,
             stamped: bool = True) -> list[str]:
    """The report files and directories (the stages' outputs) in the workdir and its weight
    groups; without `stamped`, not those of the enabled stages saved whole (their stage file
    decides whether they are current; a disabled one's are an earlier analysis's)."""
    dirs = dict.fromkeys([workdir] + [d for _, d in _weight_groups(config, workdir)])
    patterns = [o for s in pipeline if stamped or not (s.stamped and s.enabled(config))
                for o in s.outputs]
    return [path for directory in dirs for pattern in patterns
            for path in sorted(glob.glob(os.path.join(glob.escape(directory), pattern)))]


def _mark_done(config, workdir: str, pipeline: Sequence[Stage] = PIPELINE) -> None:
    """sweep_done.json: when, with which analysis settings, and the sha256 of every report file
    (by path under the workdir; a directory's files one by one), which a relaunch verifies."""
    if not distributed.is_main():  # process 0 writes the files
        return
    files = []
    for path in _reports(config, workdir, pipeline):
        files += ([os.path.join(d, f) for d, _, names in os.walk(path) for f in names]
                  if os.path.isdir(path) else [path])
    stages.write(os.path.join(workdir, DONE_FILE), json.dumps(
        {"time": checkpoint._now(), "analysis": _analysis_settings(config, pipeline),  # noqa: SLF001
         "stages": _enabled(config, pipeline),
         "figures": config.figures,  # which were drawn; complete_figures draws the rest
         "reports": {os.path.relpath(f, workdir): stages.sha256(f) for f in files}},
        indent=2, sort_keys=True), "final")


def _enabled(config, pipeline: Sequence[Stage]) -> list[str]:
    return [stage.name for stage in pipeline if stage.enabled(config)]


def _done_shape(done) -> str | None:
    """Why parsed JSON is not a record _mark_done writes (None if it is one)."""
    if not isinstance(done, dict) or not isinstance(done.get("analysis"), dict) \
            or not isinstance(done.get("time"), str):
        return (f"valid JSON, but a {type(done).__name__} without the time and analysis "
                "settings of a finished sweep")
    reports = done.get("reports", {})  # absent in files written before the checksums
    if not isinstance(reports, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in reports.items()):
        return "valid JSON, but its reports are not {file: sha256}"
    ran = done.get("stages", [])  # absent in files written before the pipeline tuple
    if not isinstance(ran, list) or not all(isinstance(s, str) for s in ran):
        return "valid JSON, but its stages are not a list of names"
    return None


def _read_done(workdir: str, move_aside) -> dict | None:
    """sweep_done.json, or None if the sweep has not finished. An unreadable one, or valid JSON
    of another shape, is moved aside and read as a finished sweep of unknown analysis settings
    ({"analysis": None}: the analysis is done again from the saved stages)."""
    path = os.path.join(workdir, DONE_FILE)
    try:
        done = stages.read_json(path)
        why = None if done is None else _done_shape(done)
    except (OSError, ValueError) as err:
        why = checkpoint.error_line(err)
    if why is None:
        return done
    move_aside(path, f"is unreadable ({why}); the reports are written again")
    return {"analysis": None}


def _unverified(done: dict, workdir: str) -> str | None:
    """Why the reports of a finished sweep are not those sweep_done.json vouches for (a file
    missing, emptied or changed since), or None when every one matches its sha256."""
    if "reports" not in done:
        return f"its {DONE_FILE} predates the checksums of the reports, so they are unverified"
    for name, digest in sorted(done["reports"].items()):
        path = os.path.join(workdir, name)
        if not os.path.isfile(path):
            return f"its {name} is missing"
        if stages.sha256(path) != digest:
            return (f"its {name} is empty" if os.path.getsize(path) == 0 else
                    f"its {name} differs from the sha256 recorded in {DONE_FILE}")
    return None


def run(config: Settings, workdir: str, *, verbose: bool = True, start_over: bool = False,
        pipeline: Sequence[Stage] = PIPELINE) -> list[dict]:
    """The whole job, resumable stage by stage (see the module docstring). Returns the rows.
    `config`: Settings that passed the door's check, `settings, notes = validate.check(config)`
    (the launchers call it; it also splits the CPU into config.cpu_devices before JAX starts).
    `pipeline`: the stages, in order (PIPELINE; a test or an experiment may add its own).
    Ends with one line saying where the time went: seconds per stage, in the pipeline's order,
    and compilations (timing.Breakdown).

    With several processes (distributed.initialize) all of them compute, each on its devices'
    seeds, and process 0 alone writes the files; every process returns all rows."""
    if not isinstance(config, Settings):
        raise TypeError(f"sweep.run takes checked Settings, not a {type(config).__name__}: "
                        "call `settings, notes = validate.check(config)` first")
    # the check's devices, or a one-line error
    distributed.use_devices(config.cpu_devices, config.gpu_deterministic)
    with timing.Breakdown() as clock, watchdog.watching(config.stall_seconds, workdir):
        rows = _run(config, workdir, verbose=verbose, start_over=start_over, pipeline=pipeline)
    if clock.seconds and verbose and distributed.is_main():  # not when there was nothing to do
        print(clock.line(clocks(pipeline)))
    return rows


def _finished(config: Settings, workdir: str, done: dict, say) -> list[dict]:
    """The rows of a finished sweep whose reports match their checksums; with figures=all on a
    sweep that drew the summary, the rest, as launch.figures draws them (a marker without
    "figures" predates the setting: every figure was drawn)."""
    pc = config.proxies
    rows = [row for _, group_dir in _weight_groups(config, workdir) if pc.methods
            for row in results.read_csv(os.path.join(group_dir, "results.csv"))]
    where = f"{workdir}/results.csv" if pc.methods else workdir
    todo = ("nothing to do" if not pc.methods or config.figures != "all"
            or done.get("figures", "all") == "all" else "")
    if not todo and distributed.is_main():
        with timing.stage("figures"):
            todo = (f"drew the {len(complete_figures(config, workdir, say))} figures "
                    "it had left out (figures=all)")
    say(f"the sweep in {workdir} is finished (finished {done['time']}); {todo}. "
        f"Results: {where}. Change a proxies.* or wen.* setting to redo the analysis.")
    return rows


def _run(config: Settings, workdir: str, *, verbose: bool, start_over: bool,
         pipeline: Sequence[Stage]) -> list[dict]:
    say = print if verbose and distributed.is_main() else (lambda *a, **k: None)
    start = time.perf_counter()
    # Checked here; claimed (config.json written) by train_sweep once the data has loaded, so a
    # data error leaves a fresh workdir unclaimed.
    train.claim_workdir(workdir, config, record=False)
    move_aside = stages.mover(workdir, say)
    done = _read_done(workdir, move_aside)
    ran = done.get("stages", _enabled(config, pipeline)) if done else None  # (older: the same)
    if done is not None and done["analysis"] == _analysis_settings(config, pipeline) \
            and ran != _enabled(config, pipeline):
        say(f"the sweep in {workdir} finished without the stages "
            f"{', '.join(s for s in _enabled(config, pipeline) if s not in ran) or '(none)'} "
            f"(it ran {', '.join(ran)}): they run now, the others resume from their stage files")
    elif done is not None and done["analysis"] == _analysis_settings(config, pipeline):
        why = _unverified(done, workdir)
        if why is None:
            return _finished(config, workdir, done, say)
        if not checkpoint.has_checkpoints(workdir):  # rewriting would mean training again
            raise ValueError(
                f"the sweep in {workdir} finished, but {why}, and {workdir}/"
                f"{checkpoint.CHECKPOINT_DIR} holds no checkpoint to write the reports again "
                "from: restore the file from a copy, or run the sweep again in a new "
                "--workdir")
        say(f"{'note' if 'reports' not in done else 'warning'}: the sweep in {workdir} "
            f"finished, but {why}; the reports are written again from the saved stages (the "
            "earlier ones are kept under superseded/)")
    elif done is not None and done["analysis"] is not None:
        say("analysis settings changed since the sweep finished: training is kept; proxy "
            "families are refitted and re-evaluated where their settings changed")
    # The earlier reports are kept, under superseded/, before they are written again; without a
    # done-file too (a sweep stopped in its report stage), whose analysis may have been another.
    for path in _reports(config, workdir, pipeline, stamped=False):
        move_aside(path, stages.STALE if done is not None else
                   f"is from a sweep that did not finish (no {DONE_FILE}); the reports are "
                   "written again")

    splits, model_cfg, _ = train.build(config)
    ctx = Context(settings=config, workdir=workdir, say=say, verbose=verbose,
                  move_aside=move_aside, splits=splits, model_cfg=model_cfg, start=start,
                  start_over=start_over)
    groups = []
    for stage in pipeline:
        if not stage.enabled(config):
            continue
        if stage.scope == "run":
            ctx = _run_stage(stage, ctx)
            continue
        if not config.proxies.methods:  # the group stages work on the proxies' results
            break
        if not groups:
            groups = [_group(ctx, idx, directory)
                      for idx, directory in _weight_groups(config, workdir)]
        groups = [_run_stage(stage, group) for group in groups]
    _mark_done(config, workdir, pipeline)
    if not groups:
        return []
    # One weight group: all its logs are in <workdir>/tensorboard (the README's logdir);
    # several: each group has its own under contrastive_weight_<w>/, so the workdir.
    logdir = os.path.join(workdir, "tensorboard") if len(groups) == 1 else workdir
    say(f"[{time.perf_counter() - start:.0f}s] done: {workdir}, TensorBoard: "
        f"tensorboard --logdir {logdir}")
    if config.figures != "all":
        say(f"figures: {'none' if config.figures == 'none' else 'the summary set'} (setting "
            f"figures); python -m launch.figures {workdir} draws the rest")
    return [row for group in groups for row in group.results.get("rows", [])]


def _group(ctx: Context, idx: np.ndarray, directory: str) -> Context:
    """The context of one weight group: its members' parameters, health and seeds, its
    directory and stage files."""
    os.makedirs(directory, exist_ok=True)
    seeds = tuple(int(s) for s in train.members(ctx.settings).seeds[idx])
    return dataclasses.replace(
        ctx, directory=directory, members=idx, seeds=seeds,
        params=jax.tree.map(lambda x: x[idx], ctx.state.params),
        healthy=np.asarray(ctx.state.healthy)[idx],
        files=stages.Stages(directory, ctx.move_aside), results={})


def _weight_groups(config, workdir: str) -> list[tuple[np.ndarray, str]]:
    """(member indices, directory) per contrastive weight: the workdir itself for one weight."""
    weights = train.members(config).hparams["contrastive_weight"]
    unique = list(dict.fromkeys(weights.tolist()))
    if len(unique) == 1:
        return [(np.arange(len(weights)), workdir)]
    return [(np.flatnonzero(weights == w), os.path.join(workdir, f"contrastive_weight_{w:g}"))
            for w in unique]


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


def write_reports(rows, config, workdir: str, seeds, healthy, *, verbose: bool = True,
                  model_cfg=None, data_baselines: dict | None = None) -> None:
    """Statistics (gap_table.txt and its CSV tables, report/stats.py), figures and
    TensorBoard views from the result rows. `data_baselines`: the task's data-only predictors
    per split ({split: {metric: value}}, e.g. a unigram model), written to baselines.csv."""
    splits = list(config.proxies.eval_splits)
    baseline = config.proxies.gap_baseline
    task = tasks.get(config)
    labelled = {b: task.bin_labels(b) for b in task.BREAKDOWNS if task.bin_labels(b)}
    text, stat_tables = tables.statistics_report(rows, splits, baseline=baseline,
                                                 evaluated=task.EVALUATED,
                                                 by_bin=labelled,
                                                 data_baselines=data_baselines,
                                                 in_distribution=task.IN_DISTRIBUTION)
    mechanism = induction.report_lines(config, workdir)  # lines that join the headline
    if mechanism:
        head, sep, rest = text.partition("\n\n")
        text = "\n".join([head, *mechanism]) + sep + rest
    text = "\n".join([text, *probes.report_lines(config, workdir)])  # with probes.sites
    if data_baselines:
        names = list(dict.fromkeys(m for b in data_baselines.values() for m in b))
        with stages.writing("report", os.path.join(workdir, "baselines.csv")):
            tables.write_csv([{"split": s, **b} for s, b in data_baselines.items()],
                             os.path.join(workdir, "baselines.csv"), ("split", *names))
    for name, table in stat_tables.items():
        columns = tables.STAT_COLUMNS.get(name, tables.BIN_GAP_COLUMNS)
        with stages.writing("report", os.path.join(workdir, f"{name}.csv")):
            tables.write_csv(table, os.path.join(workdir, f"{name}.csv"), columns)
    _write_tables(workdir, dictionaries.results_tables(
        rows, baseline, tasks.get(config.task).IN_DISTRIBUTION))  # with method sae
    with stages.writing("report", os.path.join(workdir, "gap_table.txt")), \
            open(os.path.join(workdir, "gap_table.txt"), "w") as f:
        f.write(text + "\n")
    if verbose:  # the headline only; the full tables are in the file
        print(tables.summary_of(text))
        print(f"(full tables: {os.path.join(workdir, 'gap_table.txt')})")

    # Figures and TensorBoard show the same paired gaps as gaps.csv (the chosen baseline), the
    # other in-distribution split (iid_with_train) included: the control, a gap near 0.
    gaps = [g for g in stat_tables["gaps"] if g["baseline"] == baseline
            and g["split"] != baseline]
    with timing.stage("figures"):  # and the TensorBoard views
        write_views(rows, config, workdir, seeds, healthy, model_cfg=model_cfg, gaps=gaps)


def _write_tables(workdir: str, named: dict) -> None:
    for name, (table, columns) in named.items():
        with stages.writing("report", os.path.join(workdir, f"{name}.csv")):
            tables.write_csv(table, os.path.join(workdir, f"{name}.csv"), columns)


def write_views(rows, config, workdir: str, seeds, healthy, *, model_cfg=None,
                gaps=()) -> None:
    """Figures (figures/*.png, also under TensorBoard's IMAGES; those of `figure_jobs` that the
    setting `figures` chooses) and the TensorBoard reports (report/board.py) from the result
    rows and, when given, the paired gaps (report/stats.py)."""
    jobs = figure_jobs(rows, config, gaps, config.figures)
    with stages.writing("report", os.path.join(workdir, "tensorboard")), \
            log_lib.board(workdir, seeds) as writer:
        draw(jobs, writer, workdir)
        board.write_all(writer, rows, config, model_cfg, board.Sessions(seeds, healthy),
                        workdir, gaps)


def figure_jobs(rows, config: Settings, gaps=(), which: str = "all") -> list[tuple]:
    """The figures of the result rows and the paired gaps (those of the gap baseline), as jobs of
    `draw`. `which`="summary" (settings.FIGURES): the paired gaps per split (gap_vs_size_<method>,
    gaps_attention_proxies; with `gaps`), faithfulness against size (faithfulness_<method>) and
    the task's categorical breakdowns (same_pred_by_<breakdown>_<method>); "all": also accuracy
    per bin of every breakdown with a training bound, one figure per proxy family
    (accuracy_by_<breakdown>_<method>_<site>); "none": no figure."""
    if which == "none":
        return []
    splits = list(config.proxies.eval_splits)
    methods = list(dict.fromkeys(r["method"] for r in rows))
    sized = [m for m in methods if any(r["method"] == m and r["size"] > 0 for r in rows)]
    unsized = [m for m in methods if m not in sized]
    task = tasks.get(config)
    labelled = {b: task.bin_labels(b) for b in task.BREAKDOWNS
                if task.bin_labels(b) and any(r["breakdown"] == b for r in rows)}
    jobs = []  # (TensorBoard tag, file name, figure function, its arguments)
    for method in sized:
        if gaps:
            jobs.append((f"gaps/{method}", f"gap_vs_size_{method}", figures.gap_vs_size,
                         (gaps, method, splits)))
        jobs.append((f"faithfulness/{method}", f"faithfulness_{method}",
                     figures.faithfulness_curves, (rows, method, splits)))
    if gaps and unsized:
        jobs.append(("gaps/attention_proxies", "gaps_attention_proxies", figures.gaps_by_split,
                     (gaps, unsized, splits)))
    for breakdown, labels in labelled.items():  # categorical breakdowns (code: category)
        for method in methods:
            jobs.append((f"same_pred_by_{breakdown}/{method}",
                         f"same_pred_by_{breakdown}_{method}", figures.faithfulness_by_label,
                         (rows, method, splits, breakdown, labels)))
    if which == "summary":
        return jobs
    bounds = task.bounds(config.data)  # the largest bin seen in training, per breakdown
    if "position" in bounds:  # position offsets (train.max_position_offset) train later ones
        bounds["position"] += objective.from_settings(config).max_position_offset
    breakdowns = [b for b in bounds if any(r["breakdown"] == b for r in rows)]
    for site, method in dict.fromkeys((r["site"], r["method"]) for r in rows):
        # The family's rows, all that the figure reads: it aggregates every row it is
        # given (over seeds, per bin), the most costly part of the reports on all rows.
        family = [r for r in rows if r["site"] == site and r["method"] == method]
        for breakdown in breakdowns:
            jobs.append((f"accuracy_by_{breakdown}/{method}/{site}",
                         f"accuracy_by_{breakdown}_{method}_{site.replace('+', '_and_')}",
                         figures.accuracy_by_bin,
                         (family, site, method, splits, breakdown, bounds[breakdown])))
    return jobs


def write_activation_figures(params, splits, model_cfg, config, workdir: str, seeds,
                             healthy=None, max_seeds: int = 4) -> None:
    """The activation figures of `activation_jobs` that the setting `figures` chooses, under
    figures/ and TensorBoard IMAGES."""
    jobs = activation_jobs(params, splits, model_cfg, config, seeds, healthy, config.figures,
                           max_seeds)
    if not jobs:
        return
    with stages.writing("report", os.path.join(workdir, "tensorboard")), \
            log_lib.board(workdir, seeds) as writer:
        draw(jobs, writer, workdir)


def activation_jobs(params, splits, model_cfg, config: Settings, seeds, healthy=None,
                    which: str = "all", max_seeds: int = 4) -> list[tuple]:
    """The task's figures of activations, as jobs of `draw` (Dyck: last-layer attention patterns
    on one iid sentence for the first healthy seeds, and the 2-D SVD projection of the last
    layer's keys at training positions of the first 3 healthy seeds, one figure each).
    `which`="summary": the first figure of each kind (the attention patterns, the first healthy
    seed's key projection); "all": every one; "none": none."""
    healthy = np.ones(len(seeds), bool) if healthy is None else np.asarray(healthy, bool)
    if which == "none" or not healthy.any():
        return []
    index = np.flatnonzero(healthy)[:max_seeds]  # diverged seeds are not drawn
    shown = [seeds[i] for i in index]
    pattern_site = faithfulness.resolve_site("blocks.-1.attn.pattern", model_cfg)
    key_site = faithfulness.resolve_site("blocks.-1.attn.k", model_cfg)

    def run(tokens, site):
        def one(p):
            return model.forward(p, tokens, model_cfg, cache=(site,))[1][site]
        return np.asarray(jax.jit(jax.vmap(one))(jax.tree.map(lambda x: x[index], params)))

    plots = tasks.get(config.task).activation_plots(run, splits, config.data, shown, pattern_site,
                                                    key_site)
    if which == "summary":
        first: dict[str, str] = {}  # figure function -> the first figure drawn with it
        for name, (kind, _) in plots.items():
            first.setdefault(kind, name)
        plots = {name: plots[name] for name in first.values()}
    return [(f"activations/{name}", name, getattr(figures, kind), args)
            for name, (kind, args) in plots.items()]


def complete_figures(config: Settings, workdir: str, say=print) -> list[str]:
    """Draws every figure of the main job (`figure_jobs` and `activation_jobs`, "all") that
    `workdir` (and each weight group's directory) lacks, from its stored results: results.csv,
    gaps.csv, and for the activation figures its newest checkpoint (results.load_run). A figure
    already there is kept as it is; each new one also goes to TensorBoard's IMAGES once. On a
    finished sweep, sweep_done.json must vouch for the reports first, and then vouches for the
    new figures too, so that a relaunch still finds the sweep finished. Returns the paths drawn.
    A workdir without results, or with reports that its sweep_done.json does not vouch for, is a
    one-line ValueError before any drawing (python -m launch.figures WORKDIR)."""
    done_path = os.path.join(workdir, DONE_FILE)
    done = _verified_done(config, workdir)
    if not config.proxies.methods:
        raise ValueError(f"the run in {workdir} has no proxies (proxies.methods is empty), so "
                         "no figures of results to draw")
    every = _weight_groups(config, workdir)
    groups = [(idx, d) for idx, d in every if os.path.isfile(os.path.join(d, "results.csv"))]
    if not groups:
        raise ValueError(f"{workdir} has no results yet (no results.csv: its sweep has not "
                         "finished evaluating the proxies); run or relaunch python -m "
                         "launch.sweep on it first")
    for _, group_dir in every:
        if not os.path.isfile(os.path.join(group_dir, "results.csv")):
            say(f"note: {group_dir} has no results.csv yet; its figures are left out")
    run, complete = None, len(groups) == len(every)
    if checkpoint.has_checkpoints(workdir):
        try:
            run = results.load_run(workdir)
        except FileNotFoundError as err:
            say(f"note: {err}; the activation figures are left out")
    else:
        say(f"note: {workdir}/{checkpoint.CHECKPOINT_DIR} holds no checkpoint; the activation "
            "figures are left out")
    complete &= run is not None
    baseline, seeds_of = config.proxies.gap_baseline, train.members(config).seeds
    drawn, figure_files = [], []
    for idx, group_dir in groups:
        rows = results.read_csv(os.path.join(group_dir, "results.csv"))
        gaps_path = os.path.join(group_dir, "gaps.csv")
        gaps = []
        if os.path.isfile(gaps_path):  # as write_reports passes them: the chosen baseline's
            gaps = [g for g in tables.read_csv(gaps_path)
                    if g["baseline"] == baseline and g["split"] != baseline]
        else:
            complete = False
            say(f"note: {group_dir} has no gaps.csv (its reports were stopped before it); the "
                "gap figures are left out: relaunch the sweep to write the reports")
        seeds = [int(s) for s in seeds_of[idx]]
        jobs = figure_jobs(rows, config, gaps)
        if run is not None:
            jobs += activation_jobs(jax.tree.map(lambda x, idx=idx: x[idx], run.params),
                                    run.splits, run.model_config, config, seeds,
                                    run.healthy[idx])
        todo = [job for job in jobs if not os.path.exists(_figure_path(group_dir, job[1]))]
        say(f"{group_dir}: drawing {len(todo)} figures ({len(jobs) - len(todo)} of {len(jobs)} "
            "are there and kept)" if todo else f"{group_dir}: all {len(jobs)} figures are "
            "there; nothing to draw", flush=True)
        paths = [_figure_path(group_dir, job[1]) for job in todo]
        try:
            if todo:
                with stages.writing("report", os.path.join(group_dir, "tensorboard")), \
                        log_lib.board(group_dir, seeds) as writer:
                    draw(todo, writer, group_dir)
        except BaseException:  # a stop: draw sends its figures to TensorBoard at its end, so
            for path in paths:  # the ones drawn here are drawn again, with their images, next time
                if os.path.exists(path):
                    os.remove(path)
            raise
        drawn += paths
        figure_files += [_figure_path(group_dir, job[1]) for job in jobs]
    if done is not None:  # the finished sweep's marker vouches for the new figures too (and
        # for those an earlier, stopped call drew: the others are verified, the same sha256)
        done["reports"].update({os.path.relpath(p, workdir): stages.sha256(p)
                                for p in figure_files})
        done["figures"] = "all" if complete else done.get("figures", "summary")
        stages.write(done_path, json.dumps(done, indent=2, sort_keys=True), "final")
    return drawn


def _figure_path(directory: str, name: str) -> str:
    return os.path.join(directory, "figures", name + ".png")


def _verified_done(config: Settings, workdir: str) -> dict | None:
    """sweep_done.json, or None if the sweep has not finished; a ValueError (one line) if it is
    unreadable, or records other analysis settings than the run's, or its reports do not match
    their checksums: figures drawn now could not be vouched for."""
    path = os.path.join(workdir, DONE_FILE)
    try:
        done = stages.read_json(path)
        why = None if done is None else _done_shape(done)
    except (OSError, ValueError) as err:
        why = f"its {DONE_FILE} is unreadable ({checkpoint.error_line(err)})"
    else:
        if why is not None:
            why = f"its {DONE_FILE} is unreadable ({why})"
        elif done is not None and done["analysis"] != _analysis_settings(config):
            why = f"its {DONE_FILE} records other analysis settings than its config.json"
        elif done is not None:
            why = _unverified(done, workdir)
    if why is not None:
        raise ValueError(f"the sweep in {workdir} finished, but {why}; relaunch its "
                         "python -m launch.sweep command to write the reports again, then "
                         "draw the figures")
    return done


def draw(jobs, writer, workdir: str) -> None:
    """Draws each figure of `jobs` ([(TensorBoard tag, file name under figures/, a figure
    function of report/figures.py, its arguments)]) once, into its PNG and TensorBoard's IMAGES
    (in the order of `jobs`). Drawing is single-threaded Python: where this process may use two
    cores, a helper process draws every other figure meanwhile (the same PNG, byte for byte);
    should it fail, its figures are drawn here."""
    paths = [os.path.join(workdir, "figures", name + ".png") for _, name, _, _ in jobs]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    helper = _start_helper([(f, a, p) for (_, _, f, a), p in zip(jobs[1::2], paths[1::2],
                                                                 strict=True)]
                           ) if len(jobs) > 1 and (cores or 1) > 1 else None
    pixels, helped = {}, False
    try:
        for i in range(0, len(jobs), 2 if helper else 1):
            _stop_in_reports(workdir)  # each figure takes a while: a signal stops between them
            with stages.writing("report", paths[i]):
                pixels[i] = figures.render(*jobs[i][2:], paths[i])
        while helper is not None and helper.poll() is None:  # it draws; this process waits
            watchdog.progress()
            time.sleep(0.2)
        helped = helper is not None and helper.wait() == 0
    finally:
        if helper is not None:
            if helper.poll() is None:  # stopped (the relaunch draws every figure again)
                helper.kill()
                helper.wait()
            os.remove(helper.args[-1])
    for i, (tag, _, function, args) in enumerate(jobs):
        if i not in pixels:
            _stop_in_reports(workdir)
            with stages.writing("report", paths[i]):
                if helped:
                    with Image.open(paths[i]) as image:
                        pixels[i] = np.asarray(image.convert("RGBA"))
                else:
                    pixels[i] = figures.render(function, args, paths[i])
        log_lib.write_figure(writer, tag, pixels[i][..., :3])


def _start_helper(jobs: list) -> subprocess.Popen:
    """A process that draws `jobs` ([(figure function, arguments, path)]; figures.render_file),
    in a session of its own (a Ctrl-C stops this process, which ends it); its last argument is
    the jobs' file, for the caller to remove."""
    fd, path = tempfile.mkstemp(suffix=".pkl", prefix="figures_")
    with os.fdopen(fd, "wb") as f:
        pickle.dump(jobs, f)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # jaxillusions' parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    return subprocess.Popen(
        [sys.executable, "-c", "import sys; from jaxillusions.report import figures; "
         "figures.render_file(sys.argv[1])", path],
        env=env, stdout=subprocess.DEVNULL, start_new_session=True)


def picture(pipeline: Sequence[Stage] = PIPELINE) -> str:
    """docs/design.md's picture (a test keeps the page equal to it): the folders, layer by
    layer from the bottom, each with the first line of its docstring, then the main job's
    stages in order with when each runs and what it writes."""
    import importlib  # noqa: PLC0415

    import jaxillusions  # noqa: PLC0415

    lines = ["jaxillusions/   (layers, lowest first; each imports only from its own or lower)"]
    for rank, prefixes in enumerate(jaxillusions.LAYERS):
        for prefix in prefixes:
            doc = importlib.import_module(f"jaxillusions.{prefix}").__doc__ or ""
            first = " ".join(doc.strip().split("\n\n")[0].split())
            folder = prefix.replace(".", "/") + (".py" if "." in prefix else "/")
            lines.append(f"  {rank} {folder:<17}{first}")
    lines += ["", "The main job, sweep.PIPELINE, in order (run: once; group: per weight group):"]
    for stage in pipeline:
        when = stage.enabled.__doc__ or "always"
        when = " ".join(when.strip().split("\n\n")[0].split())
        lines.append(f"  {stage.name:<13}{stage.scope:<6} {when}")
        if stage.outputs:
            lines.append(f"  {'':<13}{'':<6} writes {', '.join(stage.outputs)}"
                         + ("; saved whole" if stage.stamped else ""))
    return "\n".join(lines)


if __name__ == "__main__":  # docs/design.md's picture
    print(picture())
