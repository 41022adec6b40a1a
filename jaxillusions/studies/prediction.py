"""Does an interpretation predict behaviour? The held-out prediction test over the run's members
(report/heldout.py, docs/prediction.md), as a stage of the main job.

With prediction.enabled, after every group's proxies and reports, each healthy trained member
becomes one row:

- features (measured in distribution, on proxies.gap_baseline): each proxy family's and size's
  `prediction.metrics` (default same_pred) on the baseline split, every breakdown pooled;
- hyper-parameters: the member's hyper-parameters that vary over the run (train.members'
  hparams, e.g. contrastive_weight), its setting the group it belongs to;
- targets (out of distribution): the original model's accuracy on each evaluation split outside
  the task's training distribution (`acc:<split>`), and, with prediction.gaps, each family's
  gap in same_pred on it at its smallest size (`gap:<method>:<site>:<size>:<split>`).

A null population (train.null, when the members have a `null` hyper-parameter: untrained or
shuffled-label copies of the same seeds and settings) gives the same features on those copies:
the test says whether the trained members' features predict better than theirs. With two null
kinds, the first of train.null's order is the null population (prediction.txt and
prediction.csv's `null_kind` name it). Writes prediction.csv (report/heldout.py's columns and
null_kind), prediction.txt (its lines) and prediction_auroc.png in the workdir.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np

from jaxillusions import model as model_lib
from jaxillusions import tasks
from jaxillusions.config.fields import BOOL, INT, STR, STRS, positive, setting
from jaxillusions.report import heldout, tables
from jaxillusions.runtime import distributed, schema, stages
from jaxillusions.runtime.chunks import padded_chunks
from jaxillusions.studies.stage import PROXIES, Context, Stage
from jaxillusions.training import train

if TYPE_CHECKING:  # for annotations; the functions import it where used
    import pandas as pd

OUTPUTS = ("prediction.csv", "prediction.txt", "prediction_auroc.png", "prediction_members.csv")
NULL = "null"  # the hyper-parameter of null members (0: trained)
# What a proxy row measures per member: its faithfulness, its accuracy, a dictionary's metrics.
FEATURE_METRICS = (*schema.FAITHFULNESS, "acc_proxy", *schema.DICTIONARY_METRICS)
# The families of features (prediction.features), each tested alone and all together:
# the proxies' prediction.metrics, the heads' attention on the task's targets ("attn:..."),
# the probes' accuracies ("probe:...").
FAMILIES = ("proxies", "heads", "probes")
ALL = "all"  # the family column of the test on every feature
# prediction.csv's: null_kind names the null population ("" without one)
_AFTER_NULL = heldout.COLUMNS.index("null") + 1
COLUMNS = ("family", *heldout.COLUMNS[:_AFTER_NULL], "null_kind",
           *heldout.COLUMNS[_AFTER_NULL:])


def family(column: str, metrics) -> str | None:
    """The feature family of a member frame's column (None: not a feature)."""
    head = column.split(":")[0]
    return ("proxies" if head in metrics else "heads" if head == "attn"
            else "probes" if head == "probe" else None)


def _threshold_ok(v, s) -> bool:
    if v == "median":
        return True
    try:
        return -1.0 <= float(v) <= 1.0
    except ValueError:
        return False


