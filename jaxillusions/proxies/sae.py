"""TopK sparse autoencoder proxy: x -> b_dec + sum over the k largest latents of z_i d_i.

    z = TopK(ReLU(W_enc^T (x - b_dec) + b_enc)),   x_hat = b_dec + W_dec^T z,   |d_i| = 1,

with untied encoder and decoder, the pre-encoder bias b_dec subtracted before encoding and added
back, and the decoder rows d_i renormalised to unit norm after every step (Gao et al. 2024).

Why TopK (not BatchTopK or JumpReLU): k is exact for every token, so "k active latents" means the
same on every split, in and out of distribution; there is no threshold to tune or to estimate
after training (BatchTopK needs one at inference, JumpReLU learns one per latent with a
straight-through estimator and an L0 coefficient to tune); and the proxy is a deterministic
function of one token's activation, as the other proxies are. BatchTopK would let a token use
more latents than k, which on a shifted split is exactly the quantity that would drift.

Against dead latents: the AuxK loss of Gao et al. A latent is dead once it has not fired for
`dead_steps` steps; the residual e = x - x_hat (no gradient into it) is reconstructed from the
top `k_aux` dead latents, and alpha * |e - e_hat|^2 / |e|^2 is added to the loss. Encoder columns
start as the decoder rows (transpose init), b_dec at the mean of the sample.

All sizes are fitted in one program. Widths differ, so every dictionary is padded to the largest
width with a latent mask (as svd masks ranks): masked latents never fire, so their parameters
get zero gradients and Adam leaves them unchanged; vmap over sizes is inside one lax.scan over
steps, and the caller vmaps fit over seeds and heads. All sizes see the same minibatches, and
latent i starts from fold_in(key, i), so a size's fit does not depend on the other sizes: it
equals fitting that size alone (to float32 rounding, see tests/test_sae.py).

Sizes: a size is a dictionary width, trained with the option `k`; with several proxies.sae_k,
a size is the code k * K_BASE + width (`size_code`, `width_and_k`), so the sizes axis is the
product widths x ks. The loss is the MSE normalised by the sample's variance (scale free, so one
learning rate suits every site). Training uses proxies.kmeans_samples vectors (the "samples"
statistic), in minibatches drawn with replacement.
"""

import dataclasses

import jax
import jax.numpy as jnp
import optax

from jaxillusions.config.fields import INT, INTS, NUMBER, positive, setting

STATISTIC = "samples"
SITE = "vector"
SIZES_KEY = "sae_sizes"
SIZE_LABEL = "width (k * 100000 + width with several sae_k)"
K_BASE = 100_000  # a size code k * K_BASE + width; a plain width (< K_BASE) uses the option k
# The defaults of fit() and of its keys of config.proxies (the transcoder shares them).
DEFAULTS = {"sae_k": (4,), "sae_steps": 1000, "sae_lr": 1e-3, "sae_batch": 256}
# Its own keys of config.proxies (the Proxies section gains them: config/settings.py).
OPTIONS = {
    "sae_sizes": setting((32, 64, 128), INTS, "sae sizes >= 1 (dictionary widths, at most 99999)",
                         lambda v, s: len(v) >= 1 and all(1 <= w < K_BASE for w in v)),
    "sae_k": setting(DEFAULTS["sae_k"], INTS, "k values >= 1, at least one",
                     lambda v, s: len(v) >= 1 and all(k >= 1 for k in v),
                     "TopK's k; several: every width x every k"),
    "sae_steps": setting(DEFAULTS["sae_steps"], INT, ">= 1", positive),
    "sae_lr": setting(DEFAULTS["sae_lr"], NUMBER, "> 0", lambda v, s: v > 0),
    "sae_batch": setting(DEFAULTS["sae_batch"], INT, ">= 1", positive),
}

_HI = jax.lax.Precision.HIGHEST  # full float32 matmuls on accelerators too (TF32 by default)


