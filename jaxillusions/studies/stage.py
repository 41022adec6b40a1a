"""The plug of the main job: a `Stage` (one step of pipeline/job.py's PIPELINE) and the typed
`Context` the stages hand each other. Not a study: what every study module declares its
`STAGE` with.

A stage is all a study needs to be part of the job: its name, when it runs (`enabled`), what it
computes (`run`: a Context in, the context with its products out), its settings section
(`section`: a frozen dataclass of config/fields.py settings, config key `<name>.*`; the door
adds it to Settings), its check at the door (`check`), its lines in gap_table.txt (`report`),
the settings its results depend on (`keys`), the report files it writes (`outputs`), and what
it needs from earlier stages and makes for later ones (`needs`, `makes`; the runner refuses an
order that breaks them). Its files are saved and resumed by the runner (runtime/stages.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from jaxillusions.config.settings import Settings
    from jaxillusions.faithfulness.evaluate import EvalSet
    from jaxillusions.faithfulness.fit import FittedProxy
    from jaxillusions.faithfulness.specs import ProxySpec
    from jaxillusions.model import ModelConfig
    from jaxillusions.runtime.stages import StageFiles
    from jaxillusions.training.step import SweepState

# What the job's own stages make (Stage.makes / needs name these, or a study stage's name).
TRAINED = "trained"  # Context.state: the trained members (the training stage)
# Context.final_eval: their evaluation on every split (the training stage; a relaunch of a
# finished training evaluates them only when an enabled stage needs this)
FINAL_EVAL = "final_eval"
PROXIES = "proxies"  # Context.proxies: the fitted proxies and their rows (the proxy stage)


def _always(settings: Settings) -> bool:
    del settings
    return True


@dataclasses.dataclass(frozen=True)
class Stage:
    """One step of the main job.

    `scope`: "run" (once per run, in the workdir, before the groups), "group" (once per group
    of members, in its directory: the workdir itself unless the members differ in
    hyper-parameters, e.g. train.contrastive_weights: then one directory per setting), or
    "population" (once, in the workdir, after every group: Context.groups holds them).
    `keys`: fnmatch patterns of the settings keys (as settings.flat names them) that define the
    stage's results (its own section's keys and any other analysis keys it reads); a change
    redoes the analysis. `outputs`: glob patterns of the report files it writes in its
    directory: moved aside before an analysis with other settings, checksummed in
    sweep_done.json. `clocks`: the names its time is counted under in the timing line (default:
    its name). `stamped`: saved whole (runtime/stages.py's stage file); skipped on a relaunch
    while its stamp and outputs are there.

    `section`: the dataclass of its settings, config keys `<name>.*` (analysis keys). `check`:
    (settings, model_cfg) -> notes, a one-line ValueError for a bad value, at the door before
    any work. `report`: Context -> lines for gap_table.txt, called by the reports stage (it may
    write its own tables); `headline`: they join the headline, else they go at the end.
    `needs`: stages (or TRAINED / FINAL_EVAL / PROXIES) whose products it reads: each must
    come earlier in the pipeline; a relaunch of a finished training evaluates the members again
    only for an enabled stage that needs FINAL_EVAL. `makes`: what it adds to Context.made
    under its name (for later stages)."""

    name: str
    run: Callable[[Context], Context]
    enabled: Callable[[Settings], bool] = _always
    scope: str = "group"
    keys: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    clocks: tuple[str, ...] = ()
    stamped: bool = False
    section: type | None = None
    check: Callable[[Settings, ModelConfig], list[str]] | None = None
    report: Callable[[Context], list[str]] | None = None
    headline: bool = False
    needs: tuple[str, ...] = ()
    makes: tuple[str, ...] = ()

    def __post_init__(self):
        if self.scope not in SCOPES:
            raise ValueError(f"stage {self.name}: scope must be one of {', '.join(SCOPES)}, "
                             f"got {self.scope!r}")


SCOPES = ("run", "group", "population")  # in the order they run


def check_order(pipeline: tuple[Stage, ...]) -> None:
    """ValueError (one line) if a stage needs what no earlier stage makes, two stages share a
    name, or a stage's scope comes before an earlier one's (SCOPES' order); the runner and the
    door call it."""
    seen: set[str] = set()
    for before, stage in zip((None, *pipeline), pipeline, strict=False):
        if stage.name in seen:
            raise ValueError(f"pipeline: two stages named {stage.name!r}")
        if before is not None and SCOPES.index(stage.scope) < SCOPES.index(before.scope):
            raise ValueError(f"pipeline: stage {stage.name!r} of scope {stage.scope} comes "
                             f"after {before.name!r} of scope {before.scope}")
        missing = [need for need in stage.needs if need not in seen]
        if missing:
            raise ValueError(f"pipeline: stage {stage.name!r} needs {', '.join(missing)}, which "
                             "no earlier stage makes: move it after them")
        seen |= {stage.name, *stage.makes}


@dataclasses.dataclass(frozen=True)
class ProxyResults:
    """What the proxy stage makes: the families' specs, their fitted parameters and stage
    stamps, the FittedProxy list, the evaluation set and the result rows (results.csv)."""

    specs: list[ProxySpec]
    fitted: list[dict]
    fit_stamps: list[str]
    families: list[FittedProxy]
    eval_set: EvalSet
    rows: list[dict]


@dataclasses.dataclass(frozen=True)
class Context:
    """What the stages share, by name: the run (settings, workdir, data, model), what training
    produced, and, in a weight group's stages, the group (its directory, members, stage files)
    and what its stages produced. A stage returns `dataclasses.replace(ctx, field=...)` or
    `ctx.produced(stage_name, ...)`; nothing travels by position."""

    settings: Settings
    workdir: str
    say: Callable[..., None]
    verbose: bool
    move_aside: Callable[..., None]
    splits: Mapping[str, object]
    model_cfg: ModelConfig
    start: float = 0.0  # time.perf_counter() at the start of the job (progress lines)
    start_over: bool = False
    pipeline: tuple[Stage, ...] = ()  # the stages of this run, in order
    # Training (TRAINED).
    state: SweepState | None = None  # the trained members (params, healthy, step)
    final_eval: dict[str, dict] | None = None  # per split (evaluation.evaluate_splits)
    # A group of members (scope "group").
    directory: str = ""
    members: np.ndarray | None = None  # member indices of the group
    params: dict | None = None
    healthy: np.ndarray | None = None  # [members] bool
    seeds: tuple[int, ...] = ()
    files: StageFiles | None = None
    # What the group's stages produced: the proxy stage's (PROXIES), and each study's by name.
    proxies: ProxyResults | None = None
    made: Mapping[str, Mapping[str, object]] = dataclasses.field(default_factory=dict)
    # Scope "population": every group's context, after its stages.
    groups: tuple[Context, ...] = ()

    def produced(self, stage: str, **values: object) -> Context:
        """The context with `values` added to made[stage] (by the stage that computed them)."""
        return dataclasses.replace(self, made={**self.made,
                                               stage: {**self.made.get(stage, {}), **values}})
