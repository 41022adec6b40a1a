"""Circuits as proxies (proxies/circuit.py): the area under faithfulness against circuit size per
seed and split, with paired gaps, the overlap of the circuits found across seeds and fit splits,
and circuits against the site proxies at equal in-distribution faithfulness. The sweep's
circuits stage (proxies.methods has "circuit"), after the fit shift.

Per seed, family (target circuit.<granularity>.<ablation>) and split, with x = size / units
(the fraction of the edges, nodes or neurons kept) and f(x) the faithfulness at that size:
  cpr  the area under f over the evaluated sizes (MIB's circuit performance ratio, Mueller et
       al. 2025, arXiv 2504.13151; trapezoids; the default sizes span 0 to every unit);
  cmd  the area between f and 1 (MIB's circuit-model distance; 0 is the model itself).
f is `same_pred` (agreement with the model's next token) or `1 - jsd`. circuits.csv: per
family, split and measure, the mean over seeds with its 95% interval and the paired gap against
proxies.gap_baseline (positive: less faithful on the split; cpr: baseline minus split, cmd:
split minus baseline).

circuits_overlap.csv: Jaccard overlap |A & B| / |A | B| of the circuits (the units of largest
|attribution|, whatever proxies.circuit_direction ablates) at every size strictly between 0 and
every unit: `seeds`, the mean over every pair of seeds of the same family (seed-to-seed
stability; edges and nodes are the same units in every seed, neurons are not: an MLP's neurons
may be permuted between seeds, so their `seeds` overlap is near chance by construction), with a
jackknife interval over seeds (stats.pairs_jackknife; pairs sharing a seed are not independent;
none below 3 seeds), and, with fit_shift.splits, `fit:<split>`, per seed the overlap of the
circuit fitted on <split> with the one fitted on train, with a logit-t interval over seeds
(benchmarks/circuit_overlap.py computes it for a finished run without the fit-shift stage).
n_seeds: the seeds the interval is over; n_pairs: the pairs of circuits averaged.

circuits_equal_iid.csv: with svd or kmeans in the run, each reference size on its site
matched per seed to the circuit size (below every unit) closest in baseline same_pred
(studies/dictionaries.py's equal_id), and the paired difference of their gaps (positive: the
circuit is the worse OOD proxy at equal in-distribution faithfulness).
"""

from __future__ import annotations

import itertools
import math
import os
from collections import defaultdict
from collections.abc import Iterable, Sequence

import numpy as np

from jaxillusions.model import patching
from jaxillusions.report import stats, tables
from jaxillusions.runtime import distributed, stages
from jaxillusions.studies import dictionaries
from jaxillusions.studies.stage import PROXIES, Context, Stage

METHOD = "circuit"
MEASURES = ("cpr", "cmd")
FAITHFULNESS = {"same_pred": lambda r: r["same_pred"], "1-jsd": lambda r: 1.0 - r["jsd"]}
COLUMNS = ("site", "split", "measure", "faithfulness", "mean", "low", "high", "baseline",
           "gap", *stats.SUMMARY_COLUMNS)
OVERLAP_COLUMNS = ("site", "size", "units", "between", "mean", "ci_low", "ci_high", "n_seeds",
                   "n_pairs")
REPORTS = ("circuits.csv", "circuits_overlap.csv", "circuits_equal_iid.csv")


def areas(xs: np.ndarray, fs: np.ndarray) -> dict[str, float]:
    """cpr and cmd of faithfulness fs at circuit fractions xs (sorted)."""
    return {"cpr": float(np.trapezoid(fs, xs)), "cmd": float(np.trapezoid(np.abs(1 - fs), xs))}


def units_of(target: str, model_cfg) -> int:
    """How many units a circuit family "circuit.<granularity>.<ablation>" chooses from."""
    return patching.num_units(model_cfg, target.split(".")[1])


def per_seed_areas(rows: Iterable[dict], model_cfg) -> list[dict]:
    """{seed, site, split, faithfulness, cpr, cmd} per seed, circuit family and split, from the
    `all` rows of method circuit."""
    curves = defaultdict(list)
    for r in rows:
        if r["method"] == METHOD and r["breakdown"] == "all":
            curves[(r["seed"], r["site"], r["split"])].append(r)
    out = []
    for (seed, site, split), curve in sorted(curves.items()):
        curve = sorted(curve, key=lambda r: r["size"])
        xs = np.array([r["size"] for r in curve], np.float64) / units_of(site, model_cfg)
        for name, f in FAITHFULNESS.items():
            fs = np.array([f(r) for r in curve], np.float64)
            out.append({"seed": seed, "site": site, "split": split, "faithfulness": name,
                        **areas(xs, fs)})
    return out


def area_table(per_seed: Sequence[dict], baseline: str) -> list[dict]:
    """circuits.csv's rows from per_seed_areas (module docstring)."""
    table = defaultdict(dict)
    for r in per_seed:
        table[(r["site"], r["faithfulness"], r["split"])][r["seed"]] = r
    out = []
    for (site, faith, split), by_seed in sorted(table.items()):
        base = table.get((site, faith, baseline), {})
        seeds = sorted(set(by_seed) & set(base))
        for measure in MEASURES:
            values = np.array([by_seed[s][measure] for s in by_seed], np.float64)
            mean, low, high = stats.t_interval(values, bounds=(0.0, 1.0))  # areas of [0, 1]
            row = {"site": site, "split": split, "measure": measure, "faithfulness": faith,
                   "mean": mean, "low": low, "high": high, "baseline": baseline}
            if split != baseline and seeds:
                b = np.array([base[s][measure] for s in seeds])
                o = np.array([by_seed[s][measure] for s in seeds])
                summary = stats.paired_summary(b - o if measure == "cpr" else o - b,
                                               bounds=(-1.0, 1.0))
                row |= {"gap": summary["mean"], **{k: summary[k]
                                                   for k in stats.SUMMARY_COLUMNS}}
            out.append(row)
    return out


