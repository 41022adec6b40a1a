"""Datasets: Dyck-(k, m) with generalization splits (dyck.py); the on-disk cache of generated
data, shared with the code task (cache.py)."""

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
