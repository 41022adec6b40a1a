"""Figures from the tidy result rows (matplotlib, written as PNG; no display needed)."""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from jaxillusions.analysis import tables


def _pyplot():
    import matplotlib  # noqa: PLC0415 - matplotlib is slow to import; only figures need it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    return plt


def faithfulness_curves(rows: Sequence[dict], method: str, splits: Sequence[str]):
    """same_pred (top) and JSD (bottom) against size, one column per target, one line per split,
    with 95% intervals over seeds. Returns the matplotlib Figure."""
    plt = _pyplot()
    agg = tables.aggregate(rows)
    sites = sorted({k[0] for k in agg if k[1] == method})
    fig, axes = plt.subplots(2, len(sites), figsize=(4.2 * len(sites), 6.5), squeeze=False,
                             sharex=True)
    for col, site in enumerate(sites):
        for split in splits:
            keys = sorted((k for k in agg if k[:2] == (site, method) and k[3] == split),
                          key=lambda k: k[2])
            if not keys:
                continue
            sizes = np.array([k[2] for k in keys])
            for row, metric in enumerate(("same_pred", "jsd")):
                mean = np.array([agg[k][metric][0] for k in keys])
                ci = np.nan_to_num(np.array([agg[k][metric][1] for k in keys]))
                ax = axes[row, col]
                ax.plot(sizes, mean, marker="o", ms=3, label=split)
                # Both metrics live in [0, 1]; a t-interval over few seeds can overshoot.
                ax.fill_between(sizes, np.clip(mean - ci, 0, 1), np.clip(mean + ci, 0, 1),
                                alpha=0.2)
        axes[0, col].set_title(site, fontsize=9)
        axes[1, col].set_xlabel("rank" if method in ("svd", "pca") else "clusters k")
        axes[1, col].set_xscale("log", base=2)
    axes[0, 0].set_ylabel("same prediction")
    axes[1, 0].set_ylabel("JSD (bits)")
    axes[0, -1].legend(fontsize=8)
    fig.suptitle(f"{method}: faithfulness to the original model (mean ± 95% CI over seeds)")
    fig.tight_layout()
    return fig


def accuracy_by_depth(rows: Sequence[dict], site: str, method: str, splits: Sequence[str]):
    """Closing-bracket accuracy against depth, one panel per split: the original model (black)
    and the proxy at each size. Returns the matplotlib Figure."""
    plt = _pyplot()
    agg = tables.aggregate(rows, breakdown="depth")
    sizes = sorted({k[2] for k in agg if k[:2] == (site, method)})
    fig, axes = plt.subplots(1, len(splits), figsize=(3.4 * len(splits), 3.2), squeeze=False,
                             sharey=True)
    colors = plt.cm.viridis(np.linspace(0.1, 0.9, max(len(sizes), 1)))
    for ax, split in zip(axes[0], splits, strict=True):
        for i, size in enumerate(sizes):
            keys = sorted((k for k in agg if k[:4] == (site, method, size, split)),
                          key=lambda k: int(k[4]))
            if not keys:
                continue
            depth = [int(k[4]) for k in keys]
            if i == 0:
                # On top and dashed: a faithful proxy would otherwise hide it.
                ax.plot(depth, [agg[k]["acc_original"][0] for k in keys], color="black", lw=1.5,
                        ls="--", zorder=5, label="original")
            label = method if method.endswith("attention") else f"{method} {size}"
            ax.plot(depth, [agg[k]["acc_proxy"][0] for k in keys], color=colors[i], marker=".",
                    label=label)
        ax.set_title(split, fontsize=9)
        ax.set_xlabel("depth")
    axes[0, 0].set_ylabel("closing-bracket accuracy")
    axes[0, -1].legend(fontsize=7)
    fig.suptitle(f"{method} on {site}: accuracy by depth (mean over seeds)", fontsize=10)
    fig.tight_layout()
    return fig


def save(fig, path: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)


def attention_patterns(patterns: np.ndarray, labels: Sequence[str], seeds: Sequence[int],
                       site: str):
    """One heatmap per seed: patterns [S, T, T] (query rows, key columns) on one sentence."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(seeds), figsize=(3.2 * len(seeds), 3.4), squeeze=False)
    for ax, pattern, seed in zip(axes[0], patterns, seeds, strict=True):
        ax.imshow(pattern, cmap="viridis", vmin=0, vmax=1)
        ax.set_title(f"seed {seed}", fontsize=9)
        ax.set_xticks(range(len(labels)), labels, fontsize=6, rotation=90)
        ax.set_yticks(range(len(labels)), labels, fontsize=6)
    fig.suptitle(f"{site} (rows: queries, columns: keys)", fontsize=10)
    fig.tight_layout()
    return fig


def key_projection(vectors: np.ndarray, depth: np.ndarray, kind: np.ndarray, site: str):
    """Vectors [N, F] projected on their top-2 right singular vectors, coloured by depth (left)
    and by token kind (right: bracket type, open vs close marker)."""
    plt = _pyplot()
    _, _, vt = np.linalg.svd(vectors, full_matrices=False)
    xy = vectors @ vt[:2].T
    fig, axes = plt.subplots(1, 2, figsize=(9, 4))
    sc = axes[0].scatter(xy[:, 0], xy[:, 1], c=depth, s=4, cmap="viridis")
    fig.colorbar(sc, ax=axes[0], label="depth")
    axes[1].scatter(xy[:, 0], xy[:, 1], c=kind, s=4, cmap="tab20")
    axes[0].set_title("coloured by depth", fontsize=9)
    axes[1].set_title("coloured by token (bracket type; BOS/EOS separate)", fontsize=9)
    for ax in axes:
        ax.set_xlabel("SV 1")
        ax.set_ylabel("SV 2")
    fig.suptitle(f"{site}: 2-D SVD projection (training positions)", fontsize=10)
    fig.tight_layout()
    return fig
