"""Devices and processes: one mesh with a `seed` axis over every device of every process.

    initialize(...)            # joins a multi-host run (jax.distributed); no-op for one process
    use_devices(2, True)       # the CPU as two devices (config.cpu_devices) and deterministic
                               # GPU kernels (config.gpu_deterministic), before any JAX work
    tree = shard_seeds(tree)   # leading seed axis padded to a multiple of the device count, sharded
    host = to_host(tree, num)  # numpy, gathered from all processes, the first `num` seeds

The same code runs on 1 CPU, 8 GPUs or several hosts: computations take their inputs sharded
over the mesh (jit follows the input shardings), so each device computes its own seeds. A seed
count that does not divide the device count is padded with copies of the last seed; callers
drop them again (`to_host(..., num)`) before anything is reported or saved.

With several processes every process runs the same program on the same data and computes its
devices' share; `to_host` gathers the results into every process, and files are written by
process 0 alone (`is_main`).
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import math
import os
import pkgutil
import socket
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from jaxillusions.runtime import cache

AXIS = "seed"


# ---------------------------------------------------------------------------------------------
# Processes.


class JoinError(ConnectionError):
    """A process of a multi-host run did not join in time (the message names it)."""


def settings(coordinator_address: str | None = None, num_processes: int | None = None,
             process_id: int | None = None) -> tuple[str | None, int, int]:
    """(address, count, id) from the arguments, else from the environment variables
    JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID; (None, 1, 0) when unset."""
    env = os.environ
    address = coordinator_address or env.get("JAX_COORDINATOR_ADDRESS") or None
    count = num_processes if num_processes is not None else int(env.get("JAX_NUM_PROCESSES", 1))
    index = process_id if process_id is not None else int(env.get("JAX_PROCESS_ID", 0))
    if count > 1 and process_id is None and "JAX_PROCESS_ID" not in env:
        raise ValueError(f"{count} processes: give each its id, --process_id=0 .. {count - 1} "
                         "(or JAX_PROCESS_ID); without it every process would be process 0")
    if count < 1 or not 0 <= index < count:
        raise ValueError(f"process id {index} with {count} processes: need 0 <= id < count")
    if count > 1 and (not address or ":" not in address):
        raise ValueError(f"{count} processes need a coordinator address HOST:PORT (process 0's "
                         f"host; --coordinator_address or JAX_COORDINATOR_ADDRESS), got "
                         f"{address!r}")
    return address, count, index


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, timeout_s: float = 300.0) -> None:
    """Joins the `num_processes` processes of a run through process 0 at `coordinator_address`
    (HOST:PORT), then starts jax.distributed. Nothing happens for one process.

    Before jax.distributed starts, process 0 takes a roll call on the same port, so that a
    process that does not join within `timeout_s` is named in a one-line JoinError on every
    process that is there (jax.distributed itself would abort without naming it).
    """
    address, count, index = settings(coordinator_address, num_processes, process_id)
    if count == 1:
        return
    _roll_call(address, count, index, timeout_s)
    jax.distributed.initialize(address, count, index,
                               initialization_timeout=max(int(timeout_s), 1))


def _roll_call(address: str, count: int, index: int, timeout_s: float) -> None:
    host, _, port = address.rpartition(":")
    deadline = time.monotonic() + timeout_s
    if index == 0:
        _roll_call_coordinator(int(port), count, deadline, address, timeout_s)
        return
    conn = None
    while conn is None:
        try:
            conn = socket.create_connection((host, int(port)), timeout=1.0)
        except OSError:
            if time.monotonic() > deadline:
                raise JoinError(f"process {index} of {count} could not reach the coordinator "
                                f"(process 0) at {address} within {timeout_s:g} s") from None
            time.sleep(0.2)
    with conn:
        conn.settimeout(max(deadline - time.monotonic(), 0.1) + 5.0)
        conn.sendall(f"{index}\n".encode())
        try:
            answer = conn.makefile().readline().strip()
        except OSError:
            answer = ""
    if answer != "ok":
        raise JoinError(answer or f"process {index}: the coordinator at {address} did not "
                        f"answer within {timeout_s:g} s")


def _roll_call_coordinator(port: int, count: int, deadline: float, address: str,
                           timeout_s: float) -> None:
    joined: dict[int, socket.socket] = {}
    with socket.create_server(("", port)) as server:
        server.settimeout(0.2)
        while len(joined) < count - 1 and time.monotonic() < deadline:
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            conn.settimeout(5.0)
            try:
                joined[int(conn.makefile().readline())] = conn
            except (OSError, ValueError):
                conn.close()
        missing = sorted(set(range(1, count)) - set(joined))
        message = "ok"
        if missing:
            names = ", ".join(map(str, missing))
            message = (f"process{'es' if len(missing) > 1 else ''} {names} of {count} did not "
                       f"join the coordinator at {address} within {timeout_s:g} s")
        for conn in joined.values():
            with conn:
                try:
                    conn.sendall(f"{message}\n".encode())
                    conn.recv(1)  # the peer closes first, so the port is free for jax at once
                except OSError:
                    pass
    if missing:
        raise JoinError(message)


# Errors of a collective or of the coordination service when a peer process is gone.
_LOST_PEER = ("Gloo", "Connection reset by peer", "Connection refused", "UNAVAILABLE",
              "heartbeat", "Socket closed", "coordination service")


def lost_peer_line(err: BaseException) -> str | None:
    """In a multi-process run, one line for an error that means a peer process was lost (killed,
    crashed, or its host gone): which one, and that relaunching every process resumes. None for
    any other error, or with one process."""
    # The text first: an error of JAX's start (no backend) would raise again in process_count.
    if not any(s in str(err) for s in _LOST_PEER) or jax.process_count() < 2:
        return None
    count, me = jax.process_count(), jax.process_index()
    who = f"process {1 - me}" if count == 2 else "another process"
    first = (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
    return (f"error: lost {who} of {count} (this is process {me}; it stopped or cannot be "
            f"reached: {first}); relaunch all {count} processes with the same command to "
            "resume from the last checkpoint")


def use_devices(cpu_devices: int, gpu_deterministic: bool) -> None:
    """The config's devices, before JAX's first operation: the CPU split into `cpu_devices`
    (use_cpu_devices), its kernels compiled at LLVM's level 1 (use_cpu_compile_level) and, with
    `gpu_deterministic`, GPU kernels that give the same bits on every run
    (use_deterministic_gpu)."""
    use_deterministic_gpu(gpu_deterministic)
    use_cpu_compile_level()
    use_cpu_devices(cpu_devices)


def start_jax() -> None:
    """Starts JAX's backends (the devices are fixed from here on); a one-line ValueError where
    JAX cannot start them, as where JAX_PLATFORMS names a platform this install lacks (JAX
    itself then raises an AssertionError for `cuda`)."""
    try:
        jax.devices()
    except Exception as err:  # noqa: BLE001 - whatever JAX raises, one line naming the cause
        platforms = jax.config.jax_platforms
        fix = (f"JAX_PLATFORMS={platforms} names the platforms JAX may start: unset it, or name "
               "one this install has (cpu)" if platforms else
               "check JAX's installation for this machine")
        raise ValueError(f"JAX could not start: {cache.error_line(err)}; {fix}") from None


# XLA:GPU sums some reductions and scatter-adds (the gradients of embedding lookups and of the
# loss's label lookup) with atomics, in whatever order the threads finish: on an H100 four runs of
# the Dyck demo gave four different results.csv. This flag makes XLA pick deterministic kernels
# (docs/speed.md, "On a GPU", has its cost). CPU kernels are deterministic and ignore it.
_GPU_DETERMINISTIC_FLAG = "--xla_gpu_deterministic_ops"


def use_deterministic_gpu(on: bool) -> None:
    """Adds `--xla_gpu_deterministic_ops=true` to XLA_FLAGS (_add_xla_flag; once JAX has started
    it is read already: then a GPU process without it gets a warning). `on=False` adds
    nothing."""
    if on and not _add_xla_flag(_GPU_DETERMINISTIC_FLAG, "true") \
            and jax.default_backend() == "gpu":
        warnings.warn("gpu_deterministic=True, but JAX started on the GPU before "
                      f"{_GPU_DETERMINISTIC_FLAG} could be set: this process's numbers may "
                      "differ from run to run; set XLA_FLAGS="
                      f"{_GPU_DETERMINISTIC_FLAG}=true before starting Python", stacklevel=1)


# LLVM's optimization level for XLA's kernels (XLA's default: 2). On the 2-core CPU the
# Quickstart job compiled its 22 programs in 15.7 s at level 1 against 19.4 s at 2, trained as
# fast and wrote the same results.csv (docs/speed.md, "Compiling at LLVM's level 1"). XLA:GPU
# supports no level under 2, so it is set only where JAX can run on nothing but the CPU.
_CPU_LEVEL_FLAG = "--xla_backend_optimization_level"
_warned_cpu_level = False


def use_cpu_compile_level() -> None:
    """Adds `--xla_backend_optimization_level=1` to XLA_FLAGS (_add_xla_flag) where JAX can only
    run on the CPU (cpu_only). Once JAX runs on the CPU without it, a warning, once per process:
    its programs compile at level 2, and training some models gives other last bits than the
    launchers' (docs/reliability.md, Reproducibility)."""
    global _warned_cpu_level
    if cpu_only() and not _add_xla_flag(_CPU_LEVEL_FLAG, "1") and not _warned_cpu_level:
        _warned_cpu_level = True
        warnings.warn(f"JAX started before {_CPU_LEVEL_FLAG}=1 could be set: this process "
                      "compiles at XLA's level 2, more slowly, and training may differ in the "
                      "last bits from the launchers'; set XLA_FLAGS="
                      f"{_CPU_LEVEL_FLAG}=1 before starting Python", stacklevel=1)


