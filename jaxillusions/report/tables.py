"""Tidy result tables: the CSV, seed aggregates with 95% intervals, the generalization-gap table."""

from __future__ import annotations

import csv
import io
import itertools
import math
import textwrap
from collections import defaultdict
from collections.abc import Iterable, Sequence

import numpy as np

from jaxillusions.report import stats
from jaxillusions.report.proxy_sizes import identical_sizes, middle_size
from jaxillusions.report.proxy_sizes import label as _label
from jaxillusions.runtime import schema

STAT_COLUMNS = {"gaps": stats.GAP_COLUMNS, "proxy_vs_original": stats.PROXY_COLUMNS,
                "id_predicts_gap": stats.CORRELATION_COLUMNS, "min_size": stats.MIN_SIZE_COLUMNS}
# gaps_by_<breakdown>.csv: the paired gaps of one bin of a labelled breakdown (code: category)
BIN_GAP_COLUMNS = ("breakdown", "bin", "label") + stats.GAP_COLUMNS
_INT_COLUMNS = ("seed", "size", "n", "n_seeds", "seeds_positive",
                "layer", "head", "num_seeds", "num_pairs", "prefix_len")  # + wen_attention.csv
_TEXT_COLUMNS = ("site", "method", "split", "breakdown", "bin", "metric", "baseline", "predictor",
                 "label", "fit_split", "part",  # these two: studies/fit_shift.py
                 "category")  # induction_ablation.csv (tasks/code_completion/copying.py)


def write_csv(rows: Iterable[dict], path: str, columns: Sequence[str] = schema.ROW) -> None:
    """Writes rows atomically (checkpoint.write_atomic), so a crash never leaves half a table.
    A column a row lacks is an empty cell, and so is NaN (e.g. jsd_p95 on breakdown rows other
    than `all`); a key that is not a column is a ValueError, as csv.DictWriter's."""
    from jaxillusions.runtime import checkpoint  # noqa: PLC0415 - orbax is slow to import for readers

    names = frozenset(columns)

    def cells(row: dict) -> list:
        if not names.issuperset(row):
            raise ValueError(f"{path}: row keys {sorted(row.keys() - names)} are not columns")
        return ["" if isinstance(v, float) and v != v else v  # v != v: NaN
                for v in map(row.get, columns, itertools.repeat(""))]

    text = io.StringIO()
    writer = csv.writer(text)
    writer.writerow(columns)
    writer.writerows(map(cells, rows))
    checkpoint.write_atomic(path, text.getvalue())


