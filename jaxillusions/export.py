"""Export a trained seed to TransformerLens (`HookedTransformer`), and the site-name map both ways.

    from jaxillusions import export
    tl_model = export.from_workdir("runs/dyck_small", seed=0)        # a HookedTransformer
    logits, cache = tl_model.run_with_cache(tokens)                   # tokens: torch int [B, T]
    cache[export.tl_name("blocks.1.attn.k")]                           # our site, TL's hook

Needs the optional extra `export` (torch and transformer-lens 3.x, which still has
`HookedTransformer`; see the README for the exact install). Our model maps onto a standard
TransformerLens config: pre-LayerNorm blocks (eps 1e-5), tanh GELU (TL's `gelu_new`), attention
scaled by 1/sqrt(d_head), no key bias (TL's b_K is set to zero), and `w_q/k/v` stored as
[d_model, head, d_head] (TL: [head, d_model, d_head]). Every position encoding becomes TL's
"standard" W_pos table: learned as is, sinusoidal and linear as the table they compute, none as
zeros. Frozen one-hot token embeddings export as the table they are. Layers with frozen uniform
attention and the minimal first layer (Wen et al.) have no TL counterpart and are refused.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from jaxillusions import model as model_lib

# Our block sites -> TransformerLens hook names (within blocks.{i}).
_BLOCK_HOOKS = {
    "resid_pre": "hook_resid_pre",
    "attn.q": "attn.hook_q",
    "attn.k": "attn.hook_k",
    "attn.v": "attn.hook_v",
    "attn.scores": "attn.hook_attn_scores",
    "attn.pattern": "attn.hook_pattern",
    "attn.z": "attn.hook_z",
    "attn.out": "hook_attn_out",
    "resid_mid": "hook_resid_mid",
    "mlp.hidden": "mlp.hook_post",
    "mlp.out": "hook_mlp_out",
    "resid_post": "hook_resid_post",
}
# Not mapped: `ln_final` (TL's ln_final.hook_normalized is before the LayerNorm's scale and bias,
# ours after: ours = hook_normalized * ln_final.w + ln_final.b) and `logits` (TL's output).
_TOP_HOOKS = {"embed": "hook_embed", "pos_embed": "hook_pos_embed"}
_BLOCK_SITES = {v: k for k, v in _BLOCK_HOOKS.items()}
_TOP_SITES = {v: k for k, v in _TOP_HOOKS.items()}


def _translate(name: str, top: dict[str, str], block: dict[str, str], what: str,
               missing: str) -> str:
    """Looks `name` up in the top-level map, or as blocks.<i>.<part> in the block map."""
    if name in top:
        return top[name]
    parts = name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blocks" and parts[1].isdigit() and parts[2] in block:
        return f"blocks.{parts[1]}.{block[parts[2]]}"
    raise ValueError(f"{what} {name!r} has no {missing}; {what}s: {', '.join(top)}, "
                     f"blocks.<i>.{{{', '.join(block)}}}")


def tl_name(site: str) -> str:
    """Our site name -> the TransformerLens hook with the same value, e.g.
    'blocks.1.attn.out' -> 'blocks.1.hook_attn_out', 'blocks.0.mlp.hidden' ->
    'blocks.0.mlp.hook_post'. `logits` (the output) and `ln_final` have no equal hook."""
    return _translate(site, _TOP_HOOKS, _BLOCK_HOOKS, "site",
                      "TransformerLens hook with the same value")


def site_name(hook: str) -> str:
    """TransformerLens hook name -> our site name (the inverse of `tl_name`)."""
    return _translate(hook, _TOP_SITES, _BLOCK_SITES, "TransformerLens hook",
                      "jaxillusions site")


def site_map(cfg: model_lib.ModelConfig) -> dict[str, str]:
    """{our site: TL hook} for every site of this model with an equal hook (all but ln_final and
    logits, and resid_mid of attention-only models: TL's attention-only blocks have no
    hook_resid_mid; ours equals resid_post there). Same shapes, except pos_embed: ours
    [pos, d_model], TL's [batch, pos, d_model]."""
    skip = ("ln_final", "logits")
    return {s: tl_name(s) for s in model_lib.site_names(cfg)
            if s not in skip and not (cfg.attn_only and s.endswith(".resid_mid"))}


