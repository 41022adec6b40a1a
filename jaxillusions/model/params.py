"""A model's parameters: a nested dict of arrays whose shapes follow from its ModelConfig
(`param_shapes`), drawn at random by `init_params`, named by paths ('blocks/0/attn/w_q'), and
checked against a config (`check_params`, `seed_labels`) before any work, so that parameters of
another architecture are one line naming the first parameter that differs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np

if TYPE_CHECKING:
    from jaxillusions.model.transformer import ModelConfig

Params = dict


def param_shapes(cfg: ModelConfig) -> Params:
    """Shape and init scale of every parameter (scale 0: zeros, None: ones, a callable: a fixed
    table, scale(cfg), never trained: see `frozen_paths`)."""
    d, h, e, f = cfg.d_model, cfg.n_heads, cfg.head_dim, cfg.d_mlp
    # Residual-writing projections are scaled down with depth (GPT-2) to keep early training calm.
    out = 1.0 / math.sqrt(2 * cfg.n_layers)
    layer_norm = {"scale": ((d,), None), "bias": ((d,), 0.0)}
    block = {
        "ln1": layer_norm,
        # No key bias: it adds the same q.b_k to every score of a query row, which softmax
        # ignores, so its gradient is pure rounding noise that Adam would amplify (imported
        # checkpoints have one: key_bias).
        "attn": {"w_q": ((d, h, e), d**-0.5), "b_q": ((h, e), 0.0),
                 "w_k": ((d, h, e), d**-0.5),
                 "w_v": ((d, h, e), d**-0.5), "b_v": ((h, e), 0.0),
                 "w_o": ((h, e, d), (h * e) ** -0.5 * out), "b_o": ((d,), 0.0)},
    }
    if cfg.key_bias:
        block["attn"] = {**block["attn"], "b_k": ((h, e), 0.0)}
    if not cfg.attn_only:
        block["ln2"] = layer_norm
        block["mlp"] = {"w_in": ((d, f), d**-0.5), "b_in": ((f,), 0.0),
                        "w_out": ((f, d), f**-0.5 * out), "b_out": ((d,), 0.0)}
    shapes: Params = {
        "embed": ((cfg.vocab_size, d), _onehot_table if cfg.embedding == "onehot" else 0.02),
        "unembed": {"w": ((d, cfg.vocab_size), d**-0.5), "b": ((cfg.vocab_size,), 0.0)},
        "ln_final": layer_norm,
        "blocks": [block] * cfg.n_layers,
    }
    if cfg.front is not None:
        del shapes["embed"]
        shapes["blocks"] = (cfg.front.block_shapes(cfg)
                            + [block] * (cfg.n_layers - cfg.front.layers))
    if cfg.pos_encoding == "learned":
        shapes["pos_embed"] = ((cfg.max_len, d), 0.02)
    elif cfg.pos_encoding == "linear":
        shapes["pos_embed"] = ((d,), 0.02)
    return shapes


def init_params(key: jax.Array, cfg: ModelConfig) -> Params:
    """Random parameters for one model (vmap over keys for a seed axis)."""
    specs, treedef = jax.tree.flatten(param_shapes(cfg), is_leaf=lambda x: isinstance(x, tuple))
    sizes = [0 if callable(scale) else math.prod(shape) for shape, scale in specs]
    # One draw carved into pieces: one threefry call compiles far faster than one per tensor.
    noise = jax.random.normal(key, (sum(sizes),), jnp.float32)
    leaves, offset = [], 0
    for (shape, scale), size in zip(specs, sizes, strict=True):
        if scale is None:
            leaves.append(jnp.ones(shape))
        elif callable(scale):
            leaves.append(scale(cfg))
        else:
            leaves.append(noise[offset:offset + size].reshape(shape) * scale)
        offset += size
    return jax.tree.unflatten(treedef, leaves)


def path_str(path) -> str:
    """A jax key path as 'blocks/0/minimal/table'."""
    return "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)


def frozen_paths(cfg: ModelConfig) -> tuple[str, ...]:
    """Paths (path_str) of the parameters the optimizer must not move (fixed tables)."""
    specs = jax.tree_util.tree_flatten_with_path(param_shapes(cfg),
                                                 is_leaf=lambda x: isinstance(x, tuple))[0]
    return tuple(path_str(path) for path, (_, scale) in specs if callable(scale))


def random_paths(cfg: ModelConfig) -> tuple[str, ...]:
    """Paths (path_str) of the parameters init_params draws at random (not the LayerNorm gains,
    ones; the biases, zeros; or the fixed tables): what train.init_scales multiplies."""
    specs = jax.tree_util.tree_flatten_with_path(param_shapes(cfg),
                                                 is_leaf=lambda x: isinstance(x, tuple))[0]
    return tuple(path_str(path) for path, (_, scale) in specs
                 if not callable(scale) and scale)


def _onehot_table(cfg: ModelConfig) -> jax.Array:
    """Frozen token embeddings: row v is the one-hot vector of v."""
    return jnp.eye(cfg.vocab_size, cfg.d_model)


def _shown(shape: tuple | None) -> str:
    return "no such parameter" if shape is None else f"shape {shape}"


def check_params(params: Params, cfg: ModelConfig, lead: tuple[int, ...] = ()) -> None:
    """ValueError naming the first parameter of `params` missing, extra or of another shape
    than `cfg`'s model has, after the leading axes `lead` (e.g. (seeds,)); shapes are static,
    so under jit it runs once, at tracing."""
    want = {path_str(p): (*lead, *shape) for p, (shape, _) in jax.tree_util.tree_flatten_with_path(
        param_shapes(cfg), is_leaf=lambda x: isinstance(x, tuple))[0]}
    got = {path_str(p): tuple(np.shape(x))
           for p, x in jax.tree_util.tree_flatten_with_path(params)[0]}
    for name in dict.fromkeys([*want, *got]):
        if want.get(name) != got.get(name):
            raise ValueError(f"params: {name}: {_shown(got.get(name))} in params, "
                             f"{_shown(want.get(name))} in the model config "
                             f"(n_layers {cfg.n_layers}, d_model {cfg.d_model}, n_heads "
                             f"{cfg.n_heads}, vocab_size {cfg.vocab_size}"
                             f"{', after the seed axis' if lead else ''})")


def seed_labels(params: Params, cfg: ModelConfig, seeds: Sequence | None = None) -> tuple:
    """The labels of params' leading seed axis (0.. by default); ValueError if params are one
    model's (no seed axis), are not `cfg`'s model (`check_params`), or `seeds` has another
    length."""
    scale = params.get("ln_final", {}).get("scale") if isinstance(params, dict) else None
    if scale is not None and np.ndim(scale) == 1:
        raise ValueError("params: one model's, with no leading seed axis: add one with "
                         "jax.tree.map(lambda x: x[None], params), or vmap init_params over keys")
    num_seeds = {np.shape(x)[:1] for x in jax.tree.leaves(params)}
    if len(num_seeds) != 1 or () in num_seeds:
        raise ValueError(f"params: leaves disagree on the leading seed axis "
                         f"{sorted(n for s in num_seeds for n in s)}")
    (num_seeds,), = num_seeds
    check_params(params, cfg, (num_seeds,))
    seeds = tuple(range(num_seeds)) if seeds is None else tuple(seeds)
    if len(seeds) != num_seeds:
        raise ValueError(f"seeds: {len(seeds)} labels for {num_seeds} seeds of params")
    return seeds
