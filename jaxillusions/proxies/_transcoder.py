"""Sparse transcoder: a TopK dictionary from an MLP's input (after its layer norm) to the MLP's
output, with the SAE's sparsity, dead-latent loss and training (proxies/sae.py, `sae.train`):

    z = TopK(ReLU(W_enc^T (h - b_in) + b_enc)),   mlp_out_hat = b_dec + W_dec^T z,   |d_i| = 1.

Replacing a whole MLP needs the block's input at its output site. `intervention` does this with
the ordinary intervention protocol and no flag in the model: it keeps `blocks.{i}.resid_mid`
when `forward` visits it and, at `blocks.{i}.mlp.out` (visited later in the same trace), returns
the transcoder applied to `model.mlp_input` of it (the MLP's layer norm). Site names are
unchanged; the model's own MLP output is then unused, and XLA drops its computation.

Not yet a proxy method (the leading underscore keeps it out of proxies.available()): the engine
collects one site's samples per statistic, while a transcoder needs the pairs (MLP input, MLP
output) at the same positions, and its intervention needs the seed's model parameters (the
layer norm). Until that is wired, `fit` takes the pairs directly.
"""

import jax

from jaxillusions import model as model_lib
from jaxillusions.proxies import sae

SITE = "vector"
SIZES_KEY = "transcoder_sizes"
SIZE_LABEL = sae.SIZE_LABEL


def fit(
    stats: dict,
    sizes: tuple[int, ...],
    *,
    key: jax.Array,
    k: int = sae.DEFAULTS["sae_k"][0],
    steps: int = sae.DEFAULTS["sae_steps"],
    lr: float = sae.DEFAULTS["sae_lr"],
    batch_size: int = sae.DEFAULTS["sae_batch"],
    k_aux: int | None = None,
    aux_coeff: float = 1.0 / 32.0,
    dead_steps: int = 50,
) -> dict:
    """{"x": MLP inputs [N, F_in], "y": MLP outputs [N, F_out], "valid": [N]} -> sae.fit's
    params with W_enc [R, F_in, W], W_dec [R, W, F_out] and the input bias "b_in" [R, F_in].
    Sizes and options as sae.fit."""
    return sae.train(stats["x"], stats["y"], stats["valid"], sizes, key=key, k=k, steps=steps,
                     lr=lr, batch_size=batch_size, k_aux=k_aux, aux_coeff=aux_coeff,
                     dead_steps=dead_steps)


def apply(params: dict, x: jax.Array) -> jax.Array:
    """One size's params, MLP input x [..., F_in] -> predicted MLP output [..., F_out]."""
    return sae.apply(params, x)


encode = sae.encode


def intervention(site_params: dict, model_params: dict) -> model_lib.Intervention:
    """{"blocks.{i}.mlp.out": one size's transcoder params}, one model's params -> an
    intervention for `model.forward` that replaces each of those MLPs by its transcoder."""
    inputs = {}  # block -> its resid_mid in the forward pass being traced

    def replace(name: str, value: jax.Array) -> jax.Array:
        parts = name.split(".")
        block = ".".join(parts[:2])
        if name.endswith(".resid_mid") and f"{block}.mlp.out" in site_params:
            inputs[block] = value
        elif name in site_params:
            mlp_in = model_lib.mlp_input(model_params, int(parts[1]), inputs.pop(block))
            return apply(site_params[name], mlp_in).astype(value.dtype)
        return value

    return replace
