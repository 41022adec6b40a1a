"""A grid of shape-changing settings (config.grid, config/grid_axes.py, pipeline/grid.py): one run
per point, each the run its config is alone, bit for bit; one results table with a column per grid
key; the held-out prediction test over every point's members, the grid key a hyper-parameter;
bad grids refused at the door in one line."""

import glob
import os

import numpy as np
import pandas as pd
import pytest
from conftest import tiny_sweep_config

from jaxillusions.config import grid_axes
from jaxillusions.pipeline import grid, sweep, validate
from jaxillusions.runtime import stages
from jaxillusions.studies import prediction
from jaxillusions.training import train

pytest.importorskip("sklearn")


def _config(cache_dir):
    config = tiny_sweep_config(cache_dir)
    config.train.num_seeds = 4
    config.train.weight_decays = (0.0, 1.0)
    config.train.null = ("untrained",)
    config.grid = ("model.n_layers=1,2",)  # 2 points x 2 settings x 4 seeds
    config.prediction.enabled = True
    config.prediction.n_splits = 2
    config.prediction.n_repeats = 2
    config.figures = "none"
    return config


def test_points_are_the_product_of_the_axes_in_order():
    points = grid_axes.points(("model.n_layers=1,2", "model.d_model=16,32"))
    assert [grid_axes.name(p) for p in points] == [
        "model.n_layers=1,model.d_model=16", "model.n_layers=1,model.d_model=32",
        "model.n_layers=2,model.d_model=16", "model.n_layers=2,model.d_model=32"]
    assert points[0] == {"model.n_layers": 1, "model.d_model": 16}  # typed as Python reads them
    assert grid_axes.points(("model.pos_encoding=rotary,learned",))[0] == {
        "model.pos_encoding": "rotary"}


@pytest.mark.slow
def test_a_grid_point_is_the_run_alone_and_the_grid_tests_every_points_members(
        tmp_path, cache_dir, monkeypatch, capsys):
    config = _config(cache_dir)
    workdir = str(tmp_path / "grid")
    joined = grid.run(validate.check(config)[0], workdir, verbose=False)

    # One table, a column per grid key and per varying hyper-parameter: every group's rows.
    table = pd.read_csv(os.path.join(workdir, "results.csv"))
    assert table.groupby(["model.n_layers", "weight_decay", "null"]).size().index.tolist() == [
        (n, wd, kind) for n in (1, 2) for wd in (0.0, 1.0) for kind in ("trained", "untrained")]
    for layers in (1, 2):  # each point's groups (a directory per weight decay and null kind)
        groups = glob.glob(os.path.join(workdir, f"model.n_layers={layers}", "*", "results.csv"))
        assert len(groups) == 4
        assert len(table[table["model.n_layers"] == layers]) == sum(
            len(pd.read_csv(path)) for path in groups)
    assert len(joined) == len(table)

    # The point model.n_layers=2 is the run of the same config without the grid, bit for bit.
    alone = _config(cache_dir)
    alone.grid = ()
    alone.model.n_layers = 2
    sweep.run(validate.check(alone)[0], str(tmp_path / "alone"), verbose=False)
    point = os.path.join(workdir, "model.n_layers=2")
    names = sorted(os.path.relpath(p, point) for p in glob.glob(os.path.join(point, "**", "*.csv"),
                                                                recursive=True))
    assert len(names) > 8
    for name in names:
        with open(os.path.join(point, name), "rb") as mine, \
                open(str(tmp_path / "alone" / name), "rb") as theirs:
            assert mine.read() == theirs.read(), name

    # The test: 16 trained members in 4 settings (n_layers x weight decay), with their null.
    members = pd.read_csv(os.path.join(workdir, "prediction_members.csv"), index_col="member")
    assert sorted(members["kind"].value_counts().items()) == [("trained", 16), ("untrained", 16)]
    trained = members[members["kind"] == "trained"]
    assert trained.groupby(["hp:model.n_layers", "hp:weight_decay"]).size().tolist() == [4] * 4
    # Last-layer features of both depths line up under layer -1; the best head too.
    assert "attn:stack_top:L-1H0" in members and "attn:stack_top:max" in members
    one = trained[trained["hp:model.n_layers"] == 1]
    assert np.array_equal(one["attn:stack_top:L-1H0"], one["attn:stack_top:L0H0"])
    assert trained["attn:stack_top:L1H0"].isna().sum() == 8  # the 1-layer points have none
    rows = pd.read_csv(os.path.join(workdir, "prediction.csv"))
    assert {r for r in rows["members"]} == {16}
    loso = rows[(rows["scheme"] == "leave_one_setting_out") & (rows["family"] == "all")]
    assert set(loso["n_folds"] + loso["n_skipped"]) == {4}  # one fold per held-out setting
    text = open(os.path.join(workdir, "prediction.txt")).read()
    assert text.startswith("Held-out prediction: 16 trained members, 4 settings of "
                           "hp:weight_decay, hp:model.n_layers")
    assert "attn:stack_top:L1H0" not in open(os.path.join(workdir, "prediction.csv")).read()

    # A relaunch finds every point and the grid done: the same table, nothing tested or
    # written again.
    written = {name: os.stat(os.path.join(workdir, name)).st_mtime_ns
               for name in ("results.csv", "grid.json", "prediction.csv", grid.DONE_FILE)}
    monkeypatch.setattr(prediction, "test", lambda *a, **k: pytest.fail("tested again"))
    again = grid.run(validate.check(config)[0], workdir)
    pd.testing.assert_frame_equal(again, joined)
    assert f"the grid in {workdir} is finished" in capsys.readouterr().out
    assert {name: os.stat(os.path.join(workdir, name)).st_mtime_ns for name in written} == written
    monkeypatch.undo()

    # Other prediction settings test again; the earlier test's files are kept under superseded/.
    config.prediction.n_repeats = 3
    grid.run(validate.check(config)[0], workdir, verbose=False)
    kept = glob.glob(os.path.join(workdir, "superseded", "*", "prediction.csv"))
    assert len(kept) == 1 and pd.read_csv(kept[0]).equals(rows)
    assert not pd.read_csv(os.path.join(workdir, "prediction.csv")).equals(rows)


