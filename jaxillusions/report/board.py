"""What the main job shows on TensorBoard after evaluation (chosen here from the rows and gaps,
written by the one writer, runtime/tensorboard.py, which owns the runs and tags), so that
TensorBoard at its defaults (a new reader's: smoothing 0.6, "Ignore outliers in chart scaling"
on) shows true values, the headline first:

    split/<split>   tag Headline/<i>_<method>_<site>[_<size>]/gap_<split>: the headline's
                    paired gap (gaps.csv's mean; same_pred on the baseline minus on
                    the split, > 0: less faithful on the split), one per headline proxy and OOD
                    split, each a single point at the training step of the evaluated model
    report          TEXT: Headline/summary (gap_table.txt's headline) and gap_table (all of it)
    seed_<s>        HPARAMS session of seed s: headline hparams; metrics the seed's headline
                    gaps (hparams/gap_same_pred/...) first, then eval/<split>/acc (training's)

Why so: TensorBoard groups cards by the tag's prefix before the first '/' and sorts tags with
uppercase letters before lowercase ones (Time Series and SCALARS alike), so `Headline` is the
first group. A single point is drawn as itself: smoothing leaves a constant series unchanged,
and outlier clipping needs 3 points in a card (the split in the tag gives each card one run, one
point). Sweeps over proxy size are not written as scalars: TensorBoard would draw them as time
series (x labelled "Step", smoothed, clipped); they are figures (IMAGES, with labelled axes and
the figures' split colours) and numbers (TEXT's gap_table). TensorBoard colours runs itself, so
each split, being a run, keeps one colour in every card, but not the figures' colour.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from jaxillusions.report import stats, tables
from jaxillusions.runtime import tensorboard

HEADLINE_METRIC = "same_pred"
# Config keys shown in HPARAMS (when present), besides `seed`, `workdir` and `healthy`.
HPARAM_KEYS = (
    "task", "data.num_types", "data.max_depth", "data.max_len", "data.num_train",
    "data.source", "data.context",
    "model.n_layers", "model.n_heads", "model.d_model", "model.d_head", "model.d_mlp",
    "model.pos_encoding", "model.attn_only", "model.embedding", "model.first_layer",
    "model.minimal_embedding",
    "train.num_steps", "train.batch_size", "train.learning_rate", "train.weight_decay",
    "train.loss_on", "proxies.svd_ranks", "proxies.kmeans_sizes",
)


def headline_proxies(gaps: Sequence[dict], rows: Sequence[dict],
                     baseline: str = "iid") -> list[tuple[str, str, int, bool]]:
    """[(method, site, size, reached)]: the proxies of gap_table.txt's headline, for every
    method (the headline prints the first 5): methods as configured (the rows' order), each at
    its first site in model order, at the smallest size whose mean same_pred on `baseline`
    reaches tables.FAITHFUL (reached False: none does, the largest size), sizes at which the
    proxy is the original model itself excluded; size 0 for data-independent proxies."""
    gaps = [g for g in gaps if g["baseline"] == baseline and g["metric"] == HEADLINE_METRIC]
    order = tables.row_order(list(dict.fromkeys(r["method"] for r in rows)))
    families = sorted({(g["method"], g["site"]) for g in gaps},
                      key=lambda f: order({"method": f[0], "site": f[1], "size": 0}))
    identical, out = tables.identical_sizes(rows), []
    for method in dict.fromkeys(m for m, _ in families):
        site = next(s for m, s in families if m == method)
        # The headline's own rule (tables.headline), so that both name the same proxy.
        found = tables._faithful_size(gaps, method, site, baseline,
                                      identical.get((method, site), set()))
        if found is not None:
            out.append((method, site, found[0], found[2]))
    return out


def _ood(config, splits: Sequence[str]) -> tuple[list[str], list[str]]:
    """(OOD splits, in-distribution splits other than the gap baseline), in `splits`' order."""
    from jaxillusions import tasks

    inside = tasks.get(config).IN_DISTRIBUTION
    baseline = config.proxies.gap_baseline
    return ([s for s in splits if s not in inside and s != baseline],
            [s for s in splits if s in inside and s != baseline])


def write_headline(writer, gaps: Sequence[dict], rows: Sequence[dict], config,
                   step: int) -> list[str]:
    """The Headline group: per headline proxy (`headline_proxies`) and OOD split, its gap in
    same_pred (gaps.csv's mean) as one point at `step` (the training step of the evaluated
    model) in run split/<split>; the card's description gives the interval and seed count.
    Returns the tags, in the order TensorBoard shows them."""
    baseline = config.proxies.gap_baseline
    ood, _ = _ood(config, list(config.proxies.eval_splits))
    by_key = {(g["method"], g["site"], g["size"], g["split"]): g for g in gaps
              if g["baseline"] == baseline and g["metric"] == HEADLINE_METRIC}
    tags = []
    for i, (method, site, size, reached) in enumerate(headline_proxies(gaps, rows, baseline), 1):
        for split in ood:
            g = by_key.get((method, site, size, split))
            if g is None or not np.isfinite(g["gap"]):
                continue
            tag = tensorboard.headline_tag(i, method, site, size, split)
            chosen = ("data-independent" if size == 0 else
                      f"the smallest size with same_pred >= {tables.FAITHFUL:g} on {baseline}"
                      if reached else f"never {tables.FAITHFUL:g} on {baseline}: the largest size")
            tensorboard.write_headline(writer, tag, split, step, float(g["gap"]), (
                f"y = same_pred on {baseline} minus same_pred on {split} (> 0: the proxy is less "
                f"faithful on {split}) of {method} on {site}" + (f" at size {size}" if size else "")
                + f" ({chosen}): {g['gap']:+.4f}, "
                + (f"95% t interval [{g['ci_low']:+.4f}, {g['ci_high']:+.4f}]"
                   if math.isfinite(g["ci_low"]) else "no interval (one seed, or the same gap "
                   "in every seed)")
                + f" over {g['n_seeds']} seeds ({g['seeds_positive']} positive), as in "
                "gaps.csv. x = the training step of the evaluated model. One point: smoothing "
                "and outlier clipping do not move it."))
            tags.append(tag)
    return tags


def write_report_text(writer, text: str, step: int = 0) -> None:
    """TEXT tab: gap_table.txt's headline (tensorboard.SUMMARY_TAG) and the whole table."""
    tensorboard.write_report(writer, tables.summary_of(text), text, step)


def hparams(config, model_cfg) -> dict[str, Any]:
    """The headline config values, resolved: model.d_head as used, the SVD ranks as used."""
    from jaxillusions.faithfulness.specs import specs_from_config

    flat = tensorboard.flatten_config(config)
    out = {k: flat[k] for k in HPARAM_KEYS if k in flat}
    if model_cfg is not None:
        out["model.d_head"] = model_cfg.head_dim
        if "svd" in config.proxies.methods:
            specs = specs_from_config(config.proxies, model_cfg)
            ranks = sorted({s for spec in specs if spec.method == "svd" for s in spec.sizes})
            out["proxies.svd_ranks"] = ",".join(map(str, ranks))
    if "proxies.kmeans_sizes" in out:
        out["proxies.kmeans_sizes"] = ",".join(map(str, config.proxies.kmeans_sizes))
    return out


def _middle_proxies(rows: Sequence[dict]) -> list[tuple[str, str, int]]:
    """[(method, site, size)] without gap rows: each method at its middle size on the rows'
    first sized site (data-independent proxies at size 0)."""
    sized = [r["site"] for r in rows if r["size"] > 0]
    target = sized[0] if sized else None
    sizes: dict[tuple, set[int]] = defaultdict(set)
    for r in rows:
        if r["method"] != "original" and (r["site"] == target or r["size"] == 0):
            sizes[(r["method"], r["site"])].add(r["size"])
    return [(m, site, tables.middle_size(z)) for (m, site), z in sizes.items()]


def headline_gaps(rows: Sequence[dict], proxies: Sequence[tuple] | None = None,
                  reference: str = "iid") -> dict[str, dict[int, float]]:
    """Per-seed gaps for HPARAMS (the seeds' values behind gaps.csv's means):
    {tensorboard.gap_metric(method, site, size, split): {seed: gap}}, gap = same_pred on
    `reference` minus same_pred on the split (stats.signed_gap), for `proxies` ([(method, site,
    size, ...)]; by default each method's middle size on the first sized site,
    `_middle_proxies`), in their order and the rows' split order."""
    rows = [r for r in rows if r["breakdown"] == "all"]
    proxies = [p[:3] for p in (_middle_proxies(rows) if proxies is None else proxies)]
    wanted = set(proxies)
    values: dict[tuple, dict[int, float]] = defaultdict(dict)
    for r in rows:
        if (r["method"], r["site"], r["size"]) in wanted:
            values[(r["method"], r["site"], r["size"], r["split"])][r["seed"]] = r["same_pred"]
    splits = list(dict.fromkeys(r["split"] for r in rows))
    out: dict[str, dict[int, float]] = {}
    for method, site, size in proxies:
        base = values.get((method, site, size, reference), {})
        for split in splits:
            per_seed = values.get((method, site, size, split), {})
            gaps = {seed: stats.signed_gap(base[seed], v, "same_pred")  # gaps.csv's sign
                    for seed, v in per_seed.items() if seed in base}
            gaps = {seed: g for seed, g in gaps.items() if np.isfinite(g)}
            if split != reference and gaps:
                out[tensorboard.gap_metric(method, site, size, split)] = gaps
    return out


@dataclasses.dataclass(frozen=True)
class Sessions:
    """The HPARAMS sessions to write, one per member of the run, each list in the members'
    order: `labels`, the run labels (train.members(config).labels: seed numbers, or
    "<seed>_cw<w>" for members of a hyper-parameter sweep); `healthy` (False: diverged in
    training); `hparams`, per-member hyper-parameters of a sweep ({name: [M]}, e.g.
    {"contrastive_weight": [...]}; None: none)."""

    labels: Sequence[int | str]
    healthy: Sequence[bool]
    hparams: Mapping[str, Sequence] | None = None


def write_hparams(writer, config, model_cfg, sessions: Sessions, rows: Sequence[dict] = (),
                  workdir: str = "", proxies: Sequence[tuple] | None = None,
                  step: int = 0) -> None:
    """One HPARAMS session per member of `sessions`, in its run seed_<label>:
    `hparams(config, model_cfg)` plus `seed`, the member's own hyper-parameters, `healthy` and
    `workdir` (so sessions of several sweeps under one logdir compare).
    Metrics, in the order HPARAMS lists them (it shows the first 5): when `rows` are given, the
    seed's gap in same_pred (`headline_gaps`, from proxies.gap_baseline) of each of `proxies`
    (the headline's, `headline_proxies`; default each method's middle size) on each OOD split,
    then on the other in-distribution splits (the control), then eval/<split>/acc for the
    splits of proxies.eval_splits (the final accuracy, logged by training). The gaps' scalars
    are written at `step`."""
    base = hparams(config, model_cfg)
    if workdir:
        base["workdir"] = os.path.basename(os.path.normpath(workdir))
    splits = list(config.proxies.eval_splits)
    names = {f"eval/{s}/acc": f"accuracy on {s} (end of training)" for s in splits}
    if rows:
        proxies = [p[:3] for p in (_middle_proxies(rows) if proxies is None else proxies)]
        # The gaps are measured from the same baseline as gaps.csv and gap_table.txt.
        reference = config.proxies.gap_baseline
        gaps = headline_gaps(rows, proxies, reference=reference)
        ood, inside = _ood(config, splits)
        gap_names = {tensorboard.gap_metric(m, site, size, s): f"gap {reference}-{s}: {m}"
                     + (f" {size} {site}" if size else "")
                     for m, site, size in proxies for s in ood + inside}
        gap_names = {t: n for t, n in gap_names.items() if t in gaps}
        names = {**dict(sorted(gap_names.items(), key=lambda kv: kv[0].rsplit("/", 1)[1]
                               in inside)), **names}  # OOD splits first (a stable sort)
    else:
        gaps = {}
    member_hparams = sessions.hparams or {}
    for name in member_hparams:  # the member's own value, not the config's single one
        base.pop(f"train.{name}", None)
    healthy = np.asarray(sessions.healthy, bool).tolist()
    # What differs between sessions, shown first by TensorBoard (then constants by name).
    varying = ["seed", *(k for k, v in member_hparams.items() if len(set(v)) > 1)] + (
        ["healthy"] if len(set(healthy)) > 1 else [])
    for i, (label, ok) in enumerate(zip(sessions.labels, healthy, strict=True)):
        seed = int(str(label).split("_")[0])
        values = {tag: per_seed[seed] for tag, per_seed in gaps.items() if seed in per_seed}
        extra = {k: v[i] for k, v in member_hparams.items()}
        tensorboard.write_session(writer, tensorboard.Session(
            label, {"seed": seed, **extra, **base, "healthy": bool(ok)}, values, names, varying),
            step)


def write_all(writer, rows: Sequence[dict], config, model_cfg, sessions: Sessions,
              workdir: str, gaps: Sequence[dict] = (), report: str | None = None) -> None:
    """Everything above: the Headline cards (from `gaps`), the TEXT report (`report`, by
    default <workdir>/gap_table.txt when there is one, which the main job writes first) and
    HPARAMS (`sessions`; with the headline's proxies when there are `gaps`). The reports are
    attached to the training step of the evaluated model (config.train.num_steps)."""
    step = int(config.train.num_steps)
    proxies = headline_proxies(gaps, rows, config.proxies.gap_baseline) if gaps else None
    if gaps:
        write_headline(writer, gaps, rows, config, step)
    path = os.path.join(workdir, "gap_table.txt")
    if report is None and os.path.isfile(path):
        with open(path) as f:
            report = f.read()
    if report:
        write_report_text(writer, report, step)
    write_hparams(writer, config, model_cfg, sessions, rows, workdir, proxies=proxies,
                  step=step)
