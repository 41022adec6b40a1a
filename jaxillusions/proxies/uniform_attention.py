"""Uniform attention proxy: query i attends uniformly to key positions 0..i (causal); the same
pattern as a layer trained with it (model.UniformAttention)."""

import jax

from jaxillusions import model
from jaxillusions.proxies import fit_without_data

STATISTIC = None
SITE = "pattern"


fit = fit_without_data


def apply(params: dict, x: jax.Array) -> jax.Array:
    """x [..., T, T] attention probabilities -> uniform causal rows, same shape and dtype."""
    del params
    return model.uniform_pattern(x.shape).astype(x.dtype)
