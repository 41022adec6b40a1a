"""Linear probes of the task's concepts, and what concept erasure leaves of them, per split: the
sweep's probe stage (proxies.probe_sites not empty), run after the proxy evaluation.

A linear probe's claim: "the concept is linearly represented at this site". Erasure's (proxies/
erasure.py): "after LEACE the concept is not linearly decodable". Both are fitted on the
training distribution; this table asks whether they still hold on every evaluation split.

Per seed, site of proxies.probe_sites and concept of proxies.concepts (tasks.concept_labels),
fitted on the sample the erasure proxy is fitted on (the first proxies.kmeans_samples positions
of the training sentences):
  - the probe: ridge least squares on the one-hot class (proxies.probe_ridge times Cov's mean
    eigenvalue), predicting the argmax; closed form, batched over seeds. Least squares, not
    logistic regression: it is exact, deterministic and LEACE's own notion of linear (after
    LEACE the least-squares probe is constant);
  - the eraser: erasure.leace, the erasure proxy's (all heads of a site at once here).
Every position of a split where the concept is defined counts (not only evaluated ones).

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
probes.txt (analysis/probes.py): per site and concept, means with 95% intervals over seeds and
paired differences: probe_acc on each split against the gap baseline, and what erasure leaves.
"""

from __future__ import annotations

import functools
import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np

from jaxillusions import distributed, faithfulness, fit_shift, stages, tasks
from jaxillusions.analysis import probes as probes_report
from jaxillusions.analysis import tables
from jaxillusions.proxies import erasure

COLUMNS = ("seed", "site", "concept", "split", "n", "n_seen", "probe_acc", "probe_acc_seen",
           "chance_acc", "refit_acc", "erased_refit_acc", "refit_chance_acc")
ROWS_FILE = "probes_rows.json"
REPORTS = ("probes.csv", "probes.txt")
_HI = jax.lax.Precision.HIGHEST


def enabled(config) -> bool:
    return bool(config.proxies.probe_sites)


def check_config(config, model_cfg) -> None:
    """One-line ValueError for probe sites that are not vector sites, or concepts the task does
    not have (validate runs it before any work)."""
    pc, task = config.proxies, tasks.get(config)
    unknown = [c for c in pc.concepts if c not in task.CONCEPTS]
    if unknown:
        raise ValueError(f"proxies.concepts: {unknown[0]!r} is not a concept of task "
                         f"{task.NAME}; available: {', '.join(task.CONCEPTS)}")
    if not enabled(config):
        return
    if not pc.concepts:
        raise ValueError(f"proxies.probe_sites={tuple(pc.probe_sites)}: needs proxies.concepts "
                         f"(the concepts to probe; task {task.NAME} has "
                         f"{', '.join(task.CONCEPTS)})")
    for site in pc.probe_sites:
        try:
            resolved = faithfulness.resolve_site(site, model_cfg)
        except ValueError as err:
            raise ValueError(f"proxies.probe_sites: {err}") from None
        if resolved.split(".")[-1] in ("scores", "pattern", "logits"):
            raise ValueError(f"proxies.probe_sites: {site!r} is not a vector site of the "
                             "residual stream's kind (attention scores, patterns and logits "
                             "are not probed)")


# ---------------------------------------------------------------------------------------------
# The closed-form pieces, for one seed (vmapped over seeds).


