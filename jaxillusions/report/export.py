"""Export a trained seed to TransformerLens, 3.9 (`HookedTransformer`) or 4.x (`TransformerBridge`),
and the site-name map both ways.

    from jaxillusions import export
    tl_model = export.from_workdir("runs/dyck_small", seed=0)  # HookedTransformer or Bridge
    logits, cache = tl_model.run_with_cache(tokens)             # tokens: torch int [B, T]
    cache[export.tl_name("blocks.1.attn.k")]                     # our site, TL's hook

Needs the optional extra `export` (torch and transformer-lens >=3.9,<5; see the README for the
exact install). The path follows the installed major version: 3.x builds a `HookedTransformer`
from a `HookedTransformerConfig`; 4.x (which removed `HookedTransformer`) boots its TL-native
model (`TransformerBridge.boot_native`, no Hugging Face download) and loads the same weights
through its converter for HookedTransformer-format checkpoints (`convert_tl_checkpoint`).
Both run our weights unprocessed (no LayerNorm folding or centering), so every hook equals our
site. Our model maps onto a standard TransformerLens config: pre-LayerNorm blocks (eps 1e-5),
tanh GELU (TL's `gelu_new`), attention scaled by 1/sqrt(d_head), no key bias (TL's b_K is set to
zero), and `w_q/k/v` stored as [d_model, head, d_head] (TL: [head, d_model, d_head]). Every
additive position encoding becomes TL's "standard" W_pos table: learned as is, sinusoidal and
linear as the table they compute, none as zeros. Rotary positions become TL's
`positional_embedding_type="rotary"` over the whole head (rotary_dim = d_head) with our base and
GPT-J's adjacent pairs (`rotary_adjacent_pairs=True`; 4.x's native model has only those); TL
computes its own cos/sin table in float32 (ours is float64 rounded once), which differs from ours
by float32 rounding of the angles, about position x 1e-7 radians. Frozen one-hot token embeddings
export as the table they are.
Layers with frozen uniform attention and the minimal first layer (Wen et al.) have no TL
counterpart and are refused.

Hook names: `tl_name` gives HookedTransformer's names (`blocks.0.attn.hook_k`), which 4.x keeps as
aliases of its own hooks (`blocks.0.attn.k.hook_out`); `site_name` reads both. They differ in
three sites: 4.x's `hook_attn_scores` holds the softmaxed pattern on this architecture, so
`attn.scores` has no 4.x hook, while 4.x's `ln_final.hook_out` (after the LayerNorm's scale and
bias, as ours) and `hook_unembed` (the logits) give `ln_final` and `logits` hooks that 3.9 lacks.
With rotary positions `attn.q`/`attn.k` are before the rotation in both (hook_q/hook_k);
`attn.rot_q`/`attn.rot_k` (after it) are 3.x's hook_rot_q/hook_rot_k, and have no 4.x hook (its
native model turns the queries and keys inside the attention without firing them).

Sparse dictionaries to SAELens: `sae_to_saelens` writes one seed's, one head's, one size's TopK
SAE (proxies/sae.py) as a SAELens directory (`sae_weights.safetensors` and `cfg.json`,
architecture "topk", hook_name `tl_name(site)`), which `sae_lens.SAE.load_from_disk` loads;
`saelens_from_workdir` takes it from a finished sweep with the "sae" proxy (`sae_params` reads
its fitted params).
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import warnings
from importlib import metadata
from typing import Any

import numpy as np

from jaxillusions import model as model_lib
from jaxillusions.model import positions

# Our block sites -> HookedTransformer's hook names (within blocks.{i}); TL 4 keeps them as aliases.
_BLOCK_HOOKS = {
    "resid_pre": "hook_resid_pre",
    "attn.q": "attn.hook_q",
    "attn.k": "attn.hook_k",
    "attn.v": "attn.hook_v",
    "attn.rot_q": "attn.hook_rot_q",
    "attn.rot_k": "attn.hook_rot_k",
    "attn.scores": "attn.hook_attn_scores",
    "attn.pattern": "attn.hook_pattern",
    "attn.z": "attn.hook_z",
    "attn.out": "hook_attn_out",
    "resid_mid": "hook_resid_mid",
    "mlp.hidden": "mlp.hook_post",
    "mlp.out": "hook_mlp_out",
    "resid_post": "hook_resid_post",
}
# Not mapped in 3.x: `ln_final` (TL's ln_final.hook_normalized is before the LayerNorm's scale and
# bias, ours after: ours = hook_normalized * ln_final.w + ln_final.b) and `logits` (TL's output).
_TOP_HOOKS = {"embed": "hook_embed", "pos_embed": "hook_pos_embed"}
# TL 4.x: the hooks it adds (the aliases' targets are its own names; site_name reads them too).
_TOP_HOOKS_4 = {**_TOP_HOOKS, "ln_final": "ln_final.hook_out", "logits": "hook_unembed"}
_BLOCK_HOOKS_4 = {k: v for k, v in _BLOCK_HOOKS.items()
                  if k not in ("attn.scores", "attn.rot_q", "attn.rot_k")}
_BRIDGE_TOP = {"embed.hook_out": "embed", "pos_embed.hook_out": "pos_embed",
               "unembed.hook_out": "logits"}
_BRIDGE_BLOCK = {"hook_in": "resid_pre", "attn.q.hook_out": "attn.q", "attn.k.hook_out": "attn.k",
                 "attn.v.hook_out": "attn.v", "attn.o.hook_in": "attn.z",
                 "attn.hook_out": "attn.out", "ln2.hook_in": "resid_mid",
                 "mlp.out.hook_in": "mlp.hidden", "mlp.hook_out": "mlp.out",
                 "hook_out": "resid_post"}
_MAPS = {3: (_TOP_HOOKS, _BLOCK_HOOKS), 4: (_TOP_HOOKS_4, _BLOCK_HOOKS_4)}
_INVERSE = {3: ({v: k for k, v in _TOP_HOOKS.items()}, {v: k for k, v in _BLOCK_HOOKS.items()}),
            4: ({v: k for k, v in _TOP_HOOKS_4.items()} | _BRIDGE_TOP,
                {v: k for k, v in _BLOCK_HOOKS_4.items()} | _BRIDGE_BLOCK)}


def require(extra: str, *modules: str) -> None:
    """One-line ImportError naming the extra to install, for the first of `modules` missing,
    before any work (the `export` extra: torch and transformer-lens; SAELens's files:
    safetensors)."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise ImportError(f"the export needs {missing[0]}, which is not installed: pip install "
                          f"'jaxillusions[{extra}]', the CPU torch wheel first "
                          "(docs/python_api.md, Export to TransformerLens)")


