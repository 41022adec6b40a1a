"""Figures from the tidy result rows (matplotlib, written as PNG; no display needed).

Conventions: colour-blind-safe colours (Okabe & Ito) with a distinct marker per line; a split
has ONE colour and marker in every figure (`split_style`: its place in the configured splits);
panels of sites in model order (`tables.site_key`: q, k, q+k); 95% intervals over seeds as error
bars, inside [0, 1] for proportions and JSD (`stats.bounded_interval`, Student-t on the logit
scale) and paired Student-t intervals for gaps; a proxy size identical to the original model on
every row (e.g. full-rank SVD) is not drawn (the title says so); an SAE's or transcoder's size
codes (several sae_k) against width, one line style per k (`proxy_sizes`); seeds in the
title, on one line; legends outside the axes, text >= 8 pt at the saved size, and no more than
3 panels per row. Rows come from faithfulness.evaluate (or results.read_csv); seeds that
diverged in training have no rows, so they are never drawn.
"""

from __future__ import annotations

import functools
import io
import itertools
import math
import os
import pickle
from collections.abc import Sequence

import numpy as np

from jaxillusions import proxies
from jaxillusions.report import proxy_sizes, tables
from jaxillusions.runtime import cache

# Okabe & Ito (2008), black first; ordered so that neighbours differ in hue (sky blue and blue
# apart: the 3rd and 6th split were hard to tell apart); yellow last (weak on white).
OKABE_ITO = ("#000000", "#E69F00", "#009E73", "#D55E00", "#0072B2", "#CC79A7", "#56B4E9",
             "#F0E442")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
LINESTYLES = ("-", "--", ":", "-.")  # a line per k of a size code (fit-shift: per site and k)
FONT = 9  # pt, at the saved size
DPI = 110


def _pyplot():
    import matplotlib  # noqa: PLC0415 - matplotlib is slow to import; only figures need it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    plt.rcParams.update({"font.size": FONT, "axes.titlesize": FONT, "axes.labelsize": FONT,
                         "xtick.labelsize": 8, "ytick.labelsize": 8, "legend.fontsize": 8,
                         "figure.titlesize": 10})
    return plt


def style(i: int) -> dict:
    """Colour and marker of the i-th line (splits, sizes, methods)."""
    return {"color": OKABE_ITO[i % len(OKABE_ITO)], "marker": MARKERS[i % len(MARKERS)]}


def split_style(split: str, splits: Sequence[str]) -> dict:
    """The colour and marker of a split, the same in every figure: by its place in the
    configured evaluation splits (config.proxies.eval_splits)."""
    return style(list(splits).index(split))


def size_style(i: int) -> dict:
    """The i-th line where each panel is one split (the original model first, then proxy
    sizes): black, then lighter greys, each with its own marker, since colours mean splits."""
    return {"color": ("0.0", "0.32", "0.52", "0.7")[i % 4], "marker": ("o", "s", "^", "D")[i % 4]}


def method_style(i: int) -> dict:
    """The i-th method where methods share a panel: shades of grey with distinct markers, since
    colours are reserved for splits."""
    return {"color": ("0.1", "0.5", "0.3", "0.65")[i % 4],
            "marker": ("s", "^", "D", "v", "o", "P", "X", "*")[i % 8]}


def ordered_sites(sites) -> list[str]:
    """Sites in model order (tables.site_key), the panel order of every figure."""
    return sorted(dict.fromkeys(sites), key=tables.site_key)


def exact_sizes(rows: Sequence[dict], site: str, method: str) -> set[int]:
    """proxy_sizes.identical_sizes: sizes that are the original model (no line of their own)."""
    family = [r for r in rows if r["site"] == site and r["method"] == method]
    return proxy_sizes.identical_sizes(family).get((method, site), set())


_GAP_LABEL = {"same_pred": "gap in same_pred", "jsd": "gap in JSD (bits)"}


