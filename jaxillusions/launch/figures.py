"""Draws the figures of a main job's workdir that are not drawn yet: by default the main job draws
the summary set (the setting `figures`), this draws the rest, as `figures="all"` would have.

    jaxillusions figures runs/dyck_small

It reads the run's config.json, its results (results.csv, gaps.csv) and, for the activation
figures, its newest checkpoint; it works on a finished sweep and on one stopped after writing
results.csv. A figure already there is kept as it is; each new one also goes to TensorBoard's
IMAGES, once. A finished sweep's sweep_done.json then vouches for the new figures too, so a
relaunch of the sweep still finds it finished (sweep.complete_figures). A grid's workdir
(jaxillusions figures runs/dyck_grid) draws every point's, in the grid's order. Like the other
launchers it locks the workdir, and every error is one line (--debug shows the traceback).
"""

import json
import os
import sys
import time

from jaxillusions.runtime import interrupt

if __name__ == "__main__":  # first: a signal during the slow imports below is one line
    interrupt.catch_start_up()

from jaxillusions.launch import common  # noqa: E402

USAGE = "jaxillusions figures WORKDIR, e.g. jaxillusions figures runs/dyck_small"


def read_runs(workdir: str) -> list[tuple[str, object]]:
    """(directory, Settings) of the run in `workdir`, or of every point of the grid there
    (grid.json), in the grid's order; a one-line SystemExit for a workdir that is neither."""
    if not os.path.isdir(workdir):
        sys.exit(f"error: {workdir} is not a directory ({USAGE})")
    if not os.path.isfile(os.path.join(workdir, "grid.json")):
        return [(workdir, read_settings(workdir))]
    try:
        with open(os.path.join(workdir, "grid.json")) as f:
            names = list(json.load(f)["points"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        sys.exit(f"error: {os.path.join(workdir, 'grid.json')} cannot be read as a grid's "
                 f"record ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})")
    points = [os.path.join(workdir, name) for name in names]
    missing = [p for p in points if not os.path.isfile(os.path.join(p, "config.json"))]
    if missing:
        sys.exit(f"error: grid point {os.path.basename(missing[0])} has not run (no "
                 f"{os.path.join(missing[0], 'config.json')}); run the grid first")
    return [(point, read_settings(point)) for point in points]


def grid_point(workdir: str) -> bool:
    """Whether `workdir` is a point of the grid in its parent directory (its grid.json)."""
    record = os.path.join(os.path.dirname(os.path.abspath(workdir)), "grid.json")
    try:
        with open(record) as f:
            return os.path.basename(os.path.abspath(workdir)) in json.load(f)["points"]
    except (OSError, ValueError, KeyError, TypeError):
        return False


def read_settings(workdir: str):
    """The run's Settings, from its config.json (validate.read_stored, the door of stored runs;
    a grid point's with the point's stages, the grid testing prediction over every point); a
    one-line SystemExit for a workdir that is not a run."""
    if not os.path.isfile(os.path.join(workdir, "config.json")):
        sys.exit(f"error: {workdir} is not the workdir of a run: it has no config.json ({USAGE})")
    from jaxillusions.pipeline import job, validate  # noqa: PLC0415 - JAX loads only for a workdir of a run

    try:
        return validate.read_stored(workdir, job.POINT_PIPELINE if grid_point(workdir)
                                    else job.PIPELINE)
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
    runs = read_runs(workdir)

    def draw(*settings) -> None:
        from jaxillusions.pipeline import sweep  # noqa: PLC0415 - after the checks above: JAX is slow

        start = time.perf_counter()
        for (directory, _), point in zip(runs, settings, strict=True):
            drawn = sweep.complete_figures(point, directory)
            print(f"[{time.perf_counter() - start:.0f}s] drew {len(drawn)} figures in "
                  f"{directory} (figures/*.png, and TensorBoard's IMAGES)")

    from jaxillusions.pipeline import job  # noqa: PLC0415 - after the checks above

    point = grid_point(runs[0][0])  # the points of a grid, or one run (a point, or not)
    common.guard(draw, workdir, [stored for _, stored in runs],  # checked against this machine
                 job.POINT_PIPELINE if point else job.PIPELINE)


if __name__ == "__main__":
    main()
