"""What the main job writes to TensorBoard after evaluation: faithfulness curves over proxy size,
generalization-gap cards with their intervals, a custom-scalars layout that shows the gap cards
first, and one HPARAMS session per seed.

**x axis = log2(size).** Curves over a proxy's size (SVD rank, number of k-means clusters) are
written with step = `size_step(size)` = log2(size): rank 1 -> step 0, 2 -> 1, 4 -> 2, ...,
64 -> 6. Sizes that are not powers of two are rounded to the nearest step; one that would land on
a step already taken in the same curve is left out of TensorBoard with a warning (it is still in
results.csv and the figures). Data-independent proxies (one-hot and uniform attention, size 0)
have no curve (one value per split: see HPARAMS, the figures and gap_table.txt).

**Smoothing.** TensorBoard smooths every curve by default (0.6) and "ignore outliers" clips the
y range, which here would mix ranks and hide the smallest sizes; the logged values are exact
(the means of results.csv), so set smoothing to 0 and untick "ignore outliers" in the
settings to read them.

Runs and tags (a handful of tags; the runs are the lines of a card):

    faithfulness/<split>   <method>/<site>/{same_pred,jsd,acc} of sized proxies (the seed means
                           of results.csv); on OOD splits gap/<metric>/<method>/<site> (the
                           paired gap) and gap_interval/<metric>/<method>/<site>/{low,high}
                           (its 95% interval; CUSTOM SCALARS draws all three as one chart)
    seed_<s>               HPARAMS session of seed s: headline hparams; metrics
                           eval/<split>/acc (final accuracy, logged by training) and
                           hparams/gap_same_pred/<method>/<split> (this seed's gap)
"""

from __future__ import annotations

import math
import os
import warnings
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from jaxillusions.analysis import stats, tables

CURVE_METRICS = {"same_pred": "same_pred", "jsd": "jsd", "acc_proxy": "acc"}  # row key -> tag
GAP_METRICS = ("same_pred",)  # gap cards in TensorBoard (gaps.csv has every metric)
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


def card_note(method: str, what: str) -> str:
    """The description on a card: what it shows, the x axis, and how to read exact values."""
    from jaxillusions import proxies

    return (f"{what}. x = log2({proxies.size_label(method)}): step 0 = 1, 1 = 2, 2 = 4, ... "
            "The logged points are exact (results.csv, gaps.csv); TensorBoard smooths curves "
            "(0.6) and ignores outliers in the y range by default: set Smoothing to 0 and untick "
            "'Ignore outliers in chart scaling' to read them.")


def size_step(size: int) -> int:
    """TensorBoard step of a proxy size: round(log2(size)); 1 -> 0, 4 -> 2, 64 -> 6."""
    if size < 1:
        raise ValueError(f"size {size} has no step (data-independent proxies have size 0)")
    return round(math.log2(size))


def _steps(sizes: Iterable[int], what: str) -> dict[int, int]:
    """{size: step} for sizes whose step is not taken by an exact power of two or a smaller
    size in the same curve."""
    out: dict[int, int] = {}
    taken: dict[int, int] = {}
    # Exact powers of two first: they own their step.
    for size in sorted(sizes, key=lambda s: (s & (s - 1) != 0, s)):
        step = size_step(size)
        if step in taken:
            warnings.warn(f"TensorBoard {what}: size {size} rounds to step {step} "
                          f"(log2) like size {taken[step]}; left out of TensorBoard "
                          "(it is in results.csv and the figures)", stacklevel=3)
            continue
        taken[step] = size
        out[size] = step
    return out


def _mean_by_size(agg: dict, metric: str) -> dict[tuple, dict[int, float]]:
    """{(split, method, site): {size: mean over seeds}} from tables.aggregate's output."""
    out: dict[tuple, dict[int, float]] = defaultdict(dict)
    for (site, method, size, split, _), values in agg.items():
        out[(split, method, site)][size] = values[metric][0]
    return out


def write_faithfulness(writer, rows: Sequence[dict]) -> None:
    """Runs faithfulness/<split>: per sized (method, site) the seed mean of same_pred, jsd and the
    proxy's accuracy against log2(size), exactly the means of results.csv. Data-independent
    proxies and the original model have one value per split: no flat reference cards (their
    values are in HPARAMS, the figures and gap_table.txt)."""
    agg = tables.aggregate(rows)
    for metric, tag in CURVE_METRICS.items():
        for (split, method, site), by_size in sorted(_mean_by_size(agg, metric).items()):
            if set(by_size) == {0}:
                continue
            run, name = f"faithfulness/{split}", f"{method}/{site}/{tag}"
            steps = _steps([s for s in by_size if s > 0], f"{run} {name}")
            writer.curve(run, name, [steps[s] for s in sorted(steps)],
                         [by_size[s] for s in sorted(steps)],
                         card_note(method, f"{tag} of {method} on {site}, mean over seeds, "
                                   "a line per split"))


