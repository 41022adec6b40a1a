"""The stage files of the main job, and the helpers its stages write with.

A stage (studies/stage.py) saved whole (Stage.stamped) has one stage file,
proxies/stage_<name>.json, stamped with the values of its keys: the runner skips the stage on a
relaunch while that file and its outputs are there, and moves them aside when a key changed.
Stages with finer-grained work (a proxy family at a time) save each piece in a stamped stage
file of their own (`StageFiles`), so a relaunch resumes where a run stopped and a changed
analysis setting recomputes only what it affects (a stale file is moved to superseded/, never
overwritten). Writes go through `write`/`writing`: an OSError becomes one line naming the file
and the stage.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable, Sequence

from flax import serialization

from jaxillusions.runtime import distributed, interrupt
from jaxillusions.runtime.cache import error_line, write_atomic

STAGE_DIR = "proxies"


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


def unverified(digests: dict[str, str], directory: str, marker: str) -> str | None:
    """Why the files that `marker` (a done-file in `directory`) vouches for, `digests`
    ({path under directory: sha256}), are not those it recorded: the first one missing,
    emptied or changed since; None when every one matches."""
    for name, digest in sorted(digests.items()):
        path = os.path.join(directory, name)
        if not os.path.isfile(path):
            return f"its {name} is missing"
        if sha256(path) != digest:
            return (f"its {name} is empty" if os.path.getsize(path) == 0 else
                    f"its {name} differs from the sha256 recorded in {marker}")
    return None


STALE = "was computed with other analysis settings"


def mover(workdir: str, say) -> Callable[..., None]:
    """move_aside(path, why=STALE): moves `path` (under `workdir`; or a list of paths) to
    <workdir>/superseded/<time of this run>/, keeping its relative path (never over an earlier
    file), with a note (one for a list). Only process 0 moves; the others skip the file."""
    aside = os.path.join(workdir, "superseded", time.strftime("%Y%m%dT%H%M%S"))

    def move(path: str) -> str:
        dest = base = os.path.join(aside, os.path.relpath(path, workdir))
        n = 0
        while os.path.lexists(dest):  # never over an earlier file moved aside
            n += 1
            dest = f"{base}.{n}"
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.move(path, dest)
        return dest

    def move_aside(path: str | Sequence[str], why: str = STALE) -> None:
        if not distributed.is_main():
            return
        paths = [path] if isinstance(path, str) else list(path)
        if len(paths) == 1:
            dest = move(paths[0])
            say(f"note: {os.path.relpath(paths[0], workdir)} {why}; moved to "
                f"{os.path.relpath(dest, workdir)}")
            return
        names = [os.path.relpath(p, workdir) for p in paths]
        for p in paths:
            move(p)
        if names:
            shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6
                                            else "")
            say(f"note: {len(names)} files moved to {os.path.relpath(aside, workdir)}/ "
                f"({shown}): each {why}")
    return move_aside


class StageFiles:
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
