"""Fit proxies on other splits than `train` (fit_shift.splits) and evaluate them everywhere.

A proxy fitted on the training split loses faithfulness out of distribution. Fitting a proxy
of the same size on the OOD split itself separates the two causes (studies/fit_shift.py):
the part of the gap that refitting removes is tied to the fit distribution, the part that
remains is beyond what a proxy of that size can do.

    fit_shift.splits = ("train", "unseen_depth", "longer")   # train: the reference, required
    fit_shift.sentences = 0                                  # cap per fit (0: all)

Halves: a fit split F other than train is cut in two by a fixed permutation of its sentence
indices, drawn from a numpy generator seeded by (a constant naming this stream, config.seed, the
split's number of sentences): its even positions are the fit half, its odd positions the
evaluation half. So no sentence is both fitted on and evaluated, and the cut is the same on
every run, machine and fit split. Every proxy, the train-fitted one included, is evaluated on
the same sentences: the evaluation half of each fit split and the whole of the other
evaluation splits (the "halved evaluation set"); the paired comparisons are on equal footing.

fit_shift.sentences caps the sentences of every fit (train included) at the first N of the
fit half in permutation order (train: of the same kind of permutation of train), a random
sample; 0 (the default) uses them all, and then the training split is used as it is, so the
train-fitted proxies and results.csv are those of a run without this module.

Only data-dependent proxies (STATISTIC not None) are refitted; the others (one-hot and uniform
attention) do not depend on the fit split and are evaluated once, as fit_split "train".

Batched as the main proxy stage (faithfulness.collect / fit_one / evaluate over seeds and
sizes), resumable per (fit split, family) with stage files under proxies/fit_<split>/, each
stamped with what it was computed with.

Why a proxy fails out of distribution: the fit x evaluate table and the gap decomposition.

Input: the rows of the fit-shift stage, `run` (faithfulness.evaluate's rows with a `fit_split`
column), every proxy evaluated on the same sentences (the halved evaluation set), so every
comparison below is paired within a seed.

fit_x_eval.csv: per (site, method, size, fit split, evaluation split, metric), the mean over
seeds with its logit-t interval (stats.bounded_interval), and `vs_train`: the paired difference
against the train-fitted proxy of the same size on the same split, positive = more faithful
than it (stats.paired_summary columns).

gap_decomposition.csv: per seed, proxy, size and OOD split F that proxies were also fitted on,
with B the gap baseline (proxies.gap_baseline) and stats.signed_gap's sign (> 0: less
faithful), every term measured on the halved evaluation set (F: its evaluation half),
    halved_gap   = signed_gap(train-fitted on B, train-fitted on F)
    distribution = signed_gap(F-fitted on F,     train-fitted on F)   what refitting on F removes
    capacity     = signed_gap(train-fitted on B, F-fitted on F)       what remains
so halved_gap = distribution + capacity for every seed, exactly. halved_gap is the gap of
gaps.csv measured on other sentences (half of F, and of B when B is a fit split too): it
differs from gaps.csv's `gap` (whole splits) by sampling noise, hence its own name. Each part:
paired mean, Student-t and bootstrap intervals, seeds and seeds > 0 (stats.paired_summary), and
`share_of_halved_gap`: the mean part over the mean halved_gap, left empty where that mean is
within the metric's resolution (stats.RESOLUTION) of 0, where the ratio is the noise's. A
data-independent proxy (one-hot, uniform attention) is the same whatever it is fitted on: its
distribution part is 0 and its capacity part is its whole gap.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import zlib
from collections import defaultdict
from collections.abc import Iterable, Sequence

import jax
import numpy as np
from flax import serialization

from jaxillusions import proxies, tasks
from jaxillusions.config.fields import INT, STRS, nonnegative, setting
from jaxillusions.faithfulness.collect import Chunking, collect
from jaxillusions.faithfulness.evaluate import EvalOptions, evaluate, make_eval_set
from jaxillusions.faithfulness.fit import FittedProxy, fit_one
from jaxillusions.faithfulness.specs import labels_for
from jaxillusions.report import figures, proxy_sizes, stats, tables
from jaxillusions.runtime import schema, stages, timing
from jaxillusions.studies.stage import PROXIES, Context, Stage

REFERENCE = "train"


METRICS = ("same_pred", "jsd")


REPORTS = ("fit_shift_results.csv", "fit_x_eval.csv", "gap_decomposition.csv")


SUMMARY = ("ci_low", "ci_high", "n_seeds", "seeds_positive", "boot_low", "boot_high")


# fit_shift_results.csv: results' rows, each with the split its proxy was fitted on.
ROW_COLUMNS = (("fit_split",) + schema.KEYS + schema.ACCURACIES + schema.FAITHFULNESS
               + tuple(schema.JSD_QUANTILES))


FIT_X_EVAL_COLUMNS = ("site", "method", "size", "fit_split", "split", "metric", "mean", "low",
                      "high", "vs_train") + SUMMARY


PARTS = ("halved_gap", "distribution", "capacity")


DECOMPOSITION_COLUMNS = ("site", "method", "size", "split", "metric", "baseline", "part",
                         "mean", "share_of_halved_gap") + SUMMARY


def _fit_independent(method: str) -> bool:
    try:
        return proxies.get(method).STATISTIC is None
    except ValueError:  # a method whose file is gone: judge it by its rows
        return False


def by_seed(rows: Iterable[dict]) -> dict[tuple, dict[int, dict]]:
    """{(site, method, size, fit_split, split): {seed: row}} of the `all` breakdown. A
    data-independent proxy's train-fitted rows also stand for every other fit split."""
    out: dict[tuple, dict[int, dict]] = defaultdict(dict)
    rows = [r for r in rows if r["breakdown"] == "all"]
    fits = list(dict.fromkeys(r["fit_split"] for r in rows))
    for r in rows:
        alike = fits if _fit_independent(r["method"]) else [r["fit_split"]]
        for fit in alike:
            out[(r["site"], r["method"], r["size"], fit, r["split"])][r["seed"]] = r
    return out