def write_gaps(writer, gaps: Sequence[dict], metrics: Sequence[str] = GAP_METRICS) -> None:
    """Tags gap/<metric>/<method>/<site> in runs faithfulness/<split>: the paired gap (baseline
    minus split, signed so that positive = less faithful on the split) against log2(size), with
    its 95% interval bounds as gap_interval/<metric>/<method>/<site>/{low,high} (gap_tags).
    `gaps` are rows with columns site, method, size, split, metric, gap, ci_low, ci_high
    (analysis/stats.py)."""
    gaps = [g for g in gaps if g["metric"] in metrics]
    sized = {g["size"] for g in gaps if g["size"] > 0}
    all_steps = sorted({size_step(s) for s in sized}) or [0]
    series: dict[tuple, dict[int, dict]] = defaultdict(dict)
    for g in gaps:
        series[(g["split"], g["metric"], g["method"], g["site"])][g["size"]] = g
    for (split, metric, method, site), by_size in sorted(series.items()):
        run, name = f"faithfulness/{split}", f"gap/{metric}/{method}/{site}"
        if set(by_size) == {0}:
            xs, points = all_steps, [by_size[0]] * len(all_steps)
        else:
            steps = _steps([s for s in by_size if s > 0], f"{run} {name}")
            xs, points = [steps[s] for s in sorted(steps)], [by_size[s] for s in sorted(steps)]
        for tag, column in zip(gap_tags(metric, method, site), ("gap", "ci_low", "ci_high"),
                               strict=True):
            writer.curve(run, tag, xs, [float(p[column]) for p in points],
                         card_note(method, f"{column} of the paired {metric} gap (baseline "
                                   "minus split, > 0: less faithful on the split) of "
                                   f"{method} on {site}"))


def gap_tags(metric: str, method: str, site: str) -> tuple[str, str, str]:
    """(gap, interval low, interval high) tags of a gap: the bounds under their own group
    `gap_interval/` so that SCALARS' `gap` group has one card per gap (CUSTOM SCALARS draws the
    three as one margin chart)."""
    return (f"gap/{metric}/{method}/{site}", f"gap_interval/{metric}/{method}/{site}/low",
            f"gap_interval/{metric}/{method}/{site}/high")


def layout(rows: Sequence[dict], gaps: Sequence[dict] = (),
           metrics: Sequence[str] = GAP_METRICS) -> Any:
    """The custom-scalars layout: gap cards first (one margin chart per metric, method and site,
    a line per split with its 95% interval; as displayed: methods as configured, sites in the
    rows' order), then faithfulness (one chart per method, site and
    metric, a line per split, with the data-independent proxies and the original model's
    accuracy as reference lines)."""
    import re

    from tensorboardX.proto import layout_pb2

    def sized_first(keys):  # in the order of the rows (the config's), sized proxies first
        keys = list(dict.fromkeys(keys))
        return sorted(keys, key=lambda k: k[0] in unsized)

    unsized = {r["method"] for r in rows if r["size"] == 0}
    categories = []
    keys = sized_first((r["method"], r["site"]) for r in rows)
    have = {(g["method"], g["site"]) for g in gaps if g["metric"] in metrics}
    gap_keys = [k for k in keys if k in have] + sized_first(have - set(keys))
    if gap_keys:
        baseline = gaps[0].get("baseline", "iid")
        charts = []
        for metric in metrics:
            for method, site in gap_keys:
                value, lower, upper = gap_tags(metric, method, site)
                series = layout_pb2.MarginChartContent.Series(value=value, lower=lower,
                                                              upper=upper)
                charts.append(layout_pb2.Chart(
                    title=f"gap in {metric}: {method} on {site}; x = log2(size)",
                    margin=layout_pb2.MarginChartContent(series=[series])))
        categories.append(layout_pb2.Category(
            title=f"generalization gaps ({baseline} vs split, > 0: less faithful on the split; "
                  "95% CI over seeds). Untick 'Ignore outliers in chart scaling' (on by "
                  "default): it cuts off the largest gaps", chart=charts[::-1]))
    charts = []
    for tag in CURVE_METRICS.values():
        for method, site in keys:
            if method in unsized:
                continue
            charts.append(layout_pb2.Chart(
                title=f"{tag}: {method} on {site} (a line per split); x = log2(size)",
                multiline=layout_pb2.MultilineChartContent(
                    tag=[rf"^{re.escape(f'{method}/{site}/{tag}')}$"])))
    if not charts:  # only data-independent proxies
        charts = [layout_pb2.Chart(title=f"{tag} (a line per split)",
                                   multiline=layout_pb2.MultilineChartContent(tag=[f"/{tag}$"]))
                  for tag in CURVE_METRICS.values()]
    categories.append(layout_pb2.Category(
        title="faithfulness to the original model (seed means). Set Smoothing to 0 (0.6 by "
              "default) and untick 'Ignore outliers in chart scaling' to read exact values",
        chart=charts[::-1]))
    # Charts are written in reverse: TensorBoard 2.21's CUSTOM SCALARS draws a category's charts
    # last first (seen in Chromium), so they appear in the order built above.
    return layout_pb2.Layout(category=categories)


