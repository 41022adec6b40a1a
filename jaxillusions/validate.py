"""Checks of a whole config before any work, and which keys may change when a run resumes.

    notes = validate(config)   # ValueError "key=value: must be ..." (one line), or notes to print

`RULES` is a flat table: one entry per config key, with the type it must have, a test of its
value (which may look at the rest of the config) and what is allowed, for the error message.
Every key of a config must have a rule, so a new key comes with its check (keys that a config
may leave out, read with config.get, are checked when present). The checks that need
the resolved model (proxy sites, ranks against d_head, k against the number of k-means samples)
follow in `_proxy_checks`; the task's own checks (tasks.<name>.check_config, with the rows of its
data.* keys from tasks.<name>.data_rules()) and those of `train` are reused.

`ANALYSIS_KEYS` lists the keys that only change what is measured or logged, not the trained
parameters: they may change between a run and its resumption (the change is recorded in the
workdir's config_history.jsonl). Every other key defines the training run and may not change.
"""

from __future__ import annotations

import fnmatch
import math
import numbers
from collections.abc import Callable
from typing import Any

from jaxillusions import memory, model, tasks, train

# Keys (fnmatch patterns) that may change on resume: analysis, evaluation and logging settings.
ANALYSIS_KEYS = (
    "proxies.*",
    "wen.*",
    "train.eval_batch_size",
    "train.log_every",
    "train.eval_every",
    "train.checkpoint_every",
    "data.cache_dir",
)


# Values of keys that a config may leave out (read with config.get): a workdir whose config.json
# predates such a key matches a config that sets it to this value.
DEFAULTS = {"train.seed_chunk_size": 0, "model.compute_dtype": "float32",
            "proxies.seed_chunk_size": 0}


def is_analysis_key(key: str) -> bool:
    """True for keys that may change between a run and its resumption (see ANALYSIS_KEYS)."""
    return any(fnmatch.fnmatchcase(key, pattern) for pattern in ANALYSIS_KEYS)


# ---------------------------------------------------------------------------------------------
# Value kinds. Each is (name, test of the Python type).

def _is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)


INT = ("an integer", _is_int)
NUMBER = ("a finite number", _is_number)
BOOL = ("true or false", lambda v: isinstance(v, bool))
STR = ("a string", lambda v: isinstance(v, str))
INTS = ("a tuple of integers", lambda v: isinstance(v, tuple | list) and all(map(_is_int, v)))
NUMBERS = ("a tuple of finite numbers",
           lambda v: isinstance(v, tuple | list) and all(map(_is_number, v)))
STRS = ("a tuple of strings",
        lambda v: isinstance(v, tuple | list) and all(isinstance(x, str) for x in v))


def _pos(v, c) -> bool:
    return v >= 1


def _nonneg(v, c) -> bool:
    return v >= 0


def _any(v, c) -> bool:
    return True


