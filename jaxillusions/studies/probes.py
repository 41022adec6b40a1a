"""Linear probes of the task's concepts, and what concept erasure leaves of them, per split: the
sweep's probe stage (probes.sites not empty), run after the proxy evaluation.

A linear probe's claim: "the concept is linearly represented at this site". Erasure's (proxies/
erasure.py): "after LEACE the concept is not linearly decodable". Both are fitted on the
training distribution; this table asks whether they still hold on every evaluation split.

Per seed, site of probes.sites and concept of proxies.concepts (tasks.concept_labels),
fitted on the sample the erasure proxy is fitted on (the first proxies.kmeans_samples positions
of the training sentences):
  - the probe: ridge least squares on the one-hot class (probes.ridge times Cov's mean
    eigenvalue), predicting the argmax; closed form, batched over seeds. Least squares, not
    logistic regression: it is exact, deterministic and LEACE's own notion of linear (after
    LEACE the least-squares probe is constant);
  - the eraser: the erasure proxy's (erasure.leace, fitted by faithfulness.fit.fit_one), per head;
    a site's probe reads all its heads at once.
Closed form, batched over seeds, on the host in float64 (the eraser in float32, as the proxy's).
Every position of a split where the concept is defined counts (not only evaluated ones).
Besides the evaluation splits, rows of split `train_heldout`: training sentences after those
the fit sample reads, as many as the largest evaluation split, drawn from the training
distribution itself (Dyck's `iid` is not: it holds sentences absent from train, so longer ones
than train's average); none where the fit sample reaches the last training sentence, which a
note in probes.txt and on the console says (`heldout_note`).

Columns of probes.csv (one row per seed, site, concept, evaluation split):
  n, n_seen        positions with the concept defined; those of a class seen in the fit sample
  probe_acc        the train-fitted probe's accuracy on the split
  probe_acc_seen   the same on the positions of seen classes (a probe cannot name an unseen
                   class: Dyck's depths 7..10 of unseen_depth)
  chance_acc       always predicting the fit sample's most frequent class
  refit_acc        a probe fitted on the split's own fit half (fit_shift.halves), scored on its
                   evaluation half: how decodable the concept is on that split at all
  erased_refit_acc the same on the activations after the train-fitted LEACE: decodable after
                   erasure? At the fit data this is chance by construction; on another split
                   erasure fitted in distribution may leave the concept decodable
  refit_chance_acc the fit half's most frequent class, scored on the evaluation half
probes.txt (studies/probes.py): per site and concept, means with 95% intervals over seeds and
paired differences: probe_acc on each split against the gap baseline, and what erasure leaves.

probes.txt: the probe table of this module (probes.csv) summarised over seeds with
report/stats.py: means with 95% intervals (accuracies on the logit scale), and paired per-seed
differences with Student-t 95% intervals and the count of seeds above zero.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os

import jax
import numpy as np

from jaxillusions import tasks
from jaxillusions.config.fields import NUMBER, STRS, setting
from jaxillusions.faithfulness.collect import Chunking, collect
from jaxillusions.faithfulness.fit import fit_one
from jaxillusions.faithfulness.specs import ProxySpec, resolve_site
from jaxillusions.report import stats, tables
from jaxillusions.runtime import distributed, stages
from jaxillusions.studies import fit_shift
from jaxillusions.studies.stage import Context, Stage


def _by(rows, *keys) -> dict:
    out: dict = {}
    for r in rows:
        out.setdefault(tuple(r[k] for k in keys), {})[r["seed"]] = r
    return out


def _paired(a: dict, b: dict, f) -> np.ndarray:
    """f(row of a, row of b) on the seeds in both."""
    return np.array([f(a[s], b[s]) for s in sorted(set(a) & set(b))], np.float64)


def _interval(summary: dict) -> str:
    """'+0.081 [+0.020,+0.142] 4/4'; without an interval, why (stats.paired_summary)."""
    interval = (f"[{summary['ci_low']:+.3f},{summary['ci_high']:+.3f}]"
                if math.isfinite(summary["ci_low"]) else
                "(one seed)" if summary["n_seeds"] < 2 else "(in every seed)")
    return f"{summary['mean']:+.3f} {interval} {summary['seeds_positive']}/{summary['n_seeds']}"


def report(rows: list[dict], baseline: str, reference: str, note: str | None = None) -> str:
    """The text of probes.txt: per site and concept, one line per split, after `note` (a line
    on what is missing, `heldout_note`). Intervals are 95% over seeds: Student-t on (paired)
    per-seed differences; accuracies' on the logit scale."""
    lines = ["Linear probes and concept erasure (probes.csv; docs/lenses.md): means over seeds "
             "[95% interval] and seeds > 0 / seeds.", *([note] if note else [])]
    table = _by(rows, "site", "concept", "split")
    header = (f"  {'split':<18}{'probe_acc':<22}{'gap':<28}{'gap on seen classes':<28}"
              f"{'left':<28}{'left - left on ' + reference:<40}decodable")
    for site, concept in dict.fromkeys((k[0], k[1]) for k in table):
        splits = [k[2] for k in table if k[:2] == (site, concept)]
        base = table.get((site, concept, baseline), {})
        ref = table.get((site, concept, reference), {})
        lines += ["", f"{site}, concept {concept} ({len(base)} seeds):", header]
        for split in splits:
            per_seed = table[(site, concept, split)]
            mean, low, high = stats.bounded_interval(
                np.array([r["probe_acc"] for r in per_seed.values()]))
            gap = seen = more = ""
            if split != baseline and base:
                gap = _interval(stats.paired_summary(_paired(
                    base, per_seed, lambda b, s: b["probe_acc"] - s["probe_acc"])))
            if gap and any(r["n_seen"] < r["n"] for r in per_seed.values()):
                seen = _interval(stats.paired_summary(_paired(
                    base, per_seed, lambda b, s: b["probe_acc_seen"] - s["probe_acc_seen"])))
            if split != reference and ref:
                more = _interval(stats.paired_summary(_paired(
                    ref, per_seed, lambda b, s: _left(s) - _left(b))))
            left = _interval(stats.paired_summary(np.array([_left(r) for r in per_seed.values()])))
            there = _interval(stats.paired_summary(np.array(
                [r["refit_acc"] - r["refit_chance_acc"] for r in per_seed.values()])))
            lines.append(f"  {split:<18}{f'{mean:.3f} [{low:.3f},{high:.3f}]':<22}{gap:<28}"
                         f"{seen:<28}{left:<28}{more:<40}{there}")
    lines += ["", f"gap: probe_acc on {baseline} minus on the split (> 0: the train-fitted probe "
              "is less right there); on seen classes: probe_acc_seen's, where the split has "
              "classes the probe never saw (Dyck's unseen depths). left: erased_refit_acc - "
              "refit_chance_acc, the accuracy "
              "above chance of a probe fitted on the split's fit half after the train-fitted "
              "LEACE, scored on its evaluation half (> 0: erasure left the concept decodable); "
              f"left - left on {reference} (training sentences outside the fit sample): paired, "
              "what erasure leaves beyond what it leaves in distribution; decodable: refit_acc - "
              "refit_chance_acc, the same without erasure."]
    return "\n".join(lines)


