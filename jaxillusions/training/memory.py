"""Device memory of the training step, per seed and for the sweep, before training starts.

    est = estimate(step.train_steps, state, tokens, hparams, num_steps=..., ...)
    print(describe(est))

The estimate is XLA's own account of the compiled step (`memory_analysis()`: arguments, outputs
and temporaries, minus donated buffers) for one device's share of a chunk of seeds. Compiling
with the shapes and shardings of the real first call fills jit's cache, so the estimate costs no
extra compilation. Everything but the training tokens (which every device holds once) grows
with the seeds on the device, so per seed = (step - tokens) / seeds per device.

The capacity is what the device reports (GPUs and TPUs: `memory_stats()["bytes_limit"]`), or
on a CPU the host's RAM. When the step does not fit, `describe` says how many seeds per chunk
would (`train.seed_chunk_size`).

The proxy stage plans its own chunks (`plan_seed_chunk`): the compiled call for all seeds is
measured the same way and, if it does not fit in 90% of the capacity, the largest number of
seeds per chunk that does is chosen (checked by compiling that width, the call that then runs).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable

import jax
import numpy as np

from jaxillusions.runtime import chunks, distributed

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
    """Bytes the first local device can allocate: its `bytes_limit` (GPUs, TPUs), or on a CPU,
    whose device memory is host RAM, this process's share of the RAM (host_ram() over the
    local CPU devices); None when a device says nothing."""
    try:
        device = jax.local_devices()[0]
        stats = device.memory_stats()
    except Exception:  # noqa: BLE001 - backends without memory statistics
        return None
    if stats and "bytes_limit" in stats:
        return int(stats["bytes_limit"])
    if device.platform == "cpu":
        return host_ram() // len(jax.local_devices())
    return None


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
    if num_bytes >= 2**50:
        return f"{num_bytes / 2**50:.3g} PiB"
    return (f"{num_bytes / GiB:.1f} GiB" if num_bytes >= GiB / 10
            else f"{num_bytes / 2**20:.1f} MiB")


def estimate(step_fn, state, tokens, hparams, *, num_chunks: int = 1, **static) -> Estimate:
    """Compiles `step_fn` (a jitted function such as step.train_steps) for the given placed
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


# ---------------------------------------------------------------------------------------------
# The memory plan of a config, before any allocation (validate.check calls check_config).
#
# The compiled estimate above needs the arrays' shapes placed on the devices, i.e. the data
# loaded and the step compiled; a size that cannot fit must fail before that (a
# model.max_len=100000000 used to hang in the allocation of the initial state). So this plan
# counts, from the config alone, the buffers every run must hold: the parameters with their
# AdamW moments and gradients, the attention scores and activations of one batch, the data.
# It is a lower bound (XLA adds temporaries), so a config it rejects cannot run. Training and its
# evaluation run chunk by chunk (train.seed_chunk_size; evaluation.py), so their activations
# are counted for one chunk of seeds, while every member's parameters and moments stay on the
# devices. The machine is a parameter (`Machine`): the plan of a GPU config can be checked on a
# machine without one.


@dataclasses.dataclass(frozen=True)
class Machine:
    """What a memory plan is checked against (`Machine.local()`: this process's)."""

    platform: str  # "cpu" (device memory is host RAM: one pool), "gpu", "tpu"
    num_devices: int  # devices the seeds are sharded over
    device_bytes: int  # what one device can allocate (GPUs: JAX's bytes_limit, by default 75%)
    host_bytes: int  # host RAM
    kind: str = ""  # e.g. "NVIDIA H100 80GB HBM3", for the message

    @classmethod
    def local(cls) -> Machine:
        devices, ram = jax.devices(), host_ram()
        return cls(devices[0].platform, len(devices), capacity() or ram, ram,
                   devices[0].device_kind)


@dataclasses.dataclass(frozen=True)
class Term:
    what: str  # e.g. "parameters, gradients and AdamW moments"
    num_bytes: int
    # (config key, its value) that the term grows with; for an evaluation batch, the rows one
    # call holds (row-chunked: runtime/chunks.py), which a batch size lowers only when set below
    factors: tuple[tuple[str, int], ...]
    on_device: bool  # device memory (on a CPU: host RAM too); else host RAM only


