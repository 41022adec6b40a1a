"""Uniform attention proxy: query i attends uniformly to key positions 0..i (causal)."""

import jax
import jax.numpy as jnp

from jaxillusions.proxies import fit_without_data

STATISTIC = None
SITE = "pattern"


fit = fit_without_data


def apply(params: dict, x: jax.Array) -> jax.Array:
    """x [..., T, T] attention probabilities -> uniform causal rows, same shape and dtype."""
    del params
    t = x.shape[-1]
    assert x.shape[-2] == t, f"expected square [..., T, T] attention, got {x.shape}"
    causal = jnp.tril(jnp.ones((t, t), jnp.float32))
    return jnp.broadcast_to(causal / causal.sum(-1, keepdims=True), x.shape).astype(x.dtype)