def _left(row: dict) -> float:
    return row["erased_refit_acc"] - row["refit_chance_acc"]


# A reference row: training sentences the probes and the eraser were not fitted on, as many as
# the largest evaluation split (the measure's in-distribution floor).
HELDOUT = "train_heldout"


COLUMNS = ("seed", "site", "concept", "split", "n", "n_seen", "probe_acc", "probe_acc_seen",
           "chance_acc", "refit_acc", "erased_refit_acc", "refit_chance_acc")


ROWS_FILE = "probes_rows.json"


REPORTS = ("probes.csv", "probes.txt")


def enabled(config) -> bool:
    """With probes.sites (linear probes and concept erasure per split)."""
    return bool(config.probes.sites)


def check(config, model_cfg) -> list[str]:
    """One-line ValueError for probe sites that are not vector sites, or concepts the task does
    not have (the door runs it before any work)."""
    pc, task = config.proxies, tasks.get(config)
    unknown = [c for c in pc.concepts if c not in task.CONCEPTS]
    if unknown:
        raise ValueError(f"proxies.concepts: {unknown[0]!r} is not a concept of task "
                         f"{task.NAME}; available: {', '.join(task.CONCEPTS)}")
    if not enabled(config):
        return []
    if not pc.concepts:
        raise ValueError(f"probes.sites={tuple(config.probes.sites)}: needs proxies.concepts "
                         f"(the concepts to probe; task {task.NAME} has "
                         f"{', '.join(task.CONCEPTS)})")
    for site in config.probes.sites:
        try:
            resolved = resolve_site(site, model_cfg)
        except ValueError as err:
            raise ValueError(f"probes.sites: {err}") from None
        if resolved.split(".")[-1] in ("scores", "pattern", "logits"):
            raise ValueError(f"probes.sites: {site!r} is not a vector site of the "
                             "residual stream's kind (attention scores, patterns and logits "
                             "are not probed)")
    return []