# key: (kind, test(value, config) -> bool, what is allowed). Add a row for every new key.
RULES: dict[str, tuple[tuple[str, Callable], Callable[[Any, Any], bool], str]] = {
    "seed": (INT, _nonneg, ">= 0"),
    "task": (STR, lambda v, c: v in tasks.TASKS, f"one of {', '.join(tasks.TASKS)}"),
    # data.* keys: the task's own rows (tasks.<name>.data_rules(); see rules())
    # model (model.ModelConfig checks the combinations)
    "model.n_layers": (INT, _pos, ">= 1"),
    "model.n_heads": (INT, _pos, ">= 1"),
    "model.d_model": (INT, _pos, ">= 1"),
    "model.d_head": (INT, _nonneg, ">= 0 (0: d_model // n_heads)"),
    "model.d_mlp": (INT, _nonneg, ">= 0"),
    "model.pos_encoding": (STR, lambda v, c: v in model.POS_ENCODINGS,
                           f"one of {', '.join(model.POS_ENCODINGS)}"),
    "model.embedding": (STR, lambda v, c: v in model.EMBEDDINGS,
                        f"one of {', '.join(model.EMBEDDINGS)}"),
    "model.first_layer": (STR, lambda v, c: v in model.FIRST_LAYERS,
                          f"one of {', '.join(model.FIRST_LAYERS)}"),
    "model.minimal_embedding": (STR, lambda v, c: v in model.MINIMAL_EMBEDDINGS,
                                f"one of {', '.join(model.MINIMAL_EMBEDDINGS)}"),
    "model.max_len": (INT, _nonneg, ">= 0 (0: the longest data split)"),
    "model.attn_only": (BOOL, _any, "true or false"),
    "model.compute_dtype": (STR, lambda v, c: v in model.COMPUTE_DTYPES,
                            f"one of {', '.join(model.COMPUTE_DTYPES)}"),
    "model.uniform_attention_layers": (
        INTS, lambda v, c: all(0 <= i < c.model.n_layers for i in v),
        "layer indices in [0, model.n_layers)"),
    # train (train.check_train_config checks the same ranges; kept here for the table)
    "train.num_seeds": (INT, _pos, ">= 1"),
    "train.num_steps": (INT, _pos, ">= 1"),
    "train.batch_size": (INT, _pos, ">= 1"),
    "train.learning_rate": (NUMBER, lambda v, c: v > 0, "> 0"),
    "train.warmup_steps": (INT, _nonneg, ">= 0"),
    "train.weight_decay": (NUMBER, _nonneg, ">= 0"),
    "train.grad_clip": (NUMBER, lambda v, c: v > 0, "> 0"),
    "train.loss_on": (STR, lambda v, c: v in train.LOSS_ON, f"one of {', '.join(train.LOSS_ON)}"),
    "train.contrastive_weights": (NUMBERS, lambda v, c: all(w >= 0 for w in v)
                                  and len(set(v)) == len(v),
                                  "distinct weights >= 0, or () for none"),
    "train.log_every": (INT, _pos, ">= 1"),
    "train.eval_every": (INT, _nonneg, ">= 0 (0: only at the end)"),
    "train.checkpoint_every": (INT, _nonneg, ">= 0 (0: only at the end)"),
    "train.eval_batch_size": (INT, _pos, ">= 1"),
    # Seeds trained at once (over all devices), the rest in sequential chunks; 0: all at once.
    # A training key: the seeds a device batches together can change XLA's rounding (README,
    # "Scaling out"). 1 is refused: a one-seed chunk would run the unbatched step.
    "train.seed_chunk_size": (INT, lambda v, c: v == 0 or v >= 2, "0 (all at once) or >= 2"),
    "train.max_position_offset": (INT, lambda v, c: v >= -1,
                                  ">= 0, or -1 for as far as the model's positions allow"),
    # proxies (checked against the model in _proxy_checks)
    "proxies.targets": (STRS, lambda v, c: len(v) >= 1, "at least one '+'-joined list of sites"),
    "proxies.eval_splits": (STRS, lambda v, c: len(v) >= 1, "at least one split"),
    "proxies.pattern_site": (STR, _any, "an attention pattern site, e.g. blocks.-1.attn.pattern"),
    "proxies.methods": (STRS, _any, "proxy methods, or () for none"),
    "proxies.svd_ranks": (INTS, lambda v, c: all(r >= 1 for r in v),
                          "ranks >= 1, or () for 1, 2, 4, ... up to d_head"),
    "proxies.svd_center": (BOOL, _any, "true or false"),
    "proxies.kmeans_sizes": (INTS, lambda v, c: len(v) >= 1 and all(k >= 1 for k in v),
                             "cluster counts >= 1"),
    "proxies.kmeans_samples": (INT, _pos, ">= 1"),
    # Sparse dictionaries (proxies/sae.py; the transcoder shares these options). Optional
    # keys (defaults in sae.DEFAULTS); k against the widths is checked by sae.check below.
    "proxies.sae_k": (("an integer or a tuple of integers",
                       lambda v: _is_int(v) or INTS[1](v)),
                      lambda v, c: (v >= 1) if _is_int(v) else (len(v) >= 1 and min(v) >= 1),
                      "k values >= 1 (at most every width)"),
    "proxies.sae_steps": (INT, _pos, ">= 1"),
    "proxies.sae_lr": (NUMBER, lambda v, c: v > 0, "> 0"),
    "proxies.sae_batch": (INT, _pos, ">= 1"),
    "proxies.kmeans_iters": (INT, _pos, ">= 1"),
    "proxies.collect_batch_size": (INT, _pos, ">= 1"),
    "proxies.eval_batch_size": (INT, _pos, ">= 1"),
    # Seeds per call of the proxy stage (collect, fit, evaluate); 0: as many as fit the device.
    # An analysis key (proxies.*): it changes no number (README, "Scaling out").
    "proxies.seed_chunk_size": (INT, _nonneg, ">= 0 (0: as many as fit the device)"),
    "proxies.gap_baseline": (STR, _any, "a split of proxies.eval_splits (checked below)"),
    # Wen et al. measurements (wen.check_config checks them against the model)
    "wen.enabled": (BOOL, _any, "true or false"),
    "wen.label": (STR, _any, "a name for the measurements"),
    "wen.length_min_len": (INT, _pos, ">= 1"),
    "wen.length_max_len": (INT, _nonneg, ">= 0 (0: no length generalization)"),
    "wen.length_num_prefixes": (INT, _pos, ">= 1"),
    "wen.length_threshold": (NUMBER, lambda v, c: 0 < v < 1, "in (0, 1)"),
    "wen.length_seed": (INT, _nonneg, ">= 0"),
    "wen.length_batch_size": (INT, _pos, ">= 1"),
    "wen.members_per_call": (INT, _pos, ">= 1"),
}


