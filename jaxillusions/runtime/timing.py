"""Where a job's time goes: wall seconds per stage, and XLA compilations (how many, how long)
from JAX's own monitoring events.

    with timing.Breakdown() as clock:
        with timing.stage("training"):
            ...
    print(clock.line())   # time 139 s: training 50 s, ...; compilation 12.0 s (36 programs)

`stage` adds to every active Breakdown and is a no-op without one, so library code can mark its
stages whoever calls it. A stage inside another is counted to the inner one only.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter, defaultdict
from collections.abc import Sequence

import jax

# The events jax._src.dispatch records (names as in jax 0.10): XLA's compilation of a program
# (also recorded, with the read time, when the persistent cache has it), and those cache hits.
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"

_active: list[Breakdown] = []


class Breakdown:
    """Wall seconds per stage and compilations (count and seconds, in total and per stage)
    while the `with` block runs."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.compiles: dict[str, list] = defaultdict(lambda: [0, 0.0])  # stage: [count, s]
        self.programs: Counter[str] = Counter()  # compilations per program ("jit(name)")
        self.cache_hits = 0
        self.total = 0.0
        self._stack: list[list] = []  # open stages: [name, start, seconds in inner stages]
        self._start = 0.0

    def _on_duration(self, event: str, seconds: float, fun_name: str = "?", **_) -> None:
        if event == COMPILE_EVENT:
            self.programs[fun_name] += 1
            for name in {"", self._stack[-1][0] if self._stack else "other"}:
                self.compiles[name][0] += 1
                self.compiles[name][1] += seconds

    def _on_event(self, event: str, **_) -> None:
        if event == CACHE_HIT_EVENT:
            self.cache_hits += 1

    def __enter__(self) -> Breakdown:
        jax.monitoring.register_event_duration_secs_listener(self._on_duration)
        jax.monitoring.register_event_listener(self._on_event)
        _active.append(self)
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.total = time.perf_counter() - self._start
        _active.remove(self)
        jax.monitoring.unregister_event_duration_listener(self._on_duration)
        jax.monitoring.unregister_event_listener(self._on_event)

    @property
    def compile_count(self) -> int:
        return self.compiles[""][0]

    @property
    def compile_seconds(self) -> float:
        return self.compiles[""][1]

    def line(self, order: Sequence[str] = ()) -> str:
        """One line: the total, the seconds of each stage that ran (those of `order` in its
        order, e.g. the main job's pipeline, then the others by name), the rest, compilation."""
        total = self.total or time.perf_counter() - self._start
        parts = [f"{name} {self.seconds[name]:.0f} s" for name in
                 [*order, *sorted(set(self.seconds) - set(order))] if name in self.seconds]
        rest = total - sum(self.seconds.values())
        cached = f", {self.cache_hits} read from the cache" if self.cache_hits else ""
        return (f"time {total:.0f} s: {', '.join([*parts, f'other {rest:.0f} s'])}; of which "
                f"compilation {self.compile_seconds:.1f} s ({self.compile_count} XLA "
                f"programs{cached})")


@contextlib.contextmanager
def stage(name: str):
    """Counts the block's wall time (less that of stages inside it) and its compilations to
    stage `name` of every active Breakdown."""
    clocks, start = list(_active), time.perf_counter()
    for clock in clocks:
        clock._stack.append([name, start, 0.0])
    try:
        yield
    finally:
        elapsed = time.perf_counter() - start
        for clock in clocks:
            _, _, inner = clock._stack.pop()
            clock.seconds[name] += elapsed - inner
            if clock._stack:
                clock._stack[-1][2] += elapsed
