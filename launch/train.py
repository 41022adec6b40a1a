"""Trains every seed of a config's sweep together.

    python -m launch.train --config=configs/dyck_small.py --workdir=runs/dyck_small_train
"""

from jaxillusions import train
from launch import common


def main(config, workdir: str) -> None:
    train.train_sweep(config, workdir)


if __name__ == "__main__":
    common.run(main)
