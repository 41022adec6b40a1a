"""Device memory of the training step, per seed and for the sweep, before training starts.

    est = estimate(train.train_steps, state, tokens, hparams, num_steps=..., ...)
    print(describe(est))

The estimate is XLA's own account of the compiled step (`memory_analysis()`: arguments, outputs
and temporaries, minus donated buffers) for one device's share of a chunk of seeds. Compiling
with the shapes and shardings of the real first call fills jit's cache, so the estimate costs no
extra compilation. Everything but the training tokens (which every device holds once) grows
with the seeds on the device, so per seed = (step - tokens) / seeds per device.

When the device reports its capacity (GPUs and TPUs: `memory_stats()["bytes_limit"]`) and the
step does not fit, `describe` says how many seeds per chunk would (`train.seed_chunk_size`).

The proxy stage plans its own chunks (`plan_seed_chunk`): the compiled call for all seeds is
measured the same way and, if it does not fit in 90% of the capacity, the largest number of
seeds per chunk that does is chosen (checked by compiling that width, the call that then runs).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import numpy as np

from jaxillusions import distributed

GiB = 2**30


@dataclasses.dataclass(frozen=True)
class Estimate:
    step_bytes: int  # one device's memory for the compiled step of one chunk
    fixed_bytes: int  # of which independent of the seed count (the training tokens)
    seeds_per_device: int  # seeds of a chunk on each device (padding included)
    num_devices: int
    num_chunks: int
    capacity: int | None  # bytes one device can allocate, when it says so

    @property
    def per_seed_bytes(self) -> float:
        return (self.step_bytes - self.fixed_bytes) / max(self.seeds_per_device, 1)

    @property
    def fits(self) -> bool | None:
        return None if self.capacity is None else self.step_bytes <= self.capacity

    def max_chunk_size(self, headroom: float = 0.9) -> int | None:
        """The most seeds per chunk (all devices) that fit in `headroom` of the capacity."""
        if self.capacity is None or self.per_seed_bytes <= 0:
            return None
        per_device = int((headroom * self.capacity - self.fixed_bytes) // self.per_seed_bytes)
        return max(per_device, 0) * self.num_devices


def capacity() -> int | None:
    """Bytes the first local device can allocate, or None when it does not say (CPU)."""
    try:
        stats = jax.local_devices()[0].memory_stats()
    except Exception:  # noqa: BLE001 - backends without memory statistics
        return None
    return int(stats["bytes_limit"]) if stats and "bytes_limit" in stats else None


def _abstract(tree):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(
        x.shape, x.dtype, sharding=getattr(x, "sharding", None)), tree)


def compiled_bytes(fn, *args, **static) -> int:
    """One device's memory (XLA's memory_analysis: arguments + outputs - donated + temporaries)
    of the jitted `fn` compiled for `args` (arrays or ShapeDtypeStructs; jit keeps the
    compilation, so a later call with the same shapes and shardings does not compile again)."""
    stats = fn.lower(*args, **static).compile().memory_analysis()
    return int(stats.argument_size_in_bytes + stats.output_size_in_bytes
               - stats.alias_size_in_bytes + stats.temp_size_in_bytes)


def seed_shapes(tree, width: int):
    """ShapeDtypeStructs of `tree` with its leading (seed) axis `width` wide and sharded over the
    devices, as distributed.shard_seeds places it."""
    sharding = distributed.seed_sharding()
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct((width, *np.shape(x)[1:]), x.dtype,
                                                       sharding=sharding), tree)


def plan_seed_chunk(bytes_for: Callable[[int], int], num_seeds: int, *, what: str, lower: str,
                    force: str, headroom: float = 0.9) -> tuple[int, str | None]:
    """(seeds per chunk, a line to print) for a call whose memory per device, for `width` seeds
    over all devices, is `bytes_for(width)` (compiled_bytes of it). (0, None): all seeds at once,
    because they fit or because the device does not report its capacity (CPU). Raises
    ValueError (one line naming the config key `lower` to lower) when one seed per device does
    not fit. `force`: the config key that sets the chunk size instead."""
    cap = capacity()
    if cap is None:
        return 0, None
    devices, width = jax.device_count(), distributed.padded_size(num_seeds)
    total = bytes_for(width)
    if total <= headroom * cap:
        return 0, None
    # First guess: linear in the seeds per device, all of it counted per seed (the replicated
    # tokens are small). A seed-independent part makes that guess low for fewer seeds, so the
    # width is compiled (the call that then runs: jit keeps it) and lowered until it fits.
    est = Estimate(total, 0, width // devices, devices, 1, cap)
    chunk = max(devices, min(est.max_chunk_size(headroom) or 0, width - devices))
    while True:
        need = bytes_for(chunk)
        if need <= headroom * cap:
            return chunk, (f"{what}: {num_seeds} seeds at once need {_size(total)} per device "
                           f"(XLA estimate), over {headroom:.0%} of its {_size(cap)}; running "
                           f"{chunk} seeds per chunk ({_size(need)}), {-(-num_seeds // chunk)} "
                           f"chunks ({force} forces a size)")
        if chunk == devices:
            raise ValueError(f"{what} does not fit in device memory even at one seed per "
                             f"device: XLA estimates {_size(need)} per device, capacity "
                             f"{_size(cap)}; lower {lower}")
        chunk = max(devices, min(chunk - devices, int(chunk * headroom * cap / need))
                    // devices * devices)


def _size(num_bytes: float) -> str:
    return (f"{num_bytes / GiB:.1f} GiB" if num_bytes >= GiB / 10
            else f"{num_bytes / 2**20:.1f} MiB")


def estimate(step_fn, state, tokens, hparams, *, num_chunks: int = 1, **static) -> Estimate:
    """Compiles `step_fn` (a jitted function such as train.train_steps) for the given placed
    arguments (only their shapes and shardings are used) and reads its memory analysis."""
    step = compiled_bytes(step_fn, _abstract(state), _abstract(tokens), _abstract(hparams),
                          **static)
    width = jax.tree.leaves(state)[0].shape[0]
    devices = jax.device_count()
    return Estimate(step_bytes=step, fixed_bytes=int(np.prod(tokens.shape))
                    * tokens.dtype.itemsize, seeds_per_device=-(-width // devices),
                    num_devices=devices, num_chunks=num_chunks, capacity=capacity())


def describe(est: Estimate) -> str:
    """One or two lines for the launcher's output."""
    mib = 2**20
    line = (f"device memory (XLA estimate of the training step): {est.step_bytes / mib:.1f} MiB "
            f"per device = {est.fixed_bytes / mib:.1f} MiB tokens + {est.seeds_per_device} "
            f"seeds x {est.per_seed_bytes / mib:.2f} MiB")
    if est.num_chunks > 1:
        line += f", in {est.num_chunks} sequential chunks"
    if est.capacity is None:
        return line + f"; capacity unknown ({jax.default_backend()})"
    line += f"; capacity {est.capacity / GiB:.1f} GiB per device"
    if not est.fits:
        best = est.max_chunk_size()
        line += ("\nWARNING: the step does not fit in device memory; " +
                 (f"set --config.train.seed_chunk_size={best} (seeds trained at once, over all "
                  "devices)" if best else "even one seed per device does not fit"))
    return line
