"""Uniform attention proxy: query i attends uniformly to the keys the model lets it attend to,
positions 0..i (causal; in a packed row, those of its own sentence); the same pattern as a layer
trained with it (model.UniformAttention). It reads the layer's attention scores, which are -inf
where attention is masked."""

import jax
import jax.numpy as jnp

from jaxillusions.proxies import fit_without_data

STATISTIC = None
SITE = "pattern"


fit = fit_without_data


def input_site(site: str, model_cfg=None) -> str:
    """The attention scores of the pattern `site`'s layer (visited just before it)."""
    del model_cfg
    return site.removesuffix(".pattern") + ".scores"


def input_of(model_params, model_cfg, site: str, value: jax.Array) -> jax.Array:
    """The scores, as they are (apply reads which are masked)."""
    del model_params, model_cfg, site
    return value


def apply(params: dict, x: jax.Array) -> jax.Array:
    """x [..., T, T] attention scores (-inf where masked) -> rows uniform over the unmasked keys,
    same shape and dtype; causal scores give model.uniform_pattern bit for bit."""
    del params
    allowed = jnp.isfinite(x).astype(x.dtype)
    return allowed / allowed.sum(-1, keepdims=True)
