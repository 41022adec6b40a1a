"""Runs on imported checkpoints (model.pretrained, docs/pretrained.md): the members are the
checkpoint directories, the architecture is their config, and the training stage loads them in
place of training; every later stage runs as on trained members.

    seeds(settings)                        # the members' seeds (train.seed_list calls it)
    cfg = model_config(settings, widest)   # at the door: the checkpoints' configs, no weights
    state, final_eval = load_sweep(settings, workdir, splits=splits, model_cfg=cfg,
                                   members=train.members(settings),
                                   claim=lambda: train.claim_workdir(workdir, settings))

A member's seed is the integer its label (model.pretrained.member_labels) ends in, when every
label ends in a different one (pythia-14m-seed1 ... seed9: 1 ... 9; step1000, step2000: 1000,
2000); otherwise 0 .. M-1 in the order given. The workdir holds no copy of the weights: a
relaunch, report/results.load_run and the figures read them from the checkpoint directories
again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re

import jax
import numpy as np

from jaxillusions import model as model_lib
from jaxillusions import tasks
from jaxillusions.config import fields, settings
from jaxillusions.model import pretrained
from jaxillusions.runtime import distributed, tensorboard
from jaxillusions.runtime.cache import write_atomic
from jaxillusions.training import evaluation, step
from jaxillusions.training.step import SweepState

# The model.* keys an imported run may set: the rest describe an architecture, which here is
# the checkpoints'.
KEPT_MODEL_KEYS = ("pretrained", "compute_dtype")
# In the workdir: {checkpoint path: sha256 of its weights} from the first launch (_check_unchanged).
RECORD = "imported_checkpoints.json"


def enabled(config) -> bool:
    """Whether the run's members are imported checkpoints (model.pretrained is set)."""
    return bool(config.model.pretrained)


def labels(config) -> list[str]:
    """The checkpoints' labels (pretrained.member_labels), in the order of model.pretrained."""
    return pretrained.member_labels(list(config.model.pretrained))


def seeds(config) -> np.ndarray:
    """The members' seeds (see the module docstring)."""
    found = [re.search(r"(\d+)$", label) for label in labels(config)]
    values = [int(m.group(1)) for m in found if m]
    if len(values) == len(found) and len(set(values)) == len(values):
        return np.asarray(values, np.int64)
    return np.arange(len(found), dtype=np.int64)


def model_config(config, widest: int) -> model_lib.ModelConfig:
    """The checkpoints' ModelConfig (their configs alone: pretrained.inspect_population), with
    model.compute_dtype, and positions for rows of `widest` tokens (rotary positions: raised to
    cover them; learned ones: a one-line error naming the data key). One-line errors: another
    model.* key changed from its default, a checkpoint that cannot be loaded, a vocabulary of
    the task's data larger than the checkpoints'."""
    config = settings.require(config, "imported.model_config")
    defaults = settings.Model()
    for field in dataclasses.fields(defaults):
        value = getattr(config.model, field.name)
        if field.name not in KEPT_MODEL_KEYS and value != getattr(defaults, field.name):
            raise ValueError(f"model.{field.name}={value!r}: the architecture comes from the "
                             f"checkpoints of model.pretrained; leave model.{field.name} at its "
                             f"default {getattr(defaults, field.name)!r}")
    try:
        pretrained.member_labels(list(config.model.pretrained))  # (a directory given twice)
        checkpoints = pretrained.inspect_population(list(config.model.pretrained))
    except ValueError as err:
        raise ValueError(f"model.pretrained: {err}") from None
    cfg, first = checkpoints[0].config, checkpoints[0].path
    task = tasks.get(config.task)
    vocab = task.model_fields(config.data)["vocab_size"]
    if vocab > cfg.vocab_size:
        raise ValueError(f"{task.VOCAB_KEY}={_get(config, task.VOCAB_KEY)!r}: its vocabulary "
                         f"of {vocab} ids is larger than the checkpoints' vocab_size "
                         f"{cfg.vocab_size} ({first}); use the checkpoints' tokenizer")
    if widest > cfg.max_len:
        if cfg.pos_encoding != "rotary":
            key = max(task.WIDTH_KEYS, key=lambda k: _get(config, k))
            raise ValueError(f"{key}={_get(config, key)}: rows of {widest} tokens, more than "
                             f"the {cfg.max_len} positions of the checkpoints ({first}); lower "
                             f"{key}")
        cfg = dataclasses.replace(cfg, max_len=widest)  # no table: any length runs
    return dataclasses.replace(cfg, compute_dtype=config.model.compute_dtype)


def _get(config, key: str):
    node = config
    for part in key.split("."):
        node = getattr(node, part)
    return node


def load_params(config, workdir: str | None = None, *, record: bool = False
                ) -> tuple[dict, np.ndarray]:
    """(params with the member axis, healthy [M] bool: every weight finite) of the
    checkpoints, as numpy float32, then with train.null = ("untrained",) an untrained copy of
    each (step.initial_params: this project's initialisation of their architecture at the
    member's seed), in train.members' order. With a workdir, the checkpoints' weights must be
    those its run was computed from (RECORD: a one-line ValueError naming the checkpoint
    otherwise); `record` writes RECORD there when it is not there yet (the first launch)."""
    params, cfg, _ = pretrained.load_pretrained_labelled(list(config.model.pretrained))
    params = jax.tree.map(np.asarray, params)
    if workdir is not None:
        _check_unchanged(list(config.model.pretrained), params, workdir)
        if record:
            _record(list(config.model.pretrained), params, workdir)
    if "untrained" in config.train.null:
        copies = jax.tree.map(np.asarray, step.initial_params(seeds(config), cfg))
        params = jax.tree.map(lambda a, b: np.concatenate([a, b]), params, copies)
    leaves = jax.tree.leaves(params)
    healthy = np.asarray([all(np.isfinite(x[i]).all() for x in leaves)
                          for i in range(leaves[0].shape[0])])
    return params, healthy


