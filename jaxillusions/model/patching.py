"""Causal primitives on the model's computation graph: nodes, edges, their ablation (activation
and path patching) and attribution patching. Pure functions of ONE seed's parameters, like
`forward`; vmap them over a leading seed axis.

Nodes (`granularity` "node"): each attention head (its `blocks.{l}.attn.z` slice, so its
contribution z_h W_O[h] to the residual stream; the shared bias b_O is not part of any head) and
each MLP (`blocks.{l}.mlp.out`, bias included). "neuron": the heads and each neuron of
`blocks.{l}.mlp.hidden`. Patching a node replaces its value by its ablated value through an
ordinary `forward` intervention, `mask * value + (1 - mask) * ablated`, so a mask of ones is the
model itself, bit for bit. Being sites of `forward`, they follow every imported architecture
(model/pretrained.py: parallel blocks, where a head's contribution still enters the residual
stream in attn.out, read by the next blocks but not by its own block's MLP; partial rotary,
which turns q and k before z; another epsilon, biases, GELU): `check` lets them through.

Edges (`granularity` "edge"): senders are the embeddings (token plus position: one sender), each
head and each MLP; receivers are each head's query, key and value input, each MLP's input and
the final layer norm's input (the unembedding). A sender feeds every receiver after it. In
`edge_forward` every receiver reads its own residual stream, the biases b_O of the attention
layers before it plus, per sender before it, `m * clean + (1 - m) * ablated`: the sender's output
in this forward pass (computed from its own receivers' inputs) if the edge is kept (m = 1), its
ablated output otherwise (path patching: one edge can be cut alone). With every edge kept it is
`forward` with the residual sums taken in another order (equal within float32 rounding). It
recomputes the trained architecture only, so `check` refuses edges on an imported one.

Ablated values ("zero" | "mean" | "resample"): zero; the mean of the unit's value over the fit
split's non-PAD positions (one vector per unit, position-independent: Miller et al. 2024,
arXiv 2407.08734, on why this choice matters); or its value on another input, here the batch's
next sentence (`resample_tokens`), position by position.

Attribution patching (Syed et al. 2023, "Attribution patching outperforms automated circuit
discovery"): the first-order effect of every unit on a metric, the gradient of the metric with
respect to a continuous mask of the units, in one backward pass. metric "logit": the logit of the
model's predicted token, linearised at the model (every mask 1), as EAP does with a logit
difference. metric "kl": KL(model || masked) summed over the scored positions, linearised at the
midpoint, every mask 1/2: at the model itself the KL and its gradient are zero, and at the
all-ablated mask no gradient reaches a unit whose own outputs are all ablated (only edges into
the logits would score); the midpoint is integrated gradients with one step (EAP-IG, Hanna et
al. 2024, uses several). Either way the score of a unit is d metric / d m_u, the estimated change
of the metric when the unit goes from ablated to clean.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxillusions import model as model_lib
from jaxillusions.model import positions

GRANULARITIES = ("edge", "node", "neuron")
ABLATIONS = ("zero", "mean", "resample")
METRICS = ("kl", "logit")


@dataclasses.dataclass(frozen=True)
class Graph:
    """Senders and receivers of a model's residual stream, in forward order; `valid[s, r]`:
    sender s feeds receiver r; `edges`: the (sender, receiver) pairs of `valid`, sender-major."""

    senders: tuple[str, ...]
    receivers: tuple[str, ...]
    valid: np.ndarray  # bool [S, R]

    @property
    def edges(self) -> tuple[tuple[int, int], ...]:
        return tuple(map(tuple, np.argwhere(self.valid).tolist()))

    @property
    def edge_names(self) -> tuple[str, ...]:
        return tuple(f"{self.senders[s]}->{self.receivers[r]}" for s, r in self.edges)


def check(cfg: model_lib.ModelConfig, granularity: str = "edge") -> None:
    """The architectures a granularity covers: for all of them the token embedding first (no
    built front part, such as Wen et al.'s minimal first layer); for edges also none of an
    imported checkpoint's options (`edge_forward` recomputes the trained architecture), while
    nodes and neurons patch sites of `forward`, which follows every imported architecture."""
    if cfg.front is not None:
        raise ValueError("circuits: model.first_layer='minimal' has no embedding sender; "
                         "circuits need the standard first layer")
    options = model_lib.imported_options(cfg)
    if granularity == "edge" and options:
        raise ValueError("proxies.circuit_granularity: 'edge' needs the trained architecture "
                         "(the edge forward recomputes it), not this imported architecture "
                         f"({options}); granularity 'node' or 'neuron' works on it")


def _head(layer: int, h: int) -> str:
    return f"blocks.{layer}.attn.head{h}"


@functools.cache
def graph(cfg: model_lib.ModelConfig) -> Graph:
    """The model's senders, receivers and edges."""
    check(cfg)
    senders, levels = ["embed"], [0]  # level: where in the residual stream it writes
    receivers, reads = [], []  # reads: the senders below this level feed it
    for layer in range(cfg.n_layers):
        heads = [_head(layer, h) for h in range(cfg.n_heads)]
        receivers += [f"{head}.{x}" for x in "qkv" for head in heads]
        reads += [2 * layer + 1] * 3 * cfg.n_heads
        senders += heads
        levels += [2 * layer + 1] * cfg.n_heads
        if not cfg.attn_only:
            receivers.append(f"blocks.{layer}.mlp")
            reads.append(2 * layer + 2)
            senders.append(f"blocks.{layer}.mlp")
            levels.append(2 * layer + 2)
    receivers.append("logits")
    reads.append(2 * cfg.n_layers + 1)
    valid = np.asarray(levels)[:, None] < np.asarray(reads)[None, :]
    return Graph(tuple(senders), tuple(receivers), valid)


def node_names(cfg: model_lib.ModelConfig, granularity: str) -> tuple[str, ...]:
    """The units of a node-level granularity, in forward order ("edge": the edge names)."""
    if granularity == "edge":
        return graph(cfg).edge_names
    check(cfg, granularity)
    names = []
    for layer in range(cfg.n_layers):
        names += [_head(layer, h) for h in range(cfg.n_heads)]
        if not cfg.attn_only:
            names += ([f"blocks.{layer}.mlp"] if granularity == "node" else
                      [f"blocks.{layer}.mlp.hidden.{i}" for i in range(cfg.d_mlp)])
    return tuple(names)


def num_units(cfg: model_lib.ModelConfig, granularity: str) -> int:
    """How many edges, nodes or neurons a circuit of this granularity chooses from."""
    if granularity not in GRANULARITIES:
        raise ValueError(f"circuit granularity {granularity!r}: expected one of {GRANULARITIES}")
    return len(node_names(cfg, granularity))


def node_sites(cfg: model_lib.ModelConfig, granularity: str) -> dict[str, tuple[int, int]]:
    """{site: (first unit index, number of units)} of a node granularity: `attn.z` (one unit
    per head), `mlp.out` (one per MLP, "node") or `mlp.hidden` (one per neuron, "neuron")."""
    sites, start = {}, 0
    for layer in range(cfg.n_layers):
        sites[f"blocks.{layer}.attn.z"] = (start, cfg.n_heads)
        start += cfg.n_heads
        if not cfg.attn_only:
            width = 1 if granularity == "node" else cfg.d_mlp
            sites[f"blocks.{layer}.mlp.{'out' if granularity == 'node' else 'hidden'}"] = (
                start, width)
            start += width
    return sites


def _unit_mask(site: str, mask: jax.Array, start: int, count: int) -> jax.Array:
    """The slice of a node mask for `site`, shaped to broadcast against its value."""
    m = mask[start:start + count]
    if site.endswith("attn.z"):  # [batch, pos, head, d_head]
        return m[:, None]
    return m if site.endswith("mlp.hidden") else m[0]


def node_intervention(cfg: model_lib.ModelConfig, granularity: str, mask: jax.Array,
                      ablated: dict[str, jax.Array]) -> model_lib.Intervention:
    """An intervention for `forward` patching each node u to mask[u] * value + (1 - mask[u]) *
    ablated value (`ablated`: {site of node_sites: a value broadcasting against the site's})."""
    sites = node_sites(cfg, granularity)

    def intervention(name: str, value: jax.Array) -> jax.Array:
        if name not in sites:
            return value
        m = _unit_mask(name, mask, *sites[name])
        return m * value + (1 - m) * ablated[name]

    return intervention


def resample_tokens(tokens: jax.Array) -> jax.Array:
    """The other input of resample ablation: each sentence's next in the batch (cyclically)."""
    return jnp.roll(tokens, -1, axis=0)


def node_values(params: model_lib.Params, tokens: jax.Array, cfg: model_lib.ModelConfig,
                granularity: str) -> dict[str, jax.Array]:
    """The clean values of the node sites on `tokens` ({site: [batch, pos, ...]})."""
    _, cache = model_lib.forward(params, tokens, cfg, cache=node_sites(cfg, granularity))
    return cache


def ablated_values(params: model_lib.Params, tokens: jax.Array, cfg: model_lib.ModelConfig,
                   granularity: str, ablation: str, means=None):
    """What ablated units take on a batch: node granularities {site: value}, edges the senders'
    [S, batch or 1, pos or 1, d_model]. `means`: the fit split's means (`unit_sums` divided by
    their count), needed for "mean"."""
    if ablation not in ABLATIONS:
        raise ValueError(f"circuit ablation {ablation!r}: expected one of {ABLATIONS}")
    if ablation == "mean":
        if granularity == "edge":
            return means[:, None, None, :]
        return means
    if ablation == "resample":
        other = resample_tokens(tokens)
        if granularity == "edge":
            return sender_outputs(params, other, cfg)
        return node_values(params, other, cfg, granularity)
    if granularity == "edge":
        return jnp.zeros((len(graph(cfg).senders), 1, 1, cfg.d_model))
    return {s: jnp.zeros(()) for s in node_sites(cfg, granularity)}


def unit_sums(params: model_lib.Params, tokens: jax.Array, cfg: model_lib.ModelConfig,
              granularity: str, valid: jax.Array):
    """Sums over the valid positions ([batch, pos] bool) of the units' clean values, for the
    fit split's means: edges [S, d_model], nodes {site: [...value's trailing shape]}."""
    w = valid.astype(jnp.float32)
    if granularity == "edge":
        return jnp.einsum("sbtd,bt->sd", sender_outputs(params, tokens, cfg), w)
    values = node_values(params, tokens, cfg, granularity)
    return {s: jnp.einsum("bt...,bt->...", v, w) for s, v in values.items()}


def edge_forward(params: model_lib.Params, tokens: jax.Array, cfg: model_lib.ModelConfig,
                 edge_mask: jax.Array, ablated: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(logits [batch, pos, vocab], sender outputs [S, batch, pos, d_model]) of the forward
    pass in which edge e of `graph(cfg).edges` is kept with weight edge_mask[e] ([E], 1 kept,
    0 ablated) and ablated to its sender's `ablated` value ([S, batch or 1, pos or 1, d_model]).
    Float32 throughout; mirrors `model.forward` (learned, sinusoidal, linear or rotary
    positions, attention-only blocks, frozen uniform attention layers; a model's standing
    interventions are applied at the attention patterns only)."""
    g = graph(cfg)
    rows, cols = np.nonzero(g.valid)
    dense = jnp.zeros(g.valid.shape, jnp.float32).at[rows, cols].set(edge_mask)
    seq_len = tokens.shape[-1]
    x = params["embed"][tokens].astype(jnp.float32)
    rotary = cfg.pos_encoding == "rotary"
    if cfg.pos_encoding not in ("none", "rotary"):
        x = x + positions.embedding(params, cfg, seq_len)
    outputs = [x]  # the senders' outputs in this pass, in graph order
    bias = jnp.zeros((cfg.d_model,), jnp.float32)  # the b_O of the attention layers so far

    def read(receiver: int) -> jax.Array:
        total = bias
        for s, out in enumerate(outputs):
            m = dense[s, receiver]
            total = total + (m * out + (1 - m) * ablated[s])
        return total

    causal = jnp.tril(jnp.ones((seq_len, seq_len), bool))
    if rotary:
        cos, sin = positions.rotary_table(max(cfg.max_len, seq_len), cfg.head_dim,
                                          cfg.rotary_base)
        cos, sin = cos[:seq_len], sin[:seq_len]
    receiver = 0
    for i in range(cfg.n_layers):
        block, h = params["blocks"][i], cfg.n_heads
        a = block["attn"]
        # [3, head, batch, pos, d_model]: the query, key and value inputs of each head
        inputs = jnp.stack([read(receiver + r) for r in range(3 * h)]).reshape(
            3, h, *x.shape)
        receiver += 3 * h
        normed = model_lib.transformer._layer_norm(inputs, block["ln1"])
        q = jnp.einsum("hbtd,dhe->bthe", normed[0], a["w_q"]) + a["b_q"]
        k = jnp.einsum("hbtd,dhe->bthe", normed[1], a["w_k"])
        v = jnp.einsum("hbtd,dhe->bthe", normed[2], a["w_v"]) + a["b_v"]
        if rotary:
            q, k = positions.rotate(q, cos, sin), positions.rotate(k, cos, sin)
        scores = jnp.einsum("bqhe,bkhe->bhqk", q, k) / math.sqrt(cfg.head_dim)
        scores = jnp.where(causal, scores, -jnp.inf)
        pattern = model_lib.attention_pattern(scores)
        for standing in cfg.interventions:  # the model's own (frozen uniform patterns)
            pattern = standing(f"blocks.{i}.attn.pattern", pattern)
        z = jnp.einsum("bhqk,bkhe->bqhe", pattern, v)
        outputs += [z[:, :, j] @ a["w_o"][j] for j in range(h)]
        bias = bias + a["b_o"]
        if not cfg.attn_only:
            m = block["mlp"]
            hidden = jax.nn.gelu(model_lib.mlp_input(params, i, read(receiver)) @ m["w_in"]
                                 + m["b_in"])
            outputs.append(hidden @ m["w_out"] + m["b_out"])
            receiver += 1
    final = model_lib.transformer._layer_norm(read(receiver), params["ln_final"])
    logits = final @ params["unembed"]["w"] + params["unembed"]["b"]
    return logits, jnp.stack(outputs)


def sender_outputs(params: model_lib.Params, tokens: jax.Array, cfg: model_lib.ModelConfig
                   ) -> jax.Array:
    """The senders' clean outputs [S, batch, pos, d_model] (every edge kept)."""
    ones = jnp.ones((len(graph(cfg).edges),), jnp.float32)
    return edge_forward(params, tokens, cfg, ones, jnp.zeros((1, 1, 1, cfg.d_model)))[1]


def masked_logits(params: model_lib.Params, tokens: jax.Array, cfg: model_lib.ModelConfig,
                  granularity: str, mask: jax.Array, ablated) -> jax.Array:
    """Logits with each unit of `granularity` weighted by mask ([units]; 1 kept, 0 ablated to
    `ablated`, from `ablated_values`)."""
    if granularity == "edge":
        return edge_forward(params, tokens, cfg, mask, ablated)[0]
    intervention = node_intervention(cfg, granularity, mask, ablated)
    return model_lib.forward(params, tokens, cfg, intervention=intervention)[0]


def metric(clean_logits: jax.Array, logits: jax.Array, weight: jax.Array, kind: str
           ) -> jax.Array:
    """The attribution metric summed over positions weighted by `weight` [batch, pos]:
    "kl": KL(softmax(clean) || softmax(logits)); "logit": the logit of clean's argmax."""
    if kind == "kl":
        p = jax.nn.log_softmax(clean_logits)
        per = jnp.sum(jnp.exp(p) * (p - jax.nn.log_softmax(logits)), -1)
    elif kind == "logit":
        pred = jnp.argmax(clean_logits, -1)
        per = jnp.take_along_axis(logits, pred[..., None], -1)[..., 0]
    else:
        raise ValueError(f"circuit metric {kind!r}: expected one of {METRICS}")
    return jnp.sum(per * weight)


def attribution(params: model_lib.Params, tokens: jax.Array, cfg: model_lib.ModelConfig,
                granularity: str, ablated, weight: jax.Array, kind: str = "kl") -> jax.Array:
    """Attribution scores [units] of every edge or node on one batch: d metric / d mask at the
    masks' midpoint 1/2 ("kl") or at the model ("logit"), one backward pass (module
    docstring)."""
    clean = jax.lax.stop_gradient(model_lib.forward(params, tokens, cfg)[0])
    mask = jnp.full((num_units(cfg, granularity),), 0.5 if kind == "kl" else 1.0, jnp.float32)
    ablated = jax.lax.stop_gradient(ablated)

    def value(m):
        return metric(clean, masked_logits(params, tokens, cfg, granularity, m, ablated),
                      weight, kind)

    return jax.grad(value)(mask)


def select(scores: jax.Array, sizes: tuple[int, ...]) -> jax.Array:
    """Masks [R, units] keeping the `size` units of largest |score| (ties: the earlier unit)."""
    order = jnp.argsort(-jnp.abs(scores), stable=True)
    rank = jnp.zeros(scores.shape, jnp.int32).at[order].set(jnp.arange(scores.shape[0]))
    return (rank[None, :] < jnp.asarray(sizes)[:, None]).astype(jnp.float32)
