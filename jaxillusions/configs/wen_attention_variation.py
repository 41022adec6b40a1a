"""Wen et al. section 4.1 on the same engine: how different are the attention patterns that
different seeds learn for Dyck-(2, 4)? Three architectures, 32 seeds each, trained with the
closing-bracket loss; attention variation per layer (mean over the 496 seed pairs, jackknife
interval over seeds) against the random baseline, plus length generalization:

    jaxillusions wen-attention --workdir=runs/wen_attention      # all three, joined table

or one architecture (the argument after ':' picks it: minimal | standard_nope | standard_linear):

    jaxillusions sweep --config=wen_attention_variation:minimal \\
        --workdir=runs/wen_attention/minimal

Time alone on the 2-core CPU machine (AMD EPYC of family 25 model 17; 32 seeds, 1000 steps):
6 min 37 s for all three variants with `launch.wen_attention`; the Wen measurements take a few
seconds of it. Result (docs/wen.md): on a 17-token prefix, the second layer's attention varies
between seeds by 0.367 [0.292, 0.443] (standard, no positions) and 0.171 [0.155, 0.187] (minimal
first layer), against 0.182 for random patterns. On the Intel Xeon of family 6 model 207: 10 min
6 s, 0.341 [0.271, 0.411] and 0.171 [0.154, 0.188] (docs/wen.md).

Set `--config.proxies.methods='("svd","kmeans")'` to also fit the proxies of Friedman et al.
and evaluate their faithfulness on these models (the bridge).
"""

from ml_collections import ConfigDict

from jaxillusions.configs import dyck_small

VARIANTS = ("minimal", "standard_nope", "standard_linear")


def get_config(arg: str = "minimal") -> ConfigDict:
    if arg not in VARIANTS:
        raise ValueError(f"wen_attention_variation:{arg}: expected one of {VARIANTS}")
    config = dyck_small.get_config()
    config.cpu_devices = 0  # as JAX starts (the documented numbers' layout: one CPU device)

    # Data: Dyck-(2, 4) (Wen et al.); the demo's 20,000 training sentences of up to 24 brackets.
    config.data.num_types = 2
    config.data.max_depth = 4
    config.data.longer_max_len = 48
    config.data.depth_extra = 1
    config.data.num_eval = 500

    # Model: 2 layers, 1 head (the demo's), width 50. "minimal": layer 0 is the minimal first
    # layer (eq. 19, a one-hot of (bracket, depth)); the others are standard layers without /
    # with the linear position encoding. model.max_len fixes the linear position scale
    # t / max_len and admits the length-generalization prefixes (16x the training length).
    config.model.d_model = 50
    config.model.d_mlp = 100
    config.model.first_layer = "minimal" if arg == "minimal" else "standard"
    config.model.pos_encoding = "linear" if arg == "standard_linear" else "none"
    config.model.max_len = 385

    # Optimizer (the demo's: batch 32, learning rate 3e-3, 200 warmup steps): next-token loss on
    # closing brackets only (Wen et al.).
    config.train.num_seeds = 32
    config.train.num_steps = 1000
    config.train.loss_on = "closing"
    # No random position offsets (dyck_small's -1 trains them): Wen et al. train every sentence at
    # positions 0.., and the linear position encoding is part of what is compared.
    config.train.max_position_offset = 0
    # One sentence per row, as Wen et al. train (the minimal first layer and the contrastive
    # regularizer read a row as one sentence).
    config.train.rows_per_sentence = 1.0
    config.train.eval_every = 1000
    config.train.checkpoint_every = 500

    # Wen et al. measurements (jaxillusions/studies/wen.py), written as wen_*.csv and
    # wen_summary.txt; the other wen.* keys at their defaults.
    config.wen.enabled = True
    config.wen.label = arg
    config.wen.length_max_len = 384  # length generalization: prefixes of 25..384 brackets (16x)

    # Proxies (Friedman et al.): off; one line turns the bridge on (see the docstring).
    config.proxies.methods = ()
    return config
