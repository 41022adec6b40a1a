"""The paper's code-completion claims, judged on a finished code run: markdown tables of each
proxy family's same_pred gap (iid minus the split; > 0: less faithful out of distribution) per
character category and per closing-bracket depth, as a paired mean [95% Student-t interval over
seeds] with the seeds whose gap is positive, beside the characters counted and the original
model's accuracy; then the induction heads per seed, the best heads' ablation, and whether head
strength predicts the identifier_repeat gap.

    python -m benchmarks.code_claims runs/code_population --sizes=1,4,16

docs/code_completion.md's tables of the population run are its output. Reads results.csv and
induction_seeds.csv; computes nothing the main job did not measure.
"""

from __future__ import annotations

import argparse
import os

import numpy as np
import pandas as pd

from jaxillusions.report import results, stats, tables
from jaxillusions.studies import induction
from jaxillusions.tasks.code_completion import lexer

BASELINE = "iid"


def _counts(df: pd.DataFrame, breakdown: str) -> pd.DataFrame:
    """Per (split, bin) of the original model's rows: characters (n, the same for every seed)
    and accuracy (mean over seeds)."""
    own = df[(df["method"] == "original") & (df["breakdown"] == breakdown)]
    return own.groupby(["split", "bin"], observed=True).agg(n=("n", "first"), acc=("acc", "mean"))


def _interval(g: dict) -> str:
    star = "*" if stats.verdict(g) else ""
    return f"{g['gap']:+.3f} [{g['ci_low']:+.3f}, {g['ci_high']:+.3f}]{star}"


def gap_tables(workdir: str, breakdown: str, sizes: set[int] | None = None
               ) -> dict[tuple[str, str, int], str]:
    """{(method, site, size): a markdown table of `breakdown`'s bins (code: category,
    bracket_depth)} for every proxy family and size (`sizes`: None for all)."""
    df = results.load_results(workdir)
    rows = results.read_csv(os.path.join(workdir, "results.csv"))
    labels = lexer.CATEGORIES if breakdown == "category" else [str(d) for d in range(1024)]
    gaps = tables.bin_gaps(rows, breakdown, labels, BASELINE, metrics=("same_pred",))
    splits = [s for s in dict.fromkeys(str(s) for s in df["split"].cat.categories)
              if s != BASELINE and any(g["split"] == s for g in gaps)]
    counts = _counts(df, breakdown)
    out = {}
    families = dict.fromkeys((g["method"], g["site"], g["size"]) for g in gaps)
    for method, site, size in families:
        if sizes is not None and size and size not in sizes:
            continue
        ours = {(g["bin"], g["split"]): g for g in gaps
                if (g["method"], g["site"], g["size"]) == (method, site, size)}
        head = (f"| {breakdown} | characters {'/'.join([BASELINE, *splits])} | model accuracy "
                f"| {BASELINE} same_pred | " + " | ".join(f"gap {s}" for s in splits)
                + " | seeds > 0 |")
        lines = [head, "|" + "---|" * (head.count("|") - 1)]
        for b in sorted({b for b, _ in ours}):
            cells = [ours.get((b, s)) for s in splits]
            base = next(c for c in cells if c is not None)
            n = "/".join(str(int(counts["n"].get((s, b), 0))) for s in [BASELINE, *splits])
            acc = "/".join(f"{counts['acc'].get((s, b), np.nan):.2f}"
                           for s in [BASELINE, *splits])
            lines.append(
                f"| {labels[b]} | {n} | {acc} | {base['baseline_mean']:.3f} | "
                + " | ".join("" if c is None else _interval(c) for c in cells) + " | "
                + "/".join("-" if c is None else f"{c['seeds_positive']}" for c in cells)
                + f" of {base['n_seeds']} |")
        out[method, site, size] = "\n".join(lines)
    return out