@dataclasses.dataclass(frozen=True)
class Prediction:
    """The held-out prediction test over the members (jaxillusions/studies/prediction.py)."""

    enabled: bool = setting(False, BOOL, "true or false",
                            doc="predict each member's OOD behaviour from its in-distribution "
                            "interpretation, its hyper-parameters, both, and a null population")
    metrics: tuple[str, ...] = setting(
        ("same_pred",), STRS, f"at least one of {', '.join(FEATURE_METRICS)}",
        lambda v, s: len(v) >= 1 and set(v) <= set(FEATURE_METRICS),
        "the proxy rows' metrics on the baseline split that are the features")
    features: tuple[str, ...] = setting(
        FAMILIES, STRS, f"a non-empty subset of {', '.join(FAMILIES)}",
        lambda v, s: len(v) >= 1 and set(v) <= set(FAMILIES),
        "the feature families (proxies: prediction.metrics of every proxy; heads: each head's "
        "attention on the task's attention targets; probes: probes.sites' accuracies), each "
        "tested alone and all together")
    head_sentences: int = setting(256, INT, ">= 1", positive,
                                  "sentences of proxies.gap_baseline the head features read")
    gaps: bool = setting(True, BOOL, "true or false",
                         doc="also each proxy family's OOD gap (smallest size) as a target")
    threshold: str = setting("median", STR, "'median' or a number in [-1, 1]", _threshold_ok,
                             "AUROC's positive class: target > this (fixed before the run; a "
                             "number needs prediction.gaps=False)")
    n_splits: int = setting(5, INT, ">= 2", lambda v, s: v >= 2, "folds of the random splits")
    n_repeats: int = setting(10, INT, ">= 1", positive, "repeats of the random splits")
    seed: int = setting(0, INT, ">= 0", lambda v, s: v >= 0, "the random splits' seed")


@functools.partial(jax.jit, static_argnames=("model_cfg", "layers"))
def _attention_on(params, tokens, targets, *, model_cfg, layers):
    """[members, properties, layers, heads]: each head's attention summed over the query
    positions of `targets` [properties, B, T] (>= 0: the key position a head with the property
    attends to), and [properties] the count of those positions."""
    sites = tuple(f"blocks.{layer}.attn.pattern" for layer in layers)
    defined = targets >= 0

    def one(p):
        _, cache = model_lib.forward(p, tokens, model_cfg, cache=sites)
        out = []
        for site in sites:
            pattern = cache[site]  # [B, H, Q, K]
            on = jnp.take_along_axis(pattern[None], jnp.maximum(targets, 0)[:, :, None, :, None],
                                     axis=-1)[..., 0]  # [properties, B, H, Q]
            out.append(jnp.sum(on * defined[:, :, None, :], axis=(1, 3)))  # [properties, H]
        return jnp.stack(out, axis=1)  # [properties, layers, heads]

    return jax.vmap(one)(params), jnp.sum(defined, axis=(1, 2))


def head_features(params, split, task, model_cfg, sentences: int, batch_size: int = 64,
                  member_chunk: int = 64) -> dict[str, np.ndarray]:
    """{"attn:<property>:L<layer>H<head>": [members]}: each attention head's mean attention
    weight on the key position of each of the task's attention targets (hook
    attention_targets), over the first `sentences` rows of `split` (params: a leading member
    axis). None of them without the hook's targets."""
    targets = tasks.hook(task, "attention_targets")(split)
    if not targets:
        return {}
    names = list(targets)
    tokens = task.view(split).tokens[:sentences]
    # [N, properties, T], shifted by one so that the zero rows padded_chunks adds are no target
    shifted = np.stack([targets[n][:sentences] for n in names], axis=1) + 1
    batches = [(tok, np.moveaxis(tgt, 1, 0) - 1)  # the batches once, for every member chunk
               for tok, tgt in padded_chunks([tokens, shifted], batch_size)]
    layers = tuple(range(model_cfg.n_layers))
    num = jax.tree.leaves(params)[0].shape[0]
    sums, count = [], 0
    for index in distributed.seed_chunks(num, member_chunk):
        chunk = distributed.shard_seeds(jax.tree.map(lambda x, i=index: np.asarray(x)[i],
                                                     params))
        total, count = 0.0, 0
        for tok, tgt in batches:
            on, n = _attention_on(chunk, tok, tgt, model_cfg=model_cfg, layers=layers)
            total, count = total + distributed.to_host(on), count + distributed.to_host(n)
        sums.append(total)
    on = np.concatenate(sums)[:num] / np.maximum(count, 1)[None, :, None, None]
    return {f"attn:{name}:L{layer}H{head}": on[:, p, layer, head]
            for p, name in enumerate(names) if count[p] for layer in layers
            for head in range(on.shape[-1])}


