"""Fixed-shape row chunks of arrays (`padded_chunks`): how the shared code batches a task's rows,
or any arrays with a leading row axis, for a compiled program (evaluation, proxies, studies);
how many rows a large vocabulary's logits allow in one (`logit_rows`), how many such chunks
a call runs in turn (`steps`), a call's chunks (`calls`) and how its program runs them
(`in_turn`); and the evaluated positions of each row, where an evaluation computes its logits
(`readout`)."""

from collections.abc import Iterator, Sequence

import numpy as np


def padded_chunks(arrays: Sequence[np.ndarray], batch_size: int) -> Iterator[list[np.ndarray]]:
    """Consecutive row chunks of equally long arrays, the last one zero-padded to batch_size.

    Fixed shapes mean one compilation. Zero rows are PAD tokens and False masks, so they count
    nowhere.
    """
    n = len(arrays[0])
    for start in range(0, n, batch_size):
        pad = max(0, start + batch_size - n)
        yield [np.pad(a[start:start + batch_size], [(0, pad)] + [(0, 0)] * (a.ndim - 1))
               for a in arrays]


# The float32 logits [rows, T, vocab] that an evaluation call holds at once for one member: the
# original model's and each proxy size's (faithfulness.evaluate), or the logits and their
# log-softmax (training/evaluation.py). A call whose `copies` of them would exceed
# `logits_bytes()` runs its batch in chunks of the rows that stay within it. On a CPU that is
# 16 MiB: larger calls ran several times slower, their time going to the kernel (fresh pages for
# buffers of hundreds of MiB in every call) and to memory traffic (docs/speed.md, "A large
# vocabulary on the CPU"); at a vocabulary of 4,096 and rows of 128 tokens, 4 rows at a time in
# training's evaluation. On an accelerator, 2 GiB: at a vocabulary of 50k, about 40 such rows.
# The cap depends on the config and the backend alone, never on the machine's memory, so that
# the numbers do too. On a CPU the Dyck configs keep their batches (all but the GPU-sized
# `dyck`: a vocabulary of 19, rows of at most 42 tokens) and the code configs' proxy evaluation
# runs in chunks; on an accelerator every shipped config keeps its batches.
# training/memory.py counts it.
CPU_LOGITS_BYTES = 16 * 2**20
ACCELERATOR_LOGITS_BYTES = 2 * 2**30


def logits_bytes(platform: str | None = None) -> int:
    """The cap on one member's logits per evaluation call on `platform` (JAX's: "cpu", "gpu",
    ...; default this process's backend): CPU_LOGITS_BYTES on a CPU, else
    ACCELERATOR_LOGITS_BYTES."""
    if platform is None:
        import jax  # noqa: PLC0415 - this module is numpy's otherwise

        platform = jax.default_backend()
    return CPU_LOGITS_BYTES if platform == "cpu" else ACCELERATOR_LOGITS_BYTES


def logit_rows(rows: int, width: int, vocab: int, copies: int, platform: str | None = None
               ) -> int:
    """`rows` if `copies` float32 logits of rows x width x vocab fit in logits_bytes(platform),
    else the most rows that do (at least 1)."""
    per_row, cap = copies * width * vocab * 4, logits_bytes(platform)
    return rows if rows * per_row <= cap else max(1, cap // per_row)


def steps(rows: int, chunk_rows: int, batch_size: int) -> int:
    """How many chunks of `chunk_rows` rows (logit_rows) one call runs one after another, for
    `rows` rows in all in calls of at most `batch_size` rows (at least one chunk): as few
    calls as that allows, their chunks spread evenly over them (the least padding)."""
    most = max(1, batch_size // chunk_rows)
    needed = -(-rows // chunk_rows)
    calls = -(-needed // most)
    return max(1, -(-needed // max(calls, 1)))


def calls(arrays: Sequence[np.ndarray], steps: int, rows: int) -> Iterator[list[np.ndarray]]:
    """The calls of an evaluation over equally long arrays: `steps` chunks of `rows` rows each,
    every array [steps, rows, ...] (padded_chunks of steps x rows rows), for `in_turn`."""
    for call in padded_chunks(arrays, steps * rows):
        yield [a.reshape(steps, rows, *a.shape[1:]) for a in call]


def in_turn(one_chunk, data):
    """In a JAX program, `one_chunk`(chunk) -> (sums, out) over the K chunks of `data` (a pytree
    whose leaves have a leading chunk axis K, `calls`), one after another: (their sums added in
    chunk order, their outs stacked [K, ...]). Where K > 1 a scan, so that the buffers of one
    chunk (a large vocabulary's logits) are allocated once per call, not once per chunk; where
    K == 1 (a batch that fits) the chunk itself, no scan."""
    import jax  # noqa: PLC0415 - this module is numpy's otherwise
    import jax.numpy as jnp  # noqa: PLC0415

    first = jax.tree.map(lambda a: a[0], data)
    if jax.tree.leaves(data)[0].shape[0] == 1:
        sums, out = one_chunk(first)
        return sums, jax.tree.map(lambda x: x[None], out)

    def step(total, chunk):
        sums, out = one_chunk(chunk)
        return jax.tree.map(jnp.add, total, sums), out

    zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype),
                         jax.eval_shape(one_chunk, first)[0])
    return jax.lax.scan(step, zeros, data)


def readout(evaluated: np.ndarray, width: int) -> np.ndarray:
    """evaluated [..., T] bool -> int32 [..., width]: each row's evaluated positions ascending,
    then -1 (model.Span's readout, read by model.at_positions; its scored slots `>= 0`); `width`
    at least the most of any row (`readout_width`), or that row's last ones are dropped."""
    order = np.argsort(~evaluated, axis=-1, kind="stable")[..., :width]
    return np.where(np.take_along_axis(evaluated, order, -1), order, -1).astype(np.int32)


def readout_width(evaluated: np.ndarray) -> int:
    """The most evaluated positions of any row of `evaluated` [B, T] bool, or 0 where that is
    every position (a readout would compute no fewer) or none."""
    most = int(evaluated.sum(1).max(initial=0))
    return most if most < evaluated.shape[1] else 0