def host_ram() -> int:
    """Bytes of RAM this process may use: the machine's, or its cgroup's limit if lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total


def _forward_bytes(batch: int, width: int, model_cfg, item: int, saved: bool = False,
                   logits: int = 0) -> int:
    """The activations of one layer for `batch` rows that must be live together: the residual
    stream with the attention scores or with the MLP's hidden units (inference), or with both
    (`saved`: a training layer's, kept for the backward pass); inference with `logits` copies
    of the logits: those, where they are larger (a large vocabulary)."""
    scores, hidden = model_cfg.n_heads * width, 0 if model_cfg.attn_only else model_cfg.d_mlp
    per_token = scores + hidden if saved else max(scores, hidden, logits * model_cfg.vocab_size)
    return batch * width * (per_token + model_cfg.d_model) * item


def _evaluation(what: str, rows: int, width: int, model_cfg, platform: str | None
                ) -> tuple[str, int]:
    """(the term's name, its rows) of an evaluation batch of `rows` rows x `width` tokens: its
    logits (original and one proxy: a lower bound), row-chunked as chunks.logit_rows runs them
    on `platform`, where they outweigh one layer's attention scores."""
    rows = chunks.logit_rows(rows, width, model_cfg.vocab_size, 2, platform)
    hidden = 0 if model_cfg.attn_only else model_cfg.d_mlp  # as _forward_bytes counts them
    logits = 2 * model_cfg.vocab_size > max(model_cfg.n_heads * width, hidden)
    return (f"the logits of {what}" if logits else f"one layer's attention scores of {what}",
            rows)


def plan(config, model_cfg, num_devices: int | None = None, platform: str | None = None
         ) -> list[Term]:
    """The memory terms of `config` (see above), with the config keys each one grows with, for
    `num_devices` devices of `platform` ("cpu", "gpu", ...; default: this process's). An
    imported run (model.pretrained) holds its members' parameters and trains nothing; an
    evaluation batch counts the logits (row-chunked as on `platform`: runtime/chunks.py) where a
    large vocabulary makes them its largest buffer."""
    from jaxillusions import model as model_lib  # noqa: PLC0415
    from jaxillusions import tasks  # noqa: PLC0415

    task, tc, mc = tasks.get(config), config.train, model_cfg
    num_devices = num_devices or jax.device_count()
    # imported checkpoints (model.pretrained): the members, loaded and evaluated, not trained;
    # else the seeds times every combination of the per-member hyper-parameters' values and the
    # null kinds (train.num_members, which imports this module; a test keeps the two equal)
    imported = len(config.model.pretrained) * (1 + len(tc.null))  # (null: untrained copies)
    members = imported or tc.num_seeds * (1 + len(tc.null)) * math.prod(
        max(len(values), 1) for values in (tc.contrastive_weights, tc.learning_rates,
                                           tc.weight_decays, tc.init_scales))
    chunk = min(tc.seed_chunk_size or members, members)  # 0: all at once
    # the seeds trained and evaluated together, named by the key that sets their number
    seeds = ("train.seed_chunk_size" if chunk < members else
             "model.pretrained" if imported else "train.num_seeds", chunk)
    item = 2 if mc.compute_dtype == "bfloat16" else 4
    def shapes_of(layers: int) -> list:  # built for at most 3 layers: n_layers may be huge
        return jax.tree.leaves(
            model_lib.param_shapes(dataclasses.replace(mc, n_layers=layers)),
            is_leaf=lambda x: isinstance(x, tuple))

    def count(layers: int) -> int:
        return sum(math.prod(shape) for shape, _ in shapes_of(layers))

    few = min(mc.n_layers, 3)  # blocks after the first two are alike (the first may differ)
    params = count(few) + (mc.n_layers - few) * (count(3) - count(2) if few == 3 else 0)
    biggest = max(shapes_of(few), key=lambda s: math.prod(s[0]))[0]
    # The dimensions of the largest parameter, named by the keys that set them.
    width_key = max(task.WIDTH_KEYS, key=lambda k: _get(config, k))
    if config.model.max_len >= mc.max_len:
        width_key = "model.max_len"
    names = {mc.max_len: width_key, mc.vocab_size: task.VOCAB_KEY, mc.d_mlp: "model.d_mlp",
             mc.head_dim: "model.d_head" if config.model.d_head else "model.d_model",
             mc.n_heads: "model.n_heads", mc.d_model: "model.d_model"}
    dims = tuple((names.get(n, "model.d_model"), n) for n in biggest)
    train_width = task.train_width(config.data)
    widest = task.widest_width(config.data)
    rows_key = "data.num_train" if hasattr(config.data, "num_train") else "data.max_rows"
    rows = max(_get(config, rows_key), 0)  # code: -1 (all functions) is not counted
    what, eval_rows = _evaluation("an evaluation batch", tc.eval_batch_size, widest, mc,
                                  platform)
    evaluation = Term(what, chunk * _forward_bytes(eval_rows, widest, mc, item, logits=2),
                      (seeds, ("train.eval_batch_size", eval_rows),  # the rows of a call
                       (width_key, widest)), True)
    if imported:  # their float32 parameters, on the devices and on the host; no training
        loaded = (("model.pretrained", members),)
        terms = [Term("the parameters of every imported member", members * params * 4, loaded,
                      True), evaluation,
                 Term("the parameters of every imported member on the host",
                      members * params * 4, loaded, False)]
    else:
        terms = [
            # params and AdamW's two moments of every member stay on the devices (float32),
            # the gradients exist for the chunk being trained
            Term("parameters, gradients and AdamW moments", (members * 12 + chunk * 4) * params,
                 (("train.num_seeds", members), ("model.n_layers", mc.n_layers), *dims), True),
            Term("the attention scores and activations of a training batch",
                 chunk * mc.n_layers * _forward_bytes(tc.batch_size, train_width - 1, mc, item,
                                                      saved=True),
                 (seeds, ("train.batch_size", tc.batch_size), (width_key, train_width),
                  ("model.n_layers", mc.n_layers)), True),
            evaluation,
            # the state of every member is also kept on the host (checkpoints, results)
            Term("parameters and AdamW moments of every member on the host",
                 members * params * 12, (("train.num_seeds", members), *dims), False)]
    terms.append(Term("the training data", rows * train_width * 13,
                      ((rows_key, rows), (width_key, train_width)), False))
    pc = config.proxies
    # 0: the proxy stage plans its own chunks (plan_seed_chunk), down to 1 seed per device
    pchunk = min(pc.seed_chunk_size or num_devices, members)
    sites = sum(len(t.split("+")) for t in pc.targets)
    pseeds = ("model.pretrained" if imported else "train.num_seeds", pchunk)
    proxy_eval, proxy_rows = _evaluation("a proxy evaluation batch", pc.eval_batch_size, widest,
                                         mc, platform)
    terms += [
        Term("the activations sampled for the proxies",
             pchunk * sites * pc.kmeans_samples * mc.d_model * 4,
             (pseeds, ("proxies.kmeans_samples", pc.kmeans_samples),
              ("model.d_model", mc.d_model)), True),
        Term("one layer's attention scores of a proxy collection batch",
             pchunk * _forward_bytes(pc.collect_batch_size, train_width, mc, item),
             (pseeds, ("proxies.collect_batch_size", pc.collect_batch_size),
              (width_key, train_width)), True),
        Term(proxy_eval, pchunk * _forward_bytes(proxy_rows, widest, mc, item, logits=2),
             (pseeds, ("proxies.eval_batch_size", proxy_rows),  # the rows of a call
              (width_key, widest)), True),
    ]
    wc = config.wen
    if wc.enabled and wc.length_max_len > 0:
        terms.append(Term(
            "one layer's attention scores of a Wen length-generalization batch",
            min(wc.members_per_call, members) * _forward_bytes(
                wc.length_batch_size, wc.length_max_len + 1, mc, item),
            (("wen.members_per_call", min(wc.members_per_call, members)),
             ("wen.length_batch_size", wc.length_batch_size),
             ("wen.length_max_len", wc.length_max_len)), True))
    ic = config.induction
    if ic.enabled:  # studies/induction.py: the whole batch in one call per chunk of seeds
        # its default length (induction.default_length) is half the drawable tokens, at most
        # vocab_size - 1 of them (every task has a BOS), capped to fit the model after the BOS;
        # a longer sequence than the model takes is induction.check_config's error
        length = ic.length or max(2, min((mc.vocab_size - 1) // 2, (mc.max_len - 1) // 2))
        width = min(1 + 2 * length, mc.max_len)
        layers = mc.n_layers - model_lib.first_attention_layer(mc)
        # per row: its tokens; per seed, every attention layer's pattern (cached as float32),
        # the float32 log-probabilities and one layer's activations
        per_row = width * 4 + chunk * (
            width * (layers * mc.n_heads * width + mc.vocab_size) * 4
            + _forward_bytes(1, width, mc, item))
        terms.append(Term("the attention patterns and logits of the induction probe's batch",
                          ic.batch * per_row, (seeds, ("induction.batch", ic.batch)), True))
    return terms


def _get(config, key: str):
    node = config
    for part in key.split("."):
        node = getattr(node, part)
    return node


def check_config(config, model_cfg, machine: Machine | None = None) -> None:
    """ValueError (one line) when the plan's buffers exceed what the machine has (default:
    this one): the device's memory (plus the host's RAM for host buffers), or on a CPU, where
    device memory is host RAM, the host's RAM for both. It names the key that the largest term
    grows with most."""
    m = machine or Machine.local()
    terms, ram = plan(config, model_cfg, m.num_devices, m.platform), m.host_bytes
    if m.platform == "cpu":  # one pool: device memory is host RAM
        groups = [(terms, 1, ram, f"this machine's {_size(ram)} of RAM (CPU: device memory is "
                   "host RAM)")]
    else:  # the device terms are shared by the devices (seeds sharded over them)
        groups = [([t for t in terms if t.on_device], m.num_devices, m.device_bytes,
                    f"the {_size(m.device_bytes)} of memory of each device ({m.kind})"),
                  ([t for t in terms if not t.on_device], 1, ram,
                   f"this machine's {_size(ram)} of host RAM")]
    for group, share, limit, what in groups:
        need = sum(t.num_bytes for t in group) // share
        if need <= limit:
            continue
        top = max(group, key=lambda t: t.num_bytes)
        key, value = max(top.factors, key=lambda kv: kv[1])
        raise ValueError(
            f"{key}={_get(config, key)}: needs an estimated "
            f"{_size(need)} at least ({_size(top.num_bytes)} for {top.what}), more than "
            f"{what}; lower {key}")
