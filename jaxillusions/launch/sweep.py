"""The main job: train all seeds, fit every proxy, evaluate faithfulness per split, report.

    jaxillusions sweep --config=dyck_small --workdir=runs/dyck_small

(also `python -m jaxillusions.launch.sweep ...`, the same module). --config names a shipped
config or the path of your own file; --config.<section>.<key>=VALUE overrides any key. A
config with a `grid` (settings that change shapes, e.g. model.n_layers) runs one sweep per
point in <workdir>/<key>=<value> and joins them (jaxillusions/pipeline/grid.py).
"""

from jaxillusions.runtime import interrupt

if __name__ == "__main__":  # first: a signal during the slow imports below is one line
    interrupt.catch_start_up()

from jaxillusions.config.settings import Settings  # noqa: E402
from jaxillusions.launch import common  # noqa: E402
from jaxillusions.pipeline import grid, sweep  # noqa: E402


def main(settings: Settings, workdir: str, start_over: bool = False) -> None:
    # checked once, by common.run; a grid (config.grid) runs one sweep per point
    (grid.run if settings.grid else sweep.run)(settings, workdir, start_over=start_over)


if __name__ == "__main__":
    common.run(main)