def enabled(config) -> bool:
    """With prediction.enabled (the held-out prediction test over every group's members)."""
    return config.prediction.enabled


def settings_of(config) -> list[str]:
    """The names of the members' hyper-parameter settings (the null kind left out)."""
    return [name for _, name in train.member_settings(config, leave_out=(NULL,))]


def check_members(config, model_cfg) -> list[str]:
    """One-line ValueError before any work: the features need proxies, measured in
    distribution; the targets a split out of it; a numeric threshold one scale of targets."""
    del model_cfg
    if enabled(config) and not config.proxies.methods:
        raise ValueError("prediction.enabled=True: needs proxies (proxies.methods is empty): "
                         "the features are the proxies' faithfulness")
    task, pc = tasks.get(config), config.prediction
    splits, baseline = tuple(config.proxies.eval_splits), config.proxies.gap_baseline
    inside = ", ".join(task.IN_DISTRIBUTION)
    if enabled(config) and all(s in task.IN_DISTRIBUTION for s in splits):
        raise ValueError(f"prediction.enabled=True: the targets are behaviour out of "
                         f"distribution, and proxies.eval_splits={splits} has no split outside "
                         f"the task's {inside}; add one")
    if enabled(config) and baseline not in task.IN_DISTRIBUTION:
        raise ValueError(f"prediction.enabled=True: the features are measured on "
                         f"proxies.gap_baseline={baseline!r}, which is out of distribution (the "
                         f"targets' side); set it to one of the task's {inside}")
    if enabled(config) and pc.threshold != "median" and pc.gaps:
        raise ValueError(f"prediction.threshold={pc.threshold!r}: one number for every target, "
                         "but prediction.gaps=True adds gap targets (near 0) beside the "
                         "accuracies; set prediction.gaps=False, or threshold 'median'")
    empty = {"heads": tasks.hook(task, "attention_targets")
             is tasks.DEFAULTS["attention_targets"] and "the task has no attention targets",
             "probes": not config.probes.sites and "probes.sites is empty"}
    features = tuple(config.prediction.features)
    if enabled(config) and all(empty.get(f) for f in features):  # (proxies: there are some)
        raise ValueError(f"prediction.features={features}: no features to read ("
                         + "; ".join(f"{f}: {empty[f]}" for f in features)
                         + "); add proxies to the features, or set what they read")
    return []


def check(config, model_cfg) -> list[str]:
    """check_members, and enough trained members for the random splits (`check_count`)."""
    check_members(config, model_cfg)
    return check_count([config])


def check_count(points: Sequence, where: str = "this run") -> list[str]:
    """One-line ValueError unless the trained members of `points` (a run: itself; a grid: its
    points' Settings, tested together) fill the random splits: a target split at its median has
    classes of at most half the members, and each needs prediction.n_splits of them. (One
    setting, seeds alone, is tested under the random splits only.)"""
    config = points[0]
    if not enabled(config):
        return []
    counts = [(len(train.seed_list(p)), len(settings_of(p))) for p in points]
    trained = sum(seeds * found for seeds, found in counts)  # (null copies left out)
    need = 2 * config.prediction.n_splits
    if trained < need:
        more = ("more checkpoints in model.pretrained" if config.model.pretrained
                else "more train.num_seeds")
        parts = " + ".join(f"{seeds} seed{'s' * (seeds != 1)} x {found} "
                           f"setting{'s' * (found != 1)}" for seeds, found in counts)
        raise ValueError(f"prediction.n_splits={config.prediction.n_splits}: the random splits "
                         f"need at least {need} trained members (each class of a target split "
                         f"at its median holds at most half of them); {where} has {trained} "
                         f"({parts}{f' over {len(points)} points' if len(points) > 1 else ''}"
                         f"): {more}, or fewer prediction.n_splits")
    return []


