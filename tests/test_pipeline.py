"""The main job is one tuple of stages (sweep.PIPELINE): adding a stage to it is all it takes
for the stage to run, be saved, resume and be timed."""

import json
import os
import re
import shutil

import numpy as np
import pytest
from conftest import checked, tiny_sweep_config

from jaxillusions.pipeline import sweep
from jaxillusions.runtime import stages


def test_pipeline_order_and_timing_names_come_from_the_tuple():
    names = [s.name for s in sweep.PIPELINE]
    assert names == ["training", "wen", "induction", "proxies", "dictionaries", "geometry",
                     "probes", "fit_shift", "circuits", "reports", "figures"]
    # The run's stages come before the weight groups' (the runner does them first).
    scopes = [s.scope for s in sweep.PIPELINE]
    assert scopes == sorted(scopes, key=["run", "group"].index)
    assert sweep.clocks()[:4] == ("training", "wen", "induction", "collection")
    # Every report file a stage writes is moved aside and checksummed through its stage.
    outputs = [o for s in sweep.PIPELINE for o in s.outputs]
    assert len(outputs) == len(set(outputs)) and "results.csv" in outputs


def test_a_toy_stage_runs_resumes_from_its_stage_file_and_is_timed(tiny_sweep, tmp_path,
                                                                    cache_dir, capsys):
    """Two toy stages added to the tuple of a finished sweep: a run stage saved whole (its
    stage file) and a group stage that fails once. The relaunch after the failure skips the
    first (its stage file), runs the second, and the timing line names both stages' clocks."""
    workdir = str(tmp_path / "run")
    shutil.copytree(tiny_sweep, workdir)
    calls = {"count": 0, "group": 0}

    def count_healthy(ctx):
        calls["count"] += 1
        with open(os.path.join(ctx.workdir, "toy.txt"), "w") as f:
            f.write(f"{int(np.sum(ctx.state.healthy))}\n")
        return ctx.produced(toy=calls["count"])

    def fail_once(ctx):
        calls["group"] += 1
        if calls["group"] == 1:
            raise RuntimeError("the toy group stage stops once")
        assert ctx.results["rows"] and ctx.seeds == (0, 1)  # after the proxies, per group
        return ctx

    toy = stages.Stage("toy", count_healthy, scope="run", keys=("proxies.svd_ranks",),
                       outputs=("toy.txt",), stamped=True)
    group_toy = stages.Stage("group_toy", fail_once)
    pipeline = (*sweep.PIPELINE[:1], toy, *sweep.PIPELINE[1:], group_toy)
    config = tiny_sweep_config(cache_dir)

    with pytest.raises(RuntimeError, match="stops once"):
        sweep.run(checked(config), workdir, pipeline=pipeline)
    assert calls == {"count": 1, "group": 1}
    assert open(os.path.join(workdir, "toy.txt")).read() == "2\n"
    assert os.path.isfile(stages.stage_file(workdir, "toy"))
    capsys.readouterr()

    sweep.run(checked(config), workdir, pipeline=pipeline)  # resumes: toy from its stage file
    out = capsys.readouterr().out
    assert calls == {"count": 1, "group": 2}
    assert "toy: done before (stage file proxies/stage_toy.json)" in out
    line = next(line for line in out.splitlines() if line.startswith("time "))
    assert re.search(r"group_toy \d+ s", line) and "training" in line
    done = json.loads(open(os.path.join(workdir, sweep.DONE_FILE)).read())
    assert done["stages"][-1] == "group_toy" and "toy.txt" in done["reports"]

    # A key of the toy stage changes: it runs again, its earlier output kept under superseded/.
    config.proxies.svd_ranks = (1, 2)
    sweep.run(checked(config), workdir, verbose=False, pipeline=pipeline)
    assert calls["count"] == 2
    moved = [f for _, _, files in os.walk(os.path.join(workdir, "superseded")) for f in files]
    assert "toy.txt" in moved and "stage_toy.json" in moved
    capsys.readouterr()

    # Its stage file lost: it runs again, and the note on its output says why.
    os.remove(stages.stage_file(workdir, "toy"))
    os.remove(os.path.join(workdir, sweep.DONE_FILE))
    sweep.run(checked(config), workdir, pipeline=pipeline)
    out = capsys.readouterr().out
    assert calls["count"] == 3
    assert ("note: toy.txt has no stage file (proxies/stage_toy.json) to say which settings "
            "made it; moved to superseded/") in out
