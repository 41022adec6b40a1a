"""The main job: train all seeds, fit every proxy, evaluate faithfulness per split, report.

    python -m launch.sweep --config=configs/dyck_small.py --workdir=runs/dyck_small
"""

from jaxillusions import sweep
from launch import common


def main(config, workdir: str, start_over: bool = False) -> None:
    sweep.run(config, workdir, start_over=start_over)


if __name__ == "__main__":
    common.run(main)