@dataclasses.dataclass(frozen=True)
class AuxK:
    """The dead-latent loss (module docstring): a latent that has not fired for `dead_steps`
    steps is dead; the top `k` dead latents (None: F // 2 of the target's F features, as Gao et
    al.'s d_model / 2; at most the width) reconstruct the residual, weighted by `coeff` (alpha).
    Static settings (hashable), not config keys."""

    k: int | None = None
    coeff: float = 1.0 / 32.0
    dead_steps: int = 50


def size_code(width: int, k: int) -> int:
    """The size that stands for (width, k)."""
    return k * K_BASE + width


def width_and_k(size: int, k: int) -> tuple[int, int]:
    """A size -> (width, k); `k` is used for a plain width (the option k)."""
    code_k, width = divmod(size, K_BASE)
    return width, code_k or k


def _ks(proxy_cfg) -> tuple[int, ...]:
    return tuple(sorted(set(proxy_cfg.sae_k)))


def settings(proxy_cfg, dim: int, sizes_key: str = SIZES_KEY) -> tuple[tuple[int, ...], tuple]:
    """Widths from proxies.sae_sizes (times the k values of proxies.sae_k when there are
    several); options k, steps, lr and batch_size from proxies.sae_k/sae_steps/sae_lr/sae_batch.
    `sizes_key`: the widths' key (the transcoder shares the options, not the widths)."""
    del dim
    widths, ks = tuple(getattr(proxy_cfg, sizes_key)), _ks(proxy_cfg)
    sizes = widths if len(ks) == 1 else tuple(size_code(w, k) for w in widths for k in ks)
    options = (("k", ks[0] if ks else 0),  # no k: check() says so
               ("steps", proxy_cfg.sae_steps), ("lr", float(proxy_cfg.sae_lr)),
               ("batch_size", proxy_cfg.sae_batch))
    return sizes, options


def _check(pairs: list[tuple[int, int]], steps: int, lr: float, batch_size: int,
           where: str = "") -> None:
    """One-line ValueError for the first bad setting; pairs are (width, k)."""
    for width, k in pairs:
        if not 1 <= width < K_BASE:
            raise ValueError(f"{where}sae width {width}: must be 1..{K_BASE - 1}")
        if not 1 <= k <= width:
            raise ValueError(f"{where}sae k={k} for width {width}: must be 1..width")
    if steps < 1:
        raise ValueError(f"{where}sae steps={steps}: must be >= 1")
    if not lr > 0:
        raise ValueError(f"{where}sae learning rate={lr}: must be > 0")
    if batch_size < 1:
        raise ValueError(f"{where}sae batch={batch_size}: must be >= 1")


def check(sizes: tuple[int, ...], proxy_cfg, dim: int, target: str,
          sizes_key: str = SIZES_KEY) -> None:
    """One-line ValueError for widths < 1, k outside 1..width, steps < 1, lr <= 0, batch < 1."""
    del sizes, dim  # the config's own values, so the message names them
    widths, ks = tuple(getattr(proxy_cfg, sizes_key)), _ks(proxy_cfg)
    if not ks:
        raise ValueError(f"{target}: proxies.sae_k=(): must list at least one k >= 1")
    _check([(w, k) for w in widths for k in ks], proxy_cfg.sae_steps, proxy_cfg.sae_lr,
           proxy_cfg.sae_batch,
           where=f"{target}: proxies.{sizes_key}={widths}, sae_k={ks}: ")