def read_csv(path: str) -> list[dict]:
    """Reads a CSV written by write_csv back: integer and float columns as numbers (empty
    cells as NaN), text columns (site, method, split, breakdown, metric, ...) as strings."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        for key, value in row.items():
            if key in _INT_COLUMNS or (key == "bin" and value.lstrip("-").isdigit()):
                row[key] = int(value)  # a bin of results.csv: an int, "" on `all` rows
            elif key not in _TEXT_COLUMNS:
                row[key] = float(value) if value != "" else math.nan
    return rows


def aggregate(rows: Iterable[dict], breakdown: str = "all") -> dict[tuple, dict]:
    """Mean and 95% interval over seeds of every metric (all lie in [0, 1]: stats.bounded_interval,
    Student-t on the logit scale; schema.PROPORTIONS as shares of the row's n positions).

    Returns {(site, method, size, split, bin): {metric: (mean, low, high, num_seeds)}}.
    """
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for row in rows:
        if row["breakdown"] == breakdown:
            groups[(row["site"], row["method"], row["size"], row["split"], row["bin"])].append(row)
    out = {}
    for key, group in groups.items():
        n = np.array([r["n"] for r in group], np.float64)  # a proportion's positions
        out[key] = {m: (*stats.bounded_interval([r.get(m, np.nan) for r in group],
                                                counts=n if m in schema.PROPORTIONS else None),
                        len(group)) for m in schema.ROW[len(schema.KEYS):]}
    return out


def _verdict(row: dict) -> int:
    """stats.verdict: +1 / -1 when the 95% interval lies above / below zero by more than the
    metric's resolution, else 0 (proxy_vs_original rows: the resolution of a proportion)."""
    return stats.verdict(row, row.get("metric", "diff"))


def _exact(row: dict, value: str) -> bool:
    """Every seed's difference is exactly 0 (e.g. a full-rank SVD: the original model itself)."""
    return row["n_seeds"] > 1 and row[value] == row["ci_low"] == row["ci_high"] == 0


def _interval_cell(row: dict, value: str, digits: int, counts: bool = True) -> str:
    """'+0.081 [+0.020,+0.142]* 4/4': mean, 95% t interval, '*' when it excludes 0 by more than
    the resolution, seeds with a positive difference; '0 (exact)' when every seed's is 0."""
    tail = f"{row['seeds_positive']:>3}/{row['n_seeds']:<3}" if counts else ""
    if _exact(row, value):
        return f"{'0 (exact)':<{3 * (digits + 3) + 5}}{tail}"
    if math.isnan(row["ci_low"]):  # one seed, or the same value in every seed: no interval
        why = "one seed" if row["n_seeds"] < 2 else "in every seed"
        return f"{f'{row[value]:+.{digits}f} ({why})':<{3 * (digits + 3) + 5}}{tail}"
    mark = "*" if _verdict(row) else " "
    return (f"{row[value]:+.{digits}f} [{row['ci_low']:+.{digits}f},{row['ci_high']:+.{digits}f}]"
            f"{mark}{tail}")


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


def rho_cell(rho: float, low: float, high: float) -> str:
    """'rho [low,high]', or 'rho [n too small]' where the bootstrap interval is undefined
    (below stats.MIN_BOOTSTRAP_SEEDS seeds)."""
    interval = "n too small" if np.isnan(low) else f"{low:+.2f},{high:+.2f}"
    return f"{rho:+.2f} [{interval}]"


_COMPONENTS = ("embed", "pos_embed", "resid_pre", "q", "k", "v", "pattern", "z", "attn_out",
               "resid_mid", "mlp_in", "pre", "post", "mlp_out", "resid_post")


def site_key(site: str) -> tuple:
    """Model order of a site: by layer, single sites before '+'-joined ones, then by component
    in forward order (q, k, v, pattern, z, ...): blocks.1.attn.q < blocks.1.attn.k <
    blocks.1.attn.q+blocks.1.attn.k. Unknown components sort by name after the known ones, and
    sites that tie (circuit.edge.mean, circuit.node.mean) by name: a total order."""
    parts = [p for p in site.split("+") if p]
    layers, comps = [], []
    for part in parts:
        pieces = part.split(".")
        layers.append(int(pieces[1]) if len(pieces) > 1 and pieces[1].lstrip("-").isdigit()
                      else -1)
        name = pieces[-1].removeprefix("hook_")
        comps.append((_COMPONENTS.index(name), "") if name in _COMPONENTS
                     else (len(_COMPONENTS), name))
    return (max(layers, default=-1), len(parts), comps, site)


def row_order(methods: Sequence[str], splits: Sequence[str] = ()):
    """Sort key for table rows: methods as configured (`methods`, the order of the result rows),
    sites in model order (`site_key`), sizes ascending, then splits as evaluated."""
    method_at = {m: i for i, m in enumerate(methods)}
    split_at = {s: i for i, s in enumerate(splits)}

    def key(row: dict) -> tuple:
        return (method_at.get(row["method"], len(method_at)), row["method"],
                site_key(row["site"]), row["size"], split_at.get(row.get("split"), len(split_at)),
                str(row.get("split", "")))
    return key


def gap_table(gap_rows: Sequence[dict], splits: Sequence[str], metric: str = "same_pred",
              baseline: str = "iid", methods: Sequence[str] = ()) -> str:
    """Text table from `stats.gaps` rows: the baseline's mean and, per split, the mean paired gap
    with its Student-t 95% interval, '*' when the interval excludes 0 by more than the metric's
    resolution (stats.RESOLUTION), '0 (exact)' when every seed's gap is 0, and the number of
    seeds with a positive gap (positive = less faithful on that split). Rows: `methods` in that
    order (then any others by name), sites in model order, sizes ascending."""
    digits = 3 if metric in ("same_pred", "acc_proxy") else 4
    by_key = {(r["site"], r["method"], r["size"], r["split"]): r for r in gap_rows
              if r["metric"] == metric and r["baseline"] == baseline}
    order = row_order(methods)
    keys = sorted({k[:3] for k in by_key},
                  key=lambda k: order({"site": k[0], "method": k[1], "size": k[2]}))
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


def bin_gap_table(gap_rows: Sequence[dict], splits: Sequence[str], metric: str = "same_pred",
                  methods: Sequence[str] = ()) -> str:
    """Text table of `bin_gaps` rows: per proxy family (at its middle size) one line per bin,
    the baseline's mean and per OOD split the paired gap with its interval (as gap_table)."""
    digits = 3 if metric == "same_pred" else 4
    width = _cell_width(digits)
    rows = [g for g in gap_rows if g["metric"] == metric]
    by_key = {(g["site"], g["method"], g["size"], g["label"], g["split"]): g for g in rows}
    labels = list(dict.fromkeys(g["label"] for g in sorted(rows, key=lambda g: g["bin"])))
    order = row_order(methods)
    families = sorted({(g["method"], g["site"]) for g in rows},
                      key=lambda f: order({"method": f[0], "site": f[1], "size": 0}))
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


FAITHFUL = 0.99  # the headline's "faithful in distribution": baseline same_pred >= this
HEADLINE_LINES = 18


def _faithful_size(gap_rows: Sequence[dict], method: str, site: str, baseline: str,
                   identical: set[int] = frozenset()) -> tuple[int, float, bool] | None:
    """(size, baseline same_pred, reached): the smallest size whose mean same_pred on the
    baseline reaches FAITHFUL (reached False: none does; the largest size instead). Sizes in
    `identical` (the original model itself, e.g. full rank) are not candidates."""
    means = {g["size"]: g["baseline_mean"] for g in gap_rows
             if (g["method"], g["site"], g["metric"], g["baseline"]) ==
             (method, site, "same_pred", baseline) and g["size"] not in identical}
    if not means:
        return None
    reached = [size for size, m in means.items() if m >= FAITHFUL]
    size = min(reached) if reached else max(means)
    return size, means[size], bool(reached)


def _accuracy_cells(accuracy: dict[str, tuple[float, float, float]],
                    splits: Sequence[str]) -> list[str]:
    """'split mean [low,high]' for each split of `accuracy`, in the order of `splits`."""
    return [f"{s} {accuracy[s][0]:.3f} [{accuracy[s][1]:.3f},{accuracy[s][2]:.3f}]"
            for s in splits if s in accuracy]


def _join(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _significant(rows: Sequence[dict], column: str) -> tuple[int, int]:
    """(how many of `rows` have the p-value `column` below 0.05, how many have it defined)."""
    defined = [r for r in rows if np.isfinite(r[column])]
    return sum(r[column] < 0.05 for r in defined), len(defined)


def _below(value: float, threshold: float) -> str:
    """`value` (under `threshold`) to 3 decimals, or as many more as it takes not to read as
    the threshold (0.98985 is 0.9899 beside 'never 0.99', not 0.990); 6 at most."""
    digits = 3
    while digits < 6 and round(value, digits) >= threshold:
        digits += 1
    return f"{value:.{digits}f}"


def headline(stat_tables: dict[str, Sequence[dict]],
             accuracy: dict[str, tuple[float, float, float]], splits: Sequence[str],
             methods: Sequence[str], baseline: str = "iid", evaluated: str = "closing-bracket",
             identical: dict[tuple[str, str], set[int]] | None = None,
             in_distribution: Sequence[str] = ("iid",)) -> list[str]:
    """The summary at the top of gap_table.txt (at most HEADLINE_LINES lines): seed count, the
    original model's accuracy per split, per proxy method (its first site in model order that
    is not the original model at every size: those are named in one line) the same_pred gap at
    the smallest size faithful on `baseline` (seed-mean same_pred >= FAITHFUL; the largest
    size, marked 'never 0.99', when none is) on each OOD split, and one sentence per method
    saying where it is less faithful than on `baseline` (a positive gap), where more (a
    negative one), on how many seeds, and where no gap is shown (sizes by proxy_sizes.label);
    at most 5 methods, fewer where the lines after them need the room, then a line naming the
    rest. `stat_tables`: statistics_report's "gaps", "proxy_vs_original" and
    "id_predicts_gap". `identical`: {(method, site): sizes whose rows equal the original's}
    (identical_sizes).
    `in_distribution`: the task's in-distribution splits (not reported as OOD)."""
    gap_rows, versus = stat_tables["gaps"], stat_tables["proxy_vs_original"]
    correlation = stat_tables["id_predicts_gap"]
    identical = identical or {}
    ood = [s for s in splits if s not in in_distribution]
    res = stats.RESOLUTION["same_pred"]
    rows = [g for g in gap_rows if g["baseline"] == baseline]
    n_seeds = max((g["n_seeds"] for g in rows), default=0)
    seeds = ("1 seed, so no interval over seeds (nan: it takes 2 or more)" if n_seeds == 1
             else f"{n_seeds} seeds")
    lines = [f"SUMMARY, {seeds}. Gap = same_pred on {baseline} minus on the split "
             f"(> 0: less faithful OOD), mean [paired 95% t interval]; * = beyond ±{res:g}.",
             f"Original model, {evaluated} accuracy, mean [95% logit-t interval over seeds]:",
             # Wrapped between splits only (no break inside 'split mean [low,high]').
             *(line.replace("\xa0", " ") for line in textwrap.wrap(
                 ", ".join(c.replace(" ", "\xa0") for c in _accuracy_cells(accuracy, splits)),
                 120, initial_indent="  ", subsequent_indent="  "))]
    order = row_order(methods)
    families = sorted({(g["method"], g["site"]) for g in rows},
                      key=lambda f: order({"method": f[0], "site": f[1], "size": 0}))
    chosen, original = [], []  # a method's first site with a size to offer; those without
    for method, site in families:
        found = _faithful_size(rows, method, site, baseline, identical.get((method, site), set()))
        if found is None:  # every size is the original model itself: said in one line
            original.append(f"{method} on {site} at size " + ", ".join(
                _label(method, size) for size in sorted(identical[method, site])))
        elif method not in (c[0] for c in chosen):
            chosen.append((method, site, *found))
    def label(method, site, size, base, reached) -> str:
        short = site.split(".")[-1] if "+" not in site else "+".join(
            p.split(".")[-1] for p in site.split("+"))
        note = (f"({base:.3f})" if reached or size == 0
                else f"({_below(base, FAITHFUL)}, never {FAITHFUL:g})")
        return f"{method} {short}" + ("" if size == 0 else f" {_label(method, size)}") + " " + note

    # At most 5 methods, and as many as leave room for the lines after them: the correlation,
    # the proxy-versus-original count and a line naming the methods left to the full tables.
    tested = [c for c in correlation if c["metric"] == "same_pred" and np.isfinite(c["p_value"])]
    count = min(5, len(chosen))  # each method: a row and a sentence; then the column header
    while count and (len(lines) + 1 + 2 * count + (count < len(chosen)) + bool(tested)
                     + bool(versus) + bool(original)) > HEADLINE_LINES:
        count -= 1
    shown = chosen[:count]
    # The label column fits the longest label (a long one, e.g. a transcoder's, not run on).
    width = max(34, *(len(label(*c)) + 1 for c in shown)) if shown else 34
    cell = 25
    lines.append(f"{'proxy, size (' + baseline + ' same_pred)':<{width}}"
                 + "".join(f"{s:<{cell}}" for s in ood).rstrip())
    by_key = {(g["method"], g["site"], g["size"], g["split"]): g for g in rows
              if g["metric"] == "same_pred"}
    sentences = []
    for method, site, size, base, reached in shown:
        cells = []
        found, better, same, missed = [], [], [], []
        for split in ood:
            g = by_key.get((method, site, size, split))
            if g is None:
                cells.append(f"{'-':<{cell}}")
                continue
            cells.append(f"{_interval_cell(g, 'gap', 3, counts=False):<{cell}}")
            if _verdict(g) > 0:
                found.append(f"{split} ({g['seeds_positive']}/{g['n_seeds']} seeds)")
            elif _verdict(g) < 0:  # the split's same_pred above the baseline's
                better.append(f"{split} ({g['n_seeds'] - g['seeds_positive']}/{g['n_seeds']} "
                              "seeds not positive)")
            elif math.isnan(g["ci_low"]) and g["n_seeds"] > 1 and abs(g["gap"]) > res:
                same.append(f"{split} ({g['gap']:+.3f})")
            else:
                missed.append(split)
        lines.append(f"{label(method, site, size, base, reached):<{width}}"
                     + "".join(cells).rstrip())
        what = f"{method} on {site}" + ("" if size == 0 else f" at size {_label(method, size)}")
        clauses = [f"{word} faithful than on {baseline} on {_join(where)}"
                   for word, where in (("less", found), ("more", better)) if where]
        if same:  # no spread, so no interval
            clauses.append(f"off by the same gap in every seed, so no interval, on {_join(same)}")
        if clauses:
            sentence = f"{what} is " + "; ".join(clauses)
            sentence += f"; no gap beyond ±{res:g} shown on {_join(missed)}." if missed else "."
        else:
            sentence = (f"{what}: no gap beyond ±{res:g} shown on any OOD split ({n_seeds} "
                        f"seed{'s' if n_seeds != 1 else ''}).")
        sentences.append(sentence)
    lines += sentences
    if len(shown) < len(chosen):
        rest = [c[0] for c in chosen[len(shown):]]
        lines.append(f"(and {len(rest)} more method{'s' * (len(rest) > 1)} in the full tables: "
                     f"{', '.join(rest)})")
    if original:
        lines.append("The original model itself at every size, so no gap to show (the same "
                     f"predictions, accuracy and JSD): {'; '.join(original)}.")
    if tested:
        smallest = min(c["p_value"] for c in tested)
        (low, _), (model, n_model), (partial, n_partial) = (
            _significant(tested, c) for c in ("p_value", "p_model", "p_partial"))
        beside = (f"; the original model's own accuracy on {tested[0]['predictor']}, no proxy: "
                  f"{model} of {n_model}" if n_model else "")
        beside += (f"; faithfulness beyond that accuracy (partial): {partial} of {n_partial}"
                   if n_partial else "")
        lines.append(f"ID faithfulness predicting the gap (Spearman, permutation p): {low} of "
                     f"{len(tested)} have p < 0.05 (~{0.05 * len(tested):.0f} expected by chance;"
                     f" smallest p {smallest:.3f} at n = {tested[0]['n_seeds']}){beside}.")
    if versus:
        lines.append(f"The proxy beats the original model's accuracy (interval above +"
                     f"{stats.RESOLUTION['diff']:g}) in {sum(_verdict(v) > 0 for v in versus)} "
                     f"of {len(versus)} (proxy, size, split); the full tables follow.")
    return lines


def statistics_report(rows: Sequence[dict], splits: Sequence[str], baseline: str = "iid",
                      evaluated: str = "closing-bracket",
                      by_bin: dict[str, Sequence[str]] | None = None,
                      data_baselines: dict[str, dict[str, float]] | None = None,
                      in_distribution: Sequence[str] = ("iid",)
                      ) -> tuple[str, dict[str, list[dict]]]:
    """The population report: gap_table.txt's text and the tables behind it.

    Returns (text, {"gaps": ..., "proxy_vs_original": ..., "id_predicts_gap": ...,
    "min_size": ..., and "gaps_by_<breakdown>" for each breakdown of `by_bin` (its bin
    labels)}); the main job writes each table as <name>.csv. The text starts with `headline`
    (its first HEADLINE_LINES lines at most, then a blank line), which the main job prints.
    `evaluated` names the evaluated positions; `data_baselines` ({split: {metric: value}},
    data-only predictors such as a unigram model) are printed beside the original model's
    accuracy. `in_distribution`: the task's in-distribution splits (tasks.<name>.IN_DISTRIBUTION):
    gaps are also reported against each of them that was evaluated, and none is an OOD split.
    """
    if baseline not in splits:
        raise ValueError(f"proxies.gap_baseline={baseline!r} is not an evaluated split "
                         f"(proxies.eval_splits={tuple(splits)})")
    methods = list(dict.fromkeys(r["method"] for r in rows))  # as configured
    baselines = [baseline] + [b for b in in_distribution if b != baseline and b in splits]
    order = row_order(methods, splits)
    gap_rows = sorted((g for b in baselines for g in stats.gaps(rows, baseline=b)),
                      key=lambda g: (baselines.index(g["baseline"]), order(g),
                                     stats.GAP_METRICS.index(g["metric"])
                                     if g["metric"] in stats.GAP_METRICS else 99, g["metric"]))
    versus = sorted(stats.proxy_vs_original(rows), key=order)
    correlation = sorted(stats.id_predicts_gap(rows, baseline=baseline,
                                               in_distribution=in_distribution),
                         key=lambda c: (order(c), c["metric"]))
    min_size = stats.min_sizes(rows)
    tables = {"gaps": gap_rows, "proxy_vs_original": versus, "id_predicts_gap": correlation,
              "min_size": min_size}
    ood = [s for s in splits if s not in in_distribution]
    seeds = sorted({r["seed"] for r in rows})
    accuracy = original_accuracy(rows)
    res = stats.RESOLUTION

    identical = identical_sizes(rows)
    text = headline(tables, accuracy, splits, methods, baseline, evaluated, identical,
                    in_distribution)
    text += ["", "=" * 100, "",
             f"Population: {len(seeds)} seeds. Every comparison is paired over the seeds present "
             "in both conditions: [lo,hi] is the Student-t 95% interval of the mean per-seed "
             "difference;",
             f"* marks an interval that excludes 0 by more than the metric's resolution "
             f"(same_pred and accuracies {res['same_pred']:g}, JSD {res['jsd']:g} bits: smaller "
             "differences are not called real; float32 rounding is far below);",
             "'0 (exact)' = every seed's difference is exactly 0; k/n counts the seeds with a "
             "positive difference. Bootstrap intervals (CSV files) only from "
             f"{stats.MIN_BOOTSTRAP_SEEDS} seeds up.", "",
             f"Original model, {evaluated} accuracy (mean [95% interval: Student-t on the logit "
             "scale, inside [0, 1]] over seeds):",
             "  " + ", ".join(_accuracy_cells(accuracy, splits)), ""]
    if data_baselines:
        names = list(dict.fromkeys(m for b in data_baselines.values() for m in b))
        text[-1:-1] = ["Data-only baselines (from training-split counts): " + ", ".join(
            f"{s} " + " ".join(f"{m} {data_baselines[s][m]:.3f}" for m in names)
            for s in splits if s in data_baselines)]
    undefined = stats.undefined_cells(rows, gap_rows, baseline)
    if undefined:
        text += ["Undefined cells, empty in results.csv: no gap uses them; a gap pairs only "
                 "the seeds defined on both sides (its n_seeds in gaps.csv):"] + [
            f"  {metric} undefined in {u['undefined']} of {u['cells']} cells (seed, proxy, "
            f"size, split): {stats.UNDEFINED_WHY[metric]}; {u['fewer_seeds']} gaps over fewer "
            f"seeds, {u['no_gap']} comparisons without a gap (no seed defined on both)."
            for metric, u in undefined.items()] + [""]
    for metric, sign in (("same_pred", f"{baseline} minus split"),
                         ("jsd", f"split minus {baseline}"),
                         ("jsd_p99", f"split minus {baseline}")):
        text += [f"Generalization gap in {metric} ({sign}; positive = less faithful out of "
                 f"distribution; baseline `{baseline}`):",
                 gap_table(gap_rows, ood, metric, baseline, methods), ""]
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
    better = sorted((v for v in versus if _verdict(v) > 0), key=lambda v: (-v["diff"], order(v)))
    worse = [v for v in versus if _verdict(v) < 0]
    text += [f"Where the proxy beats the original: acc_proxy - acc_original with the 95% "
             f"interval above +{res['diff']:g} ({len(better)} of {len(versus)} (proxy, size, "
             f"split); {len(worse)} are below -{res['diff']:g}; all in proxy_vs_original.csv):"]
    text += _listing(better, "diff", 4) or ["  none"]
    text.append("")
    detected = [c for c in correlation if c["metric"] == "same_pred" and c["p_value"] < 0.05]
    tested = [c for c in correlation if c["metric"] == "same_pred" and np.isfinite(c["rho"])]
    predictor = correlation[0]["predictor"] if correlation else baseline
    text += [f"Does in-distribution faithfulness predict the OOD gap? Spearman rho across seeds "
             f"between same_pred on `{predictor}` and the same_pred gap, two-sided permutation "
             f"p-value (exact up to 7 seeds): {len(detected)} of {len(tested)} (proxy, size, "
             f"split) have p < 0.05, about {0.05 * len(tested):.1f} expected by chance alone "
             "(all in id_predicts_gap.csv; bootstrap intervals of rho from "
             f"{stats.MIN_BOOTSTRAP_SEEDS} seeds up)."]
    (model, n_model), (partial, n_partial) = (_significant(tested, c)
                                              for c in ("p_model", "p_partial"))
    if n_model:
        text += [f"The baseline a skeptic asks for first, the original model's own accuracy on "
                 f"`{predictor}` (no proxy) against the same gap: "
                 f"{model} of {n_model} have p < 0.05 "
                 "(`model rho` and `p` on each line; rho_model and p_model in the file). "
                 "What faithfulness tells beyond it, the partial Spearman rho of faithfulness "
                 "and gap given the model's accuracy (Freedman-Lane permutation p): "
                 f"{partial} of {n_partial} have "
                 "p < 0.05 (`partial`; rho_partial and p_partial)."]
    text[-1] += " Those with p < 0.05:"

    for c in sorted(detected, key=lambda c: (c["p_value"], order(c)))[:40]:
        text.append(f"  {c['method']:<18} {c['site']:<34} {_label(c['method'], c['size']):>4}  "
                    f"{c['split']:<17} rho {rho_cell(c['rho'], c['rho_low'], c['rho_high'])} "
                    f"p {c['p_value']:.3f}  rho(id, ood) "
                    f"{rho_cell(c['rho_ood'], c['rho_ood_low'], c['rho_ood_high'])}  "
                    f"n={c['n_seeds']}" + (f"  model rho {c['rho_model']:+.2f} p "
                                           f"{c['p_model']:.3f}" if np.isfinite(c["p_model"])
                                           else "")
                    + (f"  partial rho {c['rho_partial']:+.2f} p {c['p_partial']:.3f}"
                       if np.isfinite(c["p_partial"]) else ""))
    text.append("")
    dist = stats.min_size_distribution(min_size)
    text += ["Smallest size (rank or k) whose same_pred reaches 0.99, distribution over seeds "
             "(size: seeds; never = no evaluated size does; the lower median, an evaluated size;"
             " all in min_size.csv):"]
    for (site, method, split), d in sorted(
            dist.items(), key=lambda kv: order({"method": kv[0][1], "site": kv[0][0],
                                                "size": 0, "split": kv[0][2]})):
        counts = " ".join(f"{k if k == 'never' else _label(method, k)}:{v}"
                          for k, v in d["counts"].items())
        median = "never" if np.isinf(d["median"]) else _label(method, int(d["median"]))
        text.append(f"  {method:<8} {site:<34} {split:<17} lower median {median:>5}  {counts}")
    for breakdown, labels in (by_bin or {}).items():
        table = bin_gaps(rows, breakdown, labels, baseline)
        tables[f"gaps_by_{breakdown}"] = table
        text += ["", f"Generalization gap in same_pred by {breakdown} ({baseline} minus split; "
                 f"each proxy at its middle size; all sizes and jsd in gaps_by_{breakdown}.csv):",
                 bin_gap_table(table, ood, methods=methods)]
    return "\n".join(text), tables


def summary_of(text: str) -> str:
    """The headline of a statistics_report text (what the main job prints): its first block."""
    return text.split("\n\n", 1)[0]


def original_accuracy(rows: Sequence[dict]) -> dict[str, tuple[float, float, float]]:
    """The original model's accuracy per split: (mean, low, high) over seeds, the interval
    stats.bounded_interval (inside [0, 1])."""
    per_split: dict[str, dict[int, tuple[float, int]]] = defaultdict(dict)
    for row in rows:
        if row["breakdown"] == "all":
            per_split[row["split"]][row["seed"]] = row["acc_original"], row["n"]
    return {split: stats.bounded_interval(acc, counts=n) for split, (acc, n) in
            ((s, np.array(list(seeds.values()), np.float64).T) for s, seeds in per_split.items())}
