"""The main job is one tuple of stages (job.PIPELINE): adding a stage to it is all it takes
for the stage to run, be saved, resume and be timed."""

import dataclasses
import json
import os
import re
import shlex
import shutil

import numpy as np
import pytest
from conftest import checked, tiny_sweep_config
from ml_collections import ConfigDict

from jaxillusions.config import fields
from jaxillusions.pipeline import job, sweep, validate
from jaxillusions.runtime import stages
from jaxillusions.studies import stage


def test_pipeline_order_and_timing_names_come_from_the_tuple():
    names = [s.name for s in job.PIPELINE]
    assert names == ["training", "wen", "induction", "proxies", "dictionaries", "geometry",
                     "probes", "fit_shift", "circuits", "reports", "figures", "prediction"]
    # The run's stages come before the groups', the population's last (the runner's order).
    scopes = [s.scope for s in job.PIPELINE]
    assert scopes == sorted(scopes, key=stage.SCOPES.index)
    assert sweep.clocks()[:4] == ("training", "wen", "induction", "collection")
    # Every report file a stage writes is moved aside and checksummed through its stage.
    outputs = [o for s in job.PIPELINE for o in s.outputs]
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
        return ctx.produced("toy", count=calls["count"])

    def fail_once(ctx):
        calls["group"] += 1
        if calls["group"] == 1:
            raise RuntimeError("the toy group stage stops once")
        assert ctx.proxies.rows and ctx.seeds == (0, 1)  # after the proxies, per group
        return ctx

    toy = stage.Stage("toy", count_healthy, scope="run", keys=("proxies.svd_ranks",),
                       outputs=("toy.txt",), stamped=True)
    group_toy = stage.Stage("group_toy", fail_once)
    pipeline = (*job.PIPELINE[:1], toy, *job.PIPELINE[1:-1], group_toy, job.PIPELINE[-1])
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


def test_a_finished_training_is_evaluated_again_only_for_a_stage_that_needs_it(
        tiny_sweep, tmp_path, cache_dir):
    """A relaunch resumes a finished training. Its evaluation on every split
    (Context.final_eval) is computed again only when an enabled stage needs FINAL_EVAL, as the
    Wen study does: nothing else reads it, and a population of hundreds of members spends a
    minute on it."""
    workdir = str(tmp_path / "run")
    shutil.copytree(tiny_sweep, workdir)
    seen = []

    def look(ctx):
        seen.append(ctx.final_eval)
        return ctx

    config = checked(tiny_sweep_config(cache_dir))
    for needs in ((stage.TRAINED, stage.FINAL_EVAL), (stage.TRAINED,)):
        toy = stage.Stage("look", look, scope="run", needs=needs)
        sweep.run(config, workdir, verbose=False, pipeline=(job.PIPELINE[0], toy,
                                                            *job.PIPELINE[1:]))
        os.remove(os.path.join(workdir, sweep.DONE_FILE))  # relaunch the whole job again
    evaluated, skipped = seen
    assert "iid" in evaluated and "train" in evaluated
    assert evaluated["iid"]["acc"].shape == (2,) and np.all(evaluated["iid"]["acc"] > 0)
    assert skipped is None
    assert job.TRAINING.makes == (stage.TRAINED, stage.FINAL_EVAL)
    assert [s.name for s in job.PIPELINE if stage.FINAL_EVAL in s.needs] == ["wen"]


# --- A study is one module and one line in the tuple ------------------------------------------
# A toy study, written here as a user would write its module: a settings section with one key,
# a check at the door, a report line in gap_table.txt and a stamped output. No library file
# names it: the door, the runner and the reports stage take all of it from its Stage.

@dataclasses.dataclass(frozen=True)
class ToySection:
    """The toy study's keys."""

    level: int = fields.setting(2, fields.INT, ">= 1", fields.positive, "how loud the toy is")


def _toy_check(settings, model_cfg) -> list[str]:
    if settings.toy.level > model_cfg.n_layers + 3:
        raise ValueError(f"toy.level={settings.toy.level}: must be at most "
                         f"{model_cfg.n_layers + 3} (model.n_layers + 3)")
    return [f"note: toy at level {settings.toy.level}"]


def _toy_run(ctx):
    healthy = int(np.sum(ctx.healthy))
    with open(os.path.join(ctx.directory, "toy.csv"), "w") as f:
        f.write(f"level,healthy\n{ctx.settings.toy.level},{healthy}\n")
    return ctx.produced("toy", healthy=healthy)


