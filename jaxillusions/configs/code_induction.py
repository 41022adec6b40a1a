"""The single-seed version of code_population.py, for the curves of
docs/notes/code_recipe_search.md ("Getting an induction head on this data: single-seed
curves"): Python
functions of up to 254 characters (context 256), an attention-only model of 2 layers, d_model
64, 2 heads of 32, learned positions and no position offsets; batch 32, peak learning rate 3e-3
(100 warmup steps, cosine decay over 8,000 steps), one seed, a checkpoint every 500 steps.
The docs' curves were measured with that schedule, which the population kept until it held the
rate at its peak for 5,000 steps: `--config.train.decay_steps=3000` gives the population's.

    nice -n 15 python -m benchmarks.induction_curves --config=code_induction \\
        --workdir=runs/induction_learned --stops=500,1000,2000,3000

trains it in increments and tests each checkpoint (previous-token attention, induction score,
loss drop, identifier gap); `--config.<key>=<value>` overrides give the other curves.
"""

from ml_collections import ConfigDict

from jaxillusions.configs import code_population


def get_config() -> ConfigDict:
    config = code_population.get_config()

    config.train.num_seeds = 1
    config.train.decay_steps = 0  # the schedule of the docs' curves (the cosine over every step)
    return config
