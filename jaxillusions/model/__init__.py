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

With `first_layer="minimal"` (Wen et al., Assumption 1) block 0 has no attention: its output at
every position is a fixed feature vector of (token, depth) only, with the sites
`blocks.0.minimal.out` and `blocks.0.resid_post` (no `embed`). Depth is the bracket depth after the
token, computed inside `forward` from `open_ids` / `close_ids` (a cumulative sum).

With `pos_encoding="rotary"` (Su et al.'s RoPE) nothing is added to the residual stream: every
layer rotates its queries and keys by angles proportional to their positions, so an attention
score depends on the query's and key's positions only through their difference. `attn.q` and
`attn.k` are the vectors before the rotation (TransformerLens's hook_q/hook_k), `attn.rot_q` and
`attn.rot_k` after it (hook_rot_q/hook_rot_k); a proxy at `attn.k` is rotated like the keys it
replaces. Each adjacent pair (2i, 2i+1) of a head's dimensions turns by position * base^(-2i/d_head)
(GPT-J's pairing, TransformerLens's `rotary_adjacent_pairs=True`, the only one of its 4.x native
model); the cos/sin table is computed in float64 on the host and rounded to float32 once, so it
is the same on every backend.

An *intervention* is a function `(site_name, value) -> value` called at every site; it is how
proxies replace activations. Site names are static Python strings, so an intervention that ignores
a site costs nothing after tracing. `cache` names the sites whose values `forward` returns.

`start_at=(layer, residual)` runs only the rest of the model: block `layer` onwards, from the
residual stream entering it (`residual_site(cfg, layer)`, cached from an earlier pass). An
intervention that changes nothing before block `layer` (`first_block` of its sites) gives the
same logits from there as from the tokens, so a proxy evaluated at many sizes shares the prefix
of one pass (faithfulness.evaluate).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable

import jax
import jax.numpy as jnp
import numpy as np

Params = dict
Intervention = Callable[[str, jax.Array], jax.Array]

POS_ENCODINGS = ("none", "learned", "sinusoidal", "linear", "rotary")
FIRST_LAYERS = ("standard", "minimal")
# Wen et al. eqs. 19-21: one-hot of (token, depth); one-hot token ++ one-hot depth; Yao et al.'s
# one-hot token ++ (cos theta_d, sin theta_d), theta_d = arctan(d / (D + 2 - d)).
MINIMAL_EMBEDDINGS = ("onehot", "type_depth", "yao")
EMBEDDINGS = ("learned", "onehot")  # onehot: frozen one-hot token embeddings
# bfloat16: matmul operands and the activations between them in bf16 (f32 accumulation); the
# residual stream, layer norms, attention scores and softmax, logits and loss stay in f32, and
# parameters and optimizer state are f32 (mixed precision).
COMPUTE_DTYPES = ("float32", "bfloat16")
_BLOCK_SITES = (
    "resid_pre", "attn.q", "attn.k", "attn.v", "attn.rot_q", "attn.rot_k", "attn.scores",
    "attn.pattern", "attn.z", "attn.out", "resid_mid", "mlp.hidden", "mlp.out", "resid_post",
)
_ROTARY_SITES = ("attn.rot_q", "attn.rot_k")  # only with pos_encoding="rotary"


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The architecture. Its fields after max_len are settings.Model's keys, with the defaults
    a config gets (settings.Model reads them from here: one source); vocab_size, max_len and
    the bracket fields come from the data (`from_settings`)."""

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
    uniform_attention_layers: tuple[int, ...] = ()  # layers whose attention is frozen uniform
    embedding: str = "learned"  # "onehot": frozen one-hot token embeddings (d_model >= vocab)
    first_layer: str = "standard"  # "minimal": block 0 outputs fixed features of (token, depth)
    minimal_embedding: str = "onehot"  # features of the minimal first layer (MINIMAL_EMBEDDINGS)
    compute_dtype: str = "float32"  # COMPUTE_DTYPES
    # Set from the data (train.build): bracket token ids by type, the language's depth bound D
    # and the number of depth values with their own minimal-layer features (deeper ones clip).
    open_ids: tuple[int, ...] = ()
    close_ids: tuple[int, ...] = ()
    max_depth: int = 0
    depth_bins: int = 0

    def __post_init__(self):
        for name, allowed in (("pos_encoding", POS_ENCODINGS), ("embedding", EMBEDDINGS),
                              ("first_layer", FIRST_LAYERS),
                              ("minimal_embedding", MINIMAL_EMBEDDINGS),
                              ("compute_dtype", COMPUTE_DTYPES)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"model.{name}={getattr(self, name)!r}: expected one of "
                                 f"{allowed}")
        for name in ("vocab_size", "max_len", "n_layers", "n_heads", "d_model"):
            if getattr(self, name) < 1:
                raise ValueError(f"model.{name}={getattr(self, name)}: must be >= 1")
        if self.d_head == 0 and self.d_model % self.n_heads:
            raise ValueError(f"model.d_model={self.d_model} is not divisible by "
                             f"model.n_heads={self.n_heads}; set model.d_head explicitly")
        if self.pos_encoding == "rotary" and (self.head_dim % 2 or self.rotary_base < 2):
            raise ValueError(f"model.pos_encoding='rotary' turns pairs of dimensions: needs an "
                             f"even d_head (got {self.head_dim}) and model.rotary_base >= 2 "
                             f"(got {self.rotary_base})")
        if not self.attn_only and self.d_mlp < 1:
            raise ValueError(f"model.d_mlp={self.d_mlp}: must be >= 1 (or set model.attn_only)")
        bad = [i for i in self.uniform_attention_layers if not 0 <= i < self.n_layers]
        if bad:
            raise ValueError(f"model.uniform_attention_layers={self.uniform_attention_layers}: "
                             f"layers {bad} do not exist (n_layers={self.n_layers})")
        if self.embedding == "onehot" and self.d_model < self.vocab_size:
            raise ValueError(f"model.embedding='onehot' needs d_model >= vocab_size "
                             f"({self.vocab_size}), got d_model={self.d_model}")
        if len(self.open_ids) != len(self.close_ids):
            raise ValueError(f"open_ids {self.open_ids} and close_ids {self.close_ids} differ "
                             "in length")
        if self.first_layer == "minimal":
            self._check_minimal()

    def _check_minimal(self) -> None:
        def need(ok: bool, msg: str) -> None:
            if not ok:
                raise ValueError(f"model.first_layer='minimal': {msg}")

        need(bool(self.open_ids), "needs the bracket token ids (open_ids/close_ids)")
        need(self.max_depth >= 1 and self.depth_bins > self.max_depth,
             f"needs max_depth >= 1 and depth_bins > max_depth, got {self.max_depth}, "
             f"{self.depth_bins}")
        need(self.n_layers >= 2, f"needs n_layers >= 2 (the minimal layer is layer 0), got "
             f"{self.n_layers}")
        need(self.pos_encoding == "none", "its output may depend on (token, depth) only, so "
             f"model.pos_encoding must be 'none', got {self.pos_encoding!r}")
        need(0 not in self.uniform_attention_layers, "layer 0 has no attention to make uniform")
        need(self.minimal_dim <= self.d_model, f"the {self.minimal_embedding!r} features have "
             f"{self.minimal_dim} dimensions, more than d_model={self.d_model}")

    @property
    def minimal_dim(self) -> int:
        """Size of the minimal first layer's feature vector (zero-padded to d_model)."""
        if self.minimal_embedding == "onehot":
            return 2 * len(self.open_ids) * self.depth_bins + self.vocab_size - 2 * len(
                self.open_ids)
        return self.vocab_size + (self.depth_bins if self.minimal_embedding == "type_depth"
                                  else 2)

    @property
    def head_dim(self) -> int:
        return self.d_head or self.d_model // self.n_heads

    @classmethod
    def from_settings(cls, model_settings, vocab_size: int, max_len: int, **data) -> ModelConfig:
        """The model config of a run: every field of settings.Model that is one of these (all but
        its max_len, a lower bound on this one) plus what the data decides (sizes, and `data`:
        open_ids, close_ids, max_depth, depth_bins)."""
        chosen = {name: getattr(model_settings, name) for name in SETTINGS_FIELDS}
        chosen["uniform_attention_layers"] = tuple(chosen["uniform_attention_layers"])
        return cls(**chosen, **data, vocab_size=vocab_size, max_len=max_len)


# What the data decides; every other field is a key of settings.Model, defaults included.
_FROM_DATA = ("vocab_size", "max_len", "open_ids", "close_ids", "max_depth", "depth_bins")
SETTINGS_FIELDS = {f.name: f.default for f in dataclasses.fields(ModelConfig)
                   if f.name not in _FROM_DATA}
"""{field: default} of the fields a config sets (model.<field>), in ModelConfig's order."""


def site_names(cfg: ModelConfig) -> tuple[str, ...]:
    """All activation sites of the model, in forward order."""
    names = ["embed"] + (["pos_embed"] if cfg.pos_encoding not in ("none", "rotary") else [])
    if cfg.first_layer == "minimal":
        names = ["blocks.0.minimal.out", "blocks.0.resid_post"]
    for i in range(_first_attention_layer(cfg), cfg.n_layers):
        block = [s for s in _BLOCK_SITES if not (cfg.attn_only and s.startswith("mlp."))
                 and (cfg.pos_encoding == "rotary" or s not in _ROTARY_SITES)]
        names += [f"blocks.{i}.{s}" for s in block]
    return tuple(names + ["ln_final", "logits"])


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
        if parts[0] == "blocks" and int(parts[1]) >= _first_attention_layer(cfg):
            layers.append(int(parts[1]))
        elif site in ("ln_final", "logits"):
            layers.append(cfg.n_layers)
        else:
            return None
    return min(layers, default=None)


def residual_site(cfg: ModelConfig, layer: int) -> str:
    """The site holding the residual stream that enters block `layer` (after the last block: the
    last block's resid_post), to cache for `forward(start_at=(layer, value))`."""
    first = _first_attention_layer(cfg)
    if not first <= layer <= cfg.n_layers:
        raise ValueError(f"start_at layer {layer}: the model's attention blocks are "
                         f"{first}..{cfg.n_layers - 1} (or {cfg.n_layers}: after the last)")
    return f"blocks.{layer}.resid_pre" if layer < cfg.n_layers else \
        f"blocks.{layer - 1}.resid_post"


def _first_attention_layer(cfg: ModelConfig) -> int:
    return 1 if cfg.first_layer == "minimal" else 0


def _param_shapes(cfg: ModelConfig) -> Params:
    """Shape and init scale of every parameter (scale 0: zeros, None: ones, a string: a fixed
    table built by `_fixed_table`, never trained: see `frozen_paths`)."""
    d, h, e, f = cfg.d_model, cfg.n_heads, cfg.head_dim, cfg.d_mlp
    # Residual-writing projections are scaled down with depth (GPT-2) to keep early training calm.
    out = 1.0 / math.sqrt(2 * cfg.n_layers)
    layer_norm = {"scale": ((d,), None), "bias": ((d,), 0.0)}
    block = {
        "ln1": layer_norm,
        # No key bias: it adds the same q.b_k to every score of a query row, which softmax
        # ignores, so its gradient is pure rounding noise that Adam would amplify.
        "attn": {"w_q": ((d, h, e), d**-0.5), "b_q": ((h, e), 0.0),
                 "w_k": ((d, h, e), d**-0.5),
                 "w_v": ((d, h, e), d**-0.5), "b_v": ((h, e), 0.0),
                 "w_o": ((h, e, d), (h * e) ** -0.5 * out), "b_o": ((d,), 0.0)},
    }
    if not cfg.attn_only:
        block["ln2"] = layer_norm
        block["mlp"] = {"w_in": ((d, f), d**-0.5), "b_in": ((f,), 0.0),
                        "w_out": ((f, d), f**-0.5 * out), "b_out": ((d,), 0.0)}
    shapes: Params = {
        "embed": ((cfg.vocab_size, d), "onehot" if cfg.embedding == "onehot" else 0.02),
        "unembed": {"w": ((d, cfg.vocab_size), d**-0.5), "b": ((cfg.vocab_size,), 0.0)},
        "ln_final": layer_norm,
        "blocks": [block] * cfg.n_layers,
    }
    if cfg.first_layer == "minimal":
        del shapes["embed"]
        shapes["blocks"] = [{"minimal": {"table": ((cfg.vocab_size * cfg.depth_bins, d),
                                                   "minimal")}}] + [block] * (cfg.n_layers - 1)
    if cfg.pos_encoding == "learned":
        shapes["pos_embed"] = ((cfg.max_len, d), 0.02)
    elif cfg.pos_encoding == "linear":
        shapes["pos_embed"] = ((d,), 0.02)
    return shapes


def init_params(key: jax.Array, cfg: ModelConfig) -> Params:
    """Random parameters for one model (vmap over keys for a seed axis)."""
    specs, treedef = jax.tree.flatten(_param_shapes(cfg), is_leaf=lambda x: isinstance(x, tuple))
    sizes = [0 if isinstance(scale, str) else math.prod(shape) for shape, scale in specs]
    # One draw carved into pieces: one threefry call compiles far faster than one per tensor.
    noise = jax.random.normal(key, (sum(sizes),), jnp.float32)
    leaves, offset = [], 0
    for (shape, scale), size in zip(specs, sizes, strict=True):
        if scale is None:
            leaves.append(jnp.ones(shape))
        elif isinstance(scale, str):
            leaves.append(_fixed_table(scale, cfg))
        else:
            leaves.append(noise[offset:offset + size].reshape(shape) * scale)
        offset += size
    return jax.tree.unflatten(treedef, leaves)


def path_str(path) -> str:
    """A jax key path as 'blocks/0/minimal/table'."""
    return "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)


def frozen_paths(cfg: ModelConfig) -> tuple[str, ...]:
    """Paths (path_str) of the parameters the optimizer must not move (fixed tables)."""
    specs = jax.tree_util.tree_flatten_with_path(_param_shapes(cfg),
                                                 is_leaf=lambda x: isinstance(x, tuple))[0]
    return tuple(path_str(path) for path, (_, scale) in specs if isinstance(scale, str))


def _fixed_table(kind: str, cfg: ModelConfig) -> jax.Array:
    d = cfg.d_model
    if kind == "onehot":  # token embeddings: row v is the one-hot vector of v
        return jnp.eye(cfg.vocab_size, d)
    # The minimal first layer: row token * depth_bins + depth holds that pair's features.
    token = jnp.repeat(jnp.arange(cfg.vocab_size), cfg.depth_bins)
    depth = jnp.tile(jnp.arange(cfg.depth_bins), cfg.vocab_size)
    onehot_token = jax.nn.one_hot(token, cfg.vocab_size)
    if cfg.minimal_embedding == "onehot":
        # Eq. 19: one direction per (bracket, depth) pair; other tokens (BOS, EOS, PAD) occur at
        # depth 0 only and get one direction each.
        k2 = 2 * len(cfg.open_ids)
        bracket = jnp.asarray(cfg.open_ids + cfg.close_ids)
        is_bracket = (token[:, None] == bracket).any(-1)
        b_index = (token[:, None] == bracket).argmax(-1)
        others = [v for v in range(cfg.vocab_size) if v not in cfg.open_ids + cfg.close_ids]
        o_index = (token[:, None] == jnp.asarray(others or [-1])).argmax(-1)
        slot = jnp.where(is_bracket, b_index * cfg.depth_bins + depth, k2 * cfg.depth_bins
                         + o_index)
        features = jax.nn.one_hot(slot, cfg.minimal_dim)
    elif cfg.minimal_embedding == "type_depth":  # eq. 20
        features = jnp.concatenate([onehot_token, jax.nn.one_hot(depth, cfg.depth_bins)], -1)
    else:  # eq. 21 (Yao et al. 2021)
        theta = jnp.arctan2(depth, cfg.max_depth + 2 - depth)
        features = jnp.concatenate([onehot_token, jnp.stack([jnp.cos(theta), jnp.sin(theta)],
                                                            -1)], -1)
    return jnp.pad(features, ((0, 0), (0, d - features.shape[1])))


def bracket_depth(tokens: jax.Array, cfg: ModelConfig) -> jax.Array:
    """Stack depth after each token [..., T] (open +1, close -1), from the model's token ids."""
    step = (jnp.isin(tokens, jnp.asarray(cfg.open_ids)).astype(jnp.int32)
            - jnp.isin(tokens, jnp.asarray(cfg.close_ids)))
    return jnp.cumsum(step, axis=-1)


def _minimal_layer(params: Params, tokens: jax.Array, cfg: ModelConfig) -> jax.Array:
    depth = jnp.clip(bracket_depth(tokens, cfg), 0, cfg.depth_bins - 1)
    return params["blocks"][0]["minimal"]["table"][tokens * cfg.depth_bins + depth]


def mlp_input(params: Params, layer: int, resid_mid: jax.Array) -> jax.Array:
    """The input of block `layer`'s MLP: its layer norm of `blocks.{layer}.resid_mid`, as
    `forward` computes it. An intervention that replaces the whole MLP (a transcoder at
    `blocks.{layer}.mlp.out`) reads resid_mid, which `forward` visits first, and maps this."""
    return _layer_norm(resid_mid, params["blocks"][layer]["ln2"])


def _layer_norm(x: jax.Array, p: Params) -> jax.Array:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + 1e-5) * p["scale"] + p["bias"]


def _sinusoidal(num_pos: int, d: int) -> jax.Array:
    pos = jnp.arange(num_pos)[:, None]
    freq = jnp.exp(-math.log(10_000.0) * jnp.arange(0, d, 2) / d)
    table = jnp.zeros((num_pos, d))
    table = table.at[:, 0::2].set(jnp.sin(pos * freq))
    return table.at[:, 1::2].set(jnp.cos(pos * freq[: d // 2]))


def rotary_table(num_pos: int, head_dim: int, base: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin [num_pos, head_dim // 2] float32 of the rotary angles p * base^(-2i/head_dim)
    (position p, pair i), computed in float64 and rounded once: the same bits on every backend."""
    inv_freq = float(base) ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    angles = np.arange(num_pos, dtype=np.float64)[:, None] * inv_freq
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def _rotate(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """x [batch, pos, head, d_head] with each adjacent pair (x[2i], x[2i+1]) turned by the angle
    whose cos/sin [(batch,) pos, d_head // 2] are given; the same products and sums, in the same
    order, as TransformerLens's x * cos + rotate_every_two(x) * sin."""
    cos, sin = cos[..., None, :], sin[..., None, :]  # the same angle for every head
    even, odd = x[..., 0::2], x[..., 1::2]
    return jnp.stack([even * cos + -odd * sin, odd * cos + even * sin], -1).reshape(x.shape)


def _position_embedding(params: Params, cfg: ModelConfig, positions: jax.Array | int
                        ) -> jax.Array:
    """Position embeddings for integer positions [..., T] -> [..., T, d_model] (an int n:
    positions 0 .. n-1)."""
    if isinstance(positions, int):
        positions = jnp.arange(positions)
    if cfg.pos_encoding == "learned":
        return params["pos_embed"][positions]
    if cfg.pos_encoding == "sinusoidal":
        return _sinusoidal(cfg.max_len, cfg.d_model)[positions]
    # "linear" (Wen et al.): one learned direction scaled by the relative position t / max_len.
    return (positions / cfg.max_len)[..., None] * params["pos_embed"]


def forward(
    params: Params,
    tokens: jax.Array,
    cfg: ModelConfig,
    *,
    intervention: Intervention | None = None,
    cache: Iterable[str] = (),
    position_offset: jax.Array | None = None,
    start_at: tuple[int, jax.Array] | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Logits [batch, pos, vocab] for tokens [batch, pos], and the cached sites.

    `position_offset` (int [batch], default 0) shifts each sentence's positions: token t sits at
    position offset + t. Training with random offsets trains positions past the sentence length.
    `start_at=(layer, residual)`: skip the embeddings and the blocks before `layer`, whose
    output is `residual` [batch, pos, d_model] (the value of `residual_site(cfg, layer)`); the
    sites before block `layer` are not visited.
    """
    cache = frozenset(cache)
    cached: dict[str, jax.Array] = {}

    def site(name: str, value: jax.Array) -> jax.Array:
        # Interventions and the cache see f32 values whatever the compute dtype (a no-op in f32).
        dtype = value.dtype
        if intervention is not None:
            value = intervention(name, value.astype(jnp.float32)).astype(dtype)
        if name in cache:
            cached[name] = value.astype(jnp.float32)
        return value

    cdt = jnp.dtype(cfg.compute_dtype)

    def mm(spec: str, x: jax.Array, w: jax.Array, out=cdt) -> jax.Array:
        """einsum with operands in the compute dtype, f32 accumulation, result in `out`."""
        return jnp.einsum(spec, x.astype(cdt), w.astype(cdt),
                          preferred_element_type=jnp.float32).astype(out)

    seq_len = tokens.shape[-1]
    rotary = cfg.pos_encoding == "rotary"
    if seq_len > cfg.max_len and not rotary:
        raise ValueError(f"sequence length {seq_len} exceeds the model's max_len {cfg.max_len}")
    first = _first_attention_layer(cfg)
    if start_at is not None:
        residual_site(cfg, start_at[0])  # checks the layer
        first, x = start_at
    elif cfg.first_layer == "minimal":
        x = site("blocks.0.minimal.out", _minimal_layer(params, tokens, cfg))
        x = site("blocks.0.resid_post", x)
    else:
        x = site("embed", params["embed"][tokens])
    positions = jnp.arange(seq_len)
    if position_offset is not None:  # caller keeps offset + seq_len <= max_len
        positions = position_offset[:, None] + positions
    if rotary:  # [(batch,) pos, d_head // 2], for every layer's queries and keys
        cos, sin = rotary_table(max(cfg.max_len, seq_len), cfg.head_dim, cfg.rotary_base)
        cos, sin = ((cos[:seq_len], sin[:seq_len]) if position_offset is None
                    else (jnp.asarray(cos)[positions], jnp.asarray(sin)[positions]))
    elif cfg.pos_encoding != "none" and start_at is None:
        x = x + site("pos_embed", _position_embedding(params, cfg, positions))
    causal = jnp.tril(jnp.ones((seq_len, seq_len), bool))
    for i in range(first, cfg.n_layers):
        block, name = params["blocks"][i], f"blocks.{i}"
        x = site(f"{name}.resid_pre", x)
        a = block["attn"]
        h = _layer_norm(x, block["ln1"])
        q = site(f"{name}.attn.q", mm("btd,dhe->bthe", h, a["w_q"]) + a["b_q"].astype(cdt))
        k = site(f"{name}.attn.k", mm("btd,dhe->bthe", h, a["w_k"]))
        v = site(f"{name}.attn.v", mm("btd,dhe->bthe", h, a["w_v"]) + a["b_v"].astype(cdt))
        if rotary:  # turned in float32 (a no-op cast in float32 compute)
            q = site(f"{name}.attn.rot_q", _rotate(q.astype(jnp.float32), cos, sin).astype(cdt))
            k = site(f"{name}.attn.rot_k", _rotate(k.astype(jnp.float32), cos, sin).astype(cdt))
        scores = mm("bqhe,bkhe->bhqk", q, k, jnp.float32) / math.sqrt(cfg.head_dim)
        scores = site(f"{name}.attn.scores", jnp.where(causal, scores, -jnp.inf))
        if i in cfg.uniform_attention_layers:
            pattern = jnp.broadcast_to(causal / causal.sum(-1, keepdims=True), scores.shape)
        else:
            pattern = jax.nn.softmax(scores, axis=-1)
        pattern = site(f"{name}.attn.pattern", pattern)
        z = site(f"{name}.attn.z", mm("bhqk,bkhe->bqhe", pattern, v))
        attn_out = site(f"{name}.attn.out", mm("bqhe,hed->bqd", z, a["w_o"])
                        + a["b_o"].astype(cdt))
        x = site(f"{name}.resid_mid", x + attn_out)
        if not cfg.attn_only:
            m = block["mlp"]
            h = mlp_input(params, i, x)
            hidden = site(f"{name}.mlp.hidden",
                          jax.nn.gelu(mm("...d,df->...f", h, m["w_in"]) + m["b_in"].astype(cdt)))
            x = x + site(f"{name}.mlp.out", mm("...f,fd->...d", hidden, m["w_out"])
                         + m["b_out"].astype(cdt))
        x = site(f"{name}.resid_post", x)
    x = site("ln_final", _layer_norm(x, params["ln_final"]))
    logits = site("logits", mm("...d,dv->...v", x, params["unembed"]["w"], jnp.float32)
                  + params["unembed"]["b"])
    return logits, cached