def tl_major() -> int:
    """The installed TransformerLens major version; 4 (the current line) when none is installed,
    so that names match what `pip install transformer-lens` gives today."""
    try:
        major = int(metadata.version("transformer-lens").split(".")[0])
    except metadata.PackageNotFoundError:
        return 4
    if major not in _MAPS:
        raise ImportError(f"transformer-lens {metadata.version('transformer-lens')} is installed; "
                          "the export supports >=3.9,<5")
    return major


def _major(major: int | None) -> int:
    if major is None:
        return tl_major()
    if major not in _MAPS:
        raise ValueError(f"major={major!r}: TransformerLens major versions 3 or 4")
    return major


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


def tl_name(site: str, major: int | None = None) -> str:
    """Our site name -> the TransformerLens hook with the same value, for TL `major` (3 or 4;
    default the installed one, see `tl_major`), e.g. 'blocks.1.attn.out' ->
    'blocks.1.hook_attn_out', 'blocks.0.mlp.hidden' -> 'blocks.0.mlp.hook_post' in both. Only 3.x
    has `attn.scores` (4.x's hook_attn_scores is the pattern) and `attn.rot_q`/`attn.rot_k`; only
    4.x has `ln_final`, `logits`."""
    top, block = _MAPS[_major(major)]
    return _translate(site, top, block, "site",
                      f"TransformerLens {_major(major)}.x hook with the same value")