def _values(per_seed: dict[int, dict], seeds: Sequence[int], metric: str) -> np.ndarray:
    return np.array([per_seed[s][metric] for s in seeds], np.float64)


def fit_x_eval(rows: Iterable[dict], metrics: Sequence[str] = METRICS) -> list[dict]:
    """The fit x evaluate table (module docstring)."""
    table, out = by_seed(rows), []
    for (site, method, size, fit, split), per_seed in sorted(table.items()):
        train = table.get((site, method, size, REFERENCE, split), {})
        seeds = sorted(set(train) & set(per_seed))
        for metric in metrics:
            values = _values(per_seed, sorted(per_seed), metric)
            mean, low, high = stats.bounded_interval(values)
            summary = stats.paired_summary(stats.signed_gap(
                _values(per_seed, seeds, metric), _values(train, seeds, metric), metric),
                bounds=stats.gap_bounds(metric))
            out.append({"site": site, "method": method, "size": size, "fit_split": fit,
                        "split": split, "metric": metric, "mean": mean, "low": low,
                        "high": high, "vs_train": summary["mean"],
                        **{k: summary[k] for k in SUMMARY}})
    return out


def decomposition_per_seed(rows: Iterable[dict], baseline: str = "iid",
                           metrics: Sequence[str] = METRICS) -> list[dict]:
    """One row per (seed, site, method, size, split, metric) with the halved gap and its two
    parts (module docstring), for every split that is both a fit split and evaluated."""
    table, out = by_seed(rows), []
    for (site, method, size, fit, split), refit in sorted(table.items()):
        if fit != split or split in (REFERENCE, baseline):
            continue
        train = table.get((site, method, size, REFERENCE, split))
        base = table.get((site, method, size, REFERENCE, baseline))
        if train is None or base is None:
            continue
        seeds = sorted(set(train) & set(base) & set(refit))
        for metric in metrics:
            b, t, r = (_values(x, seeds, metric) for x in (base, train, refit))
            gap, dist, cap = (stats.signed_gap(b, t, metric), stats.signed_gap(r, t, metric),
                              stats.signed_gap(b, r, metric))
            for i, seed in enumerate(seeds):
                out.append({"seed": seed, "site": site, "method": method, "size": size,
                            "split": split, "metric": metric, "baseline": baseline,
                            "halved_gap": gap[i], "distribution": dist[i],
                            "capacity": cap[i]})
    return out