def fit_probe(x: np.ndarray, z: np.ndarray, weight: np.ndarray, ridge: float,
              num_classes: int | None = None) -> dict:
    """Ridge least squares of the one-hot class on x [..., N, F] (leading axes: seeds) over
    the rows with weight > 0 and z >= 0 (z [N], weight [N], shared by the leading axes) ->
    {"coef": [..., F, K], "bias": [..., K]}; predict with `predict`."""
    x = np.asarray(x, np.float64)
    f = x.shape[-1]
    k = num_classes or int(max(z.max(initial=0), 0)) + 1
    w = (np.asarray(weight, np.float64) * (z >= 0))[:, None]
    n = max(w.sum(), 1.0)
    mean = (w * x).sum(-2) / n
    xc = (x - mean[..., None, :]) * w
    y = np.eye(k)[np.maximum(z, 0)] * w
    mean_y = y.sum(0) / n
    cov = np.swapaxes(xc, -1, -2) @ xc / n
    # Relative ridge; the floor keeps a constant x (every feature erased) solvable.
    lam = ridge * np.maximum(np.trace(cov, axis1=-2, axis2=-1) / f, np.finfo(np.float64).tiny)
    coef = np.linalg.solve(cov + lam[..., None, None] * np.eye(f),
                           np.swapaxes(xc, -1, -2) @ ((y - mean_y) * w) / n)
    return {"coef": coef, "bias": mean_y - (mean[..., None, :] @ coef)[..., 0, :]}


def predict(probe: dict, x: np.ndarray) -> np.ndarray:
    """The probe's class for x [..., N, F]: the argmax of its scores. A class absent from the
    fit data scores 0 while the scores sum to 1, so it is never predicted."""
    return np.argmax(np.asarray(x, np.float64) @ probe["coef"] + probe["bias"][..., None, :],
                     axis=-1)


def erase(eraser: dict, x: np.ndarray) -> np.ndarray:
    """erasure.erase on the host: one eraser per seed and head (leaves [S, G, ...]), x
    [S, G, N, F]."""
    delta = (x - eraser["mean"][..., None, :]) @ np.swapaxes(eraser["right"], -1, -2)
    return x - delta @ np.swapaxes(eraser["left"], -1, -2)


def _majority(z: np.ndarray, weight: np.ndarray) -> int:
    return int(np.argmax(np.bincount(z[(z >= 0) & (weight > 0)], minlength=1)))


def _split_sums(probe, eraser, chance: int, seen: np.ndarray, x: np.ndarray, z: np.ndarray,
                half: np.ndarray, ridge: float) -> dict:
    """One split: x [S, G, M, F] (every position), z [M], half [M] (in the fit half) -> counts
    [S] of COLUMNS' positions and correct predictions."""
    whole = _whole_site(x)
    defined = z >= 0
    on_seen = defined & seen[np.maximum(z, 0)]
    right = predict(probe, whole) == z
    fit_w = (half & defined).astype(np.float64)
    held = ~half & defined

    def refit(values):
        return ((predict(fit_probe(values, z, fit_w, ridge), values) == z) & held).sum(-1)

    return {"n": np.full(len(x), defined.sum()), "n_seen": np.full(len(x), on_seen.sum()),
            "probe": (right & defined).sum(-1), "probe_seen": (right & on_seen).sum(-1),
            "chance": np.full(len(x), ((z == chance) & defined).sum()),
            "held": np.full(len(x), held.sum()), "refit": refit(whole),
            "erased_refit": refit(_whole_site(erase(eraser, x))),
            "refit_chance": np.full(len(x), ((z == _majority(z, fit_w)) & held).sum())}


