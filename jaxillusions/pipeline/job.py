"""The main job, in order: `PIPELINE`, one tuple of stages (studies/stage.py). Each stage has
a name, when it runs, what it computes, its settings section, its check at the door, its report
lines, the settings its results depend on and the report files it writes:

    training -> wen -> induction -> proxies -> dictionaries -> geometry -> probes -> fit_shift
             -> circuits -> reports -> figures -> prediction

The first three run once per run; the next once per group of members (one group, the workdir
itself, unless the members differ in hyper-parameters, e.g. train.contrastive_weights: then
each setting's members go to <workdir>/contrastive_weight_<w>, so that aggregates over seeds
never mix settings), and the last once over every group; all but the first three only with
proxies (proxies.methods). A new study is a module with a `STAGE` and one line here: the
door (validate.py) takes its settings section and check from this tuple, the runner (sweep.py)
runs, saves and resumes it, and the reports stage adds its lines.

`python -m jaxillusions.pipeline.job` prints docs/design.md's picture.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from jaxillusions.pipeline import proxy_stage, reports
from jaxillusions.studies import (
    circuits,
    dictionaries,
    fit_shift,
    geometry,
    induction,
    prediction,
    probes,
    wen,
)
from jaxillusions.studies.stage import FINAL_EVAL, TRAINED, Context, Stage
from jaxillusions.training import imported, train


def _train(ctx: Context) -> Context:
    """Trains every member (train.train_sweep: resumes from the newest checkpoint; a finished
    training is evaluated again only for an enabled stage that needs FINAL_EVAL); imported
    checkpoints (model.pretrained) are loaded instead (training/imported.py)."""
    if imported.enabled(ctx.settings):
        state, final_eval = imported.load_sweep(
            ctx.settings, ctx.workdir, splits=ctx.splits, model_cfg=ctx.model_cfg,
            members=train.members(ctx.settings),
            claim=lambda: train.claim_workdir(ctx.workdir, ctx.settings, splits=ctx.splits),
            say=ctx.say)
    else:
        needed = any(FINAL_EVAL in stage.needs for stage in ctx.pipeline
                     if stage.enabled(ctx.settings))
        state, final_eval = train.train_sweep(ctx.settings, ctx.workdir, splits=ctx.splits,
                                              verbose=ctx.verbose, start_over=ctx.start_over,
                                              evaluate_finished=needed)
    return dataclasses.replace(ctx, state=state, final_eval=final_eval)


TRAINING = Stage("training", _train, scope="run", makes=(TRAINED, FINAL_EVAL))

PIPELINE: tuple[Stage, ...] = (
    TRAINING, wen.STAGE, induction.STAGE, proxy_stage.STAGE, dictionaries.STAGE, geometry.STAGE,
    probes.STAGE, fit_shift.STAGE, circuits.STAGE, reports.REPORTS, reports.FIGURES,
    prediction.STAGE)
# A grid's point (config.grid; pipeline/grid.py): the same, but the prediction stage only
# writes the point's members, which the grid tests together.
POINT_PIPELINE: tuple[Stage, ...] = tuple(prediction.MEMBERS if stage is prediction.STAGE
                                          else stage for stage in PIPELINE)


def picture(pipeline: Sequence[Stage] = PIPELINE) -> str:
    """docs/design.md's picture (a test keeps the page equal to it): the folders, layer by
    layer from the bottom, each with the first line of its docstring, then the main job's
    stages in order with when each runs and what it writes."""
    import importlib  # noqa: PLC0415

    import jaxillusions  # noqa: PLC0415

    lines = ["jaxillusions/   (layers, lowest first; each imports only from its own or lower)"]
    for rank, prefixes in enumerate(jaxillusions.LAYERS):
        for prefix in prefixes:
            doc = importlib.import_module(f"jaxillusions.{prefix}").__doc__ or ""
            first = " ".join(doc.strip().split("\n\n")[0].split())
            folder = prefix.replace(".", "/") + (".py" if "." in prefix else "/")
            lines.append(f"  {rank} {folder:<17}{first}")
    lines += ["", "The main job, job.PIPELINE, in order (run: once; group: per weight group):"]
    for stage in pipeline:
        when = stage.enabled.__doc__ or "always"
        when = " ".join(when.strip().split("\n\n")[0].split())
        lines.append(f"  {stage.name:<13}{stage.scope:<6} {when}")
        if stage.outputs:
            lines.append(f"  {'':<13}{'':<6} writes {', '.join(stage.outputs)}"
                         + ("; saved whole" if stage.stamped else ""))
    return "\n".join(lines)


if __name__ == "__main__":  # docs/design.md's picture
    print(picture())