def fit_probe(x: jax.Array, z: jax.Array, weight: jax.Array, ridge: float,
              num_classes: int = tasks.MAX_CONCEPT_CLASSES) -> dict:
    """Ridge least squares of the one-hot class on x [N, F] over the rows with weight > 0 and
    z >= 0 -> {"coef": [F, K], "bias": [K]}; predict with `predict`."""
    f = x.shape[-1]
    w = (weight * (z >= 0)).astype(jnp.float32)
    n = jnp.maximum(w.sum(), 1.0)
    x = jnp.where(w[:, None] > 0, x.astype(jnp.float32), 0.0)
    mean = (w @ x) / n
    xc = (x - mean) * w[:, None]
    y = jax.nn.one_hot(z, num_classes, dtype=jnp.float32) * w[:, None]
    mean_y = y.sum(0) / n
    cov = jnp.matmul(xc.T, xc, precision=_HI) / n
    # Relative ridge; the floor keeps a constant x (every feature erased) solvable.
    lam = ridge * jnp.maximum(jnp.trace(cov) / f, jnp.finfo(jnp.float32).tiny)
    coef = jnp.linalg.solve(cov + lam * jnp.eye(f),
                            jnp.matmul(xc.T, (y - mean_y) * w[:, None], precision=_HI) / n)
    return {"coef": coef, "bias": mean_y - jnp.matmul(mean, coef, precision=_HI)}


def predict(probe: dict, x: jax.Array) -> jax.Array:
    """The probe's class for x [..., F]: the argmax of its scores. A class absent from the fit
    data scores 0 while the scores sum to 1, so it is never predicted."""
    return jnp.argmax(jnp.matmul(x.astype(jnp.float32), probe["coef"], precision=_HI)
                      + probe["bias"], axis=-1)


def _majority(z: jax.Array, weight: jax.Array, num_classes: int) -> jax.Array:
    counts = (jax.nn.one_hot(z, num_classes) * (weight * (z >= 0))[:, None]).sum(0)
    return jnp.argmax(counts)


@functools.partial(jax.jit, static_argnames=("ridge",))
def _table(x_fit, z_fit, x_ev, z_ev, fit_half, *, ridge: float) -> dict:
    """One site and concept. x_fit [S, N, F], z_fit [N] (the fit sample; z < 0: undefined),
    x_ev [S, P, M, F], z_ev [P, M] (P splits padded to M positions with z = -1), fit_half
    [P, M] -> sums [S, P] per metric (COLUMNS' counts and correct predictions)."""
    k = tasks.MAX_CONCEPT_CLASSES
    ones = jnp.ones(z_fit.shape, jnp.float32)
    seen = jnp.zeros(k, jnp.int32).at[jnp.maximum(z_fit, 0)].add(z_fit >= 0) > 0
    chance = _majority(z_fit, ones, k)

    def one_seed(x, xs):
        probe = fit_probe(x, z_fit, ones, ridge)
        eraser = erasure.leace(x, z_fit, jnp.ones(z_fit.shape, bool))

        def one_split(xs, z, half):
            defined = z >= 0
            on_seen = defined & seen[jnp.maximum(z, 0)]
            right = predict(probe, xs) == z
            fit_w = (half & defined).astype(jnp.float32)
            held = ~half & defined

            def refit(values):
                return (predict(fit_probe(values, z, fit_w, ridge), values) == z) & held

            return {"n": defined.sum(), "n_seen": on_seen.sum(),
                    "probe": (right & defined).sum(), "probe_seen": (right & on_seen).sum(),
                    "chance": ((z == chance) & defined).sum(), "held": held.sum(),
                    "refit": refit(xs).sum(),
                    "erased_refit": refit(erasure.erase(eraser, xs)).sum(),
                    "refit_chance": ((z == _majority(z, fit_w, k)) & held).sum()}

        return jax.vmap(one_split)(xs, z_ev, fit_half)

    return jax.vmap(one_seed)(x_fit, x_ev)


# ---------------------------------------------------------------------------------------------
# The stage.


def _whole_site(x: np.ndarray) -> np.ndarray:
    """[S, G, N, F] (heads G) -> [S, N, G * F]: a probe reads every head of the site."""
    return np.moveaxis(x, 1, 2).reshape(x.shape[0], x.shape[2], -1)


