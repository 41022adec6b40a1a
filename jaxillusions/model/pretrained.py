"""Pretrained checkpoints as this project's model: Hugging Face GPT-2 and GPT-NeoX (Pythia)
directories and TransformerLens state dicts, one checkpoint or a population of them stacked on
the leading member axis that training uses (docs/pretrained.md).

    params, cfg = pretrained.load_pretrained(["pythia-14m-seed1", "pythia-14m-seed2"])
    params, cfg, labels = pretrained.load_pretrained_labelled(paths)  # labels: seed1, seed2
    logits, cache = jax.vmap(lambda p: model.forward(p, tokens, cfg, cache=sites))(params)

Each path is a local directory:
- Hugging Face (`config.json`, model_type "gpt2" or "gpt_neox"): weights in `model.safetensors`,
  sharded as `model.safetensors.index.json` plus its shards, or in `pytorch_model.bin` (or its
  sharded index; reading those needs torch). A tied unembedding is the token embedding.
- TransformerLens (`tl_config.json`: a HookedTransformerConfig's or TransformerBridgeConfig's
  `to_dict()` as JSON, values JSON lacks written as strings): a HookedTransformer-format state
  dict (the keys `HookedTransformer.state_dict()` has, the format of report/export.py) in
  `model.safetensors` or `model.pt` (`torch.save`). Weights as stored: unfolded LayerNorms
  ("LN"), or folded ones ("LNPre", then scale 1 and bias 0).

What an architecture needs is a ModelConfig option (model.IMPORTED_FIELDS): GPT-2 has learned
absolute positions, biases everywhere (the key bias too, so that `attn.k` is the checkpoint's
keys), tanh GELU (`gelu_new`) and, in Stanford CRFM's Mistral runs, scores scaled also by
1 / (layer + 1) (scale_attn_by_inverse_layer_idx); GPT-NeoX has rotary positions on the first
rotary_pct of each head in the rotate-half layout, exact GELU, an untied unembedding and
(Pythia) attention and MLP in parallel. Every LayerNorm takes the checkpoint's epsilon. Weights
are cast to float32 whatever they are stored in (float16, bfloat16); every site keeps its name.

Checks come before the weights are read, each a one-line ValueError naming the path: a
directory without a config or weights, an architecture or option the model cannot express, a
population mixing architectures, checkpoints whose configs differ (naming the field and both
paths). Then each checkpoint's weights are read, converted and checked against the config's
shapes, and written into the stacked arrays; one checkpoint's weights are in memory at a time.

Member labels (`member_labels`) say what differs: a mapping {label: path} gives its own;
otherwise the shortest tail of the paths that tells them apart, less the name pieces (split at
- _ . /) all of them share at the start and end: pythia-14m-seed1, pythia-14m-seed3 -> seed1,
seed3; ckpt/step1000, ckpt/step2000 -> step1000, step2000.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import zipfile
from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxillusions import model as model_lib
from jaxillusions.runtime.cache import error_line

ARCHITECTURES = ("gpt2", "gpt_neox", "transformer_lens")
HF_CONFIG, TL_CONFIG = "config.json", "tl_config.json"
# In the order looked for; an index names its shards.
HF_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
              "pytorch_model.bin.index.json")
TL_WEIGHTS = ("model.safetensors", "model.pt")
# Activation names -> model.ACTIVATIONS (gelu_new, gelu_fast and gelu_pytorch_tanh are the same
# tanh approximation, written differently).
_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_fast": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                "gelu": "gelu"}
# Stored tensors that are not parameters: causal masks (GPT-2's attn.bias and masked_bias,
# GPT-NeoX's attention.bias), rotary tables (TransformerLens's, GPT-NeoX's inv_freq).
_BUFFERS = re.compile(r"(^|\.)(attn\.(bias|masked_bias)|attention\.(bias|masked_bias)|mask|IGNORE|"
                      r"rotary_sin|rotary_cos|inv_freq)$")
Paths = str | os.PathLike | Sequence[str | os.PathLike] | Mapping[str, str | os.PathLike]


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """What a checkpoint directory holds, read from its config alone."""

    path: str
    architecture: str  # ARCHITECTURES
    config: model_lib.ModelConfig
    files: tuple[str, ...]  # the weight files (shards: all of them)
    tied: bool  # the unembedding is the token embedding's transpose
    folded_ln: bool  # TransformerLens "LNPre": LayerNorms without scale and bias


def load_pretrained(paths: Paths) -> tuple[dict, model_lib.ModelConfig]:
    """Checkpoints of one architecture -> (params with a leading member axis, ModelConfig).
    `paths`: one directory, a sequence of them, or {label: directory}."""
    params, cfg, _ = load_pretrained_labelled(paths)
    return params, cfg


def load_pretrained_labelled(paths: Paths) -> tuple[dict, model_lib.ModelConfig, list[str]]:
    """`load_pretrained` and the members' labels (`member_labels`), in member order."""
    labels, dirs = member_labels(paths), _paths(paths)
    checkpoints = inspect_population(dirs)
    first = checkpoints[0]
    shapes = jax.eval_shape(lambda: model_lib.init_params(jax.random.PRNGKey(0), first.config))
    leaves, treedef = jax.tree.flatten(shapes)
    stacked = [np.empty((len(dirs), *x.shape), np.float32) for x in leaves]
    for i, checkpoint in enumerate(checkpoints):  # one checkpoint's weights in memory at a time
        for out, leaf in zip(stacked, jax.tree.leaves(load_checkpoint(checkpoint, shapes)),
                             strict=True):
            out[i] = leaf
    return jax.tree.unflatten(treedef, [jnp.asarray(x) for x in stacked]), first.config, labels