def _toy_report(ctx) -> list[str]:
    return ["", f"Toy study: level {ctx.settings.toy.level}, "
                f"{ctx.made['toy']['healthy']} healthy members"]


TOY = stage.Stage("toy", _toy_run, keys=("toy.*",), outputs=("toy.csv",), stamped=True,
                  section=ToySection, check=_toy_check, report=_toy_report,
                  needs=(stage.PROXIES,), makes=("toy",))


def _with_toy():
    at = [s.name for s in job.PIPELINE].index("reports")
    return (*job.PIPELINE[:at], TOY, *job.PIPELINE[at:])  # before the reports


def test_a_toy_study_is_one_stage_its_key_check_report_and_output(tiny_sweep, tmp_path,
                                                                   cache_dir):
    pipeline = _with_toy()
    config = tiny_sweep_config(cache_dir)
    config.toy = ConfigDict({"level": 3})
    # Its key is a key of the run, with its rule, default and analysis status.
    run, notes = validate.check(config, pipeline=pipeline)
    assert run.toy.level == 3 and "note: toy at level 3" in notes
    assert run.is_analysis_key("toy.level") and not run.is_analysis_key("model.d_model")
    assert validate.defaults(pipeline=pipeline)["toy"] == {"level": 2}
    assert "`toy.level`" in validate.reference(pipeline=pipeline)
    assert "toy" not in validate.defaults()  # only where the pipeline has it
    # Its rule and its check refuse bad values in one line, before any work.
    config.toy.level = 0
    with pytest.raises(ValueError, match=r"^toy.level=0: must be >= 1$"):
        validate.check(config, pipeline=pipeline)
    config.toy.level = 99
    with pytest.raises(ValueError, match=r"^toy.level=99: must be at most \d+ "):
        validate.check(config, pipeline=pipeline)
    config.toy.level = 3

    workdir = str(tmp_path / "run")
    shutil.copytree(tiny_sweep, workdir)
    sweep.run(validate.check(config, pipeline=pipeline)[0], workdir, verbose=False,
              pipeline=pipeline)
    assert open(os.path.join(workdir, "toy.csv")).read() == "level,healthy\n3,2\n"
    assert os.path.isfile(stages.stage_file(workdir, "toy"))
    table = open(os.path.join(workdir, "gap_table.txt")).read()
    assert table.rstrip().endswith("Toy study: level 3, 2 healthy members")
    done = json.loads(open(os.path.join(workdir, sweep.DONE_FILE)).read())
    assert done["analysis"]["toy.level"] == 3 and "toy.csv" in done["reports"]

    # Its key is an analysis key: a change redoes the toy (and the reports), not training.
    config.toy.level = 4
    sweep.run(validate.check(config, pipeline=pipeline)[0], workdir, verbose=False,
              pipeline=pipeline)
    assert open(os.path.join(workdir, "toy.csv")).read() == "level,healthy\n4,2\n"
    assert "Toy study: level 4" in open(os.path.join(workdir, "gap_table.txt")).read()


def test_the_last_lines_quote_the_workdir_as_a_shell_needs_it():
    """Was: "tensorboard --logdir runs/my run/tensorboard", which a shell splits in two."""
    done, figures = sweep.done_lines("runs/my run", 1, "summary")
    assert shlex.split(done.split("TensorBoard: ")[1]) == ["tensorboard", "--logdir",
                                                           "runs/my run/tensorboard"]
    assert shlex.split(figures.split("; ")[1]) == ["jaxillusions", "figures", "runs/my run",
                                                   "draws", "the", "rest"]
    assert sweep.done_lines("runs/a", 3, "all") == ["done: runs/a, TensorBoard: tensorboard "
                                                    "--logdir runs/a"]  # groups: the workdir


def test_an_order_that_breaks_what_a_stage_needs_is_refused_in_one_line(cache_dir):
    wrong = (*job.PIPELINE[:3], TOY, *job.PIPELINE[3:])  # before the proxies it reads
    with pytest.raises(ValueError, match=r"^pipeline: stage 'toy' needs proxies, which no "
                                         r"earlier stage makes: move it after them$"):
        validate.check(tiny_sweep_config(cache_dir), pipeline=wrong)
    circuits_first = tuple(sorted(job.PIPELINE, key=lambda s: s.name != "circuits"))
    with pytest.raises(ValueError, match="stage 'circuits' needs proxies, fit_shift"):
        sweep.run(validate.check(tiny_sweep_config(cache_dir))[0], "unused",
                  pipeline=circuits_first)