def tl_config(cfg: model_lib.ModelConfig, device: str = "cpu") -> Any:
    """The `HookedTransformerConfig` of a model config; a clear error for what TL can't express."""
    from transformer_lens import HookedTransformerConfig

    if cfg.uniform_attention_layers:
        raise ValueError(f"model.uniform_attention_layers={cfg.uniform_attention_layers}: "
                         "TransformerLens has no frozen uniform attention; cannot export")
    if getattr(cfg, "first_layer", "standard") != "standard":
        raise ValueError(f"model.first_layer={cfg.first_layer!r}: TransformerLens has no "
                         "(token, depth) feature layer; cannot export")
    return HookedTransformerConfig(
        n_layers=cfg.n_layers, d_model=cfg.d_model, n_ctx=cfg.max_len, d_head=cfg.head_dim,
        n_heads=cfg.n_heads, d_mlp=None if cfg.attn_only else cfg.d_mlp,
        d_vocab=cfg.vocab_size, act_fn="gelu_new", normalization_type="LN", eps=1e-5,
        attn_only=cfg.attn_only, positional_embedding_type="standard",
        default_prepend_bos=False, device=device, dtype=_torch().float32, seed=0)


def _torch():
    import torch

    return torch


def state_dict(params: dict, cfg: model_lib.ModelConfig) -> dict[str, Any]:
    """One seed's params (no seed axis) -> a TransformerLens state dict of torch tensors."""
    torch = _torch()
    p = {k: v for k, v in params.items()}
    if np.ndim(p["embed"]) != 2:
        raise ValueError(f"params['embed'] has shape {np.shape(p['embed'])}: pass one seed's "
                         "params (e.g. Run.seed_params(seed)), not the sweep's seed axis")
    if cfg.pos_encoding == "none":
        w_pos = np.zeros((cfg.max_len, cfg.d_model), np.float32)
    else:
        w_pos = model_lib._position_embedding(params, cfg, cfg.max_len)
    out = {"embed.W_E": p["embed"], "pos_embed.W_pos": w_pos,
           "ln_final.w": p["ln_final"]["scale"], "ln_final.b": p["ln_final"]["bias"],
           "unembed.W_U": p["unembed"]["w"], "unembed.b_U": p["unembed"]["b"]}
    for i, block in enumerate(p["blocks"]):
        a, name = block["attn"], f"blocks.{i}"
        out |= {f"{name}.ln1.w": block["ln1"]["scale"], f"{name}.ln1.b": block["ln1"]["bias"],
                f"{name}.attn.W_Q": np.transpose(a["w_q"], (1, 0, 2)), f"{name}.attn.b_Q": a["b_q"],
                f"{name}.attn.W_K": np.transpose(a["w_k"], (1, 0, 2)),
                f"{name}.attn.b_K": np.zeros((cfg.n_heads, cfg.head_dim), np.float32),
                f"{name}.attn.W_V": np.transpose(a["w_v"], (1, 0, 2)), f"{name}.attn.b_V": a["b_v"],
                f"{name}.attn.W_O": a["w_o"], f"{name}.attn.b_O": a["b_o"]}
        if not cfg.attn_only:
            m = block["mlp"]
            out |= {f"{name}.ln2.w": block["ln2"]["scale"], f"{name}.ln2.b": block["ln2"]["bias"],
                    f"{name}.mlp.W_in": m["w_in"], f"{name}.mlp.b_in": m["b_in"],
                    f"{name}.mlp.W_out": m["w_out"], f"{name}.mlp.b_out": m["b_out"]}
    return {k: torch.tensor(np.asarray(v, np.float32)) for k, v in out.items()}


def to_transformer_lens(params: dict, cfg: model_lib.ModelConfig, device: str = "cpu") -> Any:
    """One seed's params (no seed axis) and its ModelConfig -> a `HookedTransformer` in eval
    mode whose logits and hooks equal our `model.forward` and sites (see `site_map`)."""
    from transformer_lens import HookedTransformer

    tl_cfg = tl_config(cfg, device)
    with warnings.catch_warnings():  # 3.x announces that 4.0 drops HookedTransformer (README)
        warnings.filterwarnings("ignore", "HookedTransformer is deprecated", DeprecationWarning)
        model = HookedTransformer(tl_cfg)
    weights = state_dict(params, cfg)
    expected = {k for k, _ in model.named_parameters()}
    if set(weights) != expected:
        missing, extra = sorted(expected - set(weights)), sorted(set(weights) - expected)
        raise ValueError(f"TransformerLens parameters differ from the export: missing {missing}, "
                         f"extra {extra}")
    model.load_state_dict(weights, strict=False)
    return model.eval()


def from_workdir(workdir: str, seed: int | str, device: str = "cpu") -> Any:
    """Seed `seed` (its number: config.seed + i, or a member label such as "3_cw0.1") of a
    trained workdir as a HookedTransformer."""
    from jaxillusions.analysis import load_run

    run = load_run(workdir)
    return to_transformer_lens(run.seed_params(seed), run.model_config, device)
