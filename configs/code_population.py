"""A population of code-completion models that have the mechanism the paper's claim is about:
8 seeds of a 2-layer attention-only character-level transformer on Python functions of up to 254
characters (context 256), with induction heads, every proxy family of configs/code_small.py on
the last layer's queries and keys, and OOD splits large enough for per-category intervals.

    JAX_NUM_CPU_DEVICES=2 python -m launch.sweep --config=configs/code_population.py \\
        --workdir=runs/code_population

Choices (see docs/code_completion.md for the findings):
- Model: attention only, d_model 32, 2 heads of 16 dimensions per layer, sinusoidal positions.
  An induction head needs a previous-token head in layer 0 (a fixed relative offset, which
  sinusoidal positions give as a linear map, while learned positions must learn it for each of
  the 256 positions) and a head in layer 1 that matches on its output; without MLPs, attention
  is the only way to use the context. The small width is what fits the time: attention scores
  over 256 positions cost as much as the projections at d_model 64, and both halve here.
- Training: batch 16 (rows are one function each, padded to 256), 2000 steps, peak learning
  rate 4e-3 with 100 warmup steps and cosine decay.
- Data: `data.ood_from_train_files=True` and `data.num_eval=500`: `deeper` takes the training
  files' deep functions too (never trained on), 183 functions with 1,013 closing brackets instead
  of 40 with ~200 from the held-out files alone; `other_language` 500 JavaScript functions (1,647
  closing brackets). Only `iid` is then file-disjoint from training. The depth threshold stays at
  the 0.9 quantile: lowering it (0.8) also lowers what training sees (5,286 functions instead of
  6,364) and leaves `other_language` 519 functions.
- Proxies: `longer` (rows of 512) is left out of the evaluation to save time (its accuracy is
  still in the training log); SVD ranks 1, 4, 16 and k-means 4, 16, 64 on the last layer's
  queries, keys and both.
- Induction heads: the main job's probe (config.induction, from configs/code_small.py).

Measured (the run of the command above, 8 seeds; the machine's 2 cores were shared with 4
other helpers' jobs, load average 12-16, under `nice -n 5`): training and its final evaluation
took 60 min (3,599 s; 0.6 steps/s for the 8 seeds), fitting the proxies 2.6 min and evaluating
the 3 SVD families 8.7 min (the k-means and attention families were fitted, their evaluation
stopped for time), so the 40-minute budget of issue 24 was not met on the shared machine.
Accuracy on `iid` (mean [min, max] over the 8 seeds) and the induction test
(`jaxillusions.studies.induction`, L = 48, chance score 0.014, batch 64) on the checkpoints:

| step | iid accuracy | best-head score | loss drop (nats) | seeds with a head |
|---|---|---|---|---|
| 250 | 0.377 [0.370, 0.380] | 0.014 [0.012, 0.017] | 0.17 [-0.03, 0.51] | 0 |
| 500 | 0.415 [0.411, 0.422] | 0.013 [0.011, 0.016] | 0.15 [-0.18, 0.55] | 0 |
| 750 | 0.444 [0.437, 0.451] | 0.014 [0.011, 0.016] | 0.09 [-0.11, 0.43] | 0 |
| 1000 | 0.459 [0.454, 0.466] | 0.015 [0.008, 0.018] | 0.12 [-0.09, 0.47] | 0 |
| 1250 | 0.470 [0.462, 0.479] | 0.015 [0.009, 0.018] | 0.18 [-0.10, 0.60] | 0 |
| 1500 | 0.475 [0.469, 0.488] | 0.015 [0.009, 0.018] | 0.19 [-0.07, 0.50] | 0 |
| 1750 | 0.480 [0.471, 0.490] | 0.015 [0.008, 0.018] | 0.18 [-0.09, 0.53] | 0 |
| 2000 | 0.481 (mean) | 0.015 [0.008, 0.018] | 0.20 [-0.07, 0.58] | 0 |

So no seed has an induction head: every head stays at chance and no loss drop reaches ln 2.
This config does NOT meet issue 24's requirement; it is the population the CPU time allowed,
kept for its per-category intervals. Short runs of wider models on the same data did no better
by the steps they reached (1 seed, d_model 64, attention only, 4 heads, batch 32: iid 0.449
and score 0.01 at step 400; 2 seeds, configs/code_small.py's model at context 256: iid 0.45 and
0.50, score 0.01, at step 500). A later single-seed run with learned positions and no position
offsets (d_model 64, 2 heads, batch 32, 8000 steps, 1,555 s) formed a previous-token head by step
500 and a partial induction head: best-head score 0.11 from step 3000 on (loss drop 1.0 nat at
step 5000), still below the 0.3 threshold; 8 seeds of it would take about 2 hours here (curve:
docs/code_completion.md). Getting the mechanism needs more training than this machine gives (the
paper-like configs/code.py trains 20k steps of batch 64 on a GPU).
Final accuracy, mean [95% t interval over seeds]: iid 0.481 [0.476, 0.487], deeper 0.459
[0.452, 0.465], other_language 0.263 [0.258, 0.269], against 0.184, 0.194 and 0.134 for the
most frequent training character. The SVD reports were written by a relaunch with
`--config.proxies.methods='("svd",)'` (an analysis key: training and the fitted stages are
kept); the same command without it evaluates the remaining families.
"""

from ml_collections import ConfigDict

from configs import code_small


def get_config() -> ConfigDict:
    config = code_small.get_config()

    config.data.context = 256
    config.data.longer_context = 512
    config.data.num_eval = 500
    config.data.ood_from_train_files = True

    # Attention only, 2 layers of 2 heads of 32, learned positions trained only where the data
    # reaches (no offsets): the recipe of docs/code_completion.md's curves.
    config.model.d_model = 64
    config.model.d_mlp = 0
    config.model.attn_only = True
    config.model.pos_encoding = "learned"

    config.train.num_seeds = 8
    config.train.num_steps = 8000
    config.train.batch_size = 32
    config.train.learning_rate = 3e-3  # 100 warmup steps, cosine decay over num_steps
    config.train.max_position_offset = 0
    config.train.eval_every = 0
    config.train.checkpoint_every = 500
    config.train.log_every = 50

    config.proxies.eval_splits = ("iid", "deeper", "other_language")
    config.proxies.svd_ranks = (1, 4, 16)  # k-means: the demo's 4, 16, 64
    return config
