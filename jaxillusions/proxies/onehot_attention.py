"""One-hot attention proxy: each attention row becomes a one-hot on its argmax (first on ties)."""

import jax
import jax.numpy as jnp

from jaxillusions.proxies import fit_without_data

STATISTIC = None
SITE = "pattern"


fit = fit_without_data


def apply(params: dict, x: jax.Array) -> jax.Array:
    """x [..., Tq, Tk] attention probabilities -> one-hot rows, same shape and dtype."""
    del params
    return jax.nn.one_hot(jnp.argmax(x, axis=-1), x.shape[-1], dtype=x.dtype)