def site_name(hook: str, major: int | None = None) -> str:
    """TransformerLens hook name -> our site name (the inverse of `tl_name`); for 4.x also the
    bridge's own names of the same hooks (e.g. 'blocks.0.attn.k.hook_out', 'blocks.0.hook_in')."""
    top, block = _INVERSE[_major(major)]
    return _translate(hook, top, block, "TransformerLens hook", "jaxillusions site")


def site_map(cfg: model_lib.ModelConfig, major: int | None = None) -> dict[str, str]:
    """{our site: TL hook} for every site of this model with an equal hook in TL `major` (default
    the installed one): all but ln_final and logits in 3.x, all but attn.scores (and the rotary
    models' attn.rot_q/rot_k) in 4.x; never
    resid_mid of attention-only models (TL's attention-only blocks have no hook_resid_mid; ours
    equals resid_post there). Same shapes, except pos_embed: ours [pos, d_model], TL's
    [batch, pos, d_model]."""
    major = _major(major)
    top, block = _MAPS[major]
    return {s: tl_name(s, major) for s in model_lib.site_names(cfg)
            if (s in top or s.split(".", 2)[-1] in block)
            and not (cfg.attn_only and s.endswith(".resid_mid"))}


_TL_ACTIVATIONS = {"gelu_tanh": "gelu_new", "gelu": "gelu"}  # model.ACTIVATIONS -> TL's act_fn


def tl_config(cfg: model_lib.ModelConfig, device: str = "cpu") -> Any:
    """The TransformerLens config of a model config (3.x: `HookedTransformerConfig`, 4.x:
    `TransformerBridgeConfig` of its TL-native model); a clear error for what TL can't express."""
    require("export", "torch", "transformer_lens")
    if cfg.interventions:  # the model as trained runs them: an export without them is another
        raise ValueError(f"model.uniform_attention_layers ({cfg.interventions}): "
                         "TransformerLens has no frozen uniform attention; cannot export")
    if cfg.front is not None:
        raise ValueError(f"model.first_layer ({type(cfg.front).__name__}): TransformerLens has "
                         "no (token, depth) feature layer; cannot export")
    # The options of imported architectures (model.IMPORTED_FIELDS) that TL's native model
    # ignores (TL 4.3: its logits differ): an export would be another model.
    ignored = {"parallel_residual": cfg.parallel_residual,
               "attn_scale_by_layer": cfg.attn_scale_by_layer,
               "rotary_layout": cfg.pos_encoding == "rotary" and cfg.rotary_layout != "adjacent"}
    for name in (n for n, on in ignored.items() if on):
        raise ValueError(f"{name}={getattr(cfg, name)!r} (an imported checkpoint's "
                         "architecture): TransformerLens's native model does not run it, so "
                         "the export would be another model; load the checkpoint itself with "
                         "TransformerLens")
    # The other options have TL fields, the ones pretrained.py reads back.
    fields = dict(
        n_layers=cfg.n_layers, d_model=cfg.d_model, n_ctx=cfg.max_len, d_head=cfg.head_dim,
        n_heads=cfg.n_heads, d_mlp=None if cfg.attn_only else cfg.d_mlp,
        d_vocab=cfg.vocab_size, act_fn=_TL_ACTIVATIONS[cfg.activation],
        normalization_type="LN", eps=cfg.ln_eps, attn_only=cfg.attn_only,
        default_prepend_bos=False, device=device, dtype=_torch().float32, seed=0,
        positional_embedding_type="standard")
    if cfg.pos_encoding == "rotary":
        fields |= dict(positional_embedding_type="rotary",
                       rotary_dim=cfg.rotary_dim or cfg.head_dim, rotary_base=cfg.rotary_base,
                       rotary_adjacent_pairs=True)
    if tl_major() == 3:
        from transformer_lens import HookedTransformerConfig

        return HookedTransformerConfig(**fields)
    from transformer_lens.config import TransformerBridgeConfig

    return TransformerBridgeConfig(**fields, architecture="TransformerLensNative")


def _torch():
    import torch

    return torch