def _add_xla_flag(flag: str, value: str) -> bool:
    """Adds `flag=value` to XLA_FLAGS, keeping the user's other flags and the user's own setting
    of this one. False where it cannot: JAX's backends have started, and XLA read the variable
    then, once per process."""
    flags = os.environ.get("XLA_FLAGS", "")
    if flag in flags:
        return True
    if _backends_started():
        return False
    os.environ["XLA_FLAGS"] = f"{flags} {flag}={value}".strip()
    return True


def cpu_only() -> bool:
    """Whether JAX can run on nothing but the CPU, known without starting it: no accelerator
    plugin (an entry point or a module of `jax_plugins`, or libtpu) is installed, whatever
    JAX_PLATFORMS names ("cpu,cuda" then runs on the CPU), or JAX_PLATFORMS (or jax_platforms)
    names the CPU alone."""
    platforms = jax.config.jax_platforms
    return not _accelerator_plugin() or bool(platforms) and {
        p.strip() for p in platforms.split(",")} == {"cpu"}


@functools.cache
def _accelerator_plugin() -> bool:
    """Whether an accelerator plugin is installed, looked up once per process, as JAX looks up
    its plugins once (reading every installed package's entry points takes ~10 ms)."""
    if importlib.metadata.entry_points(group="jax_plugins"):
        return True
    if importlib.util.find_spec("libtpu") is not None:
        return True
    spec = importlib.util.find_spec("jax_plugins")
    return spec is not None and any(pkgutil.iter_modules(spec.submodule_search_locations))


