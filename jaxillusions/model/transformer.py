"""A decoder-only transformer as data plus pure functions.

Parameters are a nested dict of arrays; `forward` is a pure function of (params, tokens), so it runs
unchanged under `jax.vmap` over a leading seed axis of the parameters.

Every intermediate value passes through a named *site* (TransformerLens-style names):

    embed, pos_embed,
    blocks.{i}.resid_pre, blocks.{i}.attn.{q,k,v}            [batch, pos, head, d_head]
    blocks.{i}.attn.{rot_q,rot_k} (rotary positions only)    [batch, pos, head, d_head]
    blocks.{i}.attn.scores, blocks.{i}.attn.pattern           [batch, head, query, key]
    blocks.{i}.attn.z [batch, pos, head, d_head], blocks.{i}.attn.out, blocks.{i}.resid_mid,
    blocks.{i}.mlp.hidden, blocks.{i}.mlp.out, blocks.{i}.resid_post, ln_final, logits

A model may have a built *part* (`ModelConfig.front`, a `Part`) in place of the token embedding
and its first blocks: its fixed tables, its sites and a pure apply, built from the data by the
task (Wen et al.'s minimal first layer, tasks/minimal_layer.py: block 0 without attention, sites
`blocks.0.minimal.out` and `blocks.0.resid_post`). The model knows parts only through `Part`.

With `pos_encoding="rotary"` (Su et al.'s RoPE) nothing is added to the residual stream: every
layer rotates its queries and keys (model/positions.py). `attn.q` and `attn.k` are the vectors
before the rotation (TransformerLens's hook_q/hook_k), `attn.rot_q` and `attn.rot_k` after it.

Imported checkpoints (model/pretrained.py: GPT-2, GPT-NeoX/Pythia, TransformerLens) set options
a trained model keeps at their defaults (`IMPORTED_FIELDS`, not settings keys): the activation
(tanh or exact GELU), the LayerNorms' epsilon, a key bias (`attn.k` includes it), scores also
divided by layer + 1, attention and MLP in parallel (both read `resid_pre`; `resid_mid` is then
resid_pre + attn.out, which the MLP does not read, and resid_post adds mlp.out to it), and
rotary positions on the first `rotary_dim` dimensions of each head, in GPT-J's adjacent pairs or
GPT-NeoX's halves (`rotary_layout="half"`: dimension i pairs with i + rotary_dim / 2).

An *intervention* is a function `(site_name, value) -> value` called at every site; it is how
proxies replace activations. Site names are static Python strings, so an intervention that ignores
a site costs nothing after tracing. `cache` names the sites whose values `forward` returns. A
model's *standing* interventions (`ModelConfig.interventions`: `UniformAttention`, a layer whose
pattern is frozen uniform over the causal prefix) are part of the model as trained: `forward`
applies them at every call, before the caller's, so no caller can run the model without them.

`span=Span(layer, residual)` runs only the rest of the model: block `layer` onwards, from the
residual stream entering it (`residual_site(cfg, layer)`, cached from an earlier pass). An
intervention that changes nothing before block `layer` (`first_block` of its sites) gives the
same logits from there as from the tokens, so a proxy evaluated at many sizes shares the prefix
of one pass (faithfulness.evaluate). `Span(readout=positions)` computes the logits at those
positions only (the evaluated ones), and the last block's queries and all after them there.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Iterable
from typing import Protocol

import jax
import jax.numpy as jnp
import numpy as np

from jaxillusions.model import positions as pos_enc
from jaxillusions.model.params import Params, check_params

Intervention = Callable[[str, jax.Array], jax.Array]

POS_ENCODINGS = ("none", "learned", "sinusoidal", "linear", "rotary")
EMBEDDINGS = ("learned", "onehot")  # onehot: frozen one-hot token embeddings
# bfloat16: matmul operands and the activations between them in bf16 (f32 accumulation); the
# residual stream, layer norms, attention scores and softmax, logits and loss stay in f32, and
# parameters and optimizer state are f32 (mixed precision).
COMPUTE_DTYPES = ("float32", "bfloat16")
ACTIVATIONS = ("gelu_tanh", "gelu")  # GPT-2's gelu_new (tanh approximation); exact (erf) GELU
ROTARY_LAYOUTS = ("adjacent", "half")  # pairs (2i, 2i+1) (GPT-J); (i, i + r/2) (GPT-NeoX)
_BLOCK_SITES = (
    "resid_pre", "attn.q", "attn.k", "attn.v", "attn.rot_q", "attn.rot_k", "attn.scores",
    "attn.pattern", "attn.z", "attn.out", "resid_mid", "mlp.hidden", "mlp.out", "resid_post")
_ROTARY_SITES = ("attn.rot_q", "attn.rot_k")  # only with pos_encoding="rotary"
Site = Callable[[str, jax.Array], jax.Array]  # forward's own: intervenes and caches


class Part(Protocol):
    """A built part of the model in place of the token embedding and blocks 0 .. layers - 1:
    data plus pure functions. Frozen and hashable (the config is a static jit argument)."""

    layers: int  # blocks it takes the place of; the attention blocks start at this one
    sites: tuple[str, ...]  # its sites, in forward order

    def check(self, cfg: ModelConfig) -> None:
        """One-line ValueError where the rest of the architecture cannot take the part."""

    def block_shapes(self, cfg: ModelConfig) -> list[Params]:
        """The parameters of its `layers` blocks as `param_shapes` leaves (shape, scale); a
        callable scale is a fixed table, `scale(cfg)`, never trained (`frozen_paths`)."""

    def apply(self, params: Params, tokens: jax.Array, site: Site) -> jax.Array:
        """The residual stream entering block `layers`, each of its sites passed through
        `site(name, value)`."""


def uniform_pattern(shape: tuple[int, ...]) -> jax.Array:
    """Attention [..., T, T] in which query i attends uniformly to keys 0..i (float32)."""
    t = shape[-1]
    assert shape[-2] == t, f"expected square [..., T, T] attention, got {shape}"
    causal = jnp.tril(jnp.ones((t, t), jnp.float32))
    return jnp.broadcast_to(causal / causal.sum(-1, keepdims=True), shape)


@dataclasses.dataclass(frozen=True)
class UniformAttention:
    """A standing intervention: the attention patterns of `layers` frozen uniform over the
    causal prefix (the settings key model.uniform_attention_layers). Their queries and keys
    then get no gradient; the uniform_attention proxy makes the same pattern after training."""

    layers: tuple[int, ...]

    def __call__(self, site: str, value: jax.Array) -> jax.Array:
        # Static strings: the test runs once, at tracing.
        if site in {f"blocks.{i}.attn.pattern" for i in self.layers}:
            return uniform_pattern(value.shape).astype(value.dtype)
        return value

    def check(self, cfg: ModelConfig) -> None:
        first = first_attention_layer(cfg)
        bad = [i for i in self.layers if not first <= i < cfg.n_layers]
        if bad:
            raise ValueError(f"model.uniform_attention_layers={self.layers}: layers {bad} have "
                             f"no attention (n_layers={cfg.n_layers}, attention blocks "
                             f"{first}..{cfg.n_layers - 1})")


def compose(*interventions: Intervention | None) -> Intervention | None:
    """One intervention applying `interventions` in order (None ones skipped; none left: None)."""
    chain = tuple(i for i in interventions if i is not None)
    if len(chain) < 2:
        return chain[0] if chain else None

    def composed(site: str, value: jax.Array) -> jax.Array:
        for intervention in chain:
            value = intervention(site, value)
        return value

    return composed


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The architecture. Its fields from n_layers on are settings.Model's keys, with the
    defaults a config gets (settings.Model reads them from here: one source); vocab_size and
    max_len come from the data, and `front` and `interventions` are built from settings
    (`from_settings`, train.model_config)."""

    vocab_size: int
    # Number of positions the model supports (sequence length incl. BOS/EOS); rotary positions
    # have no table and run any length (max_len is then TransformerLens's n_ctx on export).
    max_len: int
    n_layers: int = 2
    n_heads: int = 1
    d_model: int = 32
    d_head: int = 0  # 0: d_model // n_heads
    d_mlp: int = 64
    pos_encoding: str = "learned"
    rotary_base: int = 10_000  # pos_encoding="rotary": pair i turns by base^(-2i/d_head) a step
    attn_only: bool = False  # attention-only blocks (no MLP)
    embedding: str = "learned"  # "onehot": frozen one-hot token embeddings (d_model >= vocab)
    compute_dtype: str = "float32"  # COMPUTE_DTYPES
    # A built part in place of the token embedding and the first blocks (None: the embedding).
    front: Part | None = None
    # Standing interventions, applied by every forward pass before the caller's (`compose`);
    # hashable, as the config is a static jit argument (frozen dataclasses: UniformAttention).
    interventions: tuple[Intervention, ...] = ()
    # What imported checkpoints need (IMPORTED_FIELDS; model/pretrained.py); the defaults are
    # the trained model's architecture.
    activation: str = "gelu_tanh"  # ACTIVATIONS
    ln_eps: float = 1e-5  # every LayerNorm's epsilon
    key_bias: bool = False  # a b_k parameter (GPT-2, GPT-NeoX)
    attn_scale_by_layer: bool = False  # scores also / (layer + 1) (Mistral's GPT-2 runs)
    parallel_residual: bool = False  # attention and MLP both read resid_pre (GPT-NeoX, GPT-J)
    rotary_dim: int = 0  # rotary: dimensions turned, the first of each head (0: all of them)
    rotary_layout: str = "adjacent"  # ROTARY_LAYOUTS

    def __post_init__(self):
        for name, allowed in (("pos_encoding", POS_ENCODINGS), ("embedding", EMBEDDINGS),
                              ("compute_dtype", COMPUTE_DTYPES), ("activation", ACTIVATIONS),
                              ("rotary_layout", ROTARY_LAYOUTS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"model.{name}={getattr(self, name)!r}: expected one of "
                                 f"{allowed}")
        for name in ("vocab_size", "max_len", "n_layers", "n_heads", "d_model"):
            if getattr(self, name) < 1:
                raise ValueError(f"model.{name}={getattr(self, name)}: must be >= 1")
        if self.d_head == 0 and self.d_model % self.n_heads:
            raise ValueError(f"model.d_model={self.d_model} is not divisible by "
                             f"model.n_heads={self.n_heads}; set model.d_head explicitly")
        if self.pos_encoding == "rotary" and ((self.head_dim % 2 and not self.rotary_dim)
                                              or self.rotary_base < 2):
            raise ValueError(f"model.pos_encoding='rotary' turns pairs of dimensions: needs an "
                             f"even d_head (got {self.head_dim}) and model.rotary_base >= 2 "
                             f"(got {self.rotary_base})")
        if self.rotary_dim % 2 or not 0 <= self.rotary_dim <= self.head_dim:
            raise ValueError(f"model.rotary_dim={self.rotary_dim}: rotary positions turn pairs "
                             f"of a head's first dimensions; must be even and <= d_head "
                             f"({self.head_dim})")
        if self.ln_eps <= 0:
            raise ValueError(f"model.ln_eps={self.ln_eps}: must be > 0")
        if not self.attn_only and self.d_mlp < 1:
            raise ValueError(f"model.d_mlp={self.d_mlp}: must be >= 1 (or set model.attn_only)")
        if self.embedding == "onehot" and self.d_model < self.vocab_size:
            raise ValueError(f"model.embedding='onehot' needs d_model >= vocab_size "
                             f"({self.vocab_size}), got d_model={self.d_model}")
        for part in (self.front, *self.interventions):
            if hasattr(part, "check"):
                part.check(self)

    @property
    def head_dim(self) -> int:
        return self.d_head or self.d_model // self.n_heads

    @property
    def packable(self) -> bool:  # a front reads a row as one sentence; uniform attention too
        """Whether forward on packed rows (segments) computes each sentence as if alone."""
        return self.front is None and not self.interventions

    @property
    def rotary_dims(self) -> int:
        """The dimensions of each head that rotary positions turn."""
        return self.rotary_dim or self.head_dim

    @classmethod
    def from_settings(cls, model_settings, vocab_size: int, max_len: int,
                      front: Part | None = None) -> ModelConfig:
        """The model config of a run: every field of settings.Model that is one of these (all but
        its max_len, a lower bound on this one), its uniform_attention_layers as a standing
        `UniformAttention`, plus what the data decides (sizes, and `front`, built by the task)."""
        chosen = {name: getattr(model_settings, name) for name in SETTINGS_FIELDS}
        layers = tuple(model_settings.uniform_attention_layers)
        return cls(**chosen, vocab_size=vocab_size, max_len=max_len, front=front,
                   interventions=(UniformAttention(layers),) if layers else ())


# What the data or other settings decide, and what only imported checkpoints set; every other
# field is a key of settings.Model.
_BUILT = ("vocab_size", "max_len", "front", "interventions")
IMPORTED_FIELDS = ("activation", "ln_eps", "key_bias", "attn_scale_by_layer",
                   "parallel_residual", "rotary_dim", "rotary_layout")
SETTINGS_FIELDS = {f.name: f.default for f in dataclasses.fields(ModelConfig)
                   if f.name not in _BUILT + IMPORTED_FIELDS}
"""{field: default} of the fields a config sets (model.<field>), in ModelConfig's order."""


def site_names(cfg: ModelConfig) -> tuple[str, ...]:
    """All activation sites of the model, in forward order."""
    names = ["embed"] + (["pos_embed"] if cfg.pos_encoding not in ("none", "rotary") else [])
    if cfg.front is not None:
        names = list(cfg.front.sites)
    for i in range(first_attention_layer(cfg), cfg.n_layers):
        block = [s for s in _BLOCK_SITES if not (cfg.attn_only and s.startswith("mlp."))
                 and (cfg.pos_encoding == "rotary" or s not in _ROTARY_SITES)]
        names += [f"blocks.{i}.{s}" for s in block]
    return tuple(names + ["ln_final", "logits"])


def imported_options(cfg: ModelConfig) -> dict:
    """{field: value} of the IMPORTED_FIELDS that differ from their defaults (none: a model
    this project trains)."""
    defaults = {f.name: f.default for f in dataclasses.fields(ModelConfig)}
    return {f: getattr(cfg, f) for f in IMPORTED_FIELDS if getattr(cfg, f) != defaults[f]}


def check_site(cfg: ModelConfig, site: str) -> str:
    if site not in site_names(cfg):
        raise ValueError(f"unknown activation site {site!r}; this model has: "
                         f"{', '.join(site_names(cfg))}")
    return site


def first_block(cfg: ModelConfig, sites: Iterable[str]) -> int | None:
    """The earliest attention block any of `sites` is in ('blocks.3.attn.k' -> 3; ln_final and
    logits: n_layers, after the last), or None where one precedes every attention block (the
    embeddings, the minimal first layer) or there are no sites."""
    layers = []
    for site in sites:
        parts = site.split(".")
        if parts[0] == "blocks" and int(parts[1]) >= first_attention_layer(cfg):
            layers.append(int(parts[1]))
        elif site in ("ln_final", "logits"):
            layers.append(cfg.n_layers)
        else:
            return None
    return min(layers, default=None)


def before_readout(cfg: ModelConfig, sites: Iterable[str]) -> bool:
    """Whether forward with a `readout` computes each of `sites` at every position: none comes
    after the last block's values and (rotary) keys, where its queries are read out (its
    scores and pattern hold the readout's query rows); and the model has no standing
    intervention (one may read a whole pattern)."""
    names, last = site_names(cfg), f"blocks.{cfg.n_layers - 1}.attn.scores"
    return not cfg.interventions and last in names and all(
        names.index(s) < names.index(last) for s in sites)


def residual_site(cfg: ModelConfig, layer: int) -> str:
    """The site holding the residual stream that enters block `layer` (after the last block: the
    last block's resid_post), to cache for `forward(span=Span(layer, value))`."""
    first = first_attention_layer(cfg)
    if not first <= layer <= cfg.n_layers:
        raise ValueError(f"start layer {layer}: the model's attention blocks are "
                         f"{first}..{cfg.n_layers - 1} (or {cfg.n_layers}: after the last)")
    return f"blocks.{layer}.resid_pre" if layer < cfg.n_layers else f"blocks.{layer-1}.resid_post"


def first_attention_layer(cfg: ModelConfig) -> int:
    """The first block with attention: the first after the built part, if any."""
    return 0 if cfg.front is None else cfg.front.layers


def mlp_input(params: Params, layer: int, resid_mid: jax.Array, eps: float = 1e-5) -> jax.Array:
    """The input of block `layer`'s MLP: its layer norm of `blocks.{layer}.resid_mid`, as
    `forward` computes it (eps: the model's cfg.ln_eps). With parallel_residual the MLP reads
    `blocks.{layer}.resid_pre` instead, through the same layer norm; a transcoder (at
    `blocks.{layer}.mlp.out`) reads whichever its model's MLP reads (proxies/transcoder.py)."""
    return _layer_norm(resid_mid, params["blocks"][layer]["ln2"], eps)


def _layer_norm(x: jax.Array, p: Params, eps: float = 1e-5) -> jax.Array:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + eps) * p["scale"] + p["bias"]


