"""Tidy result tables: the CSV, seed aggregates with 95% intervals, the generalization-gap table."""

from __future__ import annotations

import csv
import io
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence

import numpy as np

from jaxillusions import metrics
from jaxillusions.analysis import stats

COLUMNS = ("seed", "site", "method", "size", "split", "breakdown", "bin", "n", "jsd",
           "same_pred", "acc_original", "acc_proxy", "jsd_p95", "jsd_p99")
STAT_COLUMNS = {"gaps": stats.GAP_COLUMNS, "proxy_vs_original": stats.PROXY_COLUMNS,
                "id_predicts_gap": stats.CORRELATION_COLUMNS, "min_size": stats.MIN_SIZE_COLUMNS}
# gaps_by_<breakdown>.csv: the paired gaps of one bin of a labelled breakdown (code: category)
BIN_GAP_COLUMNS = ("breakdown", "bin", "label") + stats.GAP_COLUMNS
_INT_COLUMNS = ("seed", "size", "n", "n_seeds", "seeds_positive",
                "layer", "head", "num_seeds", "num_pairs", "prefix_len")  # + wen_attention.csv
_TEXT_COLUMNS = ("site", "method", "split", "breakdown", "bin", "metric", "baseline", "predictor",
                 "label")


def _cell(value):
    """NaN is written as an empty cell (e.g. jsd_p95 on breakdown rows other than `all`)."""
    return "" if isinstance(value, float) and math.isnan(value) else value


def write_csv(rows: Iterable[dict], path: str, columns: Sequence[str] = COLUMNS) -> None:
    """Writes rows atomically (checkpoint.write_atomic), so a crash never leaves half a table."""
    from jaxillusions import checkpoint  # noqa: PLC0415 - orbax is slow to import for readers

    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=columns)
    writer.writeheader()
    writer.writerows({k: _cell(v) for k, v in row.items()} for row in rows)
    checkpoint.write_atomic(path, text.getvalue())


