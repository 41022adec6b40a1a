"""Dictionary metrics of vector proxies in results.csv: fvu, l0, dead, ce_score, kl_score.

Computed inside faithfulness's batched evaluation program (no program of its own), per seed,
size and split, for every data-dependent vector proxy (svd, pca, kmeans, sae, transcoder); the
definitions are proxies/_sparse_coding.py's (SAELens's for the downstream scores):

  fvu       sum |x - x_hat|^2 / sum |x - mean_split(x)|^2 over the split's tokens (not PAD), x the
            original model's activation at the family's sites (heads and sites pooled), x_hat
            the proxy applied to it (a transcoder: to the MLP's input, against its output);
  l0        mean active latents per token and dictionary (proxies with `latents`: sae,
            transcoder, kmeans (1)); NaN for svd/pca, which have no latents;
  dead      fraction of the dictionaries' latents (in their mask) never active on the split;
  ce_score  (CE_zero - CE_proxy) / (CE_zero - CE_original) and
  kl_score  (KL_zero - KL_proxy) / KL_zero, KL = KL(original || replaced), with the next-token
            CE and KL averaged over the split's evaluated positions (the rows' positions, Dyck:
            closing brackets) first; "zero" sets the family's sites to 0 (a transcoder's: the
            MLP output).

Only on `all` rows (other breakdowns: NaN). Pattern proxies (onehot/uniform attention) get none
of these columns. The program sums per split on the device; `columns` forms the ratios on the
host in float64.

Defined only where the denominator means something. fvu, ce_score and kl_score are ratios whose
denominators (the site's variance; CE_zero - CE_original; KL_zero) are differences or sums of
float32 sums over the split's positions. A ratio is reported only where its denominator is
positive and at least DENOMINATOR_MARGIN (1000) times its estimated float32 rounding error
(`mean_rounding`): rounding then moves the ratio by at most 0.1% of itself through the
denominator (and by about as much through the numerator, whose error is of the same size), below
the 1e-3 at which the report calls a difference of these metrics real (report/stats.py
RESOLUTION). Elsewhere the cell is NaN (empty in results.csv) and no gap uses it. This drops
ce_score where zeroing the site lowers the loss or barely raises it (a briefly trained model's
last MLP, q/k sites of an untrained one), and fvu on a near-constant site.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jaxillusions import proxies, tasks
from jaxillusions.proxies import _sparse_coding as _dictionary
from jaxillusions.runtime import schema

EPS32 = float(np.finfo(np.float32).eps)
DENOMINATOR_MARGIN = 1e3  # a ratio's denominator must exceed its rounding error this many times


def mean_rounding(mean: np.ndarray, n: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Estimated float32 rounding error of a mean over n positions of terms each computed from
    numbers of magnitude `scale`: the sum's, about eps * sqrt(n) of it (float32 partial sums
    over the positions whose rounding errors have random signs: the usual statistical estimate
    of a sum's error, Higham, Accuracy and Stability of Numerical Algorithms, 4.2), plus one
    term's own rounding, eps * scale (which averaging does not shrink if it is systematic)."""
    return EPS32 * (np.sqrt(n) * np.abs(mean) + np.abs(scale))


def defined(den: np.ndarray, den_error: np.ndarray) -> np.ndarray:
    """Where a ratio with denominator `den` is reported: den > DENOMINATOR_MARGIN * den_error
    (so den > 0)."""
    return den > DENOMINATOR_MARGIN * den_error


def enabled(module) -> bool:
    """Whether a proxy module's families get the dictionary metrics: data-dependent vector
    proxies, but not a lens (it writes another site than it reads: no reconstruction)."""
    return (module.SITE == "vector" and module.STATISTIC is not None
            and proxies.hook(module, "output_site") is None)


def cache_sites(module, sites, model_cfg) -> tuple[str, ...]:
    """The sites (and a transcoder's input sites in the model `model_cfg`) whose original
    values the metrics read."""
    extra = (tuple(module.input_site(s, model_cfg) for s in sites)
             if proxies.hook(module, "input_site") is not None else ())
    return tuple(dict.fromkeys((*sites, *extra)))


def apply_grouped(module, params: dict, x: jax.Array, like: jax.Array) -> jax.Array:
    """One seed's, one size's params of a data-dependent proxy (head axis G first), x [B, T, F]
    or [B, T, G, F] -> the proxy's output in the shape of `like` (the site's value)."""
    grouped = x if x.ndim == 4 else x[:, :, None, :]
    out = jax.vmap(module.apply, in_axes=(0, 2), out_axes=2)(params, grouped)
    return out.reshape(like.shape)


