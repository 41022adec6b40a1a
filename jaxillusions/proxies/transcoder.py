"""Sparse transcoder proxy: a TopK dictionary from an MLP's input (after its layer norm) to the
MLP's output, with the SAE's sparsity, dead-latent loss and training (proxies/sae.py,
`sae.train`):

    z = TopK(ReLU(W_enc^T (h - b_in) + b_enc)),   mlp_out_hat = b_dec + W_dec^T z,   |d_i| = 1.

Its target is an MLP's output site, `blocks.<l>.mlp.out` (proxies.transcoder_targets, e.g.
("blocks.0.mlp.out", "blocks.-1.mlp.out")); it replaces the whole MLP. Replacing a whole MLP
needs the block's input at its output site: the engine caches `input_site(site, model_cfg)`,
the residual stream the MLP reads (`blocks.<l>.resid_mid`; with attention and MLP in parallel,
GPT-NeoX/Pythia, `blocks.<l>.resid_pre`), when `forward` visits it and, at the output site
(visited later in the same trace), applies the transcoder to `input_of` it (`model.mlp_input`,
the MLP's layer norm at the model's epsilon, model.ln_eps). This is the ordinary intervention
protocol with no flag in the model; site names are unchanged, the model's own MLP output is
unused and XLA drops its computation. In a parallel block too the MLP's output is the term
`mlp.out` that resid_post adds, so replacing that site replaces the whole MLP.

Fitted on the "pairs" statistic: the MLP's input and output at the same training positions
(proxies.kmeans_samples of them, as the SAE's sample). Widths are proxies.transcoder_sizes; k,
steps, learning rate and batch are the SAE's options (proxies.sae_k, sae_steps, sae_lr,
sae_batch), so that both dictionaries are trained alike.
"""

import jax

from jaxillusions import model as model_lib
from jaxillusions.proxies import sae

STATISTIC = "pairs"
SITE = "vector"
SIZES_KEY = "transcoder_sizes"
SIZE_LABEL = sae.SIZE_LABEL


def _layer(site: str) -> int | None:
    """blocks.<l>.mlp.out -> l (resolved, non-negative); None for any other site."""
    parts = site.split(".")
    if len(parts) == 4 and parts[0] == "blocks" and parts[2:] == ["mlp", "out"] \
            and parts[1].isdigit():
        return int(parts[1])
    return None


def input_site(site: str, model_cfg: model_lib.ModelConfig) -> str:
    """The site whose value the transcoder of `site` reads, visited earlier by forward: the
    block's resid_mid, or its resid_pre where attention and MLP run in parallel."""
    return f"blocks.{_layer(site)}.{'resid_pre' if model_cfg.parallel_residual else 'resid_mid'}"


def input_of(model_params: dict, model_cfg: model_lib.ModelConfig, site: str,
             value: jax.Array) -> jax.Array:
    """The value of input_site(site, model_cfg) -> the MLP's input (its layer norm at the
    model's epsilon), as forward computes it."""
    return model_lib.mlp_input(model_params, _layer(site), value, model_cfg.ln_eps)


def settings(proxy_cfg, dim: int) -> tuple[tuple[int, ...], tuple]:
    """Widths from proxies.transcoder_sizes; the options (and k values) of the SAE."""
    return sae.settings(proxy_cfg, dim, SIZES_KEY)


def check(sizes: tuple[int, ...], proxy_cfg, dim: int, target: str) -> None:
    """One-line ValueError for a target that is not an MLP output, or a bad SAE option."""
    for site in target.split(" ")[0].split("+"):
        if _layer(site) is None:
            raise ValueError(f"transcoder target {site}: must be an MLP's output "
                             "blocks.<layer>.mlp.out (set proxies.transcoder_targets)")
    sae.check(sizes, proxy_cfg, dim, target, SIZES_KEY)


def fit(
    stats: dict,
    sizes: tuple[int, ...],
    *,
    key: jax.Array,
    k: int = sae.DEFAULTS["sae_k"][0],
    steps: int = sae.DEFAULTS["sae_steps"],
    lr: float = sae.DEFAULTS["sae_lr"],
    batch_size: int = sae.DEFAULTS["sae_batch"],
    aux: sae.AuxK = sae.AuxK(),  # noqa: B008 - frozen (immutable), as in sae.fit
) -> dict:
    """{"x": MLP inputs [N, F_in], "y": MLP outputs [N, F_out], "valid": [N]} -> sae.fit's
    params with W_enc [R, F_in, W], W_dec [R, W, F_out] and the input bias "b_in" [R, F_in].
    Sizes and options as sae.fit."""
    return sae.train({"x": stats["x"], "y": stats["y"], "valid": stats["valid"]}, sizes,
                     key=key, k=k, steps=steps, lr=lr, batch_size=batch_size, aux=aux)


def apply(params: dict, x: jax.Array) -> jax.Array:
    """One size's params, MLP input x [..., F_in] -> predicted MLP output [..., F_out]."""
    return sae.apply(params, x)


encode = sae.encode
latents = sae.latents


def intervention(site_params: dict, model_params: dict,
                 model_cfg: model_lib.ModelConfig) -> model_lib.Intervention:
    """{"blocks.{i}.mlp.out": one size's transcoder params}, one model's params and config ->
    an intervention for `model.forward` that replaces each of those MLPs by its transcoder (the
    engine's own is faithfulness.fit.make_intervention, with a head axis and per-site flags)."""
    inputs = {}  # output site -> its MLP input in the forward pass being traced

    def replace(name: str, value: jax.Array) -> jax.Array:
        for site in site_params:
            if name == input_site(site, model_cfg):
                inputs[site] = input_of(model_params, model_cfg, site, value)
        if name in site_params:
            return apply(site_params[name], inputs.pop(name)).astype(value.dtype)
        return value

    return replace