def jaccard(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Jaccard overlap of boolean sets along the last axis (NaN where both are empty)."""
    union = np.logical_or(a, b).sum(-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(union > 0, np.logical_and(a, b).sum(-1) / union, math.nan)


def kept_sets(fitted: dict, sizes: Sequence[int]) -> np.ndarray:
    """The circuits [S, R, units] bool of a circuit family's fitted params ({target: leaves
    [S, 1, R, ...]}): the `size` units of largest |score| (circuits.select)."""
    (params,) = fitted.values()
    scores = np.abs(np.asarray(params["scores"], np.float64)[:, 0, 0])  # [S, units]
    order = np.argsort(-scores, axis=-1, kind="stable")
    rank = np.argsort(order, axis=-1, kind="stable")
    return rank[:, None, :] < np.asarray(sizes)[None, :, None]


def overlap_rows(spec, fitted: dict, shifted: dict[str, dict], model_cfg,
                 healthy: np.ndarray | None = None) -> list[dict]:
    """circuits_overlap.csv's rows of one circuit family: across seeds, and per fit split of
    `shifted` ({split: that split's fitted params of the family}) against train."""
    units = units_of(spec.target, model_cfg)
    sets = kept_sets(fitted, spec.sizes)
    keep = np.ones(len(sets), bool) if healthy is None else np.asarray(healthy, bool)
    out = []
    for r, size in enumerate(spec.sizes):
        if not 0 < size < units:
            continue
        base = {"site": spec.target, "size": int(size), "units": units}
        members = sets[keep, r]
        if len(members) > 1:  # every pair of seeds; a jackknife over seeds, inside [0, 1]
            pair = np.zeros((len(members),) * 2)
            for a, b in itertools.combinations(range(len(members)), 2):
                pair[a, b] = pair[b, a] = jaccard(members[a], members[b])
            mean, low, high = stats.pairs_jackknife(pair, bounds=(0.0, 1.0))
            out.append({**base, "between": "seeds", "mean": mean, "ci_low": low,
                        "ci_high": high, "n_seeds": len(members),
                        "n_pairs": len(members) * (len(members) - 1) // 2})
        for split, other in shifted.items():
            values = jaccard(members, kept_sets(other, spec.sizes)[keep, r])
            mean, low, high = stats.bounded_interval(values)  # one pair per seed: logit-t
            n = int(np.isfinite(values).sum())
            out.append({**base, "between": f"fit:{split}", "mean": mean, "ci_low": low,
                        "ci_high": high, "n_seeds": n, "n_pairs": n})
    return out


def equal_iid(rows: Sequence[dict], baseline: str, model_cfg) -> list[dict]:
    """circuits_equal_iid.csv: every circuit family against svd and kmeans on each of their
    sites, matched on baseline same_pred per seed (dictionaries.equal_id), among the circuits
    smaller than the whole model (the circuit of every unit is the model itself)."""
    out = []
    rows = [r for r in rows if str(r["breakdown"]) == "all"]  # equal_id's rows (its _frame)
    units = {site: units_of(site, model_cfg) for site in {r["site"] for r in rows
                                                          if r["method"] == METHOD}}
    circuit_rows = [r for r in rows if r["method"] == METHOD and r["size"] < units[r["site"]]]
    for reference in ("svd", "kmeans"):
        ref_rows = [r for r in rows if r["method"] == reference]
        for ref_site in sorted({r["site"] for r in ref_rows}):
            for family in sorted({r["site"] for r in circuit_rows}):
                moved = [{**r, "site": ref_site} for r in circuit_rows if r["site"] == family]
                for row in dictionaries.equal_id(
                        [r for r in ref_rows if r["site"] == ref_site] + moved,
                        baseline=baseline, reference=reference, dictionary=METHOD):
                    out.append({**row, "dictionary": family})
    return out


def run(ctx: Context) -> Context:
    """The stage: circuits.csv, circuits_overlap.csv and circuits_equal_iid.csv (process 0)."""
    r, pc = ctx.proxies, ctx.settings.proxies
    shift_fits = ctx.made.get("fit_shift", {}).get("fits", {})  # with fit_shift.splits
    areas_rows = area_table(per_seed_areas(r.rows, ctx.model_cfg), pc.gap_baseline)
    overlap = []
    for i, spec in enumerate(r.specs):
        if spec.method == METHOD:
            shifted = {split: fits[i].params for split, fits in shift_fits.items()}
            overlap += overlap_rows(spec, r.fitted[i], shifted, ctx.model_cfg, ctx.healthy)
    if distributed.is_main():
        for name, table, columns in (
                ("circuits.csv", areas_rows, COLUMNS),
                ("circuits_overlap.csv", overlap, OVERLAP_COLUMNS),
                ("circuits_equal_iid.csv", equal_iid(r.rows, pc.gap_baseline, ctx.model_cfg),
                 dictionaries.EQUAL_ID_COLUMNS)):
            path = os.path.join(ctx.directory, name)
            with stages.writing("report", path):
                tables.write_csv(table, path, columns)
    return ctx


def enabled(settings) -> bool:
    """With the circuit proxy (proxies.methods has "circuit")."""
    return METHOD in settings.proxies.methods


# The main job's stage (job.PIPELINE): per weight group, after the fit shift.
STAGE = Stage("circuits", run, enabled=enabled, keys=("proxies.*", "fit_shift.*"),
              outputs=REPORTS, needs=(PROXIES, "fit_shift"))