def inspect_population(paths: Paths) -> list[Checkpoint]:
    """`inspect_checkpoint` of every path, from their configs alone, and the population's checks
    (one architecture, one ModelConfig): what load_pretrained_labelled refuses before it reads
    any weights (the main job's door calls it for model.pretrained)."""
    checkpoints = [inspect_checkpoint(p) for p in _paths(paths)]
    first = checkpoints[0]
    for other in checkpoints[1:]:
        if other.architecture != first.architecture:
            raise ValueError(f"a population of one architecture only: {first.path} is "
                             f"{first.architecture}, {other.path} is {other.architecture}")
        for field in dataclasses.fields(model_lib.ModelConfig):
            a, b = getattr(first.config, field.name), getattr(other.config, field.name)
            if a != b:
                raise ValueError(f"checkpoints differ in model.{field.name}: {first.path} has "
                                 f"{a!r}, {other.path} has {b!r}")
    return checkpoints


def member_labels(paths: Paths) -> list[str]:
    """A label per checkpoint, in order (see the module's docstring)."""
    if isinstance(paths, Mapping):
        return [str(label) for label in paths]
    dirs = [os.path.abspath(p) for p in _paths(paths)]
    if len(set(dirs)) < len(dirs):
        twice = sorted({p for p in dirs if dirs.count(p) > 1})
        raise ValueError(f"{twice[0]} is given twice; pass {{label: path}} to load it twice")
    parts = [d.split(os.sep) for d in dirs]
    for k in range(1, max(map(len, parts)) + 1):
        names = ["/".join(p[-k:]) for p in parts]
        if len(set(names)) == len(names):
            break
    if len(names) == 1:
        return names
    pieces = [re.split(r"([-_./])", n) for n in names]
    shortest = min(map(len, pieces))
    start = next((j for j in range(shortest) if len({p[j] for p in pieces}) > 1), shortest)
    end = next((j for j in range(shortest - start) if len({p[-1 - j] for p in pieces}) > 1),
               shortest - start)
    stripped = ["".join(p[start:len(p) - end]).strip("-_./") for p in pieces]
    return stripped if all(stripped) and len(set(stripped)) == len(stripped) else names


def _paths(paths: Paths) -> list[str]:
    if isinstance(paths, Mapping):
        paths = list(paths.values())
    elif isinstance(paths, str | os.PathLike):
        paths = [paths]
    paths = [os.path.expanduser(os.fspath(p)) for p in paths]
    if not paths:
        raise ValueError("no checkpoint paths given")
    if "" in paths:  # (it would be the current directory)
        raise ValueError(f"an empty path (item {paths.index('') + 1} of {len(paths)}); name "
                         "each checkpoint's directory")
    return paths


