"""Tuned lens proxy (Belrose et al. 2023, "Eliciting latent predictions from transformers with
the tuned lens"): the logit lens with an affine translator per site,

    h -> h A + b,   decoded by the final layer norm and unembedding (proxies/_lens.py).

The paper trains the translator (initialised at the identity) by gradient descent on the KL
divergence to the model's final logits. Here it is fitted in closed form: least squares of the
final residual stream h_L on the site's value h, over the fit split's positions,

    h_L - mean_L ~ (h - mean) (I + D),   b = mean_L - mean (I + D),

with D the ridge solution of the correction to the identity (a ridge of proxies.tuned_lens_ridge
times the mean eigenvalue of Cov(h), for rank-deficient sites). Closed form, so it is exact,
batched over seeds, sizes and heads in one call, and deterministic; the price is that it
matches the final residual in the L2 sense rather than the logits in the KL sense (the final
layer norm removes the scale, which least squares still fits). A size is the rank of the
correction: D restricted to the top-r directions of its fitted values (reduced-rank regression),
so size 0 is the identity with the mean shift, and d_model the full least-squares translator
(proxies.tuned_lens_ranks; () -> d_model only). With A = I and b = 0 it is the logit lens.

Fitted on the "pairs" statistic of a lens: the site's value and the final residual stream at
the same training positions (proxies.kmeans_samples of them).
"""

import jax
import jax.numpy as jnp

from jaxillusions.proxies import _lens
from jaxillusions.runtime import linalg

STATISTIC = "pairs"
SITE = "vector"
SIZES_KEY = "tuned_lens_ranks"
SIZE_LABEL = "rank of the correction"
RIDGE = 1e-4  # proxies.tuned_lens_ridge's default

_HI = jax.lax.Precision.HIGHEST

output_site = _lens.output_site


def settings(proxy_cfg, dim: int) -> tuple[tuple[int, ...], tuple]:
    """proxies.tuned_lens_ranks, or () -> the full rank `dim`; the ridge."""
    return tuple(proxy_cfg.tuned_lens_ranks) or (dim,), (("ridge", proxy_cfg.tuned_lens_ridge),)


def check(sizes: tuple[int, ...], proxy_cfg, dim: int, target: str) -> None:
    _lens.check("tuned_lens", target)
    too_big = [r for r in sizes if r > dim]
    if too_big:
        raise ValueError(f"proxies.tuned_lens_ranks={tuple(proxy_cfg.tuned_lens_ranks)}: ranks "
                         f"{too_big} exceed d_model {dim} of {target}; allowed 0..{dim}")


def translator(x: jax.Array, y: jax.Array, valid: jax.Array, ranks: tuple[int, ...], *,
               ridge: float = RIDGE) -> dict:
    """x [N, F] (the site), y [N, F] (the final residual stream), valid [N] -> {"a": [R, F, F],
    "b": [R, F]}: the least-squares translator whose correction to the identity has each rank
    of `ranks`."""
    f = x.shape[-1]
    w = valid.astype(jnp.float32)[:, None]
    n = jnp.maximum(w.sum(), 1.0)
    x = jnp.where(w > 0, x.astype(jnp.float32), 0.0)
    y = jnp.where(w > 0, y.astype(jnp.float32), 0.0)
    mean_x, mean_y = x.sum(0) / n, y.sum(0) / n
    xc, yc = (x - mean_x) * w, (y - mean_y) * w
    cov = jnp.matmul(xc.T, xc, precision=_HI) / n
    lam = ridge * jnp.trace(cov) / f
    # The correction D solves (Cov + lam I) D = Cov(x, y - x).
    d = linalg.solve(cov + lam * jnp.eye(f), jnp.matmul(xc.T, yc - xc, precision=_HI) / n)
    # Reduced rank: the top-r directions of the fitted corrections x D (eigenvectors of
    # D^T Cov D, decreasing), as svd.py orders its basis.
    fitted = jnp.matmul(d.T, jnp.matmul(cov, d, precision=_HI), precision=_HI)
    _, vecs = linalg.eigh(0.5 * (fitted + fitted.T))
    vecs = vecs[:, ::-1]
    out = []
    for r in ranks:
        mask = (jnp.arange(f) < r).astype(jnp.float32)
        a = jnp.eye(f) + jnp.matmul(d, (vecs * mask) @ vecs.T, precision=_HI)
        out.append({"a": a, "b": mean_y - jnp.matmul(mean_x, a, precision=_HI)})
    return jax.tree.map(lambda *v: jnp.stack(v), *out)


def fit(stats: dict, sizes: tuple[int, ...], *, key: jax.Array | None = None,
        ridge: float = RIDGE) -> dict:
    """{"x": the site [N, F], "y": the final residual stream [N, F], "valid": [N]} -> the
    translators of every rank in `sizes`, leaves [R, ...]."""
    del key  # deterministic
    return translator(stats["x"], stats["y"], stats["valid"], sizes, ridge=ridge)


def apply(params: dict, x: jax.Array) -> jax.Array:
    """One rank's translator, the site's value x [..., F] -> the final residual stream it
    predicts, same shape and dtype."""
    out = jnp.matmul(x.astype(jnp.float32), params["a"], precision=_HI) + params["b"]
    return out.astype(x.dtype)
