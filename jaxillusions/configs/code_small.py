"""CPU demo of the Friedman et al. code-completion experiment: a character-level transformer on
Python functions of this interpreter's standard library, 4 seeds, every proxy, faithfulness per
prediction category on iid and the OOD splits (longer, deeper, other_language = the JavaScript
that ships with npm, skipped with a warning when npm is absent).

Main job:

    jaxillusions sweep --config=code_small --workdir=runs/code_small

Alone on the 2-core CPU machine (AMD EPYC of family 25 model 17, no GPU; data cached, most
compiled programs cached) the sweep took 5 min 58 s: `time 357 s: training 253 s, induction 18 s,
collection 7 s, fitting 2 s, evaluation 71 s, ...; of which compilation 9.0 s` (4 seeds x 1500
steps, ~6.4 steps/s; evaluation on 4 splits, 620 functions, 8 proxy families). Building the data
from the standard library and npm takes about 9 s more on a first run. Next-character accuracy
on `iid` 0.627 [0.607, 0.646] (mean and 95% logit-t interval over the 4 seeds; loss 1.44 nats)
against 0.151 for the most frequent training character (unigram cross-entropy 3.29 nats);
longer 0.534, deeper 0.547, other_language 0.303. docs/code_completion.md reads the
per-category gaps. On the Intel Xeon of family 6 model 207 (alone, data built anew, no program
cached): 8 min 11 s, `time 490 s: training 337 s, induction 26 s, ..., evaluation 90 s, ..., other
17 s; of which compilation 23.1 s (56 XLA programs)`; the accuracies within 0.001 of these.
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
