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
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

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


def estimate(step_fn, state, tokens, hparams, *, num_chunks: int = 1, **static) -> Estimate:
    """Compiles `step_fn` (a jitted function such as train.train_steps) for the given placed
    arguments (only their shapes and shardings are used) and reads its memory analysis."""
    compiled = step_fn.lower(_abstract(state), _abstract(tokens), _abstract(hparams),
                             **static).compile()
    stats = compiled.memory_analysis()
    step = (stats.argument_size_in_bytes + stats.output_size_in_bytes
            - stats.alias_size_in_bytes + stats.temp_size_in_bytes)
    width = jax.tree.leaves(state)[0].shape[0]
    devices = jax.device_count()
    return Estimate(step_bytes=int(step), fixed_bytes=int(np.prod(tokens.shape))
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