def compute(params, healthy, seeds, splits, model_cfg, config, say=print) -> list[dict]:
    """The rows of probes.csv (module docstring)."""
    pc, task = config.proxies, tasks.get(config)
    sites = tuple(faithfulness.resolve_site(s, model_cfg) for s in pc.probe_sites)
    spec = faithfulness.ProxySpec("erasure", sites, tuple(range(len(pc.concepts))))
    chunking = dict(seed_chunk_size=pc.seed_chunk_size, say=say)

    def sample(split, num_samples: int) -> dict:
        return faithfulness.collect(params, split, model_cfg, [spec], num_samples=num_samples,
                                    batch_size=pc.collect_batch_size,
                                    labels=tasks.concept_labels(task, split, pc.concepts),
                                    **chunking)

    train = fit_shift.fit_data(splits, "train", config)
    fit = sample(train, pc.kmeans_samples)
    names = list(pc.eval_splits)
    evals, sentence = {}, {}
    for name in names:
        valid = splits[name].tokens != tasks.PAD
        evals[name] = sample(splits[name], int(valid.sum()))  # every position
        # The collected positions are every valid one in row-major order: their sentences.
        sentence[name] = np.nonzero(valid)[0]
    width = max(len(sentence[n]) for n in names)
    fit_half = np.zeros((len(names), width), bool)
    for p, name in enumerate(names):
        first = fit_shift.halves(len(splits[name].tokens), config.seed)[0]
        fit_half[p, :len(sentence[name])] = np.isin(sentence[name], first)
    rows = []
    for site in sites:
        x_fit = _whole_site(fit[site]["labelled"]["x"])
        z_fit = fit[site]["labelled"]["z"][0, 0]  # [N, C], the same for every seed and head
        x_ev = np.stack([np.pad(_whole_site(evals[n][site]["labelled"]["x"]),
                                ((0, 0), (0, width - len(sentence[n])), (0, 0))) for n in names],
                        axis=1)
        for c, concept in enumerate(pc.concepts):
            z_ev = np.stack([np.pad(evals[n][site]["labelled"]["z"][0, 0, :, c],
                                    (0, width - len(sentence[n])), constant_values=-1)
                             for n in names])
            sums = jax.device_get(_table(x_fit, z_fit[:, c], x_ev, z_ev, fit_half,
                                         ridge=pc.probe_ridge))
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


def run(params, healthy, seeds, splits, model_cfg, config, workdir: str, files, say) -> None:
    """The stage: rows (one stage file, proxies/probes_rows.json, stamped with the settings it
    used), then probes.csv and probes.txt in `workdir`."""
    pc = config.proxies
    stamp = stages.stamp(sites=list(pc.probe_sites), concepts=list(pc.concepts),
                         ridge=pc.probe_ridge, splits=list(pc.eval_splits), seed=config.seed,
                         samples=pc.kmeans_samples, batch=pc.collect_batch_size,
                         **fit_shift.fit_stamp(config))
    path = os.path.join(files.dir, ROWS_FILE)
    rows = files.load(path, stamp, stages.read_json)
    if rows is None:
        say(f"probes: {', '.join(pc.concepts)} at {', '.join(pc.probe_sites)}")
        rows = compute(params, healthy, seeds, splits, model_cfg, config, say)
        stages.write(path, json.dumps({"stamp": stamp, "value": rows}), "probes")
    if not distributed.is_main():
        return
    with stages.writing("report", os.path.join(workdir, "probes.csv")):
        tables.write_csv(rows, os.path.join(workdir, "probes.csv"), COLUMNS)
    text = probes_report.report(rows, pc.gap_baseline)
    with stages.writing("report", os.path.join(workdir, "probes.txt")), \
            open(os.path.join(workdir, "probes.txt"), "w") as f:
        f.write(text + "\n")


def report_lines(config, workdir: str) -> list[str]:
    """probes.txt's lines for the main report (gap_table.txt), or [] without a probe table."""
    path = os.path.join(workdir, "probes.txt")
    if not enabled(config) or not os.path.exists(path):
        return []
    with open(path) as f:
        return ["", *f.read().rstrip("\n").split("\n")]