def read_csv(path: str) -> list[dict]:
    """Reads a CSV written by write_csv back: integer and float columns as numbers (empty
    cells as NaN), text columns (site, method, split, breakdown, metric, ...) as strings."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        for key, value in row.items():
            if key in _INT_COLUMNS:
                row[key] = int(value)
            elif key not in _TEXT_COLUMNS:
                row[key] = float(value) if value != "" else math.nan
    return rows


def aggregate(rows: Iterable[dict], breakdown: str = "all") -> dict[tuple, dict]:
    """Mean and 95% interval half-width over seeds.

    Returns {(site, method, size, split, bin): {metric: (mean, ci95, num_seeds)}}.
    """
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for row in rows:
        if row["breakdown"] == breakdown:
            groups[(row["site"], row["method"], row["size"], row["split"], row["bin"])].append(row)
    out = {}
    for key, group in groups.items():
        out[key] = {}
        for m in ("jsd", "same_pred", "acc_original", "acc_proxy", "jsd_p95", "jsd_p99"):
            values = np.array([r.get(m, np.nan) for r in group], dtype=np.float64)
            mean, ci = metrics.mean_ci95(values)
            out[key][m] = (float(mean), float(ci), len(values))
    return out


def _verdict(row: dict) -> int:
    """+1 / -1 when the 95% interval lies above / below zero, 0 when it covers zero."""
    return 1 if row["ci_low"] > 0 else -1 if row["ci_high"] < 0 else 0


def _interval_cell(row: dict, value: str, digits: int) -> str:
    mark = "*" if _verdict(row) else " "
    return (f"{row[value]:+.{digits}f} [{row['ci_low']:+.{digits}f},{row['ci_high']:+.{digits}f}]"
            f"{mark}{row['seeds_positive']:>3}/{row['n_seeds']:<3}")


def _cell_width(digits: int) -> int:
    """Width of a gap cell: the mean and its interval, e.g. '+0.012 [+0.004, +0.020]*'."""
    return 2 * (digits + 2) + 4 + (digits + 3) + 8


def _gap_cells(gap_rows: Sequence[dict | None], digits: int) -> tuple[list[str], float | None]:
    """One cell per OOD split ('-' where it has no row) and the baseline mean they share."""
    cells, base = [], None
    for row in gap_rows:
        if row is None:
            cells.append(f"  {'-':<{_cell_width(digits)}}")
            continue
        base = row["baseline_mean"]
        cells.append(f"  {_interval_cell(row, 'gap', digits):<{_cell_width(digits)}}")
    return cells, base


def _label(method: str, size: int) -> str:
    return "-" if size == 0 else str(size)  # size 0: a data-independent proxy


def gap_table(gap_rows: Sequence[dict], splits: Sequence[str], metric: str = "same_pred",
              baseline: str = "iid") -> str:
    """Text table from `stats.gaps` rows: the baseline's mean and, per split, the mean paired gap
    with its Student-t 95% interval, '*' when the interval excludes 0, and the number of seeds
    with a positive gap (positive = less faithful on that split)."""
    digits = 3 if metric in ("same_pred", "acc_proxy") else 4
    by_key = {(r["site"], r["method"], r["size"], r["split"]): r for r in gap_rows
              if r["metric"] == metric and r["baseline"] == baseline}
    keys = sorted({k[:3] for k in by_key}, key=lambda k: (k[1], k[0], k[2]))
    width = _cell_width(digits)
    header = (f"{'method':<18} {'site':<34} {'size':>4}  {baseline + ' ' + metric:>18}"
              + "".join(f"  {'gap ' + s:<{width}}" for s in splits))
    lines = [header, "-" * len(header)]
    for site, method, size in keys:
        cells, base_mean = _gap_cells(
            [by_key.get((site, method, size, split)) for split in splits], digits)
        if base_mean is not None:
            lines.append(f"{method:<18} {site:<34} {_label(method, size):>4}  "
                         f"{base_mean:>18.{digits}f}" + "".join(cells))
    return "\n".join(lines)


def _listing(rows: Sequence[dict], value: str, digits: int, limit: int = 40) -> list[str]:
    out = [f"  {r['method']:<18} {r['site']:<34} {_label(r['method'], r['size']):>4}  "
           f"{r['split']:<17} {_interval_cell(r, value, digits)}" for r in rows[:limit]]
    if len(rows) > limit:
        out.append(f"  ... {len(rows) - limit} more")
    return out


def bin_gaps(rows: Sequence[dict], breakdown: str, labels: Sequence[str], baseline: str = "iid",
             metrics: Sequence[str] = ("same_pred", "jsd")) -> list[dict]:
    """stats.gaps of each bin of `breakdown` (its rows taken as if they were `all` rows), with
    columns BIN_GAP_COLUMNS: the paired gap per (bin, site, method, size, split, metric)."""
    by_bin: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        if r["breakdown"] == breakdown:
            by_bin[str(r["bin"])].append({**r, "breakdown": "all"})
    out = []
    for b in sorted(by_bin, key=int):
        out += [{"breakdown": breakdown, "bin": int(b), "label": labels[int(b)], **g}
                for g in stats.gaps(by_bin[b], baseline=baseline, metrics=metrics)]
    return out


def middle_size(sizes: Iterable[int]) -> int:
    """The size a table or figure shows for a proxy family: the middle of its sorted sizes."""
    sizes = sorted(sizes)
    return sizes[len(sizes) // 2]


def bin_gap_table(gap_rows: Sequence[dict], splits: Sequence[str], metric: str = "same_pred"
                  ) -> str:
    """Text table of `bin_gaps` rows: per proxy family (at its middle size) one line per bin,
    the baseline's mean and per OOD split the paired gap with its interval (as gap_table)."""
    digits = 3 if metric == "same_pred" else 4
    width = _cell_width(digits)
    rows = [g for g in gap_rows if g["metric"] == metric]
    by_key = {(g["site"], g["method"], g["size"], g["label"], g["split"]): g for g in rows}
    labels = list(dict.fromkeys(g["label"] for g in sorted(rows, key=lambda g: g["bin"])))
    families = sorted({(g["method"], g["site"]) for g in rows})
    baseline = rows[0]["baseline"] if rows else "iid"
    header = (f"{'method':<18} {'site':<34} {'size':>4} {'bin':<18} "
              f"{baseline + ' ' + metric:>16}" + "".join(f"  {'gap ' + s:<{width}}"
                                                         for s in splits))
    lines = [header, "-" * len(header)]
    for method, site in families:
        size = middle_size({g["size"] for g in rows if (g["method"], g["site"]) == (method, site)})
        for label in labels:
            cells, base = _gap_cells(
                [by_key.get((site, method, size, label, split)) for split in splits], digits)
            if base is not None:
                lines.append(f"{method:<18} {site:<34} {_label(method, size):>4} {label:<18} "
                             f"{base:>16.{digits}f}" + "".join(cells))
    return "\n".join(lines)


