"""The paper's code-completion claims, judged on a finished code run: markdown tables of each
proxy family's same_pred gap (iid minus the split; > 0: less faithful out of distribution) per
character category and per closing-bracket depth, as a paired mean [95% Student-t interval over
seeds] with the seeds whose gap is positive, beside the characters counted and the original
model's accuracy; then the induction heads per seed, the best heads' ablation, and whether head
strength predicts the identifier_repeat gap.

    python -m benchmarks.code_claims runs/code_population --sizes=1,4,16
    python -m benchmarks.code_claims RUN_A RUN_B --sizes=1,4,16   # one population, two runs
    python -m benchmarks.code_claims RUN --against OTHER_RUN      # the same seeds, paired

Several workdirs are one population when their runs share a config but for `seed` (e.g. a second
run with --config.seed=8) and no seed: their seeds are pooled (`load`). docs/code_completion.md's
tables of the population run are its output. Reads results.csv and the induction CSVs; computes
nothing the main job did not measure.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Sequence

import numpy as np
import pandas as pd

from jaxillusions import tasks
from jaxillusions.config import settings
from jaxillusions.pipeline import validate
from jaxillusions.report import results, stats, tables
from jaxillusions.studies import induction
from jaxillusions.tasks.code_completion import copying, lexer

BASELINE = "iid"
INDUCTION_FILES = {"per_seed": "induction_seeds.csv", "heads": "induction.csv",
                   "code": "induction_code.csv", "ablation": "induction_ablation.csv"}


@dataclasses.dataclass(frozen=True)
class Population:
    """A finished code population's tables, read once: results.csv (`df`, typed; `rows`, as
    tables.bin_gaps reads them) and the induction stage's CSVs (INDUCTION_FILES)."""

    workdirs: tuple[str, ...]
    df: pd.DataFrame
    rows: list[dict]
    per_seed: pd.DataFrame
    heads: pd.DataFrame
    code: pd.DataFrame
    ablation: pd.DataFrame


def load(workdirs: Sequence[str]) -> Population:
    """The runs in `workdirs` as one population: ValueError (one line) unless their configs
    agree on every setting but `seed` and their seeds are disjoint."""
    workdirs = tuple(workdirs)
    configs = [settings.flat(validate.read_stored(w)) for w in workdirs]
    for w, config in zip(workdirs[1:], configs[1:], strict=True):
        differ = sorted(k for k in configs[0].keys() | config.keys()
                        if k != "seed" and configs[0].get(k) != config.get(k))
        if differ:
            raise ValueError(f"{w} is not a run of {workdirs[0]}'s config: they differ in "
                             f"{', '.join(differ[:5])}{' ...' if len(differ) > 5 else ''}")
    dfs = [results.load_results(w) for w in workdirs]
    seeds = [set(d["seed"]) for d in dfs]
    if len(set().union(*seeds)) < sum(len(s) for s in seeds):
        raise ValueError(f"the runs in {', '.join(workdirs)} share seeds: pool runs of "
                         "disjoint seeds (--config.seed)")
    induction_tables = {name: pd.concat([pd.read_csv(os.path.join(w, f)) for w in workdirs],
                                        ignore_index=True)
                        for name, f in INDUCTION_FILES.items()}
    return Population(workdirs=workdirs, df=pd.concat(dfs, ignore_index=True),
                      rows=[r for w in workdirs
                            for r in results.read_csv(os.path.join(w, "results.csv"))],
                      **induction_tables)


def _counts(df: pd.DataFrame, breakdown: str) -> pd.DataFrame:
    """Per (split, bin) of the original model's rows: characters (n, the same for every seed)
    and accuracy (mean over seeds)."""
    own = df[(df["method"] == "original") & (df["breakdown"] == breakdown)]
    return own.groupby(["split", "bin"], observed=True).agg(n=("n", "first"), acc=("acc", "mean"))


def _interval(g: dict) -> str:
    star = "*" if stats.verdict(g) else ""
    return f"{g['gap']:+.3f} [{g['ci_low']:+.3f}, {g['ci_high']:+.3f}]{star}"


