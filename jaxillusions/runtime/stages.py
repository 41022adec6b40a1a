"""The stages of the main job, and their stage files.

A `Stage` is one step of the pipeline (`sweep.PIPELINE` lists them in order): a name, when it
runs (`enabled`), `run` (a `Context` in, the same context with what the stage
produced out), the settings its results depend on (`keys`) and the report files it writes
(`outputs`). A stage with `stamped=True` is saved whole: the runner skips it on a relaunch while
its stage file (proxies/stage_<name>.json, stamped with the values of its `keys`) and its outputs
are there, and moves them aside when a key changed. Stages with finer-grained work (a proxy
family at a time) save each piece in a stamped stage file of their own (`Stages`), so a relaunch
resumes where a run stopped and a changed analysis setting recomputes only what it affects (a
stale file is moved to superseded/, never overwritten).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable
from typing import Any

from flax import serialization

from jaxillusions.runtime import distributed, interrupt
from jaxillusions.runtime.cache import error_line, write_atomic

STAGE_DIR = "proxies"


def _always(settings) -> bool:
    del settings
    return True


@dataclasses.dataclass(frozen=True)
class Stage:
    """One step of the main job.

    `scope`: "run" (once per run, in the workdir) or "group" (once per weight group, in its
    directory: the workdir itself unless train.contrastive_weights sweeps several weights).
    `keys`: fnmatch patterns of the settings keys (as settings.flatten names them) that define
    the stage's results: analysis keys (settings.ANALYSIS_KEYS); a change redoes the analysis.
    `outputs`: glob patterns of the report files it writes in its directory: moved aside before
    an analysis with other settings, checksummed in sweep_done.json. `clocks`: the names its
    time is counted under in the timing line (default: its name). A stage's settings are
    checked at the door, before any work (pipeline/validate.py calls each study's checks)."""

    name: str
    run: Callable[[Context], Context]
    enabled: Callable[[Any], bool] = _always
    scope: str = "group"
    keys: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    clocks: tuple[str, ...] = ()
    stamped: bool = False

    def __post_init__(self):
        if self.scope not in ("run", "group"):
            raise ValueError(f"stage {self.name}: scope must be 'run' or 'group', got "
                             f"{self.scope!r}")


@dataclasses.dataclass(frozen=True)
class Context:
    """What the stages share, by name: the run (settings, workdir, data, model), what training
    produced, and, in a weight group's stages, the group (its directory, members, stage files)
    and what its stages produced. A stage returns `dataclasses.replace(ctx, field=...)`; nothing
    travels by position."""

    settings: Any
    workdir: str
    say: Callable[..., None]
    verbose: bool
    move_aside: Callable[..., None]
    splits: dict
    model_cfg: Any
    start: float = 0.0  # time.perf_counter() at the start of the job (progress lines)
    start_over: bool = False
    # Training.
    state: Any = None  # the trained TrainState (params, healthy, step; leading member axis)
    final_eval: dict | None = None  # the final evaluation per split (evaluation.evaluate_splits)
    # A weight group (scope "group").
    directory: str = ""
    members: Any = None  # member indices of the group
    params: Any = None
    healthy: Any = None  # [members] bool
    seeds: tuple[int, ...] = ()
    files: Stages | None = None
    # What the group's stages produced.
    results: dict = dataclasses.field(default_factory=dict)

    def produced(self, **values) -> Context:
        """The context with `values` added to `results` (by the stage that computed them)."""
        return dataclasses.replace(self, results={**self.results, **values})


def write(path: str, data: str | bytes, stage: str) -> None:
    """data.cache.write_atomic in process 0, which writes the run's files (a no-op elsewhere)."""
    if distributed.is_main():
        with writing(stage, path):
            write_atomic(path, data)


class StageWriteError(OSError):
    """A file of a stage could not be written; str(err) is the one line naming both."""


@contextlib.contextmanager
def writing(stage: str, path: str):
    """An OSError while writing `path` (a full or read-only disk) becomes one line naming the
    file and the stage, instead of a bare "[Errno 28] No space left on device"."""
    try:
        yield
    except StageWriteError:
        raise
    except OSError as err:
        raise StageWriteError(
            f"the {stage} stage could not write {path}: "
            f"{err.strerror or error_line(err)}; what was saved before is intact: "
            "free space and relaunch the same command to resume") from err


def stop_if_signalled(what: str) -> None:
    """Raises interrupt.Stopped if any process has received a signal: every process stops at
    the same family, instead of the others failing in the next collective when one leaves."""
    signum = distributed.max_over_processes(interrupt.requested() or 0)
    if signum:
        interrupt.raise_if_requested(what, signum)


def read_json(path: str):
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def sha256(path: str) -> str:
    """The sha256 of a file's bytes (hex)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


STALE = "was computed with other analysis settings"


def mover(workdir: str, say) -> Callable[..., None]:
    """move_aside(path, why=STALE): moves `path` (under `workdir`) to
    <workdir>/superseded/<time of this run>/, keeping its relative path (never over an earlier
    file), with a note. Only process 0 moves; the others skip the file."""
    aside = os.path.join(workdir, "superseded", time.strftime("%Y%m%dT%H%M%S"))

    def move_aside(path: str, why: str = STALE) -> None:
        if not distributed.is_main():
            return
        dest = base = os.path.join(aside, os.path.relpath(path, workdir))
        n = 0
        while os.path.lexists(dest):  # never over an earlier file moved aside
            n += 1
            dest = f"{base}.{n}"
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.move(path, dest)
        say(f"note: {os.path.relpath(path, workdir)} {why}; moved to "
            f"{os.path.relpath(dest, workdir)}")
    return move_aside


class Stages:
    """Per-family stage files under <workdir>/proxies, each stamped with the settings it used."""

    def __init__(self, workdir: str, move_aside):
        self.move_aside = move_aside
        self.dir = os.path.join(workdir, STAGE_DIR)
        os.makedirs(self.dir, exist_ok=True)

    def path(self, index: int, spec, suffix: str) -> str:
        name = f"{index:02d}_{spec.method}_{spec.target}".replace("+", "_and_")
        return os.path.join(self.dir, name + suffix)

    def load(self, path: str, stamp: str, read, check: Callable | None = None):
        """The stage's value if the file exists and carries `stamp`; a stale or unreadable one
        is moved aside (and computed again), and so is one whose value is not what a stage
        writes (rows: a list of dicts; fitted arrays or moments: a dict), or that
        `check(value)` finds wrong (it returns why, or None): valid JSON of the wrong shape is
        as damaged as garbage."""
        if not os.path.exists(path):
            return None
        try:
            content = read(path)
            stale = content["stamp"] != stamp
            value = content["value"]
            wrong = None if stale else _container(value) or (check and check(value))
        except Exception as err:  # noqa: BLE001 - truncated or damaged: recompute, keep a copy
            self.move_aside(path, f"is unreadable ({error_line(err)})")
            return None
        if stale:
            self.move_aside(path)
        elif wrong:
            self.move_aside(path, f"is unreadable (its stamp is right, but {wrong})")
        else:
            return value
        return None


def _container(value) -> str | None:
    """Why `value` is not a stage's value of any kind (rows, or a dict of arrays), or None."""
    if isinstance(value, dict) or (isinstance(value, list)
                                   and all(isinstance(row, dict) for row in value)):
        return None
    return f"its value is a {type(value).__name__}, not rows or arrays"


def read_msgpack(path: str) -> dict:
    with open(path, "rb") as f:
        return serialization.msgpack_restore(f.read())


def stamp(**settings) -> str:
    return json.dumps(settings, sort_keys=True, default=str)


def stage_file(directory: str, name: str) -> str:
    """A whole stage's stage file (Stage.stamped) in `directory`."""
    return os.path.join(directory, STAGE_DIR, f"stage_{name}.json")