def _read_json(file: str) -> dict:
    try:
        with open(file) as f:
            raw = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{file}: cannot read it as JSON ({type(e).__name__}: "
                         f"{str(e).splitlines()[0]})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{file}: holds a JSON {type(raw).__name__}, not an object of "
                         "settings")
    return raw


def _weight_files(path: str, names: tuple[str, ...]) -> tuple[str, ...]:
    """The weight files of the first of `names` in `path` (an index: its shards)."""
    for name in names:
        file = os.path.join(path, name)
        if not os.path.isfile(file):
            continue
        if not name.endswith(".index.json"):
            return (file,)
        shards = sorted(set(_read_json(file).get("weight_map", {}).values()))
        missing = [s for s in shards if not os.path.isfile(os.path.join(path, s))]
        if not shards or missing:
            raise ValueError(f"{path}: {name} names shards that are not there: "
                             f"{missing or 'none'}")
        return tuple(os.path.join(path, s) for s in shards)
    raise ValueError(f"{path}: no weights (looked for {', '.join(names)})")


def inspect_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """The architecture, ModelConfig and weight files of a checkpoint directory, from its config
    alone; a one-line ValueError naming the path for what cannot be loaded."""
    path = os.path.expanduser(os.fspath(path))
    if not os.path.isdir(path):
        raise ValueError(f"{path}: not a directory (a checkpoint is a directory with "
                         f"{HF_CONFIG} or {TL_CONFIG} and the weights)")
    if os.path.isfile(os.path.join(path, TL_CONFIG)):
        raw, architecture, names = _read_json(os.path.join(path, TL_CONFIG)), "transformer_lens", \
            TL_WEIGHTS
    elif os.path.isfile(os.path.join(path, HF_CONFIG)):
        raw = _read_json(os.path.join(path, HF_CONFIG))
        architecture, names = raw.get("model_type"), HF_WEIGHTS
        if architecture not in ARCHITECTURES[:2]:
            raise ValueError(f"{path}: model_type {architecture!r} is not supported (supported: "
                             f"{', '.join(ARCHITECTURES[:2])}, or a TransformerLens {TL_CONFIG})")
    else:
        raise ValueError(f"{path}: no {HF_CONFIG} (Hugging Face) or {TL_CONFIG} "
                         "(TransformerLens) in it")
    try:
        fields, tied, folded = {"gpt2": _gpt2_config, "gpt_neox": _neox_config,
                                "transformer_lens": _tl_config}[architecture](raw)
        config = model_lib.ModelConfig(**fields)
    except (KeyError, TypeError, ValueError) as e:
        what = f"missing config field {e}" if isinstance(e, KeyError) else str(e).splitlines()[0]
        raise ValueError(f"{path}: {what}") from None
    files = _weight_files(path, names)
    for file in files:
        _check_whole(path, file)
    return Checkpoint(path, architecture, config, files, tied, folded)


def _check_whole(path: str, file: str) -> None:
    """A one-line ValueError for a weight file cut short (an interrupted download), from its
    header alone: a safetensors header that does not cover its tensors, a torch zip archive
    without its directory at the end (a legacy pickle .bin is not checked here)."""
    what = None
    if file.endswith(".safetensors"):
        try:
            from safetensors import safe_open  # noqa: PLC0415 - an optional dependency
        except ImportError:
            return  # reading it says what to install
        try:
            with safe_open(file, framework="numpy"):
                pass
        except Exception as err:  # noqa: BLE001 - SafetensorError has no importable base
            what = error_line(err)
    else:
        with open(file, "rb") as f:
            zipped = f.read(2) == b"PK"
        if zipped and not zipfile.is_zipfile(file):
            what = "a zip archive without its end (cut short)"
    if what is not None:
        raise ValueError(f"{path}: {os.path.basename(file)} cannot be read ({what}); is it "
                         "whole? Download it again")