def _member_rows(group: Context, config, gaps: bool) -> list[dict]:
    """One dict per healthy member of a group: features, hyper-parameters, targets."""
    pc, task = config.proxies, tasks.get(config)
    members = train.members(config)
    baseline = pc.gap_baseline
    ood = [s for s in pc.eval_splits if s not in task.IN_DISTRIBUTION]
    by_seed: dict[int, list[dict]] = defaultdict(list)  # the `all` rows, in their order
    for r in group.proxies.rows:
        if r["breakdown"] == "all":
            by_seed[r["seed"]].append(r)
    heads = (head_features(group.params, group.splits[baseline], task, group.model_cfg,
                           config.prediction.head_sentences)
             if "heads" in config.prediction.features else {})
    probed: dict[int, list[dict]] = defaultdict(list)
    if "probes" in config.prediction.features:
        for r in group.made.get("probes", {}).get("rows", []):
            if r["split"] == baseline:
                probed[r["seed"]].append(r)
    out = []
    for local, (index, seed, ok) in enumerate(zip(group.members, group.seeds, group.healthy,
                                                  strict=True)):
        if not ok:
            continue
        mine = by_seed[seed]
        row = {f"hp:{k}": float(v[index]) for k, v in members.hparams.items()}
        row["seed"] = int(seed)
        row.update({name: float(v[local]) for name, v in heads.items()})
        row.update({f"probe:{r['site']}:{r['concept']}": float(r["probe_acc"])
                    for r in probed[seed]})
        original: dict[str, float] = {}  # each split's first defined acc_original
        families: dict[tuple, dict[str, dict]] = defaultdict(dict)  # (method, site, size)
        for r in mine:  # (every proxy row has acc_original)
            if math.isnan(original.get(r["split"], math.nan)):
                original[r["split"]] = r.get("acc_original", math.nan)
            families[(r["method"], r["site"], r["size"])].setdefault(r["split"], r)
        row.update({f"acc:{s}": float(original[s]) for s in ood if s in original})
        for (method, site, size), at in sorted(families.items()):
            for metric in config.prediction.metrics:
                value = at[baseline].get(metric, math.nan) if baseline in at else math.nan
                if not math.isnan(value):
                    row[f"{metric}:{method}:{site}:{size}"] = float(value)
        if gaps:
            smallest: dict[tuple, int] = {}  # (method, site) -> its smallest size
            for method, site, size in sorted(families):
                smallest.setdefault((method, site), size)
            for (method, site), size in smallest.items():
                at = {s: r.get("same_pred", math.nan)
                      for s, r in families[(method, site, size)].items()}
                row.update({f"gap:{method}:{site}:{size}:{s}": float(at[baseline] - at[s])
                            for s in ood if s in at and baseline in at})
        out.append(row)
    return out


def members(ctx: Context) -> pd.DataFrame:
    """Every group's healthy members, trained and null (column hp:null, the kind's code), one
    row each, indexed <setting>/seed<seed> (`with_setting`)."""
    import pandas as pd  # noqa: PLC0415 - not at a launch's start
    rows = [r for g in ctx.groups for r in _member_rows(g, ctx.settings, ctx.settings.
                                                          prediction.gaps)]
    return with_setting(pd.DataFrame(rows))


def with_setting(frame: pd.DataFrame) -> pd.DataFrame:
    """The members frame with its `setting` column (the values of the hyper-parameters that
    vary over it, the null kind left out, each written as the group directories write it
    (train.member_settings: 0.001, not the float32's 0.0010000000474974513), joined by "/")
    and index <setting>/seed<seed>."""
    frame = frame.drop(columns=["setting"], errors="ignore")
    hp = [c for c in frame if c.startswith("hp:") and c != f"hp:{NULL}"]
    varying = [c for c in hp if frame[c].nunique() > 1]
    frame.insert(len(frame.columns), "setting", frame[varying].map("{:g}".format).agg(
        "/".join, axis=1) if varying else "")
    frame.index = frame["setting"] + "/seed" + frame["seed"].astype(str)
    return frame.rename_axis("member")


