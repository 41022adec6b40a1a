"""Concept erasure proxy: LEACE (Belrose et al. 2023, "LEACE: Perfect linear concept erasure in
closed form") of one of the task's concepts at a site, applied as an intervention.

    x -> x - W^+ P W (x - mean),   W = (Sigma_xx^1/2)^+ (whitening),
                                    P = the orthogonal projection onto colspace(W Sigma_xz),

with Sigma_xz the cross-covariance of x with the one-hot concept. After erasure no linear
classifier decodes the concept from the fit data better than a constant one (Cov(x', z) = 0),
and of the maps that achieve this it moves x least (in expected squared norm, in every
norm of the whitened space). This is the `concept-erasure` package's LeaceFitter with
method="leace", affine=True, shrinkage=False and constrain_cov_trace=False (the plain
formula of the paper); a test compares the two where the package is installed.

The claim it tests: "the model does not need the concept at this site": if predictions do not
change when the concept is erased, the model does not read it there (linearly).

Sizes are concepts: size c erases proxies.concepts[c] (the task's CONCEPTS: Dyck's depth and
bracket, code's category), all fitted and evaluated in one batched call. Fitted on the
"labelled" statistic: a sample of the site's vectors (proxies.kmeans_samples positions of the
training sentences, as k-means's) with every concept's class at the same positions; a concept's
eraser uses the positions where it is defined (Dyck's bracket: depth > 0) and is applied at
every position.
"""

import jax
import jax.numpy as jnp

from jaxillusions.runtime import linalg
from jaxillusions.tasks import MAX_CONCEPT_CLASSES

STATISTIC = "labelled"
SITE = "vector"
SIZES_KEY = "concepts"  # the names; a size is an index into them
SIZE_LABEL = "concept (index into proxies.concepts)"
# Directions of W Sigma_xz with a singular value (a correlation of the whitened vector with a
# centred one-hot class, <= 1/2) at most this are kept: float32 rounding of the sums leaves
# ~1e-5 where the concept is uncorrelated, and a correlation this small moves no probe (as the
# package's svd_tol, there 0.01).
TOL = 1e-3

_HI = jax.lax.Precision.HIGHEST


def settings(proxy_cfg, dim: int) -> tuple[tuple[int, ...], tuple]:
    """One size per concept of proxies.concepts (their indices)."""
    return tuple(range(len(proxy_cfg.concepts))), ()


def leace(x: jax.Array, z: jax.Array, valid: jax.Array, *, num_classes: int = MAX_CONCEPT_CLASSES,
          tol: float = TOL) -> dict:
    """x [N, F], classes z int [N] (< 0: undefined), valid bool [N] -> the LEACE eraser of the
    rows that are valid and labelled: {"mean": [F], "left": [F, M], "right": [M, F]}, M =
    min(F, num_classes), with erase(x) = x - ((x - mean) @ right.T) @ left.T. With z [N, C]
    (C concepts): one eraser per concept, leaves [C, ...] (the decompositions through
    runtime.linalg, one matrix per LAPACK call, which cannot deadlock XLA:CPU's thread pool)."""
    single = z.ndim == 1
    z = z[:, None] if single else z
    f = x.shape[-1]
    x = jnp.where(valid[:, None], x.astype(jnp.float32), 0.0)  # padding cannot leak in
    w = (valid[:, None] & (z >= 0)).astype(jnp.float32).T  # [C, N]
    n = jnp.maximum(w.sum(1), 1.0)[:, None, None]
    mean = jnp.matmul(w, x, precision=_HI) / n[:, 0]  # [C, F]
    xc = (x - mean[:, None, :]) * w[..., None]  # [C, N, F]
    onehot = jax.nn.one_hot(z.T, num_classes, dtype=jnp.float32) * w[..., None]  # [C, N, K]
    zc = (onehot - onehot.sum(1, keepdims=True) / n) * w[..., None]
    sxx = jnp.einsum("cnf,cng->cfg", xc, xc, precision=_HI) / n
    sxz = jnp.einsum("cnf,cnk->cfk", xc, zc, precision=_HI) / n
    lam, vecs = linalg.eigh(0.5 * (sxx + jnp.swapaxes(sxx, 1, 2)))
    # Pseudo-inverse square root, with the threshold of numpy's / torch's pinv.
    keep = lam > lam[:, -1:] * f * jnp.finfo(jnp.float32).eps
    lam = jnp.maximum(lam, 0.0)
    root = jnp.where(keep, jnp.sqrt(jnp.where(keep, lam, 1.0)), 0.0)
    inv_root = jnp.where(keep, 1.0 / jnp.where(keep, root, 1.0), 0.0)
    vt = jnp.swapaxes(vecs, 1, 2)
    whiten = jnp.matmul(vecs * inv_root[:, None, :], vt, precision=_HI)
    unwhiten = jnp.matmul(vecs * root[:, None, :], vt, precision=_HI)
    u, s, _ = linalg.svd(jnp.matmul(whiten, sxz, precision=_HI), full_matrices=False)
    u = u * (s > tol)[:, None, :]
    out = {"mean": mean, "left": jnp.matmul(unwhiten, u, precision=_HI),
           "right": jnp.matmul(jnp.swapaxes(u, 1, 2), whiten, precision=_HI)}
    return jax.tree.map(lambda a: a[0], out) if single else out


def erase(params: dict, x: jax.Array) -> jax.Array:
    """An eraser (leace), x [..., F] -> x with the concept erased, float32."""
    x = x.astype(jnp.float32)
    delta = jnp.matmul(x - params["mean"], params["right"].T, precision=_HI)
    return x - jnp.matmul(delta, params["left"].T, precision=_HI)


def fit(stats: dict, sizes: tuple[int, ...], *, key: jax.Array | None = None) -> dict:
    """{"x": [N, F], "z": int [N, C] (every concept's class), "valid": [N]} -> one eraser per
    size (concept index c < C), leaves [R, ...]."""
    del key  # deterministic
    return leace(stats["x"], stats["z"][:, jnp.asarray(sizes)], stats["valid"])


def apply(params: dict, x: jax.Array) -> jax.Array:
    """One concept's eraser, x [..., F] -> erased x, same shape and dtype."""
    return erase(params, x).astype(x.dtype)
