"""Population version of the CPU demo: the Dyck experiment of configs/dyck_small.py at 32 seeds.

    python -m launch.sweep --config=configs/dyck_population.py --workdir=runs/dyck_population

Every proxy, target and split of the demo (the `iid_with_train` baseline included), seeds 0..31,
2500 steps instead of 3000 and 300 instead of 500 sentences per evaluation split, so that it
fits in about 20 minutes on a 2-core CPU.
Time: TO BE MEASURED.
"""

from ml_collections import ConfigDict

from configs import dyck_small


def get_config() -> ConfigDict:
    config = dyck_small.get_config()

    # Data: the demo's Dyck-(8, 6); fewer evaluation sentences per split (7 splits x 300).
    config.data.num_eval = 300

    # Training: 32 seeds (the unit of evidence, shared/DESIGN.md section 9), trained together.
    config.train.num_seeds = 32
    config.train.num_steps = 2500
    config.train.eval_every = 0  # evaluate once, at the end
    config.train.checkpoint_every = 500

    # Proxies: every method, target and split of the demo (configs/dyck_small.py).
    return config