def _topk(pre: jax.Array, kmask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """pre [..., W] (masked latents -inf), kmask [K] -> values [..., K] (0 past k or if
    negative: ReLU), indices [..., K]. Ties go to the lower index (lax.top_k)."""
    vals, idx = jax.lax.top_k(pre, kmask.shape[-1])
    return jnp.where(kmask, jnp.maximum(vals, 0.0), 0.0), idx


def _pre(params: dict, x: jax.Array) -> jax.Array:
    # The pre-encoder bias is b_dec for an autoencoder, b_in for a transcoder.
    bias = params["b_in"] if "b_in" in params else params["b_dec"]
    pre = jnp.matmul(x - bias, params["W_enc"], precision=_HI) + params["b_enc"]
    return jnp.where(params["mask"], pre, -jnp.inf)


def _decode(params: dict, vals: jax.Array, idx: jax.Array) -> jax.Array:
    # A gather of k rows per token, not a dense [W] code: k << W.
    return params["b_dec"] + jnp.einsum("...k,...kf->...f", vals, params["W_dec"][idx],
                                        precision=_HI)


def encode(params: dict, x: jax.Array) -> jax.Array:
    """One size's params, x [..., F] -> dense codes [..., W_max] (zero for masked latents)."""
    vals, idx = _topk(_pre(params, x.astype(jnp.float32)), params["kmask"])
    one_hot = jax.nn.one_hot(idx, params["mask"].shape[-1], dtype=jnp.float32)
    return jnp.einsum("...k,...kw->...w", vals, one_hot)


def latents(params: dict, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """One size's params, x [..., F] -> the code in sparse form: latent indices [..., K] and
    whether each is active [..., K] (the dictionary metrics l0 and dead count these)."""
    vals, idx = _topk(_pre(params, x.astype(jnp.float32)), params["kmask"])
    return idx, vals > 0


def apply(params: dict, x: jax.Array) -> jax.Array:
    """One size's params, x [..., F] -> reconstruction, same shape and dtype."""
    vals, idx = _topk(_pre(params, x.astype(jnp.float32)), params["kmask"])
    return _decode(params, vals, idx).astype(x.dtype)


def _unit_rows(w: jax.Array) -> jax.Array:
    return w / jnp.maximum(jnp.linalg.norm(w, axis=-1, keepdims=True), 1e-12)


def _loss(p: dict, m: dict, xb: jax.Array, yb: jax.Array, dead: jax.Array, *,
          variance: jax.Array, k_aux: int, aux_coeff: float) -> tuple[jax.Array, jax.Array]:
    """One size's trained params p, masks m, batch xb [B, F_in] -> target yb [B, F_out], dead
    bool [W] -> (normalised MSE + aux_coeff * AuxK loss, which latents fired [W])."""
    p = {**p, **m}
    pre = _pre(p, xb)
    vals, idx = _topk(pre, m["kmask"])
    recon = _decode(p, vals, idx)
    main = jnp.mean(jnp.sum((yb - recon) ** 2, -1)) / variance
    # AuxK: the top k_aux dead latents reconstruct the residual (held fixed).
    err = jax.lax.stop_gradient(yb - recon)
    aux_vals, aux_idx = jax.lax.top_k(jnp.where(dead, pre, -jnp.inf), k_aux)
    aux_vals = jnp.maximum(aux_vals, 0.0)
    aux_rec = jnp.einsum("bk,bkf->bf", aux_vals, p["W_dec"][aux_idx], precision=_HI)
    aux = jnp.sum((err - aux_rec) ** 2) / jnp.maximum(jnp.sum(err**2), 1e-12)
    aux = jnp.where(jnp.any(dead), aux, 0.0)
    fired = jnp.zeros(pre.shape[-1]).at[idx.reshape(-1)].add((vals > 0).reshape(-1))
    return main + aux_coeff * aux, fired > 0


def fit(
    stats: dict,
    sizes: tuple[int, ...],
    *,
    key: jax.Array,
    k: int = DEFAULTS["sae_k"][0],
    steps: int = DEFAULTS["sae_steps"],
    lr: float = DEFAULTS["sae_lr"],
    batch_size: int = DEFAULTS["sae_batch"],
    aux: AuxK = AuxK(),
) -> dict:
    """{"x": [N, F], "valid": [N]} -> {"W_enc": [R, F, W], "b_enc": [R, W], "W_dec": [R, W, F],
    "b_dec": [R, F], "mask": [R, W] bool, "kmask": [R, K] bool}, W = max width, K = max k.

    Sizes are widths or size codes (see width_and_k); k is clipped to the width, as svd clips
    ranks to F (validate's check rejects k > width in a config). `aux`: the AuxK dead-latent
    loss's settings."""
    return train({"x": stats["x"], "valid": stats["valid"]}, sizes, key=key, k=k, steps=steps,
                 lr=lr, batch_size=batch_size, aux=aux)


def train(stats: dict, sizes: tuple[int, ...], *, key: jax.Array, k: int, steps: int,
          lr: float, batch_size: int, aux: AuxK) -> dict:
    """fit() of a dictionary from stats["x"] [N, F_in] to stats["y"] [N, F_out] at the rows
    where stats["valid"] [N] (no "y": to x itself, an autoencoder with the pre-encoder bias
    b_dec). With a target y (a transcoder) the input has its own bias b_in (started at the mean
    of x) and the encoder columns start as unit random directions; params then also hold
    "b_in" [R, F_in]."""
    x, y, valid = stats["x"], stats.get("y"), stats["valid"]
    k_aux, aux_coeff, dead_steps = aux.k, aux.coeff, aux.dead_steps
    pairs = [width_and_k(s, k) for s in sizes]
    _check([(w, min(kk, w)) for w, kk in pairs], steps, lr, batch_size)
    pairs = [(w, min(kk, w)) for w, kk in pairs]
    rows_ok = valid[:, None]
    x = jnp.where(rows_ok, x.astype(jnp.float32), 0.0)
    target = x if y is None else jnp.where(rows_ok, y.astype(jnp.float32), 0.0)
    wmax, kmax = max(w for w, _ in pairs), max(kk for _, kk in pairs)
    k_aux = min(k_aux or max(target.shape[1] // 2, 1), wmax)
    count = jnp.maximum(valid.sum(), 1)
    mean = target.sum(0) / count
    # Loss normalised by the target's variance: the learning rate does not depend on the scale.
    variance = jnp.maximum(jnp.sum(jnp.where(rows_ok, (target - mean) ** 2, 0.0)) / count,
                           1e-12)
    # Valid rows first (stable), so a uniform draw below count indexes a valid row.
    order = jnp.argsort(~valid, stable=True)
    init_key, batch_key = jax.random.split(key)

    def directions(key: jax.Array, dim: int) -> jax.Array:
        # Latent i's direction from fold_in(key, i): the first w rows do not depend on wmax.
        return _unit_rows(jax.vmap(lambda i: jax.random.normal(jax.random.fold_in(key, i),
                                                               (dim,)))(jnp.arange(wmax)))

    dec_key, enc_key = jax.random.split(init_key)
    w_dec = directions(dec_key, target.shape[1])
    one = {"W_enc": w_dec.T, "b_enc": jnp.zeros(wmax), "W_dec": w_dec, "b_dec": mean}
    if y is not None:
        one |= {"W_enc": directions(enc_key, x.shape[1]).T, "b_in": x.sum(0) / count}
    masks = {"mask": jnp.arange(wmax)[None, :] < jnp.asarray([w for w, _ in pairs])[:, None],
             "kmask": jnp.arange(kmax)[None, :] < jnp.asarray([kk for _, kk in pairs])[:, None]}
    params = jax.tree.map(lambda a: jnp.broadcast_to(a, (len(pairs), *a.shape)), one)
    optimizer = optax.adam(lr)

    def one_size(p: dict, opt: optax.OptState, idle: jax.Array, m: dict, xb: jax.Array,
                 yb: jax.Array):
        dead = (idle >= dead_steps) & m["mask"]
        grads, fired = jax.grad(_loss, has_aux=True)(p, m, xb, yb, dead, variance=variance,
                                                     k_aux=k_aux, aux_coeff=aux_coeff)
        updates, opt = optimizer.update(grads, opt, p)
        p = optax.apply_updates(p, updates)
        p = {**p, "W_dec": _unit_rows(p["W_dec"])}
        return p, opt, jnp.where(fired, 0, idle + 1)

    def step(carry: tuple, i: jax.Array) -> tuple:
        p, opt, idle = carry
        rows = order[jax.random.randint(jax.random.fold_in(batch_key, i), (batch_size,), 0,
                                        count)]
        return jax.vmap(one_size, in_axes=(0, 0, 0, 0, None, None))(
            p, opt, idle, masks, x[rows], target[rows]), None

    carry = (params, jax.vmap(optimizer.init)(params), jnp.zeros((len(pairs), wmax), jnp.int32))
    params = jax.lax.scan(step, carry, jnp.arange(steps))[0][0]
    return {**params, **masks}