def population(frame: pd.DataFrame, pc: Prediction, nulls: Sequence[str] = ()
               ) -> tuple[pd.DataFrame, pd.DataFrame | None, heldout.Design]:
    """(the trained members' frame, the null members' frame or None, the design) of a members
    frame (`members`), with the settings `pc` (prediction.*). The null population is the
    frame's first null kind in the order of `nulls` (train.null), then of train.NULL_KINDS;
    its hp:null column names it."""
    frame = with_setting(frame)
    hp = [c for c in frame if c.startswith("hp:") and c != f"hp:{NULL}"]
    null = None
    if f"hp:{NULL}" in frame:
        present = set(frame[f"hp:{NULL}"].astype(int)) - {0}
        order = [train.NULL_KINDS.index(k) for k in (*nulls, *train.NULL_KINDS)]
        code = next((c for c in order if c in present), None)
        null = frame[frame[f"hp:{NULL}"] == code] if code is not None else None
        frame = frame[frame[f"hp:{NULL}"] == 0]
    varying = [c for c in hp if frame[c].nunique() > 1]
    targets = [c for c in frame if c.startswith(("acc:", "gap:"))
               and frame[c].notna().all() and frame[c].nunique() > 1]
    features = [c for c in frame if family(c, pc.metrics) in pc.features
                and frame[c].notna().all()]
    if null is not None:
        null = null.reindex(frame.index)  # (each member's copy of that kind)
        features = [c for c in features if c in null and null[c].notna().all()]
        null = null if len(null.dropna(subset=features)) == len(frame) else None
    threshold = pc.threshold if pc.threshold == "median" else float(pc.threshold)
    design = heldout.Design(features=tuple(features), hparams=tuple(varying),
                            targets=tuple(targets), threshold=threshold,
                            n_splits=pc.n_splits, n_repeats=pc.n_repeats)
    return frame, null, design


def write_members(frame: pd.DataFrame, workdir: str) -> None:
    """prediction_members.csv: the members frame (`members`), a `kind` column beside hp:null."""
    if not distributed.is_main():
        return
    path = os.path.join(workdir, OUTPUTS[3])
    with stages.writing("prediction", path):
        kinds = [train.NULL_KINDS[int(k)] for k in frame[f"hp:{NULL}"]] \
            if f"hp:{NULL}" in frame else "trained"
        frame.assign(kind=kinds).to_csv(path)


def read_members(path: str) -> pd.DataFrame:
    """A prediction_members.csv as `members` made it (its `kind` column dropped)."""
    import pandas as pd  # noqa: PLC0415 - not at a launch's start
    return pd.read_csv(path, index_col="member").drop(columns=["kind"])


