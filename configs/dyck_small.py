"""CPU demo of the Friedman et al. Dyck experiment: 12 seeds, small Dyck, every proxy and split.

Main job (train + fit proxies + evaluate + tables/figures), from the repository root:

    python -m launch.sweep --config=configs/dyck_small.py --workdir=runs/dyck_small

Training only:

    python -m launch.train --config=configs/dyck_small.py --workdir=runs/dyck_small_train

On the 2-core CPU machine (AMD EPYC, `lscpu`: AuthenticAMD family 25 model 17; no GPU, nothing
else running, data cached, compilation cache empty) the sweep took 1 min 53 s wall, the job's
line `time 111 s: training 66 s, collection 5 s, fitting 4 s, evaluation 29 s, reports 2 s,
figures 5 s` (12 seeds x 2500 steps as 2 shards on the config's 2 CPU devices; the 4-seed demo
before it took 86 s there, docs/speed.md). Its data, model and training keys are
configs/dyck_population.py's but for the seed count (its first 12 seeds, other shards: the same
numbers up to the last bits); the population also evaluates the sizes and targets the demo leaves
out. Original model, closing-bracket accuracy over the 12 seeds: iid 0.958 [95% logit-t
0.953, 0.964], unseen_depth 0.806 [0.783, 0.832], longer 0.883 [0.870, 0.897]. What its summary
showed: at the smallest rank faithful in distribution (8, iid same_pred 0.997) the SVD of the
last layer's queries is less faithful on unseen_depth (+0.006 [+0.003, +0.009], 12/12 seeds)
and longer (+0.006 [+0.003, +0.009], 12/12); k-means (k = 64), one-hot and uniform attention
too, and on unseen_structure as well; no gap shown on seen_structure for SVD and k-means. With 4
seeds (t = 3.18) the same job showed a gap for SVD on unseen_depth only. For the full set of
sizes and targets use the 32-seed configs/dyck_population.py. `--config.cpu_devices=1` trains
on one device (1.4x slower at 12 seeds; numbers that differ from the 2-device run within seed
noise: docs/speed.md).
Override any key on the command line, e.g.
`--config.train.num_seeds=8 --config.data.num_train=20000`.
"""

from ml_collections import ConfigDict