def _yerr(stat: Sequence[tuple]) -> np.ndarray:
    """[2, n] error-bar lengths from (mean, low, high, ...) tuples (0 where undefined)."""
    a = np.array([s[:3] for s in stat], float).reshape(-1, 3)
    return np.nan_to_num(np.clip(np.stack([a[:, 0] - a[:, 1], a[:, 2] - a[:, 0]]), 0, None))


def _means(stat: Sequence[tuple]) -> np.ndarray:
    return np.array([s[0] for s in stat], float)


def _grid(n: int, panel: tuple[float, float], cols: int = 3, extra_height: float = 0.9):
    """Up to `cols` panels per row; unused axes are hidden. Returns (fig, flat axes)."""
    plt = _pyplot()
    cols = min(cols, n)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(panel[0] * cols, panel[1] * rows + extra_height),
                             squeeze=False)
    flat = list(axes.flat)
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def _legend_below(fig, handles, labels, ncol: int | None = None) -> bool:
    """The legend in an empty grid cell if the figure has one (returns True), else below; none
    without labels (e.g. every size of a family is the original model, not drawn)."""
    if not labels:
        return False
    spare = [ax for ax in fig.axes if not ax.get_visible()]
    if spare:
        spare[-1].set_visible(True)
        spare[-1].axis("off")
        spare[-1].legend(handles, labels, loc="center", frameon=False)
        return True
    fig.legend(handles, labels, loc="lower center", ncol=ncol or min(len(labels), 6),
               frameon=False, bbox_to_anchor=(0.5, 0.0))
    return False


def _title(fig, text: str) -> None:
    """A suptitle on ONE line: 10 pt, smaller (not below 8 pt) when the text is wider than the
    figure (about 0.55 em per character); a figure too narrow even then is widened. Its top
    0.08 inch below the figure's, as matplotlib's default puts it on a 4-inch figure (the
    default, 2% of the height, put it among the first row's panels of a tall grid)."""
    need_in = 0.55 * len(text) / 72 / 0.96  # inches per point of font size
    width, height = fig.get_size_inches()
    size = max(8.0, min(10.0, width / need_in))
    if need_in * size > width:
        fig.set_size_inches(need_in * size + 0.1, height)
    fig.suptitle(text, fontsize=size, y=1 - 0.08 / height)


def tight_layout(fig, rect: tuple[float, float, float, float]) -> None:
    """fig.tight_layout(rect=rect), measuring each axes once: given a rect, matplotlib measures
    every axes (ticks and labels: most of its cost) twice over, unchanged in between."""
    for ax in fig.axes:
        ax.get_tightbbox = functools.cache(ax.get_tightbbox)
    try:
        fig.tight_layout(rect=rect)
    finally:
        for ax in fig.axes:
            del ax.get_tightbbox  # later drawing measures afresh


def _num_seeds(rows: Sequence[dict]) -> int:
    return len({r["seed"] for r in rows})


def _log2_axis(ax, sizes: Sequence[int], label: str) -> None:
    """x on a log2 scale with a tick at each size. A size 0 (an empty circuit, the first
    concept erased, a lens without correction) has no place on a log scale: then the scale is
    linear from 0 to 1 and log2 beyond (symlog), 0 half a doubling left of 1. A size within a
    quarter doubling of a larger one (128 beside a whole model's 130) keeps its tick unlabelled,
    so that the labels do not overprint."""
    if min(sizes, default=1) > 0:
        ax.set_xscale("log", base=2)
    else:
        ax.set_xscale("symlog", base=2, linthresh=1, linscale=0.5)
    labels, right = {}, None
    for size in sorted(sizes, reverse=True):
        crowded = right is not None and size > 0 and np.log2(right / size) < 0.25
        labels[size] = "" if crowded else str(size)
        right = right if crowded else size
    ax.set_xticks(sizes, [labels[s] for s in sizes])
    ax.minorticks_off()
    ax.set_xlabel(label)


