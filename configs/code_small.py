"""CPU demo of the Friedman et al. code-completion experiment: a character-level transformer on
Python functions of this interpreter's standard library, 4 seeds, every proxy, faithfulness per
prediction category on iid and the OOD splits (longer, deeper, other_language = the JavaScript
that ships with npm, skipped with a warning when npm is absent).

Main job, from the repository root:

    python -m launch.sweep --config=configs/code_small.py --workdir=runs/code_small

On the 2-core CPU machine (no GPU; under `flock /tmp/jaxillusions-cpu.lock`, data not yet cached)
the sweep took 8 min 54 s: 9 s to build the data from the standard library and npm, 5.8 min of
training (4 seeds x 1500 steps, ~4.4 steps/s), then fitting, evaluation on 4 splits (620 functions,
8 proxy families) and the reports. Next-character accuracy on `iid` 0.626 ± 0.019 (mean ± 95% CI
over the 4 seeds; loss 1.44 nats) against 0.151 for the most frequent training character (unigram
cross-entropy 3.29 nats); longer 0.533, deeper 0.547, other_language 0.312. A rerun (data cached)
wrote byte-identical results.csv and tables. docs/code_completion.md reads the per-category gaps.
Override any key on the command line, e.g.
`--config.train.num_seeds=8 --config.data.source=/path/to/*.jsonl.gz`.
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
    config.data.context = 128
    config.data.longer_context = 256
    config.data.num_eval = 200

    # Model: a standard decoder-only transformer with learned embeddings and positions.
    config.model = ConfigDict()
    config.model.n_layers = 2
    config.model.n_heads = 2
    config.model.d_model = 64
    config.model.d_head = 0  # 0 -> d_model // n_heads
    config.model.d_mlp = 128
    config.model.pos_encoding = "learned"
    config.model.attn_only = False
    config.model.uniform_attention_layers = ()
    config.model.embedding = "learned"
    config.model.max_len = 0  # 0 -> the widest split (longer_context)
    config.model.compute_dtype = "float32"  # bfloat16: bf16 matmuls (docs/speed.md)

    # Optimizer and training loop (next-character loss on every character).
    config.train = ConfigDict()
    config.train.num_seeds = 4
    config.train.num_steps = 1500
    config.train.batch_size = 32
    config.train.learning_rate = 3e-3
    config.train.warmup_steps = 100
    config.train.weight_decay = 0.01
    config.train.grad_clip = 1.0
    config.train.log_every = 100
    config.train.eval_every = 500
    config.train.checkpoint_every = 500
    config.train.eval_batch_size = 64
    # Rows of `longer` reach positions past any training row: offsets train them (-1: as far as
    # the model's positions allow), as in the Dyck configs.
    config.train.max_position_offset = -1
    # Seeds trained at once; the others wait in sequential chunks (docs/scaling_out.md). 0: all.
    config.train.seed_chunk_size = 0

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
    config.proxies.kmeans_sizes = (4, 16, 64)
    config.proxies.kmeans_samples = 10_000
    config.proxies.kmeans_iters = 20
    config.proxies.collect_batch_size = 128
    config.proxies.eval_batch_size = 64
    # Seeds per call of the proxy stage; 0: as many as fit the device's memory.
    config.proxies.seed_chunk_size = 0

    # Induction heads after training (jaxillusions/analysis/induction.py): a random sequence of
    # `length` characters repeated once (0: half the vocabulary's characters), `batch` of them.
    config.induction = ConfigDict()
    config.induction.enabled = True
    config.induction.length = 0
    config.induction.batch = 64
    return config
