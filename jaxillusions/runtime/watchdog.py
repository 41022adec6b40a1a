"""A stall ends the run: no progress for `stall_seconds` is a one-line error, never a hang.

    with watchdog.watching(settings.stall_seconds, workdir):   # around the main job
        watchdog.progress("fitting tuned_lens on blocks.0.resid_pre")   # at each piece of work

A thread checks the time since the last `progress` call. Past the limit it writes the Python
stack of every thread to <workdir>/stall_<time>.txt, prints one line naming what was in
progress, and ends the process with exit code 124 (a main thread blocked inside XLA never
returns to Python, so nothing gentler can stop it). Every stage saves its work as it finishes,
so relaunching the same command resumes; what the stalled piece had computed is lost.
`progress` outside `watching` does nothing, so library code may call it freely.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import threading
import time

EXIT_CODE = 124  # as coreutils' timeout

_state: dict = {}


def progress(what: str | None = None) -> None:
    """Marks progress: `what` is now in progress (the error's wording if it stalls; None: the
    same piece of work as before, one more chunk of it done)."""
    if _state:
        _state["last"] = time.monotonic()
        if what is not None:
            _state["what"] = what


def _watch(limit: float, workdir: str, stop: threading.Event) -> None:
    while not stop.wait(min(limit, 5.0) / 5):
        idle = time.monotonic() - _state["last"]
        if idle < limit:
            continue
        os.makedirs(workdir, exist_ok=True)
        path = os.path.join(workdir, f"stall_{time.strftime('%Y%m%d-%H%M%S')}.txt")
        with open(path, "w") as f:
            f.write(f"no progress for {idle:.0f} s while {_state['what']}; the Python stack of "
                    "every thread:\n\n")
            f.flush()
            faulthandler.dump_traceback(f, all_threads=True)
        os.write(2, f"error: no progress for {idle:.0f} s while {_state['what']} (stall_seconds="
                    f"{limit:g}); stacks in {path}; what was saved is kept: relaunch the same "
                    "command to resume\n".encode())
        os._exit(EXIT_CODE)


@contextlib.contextmanager
def watching(limit: float, workdir: str, what: str = "starting"):
    """Watches the enclosed work; limit 0 (or below) watches nothing."""
    if limit <= 0 or _state:  # off, or already watched by an outer call
        yield
        return
    stop = threading.Event()
    _state.update(what=what, last=time.monotonic())
    thread = threading.Thread(target=_watch, args=(limit, workdir, stop), daemon=True,
                              name="watchdog")
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        _state.clear()
