"""The on-disk cache of generated data (Dyck splits, code splits): one .npz file per data config.

Files live in config.data.cache_dir, else $JAXILLUSIONS_CACHE, else ~/.cache/jaxillusions; each
task names its own files (`dyck-<key>.npz`, `code-<key>.npz`, the key a hash of what the data
depends on). The cache is only an optimization: an unreadable file is regenerated, and a
directory that cannot be written only warns.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
import warnings
from collections.abc import Callable, Mapping
from typing import TypeVar

import numpy as np

DEFAULT_DIR = "~/.cache/jaxillusions"
T = TypeVar("T")


def path(name: str, *dirs: str | None) -> str:
    """name in the first non-empty of dirs, else in $JAXILLUSIONS_CACHE, else in DEFAULT_DIR."""
    d = next((d for d in dirs if d), None) or os.environ.get("JAXILLUSIONS_CACHE") or DEFAULT_DIR
    return os.path.join(os.path.expanduser(d), name)


def write_atomic(path: str, data: bytes | str) -> None:
    """Writes a file so that a reader (or a relaunch after a kill) sees all of it or none."""
    tmp = f"{path}.tmp{os.getpid()}"
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
    is a warning (then regenerated), as is a failed save (OSError); `what` names the data."""
    if os.path.exists(file):
        try:
            data = load(file)
            if verbose:
                print(f"{what}: loaded {file}", flush=True)
            return data
        except Exception as e:  # any unreadable/foreign file: the cache is only an optimization
            warnings.warn(f"{what}: unreadable cache {file} ({type(e).__name__}: {e}); "
                          "regenerating", stacklevel=3)
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


def error_line(err: BaseException) -> str:
    """'<exception type>: <the first line of its message>', for one-line reports."""
    return f"{type(err).__name__}: {first_line(err)}"


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
