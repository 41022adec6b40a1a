"""Training throughput, model FLOP utilization and memory (`jaxillusions benchmark`).

Every timing is the best of `repeats` calls, the contenders interleaved so that they share the
machine's background load, in an order turned by one each repeat so that none always runs first
or after the same one; compilation is excluded (each jitted function runs once first).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
import resource
import sys
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import reference
from jaxillusions.runtime import cache, distributed
from jaxillusions.training import objective as objective_lib
from jaxillusions.training import step as step_lib
from jaxillusions.training.step import init_state, place_on_devices, train_steps


def times(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, list[float]]:
    """Seconds per call of each fn, repeats interleaved (same background load for all), the
    order turned by one each repeat: repeat r starts with the r-th fn (mod their number)."""
    out = {name: [] for name in fns}
    order = collections.deque(fns)
    for _ in range(repeats):
        for name in order:
            start = time.perf_counter()
            jax.block_until_ready(fns[name]())
            out[name].append(time.perf_counter() - start)
        order.rotate(-1)  # the next repeat starts with the next fn
    return out


def best_times(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Best seconds per call of each fn (see `times`)."""
    return {name: min(t) for name, t in times(fns, repeats).items()}


def peak_matmuls(n: int | None = None) -> tuple[int, dict[str, Callable[[], object]]]:
    """(n, {"f32": call, "bf16": call}): a large [n, n] @ [n, n] product to time, compiled at
    its first call (n: 2048 on CPU, 8192 on accelerators), in float32 at JAX's default
    precision (what the model's float32 matmuls use: TF32 on GPUs that have it) and in bfloat16
    (the bf16 sweep's matmuls). Each takes 2 n^3 FLOPs."""
    n = n or (2048 if jax.default_backend() == "cpu" else 8192)
    a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32)
    b = a.astype(jnp.bfloat16)
    return n, {"f32": lambda: _squared(a), "bf16": lambda: _squared(b)}


@jax.jit
def _squared(x: jax.Array) -> jax.Array:  # one program per shape and dtype, for every row
    return x @ x


def peak_flops(n: int | None = None, repeats: int = 5) -> dict:
    """The device's matmul throughput, {"n", "flops_per_s", "bf16_flops_per_s"}: the products of
    `peak_matmuls`, best of `repeats`. The denominators of the model FLOP utilization;
    `training_row` times the products again in turn with its contenders."""
    n, calls = peak_matmuls(n)
    jax.block_until_ready([call() for call in calls.values()])  # compile
    seconds = best_times(calls, repeats)
    return {"n": n, "flops_per_s": 2 * n**3 / seconds["f32"],
            "bf16_flops_per_s": 2 * n**3 / seconds["bf16"]}


def xla_step_flops(state, tokens, run: dict) -> float | None:
    """FLOPs of one training step of all seeds in `state`, from XLA's cost analysis of a
    one-step train_steps (None where the backend gives none). XLA's cost analysis counts one
    device's program, which over several devices trains its block of the seeds
    (`step.seed_shards`), and on a CPU the seeds may train in cache-sized groups, one after the
    other (`step.train_groups`), a loop whose body it counts once: its count is multiplied by
    both."""
    compiled = train_steps.lower(state, tokens, num_steps=1, **run).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list | tuple) else cost
    if not cost or "flops" not in cost:
        return None
    num = state.healthy.shape[0]
    return float(cost["flops"]) * step_lib.seed_shards(num) * step_lib.train_groups(
        num, run["model_cfg"], run["batch_size"], tokens.shape[1],
        run.get("objective", step_lib.DEFAULT_OBJECTIVE))


def peak_memory_bytes() -> dict:
    """Peak device memory (device.memory_stats) where the backend reports it, else this
    process's max resident set size (what a CPU run uses)."""
    stats = jax.devices()[0].memory_stats() or {}
    if "peak_bytes_in_use" in stats:
        return {"kind": "device peak_bytes_in_use", "bytes": int(stats["peak_bytes_in_use"])}
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return {"kind": "process max RSS", "bytes": int(rss * (1 if sys.platform == "darwin"
                                                          else 1024))}