def _backends_started() -> bool:
    """Whether JAX has created its backends (XLA_FLAGS is read then, once per process)."""
    from jax._src import xla_bridge  # noqa: PLC0415 (no public way to ask without starting one)

    return xla_bridge.backends_are_initialized()


def use_cpu_devices(count: int) -> None:
    """Splits the CPU into `count` JAX devices (the setting cpu_devices; 0: leaves JAX as it
    starts). It takes effect only before JAX's first operation in the process; later, a process
    already on `count` CPU devices (or on an accelerator) passes, any other is a one-line
    ValueError, so that a run never computes on another layout than its config names.

    More devices than the cores this process may use is allowed (the layout, and with it the
    numbers' last bits, follows the config, not the machine) but warned about: each device then
    gets a share of a core, and the run is that much slower (cpu_devices=1000 on 2 cores trained
    400x slower)."""
    if count == 0:
        return
    cores = cpu_cores()
    if count > cores:  # stacklevel 1: one place, so the several calls of a run warn once
        warnings.warn(f"cpu_devices={count} is more than the {cores} CPU core(s) this process "
                      "may use: on a CPU each device gets a share of a core, and training is "
                      f"slower; --config.cpu_devices={cores} or 0 runs at full speed, with "
                      "numbers that differ in the last bits", stacklevel=1)
    requested = os.environ.get("JAX_NUM_CPU_DEVICES", "").strip()
    if requested and not (requested.isdigit() and int(requested) >= 1):
        raise ValueError(f"JAX_NUM_CPU_DEVICES={requested} is not a device count (1 or more): "
                         f"unset it, or set it to {count} as cpu_devices does")
    if requested and requested != str(count):
        raise ValueError(f"cpu_devices={count}, but JAX_NUM_CPU_DEVICES={requested}: unset the "
                         f"variable, or set --config.cpu_devices={requested} (0 follows it)")
    try:
        jax.config.update("jax_num_cpu_devices", count)
    except RuntimeError:  # JAX has started in this process: its devices are fixed
        if jax.default_backend() == "cpu" and jax.local_device_count() != count:
            raise ValueError(
                f"cpu_devices={count}, but JAX already runs on {jax.local_device_count()} CPU "
                f"device(s) in this process: set jax.config.update('jax_num_cpu_devices', "
                f"{count}) before any JAX operation, or use cpu_devices=0") from None


