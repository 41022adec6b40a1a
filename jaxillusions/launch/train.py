"""Trains every seed of a config's sweep together.

    jaxillusions train --config=dyck_small --workdir=runs/dyck_small_train
"""

from jaxillusions.runtime import interrupt

if __name__ == "__main__":  # first: a signal during the slow imports below is one line
    interrupt.catch_start_up()

import numpy as np  # noqa: E402

from jaxillusions.config.settings import Settings  # noqa: E402
from jaxillusions.launch import common  # noqa: E402
from jaxillusions.report import board  # noqa: E402
from jaxillusions.runtime import distributed, tensorboard  # noqa: E402
from jaxillusions.training import train  # noqa: E402


def main(settings: Settings, workdir: str, start_over: bool = False) -> None:
    state, _ = train.train_sweep(settings, workdir, start_over=start_over)  # checked: common.run
    if not distributed.is_main():  # process 0 writes the files
        return
    sweep = train.members(settings)
    model_cfg = train.model_config(settings)  # for the HPARAMS view: no second data load
    varying = {k: v for k, v in sweep.hparams.items() if len(np.unique(v)) > 1}
    member_hparams = varying or None  # a sweep's own (contrastive weight, rate, null kind...)
    with tensorboard.board(workdir, sweep.labels) as writer:
        sessions = board.Sessions(sweep.labels, np.asarray(state.healthy), member_hparams)
        board.write_hparams(writer, settings, model_cfg, sessions, workdir=workdir)
    healthy = int(np.sum(state.healthy))
    print(f"trained {len(sweep.labels)} members to step {int(np.max(state.step))} ({healthy} "
          f"healthy); checkpoints in {workdir}/checkpoints; tensorboard --logdir "
          f"{workdir}/tensorboard")


if __name__ == "__main__":
    common.run(main)