# The PyTorch contenders (benchmarks/torch_loop.py), each timed where torch is installed: the
# per-seed loop, the torch.func ensemble of all seeds, eager and through torch.compile.
TORCH = ("torch_loop", "torch_ensemble", "torch_ensemble_compiled")


def peers_objective(config) -> objective_lib.Objective:
    """The objective every contender of `training_row` trains with: the config's, one sentence
    per row, as the PyTorch peers train. Packed batches (a config's train.rows_per_sentence)
    would be less work, not a faster step (docs/speed.md)."""
    return dataclasses.replace(objective_lib.from_settings(config), packed_rows=0)


def training_row(config, splits, model_cfg, tx, num_seeds: int, *, steps: int, repeats: int,
                 peak: dict, loop: bool = True, torch_loop: bool = True,
                 torch_ensemble: bool = False, torch_compile: bool | str = False,
                 bfloat16: bool = False, xla_flops: bool = True) -> dict:
    """Seed-steps/s of the sweep (train_steps over all seeds, sharded over all devices
    as `jaxillusions train` shards them), of a JAX loop over seeds
    (the same jitted train_steps, one seed per call), of a PyTorch loop over seeds of the same
    model (when torch is installed), of all seeds as one torch.func ensemble (`torch_ensemble`;
    torch_loop.Ensemble) eager and, with `torch_compile`, its step through torch.compile, and of
    the sweep with model.compute_dtype="bfloat16" (if `bfloat16`), measured side by side; the
    sweep's speed-up over each (`sweep_over_<name>`: the other's seconds over the sweep's); and
    the sweep's MFU, of the higher of `peak` (peak_flops) and the peak matmul timed in turn
    with the contenders (`peak_flops_per_s`; `peak_bf16_flops_per_s` beside the bf16 sweep's).
    A PyTorch contender that cannot run (torch.compile failing on this machine, out of GPU
    memory) is no rate but `<name>_unavailable`, the one-line reason; `torch_compile` may be
    such a reason already (a failure at a smaller seed count: not tried again).
    `torch_ensemble_compiled_first_call_s`: the compiled ensemble's first call, torch.compile
    included.
    `xla_flops`: also compile a one-step sweep for XLA's FLOP count (one more compilation: slow
    on GPUs)."""
    local_tokens = jnp.asarray(splits["train"].tokens)
    objective = peers_objective(config)
    run = dict(model_cfg=model_cfg, tx=tx, batch_size=config.train.batch_size,
               objective=objective)
    host_state = init_state(np.arange(num_seeds), model_cfg, tx)
    # The sweep runs as `jaxillusions train` runs it: seeds sharded over every device (padded to a
    # multiple of the device count), tokens on each; the loops run one seed on one device.
    ((state, _),), tokens = place_on_devices(host_state, {}, splits["train"].tokens,
                                                   distributed.seed_chunks(num_seeds))
    fns = {"sweep": lambda: train_steps(
        jax.tree.map(jnp.copy, state), tokens, num_steps=steps, **run)[1]}  # donated: copy
    if bfloat16:
        bf16_run = {**run, "model_cfg": dataclasses.replace(model_cfg, compute_dtype="bfloat16")}
        fns["sweep_bf16"] = lambda: train_steps(
            jax.tree.map(jnp.copy, state), tokens, num_steps=steps, **bf16_run)[1]
    if loop:
        singles = [jax.tree.map(lambda x, i=i: x[i:i + 1], host_state)
                   for i in range(num_seeds)]
        fns["jax_loop"] = lambda: [train_steps(jax.tree.map(jnp.copy, s), local_tokens,
                                                     num_steps=steps, **run)[1]
                                   for s in singles]
    if torch_loop:
        from benchmarks import torch_loop as torch_lib  # noqa: PLC0415 - optional

        fns["torch_loop"] = functools.partial(
            torch_lib.train_seeds, num_seeds, splits["train"].tokens, model_cfg, config.train,
            steps, objective)
    unavailable = {}
    if torch_ensemble:
        from benchmarks import torch_loop as torch_lib  # noqa: PLC0415 - optional

        variants = {"torch_ensemble": False}
        if isinstance(torch_compile, str):
            unavailable["torch_ensemble_compiled"] = torch_compile
        elif torch_compile:
            variants["torch_ensemble_compiled"] = True
        for name, compiled in variants.items():
            fns[name] = functools.partial(
                torch_lib.Ensemble(model_cfg, config.train, objective, compiled=compiled).train,
                num_seeds, splits["train"].tokens, steps)
    # The peak matmul timed again in turn with the contenders, so that it shares their
    # background load: a lone measurement taken at a disturbed moment (108 against 194-212
    # GFLOP/s on a 2-core AMD EPYC) had put the MFU at 93%. Compiled at their first call below.
    _, matmuls = peak_matmuls(peak["n"])
    fns["peak_f32"] = matmuls["f32"]
    if bfloat16:
        fns["peak_bf16"] = matmuls["bf16"]
    first_call = {}
    for name, fn in list(fns.items()):
        try:
            start = time.perf_counter()
            jax.block_until_ready(fn())  # compile (and warm up torch)
            first_call[name] = time.perf_counter() - start
        except Exception as err:
            reason = _torch_unavailable(name, err)
            if reason is None:
                raise
            unavailable[name] = reason
            del fns[name]
    seconds = best_times(fns, repeats)
    matmul_flops = 2 * peak["n"] ** 3
    peak = {"flops_per_s": max(peak["flops_per_s"], matmul_flops / seconds.pop("peak_f32")),
            "bf16_flops_per_s": max(peak["bf16_flops_per_s"],
                                    matmul_flops / seconds.pop("peak_bf16", math.inf))}
    flops = reference.train_flops(model_cfg, config.train.batch_size,
                                  splits["train"].tokens.shape[1] - 1)
    xla = xla_step_flops(host_state, local_tokens, run) if xla_flops else None
    row = {"num_seeds": num_seeds, "devices": len(state.healthy.sharding.device_set),
           "peak_flops_per_s": peak["flops_per_s"],
           "padded_seeds": distributed.padded_size(num_seeds), "steps_per_call": steps,
           "model_flops_per_seed_step": flops,
           "xla_flops_per_seed_step": None if xla is None else xla / num_seeds}
    for name, s in seconds.items():
        row[f"{name}_seed_steps_per_s"] = num_seeds * steps / s
    # The sweep's peak is one device's times the device count, except on a CPU, whose host
    # devices (--xla_force_host_platform_device_count) share the cores the peak matmul used;
    # one device's is the highest of `peak` and the product timed with this row.
    devices = 1 if jax.default_backend() == "cpu" else jax.device_count()
    row["sweep_mfu"] = row["sweep_seed_steps_per_s"] * flops / (devices * peak["flops_per_s"])
    for name in ("jax_loop", *TORCH):  # speed-ups of the sweep
        if name in seconds:
            row[f"sweep_over_{name}"] = seconds[name] / seconds["sweep"]
    for name, reason in unavailable.items():
        row[f"{name}_unavailable"] = reason
    if "torch_ensemble_compiled" in first_call:  # torch.compile's time (XLA's: `compiles`)
        row["torch_ensemble_compiled_first_call_s"] = first_call["torch_ensemble_compiled"]
    if "sweep_bf16" in seconds:  # speed-up of bf16 over f32
        row["bf16_over_f32"] = seconds["sweep"] / seconds["sweep_bf16"]
        row["peak_bf16_flops_per_s"] = peak["bf16_flops_per_s"]
        row["sweep_bf16_mfu"] = (row["sweep_bf16_seed_steps_per_s"] * flops
                                 / (devices * peak["bf16_flops_per_s"]))
    return row


def _torch_unavailable(name: str, err: Exception) -> str | None:
    """The one-line reason a PyTorch contender's warm-up call failed, where that is a result of
    the benchmark rather than a bug: any failure of the torch.compile'd ensemble (the compiler
    and its toolchain are the machine's), out of GPU memory for every contender. None: raise."""
    if name not in TORCH:
        return None
    import torch  # noqa: PLC0415 - optional

    if isinstance(err, torch.OutOfMemoryError):
        return "out of device memory"
    return cache.error_line(err) if name == "torch_ensemble_compiled" else None
