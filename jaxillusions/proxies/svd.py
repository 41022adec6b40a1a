"""Rank-r projection proxy: x -> mean + P_r (x - mean), P_r onto the top-r eigenvectors.

Uncentered (mean = 0) it projects onto the top right singular vectors of the training
activation matrix; with center=True it is PCA. Every rank comes from one eigendecomposition:
the ranks differ only in a mask over the sorted eigenvector columns.
"""

import jax
import jax.numpy as jnp

from jaxillusions.runtime import linalg

STATISTIC = "moments"
SITE = "vector"
SIZES_KEY = "svd_ranks"
SIZE_LABEL = "rank"

# Activations are small ([..., F] with F ~ d_head); full float32 precision is cheap and keeps
# full-rank projections equal to the identity on accelerators whose default matmul is TF32.
_HI = jax.lax.Precision.HIGHEST


def moments(x: jax.Array, valid: jax.Array) -> dict:
    """x [N, F], valid bool [N] -> sums over valid rows: gram [F, F], total [F], count []."""
    # where (not multiply) so garbage or NaN in padding rows cannot leak in.
    x = jnp.where(valid[:, None], x.astype(jnp.float32), 0.0)
    return {
        "gram": jnp.matmul(x.T, x, precision=_HI),
        "total": x.sum(0),
        "count": valid.sum().astype(jnp.float32),
    }


def ranks(proxy_cfg, dim: int) -> tuple[int, ...]:
    """proxies.svd_ranks, or () -> 1, 2, 4, ... up to `dim` (and `dim` itself)."""
    if proxy_cfg.svd_ranks:
        return tuple(proxy_cfg.svd_ranks)
    powers = [2**i for i in range(dim.bit_length()) if 2**i <= dim]
    return tuple(powers + ([dim] if powers[-1] != dim else []))


def settings(proxy_cfg, dim: int) -> tuple[tuple[int, ...], tuple]:
    """Ranks, and centering (PCA) from proxies.svd_center."""
    return ranks(proxy_cfg, dim), (("center", proxy_cfg.svd_center),)


def check(sizes: tuple[int, ...], proxy_cfg, dim: int, target: str) -> None:
    too_big = [r for r in sizes if r > dim]
    if too_big:
        raise ValueError(f"proxies.svd_ranks={tuple(proxy_cfg.svd_ranks)}: ranks {too_big} "
                         f"exceed the dimension {dim} of {target}; allowed 1..{dim}")


def fit(
    stats: dict, sizes: tuple[int, ...], *, key: jax.Array | None = None, center: bool = False
) -> dict:
    """Moments -> {"mean": [R, F], "basis": [R, F, F], "mask": [R, F]}; ranks clipped to F."""
    del key  # deterministic
    count = jnp.maximum(stats["count"], 1.0)
    f = stats["total"].shape[-1]
    mean = stats["total"] / count if center else jnp.zeros(f, jnp.float32)
    # Normalizing by count only rescales eigenvalues but keeps float32 well scaled.
    m = stats["gram"] / count - jnp.outer(mean, mean)
    _, vecs = linalg.eigh(0.5 * (m + m.T))
    basis = vecs[:, ::-1]  # eigh sorts ascending; we want decreasing eigenvalue
    ranks = jnp.minimum(jnp.asarray(sizes), f)
    r = len(sizes)
    return {
        "mean": jnp.broadcast_to(mean, (r, f)),
        "basis": jnp.broadcast_to(basis, (r, f, f)),
        "mask": (jnp.arange(f)[None, :] < ranks[:, None]).astype(jnp.float32),
    }


def apply(params: dict, x: jax.Array) -> jax.Array:
    """One rank's params, x [..., F] -> projection of x, same shape and dtype."""
    mean, basis = params["mean"], params["basis"]
    z = jnp.matmul(x.astype(jnp.float32) - mean, basis, precision=_HI) * params["mask"]
    return (mean + jnp.matmul(z, basis.T, precision=_HI)).astype(x.dtype)