@dataclasses.dataclass(frozen=True)
class Batch:
    """One chunk of the evaluation as one seed's metric sums read it (traced arrays, built
    inside the evaluation program): the tokens [B, T] and each position's split `split_ids`
    [B, T] (of `num_splits`); the original model's `logits` [B, P, V] at P positions per row
    (every position, or those the program reads out: model.Span's `readout`), with there
    the next tokens `targets` [B, P], whether each is `scored` [B, P] (an evaluated position)
    and its split `scored_splits` [B, P]."""

    tokens: jax.Array
    split_ids: jax.Array
    num_splits: int
    logits: jax.Array
    targets: jax.Array
    scored: jax.Array
    scored_splits: jax.Array


def _proxy_input(module, model_params, model_cfg, site: str, cache: dict) -> jax.Array:
    if proxies.hook(module, "input_site") is not None:
        return module.input_of(model_params, model_cfg, site,
                               cache[module.input_site(site, model_cfg)])
    return cache[site]


def _weights(batch: Batch):
    """Split weights [B, T, K] of the tokens, and [B, P, K] of the scored positions."""
    def split_weights(split_ids, weight):
        onehot = jax.nn.one_hot(split_ids, batch.num_splits, dtype=jnp.float32)
        return onehot * weight.astype(jnp.float32)[..., None]

    return (split_weights(batch.split_ids, batch.tokens != tasks.PAD),
            split_weights(batch.scored_splits, batch.scored))


def seed_sums(active: dict, cache: dict, batch: Batch, zero_logits: jax.Array) -> dict:
    """One seed's sums per split [K, ...] that do not depend on the proxy's size: token counts,
    the sums and sums of squares of the sites of `active` (its keys: the program's sites; for
    the variance in fvu), and the original's and the zero ablation's CE and KL at the evaluated
    positions. `cache`: the original pass's site values; `zero_logits`: the pass with the
    sites of `active` whose flag is True zeroed."""
    tokens, logits, targets = batch.tokens, batch.logits, batch.targets
    per_token, per_eval = _weights(batch)
    out = {"count": per_token.sum((0, 1)), "evaluated": per_eval.sum((0, 1)),
           "ce_original": jnp.einsum("bt,btk->k", _dictionary.cross_entropy(logits, targets),
                                     per_eval),
           "ce_zero": jnp.einsum("bt,btk->k", _dictionary.cross_entropy(zero_logits, targets),
                                 per_eval),
           "kl_zero": jnp.einsum("bt,btk->k", _dictionary.kl_divergence(logits, zero_logits),
                                 per_eval)}
    for site in active:
        x = cache[site].reshape(*tokens.shape, -1).astype(jnp.float32)
        out[f"sum/{site}"] = jnp.einsum("btd,btk->kd", x, per_token)
        out[f"sumsq/{site}"] = jnp.einsum("btd,btk->kd", x * x, per_token)
    return out


def size_sums(module, size_params: dict, model_params, model_cfg, active: dict, cache: dict,
              batch: Batch, proxy_logits: jax.Array) -> dict:
    """One seed's, one size's sums per split: the squared reconstruction error per site [K],
    how often each latent fired per site [K, G, W] (proxies with `latents`), and the proxy's CE
    and KL [K], for the sites of `active` (its keys); those whose flag is False contribute
    zeros. `proxy_logits`: the pass with this size's proxy; model_params, model_cfg: the seed's
    model (a transcoder's input, `_proxy_input`)."""
    tokens, logits, targets = batch.tokens, batch.logits, batch.targets
    split_ids, num_splits = batch.split_ids, batch.num_splits
    per_token, per_eval = _weights(batch)
    out = {"ce_proxy": jnp.einsum("bt,btk->k", _dictionary.cross_entropy(proxy_logits, targets),
                                  per_eval),
           "kl_proxy": jnp.einsum("bt,btk->k", _dictionary.kl_divergence(logits, proxy_logits),
                                  per_eval)}
    valid = tokens != tasks.PAD
    for site in active:
        params, value = size_params[site], cache[site]

        def site_sums(params=params, value=value, site=site) -> dict:
            x = _proxy_input(module, model_params, model_cfg, site, cache)
            x_hat = apply_grouped(module, params, x, value)
            err = jnp.sum(((value - x_hat) ** 2).reshape(*tokens.shape, -1), -1)
            sums = {f"err/{site}": jnp.einsum("bt,btk->k", err, per_token)}
            if proxies.hook(module, "latents") is not None:
                grouped = x if x.ndim == 4 else x[:, :, None, :]
                idx, on = jax.vmap(module.latents, in_axes=(0, 2), out_axes=2)(params, grouped)
                groups, width = params["mask"].shape
                # One flat bin per (split, head, latent): a scatter-add, not a dense code.
                index = (split_ids[:, :, None, None] * groups
                         + jnp.arange(groups)[None, None, :, None]) * width + idx
                fired = (on & valid[:, :, None, None]).reshape(-1).astype(jnp.float32)
                sums[f"fired/{site}"] = jnp.zeros(num_splits * groups * width).at[
                    index.reshape(-1)].add(fired).reshape(num_splits, groups, width)
            return sums

        # A site of the method's program that this family does not simplify costs nothing.
        shapes = jax.eval_shape(site_sums)
        out |= jax.lax.cond(active[site], site_sums,
                            lambda shapes=shapes: jax.tree.map(
                                lambda a: jnp.zeros(a.shape, a.dtype), shapes))
    return out