def cpu_cores() -> int:
    """The CPU cores this process may run on (its affinity mask: a container's or taskset's
    share, not the whole machine's)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def devices_to_suggest(members: int) -> int | None:
    """The CPU devices to suggest where `members` would train on one CPU device of a CPU with
    more cores, the device count left to JAX (no $JAX_NUM_CPU_DEVICES): one per core, at most
    one per member. XLA:CPU splits a matmul over the cores by tiles of its output, which leaves
    a core idle in the small matmuls of these models; a device per core gives each core its own
    members (1.1-1.5x faster training on the 2-core CPUs measured, docs/speed.md). None where
    JAX runs on a GPU or on several devices, where $JAX_NUM_CPU_DEVICES asks for a layout, on a
    CPU of one core, or for one member."""
    if (members < 2 or os.environ.get("JAX_NUM_CPU_DEVICES", "").strip()
            or jax.default_backend() != "cpu" or jax.device_count() != 1):
        return None
    count = min(cpu_cores(), members)
    return count if count > 1 else None


def is_main() -> bool:
    """True in the process that writes files (process 0)."""
    return jax.process_index() == 0


def barrier(name: str) -> None:
    """Waits until every process gets here (no-op for one process)."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


def max_over_processes(value: int) -> int:
    """The largest `value` any process passes (a collective; no-op for one process)."""
    if jax.process_count() == 1:
        return value
    return int(multihost_utils.process_allgather(np.int32(value)).max())