def test_a_finished_grid_is_current_until_its_inputs_or_outputs_change(tmp_path):
    inputs = {"read": {"model.n_layers=1/results.csv": "ab"}, "prediction": None}
    notes = []

    def finish():
        for name in grid.OUTPUTS:
            (tmp_path / name).write_text(name)
        grid._mark_done(str(tmp_path), inputs, grid.OUTPUTS + prediction.OUTPUTS)

    def current(given):
        return grid._current(str(tmp_path), given, stages.mover(str(tmp_path), notes.append))

    assert current(inputs) is None and notes == []  # nothing yet, nothing moved
    finish()
    assert current(inputs)["inputs"] == inputs and notes == []
    changes = [("another point file", lambda: None,
                {**inputs, "read": {"model.n_layers=1/results.csv": "cd"}},
                "was computed from other point results or prediction settings"),
               ("an output changed", lambda: (tmp_path / "grid.json").write_text("{}"), inputs,
                "is from a finished grid, but its grid.json differs from the sha256 recorded "
                f"in {grid.DONE_FILE}"),
               ("the marker unreadable", lambda: (tmp_path / grid.DONE_FILE).write_text("[1"),
                inputs, f"is from a grid whose {grid.DONE_FILE} is unreadable"),
               ("the marker gone", lambda: (tmp_path / grid.DONE_FILE).unlink(), inputs,
                f"is from a grid that did not finish, or predates {grid.DONE_FILE}")]
    for what, change, given, why in changes:
        finish()
        change()
        notes.clear()
        assert current(given) is None, what
        moved = sorted(n.split()[1] for n in notes)
        assert moved == sorted([*grid.OUTPUTS, *([grid.DONE_FILE] if (
            "gone" not in what) else [])]), what
        assert all(why in n for n in notes), (what, notes)
        assert not any((tmp_path / name).exists() for name in grid.OUTPUTS), what
    assert len(glob.glob(str(tmp_path / "superseded" / "*" / "results.csv*"))) == len(changes)


@pytest.mark.parametrize("entries, message", [
    (("model.n_layers=2",), "a grid needs at least 2 points"),
    (("model.n_layers",), "grid=('model.n_layers',): must be entries key=value1,value2"),
    (("model.n_layers=1,2", "model.n_layers=3,4"), "model.n_layers is already in the grid"),
    (("model.n_layers=1,1",), "a value is repeated"),
    (("model.n_layer=1,2",), "grid point model.n_layer=1: unknown config key model.n_layer"),
    (("model.n_layers=1,0",), "grid point model.n_layers=0: model.n_layers=0: must be >= 1"),
    (("cpu_devices=1,2",), "cpu_devices cannot vary over a grid"),
    (("proxies.svd_ranks=1,2",), "grid: proxies.svd_ranks changes what is measured"),
])
def test_bad_grids_are_one_line_errors_at_the_door(cache_dir, entries, message):
    config = _config(cache_dir)
    config.grid = entries
    with pytest.raises(ValueError) as err:
        validate.check(config)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_grid_of_too_few_members_for_the_prediction_test_is_refused_before_any_point_runs(
        cache_dir, tmp_path, monkeypatch):
    """The points' trained members together fill the random splits, or the grid says so before
    any point runs (was: every point trained, then "target ... has 4 members in its smaller
    class")."""
    config = _config(cache_dir)
    config.train.num_seeds, config.prediction.n_splits = 2, 5  # 2 x 2 x 2 = 8 < 10
    monkeypatch.setattr(sweep, "run", lambda *a, **k: pytest.fail("a point ran"))
    with pytest.raises(ValueError) as err:
        grid.run(validate.check(config)[0], str(tmp_path / "grid"))
    assert str(err.value) == (
        "prediction.n_splits=5: the random splits need at least 10 trained members (each class "
        "of a target split at its median holds at most half of them); this grid has 8 (2 seeds "
        "x 2 settings + 2 seeds x 2 settings over 2 points): more train.num_seeds, or fewer "
        "prediction.n_splits")
    assert not os.path.exists(tmp_path / "grid" / "model.n_layers=1")
    config.prediction.n_splits = 4  # 8 members fill 4 folds: the points run
    with pytest.raises(pytest.fail.Exception, match="a point ran"):
        grid.run(validate.check(config)[0], str(tmp_path / "grid"))