def category_contrast(workdir: str, first: str = "identifier_repeat",
                      second: str = "identifier_first", sizes: set[int] | None = None) -> str:
    """A markdown table: per proxy family, size and OOD split, the gap (same_pred, iid minus the
    split) on `first` minus that on `second`, paired over seeds: mean [95% Student-t
    interval], and the seeds where it is positive."""
    df = results.load_results(workdir)
    bins = [lexer.CATEGORIES.index(c) for c in (first, second)]
    sel = df[(df["breakdown"] == "category") & (df["method"] != "original")
             & df["bin"].isin(bins)]
    wide = sel.pivot_table(index=["method", "site", "size", "seed", "bin"], columns="split",
                           values="same_pred", observed=True, aggfunc="first")
    splits = [s for s in wide.columns if s != BASELINE]
    lines = ["| proxy | size | " + " | ".join(f"{first} - {second} gap, {s}" for s in splits)
             + " |", "|---|---|" + "---|" * len(splits)]
    for (method, site, size), g in wide.groupby(level=[0, 1, 2], observed=True, sort=False):
        if sizes is not None and size and size not in sizes:
            continue
        cells = []
        for split in splits:
            gap = pd.Series(stats.signed_gap(g[BASELINE].to_numpy(), g[split].to_numpy(),
                                             "same_pred"), index=g.index).unstack("bin")
            diff = (gap[bins[0]] - gap[bins[1]]).dropna().to_numpy()
            mean, low, high = stats.t_interval(diff)
            cells.append(f"{mean:+.3f} [{low:+.3f}, {high:+.3f}] {int((diff > 0).sum())}/"
                         f"{len(diff)}")
        lines.append(f"| {method} {site} | {size} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def mechanism(workdir: str) -> str:
    """The induction heads per seed, the verdict, the ablation line and head strength against
    the identifier_repeat gap (Spearman, permutation p; bootstrap interval from 16 seeds)."""
    per_seed = pd.read_csv(os.path.join(workdir, "induction_seeds.csv"))
    ok = per_seed.dropna(subset=["max_induction_score"])
    lines = ["| seed | best head | score | loss drop | on code (uniform) | ablation drop "
             "identifier_repeat / other |", "|---|---|---|---|---|---|"]
    for _, r in ok.iterrows():
        lines.append(
            f"| {int(r['seed'])} | {int(r['best_layer'])}.{int(r['best_head'])} | "
            f"{r['max_induction_score']:.3f} | {r['loss_drop']:.2f} | "
            f"{r['code_target_attention']:.3f} ({r['code_uniform_on_target']:.3f}) | "
            f"{r['ablation_drop_repeat']:+.3f} / {r['ablation_drop_other']:+.3f} |")
    lines += ["", induction.verdict(ok["max_induction_score"], ok["loss_drop"],
                                    ok["code_target_attention"]),
              induction.ablation_line(ok, stats)]
    code = pd.read_csv(os.path.join(workdir, "induction_code.csv"))
    scores = pd.read_csv(os.path.join(workdir, "induction.csv")).merge(
        code[["seed", "layer", "head", "best", "target_attention"]], on=["seed", "layer", "head"])
    for name, heads in (("best heads", scores[scores["best"] == 1]),
                        ("other layer-1 heads", scores[(scores["best"] == 0)
                                                       & (scores["layer"] > 0)]),
                        ("layer-0 heads", scores[scores["layer"] == 0])):
        lines.append(f"{name} ({len(heads)}): random-test score "
                     f"{heads['induction_score'].min():.3f} to {heads['induction_score'].max():.3f}"
                     f", on code {heads['target_attention'].min():.3f} to "
                     f"{heads['target_attention'].max():.3f}")
    lines += ["", "| split | category | accuracy | drop when the best head is mean-ablated |",
              "|---|---|---|---|"]
    ablation = pd.read_csv(os.path.join(workdir, "induction_ablation.csv"))
    best = ablation[ablation["best"] == 1]
    for (split, category), g in best.groupby(["split", "category"], sort=False):
        mean, low, high = stats.t_interval(g["drop"].to_numpy())
        lines.append(f"| {split} | {category} | {g['acc_original'].mean():.3f} | "
                     f"{mean:+.3f} [{low:+.3f}, {high:+.3f}] |")
    lines.append("")
    df = results.load_results(workdir)
    for strength in ("max_induction_score", "loss_drop", "code_target_attention",
                     "ablation_drop_repeat"):
        table = induction.head_predicts_gap(df, ok, strength=strength)
        best = table.sort_values("p_value").head(3)
        lines.append(
            f"{strength} vs the identifier_repeat gap: {int((table['p_value'] < 0.05).sum())} of "
            f"{len(table)} with p < 0.05 (rho {table['rho'].min():+.2f} to "
            f"{table['rho'].max():+.2f}); smallest p: " + "; ".join(
                f"{r.method} {r.site} {r.size} {r.split} rho {r.rho:+.2f} "
                f"[{r.rho_low:+.2f}, {r.rho_high:+.2f}] p {r.p_value:.3f}"
                for r in best.itertuples()))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("workdir")
    parser.add_argument("--sizes", default="", help="comma-separated sizes (default: all)")
    args = parser.parse_args()
    sizes = {int(s) for s in args.sizes.split(",")} if args.sizes else None
    for breakdown in ("category", "bracket_depth"):
        for (method, site, size), table in gap_tables(args.workdir, breakdown, sizes).items():
            print(f"same_pred gap by {breakdown}, {method} {site} size {size}:\n\n{table}\n")
    for first, second in (("identifier_repeat", "identifier_first"),
                          ("close_bracket", "open_bracket")):
        print(f"## {first} minus {second}: the gaps' paired difference\n")
        print(category_contrast(args.workdir, first, second, sizes), "\n")
    print("## Induction heads\n")
    print(mechanism(args.workdir))


if __name__ == "__main__":
    main()