def _flat(config) -> dict[str, Any]:
    out = {}

    def visit(node, prefix):
        for k, v in node.items():
            if hasattr(v, "items"):
                visit(v, f"{prefix}{k}.")
            else:
                out[prefix + k] = v

    visit(config, "")
    return out


def rules(config) -> dict:
    """RULES plus the data.* rows of the config's task (tasks.get: ValueError for an unknown
    task) and the sizes key of any proxy file that RULES does not name (adding a proxy is adding
    a file)."""
    from jaxillusions import proxies  # noqa: PLC0415

    sizes = {}
    for name in proxies.available():
        module = proxies.get(name)
        if module.STATISTIC is not None:
            sizes[f"proxies.{proxies.sizes_key(module)}"] = (
                INTS, lambda v, c: len(v) >= 1 and all(k >= 1 for k in v), f"{name} sizes >= 1")
        if module.SITE == "vector":  # its own targets (default proxies.targets)
            sizes[f"proxies.{name}_targets"] = (
                STRS, lambda v, c: len(v) >= 1,
                f"at least one '+'-joined list of sites for {name} (default proxies.targets)")
    return {**sizes, **RULES, **tasks.get(config).data_rules()}


def validate(config) -> list[str]:
    """Raises ValueError (one line: key, value, what is allowed) for the first bad setting.

    Returns notes to show the user (e.g. duplicate sizes that will be evaluated once).
    """
    flat = _flat(config)
    table = rules(config)
    for key, value in flat.items():
        if key not in table:
            section = key.rsplit(".", 1)[0] if "." in key else ""
            known = sorted(k.rsplit(".", 1)[-1] for k in table
                           if (k.rsplit(".", 1)[0] if "." in k else "") == section)
            raise ValueError(f"unknown config key {key}; allowed in "
                             f"{section or 'the top level'}: {', '.join(known)} "
                             "(a new key needs a rule in jaxillusions/validate.py, or in its "
                             "task's data_rules for data.*)")
        (kind, is_kind), test, allowed = table[key]
        if not is_kind(value):
            raise ValueError(f"{key}={value!r}: must be {kind}" +
                             (f", {allowed}" if test is not _any else ""))
    for key, ((_, _), test, allowed) in table.items():
        if key in flat and not test(flat[key], config):
            raise ValueError(f"{key}={flat[key]!r}: must be {allowed}")
    notes = tasks.get(config).check_config(config)
    model_cfg = _data_train_model_checks(config)
    # Sizes that cannot fit fail here, before any allocation (they used to hang in it), and
    # before the checks below build per-layer lists.
    memory.check_config(config, model_cfg)
    if "wen" in config and config.wen.enabled:
        from jaxillusions import wen  # noqa: PLC0415

        wen.check_config(config, model_cfg)
    return notes + _proxy_checks(config, model_cfg)


def _data_train_model_checks(config):
    train.check_train_config(config.train)
    return train.model_config(config)  # model.ModelConfig checks the combinations


def _proxy_checks(config, model_cfg) -> list[str]:
    from jaxillusions import faithfulness, proxies  # noqa: PLC0415

    pc, notes = config.proxies, []
    for method in pc.methods:
        if method not in proxies.available():
            raise ValueError(f"proxies.methods: unknown method {method!r}; "
                             f"available: {', '.join(proxies.available())}")
    for split in pc.eval_splits:
        if split not in tasks.get(config).SPLITS:
            raise ValueError(f"proxies.eval_splits: unknown split {split!r}; "
                             f"available: {', '.join(tasks.get(config).SPLITS)}")
    baseline = pc.get("gap_baseline", "iid")
    if baseline not in pc.eval_splits:
        raise ValueError(f"proxies.eval_splits={tuple(pc.eval_splits)}: must include "
                         f"{baseline!r} (proxies.gap_baseline), the in-distribution baseline of "
                         "every generalization gap")
    targets = {("targets", t) for t in pc.targets} | {
        (f"{m}_targets", t) for m in proxies.available() if f"{m}_targets" in pc
        for t in pc[f"{m}_targets"]}
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
    specs = faithfulness.specs_from_config(pc, model_cfg)
    for spec in specs:
        if hasattr(spec.module, "check"):
            dim = min(faithfulness.site_dim(model_cfg, s) for s in spec.sites)
            spec.module.check(spec.sizes, pc, dim,
                              f"{spec.target} (d_head {model_cfg.head_dim})")
    for key in dict.fromkeys(proxies.sizes_key(s.module) for s in specs
                             if s.module.STATISTIC is not None):
        sizes = tuple(pc[key])
        if len(set(sizes)) != len(sizes):
            notes.append(f"note: proxies.{key}={sizes} has duplicates; each size is fitted and "
                         f"evaluated once: {tuple(sorted(set(sizes)))}")
    return notes