def _refuse(raw: dict, **allowed) -> None:
    """One-line ValueError for an option the model cannot express: raw[key] not in allowed."""
    for key, values in allowed.items():
        if raw.get(key, values[0]) not in values:
            raise ValueError(f"{key}={raw[key]!r} is not supported (supported: {values})")


def _activation(name: str) -> str:
    if name not in _ACTIVATIONS:
        raise ValueError(f"activation {name!r} is not supported (supported: "
                         f"{', '.join(_ACTIVATIONS)})")
    return _ACTIVATIONS[name]


def _gpt2_config(raw: dict) -> tuple[dict, bool, bool]:
    _refuse(raw, scale_attn_weights=(True,), add_cross_attention=(False,))
    d = raw["n_embd"]
    return dict(vocab_size=raw["vocab_size"], max_len=raw["n_positions"], n_layers=raw["n_layer"],
                n_heads=raw["n_head"], d_model=d, d_mlp=raw.get("n_inner") or 4 * d,
                pos_encoding="learned", activation=_activation(raw["activation_function"]),
                ln_eps=raw["layer_norm_epsilon"], key_bias=True,
                attn_scale_by_layer=bool(raw.get("scale_attn_by_inverse_layer_idx", False)),
                ), raw.get("tie_word_embeddings", True), False


