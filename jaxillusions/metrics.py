"""Agreement metrics between an original model and its proxy, and seed aggregation.

JSD is in bits (base 2), so it lies in [0, 1]. Argmax-based metrics break ties towards the
first index (jnp.argmax semantics), for both models alike.
"""

import jax
import jax.numpy as jnp
import numpy as np

_LN2 = float(np.log(2.0))


def _jsd_from_log(logp: jax.Array, logq: jax.Array) -> jax.Array:
    def kl_terms(logx: jax.Array, logy: jax.Array) -> jax.Array:
        # Elementwise x log(x / m), m = (x + y) / 2. 0 log 0 = 0: mask zero-probability entries
        # before the arithmetic (no inf - inf).
        zero = jnp.isneginf(logx)
        diff = jnp.where(zero, 0.0, logy - logx)
        # log(x / m) = ln 2 - softplus(log y - log x): no cancellation of large logs, and
        # exactly 0 for x == y.
        return jnp.where(zero, 0.0, jnp.exp(logx) * (_LN2 - jax.nn.softplus(diff)))

    # ONE reduction over both KL terms. Two sibling sums, when one operand is broadcast along a
    # middle axis (as under vmap over proxy sizes), are miscompiled by XLA:CPU in jax 0.10.2:
    # results off by up to 0.6 bits (tests/test_metrics.py::test_jsd_with_broadcast_operands).
    js = 0.5 * jnp.sum(kl_terms(logp, logq) + kl_terms(logq, logp), axis=-1) / _LN2
    # Rounding can give tiny negatives (or a hair above 1); the true value is in [0, 1].
    return jnp.clip(js, 0.0, 1.0)


def jsd(logits_p: jax.Array, logits_q: jax.Array) -> jax.Array:
    """Jensen-Shannon divergence in bits between softmax(logits_p) and softmax(logits_q).

    [..., V] -> [...]; computed in float32 from log-softmax for stability.
    """
    logp = jax.nn.log_softmax(logits_p.astype(jnp.float32), axis=-1)
    logq = jax.nn.log_softmax(logits_q.astype(jnp.float32), axis=-1)
    return _jsd_from_log(logp, logq)


def jsd_probs(p: jax.Array, q: jax.Array) -> jax.Array:
    """Jensen-Shannon divergence in bits between probability vectors [..., V] -> [...]."""
    return _jsd_from_log(jnp.log(p.astype(jnp.float32)), jnp.log(q.astype(jnp.float32)))


def same_pred(logits_p: jax.Array, logits_q: jax.Array) -> jax.Array:
    """[..., V] -> [...] float32, 1.0 where the argmaxes agree (ties: first index)."""
    return (jnp.argmax(logits_p, -1) == jnp.argmax(logits_q, -1)).astype(jnp.float32)


def correct(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """[..., V], [...] int -> [...] float32, 1.0 where argmax == target (ties: first index)."""
    return (jnp.argmax(logits, -1) == targets).astype(jnp.float32)


# Two-sided 95% Student t quantiles t_{0.975, df} for df = 1..30.
_T975 = np.array(
    [
        12.706204736,
        4.302652730,
        3.182446305,
        2.776445105,
        2.570581836,
        2.446911851,
        2.364624252,
        2.306004135,
        2.262157163,
        2.228138852,
        2.200985160,
        2.178812830,
        2.160368656,
        2.144786688,
        2.131449546,
        2.119905299,
        2.109815578,
        2.100922040,
        2.093024054,
        2.085963447,
        2.079613845,
        2.073873068,
        2.068657610,
        2.063898562,
        2.059538553,
        2.055529439,
        2.051830516,
        2.048407142,
        2.045229642,
        2.042272456,
    ]
)


def _t975(df: np.ndarray) -> np.ndarray:
    """t_{0.975, df}: table up to 30 dof, Cornish-Fisher expansion (error < 1e-6) above."""
    df = np.asarray(df, dtype=np.float64)
    z = 1.959963984540054
    nu = np.maximum(df, 1.0)
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    g4 = (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160
    approx = z + g1 / nu + g2 / nu**2 + g3 / nu**3 + g4 / nu**4
    table = _T975[np.clip(df, 1, 30).astype(int) - 1]
    return np.where(df < 1, np.nan, np.where(df <= 30, table, approx))


def mean_ci95(values: np.ndarray, axis: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Mean over `axis` (seeds) ignoring NaN, and the 95% CI half-width t_{n-1} * s / sqrt(n).

    n counts the non-NaN entries. With n == 0 both outputs are NaN; with n == 1 the mean is
    that value and the half-width is NaN (undefined: no spread estimate), so plots show no bar.
    """
    v = np.asarray(values, dtype=np.float64)
    ok = ~np.isnan(v)
    n = ok.sum(axis=axis)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(ok, v, 0.0).sum(axis=axis) / n
        dev = np.where(ok, v - np.expand_dims(mean, axis), 0.0)
        var = (dev**2).sum(axis=axis) / (n - 1)
        half = _t975(n - 1) * np.sqrt(var / n)
    return mean, np.where(n > 1, half, np.nan)
