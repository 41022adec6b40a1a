"""Trains every seed of a config's sweep together.

    python -m launch.train --config=configs/dyck_small.py --workdir=runs/dyck_small_train
"""

import numpy as np

from jaxillusions import distributed, train
from jaxillusions import logging as log_lib
from jaxillusions.analysis import board
from launch import common


def main(config, workdir: str, start_over: bool = False) -> None:
    state, _ = train.train_sweep(config, workdir, start_over=start_over)
    if not distributed.is_main():  # process 0 writes the files
        return
    sweep = train.members(config)
    model_cfg = train.model_config(config)  # for the HPARAMS view: no second data load
    member_hparams = sweep.hparams if len(train.contrastive_weights(config)) > 1 else None
    with log_lib.SweepWriter(f"{workdir}/tensorboard", sweep.labels) as writer:
        sessions = board.Sessions(sweep.labels, np.asarray(state.healthy), member_hparams)
        board.write_hparams(writer, config, model_cfg, sessions, workdir=workdir)


if __name__ == "__main__":
    common.run(main)
