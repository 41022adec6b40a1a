"""The runner of the main job: train a sweep of seeds, fit every proxy, evaluate faithfulness on
every split, run the studies, write the reports.

The job's stages are job.PIPELINE (studies/stage.py says what a stage declares); this module
runs them: once per run or per weight group, each timed, saved and resumed, in an order the
stages' needs allow (stage.check_order).

Writes into the workdir what the stages' outputs name: results.csv (tidy rows), gap_table.txt
with its CSV tables (report/stats.py), each study's tables, figures/*.png (those the setting
`figures` chooses: the summary set by default; `complete_figures`, i.e. `jaxillusions
figures`, draws the rest later), TensorBoard curves and the hparams view, and the training
checkpoints.

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
import shlex
import time
from collections.abc import Sequence

import jax
import numpy as np

from jaxillusions.config.settings import Settings
from jaxillusions.pipeline import validate
from jaxillusions.pipeline.job import PIPELINE
from jaxillusions.report import drawing, results, tables
from jaxillusions.runtime import checkpoint, distributed, stages, tensorboard, timing, watchdog
from jaxillusions.studies.stage import Context, Stage, check_order
from jaxillusions.training import imported, train

DONE_FILE = "sweep_done.json"
# Settings of how the work runs, not of what it computes: a change redoes nothing.
ENGINE_KEYS = ("proxies.seed_chunk_size",)


def clocks(pipeline: Sequence[Stage] = PIPELINE) -> tuple[str, ...]:
    """The timing line's stage names, in the pipeline's order."""
    return tuple(dict.fromkeys(c for s in pipeline for c in (s.clocks or (s.name,))))


def _analysis_settings(config, pipeline: Sequence[Stage] = PIPELINE) -> dict:
    """The settings that define the analysis' results: those some stage's `keys` name (not
    ENGINE_KEYS, e.g. proxies.seed_chunk_size: how many seeds run at once changes no number);
    a population stage's (e.g. prediction.*) while it is enabled."""
    patterns = [k for stage in pipeline if stage.scope == "group" or stage.stamped
                or stage.scope == "population" and stage.enabled(config) for k in stage.keys]
    return {k: v for k, v in tensorboard.flatten_config(config).items()
            if any(fnmatch.fnmatchcase(k, p) for p in patterns) and k not in ENGINE_KEYS}