def _neox_config(raw: dict) -> tuple[dict, bool, bool]:
    # transformers < 5 writes rotary_pct and rotary_emb_base, >= 5 rope_parameters.
    rope = {**raw.get("rope_parameters", {}), **(raw.get("rope_scaling") or {})}
    _refuse(rope, rope_type=("default",), type=("default",))
    pct = raw.get("rotary_pct", rope.get("partial_rotary_factor", 1.0))
    base = raw.get("rotary_emb_base", rope.get("rope_theta", 10_000))
    d, heads = raw["hidden_size"], raw["num_attention_heads"]
    rotary_dim = int(d // heads * pct)  # as GPT-NeoX rounds it
    if not 0 < rotary_dim <= d // heads:
        raise ValueError(f"rotary_pct={pct} turns {rotary_dim} dimensions of each head")
    return dict(vocab_size=raw["vocab_size"], max_len=raw["max_position_embeddings"],
                n_layers=raw["num_hidden_layers"], n_heads=heads, d_model=d,
                d_mlp=raw["intermediate_size"], pos_encoding="rotary",
                rotary_base=int(base) if float(base).is_integer() else float(base),
                rotary_dim=rotary_dim, rotary_layout="half",
                activation=_activation(raw["hidden_act"]), ln_eps=raw["layer_norm_eps"],
                key_bias=True, parallel_residual=bool(raw.get("use_parallel_residual", True)),
                ), bool(raw.get("tie_word_embeddings", False)), False


def _tl_config(raw: dict) -> tuple[dict, bool, bool]:
    _refuse(raw, normalization_type=("LN", "LNPre"), positional_embedding_type=(
                "standard", "rotary"), gated_mlp=(False,), final_rms=(False,),
            use_local_attn=(False,), use_qk_norm=(False,), post_embedding_ln=(False,),
            use_attn_scale=(True,), attention_dir=("causal",), uses_rms_norm=(False,),
            use_NTK_by_parts_rope=(False,), rotary_interleaved_cos_sin=(False,),
            n_key_value_heads=(None, raw["n_heads"]), d_vocab_out=(-1, raw["d_vocab"]),
            attn_scores_soft_cap=(-1.0,), output_logits_soft_cap=(-1.0,), num_experts=(None,))
    d_head = raw["d_head"]
    if raw.get("attn_scale", -1.0) not in (-1.0, d_head ** 0.5):
        raise ValueError(f"attn_scale={raw['attn_scale']} is not sqrt(d_head)")
    rotary = raw["positional_embedding_type"] == "rotary"
    fields = dict(vocab_size=raw["d_vocab"], max_len=raw["n_ctx"], n_layers=raw["n_layers"],
                  n_heads=raw["n_heads"], d_model=raw["d_model"], d_head=d_head,
                  d_mlp=raw.get("d_mlp") or 0, attn_only=bool(raw.get("attn_only", False)),
                  pos_encoding="rotary" if rotary else "learned",
                  activation=_activation(raw.get("act_fn", "gelu_new")),
                  ln_eps=raw.get("eps", 1e-5), key_bias=True,
                  parallel_residual=bool(raw.get("parallel_attn_mlp", False)),
                  attn_scale_by_layer=bool(raw.get("scale_attn_by_inverse_layer_idx", False)))
    if rotary:
        fields |= dict(rotary_base=raw.get("rotary_base", 10_000),
                       rotary_dim=raw.get("rotary_dim") or d_head,
                       rotary_layout="adjacent" if raw.get("rotary_adjacent_pairs") else "half")
    return fields, False, raw["normalization_type"] == "LNPre"


# ---------------------------------------------------------------------------------------------
# Weights.


def _read_weights(checkpoint: Checkpoint) -> dict[str, np.ndarray]:
    """Every tensor of the checkpoint's files as float32 numpy arrays."""
    out = {}
    for file in checkpoint.files:
        if file.endswith(".safetensors"):
            try:
                from safetensors import safe_open
            except ImportError:
                raise ValueError(f"{checkpoint.path}: {os.path.basename(file)} needs safetensors "
                                 "to read (pip install 'jaxillusions[pretrained]')") from None
            with safe_open(file, framework="numpy") as f:
                names = list(f.keys())
                bf16 = {n for n in names if f.get_slice(n).get_dtype() == "BF16"}
                out |= {n: f.get_tensor(n).astype(np.float32) for n in names if n not in bf16}
            if bf16:  # numpy has no bfloat16: through JAX's
                with safe_open(file, framework="flax") as f:
                    out |= {n: np.asarray(f.get_tensor(n), np.float32) for n in bf16}
            continue
        try:
            import torch
        except ImportError:
            raise ValueError(f"{checkpoint.path}: {os.path.basename(file)} needs torch to read "
                             "(pip install 'jaxillusions[pretrained]')") from None
        try:
            state = torch.load(file, map_location="cpu", weights_only=True)
        except Exception as err:  # noqa: BLE001 - pickle, zip and torch errors alike
            raise ValueError(f"{checkpoint.path}: {os.path.basename(file)} cannot be read "
                             f"({error_line(err)})") from None
        out |= {n: t.float().numpy() for n, t in state.items() if torch.is_tensor(t)}
    return out


class _Weights:
    """A checkpoint's tensors by name (under an optional prefix), each taken at most once; every
    tensor left over at the end must be a buffer (masks, rotary tables), not a parameter."""

    def __init__(self, tensors: dict[str, np.ndarray], path: str, prefix: str = ""):
        self.tensors, self.path, self.used = tensors, path, set()
        self.prefix = prefix if any(n.startswith(prefix) for n in tensors) else ""

    def __call__(self, name: str, default: np.ndarray | None = None,
                 shape: tuple[int, ...] | None = None) -> np.ndarray:
        """The tensor `name`; with `shape`, checked to have it (before it is cut or reshaped)."""
        tensor = self.first((name,), default)
        if shape is not None and tuple(tensor.shape) != tuple(shape):
            raise ValueError(f"{self.path}: weight {name!r} has shape {tuple(tensor.shape)}, "
                             f"its config says {tuple(shape)}")
        return tensor

    def first(self, names: Sequence[str], default: np.ndarray | None = None) -> np.ndarray:
        """The first of `names` stored (each under the prefix, or without it)."""
        tried = [key for name in names for key in dict.fromkeys((self.prefix + name, name))]
        for key in tried:
            if key in self.tensors:
                self.used.add(key)
                return self.tensors[key]
        if default is None:
            raise ValueError(f"{self.path}: weight {tried[0]!r} is missing"
                             + (f" (looked for {', '.join(tried)})" if len(tried) > 1 else ""))
        return default

    def done(self) -> None:
        left = sorted(n for n in self.tensors if n not in self.used and not _BUFFERS.search(n))
        if left:
            raise ValueError(f"{self.path}: {len(left)} weights the model has no place for: "
                             f"{', '.join(left[:5])}{' ...' if len(left) > 5 else ''}")


def _ln(scale: np.ndarray, bias: np.ndarray) -> dict:
    return {"scale": scale, "bias": bias}


def _gpt2_params(w: _Weights, cfg: model_lib.ModelConfig, tied: bool) -> dict:
    """GPT-2's Conv1D weights are [in, out]; c_attn's output is q, k, v, each head-major."""
    d, h, e = cfg.d_model, cfg.n_heads, cfg.head_dim
    blocks = []
    for i in range(cfg.n_layers):
        b = f"h.{i}."
        qkv = w(b + "attn.c_attn.weight", shape=(d, 3 * d))
        qkv_b = w(b + "attn.c_attn.bias", shape=(3 * d,))
        attn = {f"{n}": qkv[:, j * d:(j + 1) * d].reshape(d, h, e)
                for j, n in enumerate(("w_q", "w_k", "w_v"))}
        attn |= {n: qkv_b[j * d:(j + 1) * d].reshape(h, e) for j, n in enumerate(("b_q", "b_k",
                                                                                  "b_v"))}
        attn |= {"w_o": w(b + "attn.c_proj.weight", shape=(h * e, d)).reshape(h, e, d),
                 "b_o": w(b + "attn.c_proj.bias")}
        blocks.append({
            "ln1": _ln(w(b + "ln_1.weight"), w(b + "ln_1.bias")), "attn": attn,
            "ln2": _ln(w(b + "ln_2.weight"), w(b + "ln_2.bias")),
            "mlp": {"w_in": w(b + "mlp.c_fc.weight"), "b_in": w(b + "mlp.c_fc.bias"),
                    "w_out": w(b + "mlp.c_proj.weight"), "b_out": w(b + "mlp.c_proj.bias")}})
    embed = w("wte.weight")
    unembed = embed.T if tied else w("lm_head.weight").T
    if tied:
        w.used.add("lm_head.weight")  # the same tensor, when it is stored
    return {"embed": embed, "pos_embed": w("wpe.weight"), "blocks": blocks,
            "ln_final": _ln(w("ln_f.weight"), w("ln_f.bias")),
            "unembed": {"w": unembed, "b": np.zeros(cfg.vocab_size, np.float32)}}


def _neox_params(w: _Weights, cfg: model_lib.ModelConfig, tied: bool) -> dict:
    """GPT-NeoX's nn.Linear weights are [out, in]; query_key_value's output is per head
    (q, k, v) of that head; attention_bias=False checkpoints have no attention biases (zeros)."""
    d, h, e = cfg.d_model, cfg.n_heads, cfg.head_dim
    blocks = []
    for i in range(cfg.n_layers):
        b = f"layers.{i}."
        qkv = w(b + "attention.query_key_value.weight", shape=(3 * d, d)).T.reshape(d, h, 3, e)
        qkv_b = w(b + "attention.query_key_value.bias", np.zeros(3 * d, np.float32),
                  shape=(3 * d,))
        qkv_b = qkv_b.reshape(h, 3, e)
        attn = {n: qkv[:, :, j] for j, n in enumerate(("w_q", "w_k", "w_v"))}
        attn |= {n: qkv_b[:, j] for j, n in enumerate(("b_q", "b_k", "b_v"))}
        attn |= {"w_o": w(b + "attention.dense.weight", shape=(d, h * e)).T.reshape(h, e, d),
                 "b_o": w(b + "attention.dense.bias", np.zeros(d, np.float32))}
        ln2 = "post_attention_layernorm"
        blocks.append({
            "ln1": _ln(w(b + "input_layernorm.weight"), w(b + "input_layernorm.bias")),
            "attn": attn, "ln2": _ln(w(b + f"{ln2}.weight"), w(b + f"{ln2}.bias")),
            "mlp": {"w_in": w(b + "mlp.dense_h_to_4h.weight").T,
                    "b_in": w(b + "mlp.dense_h_to_4h.bias"),
                    "w_out": w(b + "mlp.dense_4h_to_h.weight").T,
                    "b_out": w(b + "mlp.dense_4h_to_h.bias")}})
    embed = w("embed_in.weight")
    # The head: embed_out in saved checkpoints, lm_head in transformers 5's module (a
    # `torch.save(model.state_dict())` of it).
    unembed = embed.T if tied else w.first(("embed_out.weight", "lm_head.weight")).T
    if tied:
        w.used.update(("embed_out.weight", "lm_head.weight"))
    return {"embed": embed, "blocks": blocks,
            "ln_final": _ln(w("final_layer_norm.weight"), w("final_layer_norm.bias")),
            "unembed": {"w": unembed, "b": np.zeros(cfg.vocab_size, np.float32)}}


def _tl_params(w: _Weights, cfg: model_lib.ModelConfig, folded: bool) -> dict:
    """HookedTransformer's layout: W_Q/K/V [head, d_model, d_head], W_O [head, d_head, d_model]."""
    d = cfg.d_model

    def ln(name: str) -> dict:
        if folded:  # LNPre: normalisation only
            return _ln(np.ones(d, np.float32), np.zeros(d, np.float32))
        return _ln(w(f"{name}.w"), w(f"{name}.b"))

    blocks = []
    for i in range(cfg.n_layers):
        b = f"blocks.{i}."
        attn = {f"w_{x}": np.transpose(w(f"{b}attn.W_{x.upper()}"), (1, 0, 2)) for x in "qkv"}
        attn |= {f"b_{x}": w(f"{b}attn.b_{x.upper()}") for x in "qkv"}
        attn |= {"w_o": w(b + "attn.W_O"), "b_o": w(b + "attn.b_O")}
        block = {"ln1": ln(b + "ln1"), "attn": attn}
        if not cfg.attn_only:
            block |= {"ln2": ln(b + "ln2"),
                      "mlp": {"w_in": w(b + "mlp.W_in"), "b_in": w(b + "mlp.b_in"),
                              "w_out": w(b + "mlp.W_out"), "b_out": w(b + "mlp.b_out")}}
        blocks.append(block)
    params = {"embed": w("embed.W_E"), "blocks": blocks, "ln_final": ln("ln_final"),
              "unembed": {"w": w("unembed.W_U"),
                          "b": w("unembed.b_U", np.zeros(cfg.vocab_size, np.float32))}}
    if cfg.pos_encoding == "learned":
        params["pos_embed"] = w("pos_embed.W_pos")
    return params


_CONVERT = {"gpt2": ("transformer.", _gpt2_params, "tied"),
            "gpt_neox": ("gpt_neox.", _neox_params, "tied"),
            "transformer_lens": ("", _tl_params, "folded_ln")}


def load_checkpoint(checkpoint: Checkpoint | str | os.PathLike, shapes: dict | None = None
                    ) -> dict:
    """One checkpoint's params (no member axis; float32 numpy arrays), checked against its
    config's shapes (`shapes`: jax.eval_shape of model.init_params, computed if not given)."""
    if not isinstance(checkpoint, Checkpoint):
        checkpoint = inspect_checkpoint(checkpoint)
    cfg = checkpoint.config
    if shapes is None:
        shapes = jax.eval_shape(lambda: model_lib.init_params(jax.random.PRNGKey(0), cfg))
    prefix, convert, option = _CONVERT[checkpoint.architecture]
    weights = _Weights(_read_weights(checkpoint), checkpoint.path, prefix)
    params = convert(weights, cfg, getattr(checkpoint, option))
    weights.done()
    expected = jax.tree_util.tree_flatten_with_path(shapes)[0]
    got, treedef = jax.tree_util.tree_flatten_with_path(params)
    if treedef != jax.tree.structure(shapes):
        raise ValueError(f"{checkpoint.path}: parameters {treedef} are not the config's "
                         f"{jax.tree.structure(shapes)}")
    for (path, want), (_, leaf) in zip(expected, got, strict=True):
        if tuple(leaf.shape) != tuple(want.shape):
            raise ValueError(f"{checkpoint.path}: {model_lib.path_str(path)} has shape "
                             f"{tuple(leaf.shape)}, its config says {tuple(want.shape)}")
    return jax.tree.map(lambda x: np.ascontiguousarray(x, np.float32), params)
