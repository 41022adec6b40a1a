"""One-hot attention proxy: each attention row becomes a one-hot on its argmax (first on ties)."""

import jax
import jax.numpy as jnp

STATISTIC = None
SITE = "pattern"


def fit(stats: None, sizes: tuple[int, ...], *, key: jax.Array | None = None) -> dict:
    """Data-independent: no parameters."""
    del stats, sizes, key
    return {}


def apply(params: dict, x: jax.Array) -> jax.Array:
    """x [..., Tq, Tk] attention probabilities -> one-hot rows, same shape and dtype."""
    del params
    return jax.nn.one_hot(jnp.argmax(x, axis=-1), x.shape[-1], dtype=x.dtype)
