"""The figures of Wen et al.'s measurements (jaxillusions/studies/wen.py draws them into
figures/wen_*.png and TensorBoard; `jaxillusions wen-attention` draws the joined attention figure):
attention variation per layer against the random baseline, length generalization per contrastive
weight (each member and the mean with its interval), balance violation against length
generalization, and the attention patterns of the first healthy members. They read the member
rows and attention rows that wen.measure writes to wen_results.csv and wen_attention.csv.
"""

from __future__ import annotations

import numpy as np

from jaxillusions.report import figures
from jaxillusions.report import stats as interval_stats
from jaxillusions.tasks import dyck as dyck_task


def attention_figure(attention: list[dict]):
    plt = figures._pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    several = len({a["contrastive_weight"] for a in attention}) > 1  # then every bar says its λ
    names = [f"{a['label']}\nL{a['layer']}" + (f" cw{a['contrastive_weight']:g}" if several
                                                 else "") for a in attention]
    mean = np.array([a["variation"] for a in attention])
    err = np.array([[a["variation"] - a["low"], a["high"] - a["variation"]] for a in attention]).T
    defined = bool(np.isfinite(err).any())  # at 2 seeds no bar has one: none drawn
    ax.bar(range(len(mean)), mean, yerr=np.nan_to_num(err) if defined else None, capsize=4,
           color="tab:blue", alpha=0.8)
    ax.axhline(attention[0]["random_baseline"], color="k", ls="--", label="random (causal)")
    ax.set_xticks(range(len(mean)), names, fontsize=7)
    ax.set_ylabel("attention variation")
    what = "95% CI" if defined else "no interval: it takes 3 seeds or more"
    ax.set_title(f"Attention variation between seeds (mean over pairs, {what})", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def length_figure(rows: list[dict]):
    plt = figures._pyplot()
    weights = sorted({r["contrastive_weight"] for r in rows})
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    rng = np.random.default_rng(0)
    for ax, key, title in ((axes[0], "length_gen_acc", "closing share > threshold"),
                           (axes[1], "length_gen_argmax_acc", "argmax accuracy")):
        for x, w in enumerate(weights):
            vals = np.array([r[key] for r in rows if r["contrastive_weight"] == w
                             and r["healthy"]])
            ax.scatter(x + rng.uniform(-0.15, 0.15, len(vals)), vals, s=8, alpha=0.5,
                       color="tab:gray")
            mean, low, high = interval_stats.bounded_interval(vals)  # a proportion
            ax.errorbar(x, mean, yerr=np.nan_to_num([[mean - low], [high - mean]]), fmt="o",
                        color="tab:red", capsize=5)
        ax.set_xticks(range(len(weights)), [f"{w:g}" for w in weights])
        ax.set_xlabel("contrastive weight λ")
        ax.set_ylabel("length generalization")
        ax.set_ylim(-0.02, 1.02)
        ax.set_title(title, fontsize=9)
    figures._title(fig, "Length generalization: grey, each seed; red, mean and 95% t CI on "  # noqa: SLF001
                   f"the logit scale ({_seed_counts(rows)})")
    fig.tight_layout()
    return fig


def _seed_counts(rows: list[dict]) -> str:
    """'12 seeds per λ' or '12, 11 and 12 seeds at λ = 0, 0.3, 1': the healthy ones."""
    weights = sorted({r["contrastive_weight"] for r in rows})
    counts = [sum(r["healthy"] for r in rows if r["contrastive_weight"] == w) for w in weights]
    if len(set(counts)) == 1:
        return f"{counts[0]} seeds per λ"
    return (f"{', '.join(map(str, counts[:-1]))} and {counts[-1]} seeds at λ = "
            f"{', '.join(f'{w:g}' for w in weights)}")


def balance_figure(rows: list[dict]):
    plt = figures._pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.5))
    shown = [r for r in rows if r["healthy"] and np.isfinite(r["balance_violation"])]
    left = sum(r["healthy"] for r in rows) - len(shown)  # a violation that is not finite
    for w in sorted({r["contrastive_weight"] for r in rows}):
        group = [r for r in shown if r["contrastive_weight"] == w]
        ax.scatter([r["balance_violation"] for r in group], [r["length_gen_acc"] for r in group],
                   s=10, label=f"λ={w:g}")
    from matplotlib import ticker  # noqa: PLC0415 - with pyplot, at drawing time

    ax.set_xscale("log")  # ticks at 1, 2 and 5 per decade, in plain numbers (no crowded 3x10^-1)
    ax.xaxis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
    ax.xaxis.set_minor_formatter(ticker.NullFormatter())
    ax.set_xlabel("balance violation δ/Δ")
    ax.set_ylabel("length generalization")
    ax.legend(fontsize=8)
    figures._title(fig, f"Balance and length generalization, a point per seed "  # noqa: SLF001
                   f"({_seed_counts(rows)}" + (f"; {left} not finite, left out)" if left else ")"))
    fig.tight_layout()
    return fig


def _patterns_figure(patterns: dict, prefix: np.ndarray, k: int, labels, healthy,
                     shown: int = 4):
    """The attention patterns of the first `shown` healthy members (diverged ones are NaN)."""
    plt = figures._pyplot()
    members = np.flatnonzero(healthy)[:shown]
    ticks = [dyck_task.token_label(t, k) for t in prefix]
    layers, shown = sorted(patterns), max(len(members), 1)
    fig, axes = plt.subplots(len(layers), shown, figsize=(2.6 * shown, 2.6 * len(layers)),
                             squeeze=False)
    image = None
    for r, layer in enumerate(layers):
        for c, member in enumerate(members):
            ax = axes[r, c]
            image = ax.imshow(patterns[layer][member, 0], cmap="viridis", vmin=0, vmax=1)
            ax.set_title(f"layer {layer}, member {labels[member]}", fontsize=8)
            ax.set_xticks(range(len(ticks)), ticks, fontsize=5, rotation=90)
            ax.set_yticks(range(len(ticks)), ticks, fontsize=5)
            ax.set_xlabel("key", fontsize=7)
            ax.set_ylabel("query", fontsize=7)
    figures._title(fig, f"Attention weights on one prefix, the first {len(members)} healthy "  # noqa: SLF001
                   "members")
    figures.tight_layout(fig, rect=(0, 0, 0.9, 1))
    if image is not None:
        fig.colorbar(image, cax=fig.add_axes((0.92, 0.15, 0.015, 0.7)),
                     label="attention weight")
    return fig
