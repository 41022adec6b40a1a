"""Tidy result tables: the CSV, seed aggregates with 95% intervals, the generalization-gap table."""

from __future__ import annotations

import csv
import math
import os
from collections import defaultdict
from collections.abc import Iterable, Sequence

import numpy as np

from jaxillusions import metrics

COLUMNS = ("seed", "site", "method", "size", "split", "breakdown", "bin", "n", "jsd",
           "same_pred", "acc_original", "acc_proxy", "jsd_p95", "jsd_p99")
_INT_COLUMNS = ("seed", "size", "n", "n_seeds", "seeds_positive")


def _cell(value):
    """NaN is written as an empty cell (e.g. jsd_p95 on breakdown rows other than `all`)."""
    return "" if isinstance(value, float) and math.isnan(value) else value


def write_csv(rows: Iterable[dict], path: str, columns: Sequence[str] = COLUMNS) -> None:
    """Writes rows atomically (a temp file, then rename), so a crash never leaves half a table."""
    tmp = path + ".tmp"
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows({k: _cell(v) for k, v in row.items()} for row in rows)
    os.replace(tmp, path)


def read_csv(path: str) -> list[dict]:
    """Reads a CSV written by write_csv back: integer and float columns as numbers (empty
    cells as NaN), text columns (site, method, split, breakdown, metric, ...) as strings."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        for key, value in row.items():
            if key in _INT_COLUMNS:
                row[key] = int(value)
            elif key not in ("site", "method", "split", "breakdown", "bin", "metric",
                             "baseline", "predictor"):
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
        for m in ("jsd", "same_pred", "acc_original", "acc_proxy"):
            values = np.array([r[m] for r in group], dtype=np.float64)
            mean, ci = metrics.mean_ci95(values)
            out[key][m] = (float(mean), float(ci), len(values))
    return out


def gap_table(rows: Sequence[dict], splits: Sequence[str], metric: str = "same_pred",
              reference: str = "iid") -> str:
    """Text table: the reference split's faithfulness and, per OOD split, reference minus it.

    A positive gap means the proxy is less faithful out of distribution (for JSD, where lower is
    more faithful, the sign is flipped so that positive still means less faithful).
    """
    agg = aggregate(rows)
    sign = -1.0 if metric == "jsd" else 1.0
    keys = sorted({(k[0], k[1], k[2]) for k in agg}, key=lambda k: (k[1], k[0], k[2]))
    ood = [s for s in splits if s != reference]
    header = (f"{'method':<18} {'site':<34} {'size':>4}  {reference + ' ' + metric:>14}"
              + "".join(f"  {'gap ' + s:>22}" for s in ood))
    lines = [header, "-" * len(header)]
    for site, method, size in keys:
        ref = agg.get((site, method, size, reference, ""))
        if ref is None:
            continue
        ref_mean = ref[metric][0]
        cells = []
        for split in ood:
            other = agg.get((site, method, size, split, ""))
            if other is None:
                cells.append(f"  {'-':>22}")
                continue
            gap = sign * (ref_mean - other[metric][0])
            cells.append(f"  {gap:>+13.3f} ±{other[metric][1]:.3f}  ")
        label = "-" if method.endswith("attention") else str(size)
        lines.append(f"{method:<18} {site:<34} {label:>4}  {ref_mean:>14.3f}" + "".join(cells))
    return "\n".join(lines)


def original_accuracy(rows: Sequence[dict]) -> dict[str, tuple[float, float]]:
    """The original model's closing-bracket accuracy per split (mean, ci95 over seeds)."""
    per_split: dict[str, dict[int, float]] = defaultdict(dict)
    for row in rows:
        if row["breakdown"] == "all":
            per_split[row["split"]][row["seed"]] = row["acc_original"]
    return {split: tuple(float(v) for v in metrics.mean_ci95(np.array(list(seeds.values()))))
            for split, seeds in per_split.items()}
