"""CPU demo of the Friedman et al. code-completion experiment: a character-level transformer on
Python functions of this interpreter's standard library, 4 seeds, every proxy, faithfulness per
prediction category on iid and the OOD splits (longer, deeper, other_language = the JavaScript
that ships with npm, skipped with a warning when npm is absent).

Main job, from the repository root:

    python -m launch.sweep --config=configs/code_small.py --workdir=runs/code_small

TIME_AND_RESULT_PLACEHOLDER
"""

from ml_collections import ConfigDict

from jaxillusions.tasks.code import splits as code_data


def get_config() -> ConfigDict:
    config = ConfigDict()
    config.task = "code"
    config.seed = 0  # seed s of the sweep is config.seed + s

    # Data (jaxillusions/tasks/code/splits.py; every key: splits.DATA_DOCS). Functions of at most
    # context - 2 characters, one per row; `longer` up to longer_context - 2.
    config.data = ConfigDict(dict(code_data.DATA_DEFAULTS))
    config.data.context = 256
    config.data.longer_context = 512
    config.data.num_eval = 300

    # Model: a standard decoder-only transformer with learned embeddings and positions.
    config.model = ConfigDict()
    config.model.n_layers = 2
    config.model.n_heads = 2
    config.model.d_model = 64
    config.model.d_head = 0  # 0 -> d_model // n_heads
    config.model.d_mlp = 256
    config.model.pos_encoding = "learned"
    config.model.attn_only = False
    config.model.uniform_attention_layers = ()
    config.model.embedding = "learned"
    config.model.max_len = 0  # 0 -> the widest split (longer_context)

    # Optimizer and training loop (next-character loss on every character).
    config.train = ConfigDict()
    config.train.num_seeds = 4
    config.train.num_steps = 2000
    config.train.batch_size = 32
    config.train.learning_rate = 3e-3
    config.train.warmup_steps = 200
    config.train.weight_decay = 0.01
    config.train.grad_clip = 1.0
    config.train.log_every = 100
    config.train.eval_every = 1000
    config.train.checkpoint_every = 500
    config.train.eval_batch_size = 64
    # Rows of `longer` reach positions past any training row: offsets train them (-1: as far as
    # the model's positions allow), as in the Dyck configs.
    config.train.max_position_offset = -1

    # Proxies and faithfulness evaluation: the last layer's queries and keys, as for Dyck.
    config.proxies = ConfigDict()
    config.proxies.targets = ("blocks.-1.attn.q", "blocks.-1.attn.k",
                              "blocks.-1.attn.q+blocks.-1.attn.k")
    config.proxies.eval_splits = ("iid", "longer", "deeper", "other_language")
    config.proxies.gap_baseline = "iid"
    config.proxies.pattern_site = "blocks.-1.attn.pattern"
    config.proxies.methods = ("svd", "kmeans", "onehot_attention", "uniform_attention")
    config.proxies.svd_ranks = ()  # () -> 1, 2, 4, ... up to d_head
    config.proxies.svd_center = False  # True -> PCA
    config.proxies.kmeans_sizes = (2, 4, 8, 16, 32, 64)
    config.proxies.kmeans_samples = 20_000
    config.proxies.kmeans_iters = 25
    config.proxies.collect_batch_size = 128
    config.proxies.eval_batch_size = 64
    return config
