"""A stall ends the run: no progress and no CPU use for `stall_seconds` is a one-line error.

    with watchdog.watching(settings.stall_seconds, workdir):   # around the main job
        watchdog.progress("fitting tuned_lens on blocks.0.resid_pre")   # at each piece of work

A thread checks the time since the last `progress` call. A piece of work may legitimately take
long (a chunk of training steps is one XLA call); a stalled one waits without computing (a
deadlock, a wait on a lost peer or a hung disk). So the run is declared stalled when no progress
was marked for the limit AND the process used under 5% of one core over the last `limit`
seconds. Then it writes the Python stack of every thread to <workdir>/stall_<time>.txt, prints
one line naming what was in progress, and ends the process with exit code 124 (a main thread
blocked inside XLA never returns to Python, so nothing gentler can stop it). Every stage saves
its work as it finishes, so relaunching the same command resumes; what the stalled piece had
computed is lost. A piece of work that waits for a child process (the figures' helper) marks
progress while it waits. `progress` outside `watching` does nothing, so library code may call
it freely.
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


IDLE_CPU = 0.05  # of one core: below it over the window, the process is waiting, not working


def _watch(limit: float, workdir: str, stop: threading.Event) -> None:
    samples = [(time.monotonic(), time.process_time())]  # (wall, CPU of every thread)
    while not stop.wait(min(limit, 5.0) / 5):
        now, cpu = time.monotonic(), time.process_time()
        samples.append((now, cpu))
        while len(samples) > 2 and samples[1][0] <= now - limit:
            samples.pop(0)  # keep the last `limit` seconds (and one sample before them)
        idle = now - _state["last"]
        wall, used = now - samples[0][0], cpu - samples[0][1]
        if idle < limit or wall < limit or used > IDLE_CPU * wall:
            continue
        os.makedirs(workdir, exist_ok=True)
        path = os.path.join(workdir, f"stall_{time.strftime('%Y%m%d-%H%M%S')}.txt")
        with open(path, "w") as f:
            f.write(f"no progress for {idle:.0f} s while {_state['what']}, {used:.1f} s of CPU "
                    f"in the last {wall:.0f} s; the Python stack of every thread:\n\n")
            f.flush()
            faulthandler.dump_traceback(f, all_threads=True)
        os.write(2, f"error: no progress and no CPU use for {idle:.0f} s while {_state['what']} "
                    f"(stall_seconds={limit:g}); stacks in {path}; what was saved is kept: "
                    "relaunch the same command to resume\n".encode())
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
