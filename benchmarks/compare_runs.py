"""Paired differences between two sweeps of the same config and seeds that differ in one
training setting (e.g. model.compute_dtype), from their results.csv files:

    python -m benchmarks.compare_runs runs/dyck_small_f32 runs/dyck_small_bf16

Prints, per split, the original model's accuracy difference (B minus A) and, for every proxy
(method, site, size), the difference of its same_pred gap (baseline split minus split), each with
a paired Student-t 95% interval over the seeds, and how many intervals exclude 0.
"""

from __future__ import annotations

import argparse
import os

import numpy as np
import pandas as pd

from jaxillusions.report import load_results, stats
from jaxillusions.runtime import schema


def _table(workdir: str) -> pd.DataFrame:
    rows = load_results(workdir)
    rows = rows[rows.breakdown == "all"].astype({"method": str})  # proxies in name order
    try:
        return schema.one_group(rows, workdir)
    except ValueError:  # several groups: name their directories
        groups = sorted(d for d in os.listdir(workdir)
                        if os.path.isfile(os.path.join(workdir, d, "results.csv")))
        raise SystemExit(f"error: {workdir} holds several groups of members; compare one "
                         f"group's directory: {', '.join(groups)}") from None


def compare(dir_a: str, dir_b: str, baseline: str = "iid") -> dict[str, list[dict]]:
    a, b = _table(dir_a), _table(dir_b)
    out = {"accuracy": [], "gaps": []}

    def paired(name: str, va: pd.Series, vb: pd.Series) -> dict:
        joined = pd.concat({"a": va, "b": vb}, axis=1).dropna()
        mean, low, high = stats.t_interval((joined.b - joined.a).to_numpy())
        return {"name": name, "a_mean": float(joined.a.mean()), "diff": mean, "low": low,
                "high": high, "n_seeds": len(joined)}

    originals = {k: t[t.method == "original"].set_index(["split", "seed"]).acc for k, t in
                 (("a", a), ("b", b))}
    for split in a[a.method == "original"].split.unique():
        out["accuracy"].append(paired(split, originals["a"][split], originals["b"][split]))
    for key, group in a[a.method != "original"].groupby(["method", "site", "size"]):
        other = b[(b.method == key[0]) & (b.site == key[1]) & (b["size"] == key[2])]

        def gap(t: pd.DataFrame, split: str) -> pd.Series:
            sp = t.set_index(["split", "seed"]).same_pred
            return sp[baseline] - sp[split]

        for split in group.split.unique():
            if split != baseline:
                out["gaps"].append(paired(f"{key[0]} {key[1]} {key[2]} {split}",
                                          gap(group, split), gap(other, split)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("--baseline", default="iid")
    args = parser.parse_args()
    out = compare(args.a, args.b, args.baseline)
    for kind, rows in out.items():
        what = ("original-model accuracy" if kind == "accuracy" else
                f"same_pred gap ({args.baseline} minus split)")
        print(f"{what}: B minus A, mean [95% paired t interval] over seeds")
        for r in rows:
            star = "*" if r["low"] > 0 or r["high"] < 0 else ""
            print(f"  {r['name']:<62} A {r['a_mean']:+.4f}  B-A {r['diff']:+.4f} "
                  f"[{r['low']:+.4f}, {r['high']:+.4f}]{star}  ({r['n_seeds']} seeds)")
        excl = sum(r["low"] > 0 or r["high"] < 0 for r in rows)
        widths = [r["high"] - r["low"] for r in rows if np.isfinite(r["high"])]
        print(f"  -> {excl} of {len(rows)} intervals exclude 0 (* marks them); median interval "
              f"width {np.median(widths):.4f}\n")


if __name__ == "__main__":
    main()