def gap_tables(population: Population, breakdown: str, sizes: set[int] | None = None
               ) -> dict[tuple[str, str, int], str]:
    """{(method, site, size): a markdown table of `breakdown`'s bins (code: category,
    bracket_depth)} for every proxy family and size (`sizes`: None for all)."""
    df, rows = population.df, population.rows
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
                + f" | seeds > 0 ({'/'.join(splits)}) |")
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
                + ", ".join("-" if c is None else f"{c['seeds_positive']}" for c in cells)
                + f" of {base['n_seeds']} |")
        out[method, site, size] = "\n".join(lines)
    return out


def category_contrast(population: Population, first: str = "identifier_repeat",
                      second: str = "identifier_first", sizes: set[int] | None = None) -> str:
    """A markdown table: per proxy family, size and OOD split, the gap (same_pred, iid minus the
    split) on `first` minus that on `second`, paired over seeds: mean [95% Student-t
    interval], and the seeds where it is positive."""
    df = population.df
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


def mechanism(population: Population) -> str:
    """The induction heads per seed, the verdict, the ablation line and head strength against
    the identifier_repeat gap (Spearman, permutation p; bootstrap interval from 16 seeds). With
    the test on identifier characters (its columns in induction_seeds.csv) its score and loss
    drop too, and the code task's verdict."""
    ok = population.per_seed.dropna(subset=["max_induction_score"])
    ident = "identifier_loss_drop" in ok
    lines = ["| seed | best head | score | loss drop | on code (uniform) | ablation drop "
             "identifier_repeat / other |" + (" identifier characters: score / loss drop |"
                                              if ident else ""),
             "|---|---|---|---|---|---|" + ("---|" if ident else "")]
    for _, r in ok.iterrows():
        lines.append(
            f"| {int(r['seed'])} | {int(r['best_layer'])}.{int(r['best_head'])} | "
            f"{r['max_induction_score']:.3f} | {r['loss_drop']:.2f} | "
            f"{r['code_target_attention']:.3f} ({r['code_uniform_on_target']:.3f}) | "
            f"{r['ablation_drop_repeat']:+.3f} / {r['ablation_drop_other']:+.3f} |"
            + (f" {r['identifier_max_score']:.3f} / {r['identifier_loss_drop']:.2f} |"
               if ident else ""))
    lines += ["", induction.verdict(ok["max_induction_score"], ok["loss_drop"], ok,
                                    tasks.get("code")),
              copying.ablation_line(ok, induction.cell)]
    columns = {"random-test score": "induction_score",
               **({"on identifier characters": "identifier_score"} if ident else {}),
               "on code": "target_attention"}
    scores = population.heads.merge(
        population.code[["seed", "layer", "head", "best", "target_attention"]],
        on=["seed", "layer", "head"])
    for name, heads in (("best heads", scores[scores["best"] == 1]),
                        ("other layer-1 heads", scores[(scores["best"] == 0)
                                                       & (scores["layer"] > 0)]),
                        ("layer-0 heads", scores[scores["layer"] == 0])):
        lines.append(f"{name} ({len(heads)}): " + ", ".join(
            f"{label} {heads[c].min():.3f} to {heads[c].max():.3f}"
            for label, c in columns.items()))
    lines += ["", "| split | category | accuracy | drop when the best head is mean-ablated |",
              "|---|---|---|---|"]
    best = population.ablation[population.ablation["best"] == 1]
    for (split, category), g in best.groupby(["split", "category"], sort=False):
        mean, low, high = stats.t_interval(g["drop"].to_numpy())
        lines.append(f"| {split} | {category} | {g['acc_original'].mean():.3f} | "
                     f"{mean:+.3f} [{low:+.3f}, {high:+.3f}] |")
    lines.append("")
    strengths = ["max_induction_score", "loss_drop", "code_target_attention",
                 "ablation_drop_repeat"] + (["identifier_loss_drop"] if ident else [])
    for strength in strengths:
        table = copying.head_predicts_gap(population.df, ok, stats, strength=strength)
        table = table[np.isfinite(table["rho"])]  # Spearman is undefined below 3 seeds
        if table.empty:
            lines.append(f"{strength} vs the identifier_repeat gap: undefined at {len(ok)} "
                         "seeds")
            continue
        best = table.sort_values("p_value").head(3)
        lines.append(
            f"{strength} vs the identifier_repeat gap: {int((table['p_value'] < 0.05).sum())} of "
            f"{len(table)} with p < 0.05 (rho {table['rho'].min():+.2f} to "
            f"{table['rho'].max():+.2f}); smallest p: " + "; ".join(
                f"{r.method} {r.site} {r.size} {r.split} rho "
                f"{tables.rho_cell(r.rho, r.rho_low, r.rho_high)} p {r.p_value:.3f}"
                for r in best.itertuples()))
    return "\n".join(lines)