def statistics_report(rows: Sequence[dict], splits: Sequence[str], baseline: str = "iid",
                      evaluated: str = "closing-bracket",
                      by_bin: dict[str, Sequence[str]] | None = None,
                      data_baselines: dict[str, dict[str, float]] | None = None
                      ) -> tuple[str, dict[str, list[dict]]]:
    """The population report: gap_table.txt's text and the tables behind it.

    Returns (text, {"gaps": ..., "proxy_vs_original": ..., "id_predicts_gap": ...,
    "min_size": ..., and "gaps_by_<breakdown>" for each breakdown of `by_bin` (its bin
    labels)}); the main job writes each table as <name>.csv. `evaluated` names the evaluated
    positions; `data_baselines` ({split: {metric: value}}, data-only predictors such as a unigram
    model) are printed beside the original model's accuracy.
    """
    if baseline not in splits:
        raise ValueError(f"proxies.gap_baseline={baseline!r} is not an evaluated split "
                         f"(proxies.eval_splits={tuple(splits)})")
    baselines = [baseline] + [b for b in stats.BASELINES if b != baseline and b in splits]
    gap_rows = [g for b in baselines for g in stats.gaps(rows, baseline=b)]
    versus = stats.proxy_vs_original(rows)
    correlation = stats.id_predicts_gap(rows, baseline=baseline)
    min_size = stats.min_sizes(rows)
    ood = [s for s in splits if s not in stats.BASELINES]
    seeds = sorted({r["seed"] for r in rows})
    accuracy = original_accuracy(rows)

    text = [f"Population: {len(seeds)} seeds. Every comparison is paired over the seeds present "
            "in both conditions: [lo,hi] is the Student-t 95% interval of the mean per-seed "
            "difference,", "* marks an interval that excludes 0, k/n counts the seeds with a "
            "positive difference. Bootstrap intervals are in the CSV files.", "",
            f"Original model, {evaluated} accuracy (mean ± 95% CI over seeds):",
            "  " + ", ".join(f"{s} {accuracy[s][0]:.3f}±{accuracy[s][1]:.3f}"
                             for s in splits if s in accuracy), ""]
    if data_baselines:
        names = list(dict.fromkeys(m for b in data_baselines.values() for m in b))
        text[-1:-1] = ["Data-only baselines (from training-split counts): " + ", ".join(
            f"{s} " + " ".join(f"{m} {data_baselines[s][m]:.3f}" for m in names)
            for s in splits if s in data_baselines)]
    for metric, sign in (("same_pred", f"{baseline} minus split"),
                         ("jsd", f"split minus {baseline}"),
                         ("jsd_p99", f"split minus {baseline}")):
        text += [f"Generalization gap in {metric} ({sign}; positive = less faithful out of "
                 f"distribution; baseline `{baseline}`):",
                 gap_table(gap_rows, ood, metric, baseline), ""]
    if len(baselines) > 1:
        other = baselines[1]
        by_key = {(g["site"], g["method"], g["size"], g["split"], g["metric"], g["baseline"]): g
                  for g in gap_rows}
        compared = [g for g in gap_rows if g["baseline"] == baseline and g["split"] in ood
                    and g["metric"] in ("same_pred", "jsd")]
        differ = []
        for g in compared:
            h = by_key.get((g["site"], g["method"], g["size"], g["split"], g["metric"], other))
            if h is not None and _verdict(g) != _verdict(h):
                differ.append((g, h))
        text += [f"Baselines: gaps against `{other}` (training sentences allowed) where the "
                 f"verdict differs from `{baseline}` ({len(differ)} of {len(compared)} "
                 "same_pred/jsd gaps; all in gaps.csv):"]
        for g, h in differ[:40]:
            digits = 3 if g["metric"] == "same_pred" else 4
            text.append(f"  {g['metric']:<9} {g['method']:<18} {g['site']:<34} "
                        f"{_label(g['method'], g['size']):>4}  {g['split']:<17} "
                        f"vs {baseline}: {_interval_cell(g, 'gap', digits)}  "
                        f"vs {other}: {_interval_cell(h, 'gap', digits)}")
        if len(differ) > 40:
            text.append(f"  ... {len(differ) - 40} more")
        text.append("")
    better = sorted((v for v in versus if _verdict(v) > 0), key=lambda v: -v["diff"])
    worse = [v for v in versus if _verdict(v) < 0]
    text += [f"Where the proxy beats the original: acc_proxy - acc_original > 0 with the 95% "
             f"interval above 0 ({len(better)} of {len(versus)} (proxy, size, split); "
             f"{len(worse)} are below 0; all in proxy_vs_original.csv):"]
    text += _listing(better, "diff", 4) or ["  none"]
    text.append("")
    detected = [c for c in correlation if c["metric"] == "same_pred"
                and np.isfinite(c["rho_low"]) and (c["rho_low"] > 0 or c["rho_high"] < 0)]
    tested = [c for c in correlation if c["metric"] == "same_pred" and np.isfinite(c["rho"])]
    predictor = correlation[0]["predictor"] if correlation else baseline
    text += [f"Does in-distribution faithfulness predict the OOD gap? Spearman rho across seeds "
             f"between same_pred on `{predictor}` and the same_pred gap (bootstrap 95% interval):"
             f" {len(detected)} of {len(tested)} (proxy, size, split) have an interval excluding"
             " 0 (all in id_predicts_gap.csv):"]
    for c in sorted(detected, key=lambda c: -abs(c["rho"]))[:40]:
        text.append(f"  {c['method']:<18} {c['site']:<34} {_label(c['method'], c['size']):>4}  "
                    f"{c['split']:<17} rho {c['rho']:+.2f} [{c['rho_low']:+.2f},"
                    f"{c['rho_high']:+.2f}]  rho(id, ood) {c['rho_ood']:+.2f} "
                    f"[{c['rho_ood_low']:+.2f},{c['rho_ood_high']:+.2f}]  n={c['n_seeds']}")
    text.append("")
    dist = stats.min_size_distribution(min_size)
    text += ["Smallest size (rank or k) whose same_pred reaches 0.99, distribution over seeds "
             "(size: seeds; never = no evaluated size does; all in min_size.csv):"]
    for (site, method, split), d in sorted(dist.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        counts = " ".join(f"{k}:{v}" for k, v in d["counts"].items())
        median = "never" if np.isinf(d["median"]) else f"{d['median']:g}"
        text.append(f"  {method:<8} {site:<34} {split:<17} median {median:>5}  {counts}")
    tables = {"gaps": gap_rows, "proxy_vs_original": versus, "id_predicts_gap": correlation,
              "min_size": min_size}
    for breakdown, labels in (by_bin or {}).items():
        table = bin_gaps(rows, breakdown, labels, baseline)
        tables[f"gaps_by_{breakdown}"] = table
        text += ["", f"Generalization gap in same_pred by {breakdown} ({baseline} minus split; "
                 f"each proxy at its middle size; all sizes and jsd in gaps_by_{breakdown}.csv):",
                 bin_gap_table(table, ood)]
    return "\n".join(text), tables


def original_accuracy(rows: Sequence[dict]) -> dict[str, tuple[float, float]]:
    """The original model's closing-bracket accuracy per split (mean, ci95 over seeds)."""
    per_split: dict[str, dict[int, float]] = defaultdict(dict)
    for row in rows:
        if row["breakdown"] == "all":
            per_split[row["split"]][row["seed"]] = row["acc_original"]
    return {split: tuple(float(v) for v in metrics.mean_ci95(np.array(list(seeds.values()))))
            for split, seeds in per_split.items()}
