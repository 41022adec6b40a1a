"""CPU demo of the Friedman et al. Dyck experiment: 12 seeds, small Dyck, every proxy and split.

Main job (train + fit proxies + evaluate + tables/figures):

    jaxillusions sweep --config=dyck_small --workdir=runs/dyck_small

Training only:

    jaxillusions train --config=dyck_small --workdir=runs/dyck_small_train

On the 2-core CPU machine (Intel Xeon, `lscpu`: "Intel(R) Xeon(R) Processor" family 6 model 207;
no GPU, nothing else running, data and compilation caches empty, a fresh clone) the job's line
was `time 72 s: training 37 s, collection 4 s, fitting 3 s, evaluation 21 s, reports 1 s,
figures 5 s; of which compilation 13.8 s` (12 seeds x 2500 steps as 2 shards on the config's 2
CPU devices, each seed's batch packed into half the rows, and the proxies' collection and
evaluation on packed rows; 87 s before those, 107 s before training's packing; on the AMD EPYC
of family 25 model 17 the code before the attention softmax's own derivative took 1 min 53 s,
docs/speed.md). On the Intel Xeon of family 6 model 167, with the logits computed at the scored
positions only and the narrowing projections' gradient rule: `time 68 s: training 38 s,
collection 4 s, fitting 4 s, evaluation 16 s, ...; of which compilation 14.6 s`, every program
compiled (97% of the code before the rule side by side). Its data, model and training keys are
dyck_population.py's but for the seed count (its first 12 seeds, other shards: the same numbers
up to the last bits); the population also evaluates the sizes and targets the demo leaves out.
On the AMD EPYC of family 26 model 2 (a fresh clone, caches empty, alone) the job's line was
`time 37 s: training 19 s, collection 2 s, fitting 2 s, evaluation 10 s, ...; of which
compilation 8.6 s (22 XLA programs)`. Original model, closing-bracket accuracy over the 12
seeds: iid 0.958 [95% logit-t 0.952, 0.965], unseen_depth 0.809 [0.785, 0.835], longer 0.884
[0.871, 0.898]. What its summary showed: at the smallest rank faithful in distribution (8, iid
same_pred 0.998) the SVD of the last layer's queries is less faithful on unseen_depth (+0.006
[+0.003, +0.009], 11/12 seeds) and longer (+0.005 [+0.002, +0.007], 11/12); k-means (k = 64),
one-hot and uniform attention too, and k-means and the attention proxies on unseen_structure as
well (k-means +0.005 [+0.002, +0.008], 10/12); no gap shown on seen_structure and
unseen_structure for SVD. With 4 seeds (t = 3.18) the same job showed a gap for SVD on
unseen_depth only. For the full set of sizes and targets use the 32-seed dyck_population.py.
`--config.cpu_devices=1` trains on one device (its training steps 1.26-1.34x slower at 12 seeds
on the AMD EPYC of family 25 model 17, two runs in turn; numbers that differ from the 2-device
run within seed noise: docs/speed.md).
Override any key on the command line, e.g. `--config.train.num_seeds=8
--config.data.num_train=20000`. """

from ml_collections import ConfigDict

from jaxillusions.configs import defaults


def get_config() -> ConfigDict:
    # Every key at its default (config/settings.py, tabled in docs/configs.md); the lines
    # below set what the demo changes. Data: Dyck-(8, 6) with generalization splits
    # (docs/friedman_dyck.md, "The Dyck task"); model: 2 layers, 1 head, d_model 32.
    config = defaults("dyck")
    # The seeds as 2 shards, one per core of a 2-core CPU: 1.3x faster training than one
    # device; the numbers differ in the last bits from a 1-device run (docs/speed.md).
    config.cpu_devices = 2

    config.data.num_eval = 300  # sentences per evaluation split

    # 12 seeds: the paired intervals of the finding exclude 0 (at 4, t = 3.18 hid most gaps).
    config.train.num_seeds = 12
    config.train.num_steps = 2500
    config.train.eval_every = 1250
    # The evaluations during training score the first 2,000 training sentences (all 20,000
    # took about 14 s of the demo's 2-minute job per evaluation); 0: all.
    config.train.eval_train_sentences = 2000
    # ... in batches of 100 sentences, which divide the 2,000 and each split's 300 (at 256 they
    # were padded to 2,048 and 512): 1.0 s against 2.1 s per evaluation of the 12 seeds.
    config.train.eval_batch_size = 100
    # Each training sentence starts at a random position in [0, max_position_offset], so the
    # positions the `longer` split uses are trained too. -1: as far as the model's positions
    # allow (longer_max_len - max_len + 1 = 17 here); 0: off (positions past max_len untrained).
    config.train.max_position_offset = -1
    # Each seed's 32 sentences (9 of the 26 tokens on average) packed side by side into 16
    # rows: the same loss and gradient up to float32 rounding, training 1.7-1.8x as fast
    # (docs/speed.md); about 1 step in 1,400 needs a second pass of 16 rows.
    config.train.rows_per_sentence = 0.5

    # Proxies (docs/friedman_dyck.md, "Proxies and faithfulness"): SVD, k-means, one-hot and
    # uniform attention on the last layer's (blocks.-1) queries and keys, each simplified alone.
    # (The population can add them together, "blocks.-1.attn.q+blocks.-1.attn.k".)
    config.proxies.targets = ("blocks.-1.attn.q", "blocks.-1.attn.k")
    # The demo leaves out full rank (32), the model itself.
    config.proxies.svd_ranks = (1, 2, 4, 8, 16)
    config.proxies.kmeans_sizes = (4, 16, 64)  # the population fits 2, 4, 8, ... 64
    # Sentences per evaluation chunk: on a CPU a chunk's per-size activations then stay in the
    # core's cache (evaluation 23 s against 28 s at 256; docs/speed.md). GPUs want larger.
    config.proxies.eval_batch_size = 64
    # Packed rows per activation-collection chunk (the default 512): on a CPU a chunk's
    # activations then stay nearer the cache, as the evaluation's do (the training split's
    # collection 1.2-1.5 s against 2.4-2.8 s at 512 for the demo's 12 seeds, 3.5-3.9 s against
    # 8.0-8.5 s for 30; docs/speed.md). GPUs want larger (dyck.py: 2048).
    config.proxies.collect_batch_size = 64
    # Left at their defaults (off): fits on OOD splits, subspace geometry and repair
    # (fit_shift.splits, geometry.enabled, geometry.repair_sentences: docs/why_proxies_fail.md).
    return config