# Per-seed measures that `compare` pairs across two populations (induction_seeds.csv).
COMPARED = ("max_induction_score", "loss_drop", "code_target_attention", "identifier_max_score",
            "identifier_loss_drop", "ablation_repeat_minus_other")


def compare(population: Population, other: Population) -> str:
    """A markdown table: per-seed measures of `population` minus `other` on the seeds both have
    (e.g. two recipes' runs of the same seeds), mean [95% t interval], the seeds whose difference
    is > 0 and the two-sided sign-flip permutation p (`stats.sign_flip_p`): the original
    model's accuracy per split, then COMPARED (those both populations measured)."""
    def accuracy(p: Population) -> pd.DataFrame:
        own = p.df[(p.df["method"] == "original") & (p.df["breakdown"] == "all")]
        return own.pivot_table(index="seed", columns="split", values="acc", observed=True)

    ours, theirs = accuracy(population), accuracy(other)
    seeds = sorted(set(ours.index) & set(theirs.index))
    if len(seeds) < 2:
        raise ValueError(f"the populations share {len(seeds)} seed(s): compare runs of the same "
                         "seeds (at least 2)")
    pairs = {f"accuracy {s}": (ours.loc[seeds, s], theirs.loc[seeds, s])
             for s in ours.columns if s in theirs.columns}
    a, b = (p.per_seed.set_index("seed").loc[seeds] for p in (population, other))
    pairs |= {c: (a[c], b[c]) for c in COMPARED if c in a and c in b}
    lines = ["| measure | this | other | difference [95% t] | seeds > 0 | sign-flip p |",
             "|---|---|---|---|---|---|"]
    for name, (x, y) in pairs.items():
        d = np.asarray(x, np.float64) - np.asarray(y, np.float64)
        s = stats.paired_summary(d)
        interval = ("(the same in every seed)" if np.isnan(s["ci_low"])
                    else f"[{s['ci_low']:+.3f}, {s['ci_high']:+.3f}]")
        lines.append(f"| {name} | {np.mean(x):.3f} | {np.mean(y):.3f} | {s['mean']:+.3f} "
                     f"{interval} | "
                     f"{s['seeds_positive']}/{s['n_seeds']} | {stats.sign_flip_p(d):.4f} |")
    return f"{len(seeds)} seeds in both ({', '.join(map(str, seeds))}):\n\n" + "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("workdirs", nargs="+", metavar="workdir",
                        help="a finished code run, or runs of one config with disjoint seeds")
    parser.add_argument("--sizes", default="", help="comma-separated sizes (default: all)")
    parser.add_argument("--against", nargs="+", default=(), metavar="workdir",
                        help="another population of the same seeds (e.g. another recipe's "
                        "run): print the per-seed differences of this one minus it, and only "
                        "them")
    args = parser.parse_args()
    sizes = {int(s) for s in args.sizes.split(",")} if args.sizes else None
    try:
        population = load(args.workdirs)
        if args.against:
            print(compare(population, load(args.against)))
            return
    except (OSError, ValueError) as err:
        raise SystemExit(f"error: {err}") from None
    print(f"{population.df['seed'].nunique()} seeds from {', '.join(population.workdirs)}\n")
    for breakdown in ("category", "bracket_depth"):
        for (method, site, size), table in gap_tables(population, breakdown, sizes).items():
            print(f"same_pred gap by {breakdown}, {method} {site} size {size}:\n\n{table}\n")
    for first, second in (("identifier_repeat", "identifier_first"),
                          ("close_bracket", "open_bracket")):
        print(f"## {first} minus {second}: the gaps' paired difference\n")
        print(category_contrast(population, first, second, sizes), "\n")
    print("## Induction heads\n")
    print(mechanism(population))


if __name__ == "__main__":
    main()
