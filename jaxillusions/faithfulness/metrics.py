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
