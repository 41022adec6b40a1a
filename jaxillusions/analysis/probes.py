"""probes.txt: the probe table of jaxillusions/probes.py (probes.csv) summarised over seeds with
analysis/stats.py: means with 95% intervals (accuracies on the logit scale), and paired per-seed
differences with Student-t 95% intervals and the count of seeds above zero."""

from __future__ import annotations

import numpy as np

from jaxillusions.analysis import stats


def _by(rows, *keys) -> dict:
    out: dict = {}
    for r in rows:
        out.setdefault(tuple(r[k] for k in keys), {})[r["seed"]] = r
    return out


def _paired(a: dict, b: dict, f) -> np.ndarray:
    """f(row of a, row of b) on the seeds in both."""
    return np.array([f(a[s], b[s]) for s in sorted(set(a) & set(b))], np.float64)


def _interval(summary: dict) -> str:
    return (f"{summary['mean']:+.3f} [{summary['ci_low']:+.3f},{summary['ci_high']:+.3f}] "
            f"{summary['seeds_positive']}/{summary['n_seeds']}")


def report(rows: list[dict], baseline: str, reference: str) -> str:
    """The text of probes.txt: per site and concept, one line per split. Intervals are 95% over
    seeds: Student-t on (paired) per-seed differences; accuracies' on the logit scale."""
    lines = ["Linear probes and concept erasure (probes.csv; docs/lenses.md): means over seeds "
             "[95% interval] and seeds > 0 / seeds."]
    table = _by(rows, "site", "concept", "split")
    header = (f"  {'split':<18}{'probe_acc':<22}{'gap':<28}{'left':<28}"
              f"{'left - left on ' + reference:<40}decodable")
    for site, concept in dict.fromkeys((k[0], k[1]) for k in table):
        splits = [k[2] for k in table if k[:2] == (site, concept)]
        base = table.get((site, concept, baseline), {})
        ref = table.get((site, concept, reference), {})
        lines += ["", f"{site}, concept {concept} ({len(base)} seeds):", header]
        for split in splits:
            per_seed = table[(site, concept, split)]
            mean, low, high = stats.bounded_interval(
                np.array([r["probe_acc"] for r in per_seed.values()]))
            gap = more = ""
            if split != baseline and base:
                gap = _interval(stats.paired_summary(_paired(
                    base, per_seed, lambda b, s: b["probe_acc"] - s["probe_acc"])))
            if split != reference and ref:
                more = _interval(stats.paired_summary(_paired(
                    ref, per_seed, lambda b, s: _left(s) - _left(b))))
            left = _interval(stats.paired_summary(np.array([_left(r) for r in per_seed.values()])))
            there = _interval(stats.paired_summary(np.array(
                [r["refit_acc"] - r["refit_chance_acc"] for r in per_seed.values()])))
            lines.append(f"  {split:<18}{f'{mean:.3f} [{low:.3f},{high:.3f}]':<22}{gap:<28}"
                         f"{left:<28}{more:<40}{there}")
    lines += ["", f"gap: probe_acc on {baseline} minus on the split (> 0: the train-fitted probe "
              "is less right there). left: erased_refit_acc - refit_chance_acc, the accuracy "
              "above chance of a probe fitted on the split's fit half after the train-fitted "
              "LEACE, scored on its evaluation half (> 0: erasure left the concept decodable); "
              f"left - left on {reference} (training sentences outside the fit sample): paired, "
              "what erasure leaves beyond what it leaves in distribution; decodable: refit_acc - "
              "refit_chance_acc, the same without erasure."]
    return "\n".join(lines)


def _left(row: dict) -> float:
    return row["erased_refit_acc"] - row["refit_chance_acc"]
