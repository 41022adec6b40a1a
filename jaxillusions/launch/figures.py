"""Draws the figures of a main job's workdir that are not drawn yet: by default the main job draws
the summary set (the setting `figures`), this draws the rest, as `figures="all"` would have.

    jaxillusions figures runs/dyck_small

It reads the run's config.json, its results (results.csv, gaps.csv) and, for the activation
figures, its newest checkpoint; it works on a finished sweep and on one stopped after writing
results.csv. A figure already there is kept as it is; each new one also goes to TensorBoard's
IMAGES, once. A finished sweep's sweep_done.json then vouches for the new figures too, so a
relaunch of the sweep still finds it finished (sweep.complete_figures). Like the other
launchers it locks the workdir, and every error is one line (--debug shows the traceback).
"""

import os
import sys
import time

from jaxillusions.runtime import interrupt

if __name__ == "__main__":  # first: a signal during the slow imports below is one line
    interrupt.catch_start_up()

from jaxillusions.launch import common  # noqa: E402

USAGE = "jaxillusions figures WORKDIR, e.g. jaxillusions figures runs/dyck_small"


def read_settings(workdir: str):
    """The run's Settings, from its config.json (validate.read_stored, the door of stored runs);
    a one-line SystemExit for a workdir that is not a run."""
    if not os.path.isdir(workdir):
        sys.exit(f"error: {workdir} is not a directory ({USAGE})")
    if os.path.isfile(os.path.join(workdir, "grid.json")):
        points = sorted(d for d in os.listdir(workdir)
                        if os.path.isfile(os.path.join(workdir, d, "config.json")))
        sys.exit(f"error: {workdir} is a grid: draw a point's figures, e.g. jaxillusions "
                 f"figures {os.path.join(workdir, points[0] if points else '<point>')}")
    if not os.path.isfile(os.path.join(workdir, "config.json")):
        sys.exit(f"error: {workdir} is not the workdir of a run: it has no config.json ({USAGE})")
    from jaxillusions.pipeline import validate  # noqa: PLC0415 - JAX loads only for a workdir of a run

    try:
        return validate.read_stored(workdir)
    except (OSError, ValueError) as err:
        sys.exit(f"error: {str(err).splitlines()[0]}")


def main() -> None:
    args = common.parse_flags(sys.argv, __doc__, no_config=(
        "jaxillusions figures takes no --config and no config overrides: it reads the run's "
        f"config.json ({USAGE})"))
    if "" in args:
        sys.exit(f"error: the workdir is an empty path ({USAGE})")
    workdirs = [os.path.expanduser(a) for a in args] + (
        [common.WORKDIR.value] if common.WORKDIR.value is not None else [])
    if len(workdirs) != 1:
        sys.exit(f"error: give one workdir ({USAGE})")
    workdir = workdirs[0]
    stored = read_settings(workdir)

    def job(settings) -> None:
        from jaxillusions.pipeline import sweep  # noqa: PLC0415 - after the checks above: JAX is slow

        start = time.perf_counter()
        drawn = sweep.complete_figures(settings, workdir)
        print(f"[{time.perf_counter() - start:.0f}s] drew {len(drawn)} figures in {workdir} "
              "(figures/*.png, and TensorBoard's IMAGES)")

    common.guard(job, workdir, [stored])  # checked against this machine there


if __name__ == "__main__":
    main()
