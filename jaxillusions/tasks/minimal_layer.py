"""Wen et al.'s minimal first layer (Assumption 1) as a built part of the model (model.Part):
block 0 has no attention; its output at every position is a fixed feature vector of (token,
depth) only, the depth being the bracket depth after the token (a cumulative sum over the
bracket ids). Sites `blocks.0.minimal.out` and `blocks.0.resid_post` (no `embed`); one frozen
parameter, `blocks/0/minimal/table`, whose row token * depth_bins + depth holds that pair's
features (zero-padded to d_model). The task builds it from its data (tasks.dyck.first_layer).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from jaxillusions import model

FIRST_LAYERS = ("standard", "minimal")  # the settings key model.first_layer
# Wen et al. eqs. 19-21: one-hot of (token, depth); one-hot token ++ one-hot depth; Yao et al.'s
# one-hot token ++ (cos theta_d, sin theta_d), theta_d = arctan(d / (D + 2 - d)).
FEATURES = ("onehot", "type_depth", "yao")  # the settings key model.minimal_embedding


@dataclasses.dataclass(frozen=True)
class MinimalFirstLayer:
    """The part: bracket token ids by type, the language's depth bound D, the number of depth
    values with features of their own (deeper ones clip to the last) and the features."""

    open_ids: tuple[int, ...]
    close_ids: tuple[int, ...]
    max_depth: int
    depth_bins: int
    features: str = "onehot"  # FEATURES

    layers: ClassVar[int] = 1
    sites: ClassVar[tuple[str, ...]] = ("blocks.0.minimal.out", "blocks.0.resid_post")

    def __post_init__(self):
        def need(ok: bool, msg: str) -> None:
            if not ok:
                raise ValueError(f"model.first_layer='minimal': {msg}")

        need(self.features in FEATURES, f"model.minimal_embedding={self.features!r}: expected "
             f"one of {FEATURES}")
        need(bool(self.open_ids) and len(self.open_ids) == len(self.close_ids),
             f"needs as many open as close bracket ids, at least one; got {self.open_ids}, "
             f"{self.close_ids}")
        need(self.max_depth >= 1 and self.depth_bins > self.max_depth,
             f"needs max_depth >= 1 and depth_bins > max_depth, got {self.max_depth}, "
             f"{self.depth_bins}")

    def dim(self, vocab_size: int) -> int:
        """Size of the feature vector for `vocab_size` tokens (zero-padded to d_model)."""
        if self.features == "onehot":
            return 2 * len(self.open_ids) * self.depth_bins + vocab_size - 2 * len(self.open_ids)
        return vocab_size + (self.depth_bins if self.features == "type_depth" else 2)

    def check(self, cfg: model.ModelConfig) -> None:
        def need(ok: bool, msg: str) -> None:
            if not ok:
                raise ValueError(f"model.first_layer='minimal': {msg}")

        need(cfg.n_layers >= 2, f"needs n_layers >= 2 (the minimal layer is layer 0), got "
             f"{cfg.n_layers}")
        need(cfg.pos_encoding == "none", "its output may depend on (token, depth) only, so "
             f"model.pos_encoding must be 'none', got {cfg.pos_encoding!r}")
        dim = self.dim(cfg.vocab_size)
        need(dim <= cfg.d_model, f"the {self.features!r} features have {dim} dimensions, more "
             f"than d_model={cfg.d_model}")

    def block_shapes(self, cfg: model.ModelConfig) -> list[model.Params]:
        return [{"minimal": {"table": ((cfg.vocab_size * self.depth_bins, cfg.d_model),
                                       self.table)}}]

    def table(self, cfg: model.ModelConfig) -> jax.Array:
        """The fixed table [vocab_size * depth_bins, d_model]: row token * depth_bins + depth."""
        vocab, bins = cfg.vocab_size, self.depth_bins
        token = jnp.repeat(jnp.arange(vocab), bins)
        depth = jnp.tile(jnp.arange(bins), vocab)
        onehot_token = jax.nn.one_hot(token, vocab)
        if self.features == "onehot":
            # Eq. 19: one direction per (bracket, depth) pair; other tokens (BOS, EOS, PAD)
            # occur at depth 0 only and get one direction each.
            k2 = 2 * len(self.open_ids)
            brackets = self.open_ids + self.close_ids
            bracket = jnp.asarray(brackets)
            is_bracket = (token[:, None] == bracket).any(-1)
            b_index = (token[:, None] == bracket).argmax(-1)
            others = [v for v in range(vocab) if v not in brackets]
            o_index = (token[:, None] == jnp.asarray(others or [-1])).argmax(-1)
            slot = jnp.where(is_bracket, b_index * bins + depth, k2 * bins + o_index)
            features = jax.nn.one_hot(slot, self.dim(vocab))
        elif self.features == "type_depth":  # eq. 20
            features = jnp.concatenate([onehot_token, jax.nn.one_hot(depth, bins)], -1)
        else:  # eq. 21 (Yao et al. 2021)
            theta = jnp.arctan2(depth, self.max_depth + 2 - depth)
            features = jnp.concatenate([onehot_token, jnp.stack([jnp.cos(theta),
                                                                 jnp.sin(theta)], -1)], -1)
        return jnp.pad(features, ((0, 0), (0, cfg.d_model - features.shape[1])))

    def depth(self, tokens: jax.Array) -> jax.Array:
        """Stack depth after each token [..., T] (open +1, close -1)."""
        step = (jnp.isin(tokens, jnp.asarray(self.open_ids)).astype(jnp.int32)
                - jnp.isin(tokens, jnp.asarray(self.close_ids)))
        return jnp.cumsum(step, axis=-1)

    def features_of(self, params: model.Params, tokens, depths) -> jax.Array:
        """The layer's output for (token, depth) arrays (one model); deeper depths clip."""
        depths = jnp.clip(jnp.asarray(depths), 0, self.depth_bins - 1)
        return params["blocks"][0]["minimal"]["table"][jnp.asarray(tokens) * self.depth_bins
                                                       + depths]

    def apply(self, params: model.Params, tokens: jax.Array, site: model.Site) -> jax.Array:
        x = site("blocks.0.minimal.out", self.features_of(params, tokens, self.depth(tokens)))
        return site("blocks.0.resid_post", x)
