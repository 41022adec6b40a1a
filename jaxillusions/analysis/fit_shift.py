"""Why a proxy fails out of distribution: the fit x evaluate table and the gap decomposition.

Input: the rows of fit_shift.run_stage (faithfulness.evaluate's rows with a `fit_split`
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

import math
import os
from collections import defaultdict
from collections.abc import Iterable, Sequence

import numpy as np

from jaxillusions import proxies
from jaxillusions.analysis import figures, stats, tables

REFERENCE = "train"
METRICS = ("same_pred", "jsd")
REPORTS = ("fit_shift_results.csv", "fit_x_eval.csv", "gap_decomposition.csv")
SUMMARY = ("ci_low", "ci_high", "n_seeds", "seeds_positive", "boot_low", "boot_high")
ROW_COLUMNS = ("fit_split", "seed", "site", "method", "size", "split", "breakdown", "bin", "n",
               "acc_original", "acc_proxy", "jsd", "same_pred", "jsd_p95", "jsd_p99")
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
                _values(per_seed, seeds, metric), _values(train, seeds, metric), metric))
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
    95% t interval), one line per fit split (its split colour), one line style per site.
    Returns the matplotlib Figure."""
    rows = [r for r in table if r["method"] == method and r["metric"] == metric
            and r["fit_split"] != REFERENCE]
    sites = figures.ordered_sites(r["site"] for r in rows)
    fits = [f for f in fit_splits if f != REFERENCE]
    shown = [s for s in splits if any(r["split"] == s for r in rows)]
    fig, axes = figures._grid(len(shown), (3.6, 2.9))  # noqa: SLF001
    styles = ("-", "--", ":", "-.")
    colours = list(dict.fromkeys([*splits, *fits]))
    for ax, split in zip(axes, shown, strict=True):
        ax.axhline(0, color="0.4", lw=0.8)
        for j, site in enumerate(sites):
            for i, fit in enumerate(fits):
                line = sorted((r for r in rows if (r["site"], r["split"], r["fit_split"])
                               == (site, split, fit)), key=lambda r: r["size"])
                if not line:
                    continue
                mean = np.array([r["vs_train"] for r in line], float)
                err = np.nan_to_num(np.stack([mean - [r["ci_low"] for r in line],
                                              [r["ci_high"] for r in line] - mean]))
                sizes = np.array([r["size"] for r in line], float)
                ax.errorbar(figures._dodge(sizes, i, len(fits)), mean,  # noqa: SLF001
                            yerr=err, ls=styles[j % len(styles)], ms=4, lw=1.2, capsize=2,
                            elinewidth=0.9, label=f"fit on {fit}, {_short(site)}",
                            **figures.split_style(fit, colours))
        figures._log2_axis(ax, sorted({r["size"] for r in rows}),  # noqa: SLF001
                           proxies.size_label(method))
        ax.set_title(f"evaluated on {split}")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"{metric}: fit - train fit (> 0: better)")
    handles, labels = axes[0].get_legend_handles_labels()
    figures._legend_below(fig, handles, labels, ncol=3)  # noqa: SLF001
    n = max((r["n_seeds"] for r in rows), default=0)
    figures._title(fig, f"{method}: fitted on another split vs on train, paired by seed "  # noqa: SLF001
                   f"(mean, 95% t CI, {n} seeds)")
    fig.tight_layout(rect=(0, 0.08, 1, 1))
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