def state_dict(params: dict, cfg: model_lib.ModelConfig) -> dict[str, Any]:
    """One seed's params (no seed axis) -> a TransformerLens state dict of torch tensors."""
    require("export", "torch")
    torch = _torch()
    p = {k: v for k, v in params.items()}
    if np.ndim(p["embed"]) != 2:
        raise ValueError(f"params['embed'] has shape {np.shape(p['embed'])}: pass one seed's "
                         "params (e.g. Run.seed_params(seed)), not the sweep's seed axis")
    out = {"embed.W_E": p["embed"],
           "ln_final.w": p["ln_final"]["scale"], "ln_final.b": p["ln_final"]["bias"],
           "unembed.W_U": p["unembed"]["w"], "unembed.b_U": p["unembed"]["b"]}
    if cfg.pos_encoding == "none":
        out["pos_embed.W_pos"] = np.zeros((cfg.max_len, cfg.d_model), np.float32)
    elif cfg.pos_encoding != "rotary":  # rotary: TL computes its table from the config
        out["pos_embed.W_pos"] = positions.embedding(params, cfg, cfg.max_len)
    for i, block in enumerate(p["blocks"]):
        a, name = block["attn"], f"blocks.{i}"
        out |= {f"{name}.ln1.w": block["ln1"]["scale"], f"{name}.ln1.b": block["ln1"]["bias"],
                f"{name}.attn.W_Q": np.transpose(a["w_q"], (1, 0, 2)), f"{name}.attn.b_Q": a["b_q"],
                f"{name}.attn.W_K": np.transpose(a["w_k"], (1, 0, 2)),
                f"{name}.attn.b_K": a["b_k"] if cfg.key_bias else np.zeros(
                    (cfg.n_heads, cfg.head_dim), np.float32),
                f"{name}.attn.W_V": np.transpose(a["w_v"], (1, 0, 2)), f"{name}.attn.b_V": a["b_v"],
                f"{name}.attn.W_O": a["w_o"], f"{name}.attn.b_O": a["b_o"]}
        if not cfg.attn_only:
            m = block["mlp"]
            out |= {f"{name}.ln2.w": block["ln2"]["scale"], f"{name}.ln2.b": block["ln2"]["bias"],
                    f"{name}.mlp.W_in": m["w_in"], f"{name}.mlp.b_in": m["b_in"],
                    f"{name}.mlp.W_out": m["w_out"], f"{name}.mlp.b_out": m["b_out"]}
    return {k: torch.tensor(np.asarray(v, np.float32)) for k, v in out.items()}


def _check_keys(got: set[str], expected: set[str]) -> None:
    if got != expected:
        raise ValueError(f"TransformerLens parameters differ from the export: missing "
                         f"{sorted(expected - got)}, extra {sorted(got - expected)}")


def to_transformer_lens(params: dict, cfg: model_lib.ModelConfig, device: str = "cpu") -> Any:
    """One seed's params (no seed axis) and its ModelConfig -> a TransformerLens model in eval
    mode whose logits and hooks equal our `model.forward` and sites (see `site_map`): a
    `HookedTransformer` under TransformerLens 3.x, a `TransformerBridge` under 4.x."""
    tl_cfg = tl_config(cfg, device)
    weights = state_dict(params, cfg)
    if tl_major() == 3:
        from transformer_lens import HookedTransformer

        with warnings.catch_warnings():  # 3.x announces that 4.0 drops HookedTransformer
            warnings.filterwarnings("ignore", "HookedTransformer is deprecated",
                                    DeprecationWarning)
            model = HookedTransformer(tl_cfg)
        _check_keys(set(weights), {k for k, _ in model.named_parameters()})
        model.load_state_dict(weights, strict=False)  # not strict: its buffers (masks) stay
        return model.eval()
    from transformer_lens.model_bridge import TransformerBridge
    from transformer_lens.utilities.tl_checkpoint_conversion import convert_tl_checkpoint

    # Its native model, randomly initialised, then given our weights in HookedTransformer's
    # layout through 4.x's own converter (keys and [head, d_model, d_head] -> nn.Linear shapes).
    model = TransformerBridge.boot_native(tl_cfg, device=device, dtype=_torch().float32)
    converted = convert_tl_checkpoint(weights, model.cfg)
    _check_keys(set(converted), set(model.state_dict()))
    model.load_state_dict(converted, strict=True)
    return model.eval()


