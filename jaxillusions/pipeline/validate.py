"""The door: a config becomes checked Settings here, once per run, before any work. Each key on
its own (settings.from_config, with the rules of config/settings.py, and the study sections
that the pipeline's stages declare), then what needs the resolved model and the machine.

    settings, notes = check(config)   # ValueError "key=value: must be ..." (one line)

The launchers call it once and pass the Settings on; so does a notebook before train.train_sweep
or sweep.run, which take Settings only (a ConfigDict there is a one-line TypeError). A stored
run's config.json comes in through `read_stored`; `defaults` and `reference` give every key of
a run (the launchers' command line, docs/configs.md).

After the keys: the task's own checks (tasks.<name>.check_config), the model config
(model.ModelConfig checks the combinations), the memory plan (memory.check_config: sizes that
cannot fit), the proxies' sites, sizes and options (each proxy module's `check`), then each
stage's own check (Stage.check), in the pipeline's order. Notes are what the user should see
(e.g. duplicate sizes).

`python -m jaxillusions.pipeline.validate` prints docs/configs.md's tables of keys.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxillusions import proxies, tasks
from jaxillusions.config import fields, grid_axes, settings
from jaxillusions.config.settings import Settings
from jaxillusions.faithfulness.specs import resolve_site, site_dim, specs_from_config
from jaxillusions.pipeline.job import PIPELINE, POINT_PIPELINE
from jaxillusions.runtime import distributed, machine
from jaxillusions.studies.stage import Stage, check_order
from jaxillusions.training import memory, train


def studies(pipeline: tuple[Stage, ...] = PIPELINE) -> settings.Studies:
    """(name, section) of each stage of `pipeline` that has settings of its own."""
    return tuple((stage.name, stage.section) for stage in pipeline if stage.section is not None)


def parse(config: Any, pipeline: tuple[Stage, ...] = PIPELINE) -> Settings:
    """Settings of a ConfigDict, a nested mapping or Settings, key by key (no check against the
    model or the machine: that is `check`), with `pipeline`'s study sections."""
    if isinstance(config, Settings) and type(config).STUDIES != tuple(
            name for name, _ in studies(pipeline)):
        config = config.to_dict()  # Settings of another pipeline: read again with this one's
    return settings.from_config(config, studies(pipeline))


def read_stored(workdir: str, pipeline: tuple[Stage, ...] = PIPELINE) -> Settings:
    """The Settings of a stored run, its config.json (settings.read_stored), study sections
    included. FileNotFoundError without one; ValueError (one line, naming the file)."""
    return settings.read_stored(workdir, studies(pipeline))


def defaults(task: str = "dyck", pipeline: tuple[Stage, ...] = PIPELINE) -> dict[str, Any]:
    """Every key of a run of `task` at its default, nested as a config is (settings.defaults)."""
    return settings.defaults(task, studies(pipeline))


def reference(task: str | None = None, pipeline: tuple[Stage, ...] = PIPELINE) -> str:
    """docs/configs.md's table of keys: every section but data.* (None), or a task's data.*."""
    return settings.reference(task, studies(pipeline))


def check(config: Any, pipeline: tuple[Stage, ...] = PIPELINE) -> tuple[Settings, list[str]]:
    """Settings of a ConfigDict (or a nested mapping, or Settings), every check passed, and
    notes to show; raises ValueError (one line: key, value, what is allowed) for the first bad
    setting, or for JAX's settings the code is not written for (machine.check_jax_config). It
    splits the CPU into the config's cpu_devices first (distributed.use_devices), then starts
    JAX (distributed.start_jax; memory.check_config reads the devices), which fixes them for the
    process."""
    check_order(pipeline)
    machine.check_jax_config()  # JAX's own settings (64-bit, promotion, random generator)
    renamed = settings.renamed(config)  # old names of keys, read as the new ones
    config = parse(config, pipeline)
    if config.grid:  # every point checked as the run it is, before any of them runs
        notes = list(renamed)
        for name, point in points(config):
            try:
                notes += check(point, POINT_PIPELINE)[1]
            except ValueError as err:
                raise ValueError(f"grid point {name}: {err}") from None
        return config, list(dict.fromkeys(notes))
    distributed.use_devices(config.cpu_devices, config.gpu_deterministic)
    distributed.start_jax()  # the checks below read the devices
    notes = renamed + tasks.get(config.task).check_config(config)
    if config.train.contrastive_weights and tasks.hook(tasks.get(config.task),
                                                       "contrastive_loss") is None:
        raise ValueError(f"train.contrastive_weights={config.train.contrastive_weights}: the "
                         f"{config.task} task has no contrastive regularizer; set ()")
    model_cfg = train.model_config(config)  # model.ModelConfig checks the combinations
    tc, mc = config.train, config.model
    unpackable = [text for text, present in (
        (f"train.contrastive_weights={tc.contrastive_weights}", tc.contrastive_weights),
        (f"model.first_layer={mc.first_layer!r}", model_cfg.front is not None),
        (f"model.uniform_attention_layers={mc.uniform_attention_layers}",
         model_cfg.interventions)) if present]
    if tc.rows_per_sentence < 1 and unpackable:  # they read a row as one sentence
        raise ValueError(f"train.rows_per_sentence={tc.rows_per_sentence}: packed batches "
                         f"need rows that are one sentence with {unpackable[0]}; set 1")
    # Sizes that cannot fit fail here, before any allocation (they used to hang in it), and
    # before the checks below build per-layer lists.
    memory.check_config(config, model_cfg)
    notes += _proxy_checks(config, model_cfg)
    return config, notes + stage_checks(config, model_cfg, pipeline)