def _size_axis(ax, method: str, sizes: Sequence[int]) -> None:
    """`_log2_axis` at the family's sizes, or at the widths of its size codes (proxy_sizes)."""
    coded = any(proxy_sizes.decode(method, s)[1] for s in sizes)
    _log2_axis(ax, sorted(set(proxy_sizes.widths(method, sizes))) if coded else sizes,
               "width (line style: k)" if coded else proxies.size_label(method))


def _k_styles(method: str, sizes) -> dict:
    """{k: line style} of proxy_sizes.by_k's lines over a method's sizes (every panel alike)."""
    lines = proxy_sizes.by_k(method, sizes)
    return {k: LINESTYLES[j % len(LINESTYLES)] for j, (k, _) in enumerate(lines)}


def _k_legend(styles: dict) -> tuple[list, list[str]]:
    """Legend entries of `_k_styles` (none for one plain line)."""
    from matplotlib.lines import Line2D  # noqa: PLC0415

    ks = [k for k in styles if k is not None]
    return [Line2D([], [], color="0.35", ls=styles[k]) for k in ks], [f"k = {k}" for k in ks]


def _sizes_text(method: str, sizes) -> str:
    """'rank 8,16': sizes with the proxy's size label; size codes as 'w128k8,w64k4'."""
    if any(proxy_sizes.decode(method, s)[1] for s in sizes):
        return ",".join(proxy_sizes.label(method, s) for s in sorted(sizes))
    return f"{proxies.size_label(method)} {','.join(map(str, sorted(sizes)))}"


def _dodge(x: np.ndarray, i: int, n: int, width: float = 0.35) -> np.ndarray:
    """Offsets so that the error bars of n lines don't overlap: multiplicative in log space,
    and at size 0 (linear there: _log2_axis) additive."""
    shift = (i - (n - 1) / 2) * width / max(n - 1, 1)
    return np.where(x > 0, x * 2 ** shift, x + shift / 2)


def faithfulness_curves(rows: Sequence[dict], method: str, splits: Sequence[str]):
    """same_pred (top row) and JSD (bottom row) against size, one column per target, one line
    per split, 95% intervals over seeds as error bars. Returns the matplotlib Figure."""
    plt = _pyplot()
    agg = tables.aggregate(rows)
    sites = ordered_sites(r["site"] for r in rows if r["method"] == method)
    fig, axes = plt.subplots(2, len(sites), figsize=(max(7.0, 3.6 * len(sites) + 0.4), 6.2),
                             squeeze=False, sharex="col")
    hidden = set()
    styles = _k_styles(method, {k[2] for k in agg if k[1] == method})
    for col, site in enumerate(sites):
        exact = exact_sizes(rows, site, method)
        hidden |= exact
        sizes = sorted({k[2] for k in agg if k[:2] == (site, method)} - exact)
        lines = proxy_sizes.by_k(method, sizes)
        for (i, split), (j, (k_, group)) in itertools.product(enumerate(splits),
                                                              enumerate(lines)):
            keys = [(site, method, s, split, "") for s in group]
            if not keys or not all(k in agg for k in keys):
                continue
            x = _dodge(np.array(proxy_sizes.widths(method, group), float), i * len(lines) + j,
                       len(splits) * len(lines))
            for row, metric in enumerate(("same_pred", "jsd")):
                stat = [agg[k][metric] for k in keys]
                axes[row, col].errorbar(x, _means(stat), yerr=_yerr(stat),
                                        label=split if j == 0 else "_nolegend_", ms=4, lw=1.2,
                                        ls=styles[k_], capsize=2,
                                        elinewidth=0.9, **split_style(split, splits))
        axes[0, col].set_title(site)
        _size_axis(axes[1, col], method, sizes)
    for ax in axes.flat:
        ax.grid(alpha=0.3)
    axes[0, 0].set_ylabel("same prediction (higher = more faithful)")
    axes[1, 0].set_ylabel("JSD, bits (lower = more faithful)")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    k_handles, k_labels = _k_legend(styles)
    _legend_below(fig, handles + k_handles, labels + k_labels)
    same = f"; {_sizes_text(method, hidden)} = the original, not drawn" if hidden else ""
    _title(fig, f"{method}: faithfulness to the original model (mean, 95% CI over "
                f"{_num_seeds(rows)} seeds{same})")
    tight_layout(fig, rect=(0, 0.05, 1, 1))
    return fig


