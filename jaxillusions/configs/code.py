"""Paper-like Friedman et al. code-completion experiment, for a GPU: a 2-layer character-level
transformer with context 512 (functions of up to 510 characters; `longer` up to 1022), 64 seeds,
the same pipeline, splits and proxies as code_small.py.

    jaxillusions sweep --config=code --workdir=runs/code

Data: the Python standard library by default (`other_language`: npm's JavaScript). With the
CodeSearchNet dataset, point the config at its jsonl files, e.g.
`--config.data.source='/data/codesearchnet/python/final/jsonl/train/*.jsonl.gz'
--config.data.other_source='/data/codesearchnet/javascript/final/jsonl/train/*.jsonl.gz'`.
Time: not measured; this config has not been run on a GPU here (the one 30-minute GPU lease so
far went to the Dyck measurements in docs/speed.md). Its training is 64 seeds x 20k steps of
batch 64 rows of up to 512 characters; on the 2-core CPU machine that would take weeks, so run it
on a GPU. Override e.g.
`--config.train.num_seeds=16` for a smaller one.

Memory: the seeds train, are evaluated and are probed for induction heads (the induction
stage's ablations run an evaluation pass per head) in 8 sequential chunks of 8
(train.seed_chunk_size).
All 64 at once cannot fit one GPU: the memory plan (a lower bound) counts 136 GiB for one layer's
attention scores of an evaluation batch of 64 seeds on `longer` (128 rows x 1024 characters x 4
heads). At 8 seeds the plan counts 30.3 GiB per device and admits the config on an 80 GB GPU
(59.4 GiB for JAX by default; tests/test_scale.py). XLA:CPU's compiled estimate at 8 seeds (not
run; a GPU's XLA fuses more) is 27.3 GiB for the training step and 36.1 GiB for an evaluation
batch, each within 59.4 GiB; at 16 seeds the evaluation batch would need 72 GiB.
"""

from ml_collections import ConfigDict

from jaxillusions.configs import code_small


def get_config() -> ConfigDict:
    config = code_small.get_config()

    # Data: the paper's context length; more evaluation functions per split.
    config.data.context = 512
    config.data.longer_context = 1024
    config.data.num_eval = 1000

    # Model: 2 layers as in the paper (the demo's), wider than the CPU demo.
    config.model.n_heads = 4
    config.model.d_model = 256
    config.model.d_mlp = 1024

    # Training: many seeds for population statistics.
    config.train.num_seeds = 64
    config.train.num_steps = 20_000
    config.train.batch_size = 64
    config.train.learning_rate = 1e-3
    config.train.warmup_steps = 1000
    config.train.eval_every = 2000
    config.train.checkpoint_every = 2000
    config.train.eval_batch_size = 128
    # Seeds trained and evaluated at once: 8 fit an 80 GB GPU (see the docstring's Memory).
    config.train.seed_chunk_size = 8

    # Proxies: ranks 1..d_head (64) and k-means on 100k vectors per seed.
    config.proxies.kmeans_sizes = (2, 4, 8, 16, 32, 64, 128, 256)
    config.proxies.kmeans_samples = 100_000
    config.proxies.collect_batch_size = 256
    config.proxies.eval_batch_size = 128
    return config
