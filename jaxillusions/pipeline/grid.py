"""The runner of a grid (config.grid, config/grid_axes.py): every point as a run of its own,
then one population table.

    jaxillusions sweep --config=dyck_grid --workdir=runs/dyck_grid

Each point (e.g. model.n_layers=2) runs the main job (sweep.run, with job.POINT_PIPELINE) in
`<workdir>/<point name>`: the run its config is on its own, resumed and left alone when done
as any run is, with its own reports, figures and timing line. The grid then writes, in the
workdir:

- results.csv: every point's rows (each group's results.csv, cells as written), with a column
  per grid key (e.g. `model.n_layers`) and per hyper-parameter that varies in the member axis
  (e.g. `weight_decay`; `null`: trained, untrained or shuffled);
- grid.json: the points, their directories and the grid's settings;
- with prediction.enabled, the held-out prediction test over every point's members
  (studies/prediction.py: prediction.csv, prediction.txt, prediction_auroc.png,
  prediction_members.csv), the grid keys as hyper-parameters (`hp:<key>`) beside those of the
  member axis, so that leaving one setting out holds out one (point, member setting) pair (a
  member's `setting` and name hold both). Before any point runs, the trained members of every
  point are counted together (prediction.check_count).
  Points of different depths name their last layer's sites and heads as -1 too (`align`), so
  that features of the last layer line up; a feature a point lacks is left out of the test.

A finished grid (grid_done.json: the sha256 of every point file it read, its prediction
settings, and the sha256 of every file it wrote) is left as it is on a relaunch while those
match. Otherwise (a point's results or members changed, prediction.* changed, an output is
missing or altered, or the grid stopped before it finished) the earlier outputs are moved to
superseded/<time>/ and written again.

Ends with the grid's timing line: each stage's seconds summed over the points.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import TYPE_CHECKING

from jaxillusions.config import settings
from jaxillusions.config.grid_axes import axes
from jaxillusions.config.settings import Settings
from jaxillusions.pipeline import job, sweep, validate
from jaxillusions.runtime import checkpoint, distributed, stages, timing
from jaxillusions.studies import prediction
from jaxillusions.training import train

if TYPE_CHECKING:  # for annotations; the functions import it where used
    import pandas as pd

OUTPUTS = ("results.csv", checkpoint.GRID_FILES[0])
DONE_FILE = checkpoint.GRID_FILES[1]


def align(frame: pd.DataFrame, n_layers: int) -> pd.DataFrame:
    """A point's members frame with its last layer's features also under layer -1
    (`blocks.<n-1>.` -> `blocks.-1.`, `:L<n-1>H` -> `:L-1H`), and each attention target's
    best head (`attn:<target>:max`, the largest of its heads' columns)."""
    import pandas as pd  # noqa: PLC0415 - not at a launch's start
    last, out = n_layers - 1, {}
    for column in frame:
        alias = column.replace(f"blocks.{last}.", "blocks.-1.").replace(f":L{last}H", ":L-1H")
        if alias != column and alias not in frame:
            out[alias] = frame[column]
    heads: dict[str, list[str]] = {}
    for column in frame:
        match = re.fullmatch(r"attn:(.+):L\d+H\d+", column)
        if match:
            heads.setdefault(match.group(1), []).append(column)
    for target, columns in heads.items():
        out[f"attn:{target}:max"] = frame[columns].max(axis=1)
    return pd.concat([frame, pd.DataFrame(out, index=frame.index)], axis=1)


def point_files(point: Settings, directory: str) -> list[str]:
    """The files of a finished point that the grid reads: each group's results.csv, and with
    prediction.enabled its prediction_members.csv."""
    files = [os.path.join(group, "results.csv")
             for _, group in train.member_groups(point, directory)]
    if prediction.enabled(point):
        files.append(os.path.join(directory, prediction.OUTPUTS[3]))
    return files


def population_table(point: Settings, directory: str, values: dict) -> pd.DataFrame:
    """A point's results.csv rows (every group's, cells as written) with a column per grid key
    (`values`) and per hyper-parameter of its member axis that varies (its null kind by name)."""
    import pandas as pd  # noqa: PLC0415 - not at a launch's start
    sweep_members = train.members(point)
    parts = []
    for idx, group in train.member_groups(point, directory):
        table = pd.read_csv(os.path.join(group, "results.csv"), dtype=str,
                            keep_default_na=False)
        parts.append(table.assign(**values, **sweep_members.varying(idx[0])))
    return pd.concat(parts, ignore_index=True)


def run(config: Settings, workdir: str, *, verbose: bool = True,
        start_over: bool = False) -> pd.DataFrame:
    """Runs every point of config.grid (checked at the door: validate.check; and here, before
    any point runs, that their trained members together fill the prediction test's folds, and
    that the workdir holds no run of its own: a one-line ValueError naming its config.json),
    then writes the grid's outputs, unless a finished grid's are current (grid_done.json);
    returns the joined results.csv (cells as written)."""
    import pandas as pd  # noqa: PLC0415 - not at a launch's start
    points = validate.points(config)
    prediction.check_count([point for _, point in points], "this grid")
    if os.path.lexists(os.path.join(workdir, checkpoint.CONFIG_FILE)):
        raise ValueError(f"workdir {workdir} holds a run ({checkpoint.CONFIG_FILE}), not a grid: "
                         "the grid would replace its results.csv; run the grid in a new "
                         "--workdir")
    say = print if verbose and distributed.is_main() else (lambda *a, **k: None)
    os.makedirs(workdir, exist_ok=True)
    keys = [key for key, _ in axes(config.grid)]
    values = {name: {key: settings.flat(point)[key] for key in keys} for name, point in points}
    tables, members, read = [], [], []
    with timing.Breakdown() as clock:
        for index, (name, point) in enumerate(points):
            directory = os.path.join(workdir, name)
            say(f"grid point {index + 1} of {len(points)}: {name} (in {directory})")
            sweep.run(point, directory, verbose=verbose, start_over=start_over,
                      pipeline=job.POINT_PIPELINE)
            tables.append(population_table(point, directory, values[name]))
            read += point_files(point, directory)
            if prediction.enabled(point):
                frame = prediction.read_members(os.path.join(directory,
                                                             prediction.OUTPUTS[3]))
                frame = align(frame, point.model.n_layers)
                members.append(frame.assign(**{f"hp:{k}": v for k, v in values[name].items()}))
        joined = pd.concat(tables, ignore_index=True)
        inputs = json.loads(json.dumps(  # as grid_done.json holds them (tuples as lists)
            {"read": {os.path.relpath(p, workdir): stages.sha256(p) for p in read},
             "prediction": dataclasses.asdict(config.prediction) if members else None},
            default=str))
        done = _current(workdir, inputs, stages.mover(workdir, say))
        if done is not None:
            say(f"the grid in {workdir} is finished (finished {done['time']}); nothing to do. "
                f"Results: {os.path.join(workdir, OUTPUTS[0])}")
            return joined
        if distributed.is_main():
            path = os.path.join(workdir, OUTPUTS[0])
            with stages.writing("grid", path):
                joined.to_csv(path, index=False)
            stages.write(os.path.join(workdir, OUTPUTS[1]), json.dumps(
                {"points": values, "settings": config.to_dict()}, indent=1, default=str), "grid")
        if members:
            with timing.stage("prediction"):
                prediction.test(pd.concat(members), config.prediction, workdir, say,
                                config.train.null)
        _mark_done(workdir, inputs, OUTPUTS + (prediction.OUTPUTS if members else ()))
    say(f"grid of {len(points)} points: {clock.line(sweep.clocks(job.POINT_PIPELINE))}")
    return joined


def _current(workdir: str, inputs: dict, move_aside) -> dict | None:
    """The grid's grid_done.json when the grid finished from these `inputs` and every output
    it wrote matches its sha256; else None, with the earlier outputs (and the marker) moved to
    superseded/, saying why."""
    try:
        done = stages.read_json(os.path.join(workdir, DONE_FILE))
    except (OSError, ValueError):
        done = False
    if done is None:
        why = f"is from a grid that did not finish, or predates {DONE_FILE}"
    elif not (isinstance(done, dict) and isinstance(done.get("time"), str)
              and isinstance(done.get("outputs"), dict)):
        why = f"is from a grid whose {DONE_FILE} is unreadable"
    elif done.get("inputs") != inputs:
        why = "was computed from other point results or prediction settings"
    else:
        changed = stages.unverified(done["outputs"], workdir, DONE_FILE)
        if changed is None:
            return done
        why = f"is from a finished grid, but {changed}"
    for name in (DONE_FILE, *OUTPUTS, *prediction.OUTPUTS):
        if os.path.lexists(os.path.join(workdir, name)):
            move_aside(os.path.join(workdir, name), why)
    return None


def _mark_done(workdir: str, inputs: dict, outputs: tuple[str, ...]) -> None:
    """grid_done.json: when, from which inputs, and the sha256 of every output written."""
    if distributed.is_main():
        stages.write(os.path.join(workdir, DONE_FILE), json.dumps(
            {"time": checkpoint.now(), "inputs": inputs,
             "outputs": {name: stages.sha256(os.path.join(workdir, name)) for name in outputs
                         if os.path.isfile(os.path.join(workdir, name))}},
            indent=1, sort_keys=True, default=str), "grid")
