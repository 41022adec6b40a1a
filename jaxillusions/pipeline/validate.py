"""The door: a config becomes checked Settings here, once per run, before any work. Each key on
its own (settings.from_config, with the rules of config/settings.py), then what needs the
resolved model and the machine.

    settings, notes = check(config)   # ValueError "key=value: must be ..." (one line)

The launchers call it once and pass the Settings on; so does a notebook before train.train_sweep
or sweep.run, which take Settings only (a ConfigDict there is a one-line TypeError).

After the keys: the task's own checks (tasks.<name>.check_config), the model config
(model.ModelConfig checks the combinations), the memory plan (memory.check_config: sizes that
cannot fit), Wen et al.'s checks against the model, and the proxies' sites, sizes and options
(each proxy module's `check`). Notes are what the user should see (e.g. duplicate sizes).
"""

from __future__ import annotations

from typing import Any

from jaxillusions import faithfulness, proxies, tasks
from jaxillusions.config import settings
from jaxillusions.config.settings import Settings
from jaxillusions.runtime import distributed
from jaxillusions.studies import fit_shift, geometry, induction, probes, wen
from jaxillusions.training import memory, train


def check(config: Any) -> tuple[Settings, list[str]]:
    """Settings of a ConfigDict (or a nested mapping, or Settings), every check passed, and
    notes to show; raises ValueError (one line: key, value, what is allowed) for the first bad
    setting. It splits the CPU into the config's cpu_devices first (distributed.use_devices):
    the checks after the keys start JAX (memory.check_config reads the devices), which fixes
    them for the process."""
    renamed = settings.renamed(config)  # old names of keys, read as the new ones
    config = settings.from_config(config)
    distributed.use_devices(config.cpu_devices, config.gpu_deterministic)
    notes = renamed + tasks.get(config.task).check_config(config)
    if config.train.contrastive_weights and not hasattr(tasks.get(config.task),
                                                        "contrastive_loss"):
        raise ValueError(f"train.contrastive_weights={config.train.contrastive_weights}: the "
                         f"{config.task} task has no contrastive regularizer; set ()")
    model_cfg = train.model_config(config)  # model.ModelConfig checks the combinations
    # Sizes that cannot fit fail here, before any allocation (they used to hang in it), and
    # before the checks below build per-layer lists.
    memory.check_config(config, model_cfg)
    if config.wen.enabled:
        wen.check_config(config.wen, model_cfg)
    induction.check_config(config, model_cfg)
    return config, notes + _proxy_checks(config, model_cfg)


def validate(config: Any) -> list[str]:
    """check(config)'s notes (the one-line ValueError of a bad setting)."""
    return check(config)[1]


def _proxy_checks(config: Settings, model_cfg) -> list[str]:
    pc, notes = config.proxies, []
    for method in pc.methods:
        if method not in proxies.available():
            raise ValueError(f"proxies.methods: unknown method {method!r}; "
                             f"available: {', '.join(proxies.available())}")
    for split in pc.eval_splits:
        if split not in tasks.get(config.task).SPLITS:
            raise ValueError(f"proxies.eval_splits: unknown split {split!r}; "
                             f"available: {', '.join(tasks.get(config.task).SPLITS)}")
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
                resolved = faithfulness.resolve_site(site, model_cfg)
            except ValueError as err:
                raise ValueError(f"proxies.{key}: {err}") from None
            if resolved.endswith(".pattern"):
                raise ValueError(f"proxies.{key}: {site!r} is an attention pattern; targets "
                                 "are vector sites (patterns go in proxies.pattern_site)")
    try:
        pattern = faithfulness.resolve_site(pc.pattern_site, model_cfg)
    except ValueError as err:
        raise ValueError(f"proxies.pattern_site: {err}") from None
    if not pattern.endswith(".attn.pattern"):
        raise ValueError(f"proxies.pattern_site={pc.pattern_site!r}: must be an attention "
                         "pattern site, blocks.<layer>.attn.pattern")
    fit_shift.check_config(config)
    probes.check_config(config, model_cfg)
    specs = faithfulness.specs_from_config(pc, model_cfg)
    _geometry_checks(config, specs)
    for spec in specs:
        if hasattr(spec.module, "check"):
            dim = min(faithfulness.site_dim(model_cfg, s) for s in spec.sites)
            spec.module.check(spec.sizes, pc, dim,
                              f"{spec.target} (d_head {model_cfg.head_dim})")
    for key in dict.fromkeys(proxies.sizes_key(s.module) for s in specs
                             if s.module.STATISTIC is not None):
        sizes = tuple(getattr(pc, key))
        if len(set(sizes)) != len(sizes):
            notes.append(f"note: proxies.{key}={sizes} has duplicates; each size is fitted and "
                         f"evaluated once: {tuple(sorted(set(sizes)))}")
    return notes


def _geometry_checks(config, specs) -> None:
    """geometry.enabled / repair_sentences need an SVD proxy, and M within a split's fit half."""
    gc = config.geometry
    if not geometry.enabled(config):
        return
    key = "repair_sentences" if gc.repair_sentences else "enabled"
    if not any(s.method in geometry.METHODS for s in specs):
        raise ValueError(f"geometry.{key}={getattr(gc, key)!r}: needs svd or pca in "
                         f"proxies.methods (now {tuple(config.proxies.methods)})")
    counts, per_split = gc.repair_sentences, getattr(config.data, "num_eval", None)
    if counts and per_split is not None and per_split > 0 and max(counts) > (per_split + 1) // 2:
        raise ValueError(f"geometry.repair_sentences={counts}: must be at most "
                         f"{(per_split + 1) // 2}, the fit half of a split of data.num_eval="
                         f"{per_split} sentences")