def test(members_frame: pd.DataFrame, pc: Prediction, workdir: str, say,
         nulls: Sequence[str] = ()) -> pd.DataFrame:
    """The held-out test over a members frame (`members`, or several runs' joined): every
    feature family alone and all together, against the null kind `population` picks (`nulls`:
    train.null); writes prediction.csv (its `null_kind` column names that kind),
    prediction.txt, prediction_auroc.png and prediction_members.csv in `workdir` (process
    0)."""
    import pandas as pd  # noqa: PLC0415 - not at a launch's start
    members_frame = with_setting(members_frame)
    frame, null, design = population(members_frame, pc, nulls)
    kind = "" if null is None else train.NULL_KINDS[int(null[f"hp:{NULL}"].iloc[0])]
    if not design.targets or not design.features:
        what = "target" if not design.targets else "feature"
        raise ValueError(f"prediction.enabled=True: no {what} varies over the {len(frame)} "
                         "healthy members; nothing to predict")
    found = {f: tuple(c for c in design.features if family(c, pc.metrics) == f)
             for f in FAMILIES}
    found = {f: cols for f, cols in found.items() if cols}
    tested = {ALL: design.features, **(found if len(found) > 1 else {})}
    n = frame["setting"].nunique()
    say(f"prediction: {len(frame)} members in {n} setting{'s' * (n != 1)}, "
        f"{len(design.features)} features ("
        + ", ".join(f"{f} {len(cols)}" for f, cols in found.items())
        + f"), {len(design.hparams)} hyper-parameters, {len(design.targets)} targets"
        + ("" if null is None else f", with the {kind} null"))
    parts, fitted = [], {}  # (the hparams baseline: fitted once, not once per family)
    for name, columns in tested.items():
        part = heldout.predict(frame, dataclasses.replace(design, features=columns), null,
                               random_state=pc.seed, fitted=fitted,
                               between=functools.partial(
                                   stages.stop_if_signalled, "in the prediction stage, before "
                                   "it wrote its files; relaunch the same command to resume"))
        part.insert(0, "family", name)
        part.insert(part.columns.get_loc("null") + 1, "null_kind", kind)
        parts.append(part)
    result = pd.concat(parts, ignore_index=True)
    write_members(members_frame, workdir)
    if distributed.is_main():
        path = os.path.join(workdir, "prediction.csv")
        with stages.writing("prediction", path):
            tables.write_csv(result.to_dict("records"), path, COLUMNS)
        setting = (f"{n} settings of {', '.join(design.hparams)}" if n > 1 else
                   "1 setting (seeds alone: random splits only; hparams, one constant, scores "
                   "chance)")
        others = sorted(set(train.NULL_KINDS[int(k)] for k in members_frame.get(
            f"hp:{NULL}", [])) - {"trained", kind})
        lines = [f"Held-out prediction: {len(frame)} trained members, {setting}; "
                 f"features: {len(design.features)} in-distribution measurements ("
                 + "; ".join(f"{f}: {len(c)}" for f, c in found.items()) + "); null: "
                 + (f"the {kind} copies" if kind else "none")
                 + (f" (the {', '.join(others)} ones are in {OUTPUTS[3]} only)" if others
                    else "")]
        for name, part in zip(tested, parts, strict=True):
            lines += ["", f"Features: {name} ({len(tested[name])})",
                      *heldout.report_lines(part)]
        stages.write(os.path.join(workdir, "prediction.txt"), "\n".join(lines) + "\n",
                     "prediction")
        with stages.writing("prediction", os.path.join(workdir, OUTPUTS[2])):
            heldout.figure(parts[0], os.path.join(workdir, OUTPUTS[2]))
    return result


def run(ctx: Context) -> Context:
    """The stage (scope population): the test over the run's members, in the workdir."""
    result = test(members(ctx), ctx.settings.prediction, ctx.workdir, ctx.say,
                  ctx.settings.train.null)
    return ctx.produced("prediction", frame=result)


def run_members(ctx: Context) -> Context:
    """The stage of a grid's point (scope population): its members frame only
    (prediction_members.csv); the grid (pipeline/grid.py) tests every point's together."""
    frame = members(ctx)
    write_members(frame, ctx.workdir)
    return ctx.produced("prediction", frame=frame)


# The main job's stage (job.PIPELINE): once, after every group's stages.
STAGE = Stage("prediction", run, enabled=enabled, scope="population",
              keys=("prediction.*", "proxies.*"), outputs=OUTPUTS, section=Prediction,
              check=check, needs=(PROXIES,), makes=("prediction",))
# A grid point's (pipeline/job.py's POINT_PIPELINE): the members frame, tested by the grid.
# Its keys: the settings the members frame depends on (the grid's own record of the others
# redoes the test alone).
MEMBERS = dataclasses.replace(
    STAGE, run=run_members, outputs=OUTPUTS[3:], check=check_members,
    keys=("prediction.enabled", "prediction.metrics", "prediction.features",
          "prediction.head_sentences", "prediction.gaps", "proxies.*"))
