"""Quality metrics of sparse dictionary proxies (and of any reconstruction), as pure functions.

Reconstruction and sparsity, over the valid rows of a split:
  fvu    fraction of variance unexplained: sum |x - x_hat|^2 / sum |x - mean(x)|^2
         (1 - SAELens's explained variance, computed over the whole split);
  l0     mean number of active latents per row;
  dead   fraction of a dictionary's latents (those in its mask) never active on the split.

Downstream, with the model's next-token cross-entropy CE and the per-position KL divergence
KL(original || replaced) of the next-token distributions, each averaged over the scored positions
first, then combined as in SAELens's evaluation (`ce_loss_score`, `kl_div_score`), so that the
numbers compare with published ones:
  ce_score = (CE_zero_ablation - CE_proxy) / (CE_zero_ablation - CE_original)
  kl_score = (KL_zero_ablation - KL_proxy) / KL_zero_ablation
Both are 1 for a proxy that changes nothing and 0 for one as bad as zeroing the site.
"""

import jax
import jax.numpy as jnp
import optax


def _rows(valid: jax.Array | None, like: jax.Array) -> jax.Array:
    return jnp.ones(like.shape[:-1], bool) if valid is None else valid


def fvu(x: jax.Array, x_hat: jax.Array, valid: jax.Array | None = None) -> jax.Array:
    """x, x_hat [..., F], valid bool [...] -> fraction of variance unexplained over valid rows."""
    valid = _rows(valid, x)
    x, x_hat = x.astype(jnp.float32), x_hat.astype(jnp.float32)
    count = jnp.maximum(valid.sum(), 1)
    mean = jnp.sum(jnp.where(valid[..., None], x, 0.0), axis=tuple(range(x.ndim - 1))) / count
    err = jnp.sum(jnp.where(valid[..., None], (x - x_hat) ** 2, 0.0))
    total = jnp.sum(jnp.where(valid[..., None], (x - mean) ** 2, 0.0))
    return err / total


def l0(codes: jax.Array, valid: jax.Array | None = None) -> jax.Array:
    """codes [..., W], valid bool [...] -> mean count of nonzero latents per valid row."""
    valid = _rows(valid, codes)
    active = jnp.sum(codes != 0, -1)
    return jnp.sum(jnp.where(valid, active, 0)) / jnp.maximum(valid.sum(), 1)


def dead_fraction(codes: jax.Array, valid: jax.Array | None = None,
                  mask: jax.Array | None = None) -> jax.Array:
    """codes [..., W], valid bool [...], mask bool [W] (the dictionary's latents; default all)
    -> fraction of the masked latents that are zero on every valid row."""
    valid = _rows(valid, codes)
    mask = jnp.ones(codes.shape[-1], bool) if mask is None else mask
    fired = jnp.any((codes != 0) & valid[..., None], axis=tuple(range(codes.ndim - 1)))
    return jnp.sum(mask & ~fired) / jnp.maximum(mask.sum(), 1)


def cross_entropy(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """logits [..., V], targets int [...] -> per-position next-token cross-entropy [...]."""
    return optax.losses.softmax_cross_entropy_with_integer_labels(
        logits.astype(jnp.float32), targets)


def kl_divergence(original: jax.Array, replaced: jax.Array) -> jax.Array:
    """Logits [..., V] -> per-position KL(original || replaced) [...] (SAELens's direction)."""
    log_p = jax.nn.log_softmax(original.astype(jnp.float32), -1)
    log_q = jax.nn.log_softmax(replaced.astype(jnp.float32), -1)
    # optax.losses.kl_divergence_with_log_targets(log_q, log_p), sum(p (log p - log q)), as one
    # product per position: XLA:CPU runs that multiply-and-sum 7-50x slower where the batch
    # shape holds an axis of size 1 (a family of one size, under vmap; docs/speed.md).
    return jnp.einsum("...v,...v->...", jnp.exp(log_p), log_p - log_q)


def ce_score(ce_original: jax.Array, ce_proxy: jax.Array, ce_zero: jax.Array) -> jax.Array:
    """Mean CEs -> (CE_zero - CE_proxy) / (CE_zero - CE_original); 1: as the original model,
    0: as zero ablation. Undefined (inf/nan) when zeroing the site changes no loss."""
    return (ce_zero - ce_proxy) / (ce_zero - ce_original)


def kl_score(kl_proxy: jax.Array, kl_zero: jax.Array) -> jax.Array:
    """Mean KLs from the original -> (KL_zero - KL_proxy) / KL_zero; 1: the original's
    distribution, 0: as far as zero ablation."""
    return (kl_zero - kl_proxy) / kl_zero


def downstream_scores(original: jax.Array, proxy: jax.Array, zero: jax.Array,
                      targets: jax.Array, weight: jax.Array) -> dict:
    """Logits [..., V] of the original model, with the proxy, and with the site zeroed; targets
    [...]; weight [...] (1 at scored positions) -> {"ce_score", "kl_score"} of the weighted
    means (means first, then the ratio, as SAELens)."""
    weight = weight.astype(jnp.float32)

    def mean(v: jax.Array) -> jax.Array:
        return jnp.sum(v * weight) / jnp.maximum(weight.sum(), 1e-12)

    ce = [mean(cross_entropy(logits, targets)) for logits in (original, proxy, zero)]
    kl = [mean(kl_divergence(original, logits)) for logits in (proxy, zero)]
    return {"ce_score": ce_score(*ce), "kl_score": kl_score(*kl)}
