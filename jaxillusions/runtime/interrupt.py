"""Graceful stops: SIGTERM/SIGINT set a flag that long loops check between chunks of work.

    with interrupt.catch_signals():     # in the launcher, around the whole job
        ...
        interrupt.raise_if_requested("at step 170; checkpoint saved")   # in a loop, after saving

A loop that sees the flag saves what it has and raises `Stopped` with the exit code a scheduler
expects for that signal (143 for SIGTERM, 130 for SIGINT). A second signal stops the process at
once, without saving, with the exit code of that signal. The same signal again within
SAME_DELIVERY_S of the first is not a second one but the first delivered twice: coreutils
`timeout` (and many schedulers) send SIGTERM to the process and then to its process group.

Before catch_signals, while a launcher starts (its imports of JAX and co. take seconds), a
launcher's first lines call `catch_start_up()`: a signal then ends the process at once with one
line and that signal's exit code, not a KeyboardInterrupt traceback.

Python runs a signal handler only when the main thread returns to the interpreter; a main thread
blocked inside JAX (waiting on a computation or an allocation) would never see the signal. So
the signals also reach a watcher thread (through `signal.set_wakeup_fd`), which prints the
"stopping" line at once and ends the process on the second signal, wherever the main thread is.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time

EXIT_CODES = {signal.SIGTERM: 143, signal.SIGINT: 130}
# Seconds after a signal in which the same signal again is that one delivered twice (to the
# process and to its group), not a second request.
SAME_DELIVERY_S = 1.0


class Stopped(Exception):
    """The run stopped before its end; str(err) is the one line to show, exit_code the status."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


_received: list[int] = []
_first: list[tuple[int, float]] = []  # (signal, time.monotonic()) of the first, for repeats
_before_start_up: dict[int, object] = {}  # the handlers catch_start_up replaced


def _repeat(signum: int, now: float) -> bool:
    """Whether `signum` at `now` is the first signal delivered again, not a second one."""
    return bool(_first) and _first[0][0] == signum and now - _first[0][1] < SAME_DELIVERY_S


def exit_now(code: int, line: str) -> None:
    """Ends the process at once with `line` on stderr and exit status `code`, what was printed
    before flushed: for a signal handler that stops the process. Not by raising SystemExit: a
    handler runs wherever the main thread is, and an exception raised inside a garbage-collector
    callback (JAX has one) is printed and dropped, so a launcher stopped there went on and
    finished its run. No finally block runs (a workdir's lock is an flock: the kernel releases
    it)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # (a write the handler interrupted: reentrant)
            stream.flush()
    os.write(2, f"{line}\n".encode())
    os._exit(code)


def _stop_in_start_up(signum, frame) -> None:
    del frame
    exit_now(EXIT_CODES[signum], f"stopped by {_name(signum)} during start-up; nothing was "
                                 "computed")


def catch_start_up() -> None:
    """A launcher's first lines: until catch_signals takes over, SIGTERM/SIGINT end the process
    with one line (`stopped by SIGINT during start-up; nothing was computed`) and exit code
    143/130, instead of a KeyboardInterrupt traceback from inside an import (or no line at all
    for SIGTERM). Main thread only."""
    for s in EXIT_CODES:
        previous = signal.signal(s, _stop_in_start_up)
        if previous is not _stop_in_start_up:
            _before_start_up[s] = previous


def _handler(signum, frame) -> None:
    # The watcher thread announces the signal and handles a second one; here only the flag
    # that the loops check is set.
    if not _received:
        _received.append(signum)


def _name(signum: int) -> str:
    return signal.Signals(signum).name


def _watch(read_fd: int, clock=time.monotonic) -> None:
    """The watcher thread: reads the signal numbers that the C-level handler writes to the
    wakeup fd (even while the main thread is blocked in C++), until the fd closes. The same
    signal again within SAME_DELIVERY_S of the first is that one delivered twice: ignored."""
    first = None
    while True:
        try:
            data = os.read(read_fd, 64)
        except OSError:
            return
        if not data:
            return
        for signum in data:
            if signum not in EXIT_CODES:
                continue
            now = clock()
            if first is None:
                first = (signum, now)
                _first[:] = [first]  # for _after_stop, once catch_signals has ended
                # os.write: no buffered I/O shared with the main thread.
                os.write(1, f"\nreceived {_name(signum)}: stopping after the current chunk of "
                            "work, with everything saved (send it again to stop at once)\n"
                            .encode())
                continue
            if signum == first[0] and now - first[1] < SAME_DELIVERY_S:
                continue  # sent to the process and to its group (`timeout`): one delivery
            _stop_at_once(signum)


def _stop_at_once(signum: int, frame=None) -> None:
    """The second signal: one line, and the process ends with that signal's exit code."""
    del frame
    os.write(2, f"error: stopped at once by a second {_name(signum)} (work since the last "
                "checkpoint or saved stage is lost); relaunch the same command to resume\n"
                .encode())
    os._exit(EXIT_CODES[signum])


def _after_stop(signum: int, frame=None) -> None:
    """The handler once catch_signals ended on a signal: a repeat of that signal is ignored,
    any other stops at once."""
    if not _repeat(signum, time.monotonic()):
        _stop_at_once(signum, frame)


def requested() -> int | None:
    """The signal received since catch_signals() started, or None."""
    return _received[0] if _received else None


def raise_if_requested(what: str, signum: int | None = None) -> None:
    """Raises Stopped('stopped by SIGTERM <what>') if a signal has been received (or `signum`
    is given: one that another process of a multi-host run received)."""
    signum = signum or requested()
    if signum:
        raise Stopped(f"stopped by {_name(signum)} {what}", EXIT_CODES[signum])


@contextlib.contextmanager
def catch_signals():
    """Installs the SIGTERM/SIGINT handlers and the watcher thread for the duration (main
    thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _received.clear()
    _first.clear()
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)  # the C handler must never block on a full pipe
    watcher = threading.Thread(target=_watch, args=(read_fd,), name="signal-watcher",
                               daemon=True)
    previous_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    previous = {s: signal.signal(s, _handler) for s in EXIT_CODES}
    # catch_start_up's handlers end here: afterwards, those from before it.
    previous = {s: _before_start_up.get(s, signal.SIG_DFL) if h is _stop_in_start_up else h
                for s, h in previous.items()}
    watcher.start()
    try:
        yield
    finally:
        # Stopping on a signal: the process is about to exit with its code, so a second signal
        # that arrives now still exits with a signal's code, not the default handler's -15 (or
        # a KeyboardInterrupt), and the first one delivered again is still ignored.
        stopping = bool(_received)
        for s, h in previous.items():
            signal.signal(s, _after_stop if stopping and h in (
                signal.SIG_DFL, signal.default_int_handler) else h)
        signal.set_wakeup_fd(previous_fd)
        os.close(write_fd)  # the watcher reads EOF and ends
        watcher.join(timeout=5)
        os.close(read_fd)
        _received.clear()
