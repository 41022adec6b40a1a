"""Position encodings of the transformer (model/transformer.py): the embeddings added to the
residual stream (learned, sinusoidal, linear) and rotary positions.

With `pos_encoding="rotary"` (Su et al.'s RoPE) nothing is added to the residual stream: every
layer rotates its queries and keys by angles proportional to their positions, so an attention
score depends on the query's and key's positions only through their difference. `attn.q` and
`attn.k` are the vectors before the rotation (TransformerLens's hook_q/hook_k), `attn.rot_q` and
`attn.rot_k` after it (hook_rot_q/hook_rot_k); a proxy at `attn.k` is rotated like the keys it
replaces. Each adjacent pair (2i, 2i+1) of a head's dimensions turns by position * base^(-2i/d_head)
(GPT-J's pairing, TransformerLens's `rotary_adjacent_pairs=True`, the only one of its 4.x native
model); the cos/sin table is computed in float64 on the host and rounded to float32 once, so it
is the same on every backend.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np

if TYPE_CHECKING:  # the model's config, whose module imports this one
    from jaxillusions.model.transformer import ModelConfig


def sinusoidal(num_pos: int, d: int) -> jax.Array:
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


def rotate(x: jax.Array, cos: jax.Array, sin: jax.Array, layout: str = "adjacent") -> jax.Array:
    """x [batch, pos, head, d_head] with each adjacent pair (x[2i], x[2i+1]) turned by the angle
    whose cos/sin [(batch,) pos, r // 2] are given; the same products and sums, in the same
    order, as TransformerLens's x * cos + rotate_every_two(x) * sin. Only the first r
    dimensions turn; layout "half" pairs x[i] with x[i + r/2] (GPT-NeoX's rotate_half)."""
    cos, sin = cos[..., None, :], sin[..., None, :]  # the same angle for every head
    r = 2 * cos.shape[-1]
    x, rest = (x, None) if r == x.shape[-1] else (x[..., :r], x[..., r:])
    if layout == "half":
        first, second = x[..., :r // 2], x[..., r // 2:]
        x = jnp.concatenate([first * cos - second * sin, second * cos + first * sin], -1)
    else:
        even, odd = x[..., 0::2], x[..., 1::2]
        x = jnp.stack([even * cos + -odd * sin, odd * cos + even * sin], -1).reshape(x.shape)
    return x if rest is None else jnp.concatenate([x, rest], -1)


def embedding(params: dict, cfg: ModelConfig, positions: jax.Array | int) -> jax.Array:
    """The model's position embeddings for integer positions [..., T] -> [..., T, d_model] (an
    int n: positions 0 .. n-1): what forward adds to the token embeddings (learned, sinusoidal
    or linear positions)."""
    if isinstance(positions, int):
        positions = jnp.arange(positions)
    if cfg.pos_encoding == "learned":
        return params["pos_embed"][positions]
    if cfg.pos_encoding == "sinusoidal":
        return sinusoidal(cfg.max_len, cfg.d_model)[positions]
    # "linear" (Wen et al.): one learned direction scaled by the relative position t / max_len.
    return (positions / cfg.max_len)[..., None] * params["pos_embed"]