def stage_checks(config: Settings, model_cfg, pipeline: tuple[Stage, ...]) -> list[str]:
    """Each stage's check (its one-line ValueError, else its notes) against `model_cfg`: at the
    door, and by the main job again on the model its data gives (the code task's vocabulary)."""
    return [note for stage in pipeline if stage.check is not None
            for note in stage.check(config, model_cfg)]


def points(config: Settings) -> list[tuple[str, Settings]]:
    """(name, Settings) of every point of config.grid (config/grid_axes.py), parsed with the point
    pipeline's sections; a one-line ValueError naming the entry or the point."""
    found = grid_axes.axes(config.grid)
    for key, _ in found:
        if type(config).is_analysis_key(key):
            raise ValueError(f"grid: {key} changes what is measured, not the trained members: "
                             "set it for every point (a grid point trains a run of its own)")
    raw = config.to_dict()
    out = []
    for point in grid_axes.points(config.grid):
        name = grid_axes.name(point)
        try:
            out.append((name, parse(grid_axes.apply(raw, point), POINT_PIPELINE)))
        except ValueError as err:
            raise ValueError(f"grid point {name}: {err}") from None
    return out


def validate(config: Any) -> list[str]:
    """check(config)'s notes (the one-line ValueError of a bad setting)."""
    return check(config)[1]


def _proxy_checks(config: Settings, model_cfg) -> list[str]:
    pc, notes = config.proxies, []
    for method in pc.methods:
        if method not in proxies.available():
            raise ValueError(f"proxies.methods: unknown method {method!r}; "
                             f"available: {', '.join(proxies.available())}")
    task = tasks.get(config.task)
    named = tasks.hook(task, "split_names")  # the splits the data names (text), else SPLITS
    available = named(config.data) if named is not None else task.SPLITS
    for split in pc.eval_splits:
        if split not in available:  # a split some data.* setting makes: that key, named
            makers = [f"data.{f.name} ({fields.rule(f).allowed})"
                      for f in dataclasses.fields(task.Data) if f"`{split}`" in fields.rule(f).doc]
            raise ValueError(f"proxies.eval_splits: unknown split {split!r}; "
                             f"available: {', '.join(available)}"
                             + (f"; {split!r} is made by {', '.join(makers)}" if makers else ""))
    baseline = pc.gap_baseline
    if baseline not in pc.eval_splits:
        raise ValueError(f"proxies.eval_splits={tuple(pc.eval_splits)}: must include "
                         f"{baseline!r} (proxies.gap_baseline), the in-distribution baseline of "
                         "every generalization gap")
    targets = {("targets", t) for t in pc.targets} | {
        (f"{m}_targets", t) for m in proxies.available()
        for t in getattr(pc, f"{m}_targets", ())}
    for key, target in sorted(targets):
        for site in target.split("+"):
            try:
                resolved = resolve_site(site, model_cfg)
            except ValueError as err:
                raise ValueError(f"proxies.{key}: {err}") from None
            if resolved.endswith(".pattern"):
                raise ValueError(f"proxies.{key}: {site!r} is an attention pattern; targets "
                                 "are vector sites (patterns go in proxies.pattern_site)")
    try:
        pattern = resolve_site(pc.pattern_site, model_cfg)
    except ValueError as err:
        raise ValueError(f"proxies.pattern_site: {err}") from None
    if not pattern.endswith(".attn.pattern"):
        raise ValueError(f"proxies.pattern_site={pc.pattern_site!r}: must be an attention "
                         "pattern site, blocks.<layer>.attn.pattern")
    specs = specs_from_config(pc, model_cfg)
    for spec in specs:
        check_sizes = proxies.hook(spec.module, "check")
        if check_sizes is not None:
            dim = min(site_dim(model_cfg, s) for s in spec.sites)
            check_sizes(spec.sizes, pc, dim, f"{spec.target} (d_head {model_cfg.head_dim})")
    return notes



if __name__ == "__main__":  # the tables of docs/configs.md
    print("#### Every task\n\n" + reference() + "\n")
    for name in tasks.TASKS:
        print(f"#### data.* of task={name}\n\n" + reference(name) + "\n")
