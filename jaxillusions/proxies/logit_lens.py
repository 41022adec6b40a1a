"""Logit lens proxy: the residual stream at a site, decoded by the model's final layer norm and
unembedding, as if the layers after it did nothing.

Its claim: "the prediction is already formed at this site". The proxy model's output at every
position is the decoded site: the lens replaces the final residual stream
(`blocks.<last>.resid_post`) by the target's value (proxies/_lens.py), so faithfulness per split
is the agreement of the decoded prediction with the model's own (same_pred, jsd, ... as for every
proxy). At the last residual site it is the model itself.

Targets: proxies.logit_lens_targets, residual sites (e.g. blocks.0.resid_pre, blocks.0.resid_mid,
blocks.0.resid_post, ...), one family each. Data-independent: one size (0), nothing fitted.
"""

import jax

from jaxillusions.proxies import _lens, fit_without_data

STATISTIC = None
SITE = "vector"
SIZE_LABEL = "size"

output_site = _lens.output_site
fit = fit_without_data


def settings(proxy_cfg, dim: int) -> tuple[tuple[int, ...], tuple]:
    return (0,), ()


def check(sizes: tuple[int, ...], proxy_cfg, dim: int, target: str) -> None:
    _lens.check("logit_lens", target)


def apply(params: dict, x: jax.Array) -> jax.Array:
    """The final residual stream the lens writes: the site's value itself."""
    del params
    return x