def decomposition(per_seed: Iterable[dict]) -> list[dict]:
    """Paired summaries of each part over seeds (module docstring)."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in per_seed:
        groups[(r["site"], r["method"], r["size"], r["split"], r["metric"], r["baseline"])
               ].append(r)
    out = []
    for (site, method, size, split, metric, baseline), group in sorted(groups.items()):
        gap = float(np.mean([r["halved_gap"] for r in group]))
        real = abs(gap) > stats.RESOLUTION.get(metric, 0.0)  # else the share is noise over noise
        for part in PARTS:
            summary = stats.paired_summary(np.array([r[part] for r in group]))
            out.append({"site": site, "method": method, "size": size, "split": split,
                        "metric": metric, "baseline": baseline, "part": part,
                        "mean": summary["mean"],
                        "share_of_halved_gap": summary["mean"] / gap if real else math.nan,
                        **{k: summary[k] for k in SUMMARY}})
    return out


def _short(site: str) -> str:
    """blocks.1.attn.q+blocks.1.attn.k -> q+k (the layer is in the CSV)."""
    return "+".join(part.rsplit(".", 1)[-1] for part in site.split("+"))


def fit_x_eval_figure(table: Sequence[dict], method: str, splits: Sequence[str],
                      fit_splits: Sequence[str], metric: str = "same_pred"):
    """One panel per evaluation split: against size, the paired difference of each OOD-fitted
    proxy to the train-fitted one of the same size (> 0: more faithful than it; mean, paired
    95% t interval), one line per fit split (its split colour), one line style per site and,
    for a dictionary's size codes at several k, per k (at their widths). Returns the matplotlib
    Figure."""
    rows = [r for r in table if r["method"] == method and r["metric"] == metric
            and r["fit_split"] != REFERENCE]
    sites = figures.ordered_sites(r["site"] for r in rows)
    fits = [f for f in fit_splits if f != REFERENCE]
    shown = [s for s in splits if any(r["split"] == s for r in rows)]
    lines = [(site, k, sizes) for site in sites
             for k, sizes in proxy_sizes.by_k(method, {r["size"] for r in rows})]
    legend_rows = math.ceil(len(lines) * len(fits) / 3)  # inches below the panels: the legend
    fig, axes = figures._grid(len(shown), (3.6, 2.9), extra_height=0.5 + 0.2 * legend_rows)  # noqa: SLF001
    styles = figures.LINESTYLES
    colours = list(dict.fromkeys([*splits, *fits]))
    for ax, split in zip(axes, shown, strict=True):
        ax.axhline(0, color="0.4", lw=0.8)
        for j, (site, k, sizes) in enumerate(lines):
            for i, fit in enumerate(fits):
                line = sorted((r for r in rows if (r["site"], r["split"], r["fit_split"])
                               == (site, split, fit) and r["size"] in sizes),
                              key=lambda r: proxy_sizes.decode(method, r["size"]))
                if not line:
                    continue
                mean = np.array([r["vs_train"] for r in line], float)
                err = np.nan_to_num(np.stack([mean - [r["ci_low"] for r in line],
                                              [r["ci_high"] for r in line] - mean]))
                x = np.array(proxy_sizes.widths(method, [r["size"] for r in line]), float)
                ax.errorbar(figures._dodge(x, i, len(fits)), mean,  # noqa: SLF001
                            yerr=err, ls=styles[j % len(styles)], ms=4, lw=1.2, capsize=2,
                            elinewidth=0.9, label=f"fit on {fit}, {_short(site)}"
                            + ("" if k is None else f", k = {k}"),
                            **figures.split_style(fit, colours))
        figures._size_axis(ax, method, sorted({r["size"] for r in rows}))  # noqa: SLF001
        if lines and lines[0][1] is not None:  # size codes: k is in the legend
            ax.set_xlabel("width")
        ax.set_title(f"evaluated on {split}")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"{metric}: fit - train fit (> 0: better)")
    handles, labels = axes[0].get_legend_handles_labels()
    figures._legend_below(fig, handles, labels, ncol=3)  # noqa: SLF001
    n = max((r["n_seeds"] for r in rows), default=0)
    figures._title(fig, f"{method}: fitted on another split vs on train, paired by seed "  # noqa: SLF001
                   f"(mean, 95% t CI, {n} seeds)")
    fig.tight_layout(rect=(0, (0.17 * legend_rows + 0.05) / fig.get_figheight(), 1, 1))
    return fig


def decomposition_figure(table: Sequence[dict], splits: Sequence[str],
                         metric: str = "same_pred"):
    """Across methods: one panel per OOD split; per (method, site) at its middle size, the
    halved gap and its distribution and capacity parts side by side, with paired 95% t
    intervals."""
    rows = [r for r in table if r["metric"] == metric]
    shown = [s for s in splits if any(r["split"] == s for r in rows)]
    fig, axes = figures._grid(len(shown), (4.6, 3.2))  # noqa: SLF001
    families = sorted(dict.fromkeys((r["method"], r["site"]) for r in rows),
                      key=lambda f: (tables.site_key(f[1]), f[0]))
    middle = {f: tables.middle_size({r["size"] for r in rows if (r["method"], r["site"]) == f})
              for f in families}
    shades = ("0.15", "0.6", "0.9")  # halved_gap, distribution, capacity
    for ax, split in zip(axes, shown, strict=True):
        ax.axhline(0, color="0.4", lw=0.8)
        for p, part in enumerate(PARTS):
            cells = {(r["method"], r["site"]): r for r in rows if r["split"] == split
                     and r["part"] == part and r["size"] == middle[(r["method"], r["site"])]}
            x = np.array([i for i, f in enumerate(families) if f in cells], float)
            got = [cells[f] for f in families if f in cells]
            mean = np.array([c["mean"] for c in got], float)
            err = np.nan_to_num(np.stack([mean - [c["ci_low"] for c in got],
                                          [c["ci_high"] for c in got] - mean]))
            ax.bar(x + (p - 1) * 0.27, mean, width=0.27, yerr=err, capsize=2, label=part,
                   color=shades[p], edgecolor="0.0", linewidth=0.6)
        ax.set_xticks(range(len(families)),
                      [f"{m} {tables._label(m, middle[(m, s)])} {_short(s)}"  # noqa: SLF001
                       for m, s in families], rotation=30, ha="right", fontsize=8)
        ax.set_title(f"evaluated on {split}")
        ax.set_ylabel(f"gap in {metric} (> 0: less faithful)")
        ax.grid(alpha=0.3, axis="y")
    handles, labels = axes[0].get_legend_handles_labels()
    figures._legend_below(fig, handles, labels)  # noqa: SLF001
    n = max((r["n_seeds"] for r in rows), default=0)
    figures._title(fig, "Gap on the halved evaluation set = distribution (removed by "  # noqa: SLF001
                   "refitting on the split) + capacity (remains), middle sizes, paired 95% t "
                   f"CI, {n} seeds")
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return fig


def write_reports(rows: Sequence[dict], config, workdir: str, say=print) -> None:
    """fit_shift_results.csv, fit_x_eval.csv, gap_decomposition.csv and their figures
    (figures/fit_x_eval_<method>.png for each data-dependent method, and
    figures/gap_decomposition.png) into `workdir`."""
    pc = config.proxies
    splits = list(pc.eval_splits)
    fits = list(dict.fromkeys(r["fit_split"] for r in rows))
    # The `all` rows: per-bin rows of every fit would be 5x results.csv (208 MB for the
    # population run with 5 fit splits); they stay in the stage files (proxies/fit_<split>/).
    kept = [r for r in rows if r["breakdown"] == "all"]
    extra = tuple(dict.fromkeys(k for r in kept for k in r if k not in ROW_COLUMNS))
    # (extra: further metric columns of the rows, e.g. the dictionary metrics fvu ... kl_score)
    tables.write_csv(kept, os.path.join(workdir, "fit_shift_results.csv"), ROW_COLUMNS + extra)
    table = fit_x_eval(rows)
    tables.write_csv(table, os.path.join(workdir, "fit_x_eval.csv"), FIT_X_EVAL_COLUMNS)
    parts = decomposition(decomposition_per_seed(rows, pc.gap_baseline))
    tables.write_csv(parts, os.path.join(workdir, "gap_decomposition.csv"),
                     DECOMPOSITION_COLUMNS)
    fig_dir = os.path.join(workdir, "figures")
    for method in dict.fromkeys(r["method"] for r in table if not _fit_independent(r["method"])):
        figures.save(fit_x_eval_figure(table, method, splits, fits),
                     os.path.join(fig_dir, f"fit_x_eval_{method}.png"))
    if parts:
        figures.save(decomposition_figure(parts, splits),
                     os.path.join(fig_dir, "gap_decomposition.png"))
    say(f"fit x evaluate: {workdir}/fit_x_eval.csv, {workdir}/gap_decomposition.csv")


_STREAM = zlib.crc32(b"jaxillusions.studies.fit_shift.halves")  # names the halves' random stream


SAMPLE_BOUNDED = ("kmeans",)  # proxies whose sizes may not exceed the vectors fitted on


def permutation(num_sentences: int, seed: int) -> np.ndarray:
    """The fixed permutation of a split's sentence indices (see the module docstring)."""
    return np.random.default_rng([_STREAM, seed, num_sentences]).permutation(num_sentences)