def on_main(job: Callable[[], Any], what: str) -> Any:
    """Runs `job` in process 0 only and returns its result there (None elsewhere); if it raises
    there, every other process raises too (one line naming `what`) instead of waiting for it in
    the next collective."""
    if jax.process_count() == 1:
        return job()
    error, result = None, None
    if is_main():
        try:
            result = job()
        except Exception as err:  # noqa: BLE001 - re-raised below, after telling the others
            error = err
    failed = multihost_utils.broadcast_one_to_all(np.int32(error is not None))
    if error is not None:
        raise error
    if int(failed):
        raise ValueError(f"process 0 failed while {what} (its output says why)")
    return result


# ---------------------------------------------------------------------------------------------
# The mesh and the seed axis.


def mesh() -> jax.sharding.Mesh:
    """All devices of all processes along one axis, `seed`."""
    return jax.sharding.Mesh(np.array(jax.devices()), (AXIS,))


def seed_sharding() -> jax.sharding.NamedSharding:
    return jax.sharding.NamedSharding(mesh(), jax.sharding.PartitionSpec(AXIS))


def replicated_sharding() -> jax.sharding.NamedSharding:
    return jax.sharding.NamedSharding(mesh(), jax.sharding.PartitionSpec())


def padded_size(num: int) -> int:
    """The smallest multiple of the device count that holds `num` seeds."""
    return math.ceil(num / jax.device_count()) * jax.device_count()


def seed_chunks(num: int, chunk_size: int = 0) -> list[np.ndarray]:
    """Member indices of each sequential chunk: `chunk_size` members (0: all), rounded up to a
    multiple of the device count. Every chunk has the same width; the last one is padded with
    copies of member num - 1. Concatenated, the first `num` entries are 0..num-1."""
    width = padded_size(num if chunk_size <= 0 else min(chunk_size, num))
    count = math.ceil(num / width)
    index = np.minimum(np.arange(count * width), num - 1)
    return list(index.reshape(count, width))


def _pad(x, size: int):
    if x.shape[0] == size:
        return x
    xp = np if isinstance(x, np.ndarray) else jax.numpy
    return xp.concatenate([x, xp.repeat(x[-1:], size - x.shape[0], axis=0)])


def shard_seeds(tree, size: int | None = None):
    """The tree with its leading (seed) axis padded to `size` (default: the next multiple of the
    device count) with copies of the last seed, sharded over the mesh. Leaves already placed so
    are returned as they are."""
    size = padded_size(jax.tree.leaves(tree)[0].shape[0]) if size is None else size
    target = seed_sharding()

    def one(x):
        if isinstance(x, jax.Array):
            if x.shape[0] == size and x.sharding == target:
                return x
            if not x.is_fully_addressable:  # a global array of another layout
                return jax.jit(lambda y: _pad(y, size), out_shardings=target)(x)
            if jax.process_count() == 1:
                return jax.device_put(_pad(x, size), target)
        return _place(_pad(np.asarray(x), size), target)

    return jax.tree.map(one, tree)


def replicate(tree):
    """Every leaf whole on every device (e.g. the training tokens)."""
    target = replicated_sharding()
    return jax.tree.map(lambda x: _place(np.asarray(x), target), tree)


def _place(x: np.ndarray, sharding) -> jax.Array:
    return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])


def to_host(tree, num: int | None = None):
    """numpy copies of every leaf (gathered from all processes), trimmed to the first `num`
    entries of the leading axis when given. Every process must call it (a collective)."""
    def one(x):
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            x = multihost_utils.process_allgather(x, tiled=True)
        x = np.asarray(x)
        return x if num is None else x[:num]
    return jax.tree.map(one, tree)


def concat_host(trees: Sequence, num: int | None = None):
    """to_host of several chunks, joined along the leading axis (then trimmed to `num`)."""
    hosts = [to_host(t) for t in trees]
    joined = hosts[0] if len(hosts) == 1 else jax.tree.map(
        lambda *xs: np.concatenate(xs), *hosts)
    return joined if num is None else jax.tree.map(lambda x: x[:num], joined)
