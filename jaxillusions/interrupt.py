"""Graceful stops: SIGTERM/SIGINT set a flag that long loops check between chunks of work.

    with interrupt.catch_signals():     # in the launcher, around the whole job
        ...
        interrupt.raise_if_requested("at step 170; checkpoint saved")   # in a loop, after saving

A loop that sees the flag saves what it has and raises `Stopped` with the exit code a scheduler
expects for that signal (143 for SIGTERM, 130 for SIGINT). A second signal stops at once
(KeyboardInterrupt), without saving.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading

EXIT_CODES = {signal.SIGTERM: 143, signal.SIGINT: 130}


class Stopped(Exception):
    """The run stopped before its end; str(err) is the one line to show, exit_code the status."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


_received: list[int] = []


def _handler(signum, frame) -> None:
    if _received:
        raise KeyboardInterrupt
    _received.append(signum)
    # os.write: print() is not safe inside a signal handler (re-entrant buffered I/O).
    os.write(1, f"\nreceived {signal.Signals(signum).name}: stopping after the current chunk "
                "of work, with everything saved (send it again to stop at once)\n".encode())


def requested() -> int | None:
    """The signal received since catch_signals() started, or None."""
    return _received[0] if _received else None


def raise_if_requested(what: str, signum: int | None = None) -> None:
    """Raises Stopped('stopped by SIGTERM <what>') if a signal has been received (or `signum`
    is given: one that another process of a multi-host run received)."""
    signum = signum or requested()
    if signum:
        name = signal.Signals(signum).name
        raise Stopped(f"stopped by {name} {what}", EXIT_CODES[signum])


@contextlib.contextmanager
def catch_signals():
    """Installs the SIGTERM/SIGINT handlers for the duration (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _received.clear()
    previous = {s: signal.signal(s, _handler) for s in EXIT_CODES}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        _received.clear()
