"""Sweep training: data, the members (seeds x hyper-parameters), training of all of them together
(step.py), periodic evaluation (evaluation.py), checkpoints and TensorBoard, resumable."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
import os
import time

import jax
import numpy as np

from jaxillusions import model as model_lib
from jaxillusions import tasks
from jaxillusions.config import settings
from jaxillusions.config.settings import Settings, Train
from jaxillusions.runtime import distributed, machine, watchdog
from jaxillusions.runtime.cache import write_atomic
from jaxillusions.training import imported, memory, objective
from jaxillusions.training.evaluation import evaluate_splits, summary_lines
from jaxillusions.training.evaluation import log as log_eval
from jaxillusions.training.step import (
    SweepState,
    hold_steps,
    init_state,
    place_on_devices,
    train_steps,
)


def seed_list(config: Settings) -> np.ndarray:
    """The sweep's seeds: config.seed, config.seed + 1, ..., num_seeds of them; imported
    checkpoints (model.pretrained): theirs (imported.seeds)."""
    config = settings.require(config, "train.seed_list")
    if imported.enabled(config):
        return imported.seeds(config)
    return config.seed + np.arange(config.train.num_seeds)


def contrastive_weights(tc: Train) -> tuple[float, ...]:
    """The swept contrastive-regularization weights of the train.* settings `tc`
    (train.contrastive_weights; () -> (0,))."""
    return tuple(float(w) for w in tc.contrastive_weights) or (0.0,)


NULL = objective.NULL  # the hyper-parameter of the null kind: 0 trained, 1 untrained, 2 shuffled
NULL_KINDS = settings.NULL_KINDS  # ("trained", "untrained", "shuffled"), by code
# The per-member hyper-parameters, slowest first after the null kind: name -> its label tag.
HPARAM_TAGS = {"contrastive_weight": "cw", "learning_rate": "lr", "weight_decay": "wd",
               "init_scale": "init"}


def hparam_values(tc: Train) -> dict[str, tuple[float, ...]]:
    """The values of each per-member hyper-parameter of the train.* settings `tc`, in
    HPARAM_TAGS' order (an empty list: the scalar key's value; init_scale: 1)."""
    return {"contrastive_weight": contrastive_weights(tc),
            "learning_rate": objective.learning_rates(tc),
            "weight_decay": objective.weight_decays(tc),
            "init_scale": tuple(float(f) for f in tc.init_scales) or (1.0,)}


def null_kinds(tc: Train) -> tuple[str, ...]:
    """The kinds of member of a run: "trained", then train.null's in NULL_KINDS' order (the
    order of their codes, whatever the order of train.null)."""
    return ("trained", *sorted(tc.null, key=NULL_KINDS.index))


def num_members(tc: Train, num_seeds: int | None = None) -> int:
    """How many members `members` gives (num_seeds: train.num_seeds unless given)."""
    per_seed = math.prod(len(v) for v in hparam_values(tc).values()) * len(null_kinds(tc))
    return (tc.num_seeds if num_seeds is None else num_seeds) * per_seed


@dataclasses.dataclass(frozen=True)
class Members:
    """The sweep's members: every combination of the null kind (train.null), the per-member
    hyper-parameters (HPARAM_TAGS: train.contrastive_weights, learning_rates, weight_decays,
    init_scales) and the seed, in that order, the first slowest: null kind major, seed minor.
    So the trained members come first, in the order a run without train.null has, and each
    null kind's members follow as a slice of the same length and order (member i's null copy
    of the first kind is member i + M/K, K the kinds).

    The same seeds run under every setting (same init, same batches: a shuffled member draws
    the batches of its trained twin), so comparisons across settings are paired. With one
    setting the members are just the seeds.

    `hparams` (what the step, the groups of pipeline/sweep.py and the reports see): always
    contrastive_weight; learning_rate, weight_decay and init_scale when their list has several
    values; null (int32, NULL_KINDS' codes) when train.null is set. A null member keeps its
    trained twin's values: only null tells them apart (an untrained member is trained with
    rate 0 and no decay, i.e. not moved; a shuffled one with its twin's rate and decay).
    `values`: every name's value per member (float32; null included), varying or not.
    Labels: the seed (an int) with one setting; otherwise "<seed>" then "_<tag><value:g>" for
    each hyper-parameter with several values (tag: HPARAM_TAGS, e.g. "3_cw0.5_lr0.001") and
    "_untrained" or "_shuffled" for a null member.
    """

    seeds: np.ndarray  # [M] the seed of each member
    hparams: dict[str, np.ndarray]  # {"contrastive_weight": [M] float32, ...}: see above
    labels: list  # [M] TensorBoard run labels: the seed, or "<seed>_cw<weight>..."
    values: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)

    def kinds(self) -> np.ndarray:
        """[M] the kind of each member: "trained", "untrained" or "shuffled" (train.null), so
        that reports can split the trained members from the null population."""
        codes = self.hparams.get(NULL, np.zeros(len(self.seeds), np.int32))
        return np.asarray(NULL_KINDS)[codes]

    def varying(self, member: int) -> dict[str, object]:
        """The hyper-parameters that vary between the members, at `member` ({name: value}; the
        null kind by name), so that the rows of several groups' tables tell them apart."""
        return {name: str(self.kinds()[member]) if name == NULL else v[member].item()
                for name, v in self.hparams.items() if len(np.unique(v)) > 1}


def members(config: Settings, seeds=None) -> Members:
    """The members of a run (`seeds`: the sweep's own, seed_list, unless given)."""
    config = settings.require(config, "train.members")
    seeds = np.asarray(seed_list(config) if seeds is None else seeds)
    axes, kinds = hparam_values(config.train), null_kinds(config.train)
    grid = list(itertools.product(range(len(kinds)), *axes.values()))  # one per setting
    per_setting = len(seeds)
    values = {name: np.repeat(np.asarray([g[i] for g in grid], np.float32), per_setting)
              for i, name in enumerate(axes, start=1)}
    values[NULL] = np.repeat(np.asarray([NULL_KINDS.index(kinds[g[0]]) for g in grid],
                                        np.int32), per_setting)
    varying = [name for name, v in axes.items() if len(v) > 1]
    hparams = {name: values[name] for name in axes
               if name == "contrastive_weight" or name in varying}
    if len(kinds) > 1:
        hparams[NULL] = values[NULL]
    if len(grid) == 1:
        labels = [int(s) for s in seeds]
    else:
        column = dict(zip(axes, range(1, len(axes) + 1), strict=True))
        labels = [f"{int(s)}" + "".join(f"_{HPARAM_TAGS[n]}{g[column[n]]:g}" for n in varying)
                  + ("" if g[0] == 0 else f"_{kinds[g[0]]}") for g in grid for s in seeds]
    return Members(seeds=np.tile(seeds, len(grid)), hparams=hparams, labels=labels,
                   values=values)


def member_chunks(sweep: Members, chunk_size: int = 0) -> tuple[list[np.ndarray], list[bool]]:
    """The sequential chunks training runs (distributed.seed_chunks: member indices, padded),
    and whether each holds untrained null members, which are not stepped (step.hold_steps):
    the other members' chunks first, then theirs. Without untrained members, seed_chunks'."""
    still = sweep.values[NULL] == objective.UNTRAINED
    parts = [(index, bool(kind)) for kind, index in ((False, np.flatnonzero(~still)),
                                                     (True, np.flatnonzero(still))) if len(index)]
    chunks = [(index[c], kind) for index, kind in parts
              for c in distributed.seed_chunks(len(index), chunk_size)]
    return [c for c, _ in chunks], [k for _, k in chunks]


def member_settings(config: Settings, leave_out: tuple[str, ...] = ()
                    ) -> list[tuple[np.ndarray, str]]:
    """(member indices, name) per setting of the members' hyper-parameters that vary (but those
    in `leave_out`), in the members' order: the name is <name>_<value>[_<name>_<value>...], or
    "" for all members when none varies."""
    sweep = members(config)
    hparams = {k: v for k, v in sweep.hparams.items() if k not in leave_out}
    varying = [k for k, v in hparams.items() if len(np.unique(v)) > 1]
    if not varying:
        return [(np.arange(len(sweep.seeds)), "")]
    keys = list(zip(*(hparams[k].tolist() for k in varying), strict=True))
    return [(np.flatnonzero([k == key for k in keys]),
             "_".join(f"{n}_{v:g}" for n, v in zip(varying, key, strict=True)))
            for key in dict.fromkeys(keys)]


def member_groups(config: Settings, workdir: str) -> list[tuple[np.ndarray, str]]:
    """(member indices, directory) per setting of the members' hyper-parameters (those that
    vary, e.g. contrastive_weight): the workdir itself when they all share one, else
    <workdir>/<name>_<value>[_<name>_<value>...] per setting, in the members' order, so that
    aggregates over seeds never mix settings."""
    return [(idx, os.path.join(workdir, name) if name else workdir)
            for idx, name in member_settings(config)]


# ---------------------------------------------------------------------------------------------
# The sweep driver: data, training of all seeds, periodic evaluation, checkpoints, TensorBoard.

def build(config: Settings, splits: dict | None = None):
    """Data (the task's splits), model config and optimizer of a run (shared by training and
    the proxy sweep)."""
    config = settings.require(config, "train.build")
    if splits is None:
        splits = tasks.get(config.task).load(config.data)
    tasks.check_data(config, splits)  # degenerate data is refused before any training
    model_cfg = model_config(config, max(s.tokens.shape[1] for s in splits.values()), splits)
    return splits, model_cfg, objective.make_optimizer(config.train,
                                                       model_lib.frozen_paths(model_cfg))


def model_config(config: Settings, widest_split: int | None = None,
                 splits: dict | None = None) -> model_lib.ModelConfig:
    """The model config; `widest_split`: the longest split's token width and `splits` the data
    (None: from the data config, as validate does before any data exists)."""
    config = settings.require(config, "train.model_config")
    task = tasks.get(config.task)
    goal = objective.from_settings(config)
    if widest_split is None:
        widest_split = task.widest_width(config.data)
    if imported.enabled(config):  # the checkpoints' architecture, one member each
        if num_members(config.train, 1) != len(null_kinds(config.train)):
            raise ValueError("model.pretrained: an imported run has one member per checkpoint; "
                             "leave the per-member hyper-parameters (train.contrastive_weights, "
                             "learning_rates, weight_decays, init_scales) at their defaults")
        if "shuffled" in config.train.null:
            raise ValueError(f"train.null={tuple(config.train.null)!r}: imported checkpoints "
                             "are not trained here, so none is trained on shuffled labels; "
                             "('untrained',) adds an untrained copy of each")
        return imported.model_config(config, widest_split)
    fields = task.model_fields(config.data, splits)
    if config.model.first_layer != "standard":  # a part the task builds from its data
        build_front = tasks.require(task, "first_layer",
                                    f"model.first_layer={config.model.first_layer!r}")
        fields["front"] = build_front(config.data, config.model.minimal_embedding)
    max_len = max([widest_split]
                  # a training row (BOS ... EOS) and what the contrastive regularizer's inputs
                  # add to it (Dyck: a balanced prefix of <= 2D+2 tokens after BOS)
                  + [task.train_width(config.data) + goal.contrastive_width]
                  * goal.contrastive
                  + [config.model.max_len])
    model_cfg = model_lib.ModelConfig.from_settings(config.model, max_len=max_len, **fields)
    used = task.train_width(config.data) - 1 + goal.max_position_offset  # BOS ... EOS-1
    if used > max_len:
        raise ValueError(f"train.max_position_offset={goal.max_position_offset}: training "
                         f"inputs would reach position {used - 1}, but the model has {max_len} "
                         f"positions (at most {max_len - used + goal.max_position_offset})")
    return model_cfg


def _format_eta(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}"


def claim_workdir(workdir: str, config: Settings, record: bool = True,
                  splits: dict | None = None) -> list[str]:
    """checkpoint.claim_workdir with the analysis keys and defaults of settings.py, in process 0
    (the notes of a changed analysis setting; none in the other processes). A key that a
    workdir's config.json lacks (it predates the key) counts as its default. `record=False`:
    check only, write nothing (before the data has loaded). Recording, it records the machine
    (runtime/machine.py) and notes a launch on another machine than the last, and with
    `splits`, the data (`check_data`)."""
    from jaxillusions.runtime import checkpoint as ckpt_lib  # noqa: PLC0415 - keeps orbax off pure use
    from jaxillusions.runtime import tensorboard  # noqa: PLC0415

    config = settings.require(config, "train.claim_workdir")
    defaults = tensorboard.flatten_config(config.defaults())
    notes = distributed.on_main(lambda: ckpt_lib.claim_workdir(
        workdir, config, config.is_analysis_key, defaults, record,
        machine.describe() if record else None, lambda stored: _as_read_now(workdir, stored)),
        "checking the workdir") or []
    if splits is not None:
        check_data(workdir, splits, record=record)
    return notes


DATA_RECORD = "data_sha256.json"


def check_data(workdir: str, splits: dict, record: bool = False) -> None:
    """A workdir keeps no copy of its data, which a relaunch makes again from the settings and
    the files they name (data.source, data.files): files changed in between would mix results
    of two datasets in one run. DATA_RECORD holds each split's sha256 of its tokens from the
    first launch (written with `record`, in process 0); a split whose tokens differ is a
    one-line error naming it, before anything is moved or trained."""
    sums = {name: hashlib.sha256(str(split.tokens.shape).encode()
                                 + np.ascontiguousarray(split.tokens).tobytes()).hexdigest()
            for name, split in splits.items()}
    file = os.path.join(workdir, DATA_RECORD)
    if os.path.isfile(file):
        with open(file) as f:
            stored = json.load(f)
        changed = [name for name, value in sums.items() if stored.get(name, value) != value]
        if changed:
            raise ValueError(
                f"data: the {changed[0]} split is not the one this run was computed from (its "
                f"tokens' sha256 differs from {file}): what the data.* settings make them from "
                "has changed since (files they name edited, another Python's standard library "
                "for data.source='stdlib', another version generating the Dyck data, a cache "
                "file under data.cache_dir replaced); restore it, or run in a new --workdir")
    elif record and distributed.is_main():
        write_atomic(file, json.dumps(sums, indent=1, sort_keys=True) + "\n")


def check_checkpoint(config: Settings, workdir: str, model_cfg: model_lib.ModelConfig,
                     tx) -> None:
    """A one-line CheckpointMismatch if the workdir's newest checkpoint does not fit this run's
    state (a shape that follows the data: the code task's vocabulary, from the files of
    data.source), from its metadata: before the main job moves the earlier reports aside
    (train_sweep restores the checkpoint before it claims the workdir); nothing without one."""
    from jaxillusions.runtime import checkpoint as ckpt_lib  # noqa: PLC0415 - keeps orbax off pure use

    if not ckpt_lib.has_checkpoints(workdir):
        return
    sweep = members(config)
    target = jax.eval_shape(lambda: init_state(sweep.seeds, model_cfg, tx,
                                               sweep.values["init_scale"]))
    checkpointer = ckpt_lib.Checkpointer(os.path.join(workdir, ckpt_lib.CHECKPOINT_DIR))
    try:
        checkpointer.check_fits(target)
    finally:
        checkpointer.close()


def _as_read_now(workdir: str, stored: dict) -> dict:
    """A workdir's stored config as the door reads it now, each setting's conversion applied
    (a path relative to the launch's directory made absolute, as it is stored since), so that a
    relaunch compares like with like; one this version cannot read, as it is."""
    try:
        return json.loads(json.dumps(settings.read_stored(workdir).to_dict()))
    except ValueError:
        return stored


def _next_stop(step: int, end: int, tc) -> int:
    """The next step at which training pauses: `end` or the next log, eval or checkpoint step."""
    return min([end] + [step - step % every + every for every in
                        (tc.log_every, tc.eval_every, tc.checkpoint_every) if every > 0])


# Shortest call that `_calls` makes to share one program between pauses: below it, the host's
# dispatch per call would cost more than a second compilation.
MIN_CALL_STEPS = 20


def _calls(steps: int, tc) -> list[int]:
    """The train_steps calls, in steps, that run the `steps` steps up to the next pause. Every
    pause falls on a multiple of the greatest common divisor of the log, eval and checkpoint
    intervals and of train.num_steps, so calls of that many steps let one compiled program serve
    every pause (the Quickstart's 100-step logs and 1250-step evaluations compiled a 100-step and
    a 50-step program); an earlier end (`stop_at_step`) adds a shorter last call."""
    unit = math.gcd(*[every for every in (tc.log_every, tc.eval_every, tc.checkpoint_every,
                                          tc.num_steps) if every > 0])
    if unit < MIN_CALL_STEPS:
        return [steps]
    return [unit] * (steps // unit) + ([steps % unit] if steps % unit else [])


def _stop_if_all_diverged(healthy: np.ndarray, step: int) -> None:
    from jaxillusions.runtime import interrupt  # noqa: PLC0415

    if not healthy.any():
        raise interrupt.Stopped(
            f"all {len(healthy)} seeds diverged (non-finite loss or gradients) by step {step}; "
            "stopped there (lower train.learning_rate or raise train.warmup_steps)")


def train_sweep(config: Settings, workdir: str | None = None, *, splits=None, seeds=None,
                stop_at_step: int | None = None, verbose: bool = True,
                start_over: bool = False, evaluate_finished: bool = True):
    """Trains every seed of the sweep together; resumes from `workdir` if it has checkpoints.

    Returns (state, eval_results): the final state as numpy arrays with a leading member axis
    (no padding), and eval_results[split] with per-member arrays (see `evaluate`).
    `stop_at_step` ends early (as an interrupted run would), for tests.
    `start_over`: if the workdir has checkpoints and none of them can be restored, move them
    aside and train from step 0 (otherwise that is an error). `evaluate_finished`: when the
    workdir's training had already finished, evaluate the members again for eval_results
    (else it is None: nothing is printed or logged then either way).

    The members are sharded over all devices (of all processes, see distributed.py), padded to
    a multiple of the device count, and trained and evaluated in sequential chunks of
    `train.seed_chunk_size` members (0: all at once) to bound device memory. Padding never
    reaches results, logs, health reports or checkpoints; with several processes, process 0
    writes the files.

    Raises interrupt.Stopped when every seed has diverged, or after a SIGTERM/SIGINT (under
    interrupt.catch_signals), having saved a checkpoint at the step reached.
    """
    from jaxillusions.runtime import checkpoint as ckpt_lib  # noqa: PLC0415 - keeps orbax off pure use
    from jaxillusions.runtime import interrupt, tensorboard  # noqa: PLC0415

    config = settings.require(config, "train.train_sweep")  # checked at the door
    if imported.enabled(config):
        raise ValueError("model.pretrained: imported checkpoints are not trained here; the main "
                         "job (jaxillusions sweep) loads them in place of training")
    # before JAX starts, or checked
    distributed.use_devices(config.cpu_devices, config.gpu_deterministic)
    tc, task = config.train, tasks.get(config.task)
    say = print if verbose and distributed.is_main() else (lambda *a, **k: None)
    checkpointer = writer = None
    saved_step = None
    if workdir is not None:  # the workdir is checked before any data or compilation,
        claim_workdir(workdir, config, record=False)
    splits, model_cfg, tx = build(config, splits)
    if workdir is not None:  # and its data once they have loaded
        check_data(workdir, splits)
    goal = objective.from_settings(config)
    sweep = members(config, seeds)
    seeds, num = sweep.seeds, len(sweep.seeds)
    chunks, held = member_chunks(sweep, tc.seed_chunk_size)
    kinds = sweep.kinds()
    # Each member's first place in the chunks, joined (the chunks' padding copies come later).
    order = np.unique(np.concatenate(chunks), return_index=True)[1]
    state = distributed.to_host(init_state(seeds, model_cfg, tx, sweep.values["init_scale"]))

    if workdir is not None:  # claimed once the data has loaded and the newest checkpoint fits
        checkpointer = ckpt_lib.Checkpointer(f"{workdir}/{ckpt_lib.CHECKPOINT_DIR}")
        saved_step, state = checkpointer.restore_latest(state, start_over=start_over)
        for note in claim_workdir(workdir, config, splits=splits):
            say(note)
        if saved_step is not None:
            say(f"resumed from checkpoint at step {saved_step} in {workdir}")
        if distributed.is_main():
            writer = tensorboard.board(workdir, sweep.labels)
            # Events logged after the restored step by the run that was stopped are superseded.
            writer.restart(saved_step or 0, tensorboard.SweepWriter.seed_runs(sweep.labels))
    placed, train_tokens = place_on_devices(state, sweep.hparams, splits["train"].tokens, chunks)

    def joined(trees):  # the chunks' members, joined in the members' order, no padding
        return jax.tree.map(lambda x: x[order], distributed.concat_host(trees))

    def host_state() -> SweepState:  # every member, no padding, as numpy
        return joined([s for s, _ in placed])

    def evaluate() -> dict:  # chunk by chunk where they live, as they train (no host round trip)
        width = sum(len(c) for c in chunks)
        results = evaluate_splits([s.params for s, _ in placed], width, splits, model_cfg,
                                  config)
        return {split: {k: v if k.startswith("count_by_") else v[order] for k, v in r.items()}
                for split, r in results.items()}

    step = int(state.step[0])
    end = tc.num_steps if stop_at_step is None else min(stop_at_step, tc.num_steps)
    layout = ", ".join(
        ([f"{len(chunks)} chunks of {len(chunks[0])} members"] if len(chunks) > 1
         else [f"{len(chunks[0]) - num} padding members"] if len(chunks[0]) > num else [])
        + ([f"{int(np.sum(sweep.values[NULL] == objective.UNTRAINED))} untrained members held at "
            "their initialisation, not stepped"] if any(held) else []))
    say(f"training {num} members x {tc.num_steps} steps ({model_cfg.n_layers} layers, "
        f"d_model {model_cfg.d_model}) on {jax.device_count()} {jax.default_backend()} device(s)"
        + (f" in {jax.process_count()} processes" if jax.process_count() > 1 else "")
        + (f" ({layout})" if layout else ""))
    if step >= end:
        say(f"  already at step {step}: nothing to train")
    suggested = distributed.devices_to_suggest(num) if config.cpu_devices == 0 else None
    if suggested and step < end:
        say(f"  one CPU device on {distributed.cpu_cores()} cores: --config.cpu_devices="
            f"{suggested} gives each core its own members (1.1-1.5x faster training on 2-core "
            "CPUs, docs/speed.md; other last bits)")
    reported_unhealthy: set[int] = set()
    results = None
    try:
        # A signal that came while the data loaded stops here, before the first step compiles.
        signum = distributed.max_over_processes(interrupt.requested() or 0)
        if signum and step < end:
            interrupt.raise_if_requested(f"before training (step {step}); " + (
                "nothing was lost: relaunch the same command to resume" if workdir
                else "nothing saved (no workdir)"), signum)
        if step < end:  # compiles the first call's step (jit keeps it) and reads its memory use
            say(memory.describe(memory.estimate(
                train_steps, placed[0][0], train_tokens, placed[0][1], num_chunks=len(chunks),
                num_steps=_calls(_next_stop(step, end, tc) - step, tc)[0], model_cfg=model_cfg,
                tx=tx, batch_size=tc.batch_size, objective=goal)))
        start_time, start_step = time.perf_counter(), step
        _stop_if_all_diverged(state.healthy, step)
        while step < end:
            steps = _next_stop(step, end, tc) - step
            watchdog.progress(f"training steps {step} to {step + steps}")
            losses = []
            for k, (chunk_state, chunk_hparams) in enumerate(placed):  # sequential chunks
                chunk_losses = []
                for n in _calls(steps, tc):
                    if held[k]:  # untrained members: no loss computed (NaN in the logs)
                        chunk_state = hold_steps(chunk_state, num_steps=n)
                        chunk_losses.append(np.full((n, len(chunks[k])), np.nan, np.float32))
                    else:
                        chunk_state, call_losses = train_steps(
                            chunk_state, train_tokens, chunk_hparams, num_steps=n,
                            model_cfg=model_cfg, tx=tx, batch_size=tc.batch_size, objective=goal)
                        chunk_losses.append(call_losses)
                placed[k] = (chunk_state, chunk_hparams)
                losses.append(chunk_losses)
            step += steps
            losses = np.concatenate([np.concatenate([distributed.to_host(x) for x in calls])
                                     for calls in losses], axis=1)[:, order]
            healthy = joined([s.healthy for s, _ in placed])
            for i in np.flatnonzero(~healthy):
                if i not in reported_unhealthy:
                    reported_unhealthy.add(i)
                    say(f"WARNING: seed {sweep.labels[i]} diverged (non-finite loss or "
                        f"gradients) by step {step}; its parameters are frozen and it is "
                        "excluded from aggregates")
            _stop_if_all_diverged(healthy, step)
            last = np.where(healthy, losses[-1], np.nan)
            if writer is not None:
                tensorboard.write_scalars(writer, step, {"train": {"loss": losses[-1]}},
                                          healthy & (kinds == "trained"))  # mean/min/max
            if step % tc.log_every == 0 or step == end:
                rate = (step - start_step) / (time.perf_counter() - start_time)
                say(f"step {step:>6}/{tc.num_steps} | loss {np.nanmean(last):.4f} "
                    f"(min {np.nanmin(last):.4f}) | {num} seeds | {rate:.1f} steps/s | "
                    f"ETA {_format_eta((end - step) / rate)}", flush=True)
            if (tc.eval_every > 0 and step % tc.eval_every == 0) or step == tc.num_steps:
                results = evaluate()
                for line in summary_lines(task, results, healthy, kinds):
                    say(line)
                if writer is not None:
                    log_eval(writer, step, results, healthy & (kinds == "trained"), task)
            # Every process stops at the same step, if any of them received a signal.
            signum = distributed.max_over_processes(interrupt.requested() or 0)
            stopping = signum > 0
            if checkpointer is not None and saved_step != step and (
                    (tc.checkpoint_every > 0 and step % tc.checkpoint_every == 0)
                    or step == end or stopping):
                if writer is not None:
                    writer.flush()  # TensorBoard on disk is never behind the newest checkpoint
                checkpointer.save(step, host_state())
                saved_step = step
            if stopping:
                interrupt.raise_if_requested(
                    f"at step {step}; " + (f"checkpoint saved in {workdir}/checkpoints, relaunch "
                                           "the same command to resume" if workdir else
                                           "nothing saved (no workdir)"), signum)
        if results is None and step == tc.num_steps and evaluate_finished:  # resumed, finished
            results = evaluate()
        state = host_state()
    except BaseException:
        for closable in (writer, checkpointer):  # the error in flight is the one to report
            try:
                if closable is not None:
                    closable.close()
            except Exception:  # noqa: BLE001, S110
                pass
        raise
    if writer is not None:
        writer.close()
    if checkpointer is not None:
        checkpointer.close()
    return state, results
