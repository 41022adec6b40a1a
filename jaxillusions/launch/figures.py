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


def read_runs(workdir: str) -> tuple[list[tuple[str, object]], object]:
    """(directory, Settings) of the run in `workdir`, or of every point of the grid there
    (grid.json), in the grid's order, and the pipeline they were checked with: a grid point's
    (its stages, the grid testing prediction over every point) for a grid or one of its points,
    else the main job's. A one-line SystemExit for a workdir that is neither."""
    if not os.path.isdir(workdir):
        sys.exit(f"error: {workdir} is not a directory ({USAGE})")
    grid = os.path.isfile(os.path.join(workdir, "grid.json"))
    if not grid and not os.path.isfile(os.path.join(workdir, "config.json")):
        sys.exit(f"error: {workdir} is not the workdir of a run: it has no config.json ({USAGE})")
    from jaxillusions.pipeline import job  # noqa: PLC0415 - JAX loads only for a run or a grid

    if not grid:
        parent = os.path.dirname(os.path.abspath(workdir))
        point = os.path.basename(os.path.abspath(workdir)) in grid_points(parent, strict=False)
        pipeline = job.POINT_PIPELINE if point else job.PIPELINE
        return [(workdir, read_settings(workdir, pipeline))], pipeline
    points = [os.path.join(workdir, name) for name in grid_points(workdir, strict=True)]
    missing = [p for p in points if not os.path.isfile(os.path.join(p, "config.json"))]
    if missing:
        sys.exit(f"error: grid point {os.path.basename(missing[0])} has not run (no "
                 f"{os.path.join(missing[0], 'config.json')}); run the grid first")
    return [(p, read_settings(p, job.POINT_PIPELINE)) for p in points], job.POINT_PIPELINE


def grid_points(directory: str, strict: bool) -> list[str]:
    """The point names in `directory`'s grid.json, in the grid's order: none where there is no
    readable record, or with `strict` a one-line SystemExit for a record that cannot be read."""
    record = os.path.join(directory, "grid.json")
    try:
        with open(record) as f:
            return list(json.load(f)["points"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        if not strict:
            return []
        sys.exit(f"error: {record} cannot be read as a grid's record "
                 f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})")


def read_settings(workdir: str, pipeline):
    """The run's Settings, from its config.json, checked with `pipeline` (validate.read_stored,
    the door of stored runs); a one-line SystemExit for one that cannot be read or checked."""
    from jaxillusions.pipeline import validate  # noqa: PLC0415 - loaded with JAX by read_runs

    try:
        return validate.read_stored(workdir, pipeline)
    except (OSError, ValueError) as err:
        sys.exit(f"error: {str(err).splitlines()[0]}")


def main() -> None:
    args = common.parse_flags(sys.argv, __doc__, no_config=(
        "jaxillusions figures takes no --config and no config overrides: it reads the run's "
        f"config.json ({USAGE})"), positional=True, unused=("start_over",))
    if "" in args:
        sys.exit(f"error: the workdir is an empty path ({USAGE})")
    workdirs = [os.path.expanduser(a) for a in args] + (
        [common.WORKDIR.value] if common.WORKDIR.value is not None else [])
    if len(workdirs) != 1:
        sys.exit(f"error: give one workdir ({USAGE})")
    workdir = workdirs[0]
    runs, pipeline = read_runs(workdir)

    def draw(*settings) -> None:
        from jaxillusions.pipeline import sweep  # noqa: PLC0415 - after the checks above: JAX is slow

        start = time.perf_counter()
        for (directory, _), point in zip(runs, settings, strict=True):
            try:
                drawn = sweep.complete_figures(point, directory, pipeline=pipeline)
            except interrupt.Stopped as err:  # (the report stage's words name the sweep)
                stopped = str(err).split(" while ")[0]
                raise interrupt.Stopped(
                    f"{stopped} while drawing the figures of {directory}; those drawn are kept: "
                    f"run `jaxillusions figures {workdir}` again to draw the rest",
                    err.exit_code) from None
            print(f"[{time.perf_counter() - start:.0f}s] drew {len(drawn)} figures in "
                  f"{directory} (figures/*.png, and TensorBoard's IMAGES)")

    common.guard(draw, workdir, [stored for _, stored in runs], pipeline)  # against this machine


if __name__ == "__main__":
    main()