def get_config() -> ConfigDict:
    config = ConfigDict()
    config.task = "dyck"
    config.seed = 0  # seed s of the sweep is config.seed + s
    # The 4 seeds as 2 shards, one per core of a 2-core CPU: 1.6x faster training than one
    # device; the numbers differ in the last bits from a 1-device run (docs/speed.md).
    config.cpu_devices = 2

    # Data: Dyck-(k, m) with generalization splits (docs/friedman_dyck.md, "The Dyck task").
    config.data = ConfigDict()
    config.data.seed = 0
    config.data.num_types = 8  # k
    config.data.max_depth = 6  # m
    config.data.min_len = 2
    config.data.max_len = 24  # bracket tokens per training sentence
    config.data.longer_max_len = 40  # `longer` split: lengths max_len+1 .. longer_max_len
    config.data.depth_extra = 4  # `unseen_depth` split: depths m+1 .. m+depth_extra
    config.data.num_train = 20_000
    config.data.num_eval = 300  # sentences per evaluation split
    config.data.cache_dir = ""  # '' -> $JAXILLUSIONS_CACHE or ~/.cache/jaxillusions

    # Model: decoder-only transformer (jaxillusions/model.py).
    config.model = ConfigDict()
    config.model.n_layers = 2
    config.model.n_heads = 1
    config.model.d_model = 32
    config.model.d_head = 0  # 0 -> d_model // n_heads
    config.model.d_mlp = 64
    config.model.pos_encoding = "learned"  # none | learned | sinusoidal | linear
    config.model.attn_only = False
    config.model.uniform_attention_layers = ()
    config.model.embedding = "learned"  # learned | onehot (frozen one-hot token embeddings)
    config.model.first_layer = "standard"  # standard | minimal (Wen et al.: (type, depth) only)
    config.model.minimal_embedding = "onehot"  # onehot | type_depth | yao (Wen et al. eq. 19-21)
    config.model.max_len = 0  # positions the model supports; 0 -> the longest data split
    # bfloat16: bf16 matmuls and activations, f32 parameters, optimizer state, layer norms,
    # softmax and loss (docs/speed.md, "Mixed precision": its effect on the faithfulness
    # numbers).
    config.model.compute_dtype = "float32"

    # Optimizer and training loop.
    config.train = ConfigDict()
    # 12 seeds: the paired intervals of the finding exclude 0 (at 4, t = 3.18 hid most gaps).
    config.train.num_seeds = 12
    config.train.num_steps = 2500
    config.train.batch_size = 32
    config.train.learning_rate = 3e-3
    config.train.warmup_steps = 200
    config.train.weight_decay = 0.01
    config.train.grad_clip = 1.0
    config.train.loss_on = "all"  # all | closing (next-token loss on closing brackets only)
    # Contrastive regularization weights (Wen et al. eq. 22); several -> members = weights x
    # seeds, trained together. () -> off.
    config.train.contrastive_weights = ()
    config.train.log_every = 100
    config.train.eval_every = 1250
    config.train.checkpoint_every = 1000
    config.train.eval_batch_size = 256
    # The evaluations during training score the first 2,000 training sentences (all 20,000
    # took about 14 s of the demo's 2-minute job per evaluation); 0: all.
    config.train.eval_train_sentences = 2000
    # Each training sentence starts at a random position in [0, max_position_offset], so the
    # positions the `longer` split uses are trained too. -1: as far as the model's positions
    # allow (longer_max_len - max_len + 1 = 17 here); 0: off (positions past max_len untrained).
    config.train.max_position_offset = -1
    # Seeds trained at once over all devices; the others wait in sequential chunks of this many
    # (bounds device memory; may change float rounding, so a training key; docs/scaling_out.md).
    # 0: all at once.
    config.train.seed_chunk_size = 0

    # Proxies and faithfulness evaluation (docs/friedman_dyck.md, "Proxies and faithfulness").
    # Sites may use negative layer indices: blocks.-1 is the last layer.
    config.proxies = ConfigDict()
    # Each target is a '+'-joined list of sites simplified together (each with its own proxy).
    # (The population adds the queries and keys together, "blocks.-1.attn.q+blocks.-1.attn.k".)
    config.proxies.targets = ("blocks.-1.attn.q", "blocks.-1.attn.k")
    config.proxies.eval_splits = ("iid", "seen_structure", "unseen_structure", "unseen_depth",
                                  "longer", "iid_with_train")
    # Gaps are baseline minus split; gaps against the other baseline (iid_with_train: training
    # sentences allowed) are reported too where they lead to a different conclusion.
    config.proxies.gap_baseline = "iid"
    config.proxies.pattern_site = "blocks.-1.attn.pattern"  # where onehot/uniform attention apply
    config.proxies.methods = ("svd", "kmeans", "onehot_attention", "uniform_attention")
    # () -> 1, 2, 4, ... up to d_head; the demo leaves out full rank (32), the model itself.
    config.proxies.svd_ranks = (1, 2, 4, 8, 16)
    config.proxies.svd_center = False  # True -> PCA
    config.proxies.kmeans_sizes = (4, 16, 64)  # the population fits 2, 4, 8, ... 64
    config.proxies.kmeans_samples = 20_000  # vectors per seed used to fit k-means
    config.proxies.kmeans_iters = 25
    config.proxies.collect_batch_size = 512  # training sentences per activation-collection chunk
    # Sentences per evaluation chunk: on a CPU a chunk's per-size activations then stay in the
    # core's cache (evaluation 23 s against 28 s at 256; docs/speed.md). GPUs want larger.
    config.proxies.eval_batch_size = 64
    # Splits every data-dependent proxy is also fitted on (each on one half of its sentences,
    # evaluated on the other half): the fit x evaluate table and the gap decomposition
    # (fit_x_eval.csv, gap_decomposition.csv). "train" alone: today's analysis, nothing more.
    config.proxies.fit_splits = ("train",)
    config.proxies.fit_sentences = 0  # sentences per fit, train included; 0: all
    # Seeds per call of the proxy stage; 0: as many as fit the device's memory (on a CPU, the
    # host RAM's share per CPU device; docs/scaling_out.md).
    config.proxies.seed_chunk_size = 0
    # Why proxies fail (geometry_stage.py): principal angles and outside energy of the SVD
    # proxies' subspaces per split (geometry.csv, geometry_predicts_gap.csv), and repair with M
    # unlabelled sentences of each OOD split, e.g. (4, 16, 64, 256) (repair.csv). Off: False, ().
    config.proxies.geometry = False
    config.proxies.repair_sentences = ()
    return config
