"""k-means proxy: replace x by its nearest centroid.

All sizes are fitted together: greedy k-means++ (as scikit-learn's) runs once for
K_max = max(sizes) centres (the picks for k are a prefix of those for K_max, since pick i uses
fold_in(key, i)), then `num_iters` Lloyd iterations run for every size at once, starting from
the first k centres. The result equals Lloyd on [R, K_max] centres with those beyond k masked
out, but is computed on the sum(sizes) live centres only. Empty clusters keep their centre."""

import jax
import jax.numpy as jnp

STATISTIC = "samples"
SITE = "vector"
SIZES_KEY = "kmeans_sizes"
SIZE_LABEL = "clusters k"

_HI = jax.lax.Precision.HIGHEST  # distances by expansion cancel; keep full float32 on GPUs
_IN_BOUNDS = jax.lax.GatherScatterMode.PROMISE_IN_BOUNDS
_BLOCK = 128  # rows per block of the two-level k-means++ sampling
_UNROLL = 64  # centres compared per loop step when assigning rows


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


def latents(params: dict, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """k-means as a dictionary with one active latent per row (its cluster): indices [..., 1],
    active [..., 1] (all True). The dictionary metrics count these (l0 1, dead clusters)."""
    index = assign(params, x)[..., None]
    return index, jnp.ones(index.shape, bool)


def inertia(params: dict, x: jax.Array, valid: jax.Array) -> jax.Array:
    """One size's params, x [N, F], valid [N] -> sum of squared distances to nearest centroid."""
    d = jnp.sum((x.astype(jnp.float32) - apply(params, x.astype(jnp.float32))) ** 2, -1)
    return jnp.sum(jnp.where(valid, d, 0.0))


def _kmeanspp(
    x: jax.Array, valid: jax.Array, k: int, key: jax.Array, num_candidates: int
) -> jax.Array:
    """Greedy k-means++: k centres [k, F] from the valid rows of x [N, F]. Each pick draws
    num_candidates rows by D^2 sampling and keeps the one that lowers the potential most
    (as scikit-learn; 1 is plain k-means++)."""
    n = x.shape[0]

    def inverse_cdf(cdf: jax.Array, u: jax.Array) -> jax.Array:
        # First index with cdf > u (a row with positive weight for 0 <= u); rounding can give
        # u >= total, so cap at argmax(cdf), the last row with weight (never padding).
        return jnp.minimum(jnp.searchsorted(cdf, u, side="right"), jnp.argmax(cdf))

    def sample(w: jax.Array, u: jax.Array) -> jax.Array:
        # One uniform per draw (N Gumbels cost more), inverse CDF in two levels (block, row in
        # block): a full-length cumsum per pick dominates the init on CPU.
        wb = jnp.pad(w, (0, -n % _BLOCK)).reshape(-1, _BLOCK)
        block_cdf = jnp.cumsum(wb.sum(1))
        u = u * block_cdf[-1]
        b = inverse_cdf(block_cdf, u)
        row_cdf = jnp.cumsum(wb[b])
        u = jnp.maximum(u - (block_cdf[b] - row_cdf[-1]), 0.0)
        return b * _BLOCK + inverse_cdf(row_cdf, u)

    def sqdist(c: jax.Array) -> jax.Array:
        # Direct difference (not the expansion): exactly 0 for rows equal to a chosen centre.
        return jnp.where(valid, jnp.sum((x - c) ** 2, -1), 0.0)

    w0 = valid.astype(jnp.float32)

    def body(i: jax.Array, carry: tuple) -> tuple:
        centres, d2 = carry
        # The first pick, and any pick once every row coincides with a centre (k > #distinct
        # points: D^2 all zero), samples uniformly over valid rows (duplicates are harmless).
        w = jnp.where((i == 0) | (d2.sum() == 0), w0, d2)
        # fold_in(key, i): pick i does not depend on k, so the picks for k prefix those for K_max.
        u = jax.random.uniform(jax.random.fold_in(key, i), (num_candidates,))
        rows = jax.vmap(sample, in_axes=(None, 0))(w, u)
        d = jax.vmap(sqdist)(x[rows])  # [candidates, N]
        d = jnp.where(i == 0, d, jnp.minimum(d2, d))
        best = jnp.argmin(d.sum(1))
        return centres.at[i].set(x[rows[best]]), d[best]

    init = (jnp.zeros((k, x.shape[1]), jnp.float32), jnp.zeros(n, jnp.float32))
    return jax.lax.fori_loop(0, k, body, init)[0]


def _first_argmin(s: jax.Array) -> jax.Array:
    """[k, B] -> [B] index of the smallest row, first on ties (as jnp.argmin).

    A running compare over rows: XLA's CPU argmin reduction is several times slower. Unrolled
    (a loop step costs more than comparing one row), in blocks so compile time stays bounded."""

    def body(j: jax.Array, carry: tuple) -> tuple:
        best, idx = carry
        better = s[j] < best
        return jnp.where(better, s[j], best), jnp.where(better, j, idx)

    init = (s[0], jnp.zeros(s.shape[1], jnp.int32))
    return jax.lax.fori_loop(1, s.shape[0], body, init, unroll=_UNROLL)[1]


def _lloyd(
    x: jax.Array, w: jax.Array, c: jax.Array, sizes: tuple[int, ...], num_iters: int, chunk: int
) -> jax.Array:
    """Lloyd for every size at once. x [N, F] (padding zeroed), w [N] 0/1 weights, c [S, F]: the
    centres of all sizes packed one after the other (S = sum(sizes)) -> updated c.

    Packing instead of masking [R, K_max] skips the masked distances (3x fewer for doubling
    sizes); streaming rows in chunks keeps the [S, chunk] distances in cache."""
    n, f = x.shape
    offsets = [sum(sizes[:i]) for i in range(len(sizes))]
    chunk = min(chunk, n)
    pad = -n % chunk
    x = jnp.pad(x, ((0, pad), (0, 0))).reshape(-1, chunk, f)
    # Weighted rows with the weight appended: one segment_sum gives sums and counts.
    xw = jnp.concatenate([x, jnp.ones_like(x[..., :1])], -1) * jnp.pad(w, (0, pad)).reshape(
        -1, chunk, 1
    )

    def step(_: int, c: jax.Array) -> jax.Array:
        cc = jnp.sum(c * c, -1)[:, None]

        def accumulate(acc: jax.Array, rows: tuple) -> tuple:
            xb, xwb = rows
            s = cc - 2.0 * jnp.matmul(c, xb.T, precision=_HI)  # [S, chunk], |x|^2 dropped
            seg = jnp.concatenate(
                [_first_argmin(s[o : o + k]) + o for o, k in zip(offsets, sizes, strict=True)]
            )
            tiled = jnp.tile(xwb, (len(sizes), 1))
            # seg is in bounds by construction; promising it skips a bounds check per row.
            sums = jax.ops.segment_sum(tiled, seg, c.shape[0], mode=_IN_BOUNDS)
            return acc + sums, None

        acc, _ = jax.lax.scan(accumulate, jnp.zeros((c.shape[0], f + 1)), (x, xw))
        counts = acc[:, -1:]
        # Empty clusters keep their previous centre.
        return jnp.where(counts > 0, acc[:, :-1] / jnp.maximum(counts, 1.0), c)

    return jax.lax.fori_loop(0, num_iters, step, c)


def _lloyd_cpu_sequential(
    x: jax.Array, w: jax.Array, c: jax.Array, sizes: tuple[int, ...], num_iters: int, chunk: int
) -> jax.Array:
    """_lloyd, except that jax.vmap of it (over seeds, heads) runs the batch in sequence on CPU.

    Measured on CPU: vmap over 4 seeds took ~1.7x the time of the same fits in sequence (XLA's
    CPU segment_sum is slower per row when batched, and one item at a time stays in cache).
    Accelerators keep the batched, parallel version. The result is the same either way."""

    def lloyd(x: jax.Array, w: jax.Array, c: jax.Array) -> jax.Array:
        return _lloyd(x, w, c, sizes, num_iters, chunk)

    if jax.default_backend() != "cpu":
        return lloyd(x, w, c)
    one_at_a_time = jax.custom_batching.custom_vmap(lloyd)

    @one_at_a_time.def_vmap
    def _(axis_size: int, in_batched: list, *args: jax.Array) -> tuple:
        args = [
            a if b else jnp.broadcast_to(a, (axis_size, *a.shape))
            for a, b in zip(args, in_batched, strict=True)
        ]
        return jax.lax.map(lambda a: one_at_a_time(*a), tuple(args)), True

    return one_at_a_time(x, w, c)


def settings(proxy_cfg, dim: int) -> tuple[tuple[int, ...], tuple]:
    """Cluster counts, and the Lloyd iterations from proxies.kmeans_iters."""
    del dim
    return tuple(proxy_cfg.kmeans_sizes), (("num_iters", proxy_cfg.kmeans_iters),)


def check(sizes: tuple[int, ...], proxy_cfg, dim: int, target: str) -> None:
    del dim, target
    if any(k < 1 for k in sizes):  # before kmeans_samples, which a ProxySpec does not have
        raise ValueError(f"proxies.kmeans_sizes={tuple(sizes)}: k below 1; allowed "
                         "1..kmeans_samples")
    too_big = [k for k in sizes if k > proxy_cfg.kmeans_samples]
    if too_big:
        raise ValueError(f"proxies.kmeans_sizes={tuple(proxy_cfg.kmeans_sizes)}: k {too_big} "
                         f"exceed proxies.kmeans_samples={proxy_cfg.kmeans_samples} (the "
                         "vectors they are fitted on); allowed 1..kmeans_samples")


def fit(
    stats: dict,
    sizes: tuple[int, ...],
    *,
    key: jax.Array,
    num_iters: int = 25,
    num_candidates: int = 4,
    chunk_size: int = 512,
) -> dict:
    """{"x": [N, F], "valid": [N]} -> {"centroids": [R, K_max, F], "mask": [R, K_max] bool}.

    Entries beyond k (mask False) hold the unused k-means++ centres. num_candidates: D^2 draws
    per k-means++ pick, the best kept (1: plain k-means++). chunk_size: rows per step of the
    assignment (cache-sized on CPU; a larger one may suit accelerators)."""
    valid = stats["valid"]
    x = jnp.where(valid[:, None], stats["x"].astype(jnp.float32), 0.0)
    kmax = max(sizes)
    centres = _kmeanspp(x, valid, kmax, key, num_candidates)
    packed = jnp.concatenate([centres[:k] for k in sizes])
    packed = _lloyd_cpu_sequential(
        x, valid.astype(jnp.float32), packed, tuple(sizes), num_iters, chunk_size
    )
    offsets = [sum(sizes[:i]) for i in range(len(sizes))]
    centroids = jnp.stack(
        [
            jnp.concatenate([packed[o : o + k], centres[k:]])
            for o, k in zip(offsets, sizes, strict=True)
        ]
    )
    mask = jnp.arange(kmax)[None, :] < jnp.asarray(sizes)[:, None]
    return {"centroids": centroids, "mask": mask}
