"""Trains every seed of a config's sweep together.

    python -m launch.train --config=configs/dyck_small.py --workdir=runs/dyck_small_train
"""

import numpy as np

from jaxillusions import logging as log_lib
from jaxillusions import train
from launch import common


def main(config, workdir: str) -> None:
    state, results = train.train_sweep(config, workdir)
    seeds = [int(s) for s in train.seed_list(config)]
    with log_lib.SweepWriter(f"{workdir}/tensorboard", seeds) as writer:
        writer.hparams(log_lib.flatten_config(config),
                       train.final_metrics(results, np.asarray(state.healthy)))


if __name__ == "__main__":
    common.run(main)