def accuracy_by_bin(rows: Sequence[dict], site: str, method: str, splits: Sequence[str],
                    breakdown: str = "depth", train_bound: int | None = None,
                    max_sizes: int = 3):
    """Closing-bracket accuracy per depth (or distance, position) bin, one panel per split
    (3 per row): the original model and the proxy at up to `max_sizes` sizes (smallest, middle,
    largest), each with 95% intervals over seeds; grey bars: closing brackets per bin (n, per
    seed, right axis). `train_bound`: the largest bin value seen in training (e.g.
    data.max_depth); bins beyond it are shaded. Returns the matplotlib Figure."""
    from matplotlib.ticker import MaxNLocator

    agg = tables.aggregate(rows, breakdown=breakdown)
    exact = exact_sizes(rows, site, method)
    sizes = sorted({k[2] for k in agg if k[:2] == (site, method)} - exact)
    if len(sizes) > max_sizes:
        sizes = sorted({sizes[0], sizes[len(sizes) // 2], sizes[-1]})
    shown = [s for s in splits if any(k[:2] == (site, method) and k[3] == s for k in agg)]
    fig, axes = _grid(len(shown), (3.6, 2.9), extra_height=0.4 if len(shown) % 3 else 1.0)
    counts = {(r["split"], int(r["bin"])): r["n"] for r in rows
              if r["breakdown"] == breakdown and r["site"] == site and r["method"] == method}
    lines = ["original"] + [method if size == 0 else f"{method}, {_sizes_text(method, [size])}"
                            for size in sizes]
    # Bins are ints in memory and strings when read back from a CSV.
    key_of = {(k[2], k[3], int(k[4])): k for k in agg if k[:2] == (site, method)}
    beyond = False  # some panel has bins beyond the training bound
    for ax, split in zip(axes, shown, strict=True):
        bins = sorted({int(k[4]) for k in agg if k[:2] == (site, method) and k[3] == split})
        x = np.array(bins, float)
        twin = ax.twinx()
        n = np.array([counts.get((split, b), 0) for b in bins])
        twin.bar(x, n, width=0.8, color="0.85", zorder=0)
        twin.set_ylim(0, 3.5 * max(n.max(), 1))  # bars fill the bottom ~30%
        twin.tick_params(axis="y", labelsize=8, colors="0.45")
        twin.set_ylabel("closing brackets per bin and seed", color="0.45")
        ax.set_zorder(twin.get_zorder() + 1)
        ax.patch.set_visible(False)
        first = sizes[0] if sizes else min(exact)
        series = [("acc_original", first)] + [("acc_proxy", s) for s in sizes]
        for i, (metric, size) in enumerate(series):
            keys = [key_of.get((size, split, b)) for b in bins]
            stat = [agg[k][metric] if k in agg else (np.nan,) * 3 for k in keys]
            offset = (i - (len(series) - 1) / 2) * 0.12
            ax.errorbar(x + offset, _means(stat), yerr=_yerr(stat), ms=3.5,
                        lw=1.3 if i == 0 else 1.0,
                        ls="--" if i == 0 else "-", capsize=1.5, elinewidth=0.8,
                        zorder=5 if i == 0 else 3, label=lines[i], **size_style(i))
        # Only where this split has bins beyond the bound (with position offsets, training
        # covers every position: nothing is shaded, and no line stretches the axis).
        if train_bound is not None and bins and bins[-1] > train_bound:
            beyond = True
            ax.axvspan(train_bound + 0.5, bins[-1] + 0.6, color="#56B4E9", alpha=0.12, lw=0)
            ax.axvline(train_bound + 0.5, color="0.3", ls=":", lw=1)
        ax.set_title(split)
        ax.set_xlabel(breakdown)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # bins are integers
        ax.set_ylabel("closing-bracket accuracy")
        ax.set_ylim(-0.03, 1.03)
        ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    if beyond:
        from matplotlib.patches import Patch

        handles.append(Patch(color="#56B4E9", alpha=0.25))
        labels.append(f"{breakdown} beyond what training covers (> {train_bound})")
    handles.append(_patch("0.85"))
    labels.append("closing brackets per bin, per seed (right axis)")
    inside = _legend_below(fig, handles, labels, ncol=3)
    same = f"; {_sizes_text(method, exact)} = the original, not drawn" if exact else ""
    _title(fig, f"{method} on {site}: accuracy by {breakdown} (mean, 95% CI over "
                f"{_num_seeds(rows)} seeds{same})")
    tight_layout(fig, rect=(0, 0 if inside else 0.1, 1, 1))
    return fig


def _patch(color):
    from matplotlib.patches import Patch

    return Patch(color=color)


def accuracy_by_depth(rows: Sequence[dict], site: str, method: str, splits: Sequence[str],
                      max_depth: int | None = None):
    """`accuracy_by_bin` over depth, with the training depth bound `max_depth` marked."""
    return accuracy_by_bin(rows, site, method, splits, "depth", max_depth)


def gap_vs_size(gaps: Sequence[dict], method: str, splits: Sequence[str],
                metrics_: Sequence[str] = ("same_pred", "jsd")):
    """The paired generalization gap (report/stats.py rows: baseline minus split, positive =
    less faithful on the split) against size, one column per target, one row per metric, one
    line per OOD split with its 95% interval; zero marked. Returns the matplotlib Figure."""
    plt = _pyplot()
    gaps = [g for g in gaps if g["method"] == method and g["metric"] in metrics_]
    sites = ordered_sites(g["site"] for g in gaps)
    metrics_ = [m for m in metrics_ if any(g["metric"] == m for g in gaps)]
    fig, axes = plt.subplots(len(metrics_), len(sites),
                             figsize=(max(7.0, 3.6 * len(sites) + 0.4), 2.9 * len(metrics_) + 1.1),
                             squeeze=False, sharex="col")
    ood = [s for s in splits if any(g["split"] == s for g in gaps)]
    styles = _k_styles(method, {g["size"] for g in gaps})
    for col, site in enumerate(sites):
        sizes = sorted({g["size"] for g in gaps if g["site"] == site})
        lines = proxy_sizes.by_k(method, sizes)
        for row, metric in enumerate(metrics_):
            ax = axes[row, col]
            ax.axhline(0, color="0.4", lw=0.8)
            for (i, split), (j, (k_, group)) in itertools.product(enumerate(ood),
                                                                  enumerate(lines)):
                by_size = {g["size"]: g for g in gaps
                           if (g["site"], g["metric"], g["split"]) == (site, metric, split)}
                xs = [s for s in group if s in by_size]
                mean = np.array([by_size[s]["gap"] for s in xs], float)
                low = np.array([by_size[s]["ci_low"] for s in xs], float)
                high = np.array([by_size[s]["ci_high"] for s in xs], float)
                yerr = np.nan_to_num(np.stack([mean - low, high - mean]))
                x = np.array(proxy_sizes.widths(method, xs), float)
                ax.errorbar(_dodge(x, i * len(lines) + j, len(ood) * len(lines)),
                            mean, yerr=yerr, ms=4, lw=1.2, ls=styles[k_], capsize=2,
                            elinewidth=0.9, label=split if j == 0 else "_nolegend_",
                            **split_style(split, splits))
            ax.grid(alpha=0.3)
            ax.set_ylabel(_GAP_LABEL.get(metric, f"gap in {metric}"))
        axes[0, col].set_title(site)
        _size_axis(axes[-1, col], method, sizes)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    k_handles, k_labels = _k_legend(styles)
    _legend_below(fig, handles + k_handles, labels + k_labels)
    n = max((g.get("n_seeds", 0) for g in gaps), default=0)
    baseline = gaps[0].get("baseline", "iid") if gaps else "iid"
    _title(fig, f"{method}: paired gap, {baseline} vs split (> 0: less faithful on the split), "
                f"mean, 95% t CI over {n} seeds")
    tight_layout(fig, rect=(0, 0.06, 1, 1))
    return fig


def gaps_by_split(gaps: Sequence[dict], methods: Sequence[str], splits: Sequence[str],
                  metrics_: Sequence[str] = ("same_pred", "jsd")):
    """Gaps of proxies of one size each (the attention proxies, the logit lens): x = OOD split,
    one marker per family (a method at each of its sites; the site named where a method has
    several), one panel per metric, 95% intervals. Returns the matplotlib Figure."""
    gaps = [g for g in gaps if g["method"] in methods and g["metric"] in metrics_]
    metrics_ = [m for m in metrics_ if any(g["metric"] == m for g in gaps)]
    ood = [s for s in splits if any(g["split"] == s for g in gaps)]
    families = sorted(dict.fromkeys((g["method"], g["site"]) for g in gaps),
                      key=lambda f: (list(methods).index(f[0]), tables.site_key(f[1])))
    shown = list(dict.fromkeys(method for method, _ in families))
    several = {m for m in shown if sum(method == m for method, _ in families) > 1}
    step = min(0.15, 0.8 / max(len(families), 1))
    fig, axes = _grid(len(metrics_), (max(3.6, 1.1 * len(ood) + 1), 3.0), cols=2)
    for ax, metric in zip(axes, metrics_, strict=True):
        ax.axhline(0, color="0.4", lw=0.8)
        for i, (method, site) in enumerate(families):
            rows = {g["split"]: g for g in gaps
                    if (g["method"], g["site"], g["metric"]) == (method, site, metric)}
            x = np.array([j for j, s in enumerate(ood) if s in rows], float)
            mean = np.array([rows[s]["gap"] for s in ood if s in rows], float)
            low = np.array([rows[s]["ci_low"] for s in ood if s in rows], float)
            high = np.array([rows[s]["ci_high"] for s in ood if s in rows], float)
            ax.errorbar(x + (i - (len(families) - 1) / 2) * step, mean,
                        yerr=np.nan_to_num(np.stack([mean - low, high - mean])), ls="none",
                        ms=5, capsize=3, label=f"{method} {site}" if method in several
                        else method, **method_style(i))
        ax.set_xticks(range(len(ood)), ood, rotation=20, ha="right")
        ax.set_xlabel("evaluation split")
        ax.set_ylabel(_GAP_LABEL.get(metric, f"gap in {metric}"))
        ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    _legend_below(fig, handles, labels)
    n = max((g.get("n_seeds", 0) for g in gaps), default=0)
    _title(fig, f"{' and '.join(shown)}: paired gap (> 0: less faithful on the split), "
                f"95% t CI, {n} seeds")
    tight_layout(fig, rect=(0, 0.08, 1, 1))
    return fig


def render(function, args: Sequence, path: str) -> np.ndarray:
    """function(*args), a figure function of this module, saved as `path` (`save`)."""
    return save(function(*args), path)


def claim(claims: str, index: int) -> bool:
    """Whether this process takes figure `index` of a drawing shared by two processes
    (report/drawing.py's `draw` and its helper): the first to create its file under `claims`
    does, the other is refused (an exclusive create)."""
    try:
        os.close(os.open(os.path.join(claims, str(index)), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def drawn(claims: str, index: int) -> bool:
    """Whether the helper process (`render_file`) has written figure `index` whole."""
    return os.path.exists(os.path.join(claims, f"{index}.drawn"))


def render_file(jobs_path: str, claims: str) -> None:
    """`render` of the (function, arguments, path) jobs pickled in `jobs_path`, the last first,
    each that this process `claim`s, until one is refused, each marked `drawn` once its file is
    written (report/drawing.py's helper process: the main process draws from the first)."""
    with open(jobs_path, "rb") as f:
        jobs = pickle.load(f)
    for index in reversed(range(len(jobs))):
        if not claim(claims, index):
            return
        render(*jobs[index])
        with open(os.path.join(claims, f"{index}.drawn"), "x"):
            pass


def save(fig, path: str) -> np.ndarray:
    """Writes `fig` as a PNG at DPI and closes it; returns the pixels it drew [H, W, 4]. The file
    appears whole or not at all (a temporary file, then a rename): a run killed while saving
    leaves no cut figure, which `jaxillusions figures` would take for a drawn one."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    # tight_layout leaves a placeholder layout engine, for which savefig draws the whole figure
    # once more before the draw it saves; the layout is done, so none is needed.
    fig.set_layout_engine(None)
    data = io.BytesIO()
    fig.savefig(data, dpi=DPI, format=os.path.splitext(path)[1][1:] or "png")
    cache.write_atomic(path, data.getvalue())  # (not via checkpoint: no orbax import here)
    pixels = np.array(fig.canvas.buffer_rgba())  # savefig's draw (no second one)
    _pyplot().close(fig)
    return pixels


def attention_patterns(patterns: np.ndarray, labels: Sequence[str], seeds: Sequence[int],
                       site: str, shown: str = "one iid sentence"):
    """One heatmap per seed (2 per row): patterns [S, T, T] (query rows, key columns) on one
    input (`shown` says which, in the title), with a shared colour bar."""
    n, t = len(seeds), len(labels)
    side = max(3.6, 0.16 * t + 1.2)  # >= ~11 pt per token row, so 8 pt labels fit
    fig, axes = _grid(n, (side, side), cols=2, extra_height=0.6)
    image = None
    for ax, pattern, seed in zip(axes, patterns, seeds, strict=True):
        image = ax.imshow(pattern, cmap="viridis", vmin=0, vmax=1)
        ax.set_title(f"seed {seed}")
        ax.set_xticks(range(t), labels, fontsize=8, rotation=90)
        ax.set_yticks(range(t), labels, fontsize=8)
        ax.set_xlabel("key")
        ax.set_ylabel("query")
    _title(fig, f"{site}: attention weights on {shown}")
    tight_layout(fig, rect=(0, 0, 0.9, 1))
    cax = fig.add_axes((0.92, 0.15, 0.02, 0.7))
    fig.colorbar(image, cax=cax, label="attention weight")
    return fig


def key_projection(vectors: np.ndarray, depth: np.ndarray, tokens: np.ndarray, num_types: int,
                   site: str, max_types: int = 4):
    """Vectors [N, F] (one per position) projected on their top-2 right singular vectors, three
    panels: coloured by depth (colour bar), by open vs close bracket, and by bracket type for the
    first `max_types` types (open and close of a type in distinct colours: a dark/light pair)."""
    _, _, vt = np.linalg.svd(vectors, full_matrices=False)
    xy = vectors @ vt[:2].T
    fig, axes = _grid(3, (3.6, 3.4), extra_height=1.2)
    dot = {"s": 5, "linewidths": 0}
    sc = axes[0].scatter(xy[:, 0], xy[:, 1], c=depth, cmap="viridis", **dot)
    fig.colorbar(sc, ax=axes[0], label="depth (after the token)")
    is_open = (tokens >= 3) & (tokens < 3 + num_types)
    is_close = tokens >= 3 + num_types
    kinds = [("BOS / EOS", tokens < 3, "#000000"), ("open bracket", is_open, "#E69F00"),
             ("close bracket", is_close, "#0072B2")]
    for label, mask, color in kinds:
        axes[1].scatter(xy[mask, 0], xy[mask, 1], color=color, label=label, **dot)
    # Paired shades per type: open = dark, close = light (Paul Tol's "paired"-style pairs).
    pairs = [("#994F00", "#FFB45C"), ("#005A8C", "#7FC7F5"), ("#006B4F", "#6FD9B5"),
             ("#7A2D6B", "#E3A6D6")]
    axes[2].scatter(xy[:, 0], xy[:, 1], color="0.85", label="other tokens", **dot)
    for t in range(min(num_types, max_types, len(pairs))):
        for (label, ids), color in zip(((f"( type {t}", tokens == 3 + t),
                                        (f") type {t}", tokens == 3 + num_types + t)),
                                       pairs[t], strict=True):
            axes[2].scatter(xy[ids, 0], xy[ids, 1], color=color, label=label, **dot)
    axes[0].set_title("by depth")
    axes[1].set_title("open vs close")
    axes[2].set_title(f"by bracket type (first {min(num_types, max_types)} of {num_types})")
    for ax in axes:
        ax.set_xlabel("singular direction 1")
        ax.set_ylabel("singular direction 2")
    for ax, ncol in ((axes[1], 3), (axes[2], 3)):
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=ncol, frameon=False,
                  markerscale=3, handletextpad=0.2, columnspacing=0.8)
    _title(fig, f"{site}: 2-D SVD projection at training positions")
    fig.tight_layout()
    return fig


def faithfulness_by_label(rows: Sequence[dict], method: str, splits: Sequence[str],
                          breakdown: str, labels: Sequence[str], metric: str = "same_pred"):
    """`metric` per bin of a labelled breakdown (code: prediction category), one panel per
    target of `method` at its middle size, one marker per split (the baseline first), with 95%
    intervals over seeds; grey text: evaluated positions per bin and seed on the first split.
    Returns the matplotlib Figure."""
    agg = tables.aggregate(rows, breakdown=breakdown)
    sites = ordered_sites(r["site"] for r in rows if r["method"] == method)
    fig, axes = _grid(len(sites), (max(4.2, 0.42 * len(labels) + 1.2), 3.3), cols=2,
                      extra_height=1.3)
    counts = {(r["site"], r["split"], int(r["bin"])): r["n"] for r in rows
              if r["breakdown"] == breakdown and r["method"] == method}
    size = 0
    for ax, site in zip(axes, sites, strict=True):
        size = proxy_sizes.middle_size({k[2] for k in agg if k[:2] == (site, method)})
        shown = [s for s in splits if any(k[:4] == (site, method, size, s) for k in agg)]
        bins = sorted({int(k[4]) for k in agg if k[:3] == (site, method, size)})
        for i, split in enumerate(shown):
            keys = [(site, method, size, split, b) for b in bins]
            keys = [next((k for k in agg if k[:4] == key[:4] and int(k[4]) == key[4]), None)
                    for key in keys]
            stat = [agg[k][metric] if k else (np.nan,) * 3 for k in keys]
            x = np.arange(len(bins)) + (i - (len(shown) - 1) / 2) * 0.8 / max(len(shown), 1)
            ax.errorbar(x, _means(stat), yerr=_yerr(stat), ls="none", ms=4, capsize=2,
                        elinewidth=0.9, label=split, **split_style(split, splits))
        ax.set_xticks(range(len(bins)), [labels[b] for b in bins], rotation=35, ha="right")
        ax.set_xlabel(breakdown)
        if shown:
            for j, b in enumerate(bins):
                n = counts.get((site, shown[0], b))
                if n is not None:
                    ax.annotate(str(n), (j, 0), xycoords=("data", "axes fraction"),
                                xytext=(0, 2), textcoords="offset points", ha="center",
                                fontsize=7, color="0.45")
        ax.set_title(site if size == 0 else f"{site}, {_sizes_text(method, [size])}")
        ax.set_ylabel(f"{metric.replace('_', ' ')} (higher = more faithful)"
                      if metric == "same_pred" else metric)
        ax.grid(alpha=0.3)
    handles, labels_ = axes[0].get_legend_handles_labels()
    inside = _legend_below(fig, handles, labels_)
    _title(fig, f"{method}: {metric} by {breakdown} (mean, 95% CI, {_num_seeds(rows)} seeds; "
                f"grey: positions per bin and seed on {splits[0]})")
    tight_layout(fig, rect=(0, 0 if inside else 0.08, 1, 1))
    return fig