def hparams(config, model_cfg) -> dict[str, Any]:
    """The headline config values, resolved: model.d_head as used, the SVD ranks as used."""
    from jaxillusions import faithfulness
    from jaxillusions.logging import flatten_config

    flat = flatten_config(config)
    out = {k: flat[k] for k in HPARAM_KEYS if k in flat}
    if model_cfg is not None:
        out["model.d_head"] = model_cfg.head_dim
        if "svd" in config.proxies.methods:
            specs = faithfulness.specs_from_config(config.proxies, model_cfg)
            ranks = sorted({s for spec in specs if spec.method == "svd" for s in spec.sizes})
            out["proxies.svd_ranks"] = ",".join(map(str, ranks))
    if "proxies.kmeans_sizes" in out:
        out["proxies.kmeans_sizes"] = ",".join(map(str, config.proxies.kmeans_sizes))
    return out


def headline_gaps(rows: Sequence[dict], target: str | None = None,
                  reference: str = "iid") -> dict[str, dict[int, float]]:
    """Per-seed gaps for HPARAMS (the seeds' values behind gaps.csv's means):
    {"hparams/gap_same_pred/<method>_<size>/<site>/<split>": {seed: gap}} (data-independent
    proxies: .../<method>/<split>), gap = same_pred on `reference` minus same_pred on the split
    (stats.signed_gap), for `target` (default: the first site in the rows) at each method's
    middle size (size 0 for data-independent proxies)."""
    rows = [r for r in rows if r["breakdown"] == "all"]
    sized = [r["site"] for r in rows if r["size"] > 0]
    target = target or (sized[0] if sized else None)
    sizes: dict[str, set[int]] = defaultdict(set)
    for r in rows:
        if r["site"] == target or r["size"] == 0:
            sizes[r["method"]].add(r["size"])
    chosen = {m: tables.middle_size(s) for m, s in sizes.items()}
    values: dict[tuple, float] = {}
    for r in rows:
        if chosen.get(r["method"]) == r["size"] and (r["site"] == target or r["size"] == 0):
            values[(r["method"], r["split"], r["seed"])] = r["same_pred"]
    out: dict[str, dict[int, float]] = defaultdict(dict)
    for (method, split, seed), value in sorted(values.items()):
        base = values.get((method, reference, seed))
        if split != reference and base is not None:
            size = chosen[method]
            label = method if size == 0 else f"{method}_{size}/{target}"
            out[f"hparams/gap_same_pred/{label}/{split}"][seed] = stats.signed_gap(
                base, value, "same_pred")  # the sign convention of gaps.csv
    return dict(out)


def write_hparams(writer, config, model_cfg, seeds: Sequence[int | str],
                  healthy: Sequence[bool], rows: Sequence[dict] = (), workdir: str = "",
                  splits: Sequence[str] | None = None,
                  member_hparams: dict[str, Sequence] | None = None) -> None:
    """One HPARAMS session per seed, in its run seed_<s>: `hparams(config, model_cfg)` plus
    `seed`, `healthy` and `workdir` (so sessions of several sweeps under one logdir compare),
    with metrics eval/<split>/acc (the final accuracy, already logged by training) and, when
    `rows` are given, the seed's headline gaps (`headline_gaps`, from proxies.gap_baseline).

    `seeds` are the run labels (train.members(config).labels): seed numbers, or "<seed>_cw<w>"
    for members of a hyper-parameter sweep, whose per-member values `member_hparams` adds
    (e.g. {"contrastive_weight": [...]})."""
    base = hparams(config, model_cfg)
    if workdir:
        base["workdir"] = os.path.basename(os.path.normpath(workdir))
    if splits is None:
        splits = list(config.proxies.eval_splits)
    final = [f"eval/{s}/acc" for s in splits]
    # The gaps are measured from the same baseline as gaps.csv and gap_table.txt.
    reference = config.proxies.gap_baseline
    gaps = headline_gaps(rows, reference=reference) if rows else {}
    member_hparams = member_hparams or {}
    healthy = np.asarray(healthy, bool).tolist()
    # What differs between sessions, shown first by TensorBoard (then constants by name).
    varying = ["seed", *member_hparams] + (["healthy"] if len(set(healthy)) > 1 else [])
    for i, (label, ok) in enumerate(zip(seeds, healthy, strict=True)):
        seed = int(str(label).split("_")[0])
        values = {tag: per_seed[seed] for tag, per_seed in gaps.items() if seed in per_seed}
        extra = {k: v[i] for k, v in member_hparams.items()}
        writer.hparams({"seed": seed, **extra, **base, "healthy": bool(ok)}, values,
                       run=f"seed_{label}", metric_tags=sorted(gaps) + final, varying=varying)


def write_all(writer, rows: Sequence[dict], config, model_cfg, seeds, healthy, workdir: str,
              gaps: Sequence[dict] = ()) -> None:
    """Everything above, in the order TensorBoard should list it."""
    if gaps:
        write_gaps(writer, gaps)
    write_faithfulness(writer, rows)
    writer.custom_scalars(layout(rows, gaps))
    write_hparams(writer, config, model_cfg, seeds, healthy, rows, workdir)
