"""Paper scale Friedman et al. Dyck experiment: Dyck-(20, 10), 200k training sentences, 2 layers,
1 head, 128 seeds; the same pipeline as dyck_small.py. Meant for a GPU:

    jaxillusions sweep --config=dyck --workdir=runs/dyck

Training only: `jaxillusions train --config=dyck --workdir=runs/dyck_train`.
Time, measured on one NVIDIA H100 80GB (jax 0.11.2): 128 seeds train at 26.1 steps/s (3,340
seed-steps/s; the XLA estimate of the step is 13.1 GiB); `launch.train` with
`--config.train.num_steps=2000` took 2 min 58 s end to end, and reached mean closing-bracket
accuracy iid 0.994, unseen_depth 0.916, longer 0.938 over the 128 seeds. The full 20,000 steps
are therefore about 13 minutes of training steps plus 4 evaluations and checkpoints; the whole
sweep (proxies, evaluation, reports) was not run to the end on the GPU (docs/speed.md: the
proxy stage then ran out of memory at 256 seeds). On the 2-core CPU machine (Intel Xeon,
`lscpu` family 6 model 167) the step ran at 19 seed-steps/s (32 seeds, one device), about 1.6
days for the 128 x 20k seed-steps. The data (200k
sentences) generates in 2-3.5 s. Population statistics (paired intervals over seeds) need many
seeds: 128 by default.
"""

from ml_collections import ConfigDict

from jaxillusions.configs import dyck_small


def get_config() -> ConfigDict:
    config = dyck_small.get_config()
    config.cpu_devices = 0  # as JAX starts (meant for a GPU, where it has no effect)

    # Data: Dyck-(20, 10) as in the paper (Hewitt et al. sampler).
    config.data.num_types = 20
    config.data.max_depth = 10
    config.data.max_len = 40
    config.data.longer_max_len = 80
    config.data.depth_extra = 5
    config.data.num_train = 200_000
    config.data.num_eval = 2000

    # Model: 2 layers, 1 head (as in the paper), wider than the CPU demo.
    config.model.d_model = 128
    config.model.d_mlp = 512

    # Optimizer.
    config.train.num_seeds = 128
    config.train.num_steps = 20_000
    config.train.batch_size = 128
    config.train.learning_rate = 1e-3
    config.train.warmup_steps = 1000
    config.train.log_every = 500
    config.train.eval_every = 5000
    config.train.checkpoint_every = 5000
    config.train.eval_batch_size = 512

    # Proxies and evaluation: same methods and targets at every size (SVD ranks 1, 2, 4, ...
    # d_head; k-means k = 2 ... 64); k-means fitted on 100k vectors per seed.
    config.proxies.targets = ("blocks.-1.attn.q", "blocks.-1.attn.k",
                              "blocks.-1.attn.q+blocks.-1.attn.k")
    config.proxies.svd_ranks = ()
    config.proxies.kmeans_sizes = (2, 4, 8, 16, 32, 64)
    config.proxies.kmeans_samples = 100_000
    config.proxies.collect_batch_size = 2048
    config.proxies.eval_batch_size = 512
    return config