def check_unchanged(config, workdir: str) -> None:
    """load_params' check of the weights alone (RECORD, where the workdir has one), for a
    relaunch that checks them before it moves any report aside."""
    if os.path.isfile(os.path.join(workdir, RECORD)):
        params, _, _ = pretrained.load_pretrained_labelled(list(config.model.pretrained))
        _check_unchanged(list(config.model.pretrained), jax.tree.map(np.asarray, params),
                         workdir)


def _member_sums(paths: list[str], params: dict) -> dict[str, str]:
    """{path: sha256 of the member's converted float32 weights}: the same for the same weights
    whatever file format holds them."""
    from jaxillusions.runtime import checkpoint  # noqa: PLC0415 - keeps orbax off pure use

    return {path: hashlib.sha256(json.dumps(checkpoint.checksums(jax.tree.map(
        lambda x, i=i: x[i], params)), sort_keys=True).encode()).hexdigest()
        for i, path in enumerate(paths)}


def _check_unchanged(paths: list[str], params: dict, workdir: str) -> None:
    """The workdir keeps no copy of the weights, so a relaunch, load_run and the figures read
    them again: a checkpoint rewritten in between (another revision downloaded into the same
    directory) would mix two models' numbers in one run. RECORD holds each member's weight
    sums from the first launch (_record); a member whose weights differ is a one-line error."""
    file = os.path.join(workdir, RECORD)
    if os.path.isfile(file):
        with open(file) as f:  # (paths stored as typed before the door made them absolute)
            stored = {fields.absolute(path): value for path, value in json.load(f).items()}
        for path, value in _member_sums(paths, params).items():
            if stored.get(path, value) != value:
                raise ValueError(f"model.pretrained: the weights in {path} are not those this "
                                 f"run was computed from (their sha256 differs from {file}); "
                                 "restore them, or run in a new workdir")


def _record(paths: list[str], params: dict, workdir: str) -> None:
    """Writes RECORD where it is not yet (the first launch), in process 0."""
    file = os.path.join(workdir, RECORD)
    if not os.path.isfile(file) and distributed.is_main():
        write_atomic(file, json.dumps(_member_sums(paths, params), indent=1, sort_keys=True)
                     + "\n")


def load_sweep(config, workdir: str | None, *, splits, model_cfg: model_lib.ModelConfig,
               members, claim=lambda: [], say=print) -> tuple[SweepState, dict]:
    """The training stage of an imported run: says that training is skipped and which
    checkpoint each member is, loads them (a member with a non-finite weight is unhealthy: left
    out of every aggregate, as a diverged seed), evaluates them on every split as training's
    last evaluation does (printed, and at step 0 in TensorBoard), and returns (state, the
    evaluation) as train.train_sweep does. `members`: train.members(config), whose labels and
    null kinds the evaluation's lines and TensorBoard's runs use. `claim()` claims the workdir
    (train.claim_workdir: config.json written, its notes returned to be said) once the weights
    have passed their check, so that a relaunch refused by it leaves the workdir as it was."""
    config = settings.require(config, "imported.load_sweep")
    task, paths = tasks.get(config.task), list(config.model.pretrained)
    member_seeds = seeds(config)
    copies = ("; and an untrained copy of each (train.null: their architecture as this "
              "project initialises it, at the member's seed)" if config.train.null else "")
    say(f"training: skipped, {len(paths)} imported checkpoints: "
        + ", ".join(f"seed {s} = {p}" for s, p in zip(member_seeds, paths, strict=True))
        + copies, flush=True)
    params, healthy = load_params(config, workdir)
    for note in claim():
        say(note)
    if workdir is not None:
        _record(paths, params, workdir)
    for s, ok in zip(member_seeds, healthy, strict=False):  # (the copies are finite)
        if not ok:
            say(f"WARNING: seed {s} has non-finite weights; it is excluded from aggregates")
    num = len(healthy)
    state = SweepState(params=params, opt_state=(), rng=np.zeros((num, 2), np.uint32),
                       step=np.zeros(num, np.int32), healthy=healthy)
    chunks = evaluation.seed_chunks(params, config.train.seed_chunk_size)
    results = evaluation.evaluate_splits(chunks, num, splits, model_cfg, config)
    for line in evaluation.summary_lines(task, results, healthy, members.kinds()):
        say(line)
    if workdir is not None and distributed.is_main():
        writer = tensorboard.board(workdir, members.labels)
        try:  # a relaunch's step 0 supersedes the last one's (a restart marker before it)
            writer.restart(-1, tensorboard.SweepWriter.seed_runs(members.labels))
            evaluation.log(writer, 0, results, healthy & (members.kinds() == "trained"), task)
        finally:
            writer.close()
    return state, results