def from_workdir(workdir: str, seed: int | str, device: str = "cpu") -> Any:
    """Seed `seed` (its number: config.seed + i, or a member label such as "3_cw0.1") of a
    trained workdir as a TransformerLens model (see `to_transformer_lens`)."""
    from jaxillusions.report import load_run

    require("export", "torch", "transformer_lens")  # before the run loads
    run = load_run(workdir)
    return to_transformer_lens(run.seed_params(seed), run.model_config, device)


# ---------------------------------------------------------------------------------------------
# Sparse dictionaries (proxies/sae.py) to SAELens.

SAELENS_WEIGHTS = "sae_weights.safetensors"  # SAELens's file names (sae_lens.constants)
SAELENS_CONFIG = "cfg.json"
SAELENS_FORMAT = "6.54.12"  # the sae-lens release whose format this writes and was tested with
# per-head sites: [batch, pos, head, d_head] in TL
_HEAD_SITES = ("q", "k", "v", "rot_q", "rot_k", "z")


def _per_head(site: str) -> bool:
    return site.rsplit(".", 1)[-1] in _HEAD_SITES


def sae_to_saelens(params: dict, path: str, site: str, *, head: int | None = None,
                   model_name: str = "jaxillusions") -> str:
    """One seed's, one head's, one size's TopK SAE -> a SAELens directory at `path` (created;
    existing SAELens files there are refused, not overwritten). Returns `path`.

    `params`: sae.fit's leaves without their leading axes (W_enc [F, W], b_enc [W], W_dec [W, F],
    b_dec [F], mask [W], kmask [K]), e.g. from `sae_params`. Only the live latents (mask) are
    written: d_sae is the size's width and k its k (kmask). SAELens's TopK SAE computes
    TopK(ReLU((x - b_dec) @ W_enc + b_enc)) @ W_dec + b_dec with W_dec [d_sae, d_in]: ours, as is.
    hook_name is `tl_name(site)`; per-head sites (attn q/k/v/z: TL's hook is [batch, pos, head,
    d_head]) need `head`, written as SAELens's hook_head_index (SAELens reads that head's
    [batch, pos, d_head] slice, as its ActivationsStore does), since our SAE on such a site is
    one dictionary per head. (HookedSAETransformer.add_sae ignores hook_head_index: spliced
    there, it would run this head's SAE on every head.)"""
    require("export", "safetensors")
    from safetensors.numpy import save_file

    hook = tl_name(site)  # a site TL has no hook for is refused here
    if "b_in" in params:
        raise ValueError("params have b_in: a transcoder, not an SAE; SAELens's TopK SAE "
                         "reconstructs its own input")
    if np.ndim(params["W_enc"]) != 2:
        raise ValueError(f"params['W_enc'] has shape {np.shape(params['W_enc'])}: pass one seed's, "
                         "head's and size's params [F, W] (e.g. export.sae_params)")
    if _per_head(site) != (head is not None):
        raise ValueError(f"site {site!r} is " + ("per head: pass head=" if _per_head(site) else
                                                 "not per head: head must be None"))
    if head is not None and head < 0:
        raise ValueError(f"head={head}: must be >= 0")
    live = np.asarray(params["mask"], bool)
    width, k = int(live.sum()), int(np.sum(params["kmask"]))
    if not np.all(live[:width]):  # sae.fit's mask is a prefix: latents 0..width-1
        raise ValueError("params['mask'] is not a prefix of live latents")
    # Contiguous copies: safetensors writes an array's buffer, and W_enc[:, :width] is a view.
    weights = {name: np.ascontiguousarray(np.asarray(params[name], np.float32)[cut]) for name, cut
               in (("W_enc", np.s_[:, :width]), ("b_enc", np.s_[:width]),
                   ("W_dec", np.s_[:width]), ("b_dec", np.s_[:]))}
    # SAELens 6's TopKSAEConfig.to_dict(), as its SAE.save_model writes it. metadata's
    # sae_lens_version marks the 6.x layout (without it SAELens converts the file as pre-6.0);
    # hook_name and hook_head_index say where the SAE reads.
    cfg = {"d_in": weights["b_dec"].shape[0], "d_sae": width, "dtype": "float32",
           "device": "cpu", "apply_b_dec_to_input": True, "normalize_activations": "none",
           "reshape_activations": "none",
           "metadata": {"sae_lens_version": SAELENS_FORMAT, "sae_lens_training_version": None,
                        "model_name": model_name, "hook_name": hook, "hook_head_index": head,
                        "prepend_bos": False},
           "k": k, "rescale_acts_by_decoder_norm": False, "architecture": "topk"}
    files = [os.path.join(path, SAELENS_WEIGHTS), os.path.join(path, SAELENS_CONFIG)]
    if any(os.path.exists(f) for f in files):
        raise FileExistsError(f"{path} already holds a SAELens SAE; choose another directory")
    os.makedirs(path, exist_ok=True)
    save_file(weights, files[0])
    with open(files[1], "w") as f:
        json.dump(cfg, f, indent=2)
    return path


