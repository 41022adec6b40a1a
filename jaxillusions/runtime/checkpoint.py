"""Workdir bookkeeping: the lock, the config a workdir belongs to, verified orbax checkpoints of
the sweep state, and small atomically written files for finished stages of the main job."""

from __future__ import annotations

import datetime
import fcntl
import hashlib
import json
import os
import shutil
import socket
import sys
import time
from typing import TYPE_CHECKING

import jax
import numpy as np

from jaxillusions.runtime import distributed
from jaxillusions.runtime import machine as machine_lib
from jaxillusions.runtime.cache import error_line, first_line, write_atomic
from jaxillusions.runtime.tensorboard import flatten_config

if TYPE_CHECKING:  # for annotations; the functions import it where used
    import orbax.checkpoint as ocp

CONFIG_FILE = "config.json"
# A grid's folder (pipeline/grid.py) holds these beside its joined results.csv, and its points'
# runs in subfolders: no run of its own, and no run may take it.
GRID_FILES = ("grid.json", "grid_done.json")
CHECKPOINT_DIR = "checkpoints"  # under the workdir
HISTORY_FILE = "config_history.jsonl"
LOCK_FILE = ".lock"
CHECKSUM_FILE = "checksums.json"  # written after orbax commits a step: the step's commit marker
_ORBAX_COMMITTED = "_CHECKPOINT_METADATA"  # orbax writes it when it commits a step


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---------------------------------------------------------------------------------------------
# The workdir lock: one process per workdir.


