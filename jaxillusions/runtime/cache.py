"""The on-disk cache of generated data (Dyck splits, code splits): one .npz file per data config.

Files live in config.data.cache_dir, else $JAXILLUSIONS_CACHE, else ~/.cache/jaxillusions; each
task names its own files (`dyck-<key>.npz`, `code-<key>.npz`, the key a hash of what the data
depends on). The cache is only an optimization: an unreadable file is regenerated, and a
directory that cannot be written only warns. Processes that share the cache (two runs, the
processes of a multi-process run) make each file once: one makes it, the others wait for it
and load it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import time
import warnings
from collections.abc import Callable, Mapping
from typing import TypeVar

import numpy as np

from jaxillusions.runtime import interrupt

DEFAULT_DIR = "~/.cache/jaxillusions"
T = TypeVar("T")


def path(name: str, *dirs: str | None) -> str:
    """name in the first non-empty of dirs, else in $JAXILLUSIONS_CACHE, else in DEFAULT_DIR."""
    d = next((d for d in dirs if d), None) or os.environ.get("JAXILLUSIONS_CACHE") or DEFAULT_DIR
    return os.path.join(os.path.expanduser(d), name)


def temporary_path(path: str, pid: int) -> str:
    """The name under which process `pid`'s write_atomic writes `path` before renaming it (what
    a process killed mid-write leaves behind)."""
    return f"{path}.tmp{pid}"


def write_atomic(path: str, data: bytes | str) -> None:
    """Writes a file so that a reader (or a relaunch after a kill) sees all of it or none."""
    tmp = temporary_path(path, os.getpid())
    try:
        with open(tmp, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):  # a full disk leaves no partial temp file behind
            os.remove(tmp)
        raise


def save_npz(file: str, arrays: Mapping[str, np.ndarray], *, compressed: bool = False) -> None:
    """Writes arrays to file atomically (a temp file beside it, then rename): readers never see
    a half-written file. Creates the directory."""
    directory = os.path.dirname(file)
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            (np.savez_compressed if compressed else np.savez)(f, **arrays)
        os.replace(tmp, file)
    except BaseException:
        os.unlink(tmp)
        raise


def load_or_make(file: str, load: Callable[[str], T], make: Callable[[], T],
                 save: Callable[[str, T], None], what: str, verbose: bool = True) -> T:
    """load(file) if it exists and loads; else make(), then save(file, data). An unreadable file
    is a warning (then regenerated), as is a failed save (OSError); `what` names the data. While
    it makes the file, another process asking for it waits (`_making`), then loads it."""
    stale = os.path.exists(file)
    if stale:
        loaded = _load(file, load, what, verbose)
        if loaded:
            return loaded[0]
    with _making(file, what, verbose) as waited:
        if os.path.exists(file) and (waited or not stale):  # another process made it
            loaded = _load(file, load, what, verbose)
            if loaded:
                return loaded[0]
        t0 = time.perf_counter()
        data = make()
        dt = time.perf_counter() - t0
        where = f"cached at {file}"
        try:
            save(file, data)
        except OSError as e:
            warnings.warn(f"{what}: could not write cache {file} ({type(e).__name__}: {e})",
                          stacklevel=3)
            where = "not cached"
    if verbose:
        print(f"{what}: generated in {dt:.1f}s, {where}", flush=True)
    return data


def _load(file: str, load: Callable[[str], T], what: str, verbose: bool) -> tuple[T] | None:
    """(load(file),), or None with a warning when the file cannot be read."""
    try:
        data = load(file)
    except Exception as e:  # any unreadable/foreign file: the cache is only an optimization
        warnings.warn(f"{what}: unreadable cache {file} ({type(e).__name__}: {e}); "
                      "regenerating", stacklevel=4)
        return None
    if verbose:
        print(f"{what}: loaded {file}", flush=True)
    return (data,)


@contextlib.contextmanager
def _making(file: str, what: str, verbose: bool):
    """Held while this process makes `file`: an exclusive lock on `<file>.lock`, which the
    system releases when the process ends however it ends. Another process that asks for the
    same file meanwhile says so in one line and waits; a signal (interrupt.catch_signals)
    stops the wait. Yields whether it waited. The holder removes the lock file when done (a
    process that comes later finds the file made). No lock where the lock file cannot be made
    or the file system has no locks; then, as in the rare races of a removed lock file, two
    processes may both make the file, each writing it whole."""
    lock = f"{file}.lock"
    try:
        os.makedirs(os.path.dirname(file) or ".", exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:  # a directory that cannot be written: save warns
        yield False
        return
    waited = held = False
    try:
        while not held:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held = True
            except BlockingIOError:
                if not waited and verbose:
                    print(f"{what}: another process is making {file}; waiting for it",
                          flush=True)
                waited = True
                interrupt.raise_if_requested(f"while waiting for {file}")
                time.sleep(0.05)
            except OSError:  # no locks on this file system
                held = True
        yield waited
    finally:
        if held:  # a waiter stopped by a signal leaves the holder's lock file alone
            with contextlib.suppress(OSError):
                os.remove(lock)
        os.close(fd)  # and with it the lock


def error_line(err: BaseException) -> str:
    """'<exception type>: <the first line of its message>', for one-line reports; the type alone
    for an exception without a message (JAX's AssertionError where it cannot start a backend)."""
    return f"{type(err).__name__}: {first_line(err)}" if str(err).strip() else \
        type(err).__name__


def first_line(err: BaseException, limit: int = 1000) -> str:
    """The first line of the message, whole: a cut would end mid-sentence (e.g. orbax's
    "Requested byte range ... is not valid for value of size ..."). Only a line longer than
    `limit` is shortened, at the end of its last sentence that fits."""
    lines = str(err).strip().splitlines()
    if not lines:
        return type(err).__name__
    line = lines[0]
    if len(line) <= limit:
        return line
    end = line.rfind(". ", 0, limit)
    return line[:end + 1] if end > 0 else line[:limit] + " ..."