def test_a_grid_and_a_run_refuse_each_others_workdir_before_any_work(
        cache_dir, tmp_path, monkeypatch):
    """A grid's folder holds its joined results.csv and its points in subfolders, a run's its own
    results: either launched in the other's folder would replace that results.csv (was: each
    relaunch moved the other's results.csv to superseded/)."""
    config = _config(cache_dir)
    monkeypatch.setattr(sweep, "run", lambda *a, **k: pytest.fail("a point ran"))
    run_dir, grid_dir = tmp_path / "run", tmp_path / "grid"
    run_dir.mkdir()
    (run_dir / "config.json").write_text("{}")
    with pytest.raises(ValueError) as err:
        grid.run(validate.check(config)[0], str(run_dir))
    assert str(err.value) == (f"workdir {run_dir} holds a run (config.json), not a grid: the "
                              "grid would replace its results.csv; run the grid in a new "
                              "--workdir")
    for name in grid.OUTPUTS[1], grid.DONE_FILE:  # a finished grid has both
        grid_dir.mkdir(exist_ok=True)
        (grid_dir / name).write_text("{}")
        config.grid = ()
        with pytest.raises(ValueError) as err:
            train.claim_workdir(str(grid_dir), validate.check(config)[0], record=False)
        assert str(err.value).startswith(f"workdir {grid_dir} holds a grid ({name}; ")
        assert "\n" not in str(err.value)
        (grid_dir / name).unlink()
    assert sorted(os.listdir(grid_dir)) == []  # nothing written


def test_figures_of_a_grid_read_every_point_with_the_points_stages(tmp_path, cache_dir):
    """jaxillusions figures on a grid draws every point's; a point's stored config is checked
    with the point's stages (the grid tests prediction over all points). Was: the grid refused
    ("draw a point's figures"), and the point then refused for its few members
    (prediction.n_splits, checked as if the point ran the test alone)."""
    import json

    from jaxillusions.launch import figures
    from jaxillusions.pipeline import job

    config = _config(cache_dir)
    config.grid, config.train.num_seeds, config.prediction.n_splits = (), 1, 5
    stored = validate.parse(config, job.POINT_PIPELINE).to_dict()
    names = ["model.n_layers=1", "model.n_layers=2"]
    (tmp_path / "grid.json").write_text(json.dumps({"points": {n: {} for n in names}}))
    (tmp_path / names[0]).mkdir()
    (tmp_path / names[0] / "config.json").write_text(json.dumps(stored))
    with pytest.raises(SystemExit) as err:  # a point not run yet
        figures.read_runs(str(tmp_path))
    assert str(err.value) == (f"error: grid point {names[1]} has not run (no "
                              f"{tmp_path / names[1] / 'config.json'}); run the grid first")
    (tmp_path / names[1]).mkdir()
    (tmp_path / names[1] / "config.json").write_text(json.dumps(stored))
    runs, pipeline = figures.read_runs(str(tmp_path))
    assert [d for d, _ in runs] == [str(tmp_path / n) for n in names]
    assert pipeline is job.POINT_PIPELINE
    assert figures.read_runs(runs[0][0])[1] is job.POINT_PIPELINE  # one point alone
    alone = tmp_path / "copied"  # the same config outside the grid is a run of its own
    alone.mkdir()
    (alone / "config.json").write_text(json.dumps(stored))
    assert figures.read_runs(str(alone))[1] is job.PIPELINE
    for _, point in runs:
        validate.check(point, job.POINT_PIPELINE)  # as the launcher checks it
        with pytest.raises(ValueError, match=r"^prediction.n_splits=5: the random splits need"):
            validate.check(point)  # as a run of its own (the earlier check)
    (tmp_path / "grid.json").write_text("[1")
    with pytest.raises(SystemExit, match="grid.json cannot be read as a grid's record"):
        figures.read_runs(str(tmp_path))
