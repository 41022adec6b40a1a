"""Draws the figures of a main job's workdir that are not drawn yet: by default the main job draws
the summary set (the setting `figures`), this draws the rest, as `figures="all"` would have.

    python -m launch.figures runs/dyck_small

It reads the run's config.json, its results (results.csv, gaps.csv) and, for the activation
figures, its newest checkpoint; it works on a finished sweep and on one stopped after writing
results.csv. A figure already there is kept as it is; each new one also goes to TensorBoard's
IMAGES, once. A finished sweep's sweep_done.json then vouches for the new figures too, so a
relaunch of the sweep still finds it finished (sweep.complete_figures). Like the other
launchers it locks the workdir, and every error is one line (--debug shows the traceback).
"""

import json
import os
import sys
import time

from launch import common

USAGE = "python -m launch.figures WORKDIR, e.g. python -m launch.figures runs/dyck_small"


def read_config(workdir: str) -> dict:
    """The run's config.json; a one-line SystemExit for a workdir that is not a run."""
    if not os.path.isdir(workdir):
        sys.exit(f"error: {workdir} is not a directory ({USAGE})")
    path = os.path.join(workdir, "config.json")
    if not os.path.isfile(path):
        sys.exit(f"error: {workdir} is not the workdir of a run: it has no config.json ({USAGE})")
    try:
        with open(path) as f:
            config = json.load(f)
    except (OSError, ValueError) as err:
        sys.exit(f"error: {path} is unreadable ({type(err).__name__}: "
                 f"{str(err).splitlines()[0] if str(err) else ''})")
    if not isinstance(config, dict):
        sys.exit(f"error: {path} is unreadable (valid JSON, but a {type(config).__name__}, not "
                 "a config)")
    return config


def main() -> None:
    args = common.parse_flags(sys.argv)
    if common.CONFIG.value is not None:
        sys.exit("error: launch.figures takes no --config: it reads the run's config.json "
                 f"({USAGE})")
    workdirs = args + ([common.WORKDIR.value] if common.WORKDIR.value is not None else [])
    if len(workdirs) != 1:
        sys.exit(f"error: give one workdir ({USAGE})")
    workdir = workdirs[0]
    config = read_config(workdir)

    def job(settings) -> None:
        from jaxillusions import sweep  # noqa: PLC0415 - after the checks above: JAX is slow

        start = time.perf_counter()
        drawn = sweep.complete_figures(settings, workdir)
        print(f"[{time.perf_counter() - start:.0f}s] drew {len(drawn)} figures in {workdir} "
              "(figures/*.png, and TensorBoard's IMAGES)")

    common.guard(job, workdir, [config])


if __name__ == "__main__":
    main()