class WorkdirLock:
    """An exclusive `flock` on `<workdir>/.lock`, held for the life of the process.

    The kernel releases it when the process dies, however it dies, so a lock left by a killed run
    is free again; its holder line (pid, host, start time) stays in the file and is reported when
    the next run takes over. (flock on network file systems depends on their locking support.)
    """

    def __init__(self, workdir: str):
        self.workdir = workdir
        self.path = os.path.join(workdir, LOCK_FILE)
        self._fd: int | None = None

    def acquire(self) -> str | None:
        """Takes the lock; ValueError naming the holder if busy. Returns a note on takeover."""
        if os.path.exists(self.workdir) and not os.path.isdir(self.workdir):
            raise ValueError(f"workdir {self.workdir} exists and is not a directory")
        try:
            os.makedirs(self.workdir, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            raise ValueError(f"workdir {self.workdir} cannot be written: "
                             f"{err.strerror or err}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 1000, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise ValueError(f"workdir {self.workdir} is in use by {holder} (lock file "
                             f"{self.path}); wait for it to end or use another --workdir"
                             ) from None
        previous = os.pread(fd, 1000, 0).decode(errors="replace").strip()
        holder = f"pid {os.getpid()} on {socket.gethostname()} since {now()}"
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, holder.encode() + b"\n", 0)
        except OSError as err:
            os.close(fd)
            raise ValueError(f"workdir {self.workdir} cannot be written: "
                             f"{err.strerror or err}") from None
        self._fd = fd
        if previous:
            return f"note: took over the lock of {previous}, which ended without releasing it"
        return None

    def release(self) -> None:
        if self._fd is not None:
            try:
                os.ftruncate(self._fd, 0)
            except OSError:
                pass
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> WorkdirLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


# ---------------------------------------------------------------------------------------------
# The config a workdir belongs to.


def claim_workdir(workdir: str, config, may_change=lambda key: False,
                  defaults: dict | None = None, record: bool = True,
                  machine: dict | None = None, read=lambda stored: stored) -> list[str]:
    """Records the config in a new workdir, or checks it against the one the workdir holds (a
    ValueError for a grid's folder, GRID_FILES).

    `record=False` only checks: it raises as below but writes nothing (and returns no notes),
    so that a run that fails before training (bad data) does not claim a fresh workdir.

    Keys for which `may_change(key)` is true (analysis and logging settings, see
    settings.is_analysis_key) may differ: the change is appended to config_history.jsonl,
    config.json is updated, and the changes are returned as notes. Any other difference is a
    ValueError: resuming with a different training config would mix two experiments. Keys in
    `defaults` that one side lacks count as their default value there.

    `machine` (machine.describe()) is recorded in config_history.jsonl when the workdir is
    created and whenever it differs from the last one recorded; a launch on another machine than
    the last is returned as a note, since its numbers round as that machine does. `read` turns
    the stored config into what the door makes of it now (settings.read_stored), before the
    two are compared.
    """
    grid = next((f for f in GRID_FILES if os.path.lexists(os.path.join(workdir, f))), None)
    if grid is not None:
        raise ValueError(f"workdir {workdir} holds a grid ({grid}; its points in subfolders): "
                         "a run there would replace the grid's results.csv; use a new "
                         "--workdir, or relaunch the grid (config.grid) as it was")
    checkpoints = os.path.join(workdir, CHECKPOINT_DIR)
    if os.path.lexists(checkpoints) and not os.path.isdir(checkpoints):
        raise ValueError(f"{checkpoints} is not a directory, so no checkpoint could be saved "
                         "there; move it away or use another --workdir")
    path = os.path.join(workdir, CONFIG_FILE)
    new = json.loads(json.dumps(config.to_dict()))  # Settings (or a ConfigDict)
    text = json.dumps(new, indent=2, sort_keys=True)
    if not os.path.exists(path):
        if has_checkpoints(workdir):  # trained under a config nobody can check any more
            raise ValueError(
                f"{path} is missing, but {checkpoints} holds checkpoints: the config they were "
                "trained with is unknown, so they are not resumed; put that config.json back, "
                "or use another --workdir")
        if not record:
            return []
        os.makedirs(workdir, exist_ok=True)
        write_atomic(path, text)
        _append_history(workdir, {"time": now(), "event": "created",
                                  **({"machine": machine} if machine else {})})
        return []
    old = read(_read_config_file(path))
    # A key missing on one side counts as its default (`defaults`: settings' own).
    old_flat = {**(defaults or {}), **flatten_config(old)}
    new_flat = {**(defaults or {}), **flatten_config(new)}
    diffs = [k for k in sorted(set(old_flat) | set(new_flat))
             if old_flat.get(k, "<missing>") != new_flat.get(k, "<missing>")]
    fixed = [k for k in diffs if not may_change(k)]
    if fixed:
        k = fixed[0]
        raise ValueError(
            f"workdir {workdir} holds a run with a different config ({len(fixed)} training "
            f"{'key differs' if len(fixed) == 1 else 'keys differ'}, e.g. {k}: "
            f"{old_flat.get(k, '<missing>')!r} there vs "
            f"{new_flat.get(k, '<missing>')!r} now); use a new --workdir or the same config")
    if not record:
        return []
    notes = []
    if diffs:
        changes = {k: [old_flat.get(k), new_flat.get(k)] for k in diffs}
        _append_history(workdir, {"time": now(), "event": "changed", "changes": changes})
        write_atomic(path, text)
        notes = [f"note: {k} changed from {a!r} to {b!r} (analysis setting; recorded in "
                 f"{HISTORY_FILE})" for k, (a, b) in changes.items()]
    return notes + (_machine_changed(workdir, machine) if machine else [])


def _machine_changed(workdir: str, machine: dict) -> list[str]:
    """Appends `machine` to the history where the last recorded one differs (or none is, in a
    workdir from before the record); a note where a recorded entry differs (an entry the record
    predates is added without one)."""
    last = None
    try:
        with open(os.path.join(workdir, HISTORY_FILE)) as f:
            for line in f:
                try:
                    last = json.loads(line).get("machine") or last
                except (ValueError, AttributeError):  # a torn or foreign line: not a record
                    pass
    except OSError:
        pass
    if last == machine:
        return []
    _append_history(workdir, {"time": now(), "event": "machine", "machine": machine})
    if last is None:
        return []
    what = machine_lib.changed({**machine, **last}, machine)  # entries it predates: as now
    if not what:
        return []
    return [f"note: this workdir last ran on another machine ({what}): what it trains or "
            "computes from here rounds as this machine does, so its last bits differ from a run "
            f"on one machine (recorded in {HISTORY_FILE}; docs/reliability.md, Reproducibility)"]


def has_checkpoints(workdir: str) -> bool:
    """True when <workdir>/checkpoints holds a checkpoint step, finished or not."""
    directory = os.path.join(workdir, CHECKPOINT_DIR)
    return os.path.isdir(directory) and any(
        name.split(".", 1)[0].isdigit() for name in os.listdir(directory))


def _read_config_file(path: str) -> dict:
    """A workdir's config.json; ValueError naming it if it is not a JSON object of sections."""
    try:
        with open(path) as f:
            old = json.load(f)
    except (OSError, ValueError) as err:
        why = error_line(err)
    else:
        if isinstance(old, dict):
            return old
        why = f"valid JSON, but a {type(old).__name__}, not a config"
    raise ValueError(f"{path} is unreadable ({why}); it records the config this workdir's run "
                     "was trained with: restore it from a copy, or use another --workdir")


def _append_history(workdir: str, record: dict) -> None:
    with open(os.path.join(workdir, HISTORY_FILE), "a") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")


# ---------------------------------------------------------------------------------------------
# Checkpoints.


def _name(path) -> str:
    return jax.tree_util.keystr(path, simple=True, separator=".")


def checksums(tree) -> dict[str, str]:
    """sha256 of every leaf's bytes (with dtype and shape), by dotted leaf name."""
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        x = np.asarray(leaf)
        h = hashlib.sha256(f"{x.dtype.str}{x.shape}".encode())
        h.update(np.ascontiguousarray(x).tobytes())
        out[_name(path)] = h.hexdigest()
    return out


def _first_mismatch(metadata, target) -> str | None:
    """The first leaf whose structure, shape or dtype differs between checkpoint and target."""
    saved = {_name(p): m for p, m in jax.tree_util.tree_flatten_with_path(metadata)[0]}
    wanted = [(_name(p), x) for p, x in jax.tree_util.tree_flatten_with_path(target)[0]]
    for name, x in wanted:
        if name not in saved:
            return f"{name} is in this config/code but not in the checkpoint"
        m = saved[name]
        if tuple(m.shape) != tuple(x.shape) or np.dtype(m.dtype) != np.dtype(x.dtype):
            return (f"{name}: checkpoint {tuple(m.shape)} {np.dtype(m.dtype)} vs config "
                    f"{tuple(x.shape)} {np.dtype(x.dtype)}")
    extra = sorted(set(saved) - {n for n, _ in wanted})
    if extra:
        return f"{extra[0]} is in the checkpoint but not in this config/code"
    return None


class CheckpointMismatch(ValueError):
    """The checkpoint is readable but was written for another model/config/code."""


def _late_read(unraisable) -> bool:
    """Whether an unraisable error is a read that finished after its restore failed (see
    drop_late_reads): asyncio's RuntimeError for a closed loop, raised in call_soon_threadsafe."""
    tb = unraisable.exc_traceback
    return (unraisable.object is None and isinstance(unraisable.exc_value, RuntimeError)
            and str(unraisable.exc_value) == "Event loop is closed" and tb is not None
            and tb.tb_frame.f_code.co_name == "call_soon_threadsafe")


def drop_late_reads() -> None:
    """Silences the reads of a failed restore that finish after it. Orbax reads a checkpoint's
    arrays in parallel (tensorstore) in an event loop that it closes as soon as one read fails;
    the others finish later on their own threads and each hands its result to the closed loop,
    an error Python prints as a traceback with no owner (sys.unraisablehook): a screenful for
    one truncated file before the checkpoint's one-line warning. Their results are not wanted.
    This wraps sys.unraisablehook, once per process, to drop exactly that error (_late_read)
    and pass every other to the hook before it."""
    previous = sys.unraisablehook
    if getattr(previous, "drops_late_reads", False):
        return

    def hook(unraisable) -> None:
        if not _late_read(unraisable):
            previous(unraisable)

    hook.drops_late_reads = True
    sys.unraisablehook = hook


class Checkpointer:
    """Saves the whole sweep state with per-leaf checksums; restores the newest good checkpoint."""

    def __init__(self, directory: str, max_to_keep: int = 2):
        self.directory = os.path.abspath(directory)
        self.max_to_keep = max_to_keep
        self._manager = self._new_manager()

    def _new_manager(self) -> ocp.CheckpointManager:
        # The handler is named up front so that item_metadata works before any save/restore.
        import orbax.checkpoint as ocp  # noqa: PLC0415 - not at a launch's start
        return ocp.CheckpointManager(
            self.directory, options=ocp.CheckpointManagerOptions(max_to_keep=self.max_to_keep,
                                                                 create=True),
            item_handlers=ocp.StandardCheckpointHandler())

    def _renew(self) -> None:
        # A failed restore can leave the manager unusable for the next step: start afresh.
        try:
            self._manager.close()
        except Exception:  # noqa: BLE001 - the old manager is discarded either way
            pass
        self._manager = self._new_manager()

    def save(self, step: int, state) -> None:
        """Saves `state` at `step`, then its checksums.json, the step's commit marker (see
        `committed`): a failed or killed save leaves an incomplete step that restore_latest
        skips, and older checkpoints intact."""
        import orbax.checkpoint as ocp  # noqa: PLC0415 - not at a launch's start
        try:
            self._manager.save(step, args=ocp.args.StandardSave(state), force=True)
            self._manager.wait_until_finished()
            if distributed.is_main():  # with several processes, all save and one writes
                sums = json.dumps(checksums(state), indent=0, sort_keys=True)
                write_atomic(os.path.join(self.directory, str(step), CHECKSUM_FILE), sums)
        except Exception as err:
            raise OSError(f"could not save checkpoint {step} in {self.directory} "
                          f"({root_cause(err)}); any older checkpoints are intact") from err

    def _step_dir(self, step: int) -> str:
        return os.path.join(self.directory, str(step))

    def committed(self, step: int) -> bool:
        """True when the step's save finished: orbax committed it (_CHECKPOINT_METADATA) and
        its checksums.json, written after that commit, exists. The checksums file is the
        commit marker of the pair: a kill between the two leaves a step without it, which is
        incomplete, and so is a step dir that orbax's cleanup of old steps left half-deleted."""
        return all(os.path.exists(os.path.join(self._step_dir(step), name))
                   for name in (CHECKSUM_FILE, _ORBAX_COMMITTED))

    def _restore(self, step: int, target, abstract):
        """The state at `step`. CheckpointMismatch if it does not fit `target`; any other
        exception means it is incomplete, unreadable or fails its checksums."""
        import orbax.checkpoint as ocp  # noqa: PLC0415 - not at a launch's start
        sums_path = os.path.join(self._step_dir(step), CHECKSUM_FILE)
        if not os.path.exists(sums_path):
            raise RuntimeError(f"incomplete: no {CHECKSUM_FILE}, so the save did not finish "
                               "(killed between orbax's commit and the checksums)")
        try:
            metadata = self._manager.item_metadata(step)
        except Exception as err:  # noqa: BLE001
            raise RuntimeError(f"metadata unreadable: {first_line(err)}") from err
        if metadata is None:
            raise RuntimeError("metadata missing")
        self._fits(step, metadata, target)
        state = self._manager.restore(step, args=ocp.args.StandardRestore(abstract))
        with open(sums_path) as f:
            expected = json.load(f)
        actual = checksums(state)
        for name in sorted(set(expected) | set(actual)):
            if expected.get(name) != actual.get(name):
                raise RuntimeError(f"{name} does not match its recorded sha256 checksum")
        return state

    def _fits(self, step: int, metadata, target) -> None:
        mismatch = _first_mismatch(metadata, target)
        if mismatch:
            raise CheckpointMismatch(
                f"checkpoint {step} in {self.directory} does not match this config or code: "
                f"{mismatch}; nothing was changed (use another --workdir, or the config, data "
                "and code that wrote it: a model's vocabulary follows its data)")

    def check_fits(self, target) -> None:
        """CheckpointMismatch if the newest finished checkpoint does not fit `target` (shapes
        and dtypes, e.g. jax.eval_shape's), from its metadata alone: before a relaunch claims
        the workdir or moves its reports aside. Nothing where there is none or it is unreadable
        (restore_latest deals with those)."""
        steps = [s for s in sorted(self._manager.all_steps(), reverse=True) if self.committed(s)]
        try:
            metadata = self._manager.item_metadata(steps[0]) if steps else None
        except Exception:  # noqa: BLE001 - unreadable: restore_latest skips it
            return
        if metadata is not None:
            self._fits(steps[0], metadata, target)

    def restore_latest(self, target, *, start_over: bool = False):
        """Returns (step, state) of the newest checkpoint that restores and verifies, or
        (None, target) when there is none.

        An unreadable checkpoint (incomplete: no checksums.json, see `committed`; missing
        files, corrupt bytes, checksum mismatch) is skipped and the next older one tried, each
        with a fresh manager; once one restores, the newer unreadable ones, and older step dirs
        that are incomplete (half-deleted by a kill during orbax's cleanup), are moved to
        `<workdir>/corrupt_checkpoints/` (kept, never deleted). A checkpoint that reads fine
        but does not fit `target` stops everything with CheckpointMismatch, touching nothing.
        If checkpoints exist but none restores, that is a ValueError, and nothing is moved,
        unless `start_over`: then they are all moved aside and training starts from step 0.
        """
        import orbax.checkpoint as ocp  # noqa: PLC0415 - not at a launch's start
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, target)
        failed: list[tuple[int, str]] = []
        steps = sorted(self._manager.all_steps(), reverse=True)
        if steps:
            drop_late_reads()
        for step in steps:
            try:
                state = self._restore(step, target, abstract)
            except CheckpointMismatch:
                raise
            except Exception as err:  # noqa: BLE001 - any other failure: unreadable
                failed.append((step, error_line(err)))
                self._renew()
                continue
            self._quarantine(failed + [
                (s, f"incomplete: no {CHECKSUM_FILE} or {_ORBAX_COMMITTED}, a save or cleanup "
                    "cut off") for s in steps if s < step and not self.committed(s)])
            return step, state
        if failed and not start_over:
            steps = ", ".join(str(s) for s, _ in failed)
            raise ValueError(
                f"none of the checkpoints in {self.directory} (steps {steps}) can be restored "
                f"(step {failed[0][0]}: {failed[0][1]}); nothing was moved. Relaunch with "
                "--start_over to move them to corrupt_checkpoints/ and train from step 0")
        self._quarantine(failed)
        return None, target

    def _quarantine(self, failed: list[tuple[int, str]]) -> None:
        for step, reason in failed if distributed.is_main() else ():
            aside = os.path.join(os.path.dirname(self.directory), "corrupt_checkpoints",
                                 f"{step}-{int(time.time())}")
            os.makedirs(os.path.dirname(aside), exist_ok=True)
            shutil.move(self._step_dir(step), aside)
            print(f"WARNING: checkpoint {step} in {self.directory} is unreadable ({reason}); "
                  f"moved to {aside}")
        if failed:
            distributed.barrier("checkpoints moved aside")
            self._renew()

    def close(self) -> None:
        self._manager.close()


def root_cause(err: BaseException) -> str:
    """The innermost OS error of an exception chain (e.g. 'No space left on device'), or the
    first line of the exception itself."""
    chain, seen = [], set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        chain.append(err)
        err = err.__cause__ or err.__context__
    for e in reversed(chain):
        if isinstance(e, OSError) and e.strerror:
            return e.strerror + (f": {e.filename}" if e.filename else "")
    for e in chain:
        if "No space left on device" in str(e):
            return "No space left on device"
    return error_line(chain[0])
