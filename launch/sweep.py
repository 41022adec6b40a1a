"""The main job: train all seeds, fit every proxy, evaluate faithfulness per split, report.

    python -m launch.sweep --config=configs/dyck_small.py --workdir=runs/dyck_small
"""

from jaxillusions.config.settings import Settings
from jaxillusions.pipeline import sweep
from launch import common


def main(settings: Settings, workdir: str, start_over: bool = False) -> None:
    sweep.run(settings, workdir, start_over=start_over)  # checked once, by common.run


if __name__ == "__main__":
    common.run(main)
