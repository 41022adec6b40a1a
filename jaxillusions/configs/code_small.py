"""CPU demo of the Friedman et al. code-completion experiment: a character-level transformer on
Python functions of this interpreter's standard library, 4 seeds, every proxy, faithfulness per
prediction category on iid and the OOD splits (longer, deeper, other_language = the JavaScript
that ships with npm, skipped with a warning when npm is absent).

Main job:

    jaxillusions sweep --config=code_small --workdir=runs/code_small

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

from jaxillusions.configs import defaults


def get_config() -> ConfigDict:
    # Every key at its default (config/settings.py; data.*: jaxillusions/tasks/code_completion/
    # splits.py, every key in splits.DATA_DOCS); the lines below set what the demo changes.
    config = defaults("code")

    # Data: functions of at most context - 2 characters, one per row; `longer` up to
    # longer_context - 2.
    config.data.context = 128
    config.data.longer_context = 256
    config.data.num_eval = 200

    # Model: a standard decoder-only transformer with learned embeddings and positions, 2 layers
    # of 2 heads.
    config.model.n_heads = 2
    config.model.d_model = 64
    config.model.d_mlp = 128

    # Optimizer and training loop (next-character loss on every character).
    config.train.num_steps = 1500
    config.train.warmup_steps = 100
    config.train.eval_every = 500
    config.train.checkpoint_every = 500
    config.train.eval_batch_size = 64
    # Rows of `longer` reach positions past any training row: offsets train them (-1: as far as
    # the model's positions allow), as in the Dyck configs.
    config.train.max_position_offset = -1

    # Proxies and faithfulness evaluation: every method on the last layer's queries, keys and
    # both, as for Dyck; SVD at ranks 1, 2, 4, ... up to d_head.
    config.proxies.eval_splits = ("iid", "longer", "deeper", "other_language")
    config.proxies.kmeans_sizes = (4, 16, 64)
    config.proxies.kmeans_samples = 10_000
    config.proxies.kmeans_iters = 20
    config.proxies.collect_batch_size = 128
    config.proxies.eval_batch_size = 64

    # Induction heads after training (jaxillusions/studies/induction.py): a random sequence of
    # induction.length characters repeated once (0: half the vocabulary's characters),
    # induction.batch of them.
    config.induction.enabled = True
    return config
