"""The reference model of the speed benchmark: 2 layers, d_model 64, 1 head, MLP 256,
vocabulary 43 (Dyck-(20, 10)), batch 32 x 64 input tokens, AdamW; and its FLOP count."""

from __future__ import annotations

from ml_collections import ConfigDict

from jaxillusions.configs import dyck as dyck_config


def get_config() -> ConfigDict:
    config = dyck_config.get_config()
    config.data.max_len = 63  # BOS + 63 brackets + EOS: 64 input tokens, 64 targets
    config.data.longer_max_len = 70
    config.data.num_train = 20_000
    config.data.num_eval = 200
    config.model.d_model = 64
    config.model.d_mlp = 256
    config.train.batch_size = 32
    config.train.learning_rate = 1e-3
    config.train.max_position_offset = 0
    config.proxies.collect_batch_size = 512
    config.proxies.eval_batch_size = 128
    return config


def train_flops(model_cfg, batch: int, seq: int) -> float:
    """Model FLOPs of one training step of one seed, counted analytically: every matmul of the
    forward pass (2 FLOPs per multiply-add) times 3 (forward + the two backward matmuls).
    Elementwise work (layer norm, softmax, GELU, Adam) is not counted, as is usual for MFU."""
    d, e, h, f, v = (model_cfg.d_model, model_cfg.head_dim, model_cfg.n_heads, model_cfg.d_mlp,
                     model_cfg.vocab_size)
    tokens = batch * seq
    per_layer = 2 * tokens * d * h * e * 3  # q, k, v projections
    per_layer += 2 * batch * h * seq * seq * e * 2  # scores and pattern @ v
    per_layer += 2 * tokens * h * e * d  # output projection
    if not model_cfg.attn_only:
        per_layer += 2 * tokens * d * f * 2  # MLP in and out
    forward = model_cfg.n_layers * per_layer + 2 * tokens * d * v  # + unembedding
    return 3.0 * forward
