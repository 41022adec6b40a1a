"""k-means proxy: replace x by its nearest centroid.

All sizes are fitted together: k-means++ runs once for K_max = max(sizes) centres (the
k-means++ sequence for k is a prefix of the one for K_max, since pick i uses
fold_in(key, i)), then Lloyd runs for every size at once on [R, K_max] centres with the
centres beyond k masked out.
"""

import jax
import jax.numpy as jnp

STATISTIC = "samples"
SITE = "vector"

_HI = jax.lax.Precision.HIGHEST  # distances by expansion cancel; keep full float32 on GPUs


def _scores(x: jax.Array, c: jax.Array, mask: jax.Array) -> jax.Array:
    """[N, F], [K, F], [K] -> [N, K] squared distance minus |x|^2 (constant per row, so the
    argmin is unchanged); masked centres get +inf."""
    s = jnp.sum(c * c, -1) - 2.0 * jnp.matmul(x, c.T, precision=_HI)
    return jnp.where(mask, s, jnp.inf)


def assign(params: dict, x: jax.Array) -> jax.Array:
    """One size's params, x [..., F] -> index [...] of the nearest unmasked centroid."""
    c = params["centroids"]
    flat = x.reshape(-1, x.shape[-1]).astype(jnp.float32)
    return jnp.argmin(_scores(flat, c, params["mask"]), -1).reshape(x.shape[:-1])


def apply(params: dict, x: jax.Array) -> jax.Array:
    """One size's params, x [..., F] -> nearest unmasked centroid, same shape and dtype."""
    return params["centroids"][assign(params, x)].astype(x.dtype)


def inertia(params: dict, x: jax.Array, valid: jax.Array) -> jax.Array:
    """One size's params, x [N, F], valid [N] -> sum of squared distances to nearest centroid."""
    d = jnp.sum((x.astype(jnp.float32) - apply(params, x.astype(jnp.float32))) ** 2, -1)
    return jnp.sum(jnp.where(valid, d, 0.0))


def _kmeanspp(x: jax.Array, valid: jax.Array, k: int, key: jax.Array) -> jax.Array:
    """D^2 sampling of k centres [k, F] from the valid rows of x [N, F]."""

    def pick(i: jax.Array, w: jax.Array) -> jax.Array:
        # Inverse-CDF sampling: one uniform per pick instead of N Gumbels.
        cdf = jnp.cumsum(w)
        u = jax.random.uniform(jax.random.fold_in(key, i)) * cdf[-1]
        j = jnp.searchsorted(cdf, u, side="right")
        # Rounding can give u == total; argmax(cdf) is the last row with weight, never padding.
        return jnp.minimum(j, jnp.argmax(cdf))

    def sqdist(c: jax.Array) -> jax.Array:
        # Direct difference (not the expansion): exactly 0 for rows equal to a chosen centre.
        return jnp.where(valid, jnp.sum((x - c) ** 2, -1), 0.0)

    w0 = valid.astype(jnp.float32)
    c0 = x[pick(0, w0)]

    def body(i: jax.Array, carry: tuple) -> tuple:
        centres, d2 = carry
        # Once every row coincides with a centre (k > #distinct points), D^2 is all zero:
        # fall back to uniform over valid rows (duplicate centres, harmless).
        c = x[pick(i, jnp.where(d2.sum() > 0, d2, w0))]
        return centres.at[i].set(c), jnp.minimum(d2, sqdist(c))

    init = (jnp.zeros((k, x.shape[1]), jnp.float32).at[0].set(c0), sqdist(c0))
    return jax.lax.fori_loop(1, k, body, init)[0]


def _lloyd(x: jax.Array, w: jax.Array, c: jax.Array, mask: jax.Array, num_iters: int) -> jax.Array:
    """Lloyd iterations for one size: x [N, F] (padding zeroed), w [N] 0/1, c [K, F], mask [K]."""
    k = c.shape[0]
    xw = x * w[:, None]

    def step(_: int, c: jax.Array) -> jax.Array:
        a = jnp.argmin(_scores(x, c, mask), -1)
        sums = jax.ops.segment_sum(xw, a, num_segments=k)
        counts = jax.ops.segment_sum(w, a, num_segments=k)
        # Empty (or masked) clusters keep their previous centre.
        return jnp.where(counts[:, None] > 0, sums / jnp.maximum(counts, 1.0)[:, None], c)

    return jax.lax.fori_loop(0, num_iters, step, c)


def fit(
    stats: dict, sizes: tuple[int, ...], *, key: jax.Array, num_iters: int = 25
) -> dict:
    """{"x": [N, F], "valid": [N]} -> {"centroids": [R, K_max, F], "mask": [R, K_max] bool}."""
    valid = stats["valid"]
    x = jnp.where(valid[:, None], stats["x"].astype(jnp.float32), 0.0)
    kmax = max(sizes)
    centres = _kmeanspp(x, valid, kmax, key)
    mask = jnp.arange(kmax)[None, :] < jnp.asarray(sizes)[:, None]
    w = valid.astype(jnp.float32)
    lloyd = jax.vmap(lambda m: _lloyd(x, w, centres, m, num_iters))
    return {"centroids": lloyd(mask), "mask": mask}
