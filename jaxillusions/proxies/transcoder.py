"""Sparse transcoder proxy: a TopK dictionary from an MLP's input (after its layer norm) to the
MLP's output, with the SAE's sparsity, dead-latent loss and training (proxies/sae.py,
`sae.train`):

    z = TopK(ReLU(W_enc^T (h - b_in) + b_enc)),   mlp_out_hat = b_dec + W_dec^T z,   |d_i| = 1.

Its target is an MLP's output site, `blocks.<l>.mlp.out` (proxies.transcoder_targets, e.g.
("blocks.0.mlp.out", "blocks.-1.mlp.out")); it replaces the whole MLP. Replacing a whole MLP
needs the block's input at its output site: the engine caches `input_site(site)`
(`blocks.<l>.resid_mid`) when `forward` visits it and, at the output site (visited later in the
same trace), applies the transcoder to `input_of` it (`model.mlp_input`, the MLP's layer norm).
This is the ordinary intervention protocol with no flag in the model; site names are unchanged,
the model's own MLP output is unused and XLA drops its computation. An imported architecture
whose MLP reads otherwise (parallel attention and MLP, another layer-norm epsilon) is refused at
the door (`check_model`).

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


def input_site(site: str) -> str:
    """The site whose value the transcoder of `site` reads: the block's resid_mid."""
    return f"blocks.{_layer(site)}.resid_mid"


def input_of(model_params: dict, site: str, value: jax.Array) -> jax.Array:
    """The value of input_site(site) -> the MLP's input (its layer norm), as forward computes."""
    return model_lib.mlp_input(model_params, _layer(site), value)


def check_model(model_cfg: model_lib.ModelConfig, target: str) -> None:
    """One-line ValueError for a model whose MLP input is not input_of(resid_mid): attention
    and MLP in parallel (the MLP reads resid_pre) or layer norms of another epsilon (imported
    checkpoints, model.pretrained)."""
    default = model_lib.ModelConfig.__dataclass_fields__["ln_eps"].default
    if model_cfg.parallel_residual or model_cfg.ln_eps != default:
        what = ("attention and MLP in parallel (the MLP reads resid_pre)"
                if model_cfg.parallel_residual else f"layer norms of epsilon {model_cfg.ln_eps}")
        raise ValueError(f"proxies.transcoder_targets: the transcoder of {target} reads the "
                         f"MLP's input as the layer norm of resid_mid at epsilon {default}, "
                         f"but this model has {what}; leave transcoder out of proxies.methods")


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


def intervention(site_params: dict, model_params: dict) -> model_lib.Intervention:
    """{"blocks.{i}.mlp.out": one size's transcoder params}, one model's params -> an
    intervention for `model.forward` that replaces each of those MLPs by its transcoder (the
    engine's own is faithfulness.fit.make_intervention, with a head axis and per-site flags)."""
    inputs = {}  # output site -> its MLP input in the forward pass being traced

    def replace(name: str, value: jax.Array) -> jax.Array:
        for site in site_params:
            if name == input_site(site):
                inputs[site] = input_of(model_params, site, value)
        if name in site_params:
            return apply(site_params[name], inputs.pop(name)).astype(value.dtype)
        return value

    return replace