@dataclasses.dataclass(frozen=True)
class Span:
    """The part of a forward pass that runs (faithfulness.evaluate's passes): from block
    `start_layer`, whose input is `residual` [batch, pos, d_model] (the value of
    `residual_site(cfg, start_layer)`; the embeddings and the blocks before it are skipped and
    their sites not visited; None: from the tokens), to the logits at the positions `readout`
    (int [batch, K], -1 allowed: `at_positions`; None: every position): the last block runs
    its queries there only (its keys and values at every position), so its sites from
    attn.scores on hold [batch, head, K, pos] and [batch, K, ...] (`before_readout`)."""

    start_layer: int | None = None
    residual: jax.Array | None = None
    readout: jax.Array | None = None


def at_positions(t: jax.Array, positions: jax.Array, axis: int = 1) -> jax.Array:
    """t [batch, ..., pos (at `axis`), ...] at each row's `positions` [batch, K] (a readout,
    runtime/chunks.readout: -1, past a row's last, is read at position 0 and scores nothing)."""
    shape = (len(positions), *[1] * (axis - 1), positions.shape[1], *[1] * (t.ndim - axis - 1))
    return jnp.take_along_axis(t, jnp.maximum(positions, 0).reshape(shape), axis)


def forward(params: Params, tokens: jax.Array, cfg: ModelConfig, *,
            intervention: Intervention | None = None, cache: Iterable[str] | str = (),
            position_offset: jax.Array | None = None, segments: jax.Array | None = None,
            span: Span = Span()) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Logits [batch, pos, vocab] for tokens [batch, pos], and the cached sites.

    `intervention` applies after the model's standing ones (`cfg.interventions`).
    `position_offset` (int [batch], or [batch, pos] per token; default 0): token t sits at
    position offset + t (training's random offsets train positions past the sentence length).
    `segments` (int [batch, pos]): tokens attend within their segment id only (packed rows;
    ValueError for a model that reads a row as one sentence: not `cfg.packable`).
    `span` (`Span`): from a later block, or to the logits [batch, K, vocab] at K positions.
    """
    if segments is not None and not cfg.packable:
        raise ValueError("model.forward: packed rows (segments) for a model that reads a row as "
                         "one sentence (a built front or standing interventions: packable)")
    if np.ndim(params.get("ln_final", {}).get("scale")) == 2:  # static: checked at tracing
        raise ValueError(f"model.forward: params have a leading member axis (ln_final scale "
                         f"{params['ln_final']['scale'].shape}): pass one member's, "
                         f"run.seed_params(seed), or jax.vmap")
    check_params(params, cfg)
    if np.ndim(tokens) != 2:
        raise ValueError(f"model.forward: tokens [batch, pos], not of shape {np.shape(tokens)}")
    ids = () if isinstance(tokens, jax.core.Tracer) else np.asarray(tokens)  # known ones only
    if np.size(ids) and not (0 <= ids.min() and ids.max() < cfg.vocab_size):
        raise ValueError(f"model.forward: token ids {ids.min()}..{ids.max()} outside the "
                         f"vocabulary 0..{cfg.vocab_size - 1}")
    cache = frozenset(check_site(cfg, s) for s in ([cache] if isinstance(cache, str) else cache))
    cached: dict[str, jax.Array] = {}
    intervention = compose(*cfg.interventions, intervention)

    def site(name: str, value: jax.Array) -> jax.Array:
        # Interventions and the cache see f32 values whatever the compute dtype (a no-op in f32).
        dtype = value.dtype
        if intervention is not None:
            out = intervention(name, value.astype(jnp.float32))
            try:  # e.g. zeros of the last axis alone: the same for every position
                out = jnp.broadcast_to(out, value.shape)
            except (TypeError, ValueError):
                got = "None" if out is None else f"shape {np.shape(out)}"
                raise ValueError(f"intervention at {name} returned {got}, which does not "
                                 f"broadcast to the site's shape {value.shape}") from None
            value = out.astype(dtype)
        if name in cache:
            cached[name] = value.astype(jnp.float32)
        return value

    cdt = jnp.dtype(cfg.compute_dtype)

    def mm(spec: str, x: jax.Array, w: jax.Array, out=cdt) -> jax.Array:
        """einsum with operands in the compute dtype, f32 accumulation, result in `out`."""
        return jnp.einsum(spec, x.astype(cdt), w.astype(cdt),
                          preferred_element_type=jnp.float32).astype(out)

    def projected(x: jax.Array, w: jax.Array, out=cdt) -> jax.Array:
        """x [..., d] @ w [d, f] through `projection`, operands in the compute dtype."""
        return projection(x.astype(cdt), w.astype(cdt)).astype(out)

    def linear(x: jax.Array, w: jax.Array, out=cdt) -> jax.Array:
        """x [..., d] @ w [d, f] as mm; through `projection` where f != d."""
        return projected(x, w, out) if w.shape[-1] != w.shape[0] else mm("...d,df->...f", x, w, out)

    readout, seq_len, rotary = span.readout, tokens.shape[-1], cfg.pos_encoding == "rotary"
    if seq_len > cfg.max_len and not rotary:
        raise ValueError(f"sequence length {seq_len} exceeds the model's max_len {cfg.max_len}")
    first = first_attention_layer(cfg)
    if span.start_layer is not None:
        residual_site(cfg, span.start_layer)  # checks the layer
        first, x = span.start_layer, span.residual
    elif cfg.front is not None:
        x = cfg.front.apply(params, tokens, site)
    else:
        x = site("embed", params["embed"][tokens])
    positions = jnp.arange(seq_len)
    if position_offset is not None:  # caller keeps offset + seq_len <= max_len
        positions = position_offset.reshape(len(position_offset), -1) + positions
    if rotary:  # [(batch,) pos, d_head // 2], for every layer's queries and keys
        cos, sin = pos_enc.rotary_table(max(cfg.max_len, seq_len), cfg.rotary_dims,
                                        cfg.rotary_base)
        cos, sin = ((cos[:seq_len], sin[:seq_len]) if position_offset is None
                    else (jnp.asarray(cos)[positions], jnp.asarray(sin)[positions]))
    elif cfg.pos_encoding != "none" and span.start_layer is None:
        x = x + site("pos_embed", pos_enc.embedding(params, cfg, positions))
    causal = jnp.tril(jnp.ones((seq_len, seq_len), bool))
    if segments is not None:  # [batch, 1 (heads), query, key]
        causal &= segments[:, None, :, None] == segments[:, None, None, :]
    for i in range(first, cfg.n_layers):
        block, name = params["blocks"][i], f"blocks.{i}"
        x = site(f"{name}.resid_pre", x)
        a = block["attn"]
        resid_pre, h = x, _layer_norm(x, block["ln1"], cfg.ln_eps)
        q = site(f"{name}.attn.q", mm("btd,dhe->bthe", h, a["w_q"]) + a["b_q"].astype(cdt))
        k = mm("btd,dhe->bthe", h, a["w_k"])
        k = site(f"{name}.attn.k", k + a["b_k"].astype(cdt) if cfg.key_bias else k)
        v = site(f"{name}.attn.v", mm("btd,dhe->bthe", h, a["w_v"]) + a["b_v"].astype(cdt))
        if rotary:  # turned in float32 (a no-op cast in float32 compute)
            q, k = (site(f"{name}.attn.rot_{n}", pos_enc.rotate(
                t.astype(jnp.float32), cos, sin, cfg.rotary_layout).astype(cdt))
                    for n, t in (("q", q), ("k", k)))
        if readout is not None and i == cfg.n_layers - 1:  # the rest per query: `readout`'s
            q, x = at_positions(q, readout), at_positions(x, readout)
            resid_pre = x
            causal = at_positions(jnp.broadcast_to(causal, (len(x), 1, seq_len, seq_len)),
                                  readout, axis=2)
        scores = mm("bqhe,bkhe->bhqk", q, k, jnp.float32) / math.sqrt(cfg.head_dim)
        if cfg.attn_scale_by_layer:
            scores = scores / (i + 1)
        scores = site(f"{name}.attn.scores", jnp.where(causal, scores, -jnp.inf))
        pattern = site(f"{name}.attn.pattern", attention_pattern(scores))
        z = site(f"{name}.attn.z", mm("bhqk,bkhe->bqhe", pattern, v))
        # Heads flattened into one `projection`, whose weight gradient z^T g has XLA:CPU transpose
        # z, not the residual stream's gradient, whose producers it fused into that copy.
        w_o = a["w_o"].reshape(-1, a["w_o"].shape[-1])
        attn_out = site(f"{name}.attn.out", projected(z.reshape(*z.shape[:-2], -1), w_o)
                        + a["b_o"].astype(cdt))
        x = site(f"{name}.resid_mid", x + attn_out)
        if not cfg.attn_only:
            m = block["mlp"]
            h = mlp_input(params, i, resid_pre if cfg.parallel_residual else x, cfg.ln_eps)
            gelu = functools.partial(jax.nn.gelu, approximate=cfg.activation == "gelu_tanh")
            hidden = site(f"{name}.mlp.hidden",
                          gelu(linear(h, m["w_in"]) + m["b_in"].astype(cdt)))
            x = x + site(f"{name}.mlp.out", linear(hidden, m["w_out"]) + m["b_out"].astype(cdt))
        x = site(f"{name}.resid_post", x)
    if readout is not None and first == cfg.n_layers:  # no block ran
        x = at_positions(x, readout)
    x = site("ln_final", _layer_norm(x, params["ln_final"], cfg.ln_eps))
    logits = site("logits", linear(x, params["unembed"]["w"], jnp.float32)
                  + params["unembed"]["b"])
    return logits, cached


@jax.custom_vjp
def projection(x: jax.Array, w: jax.Array) -> jax.Array:
    """x [..., d] @ w [d, f] (the MLP's two projections, the unembedding where f != d, the
    attention's output projection), accumulated in float32, with the weight's gradient, a
    product contracted over the positions, laid out as XLA:CPU's fast matmuls take it: the left
    operand, which XLA:CPU copies to put the positions innermost, is the narrower of x and the
    output gradient g, and x at equal widths (g's producers would be fused into the copy).
    Widening (f > d) and equal widths: x^T g. Narrowing (f < d): (g^T x)^T, its transposes kept
    by optimization barriers, which XLA would otherwise fold back into the product's slower
    layout. The values are einsum's bit for bit, the gradients equal within float32 rounding
    (docs/speed.md)."""
    return jnp.einsum("...d,df->...f", x, w, preferred_element_type=jnp.float32)


def _projection_bwd(res, g):
    x, w = res
    dx = jnp.einsum("...f,df->...d", g.astype(w.dtype), w, preferred_element_type=jnp.float32)
    x, g = x.reshape(-1, x.shape[-1]), g.reshape(-1, g.shape[-1]).astype(x.dtype)
    if w.shape[1] >= w.shape[0]:
        dw = jnp.einsum("nd,nf->df", x, g, preferred_element_type=jnp.float32)
    else:
        kept = jax.lax.optimization_barrier
        dw = kept(jnp.matmul(kept(g.T), x, preferred_element_type=jnp.float32)).T
    return dx.astype(x.dtype), dw.astype(w.dtype)


projection.defvjp(lambda x, w: (projection(x, w), (x, w)), _projection_bwd)


def attention_pattern(scores: jax.Array) -> jax.Array:
    """Softmax over the last (key) axis, differentiated by its own rule, p (g - sum(g p)) (JAX's
    `softmax_custom_jvp`), rather than through exp and the quotient by the sum: the same values
    bit for bit, gradients equal within float32 rounding, and a backward pass with fewer
    operations (on the 2-core CPU the training step of the Quickstart's model ran 1.1x as fast,
    docs/speed.md)."""
    with jax.softmax_custom_jvp(True):
        return jax.nn.softmax(scores, axis=-1)