def _whole_site(x: np.ndarray) -> np.ndarray:
    """[S, G, N, F] (heads G) -> [S, N, G * F]: a probe reads every head of the site."""
    return np.moveaxis(x, 1, 2).reshape(x.shape[0], x.shape[2], -1)


def heldout_train(train, num_samples: int, size: int):
    """The `size` training sentences after those the fit sample reads (its first num_samples
    positions), or fewer if train ends first; None if none is left."""
    ends = np.cumsum((train.tokens != tasks.PAD).sum(1))  # positions up to each sentence
    used = int(np.searchsorted(ends, num_samples)) + 1
    if used >= len(ends):
        return None
    return tasks.subset(train, np.arange(used, min(used + size, len(ends))))


def heldout_note(train, num_samples: int) -> str | None:
    """Why there are no `HELDOUT` rows (the fit sample reaches the last training sentence), or
    None where there are."""
    if heldout_train(train, num_samples, 1) is not None:
        return None
    positions = int((train.tokens != tasks.PAD).sum())
    return (f"No {HELDOUT} rows, so no 'left - left on {HELDOUT}': no training sentence is left "
            f"after the fit sample's {min(num_samples, positions)} positions (proxies."
            f"kmeans_samples={num_samples}; train has {len(train.tokens)} sentences, "
            f"{positions} positions).")


def compute(params, healthy, seeds, splits, model_cfg, config, say=print) -> list[dict]:
    """The rows of probes.csv (module docstring)."""
    pc, task = config.proxies, tasks.get(config)
    sites = tuple(resolve_site(s, model_cfg) for s in config.probes.sites)
    # The erasure proxy on the probe sites: its sample, and its erasers (fitted as the
    # proxy's, per head).
    spec = ProxySpec("erasure", sites, tuple(range(len(pc.concepts))))
    chunking = Chunking(pc.seed_chunk_size, say)

    def sample(split, num_samples: int) -> dict:
        return collect(params, split, model_cfg, [spec], num_samples=num_samples,
                       batch_size=pc.collect_batch_size,
                       labels=tasks.concept_labels(task, split, pc.concepts),
                       chunking=chunking)

    train = fit_shift.fit_data(splits, "train", config)
    fit = sample(train, pc.kmeans_samples)
    erasers = fit_one(spec, 0, fit, jax.random.PRNGKey(config.seed), len(seeds),
                      chunking=chunking).params
    sets = {n: splits[n] for n in pc.eval_splits}
    heldout = heldout_train(train, pc.kmeans_samples, max(len(v.tokens) for v in sets.values()))
    if heldout is not None:  # the in-distribution reference of erasure: unseen training rows
        sets = {HELDOUT: heldout, **sets}
    names, rows = list(sets), []
    halves = {n: fit_shift.halves(len(sets[n].tokens), config.seed)[0] for n in names}
    sentence = {n: np.nonzero(sets[n].tokens != tasks.PAD)[0] for n in names}
    # Every position of each split, in row-major order (whose sentences `sentence` lists).
    evals = {n: sample(sets[n], len(sentence[n])) for n in names}
    labels = {n: evals[n][sites[0]]["labelled"]["z"][0, 0] for n in names}  # [M, C]
    z_fit = fit[sites[0]]["labelled"]["z"][0, 0]  # [N, C], the same for every seed and head
    for site in sites:
        x_fit = _whole_site(fit[site]["labelled"]["x"])
        x_eval = {n: evals[n][site]["labelled"]["x"].astype(np.float64) for n in names}
        for c, concept in enumerate(pc.concepts):
            z = z_fit[:, c]
            # One-hot columns for the classes that occur (an absent class is never predicted).
            k = 1 + max(int(v[:, c].max(initial=0)) for v in (z_fit, *labels.values()))
            probe = fit_probe(x_fit, z, np.ones(len(z)), config.probes.ridge, k)
            seen = np.bincount(z[z >= 0], minlength=k) > 0
            eraser = jax.tree.map(lambda a, c=c: np.asarray(a[:, :, c], np.float64),
                                  erasers[site])
            sums = [_split_sums(probe, eraser, _majority(z, np.ones(len(z))), seen, x_eval[n],
                                labels[n][:, c], np.isin(sentence[n], halves[n]),
                                config.probes.ridge)
                    for n in names]
            sums = {key: np.stack([s[key] for s in sums], axis=1) for key in sums[0]}  # [S, P]
            rows += _rows(sums, seeds, healthy, site, concept, names)
    return rows