def _stage_stamp(stage: Stage, ctx: Context) -> str:
    """A stage saved whole depends on its keys and on the trained step."""
    values = {k: v for k, v in tensorboard.flatten_config(ctx.settings).items()
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
    # A signal a stage does not check inside it stops the run here, before the next stage.
    stages.stop_if_signalled(f"after the {stage.name} stage; relaunch the same command to "
                             "resume")
    return ctx


def _reports(config, workdir: str, pipeline: Sequence[Stage] = PIPELINE,
             stamped: bool = True) -> list[str]:
    """The report files and directories (the stages' outputs) in the workdir and its weight
    groups; without `stamped`, not those of the enabled stages saved whole (their stage file
    decides whether they are current; a disabled one's are an earlier analysis's)."""
    dirs = dict.fromkeys([workdir] + [d for _, d in train.member_groups(config, workdir)])

    def found(of: Sequence[Stage]) -> list[str]:
        return [path for directory in dirs for pattern in (o for s in of for o in s.outputs)
                for path in sorted(glob.glob(os.path.join(glob.escape(directory), pattern)))]

    saved = [s for s in pipeline if s.stamped and s.enabled(config)]
    paths = found([s for s in pipeline if stamped or s not in saved])
    if stamped:
        return paths
    # A directory that also holds the files of a stage saved whole (Wen's figures/wen_*.png in
    # figures/) is taken file by file, without them.
    kept = set(found(saved))
    return [f for path in paths for f in (
        [os.path.join(d, n) for d, _, names in os.walk(path) for n in names]
        if os.path.isdir(path) and any(k.startswith(path + os.sep) for k in kept) else [path])
        if f not in kept]


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
        {"time": checkpoint.now(), "analysis": _analysis_settings(config, pipeline),
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
    return stages.unverified(done["reports"], workdir, DONE_FILE)


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
    check_order(tuple(pipeline))
    # the check's devices, or a one-line error
    distributed.use_devices(config.cpu_devices, config.gpu_deterministic)
    with timing.Breakdown() as clock, watchdog.watching(config.stall_seconds, workdir):
        rows = _run(config, workdir, verbose=verbose, start_over=start_over, pipeline=pipeline)
    if clock.seconds and verbose and distributed.is_main():  # not when there was nothing to do
        print(clock.line(clocks(pipeline)))
    return rows


def _finished(config: Settings, workdir: str, done: dict, say,
              pipeline: Sequence[Stage] = PIPELINE) -> list[dict]:
    """The rows of a finished sweep whose reports match their checksums; with figures=all on a
    sweep that drew the summary, the rest, as `jaxillusions figures` draws them (a marker without
    "figures" predates the setting: every figure was drawn). A setting that changed without
    changing the analysis (figures, logging) is recorded, as on any relaunch."""
    for note in train.claim_workdir(workdir, config):
        say(note)
    pc = config.proxies
    tables = [os.path.join(group_dir, "results.csv") for _, group_dir in
              train.member_groups(config, workdir)] if pc.methods else []
    rows = [row for table in tables for row in results.read_csv(table)]
    where = (tables[0] if len(tables) == 1 else  # (was the workdir's, which groups lack)
             f"the results.csv of {len(tables)} groups in {workdir}: "
             + ", ".join(os.path.basename(os.path.dirname(t)) for t in tables)
             if tables else workdir)
    todo = ("nothing to do" if not pc.methods or config.figures != "all"
            or done.get("figures", "all") == "all" else "")
    if not todo and distributed.is_main():
        with timing.stage("figures"):
            todo = (f"drew the {len(complete_figures(config, workdir, say, pipeline))} figures "
                    "it had left out (figures=all)")
    say(f"the sweep in {workdir} is finished (finished {done['time']}); {todo}. "
        f"Results: {where}. Change an analysis setting (proxies.*, wen.*, prediction.*, ...) to "
        "redo the analysis.")
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
    # Why the earlier reports move aside (below): settings changed, unless said otherwise here.
    reason = stages.STALE if done is not None else (
        f"is from a sweep that did not finish (no {DONE_FILE}); the reports are written again")
    if done is not None and done["analysis"] == _analysis_settings(config, pipeline) \
            and ran != _enabled(config, pipeline):
        reason = "is written again, with the stages that now run"
        say(f"the sweep in {workdir} finished without the stages "
            f"{', '.join(s for s in _enabled(config, pipeline) if s not in ran) or '(none)'} "
            f"(it ran {', '.join(ran)}): they run now, the others resume from their stage files")
    elif done is not None and done["analysis"] == _analysis_settings(config, pipeline):
        why = _unverified(done, workdir)
        if why is None:
            return _finished(config, workdir, done, say, pipeline)
        # rewriting would mean training again (imported members are read again instead)
        if not checkpoint.has_checkpoints(workdir) and not config.model.pretrained:
            raise ValueError(
                f"the sweep in {workdir} finished, but {why}, and {workdir}/"
                f"{checkpoint.CHECKPOINT_DIR} holds no checkpoint to write the reports again "
                "from: restore the file from a copy, or run the sweep again in a new "
                "--workdir")
        say(f"{'note' if 'reports' not in done else 'warning'}: the sweep in {workdir} "
            f"finished, but {why}; the reports are written again from the saved stages (the "
            "earlier ones are kept under superseded/)")
        reason = f"is written again ({why})"
    elif done is not None and done["analysis"] is not None:
        say("analysis settings changed since the sweep finished: training is kept; proxy "
            "families are refitted and re-evaluated where their settings changed")
    splits, model_cfg, tx = train.build(config)
    train.check_data(workdir, splits)  # the same data as the run's first launch
    validate.stage_checks(config, model_cfg, pipeline)  # on the model the data gives
    if not config.model.pretrained:  # a checkpoint of another shape moves nothing (below)
        train.check_checkpoint(config, workdir, model_cfg, tx)
    # The earlier reports are kept, under superseded/, before they are written again; without a
    # done-file too (a sweep stopped in its report stage), whose analysis may have been another.
    reports = _reports(config, workdir, pipeline, stamped=False)
    if reports and config.model.pretrained:  # weights changed since: refused before any move
        imported.check_unchanged(config, workdir)
    move_aside(reports, reason)
    if done is not None and os.path.exists(os.path.join(workdir, DONE_FILE)):
        # vouched for those reports: until _mark_done, this is a sweep that did not finish
        move_aside(os.path.join(workdir, DONE_FILE), reason)
    ctx = Context(settings=config, workdir=workdir, say=say, verbose=verbose,
                  move_aside=move_aside, splits=splits, model_cfg=model_cfg, start=start,
                  start_over=start_over, pipeline=tuple(pipeline))
    groups = []
    for stage in pipeline:
        if not stage.enabled(config):
            continue
        if stage.scope == "run":
            ctx = _run_stage(stage, ctx)
            continue
        if not config.proxies.methods:  # the later stages work on the proxies' results
            break
        if not groups:
            groups = [_group(ctx, idx, directory)
                      for idx, directory in train.member_groups(config, workdir)]
        if stage.scope == "group":
            groups = [_run_stage(stage, _heading(group, stage, len(groups))) for group in groups]
        else:  # population: once, over every group
            _run_stage(stage, dataclasses.replace(
                ctx, groups=tuple(groups),
                files=stages.StageFiles(workdir, ctx.move_aside)))
    _mark_done(config, workdir, pipeline)
    if not groups:
        return []
    done, *rest = done_lines(workdir, len(groups), config.figures)
    for line in (f"[{time.perf_counter() - start:.0f}s] {done}", *rest):
        say(line)
    return [row for group in groups if group.proxies for row in group.proxies.rows]


def done_lines(workdir: str, num_groups: int, figures: str) -> list[str]:
    """What a finished sweep says last: where its results are, and the commands that show them,
    quoted as a shell needs them (a workdir may hold spaces)."""
    # One group: all its logs are in <workdir>/tensorboard (the README's logdir); several:
    # each group has its own under its directory (e.g. contrastive_weight_<w>/), so the workdir.
    logdir = os.path.join(workdir, "tensorboard") if num_groups == 1 else workdir
    lines = [f"done: {workdir}, TensorBoard: tensorboard --logdir {shlex.quote(logdir)}"]
    if figures != "all":
        lines.append(f"figures: {'none' if figures == 'none' else 'the summary set'} (setting "
                     f"figures); jaxillusions figures {shlex.quote(workdir)} draws the rest")
    return lines


def _heading(group: Context, stage: Stage, num_groups: int) -> Context:
    """Says which group a stage works on next, where there are several (each prints its own
    progress and summary): its directory's name, its members and their kind."""
    if num_groups > 1:
        kinds = sorted(set(train.members(group.settings).kinds()[group.members]))
        group.say(f"[{time.perf_counter() - group.start:.0f}s] {stage.name}, group "
                  f"{os.path.relpath(group.directory, group.workdir)}: {len(group.members)} "
                  f"{' and '.join(kinds)} members")
    return group


def _group(ctx: Context, idx: np.ndarray, directory: str) -> Context:
    """The context of one weight group: its members' parameters, health and seeds, its
    directory and stage files."""
    os.makedirs(directory, exist_ok=True)
    seeds = tuple(int(s) for s in train.members(ctx.settings).seeds[idx])
    return dataclasses.replace(
        ctx, directory=directory, members=idx, seeds=seeds,
        params=jax.tree.map(lambda x: x[idx], ctx.state.params),
        healthy=np.asarray(ctx.state.healthy)[idx],
        files=stages.StageFiles(directory, ctx.move_aside), proxies=None, made={})


def complete_figures(config: Settings, workdir: str, say=print,
                     pipeline: Sequence[Stage] = PIPELINE) -> list[str]:
    """Draws every figure of the main job (`figure_jobs` and `activation_jobs`, "all") that
    `workdir` (and each weight group's directory) lacks, from its stored results: results.csv,
    gaps.csv, and for the activation figures its newest checkpoint (results.load_run). A figure
    already there is kept as it is; each new one also goes to TensorBoard's IMAGES once. On a
    finished sweep, sweep_done.json must vouch for the reports first, and then vouches for the
    new figures too, so that a relaunch still finds the sweep finished. Returns the paths drawn.
    A workdir without results, or with reports that its sweep_done.json does not vouch for, is a
    one-line ValueError before any drawing (jaxillusions figures WORKDIR). `pipeline`: the
    run's stages (a grid point's: job.POINT_PIPELINE), whose keys its marker records."""
    done_path = os.path.join(workdir, DONE_FILE)
    done = _verified_done(config, workdir, pipeline)
    if not config.proxies.methods:
        raise ValueError(f"the run in {workdir} has no proxies (proxies.methods is empty), so "
                         "no figures of results to draw")
    every = train.member_groups(config, workdir)
    groups = [(idx, d) for idx, d in every if os.path.isfile(os.path.join(d, "results.csv"))]
    if not groups:
        raise ValueError(f"{workdir} has no results yet (no results.csv: its sweep has not "
                         "finished evaluating the proxies); run or relaunch jaxillusions "
                         "sweep on it first")
    for _, group_dir in every:
        if not os.path.isfile(os.path.join(group_dir, "results.csv")):
            say(f"note: {group_dir} has no results.csv yet; its figures are left out")
    run, complete = None, len(groups) == len(every)
    if checkpoint.has_checkpoints(workdir) or config.model.pretrained:  # (imported: read again)
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
        jobs = drawing.figure_jobs(rows, config, gaps)
        if run is not None:
            jobs += drawing.activation_jobs(jax.tree.map(lambda x, idx=idx: x[idx], run.params),
                                    run.splits, run.model_config, config, seeds,
                                    run.healthy[idx])
        todo = [job for job in jobs if not os.path.exists(drawing.figure_path(group_dir, job[1]))]
        say(f"{group_dir}: drawing {len(todo)} figures ({len(jobs) - len(todo)} of {len(jobs)} "
            "are there and kept)" if todo else f"{group_dir}: all {len(jobs)} figures are "
            "there; nothing to draw", flush=True)
        paths = [drawing.figure_path(group_dir, job[1]) for job in todo]
        try:
            if todo:
                with stages.writing("report", os.path.join(group_dir, "tensorboard")), \
                        tensorboard.board(group_dir, seeds) as writer:
                    drawing.draw(todo, writer, group_dir)
        except BaseException:  # a stop: draw sends its figures to TensorBoard at its end, so
            for path in paths:  # the ones drawn here are drawn again, with their images, next time
                if os.path.exists(path):
                    os.remove(path)
            raise
        drawn += paths
        figure_files += [drawing.figure_path(group_dir, job[1]) for job in jobs]
    if done is not None:  # the finished sweep's marker vouches for the new figures too (and
        # for those an earlier, stopped call drew: the others are verified, the same sha256)
        done["reports"].update({os.path.relpath(p, workdir): stages.sha256(p)
                                for p in figure_files})
        done["figures"] = "all" if complete else done.get("figures", "summary")
        stages.write(done_path, json.dumps(done, indent=2, sort_keys=True), "final")
    return drawn


def _verified_done(config: Settings, workdir: str, pipeline: Sequence[Stage] = PIPELINE
                   ) -> dict | None:
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
        elif done is not None and done["analysis"] != _analysis_settings(config, pipeline):
            why = f"its {DONE_FILE} records other analysis settings than its config.json"
        elif done is not None:
            why = _unverified(done, workdir)
    if why is not None:
        raise ValueError(f"the sweep in {workdir} finished, but {why}; relaunch its "
                         "jaxillusions sweep command to write the reports again, then "
                         "draw the figures")
    return done