def columns(spec, params: dict, seed: dict, size: dict) -> np.ndarray:
    """A family's summed metrics (seed: leaves [S, K, ...]; size: [S, R, K, ...]) and fitted
    params ({site: leaves [S, G, R, ...]}) -> [S, R, K, M] float64, the M metrics in the order
    of schema.DICTIONARY_METRICS, NaN where a metric is undefined: no latents (l0, dead of
    svd/pca), or a denominator that is not positive or within DENOMINATOR_MARGIN of its float32
    rounding (module docstring)."""
    f64 = {k: np.asarray(v, np.float64) for k, v in (*seed.items(), *size.items())}
    count = f64["count"]  # [S, K]
    total = sum((f64[f"sumsq/{s}"] - f64[f"sum/{s}"] ** 2 / np.maximum(count, 1)[..., None]
                 ).sum(-1) for s in spec.sites)  # [S, K]
    # The variance's rounding: sumsq and sum^2/n each carry about eps * sqrt(n) * sumsq
    # (Cauchy-Schwarz: sum^2 <= n * sumsq; the square doubles the sum's relative error), and
    # each square its own eps: a site of large mean and small spread cancels them.
    sumsq = sum(f64[f"sumsq/{s}"].sum(-1) for s in spec.sites)  # [S, K]
    total_error = EPS32 * (3 * np.sqrt(count) + 1) * sumsq
    err = sum(f64[f"err/{s}"] for s in spec.sites)  # [S, R, K]
    nan = np.full(err.shape, np.nan)
    l0 = dead = nan
    if all(f"fired/{s}" in f64 for s in spec.sites):
        fired, latents, masked = 0.0, 0.0, 0.0
        for s in spec.sites:
            mask = np.moveaxis(np.asarray(params[s]["mask"], bool), 2, 1)[:, :, None]  # S,R,1,G,W
            counts = f64[f"fired/{s}"]  # [S, R, K, G, W]
            fired = fired + counts.sum((-2, -1))
            latents = latents + (mask & (counts == 0)).sum((-2, -1))
            masked = masked + mask.sum((-2, -1))
        groups = sum(np.shape(params[s]["mask"])[1] for s in spec.sites)
        with np.errstate(invalid="ignore", divide="ignore"):
            l0 = fired / (count[:, None] * groups)
            dead = latents / masked
    evaluated = np.maximum(f64["evaluated"], 1)

    def mean(name: str) -> np.ndarray:
        value = f64[name] / (evaluated if f64[name].ndim == 2 else evaluated[:, None])
        return value if value.ndim == 3 else value[:, None]

    n = evaluated[:, None]
    ce_original, ce_zero, ce_proxy = mean("ce_original"), mean("ce_zero"), mean("ce_proxy")
    kl_zero = mean("kl_zero")
    # _dictionary's definitions, each ratio's denominator checked against its rounding: CE
    # terms are computed from log-probabilities of about the size of the loss itself; KL(p || q)
    # from log p and log q, whose p-weighted sizes are H(p) and H(p) + KL, with H(p) about the
    # original's loss (its expected value for a calibrated model).
    ce_error = (mean_rounding(ce_zero, n, ce_zero)
                + mean_rounding(ce_original, n, ce_original))
    kl_error = mean_rounding(kl_zero, n, 2 * ce_original + kl_zero)
    with np.errstate(invalid="ignore", divide="ignore"):
        fvu = np.where(defined(total, total_error)[:, None], err / total[:, None], np.nan)
        ce = np.where(defined(ce_zero - ce_original, ce_error),
                      _dictionary.ce_score(ce_original, ce_proxy, ce_zero), np.nan)
        kl = np.where(defined(kl_zero, kl_error),
                      _dictionary.kl_score(mean("kl_proxy"), kl_zero), np.nan)
    named = {"fvu": fvu, "l0": l0, "dead": dead, "ce_score": ce, "kl_score": kl}
    out = np.stack(np.broadcast_arrays(*(named[m] for m in schema.DICTIONARY_METRICS)), axis=-1)
    return np.where(np.isfinite(out), out, np.nan)