def _rows(sums: dict, seeds, healthy, site: str, concept: str, names) -> list[dict]:
    def ratio(num, den):
        return float(num / den) if den else math.nan

    out = []
    for s, seed in enumerate(seeds):
        if healthy is not None and not healthy[s]:
            continue
        for p, name in enumerate(names):
            v = {k: float(a[s, p]) for k, a in sums.items()}
            out.append({"seed": int(seed), "site": site, "concept": concept, "split": name,
                        "n": int(v["n"]), "n_seen": int(v["n_seen"]),
                        "probe_acc": ratio(v["probe"], v["n"]),
                        "probe_acc_seen": ratio(v["probe_seen"], v["n_seen"]),
                        "chance_acc": ratio(v["chance"], v["n"]),
                        "refit_acc": ratio(v["refit"], v["held"]),
                        "erased_refit_acc": ratio(v["erased_refit"], v["held"]),
                        "refit_chance_acc": ratio(v["refit_chance"], v["held"])})
    return out


def run(ctx: Context) -> Context:
    """The stage, on a weight group's context: rows (one stage file, proxies/probes_rows.json,
    stamped with the settings it used), then probes.csv and probes.txt in its directory."""
    config, workdir, files, say = ctx.settings, ctx.directory, ctx.files, ctx.say
    pc = config.proxies
    stamp = stages.stamp(sites=list(config.probes.sites), concepts=list(pc.concepts), heldout=True,
                         ridge=config.probes.ridge, splits=list(pc.eval_splits), seed=config.seed,
                         samples=pc.kmeans_samples, batch=pc.collect_batch_size,
                         **fit_shift.fit_stamp(config))
    path = os.path.join(files.dir, ROWS_FILE)
    rows = files.load(path, stamp, stages.read_json)
    if rows is None:
        say(f"probes: {', '.join(pc.concepts)} at {', '.join(config.probes.sites)}")
        rows = compute(ctx.params, ctx.healthy, ctx.seeds, ctx.splits, ctx.model_cfg, config,
                       say)
        stages.write(path, json.dumps({"stamp": stamp, "value": rows}), "probes")
    ctx = ctx.produced("probes", rows=rows)  # the prediction study's probe features
    if not distributed.is_main():
        return ctx
    with stages.writing("report", os.path.join(workdir, "probes.csv")):
        tables.write_csv(rows, os.path.join(workdir, "probes.csv"), COLUMNS)
    note = heldout_note(fit_shift.fit_data(ctx.splits, "train", config), pc.kmeans_samples)
    if note:
        say(f"probes: {note}")
    text = report(rows, pc.gap_baseline, HELDOUT, note)
    with stages.writing("report", os.path.join(workdir, "probes.txt")), \
            open(os.path.join(workdir, "probes.txt"), "w") as f:
        f.write(text + "\n")
    return ctx


def report_lines(ctx: Context) -> list[str]:
    """probes.txt's lines for the main report (gap_table.txt), or [] without a probe table."""
    path = os.path.join(ctx.directory, "probes.txt")
    if not enabled(ctx.settings) or not os.path.exists(path):
        return []
    with open(path) as f:
        return ["", *f.read().rstrip("\n").split("\n")]


@dataclasses.dataclass(frozen=True)
class Probes:
    """Linear probes of proxies.concepts per split (jaxillusions/studies/probes.py)."""

    sites: tuple[str, ...] = setting(
        (), STRS, "vector sites, or () for no probe table",
        doc="sites of the linear-probe table (probes.csv, probes.txt)")
    ridge: float = setting(1e-3, NUMBER, "> 0", lambda v, s: v > 0,
                           "ridge of the probes, times Cov's mean eigenvalue")


# The main job's stage (job.PIPELINE): per weight group, after the proxies.
STAGE = Stage("probes", run, enabled=enabled, keys=("probes.*", "proxies.*"), outputs=REPORTS,
              section=Probes, check=check, report=report_lines, makes=("probes",))