def sae_params(workdir: str, seed: int | str, site: str, width: int, k: int | None = None, *,
               head: int | None = None, target: str | None = None) -> dict:
    """One seed's (its number or member label), one head's SAE at `site` of width `width` (and
    `k`; None: the one k fitted with that width) from a sweep with the "sae" proxy:
    <workdir>/proxies/<i>_sae_<target>.msgpack, leaves [seed, head, size, ...]. `target` picks
    the proxy family when several targets include `site` (e.g. "blocks.1.attn.k+blocks.1.attn.q");
    `head` is required on per-head sites of a model with several heads."""
    from flax import serialization

    from jaxillusions.report import load_run

    files = sorted(glob.glob(os.path.join(workdir, "proxies", "*_sae_*.msgpack")))
    if not files:
        raise FileNotFoundError(f"no fitted SAE in {workdir}/proxies (run a sweep with "
                                "proxies.methods including 'sae')")
    families = {}
    for file in files:
        with open(file, "rb") as f:
            value = serialization.msgpack_restore(f.read())["value"]
        family = os.path.basename(file)[:-len(".msgpack")].split("_sae_", 1)[1]
        if site in value and (target is None or family == target.replace("+", "_and_")):
            families[file] = value[site]
    if len(families) != 1:
        raise ValueError(f"site {site!r}" + (f", target {target!r}" if target else "") +
                         f": {len(families)} SAE families fit it in {workdir}/proxies "
                         f"({', '.join(map(os.path.basename, families)) or 'none'}); "
                         + ("pass target=" if families else "see their targets"))
    fitted = next(iter(families.values()))
    index = load_run(workdir).index(seed)
    heads = fitted["W_enc"].shape[1]
    if head is None and heads > 1:
        raise ValueError(f"site {site!r} has one SAE per head ({heads}): pass head=")
    if not 0 <= (head or 0) < heads:
        raise ValueError(f"head={head}: site {site!r} has {heads} head(s)")
    widths = fitted["mask"][index, head or 0].sum(-1)
    ks = fitted["kmask"][index, head or 0].sum(-1)
    sizes = [i for i in range(len(widths)) if widths[i] == width and k in (None, ks[i])]
    if len(sizes) != 1:
        raise ValueError(f"width={width}, k={k}: fitted (width, k) are "
                         f"{sorted(zip(widths.tolist(), ks.tolist(), strict=True))}")
    return {name: np.asarray(leaf[index, head or 0, sizes[0]]) for name, leaf in fitted.items()}


def saelens_from_workdir(workdir: str, path: str, seed: int | str, site: str, width: int,
                         k: int | None = None, *, head: int | None = None,
                         target: str | None = None) -> str:
    """`sae_params` of a finished sweep written as a SAELens directory at `path` (see
    `sae_to_saelens`; on a per-head site of a one-head model, head 0). Returns `path`."""
    require("export", "safetensors")  # before the run loads
    params = sae_params(workdir, seed, site, width, k, head=head, target=target)
    head = (head or 0) if _per_head(site) else head
    return sae_to_saelens(params, path, site, head=head,
                          model_name=f"jaxillusions:{os.path.basename(os.path.normpath(workdir))}"
                          f":seed{seed}")