def halves(num_sentences: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(fit half in permutation order, evaluation half sorted): disjoint, together every index."""
    order = permutation(num_sentences, seed)
    return order[0::2], np.sort(order[1::2])


def fit_data(splits: dict, name: str, config):
    """The sentences proxies are fitted on for fit split `name`: train as it is unless capped,
    another split's fit half (capped by fit_shift.sentences)."""
    split, cap, seed = splits[name], config.fit_shift.sentences, config.seed
    if name == REFERENCE:
        return split if not cap else tasks.subset(split, permutation(len(split.tokens), seed)[:cap])
    index = halves(len(split.tokens), seed)[0]
    return tasks.subset(split, index[:cap] if cap else index)


def fit_stamp(config) -> dict:
    """What the train fit's stage stamp gains: nothing at the default (so the stage files of
    runs without this module stay valid), else the cap."""
    return {"fit_sentences": config.fit_shift.sentences} if config.fit_shift.sentences else {}


def check(config, model_cfg) -> list[str]:
    """One-line ValueError for bad fit settings (the door runs it before any work)."""
    del model_cfg
    pc, task = config.proxies, tasks.get(config)
    names = config.fit_shift.splits
    named = tasks.hook(task, "split_names")  # the splits the data names (text), else SPLITS
    available = named(config.data) if named is not None else task.SPLITS
    for name in names:
        if name not in available:
            other = [t for t in tasks.TASKS if name in tasks.get(t).SPLITS]
            where = f"a split of task {other[0]}, not" if other else "unknown in"
            raise ValueError(f"fit_shift.splits: {name!r} is {where} task {task.NAME}; "
                             f"available: {', '.join(available)}")
    if REFERENCE not in names:  # (each once: the door's rule of every tuple)
        raise ValueError(f"fit_shift.splits={names}: must list {REFERENCE!r} (the reference "
                         "of every paired comparison)")
    cap, width = config.fit_shift.sentences, task.widest_width(config.data)
    for method in [m for m in pc.methods if m in SAMPLE_BOUNDED] if cap else ():
        # A fit on `cap` sentences sees at most cap * width positions (vectors to cluster).
        largest = max(getattr(pc, proxies.sizes_key(proxies.get(method))))
        if cap * width < largest:
            raise ValueError(f"fit_shift.sentences={cap}: at most {cap * width} positions "
                             f"to fit {method} on, fewer than its largest size {largest}; use "
                             f"at least {-(-largest // width)} sentences, or 0 (all)")
    return []


def enabled(config) -> bool:
    """With fit_shift.splits beyond train (proxies fitted on other splits too)."""
    return any(s != REFERENCE for s in config.fit_shift.splits)


def run(ctx: Context) -> Context:
    """The stage, on a weight group's context: makes `rows`, the rows of every proxy fitted on
    every split of fit_shift.splits (column fit_split), evaluated on the halved evaluation set,
    from the proxy stage's train fits; its report (`report`) writes their tables. Makes `fits`
    too: {split: the FittedProxy list fitted on it} (train's are the proxy stage's families),
    for studies/circuits.py's overlaps."""
    config, params, splits, say = ctx.settings, ctx.params, ctx.splits, ctx.say
    specs, fitted, fit_stamps = ctx.proxies.specs, ctx.proxies.fitted, ctx.proxies.fit_stamps
    others = [s for s in config.fit_shift.splits if s != REFERENCE]
    pc, seed = config.proxies, config.seed
    chunking = Chunking(pc.seed_chunk_size, say)
    files, model_cfg, seeds, healthy = ctx.files, ctx.model_cfg, ctx.seeds, ctx.healthy
    halved = {n: tasks.subset(splits[n], halves(len(splits[n].tokens), seed)[1])
              for n in pc.eval_splits if n in others}
    eval_set = make_eval_set({**splits, **halved}, pc.eval_splits, tasks.get(config))
    eval_stamp = dict(splits=list(pc.eval_splits), halved=sorted(halved), seed=seed,
                      batch=pc.eval_batch_size)
    train_fitted = [FittedProxy(s, f) for s, f in zip(specs, fitted, strict=True)]
    dependent = [i for i, s in enumerate(specs) if s.module.STATISTIC is not None]
    say(f"fit shift: fitting on {', '.join(others)} (their fit halves), evaluating every fit on "
        f"{', '.join(pc.eval_splits)} (halved: {', '.join(halved) or 'none'})")
    rows, shift_fits = [], {}
    for name in (REFERENCE, *others):
        directory = os.path.join(files.dir, f"fit_{name}")
        os.makedirs(directory, exist_ok=True)
        family_fits = list(train_fitted)
        stamps = {i: fit_stamps[i] for i in range(len(specs))}
        if name != REFERENCE:
            data = fit_data(splits, name, config)
            stamps = {i: stages.stamp(train=fit_stamps[i], fit_split=name,
                                      sentences=len(data.tokens), seed=seed)
                      for i in dependent}
            family_fits = _fit(ctx, data, dependent, stamps, directory, family_fits)
            shift_fits[name] = family_fits
        for i in sorted(stamps):
            spec = specs[i]
            path = os.path.join(directory, os.path.basename(files.path(i, spec, "_rows.json")))
            stamp = stages.stamp(fit=stamps[i], **eval_stamp)
            family = files.load(path, stamp, stages.read_json)
            if family is None:
                with timing.stage("evaluation"):
                    family = evaluate(
                        params, model_cfg, eval_set, [family_fits[i]],
                        batch_size=pc.eval_batch_size, seeds=seeds, healthy=healthy,
                        options=EvalOptions(shared=family_fits, chunking=chunking))
                stages.write(path, json.dumps({"stamp": stamp, "value": family}),
                             "fit-shift evaluation")
            rows += [{"fit_split": name, **row} for row in family]
            stages.stop_if_signalled(
                f"while evaluating proxies fitted on {name}; the finished families are saved "
                f"in {directory}; relaunch the same command to resume")
        say(f"  fit on {name}: {len(stamps)} families evaluated", flush=True)
    return ctx.produced("fit_shift", rows=rows, fits=shift_fits)


def _fit(ctx: Context, data, dependent: list[int], stamps: dict, directory: str,
         family_fits: list) -> list:
    """family_fits with the data-dependent families (indices `dependent` of the proxy stage's
    specs) fitted on `data` by the group of `ctx` (loaded from their stage files under
    `directory` where those carry `stamps`). Collected once for all families that need it."""
    config, params, model_cfg, files = ctx.settings, ctx.params, ctx.model_cfg, ctx.files
    specs, pc, out = ctx.proxies.specs, config.proxies, list(family_fits)
    chunking = Chunking(pc.seed_chunk_size, ctx.say)
    paths = {i: os.path.join(directory, os.path.basename(files.path(i, specs[i], ".msgpack")))
             for i in dependent}
    loaded = {i: files.load(paths[i], stamps[i], stages.read_msgpack)
              for i in dependent}
    todo = [i for i in dependent if loaded[i] is None]
    if todo:
        if not len(data.tokens):
            raise ValueError(f"fit_shift.splits: the fit half of {os.path.basename(directory)}"
                             " has no sentences")
        with timing.stage("collection"):
            stats = collect(params, data, model_cfg, [specs[i] for i in todo],
                            num_samples=pc.kmeans_samples, batch_size=pc.collect_batch_size,
                            chunking=chunking,
                            labels=labels_for([specs[i] for i in todo], config, data))
        for i in todo:
            with timing.stage("fitting"):
                # The train fit's random keys (spec index i): only the data differ.
                proxy = fit_one(specs[i], i, stats, jax.random.PRNGKey(config.seed),
                                jax.tree.leaves(params)[0].shape[0], chunking=chunking)
                loaded[i] = jax.tree.map(np.asarray, proxy.params)
            stages.write(paths[i], serialization.msgpack_serialize(
                {"stamp": stamps[i], "value": loaded[i]}), "fit-shift fitting")
        del stats
    for i in dependent:
        out[i] = FittedProxy(specs[i], loaded[i])
    return out


def report_lines(ctx: Context) -> list[str]:
    """The reports stage's part: the tables and figures of `write_reports` from the stage's
    rows (process 0); no lines for gap_table.txt."""
    rows = ctx.made.get("fit_shift", {}).get("rows")
    if rows:
        with stages.writing("report", ctx.directory):
            write_reports(rows, ctx.settings, ctx.directory, say=ctx.say)
    return []


@dataclasses.dataclass(frozen=True)
class FitShift:
    """Proxies fitted on other splits than train too (jaxillusions/studies/fit_shift.py)."""

    splits: tuple[str, ...] = setting(
        ("train",), STRS, "splits of the task, 'train' among them (checked below)",
        lambda v, s: len(v) >= 1, "splits the proxies are fitted on (an OOD one: its fit half)")
    sentences: int = setting(0, INT, ">= 0 (0: every sentence of the fit split or half)",
                             nonnegative, "cap on the sentences a proxy is fitted on")


# The main job's stage (job.PIPELINE): per weight group, after the proxies.
STAGE = Stage("fit_shift", run, enabled=enabled, keys=("fit_shift.*", "proxies.*"),
              outputs=REPORTS, section=FitShift, check=check, report=report_lines,
              needs=(PROXIES,), makes=("fit_shift",))
