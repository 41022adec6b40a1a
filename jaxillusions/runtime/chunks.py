"""Fixed-shape row chunks of arrays (`padded_chunks`): how the shared code batches a task's rows,
or any arrays with a leading row axis, for a compiled program (evaluation, proxies, studies);
how many rows a large vocabulary's logits allow in one (`logit_rows`); and the evaluated
positions of each row, where an evaluation computes its logits (`readout`)."""

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
# log-softmax (training/evaluation.py). A call whose `copies` of them would exceed LOGITS_BYTES
# runs its batch in chunks of the rows that stay within it: at a vocabulary of 50k, 128-token
# rows run about 40 at a time in training's evaluation. The cap depends on the config alone,
# never on the machine, so that the numbers do too; the shipped configs (a vocabulary of at
# most 256) stay well below it, so their batches are as set. training/memory.py counts it.
LOGITS_BYTES = 2 * 2**30


def logit_rows(rows: int, width: int, vocab: int, copies: int) -> int:
    """`rows` if `copies` float32 logits of rows x width x vocab fit in LOGITS_BYTES, else the
    most rows that do (at least 1)."""
    per_row = copies * width * vocab * 4
    return rows if rows * per_row <= LOGITS_BYTES else max(1, LOGITS_BYTES // per_row)


def readout(evaluated: np.ndarray, width: int) -> np.ndarray:
    """evaluated [B, T] bool -> int32 [B, width]: each row's evaluated positions ascending, then
    -1 (model.Span's readout, read by model.at_positions; its scored slots `>= 0`); `width` at
    least the most of any row (`readout_width`), or that row's last ones are dropped."""
    order = np.argsort(~evaluated, axis=1, kind="stable")[:, :width]
    return np.where(np.take_along_axis(evaluated, order, 1), order, -1).astype(np.int32)


def readout_width(evaluated: np.ndarray) -> int:
    """The most evaluated positions of any row of `evaluated` [B, T] bool, or 0 where that is
    every position (a readout would compute no fewer) or none."""
    most = int(evaluated.sum(1).max(initial=0))
    return most if most < evaluated.shape[1] else 0
