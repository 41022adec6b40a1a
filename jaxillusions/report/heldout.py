"""Does an interpretation measured in distribution predict a member's behaviour out of it, better
than the member's hyper-parameters and better than the same measurement on a null population?

The held-out prediction test of Li et al. 2025 ("Can interpretation predict behavior on unseen
data?", arXiv 2507.06445), on a population of members (seeds x hyper-parameters); docs/
prediction.md states it in full. Per target (a continuous OOD metric of each member) and
predictor set (the interpretation `features`, the `hparams` alone, `both`, and the features
of a `null` population: the same members untrained or trained on shuffled labels):

The hyper-parameters enter as indicators (`hparam_matrix`): one column per value of each and
one per setting, so that the baseline can fit every setting's own mean.

- AUROC: StandardScaler + LogisticRegression (C = 1) on the target binarised as
  `value > threshold`; the threshold is fixed before the run: a number, or "median", resolved
  once on the whole population and written in the `threshold` column.
- Spearman: StandardScaler + Ridge (alpha = 1) on the continuous target; a constant prediction
  (hyper-parameters inside one held-out setting) ranks nothing: rho 0, as it has AUROC 0.5.

Each under two schemes, fitted and scored fold by fold (a fresh estimator per fold, as
sklearn's cross_validate does) on folds from its splitters: `random` (RepeatedStratifiedKFold
for AUROC, RepeatedKFold for Spearman) and `leave_one_setting_out` (LeaveOneGroupOut over
the `setting` column; with 2 settings or more: a population of one setting, seeds alone, gets
the random splits, where `hparams` is one constant column that scores chance, and no `both`).
A fold whose held-out (or training) members have one class (AUROC) or one value (Spearman) is
skipped before any fitting and counted in `n_skipped`; every predictor set of a (target,
metric, scheme) sees the same folds, so they are compared fold by fold.

Per row: mean and sd (ddof 1) of the per-fold values over n_folds folds, and low/high, the 95%
corrected resampled t interval of the mean (Nadeau & Bengio 2003: variance sd^2 (1/J + n_test /
n_train), J folds, t with J - 1 degrees of freedom; folds share training members, so the plain
t interval over folds is too narrow), clipped to the metric's range. No interval (NaN) from
fewer than 2 folds, or from folds that all have the same value: the t interval scales the
folds' spread, and a zero spread measures none (small folds' coarse scores often agree).
Paired rows ("features - hparams", "both - hparams", "features - null") hold the per-fold
differences' interval, and `verdict` says "beats" (low > 0), "loses" (high < 0), "within
noise", or "undefined" without an interval (the text says why).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # for annotations; the functions import it where used
    import pandas as pd

CONFIDENCE = 0.95
METRICS = ("auroc", "spearman")
SCHEMES = ("random", "leave_one_setting_out")
PREDICTORS = ("features", "hparams", "both")
# Paired comparisons over the same folds: (name, minuend, subtrahend); "null" is the features
# of the null population.
COMPARISONS = (("features - hparams", "features", "hparams"),
               ("both - hparams", "both", "hparams"),
               ("features - null", "features", "null"))
COLUMNS = ("target", "metric", "predictors", "scheme", "null", "mean", "sd", "low", "high",
           "n_folds", "n_skipped", "members", "threshold", "verdict")
# Per-fold values closer than this are one value (float rounding of equal scores: a Spearman
# rho of equal ranks is 1 less an ulp); a fold's score moves in steps far above it (an AUROC
# of n_pos x n_neg pairs by 1 / (2 n_pos n_neg)).
SAME = 1e-12
_RANGE = {"auroc": (0.0, 1.0), "spearman": (-1.0, 1.0)}
_SCHEME_NAMES = {"random": "random splits", "leave_one_setting_out": "leave one setting out"}
_PREDICTOR_NAMES = {"features": "features", "hparams": "hparams", "both": "both",
                    "null": "null features"}


@dataclasses.dataclass(frozen=True)
class Design:
    """Which columns of the members frame play which part, and how to split.

    features: interpretation features measured in distribution (numeric). hparams: the
    hyper-parameters as numbers (pass log10(weight decay) if that is its scale). targets:
    continuous OOD metrics. setting: the column naming each member's hyper-parameter
    combination (leave-one-setting-out holds out one value at a time). threshold: per target
    (a Mapping) or for all, a number or "median"; AUROC's positive class is value > threshold.
    Random splits: n_repeats times stratified (AUROC) or plain (Spearman) n_splits-fold.
    A field of another type (a string for a tuple of columns, a bool or a string other than
    "median" for a threshold, a fraction for a count) is a one-line ValueError naming it."""

    features: tuple[str, ...]
    hparams: tuple[str, ...]
    targets: tuple[str, ...]
    setting: str = "setting"
    threshold: float | str | Mapping[str, float | str] = "median"
    n_splits: int = 5
    n_repeats: int = 10

    def __post_init__(self):
        for name in ("features", "hparams", "targets"):
            value = getattr(self, name)
            if isinstance(value, str) or not isinstance(value, Sequence) or not all(
                    isinstance(c, str) for c in value):
                raise ValueError(f"Design.{name}={value!r}: give a tuple of column names")
            object.__setattr__(self, name, tuple(value))
        if not isinstance(self.setting, str):
            raise ValueError(f"Design.setting={self.setting!r}: give a column name")
        spec = self.threshold
        for t in spec.values() if isinstance(spec, Mapping) else (spec,):
            if isinstance(t, bool) or not (t == "median" or isinstance(t, numbers.Real)):
                raise ValueError(f"Design.threshold={spec!r}: give a number or 'median' (or a "
                                 "mapping of targets to them)")
        for name, least in (("n_splits", 2), ("n_repeats", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) \
                    or value < least:
                raise ValueError(f"Design.{name}={value!r}: give an integer >= {least}")


# scikit-learn is imported where it is used (0.15-0.2 s): every launch imports this module,
# and only the prediction stage fits.


def model(metric: str):
    """The unfitted estimator of `metric`: standardised logistic (AUROC) or ridge (Spearman)."""
    from sklearn.linear_model import LogisticRegression, Ridge  # noqa: PLC0415
    from sklearn.pipeline import make_pipeline  # noqa: PLC0415
    from sklearn.preprocessing import StandardScaler  # noqa: PLC0415

    if metric == "auroc":
        return make_pipeline(StandardScaler(), LogisticRegression(C=1.0))
    return make_pipeline(StandardScaler(), Ridge(alpha=1.0))


def _per_row(method, x: np.ndarray) -> np.ndarray:
    """method(x), computed once per distinct row of x: members with the same inputs (a held-out
    setting's hyper-parameters) get the same score, not scores that differ in the last bits
    with their place in the matrix product, whose order would then rank them."""
    rows, inverse = np.unique(np.asarray(x), axis=0, return_inverse=True)
    return np.asarray(method(rows))[inverse.reshape(-1)]


def _fit(metric: str, x: np.ndarray, y: np.ndarray):
    """model(metric) fitted on (x, y), as the function of rows that scores them: the
    logistic decision function (AUROC) or the ridge prediction (Spearman). Its two steps are
    fitted and applied here as the pipeline applies them (x - mean_, / scale_, @ coef_.T +
    intercept_: the same numbers as its decision_function and predict), without its per-call
    input checks."""
    scaler, linear = (step for _, step in model(metric).steps)
    scaler.fit(x)
    linear.fit((x - scaler.mean_) / scaler.scale_, y)
    return lambda rows: (((rows - scaler.mean_) / scaler.scale_) @ linear.coef_.T
                         + linear.intercept_).reshape(-1)


def _auroc(scores: np.ndarray, y: np.ndarray) -> float:
    """The area under the ROC curve, as the Mann-Whitney U of the positives' scores over
    n_pos n_neg (ties count one half: scipy.stats.rankdata's average ranks); roc_auc_score's
    number up to its trapezoid sum's last bit."""
    import scipy.stats  # noqa: PLC0415 - not at a launch's start
    positive = y == 1
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    ranks = scipy.stats.rankdata(scores)
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def _spearman(predicted: np.ndarray, y: np.ndarray) -> float:
    import scipy.stats  # noqa: PLC0415 - not at a launch's start
    if np.ptp(predicted) == 0:  # ranks nothing (AUROC would be 0.5 from the ties)
        return 0.0
    return float(scipy.stats.spearmanr(y, predicted).statistic)


_SCORERS = {"auroc": _auroc, "spearman": _spearman}


def _frame(members) -> pd.DataFrame:
    import pandas as pd  # noqa: PLC0415 - not at a launch's start
    return members if isinstance(members, pd.DataFrame) else pd.DataFrame(members)


def _threshold_spec(design: Design, target: str) -> float | str:
    spec = design.threshold
    if isinstance(spec, Mapping):
        if target not in spec:
            raise ValueError(f"threshold: no value for target {target!r} in the mapping")
        spec = spec[target]
    return spec


def _check_columns(frame: pd.DataFrame, parts: Mapping[str, Sequence[str]], which: str) -> None:
    """Every column present, numeric and finite (the setting column only present and set)."""
    import pandas as pd  # noqa: PLC0415 - not at a launch's start
    for part, columns in parts.items():
        for c in columns:
            if c not in frame.columns:
                raise ValueError(f"the {which} frame has no column {c!r} ({part})")
            values = frame[c]
            if part == "setting":
                if values.isna().any():
                    raise ValueError(f"setting column {c!r} is empty in {int(values.isna().sum())}"
                                     f" of {len(frame)} members")
                continue
            if not pd.api.types.is_numeric_dtype(values) or pd.api.types.is_bool_dtype(values):
                raise ValueError(f"{part} column {c!r} of the {which} frame is not numeric "
                                 f"(dtype {values.dtype})")
            bad = int((~np.isfinite(values.to_numpy(np.float64))).sum())
            if bad:
                raise ValueError(f"{part} column {c!r} of the {which} frame has NaN or inf in "
                                 f"{bad} of {len(frame)} members")


def check(members, design: Design, null=None) -> dict[str, float]:
    """Validates the input before any fitting; returns {target: threshold} (a "median"
    resolved on the whole population). Each problem is a one-line ValueError naming the column
    or value: a missing, non-numeric or non-finite column, a column in two parts, a threshold
    outside a target's observed range, a target with one class after binarising (or a class
    smaller than n_splits), a null frame of other members."""
    members = _frame(members)
    parts = {"feature": design.features, "hyper-parameter": design.hparams,
             "target": design.targets, "setting": (design.setting,)}
    for part, columns in parts.items():
        if not columns and part != "hyper-parameter":  # (none: the setting column alone)
            raise ValueError(f"the design names no {part} column")
    named = [c for columns in parts.values() for c in columns]
    twice = sorted({c for c in named if named.count(c) > 1})
    if twice:
        raise ValueError(f"column {twice[0]!r} is named in two parts of the design")
    if not members.index.is_unique:
        raise ValueError("the members frame's index names a member twice")
    _check_columns(members, parts, "members")
    if null is not None:
        null = _frame(null)
        missing = len(members.index.difference(null.index))
        if missing or len(null) != len(members):
            raise ValueError(f"the null frame must hold the same {len(members)} members (its "
                             f"index); {missing} are missing, it has {len(null)}")
        _check_columns(null, {"feature": design.features}, "null")
    thresholds = {}
    for target in design.targets:
        y = members[target].to_numpy(np.float64)
        spec = _threshold_spec(design, target)
        t = float(np.median(y)) if spec == "median" else float(spec)
        if not y.min() <= t <= y.max():
            raise ValueError(f"threshold {t:g} for target {target!r} lies outside its observed "
                             f"range [{y.min():g}, {y.max():g}]")
        above = int((y > t).sum())
        if above in (0, len(y)):
            raise ValueError(f"target {target!r} has one class after binarising at > {t:g}: "
                             f"{above} of {len(y)} members above")
        if min(above, len(y) - above) < design.n_splits:
            raise ValueError(f"target {target!r} has {min(above, len(y) - above)} members in "
                             f"its smaller class at > {t:g}; stratified {design.n_splits}-fold "
                             f"splits need at least {design.n_splits}")
        thresholds[target] = t
    return thresholds


def schemes(members, design: Design) -> tuple[str, ...]:
    """The SCHEMES that apply: leave-one-setting-out only with 2 settings or more (one setting,
    a population of seeds alone: the random splits, and the hyper-parameters are one constant
    indicator, so `hparams` scores chance, AUROC 0.5 and rho 0, in every fold)."""
    several = _frame(members)[design.setting].nunique() > 1
    return tuple(s for s in SCHEMES if several or s != "leave_one_setting_out")


def _folds(y: np.ndarray, groups: np.ndarray, metric: str, scheme: str, design: Design,
           random_state: int) -> tuple[list[tuple[np.ndarray, np.ndarray]], int]:
    """(kept folds as (train, test) index arrays, number skipped): y is binary for AUROC."""
    from sklearn.model_selection import (  # noqa: PLC0415
        LeaveOneGroupOut,
        RepeatedKFold,
        RepeatedStratifiedKFold,
    )

    if scheme == "leave_one_setting_out":
        splits = LeaveOneGroupOut().split(y, y, groups)
    elif metric == "auroc":
        splits = RepeatedStratifiedKFold(n_splits=design.n_splits, n_repeats=design.n_repeats,
                                         random_state=random_state).split(y, y)
    else:
        splits = RepeatedKFold(n_splits=design.n_splits, n_repeats=design.n_repeats,
                               random_state=random_state).split(y)
    kept, skipped = [], 0
    for train, test in splits:
        if np.ptp(y[train]) == 0 or np.ptp(y[test]) == 0:  # one class / one value
            skipped += 1
        else:
            kept.append((train, test))
    return kept, skipped


def _target_values(members: pd.DataFrame, target: str, metric: str, threshold: float
                   ) -> np.ndarray:
    y = members[target].to_numpy(np.float64)
    return (y > threshold).astype(np.int64) if metric == "auroc" else y


def folds(members, design: Design, target: str, metric: str, scheme: str,
          random_state: int = 0) -> tuple[list[tuple[np.ndarray, np.ndarray]], int]:
    """The folds `predict` fits and scores for (target, metric, scheme): a list of (train,
    test) row positions in `members`, and the number of folds skipped (one class or one value
    held out or trained on). An unknown target, metric or scheme is a one-line ValueError."""
    import pandas as pd  # noqa: PLC0415 - not at a launch's start
    for name, value, known in (("target", target, design.targets), ("metric", metric, METRICS),
                               ("scheme", scheme, SCHEMES)):
        if value not in known:
            raise ValueError(f"{name} {value!r}: give one of {', '.join(known)}")
    members = _frame(members)
    threshold = check(members, design)[target]
    groups = pd.factorize(members[design.setting])[0]
    return _folds(_target_values(members, target, metric, threshold), groups, metric, scheme,
                  design, random_state)


def fold_interval(values, test_over_train: float, confidence: float = CONFIDENCE
                  ) -> tuple[float, float, float, float]:
    """(mean, sd, low, high) of per-fold values (NaN dropped): sd with ddof 1 and the
    corrected resampled t interval of the mean (Nadeau & Bengio 2003), half-width
    t_{J-1} sd sqrt(1/J + n_test/n_train) over J folds. NaN sd and interval below 2 folds, and
    NaN interval when every fold has the same value (up to SAME): the t interval scales the
    folds' own spread, and a zero spread is no measured precision (a fold of one positive and
    one negative member scores an AUROC of 0, 0.5 or 1, and a few such folds often agree), so
    no interval, as a t test on constant data has none."""
    import scipy.stats  # noqa: PLC0415 - not at a launch's start
    v = np.asarray(values, np.float64)
    v = v[np.isfinite(v)]
    if len(v) == 0:
        return math.nan, math.nan, math.nan, math.nan
    mean = float(v.mean())
    if len(v) < 2:
        return mean, math.nan, math.nan, math.nan
    sd = float(v.std(ddof=1))
    if np.ptp(v) <= SAME:
        return mean, sd, math.nan, math.nan
    half = float(scipy.stats.t.ppf(0.5 + confidence / 2, len(v) - 1)) * sd * math.sqrt(
        1 / len(v) + test_over_train)
    return mean, sd, mean - half, mean + half


def compare(low: float, high: float) -> str:
    """The verdict of a paired difference's interval: "beats" / "loses" when it lies above /
    below 0, "within noise" when it contains 0, "undefined" without one (`no_interval` says
    why)."""
    if math.isnan(low) or math.isnan(high):
        return "undefined"
    return "beats" if low > 0 else "loses" if high < 0 else "within noise"


def _scores(x: np.ndarray, y: np.ndarray, metric: str, kept) -> np.ndarray:
    """The test score of each kept fold, a fresh estimator fitted on its training rows: what
    scikit-learn's cross_validate computes, without its per-call input checks (check() has
    validated the input once)."""
    import sklearn  # noqa: PLC0415

    score = _SCORERS[metric]
    with sklearn.config_context(assume_finite=True, skip_parameter_validation=True):
        return np.array([score(_per_row(_fit(metric, x[train], y[train]), x[test]), y[test])
                         for train, test in kept], np.float64)


def _key(x: np.ndarray, y: np.ndarray, metric: str, kept) -> tuple[str, ...]:
    """What a predictor set's fold scores depend on: the metric, and the checksums (bytes,
    dtype and shape) of its matrix, the target and each fold's indices."""
    from jaxillusions.runtime import checkpoint  # noqa: PLC0415 - orbax is slow to import

    return (metric, *checkpoint.checksums((x, y, kept)).values())


def _rows(inputs: Mapping[str, np.ndarray], y: np.ndarray, metric: str, kept, common: dict,
          fitted: dict) -> list[dict]:
    """The score rows of each predictor set and the paired rows of COMPARISONS on `kept`
    (a set's fold scores taken from `fitted` when the same matrix, target and folds are there,
    else fitted and kept there)."""
    ratio = float(np.mean([len(test) / len(train) for train, test in kept])) if kept else 0.0
    low_end, high_end = _RANGE[metric]
    scores = {}
    for name, x in inputs.items():
        key = _key(x, y, metric, kept)
        if key not in fitted:
            fitted[key] = _scores(x, y, metric, kept) if kept else np.zeros(0)
        scores[name] = fitted[key]
    rows, verdicts = [], {}
    for name, values in scores.items():
        mean, sd, low, high = fold_interval(values, ratio)
        rows.append({**common, "predictors": "features" if name == "null" else name,
                     "null": name == "null", "mean": mean, "sd": sd,
                     "low": max(low, low_end), "high": min(high, high_end), "verdict": ""})
    span = high_end - low_end
    for label, a, b in COMPARISONS:
        if a in scores and b in scores:
            mean, sd, low, high = fold_interval(scores[a] - scores[b], ratio)
            verdicts[label] = compare(low, high)
            rows.append({**common, "predictors": label, "null": b == "null", "mean": mean,
                         "sd": sd, "low": max(low, -span), "high": min(high, span),
                         "verdict": verdicts[label]})
    rows[0]["verdict"] = (f"vs hparams: {verdicts['features - hparams']}; vs null: "
                          f"{verdicts.get('features - null', 'not run')}")
    return rows


def hparam_matrix(members, design: Design) -> np.ndarray:
    """The hyper-parameters as the model sees them: one indicator column per value of each
    hyper-parameter (its main effect) and per setting (their combination), so that the
    baseline can fit any per-setting mean under random splits (a number's linear term could not
    follow an effect that is not monotone in it), and a held-out setting still gets its values'
    main effects."""
    import pandas as pd  # noqa: PLC0415 - not at a launch's start
    members = _frame(members)
    parts = [pd.get_dummies(members[c].astype(str), prefix=c) for c in design.hparams]
    parts.append(pd.get_dummies(members[design.setting].astype(str), prefix=design.setting))
    return pd.concat(parts, axis=1).to_numpy(np.float64)


def predict(members, design: Design, null=None, *, random_state: int = 0,
            fitted: dict | None = None, between: Callable[[], None] | None = None
            ) -> pd.DataFrame:
    """The held-out prediction test: one row per (target, metric, scheme) and predictor set
    ("features", "hparams", "both" with 2 settings or more, and "features" with null=True
    when a `null` frame of the same members gives the features' null values), and per paired
    comparison of COMPARISONS. Columns COLUMNS; the same input and random_state give the
    identical frame. Input problems raise (`check`) before any fitting. `fitted`: a dict
    shared by several calls, which then fit each predictor matrix once per target and folds
    (the hparams baseline of calls that differ in their features only); it holds fold
    scores, keyed by what they depend on. `between()` is called after each target (the
    stage's check for a signal)."""
    import pandas as pd  # noqa: PLC0415 - not at a launch's start
    fitted = {} if fitted is None else fitted
    members = _frame(members)
    thresholds = check(members, design, null)
    groups = pd.factorize(members[design.setting])[0]
    features = members[list(design.features)].to_numpy(np.float64)
    hparams = hparam_matrix(members, design)
    inputs = {"features": features, "hparams": hparams}
    if len(set(groups)) > 1:  # (one setting: hparams is constant, so both would be features)
        inputs["both"] = np.concatenate([features, hparams], axis=1)
    if null is not None:
        inputs["null"] = _frame(null).loc[members.index, list(design.features)].to_numpy(
            np.float64)
    rows = []
    for target in design.targets:
        for metric in METRICS:
            y = _target_values(members, target, metric, thresholds[target])
            for scheme in schemes(members, design):
                kept, skipped = _folds(y, groups, metric, scheme, design, random_state)
                common = {"target": target, "metric": metric, "scheme": scheme,
                          "n_folds": len(kept), "n_skipped": skipped, "members": len(members),
                          "threshold": thresholds[target] if metric == "auroc" else math.nan}
                rows += _rows(inputs, y, metric, kept, common, fitted)
        if between is not None:
            between()
    return pd.DataFrame(rows, columns=list(COLUMNS))


def no_interval(row) -> str:
    """Why a row of the frame has no interval ("" when it has one)."""
    if not math.isnan(row["low"]):
        return ""
    return ("no fold scored" if row["n_folds"] == 0 else "1 fold"
            if row["n_folds"] < 2 else "every fold has the same value")


def _label(row) -> str:
    name = "null features" if row["null"] and row["predictors"] == "features" else (
        row["predictors"])
    why = no_interval(row)
    return (f"{name} {row['mean']:+.3f} ± {row['sd']:.3f} "
            + (f"(no interval: {why})" if why else f"[{row['low']:+.3f}, {row['high']:+.3f}]"))


def report_lines(frame: pd.DataFrame) -> list[str]:
    """The frame as text: per target and metric, per scheme, the predictor sets' mean ± sd
    [95% corrected t interval] over folds, then the paired differences with their verdicts."""
    lines = []
    for (target, metric), part in frame.groupby(["target", "metric"], sort=False):
        first = part.iloc[0]
        what = (f"AUROC of {target} > {first['threshold']:g}" if metric == "auroc"
                else f"Spearman rho of {target}")
        lines.append(f"{what}, {first['members']} members: mean ± sd [95% corrected t "
                     "interval] over held-out folds")
        for scheme, rows in part.groupby("scheme", sort=False):
            head = rows.iloc[0]
            lines.append(f"  {_SCHEME_NAMES[scheme]} ({_folds_phrase(head)}):")
            scores = rows[rows["predictors"].isin(PREDICTORS)]
            paired = rows[~rows["predictors"].isin(PREDICTORS)]
            lines.append("    " + "; ".join(_label(r) for _, r in scores.iterrows()))
            lines += [f"    {_label(r)}: {r['verdict']}" for _, r in paired.iterrows()]
    return lines


def _folds_phrase(row) -> str:
    """"5 folds, 1 skipped" / "1 fold, 0 skipped" for a row of the frame."""
    n = int(row["n_folds"])
    return f"{n} fold{'s' * (n != 1)}, {int(row['n_skipped'])} skipped"


def wrapped(name: str, width: int = 30) -> str:
    """`name` on lines of at most about `width` characters, broken after its colons (a panel
    title: target names such as gap:svd:blocks.1.attn.q:8:unseen_depth are long)."""
    lines = [""]
    for part in name.split(":"):
        piece = part if not lines[-1] else ":" + part
        if lines[-1] and len(lines[-1]) + len(piece) > width:
            lines[-1] += ":"
            lines.append(part)
        else:
            lines[-1] += piece
    return "\n".join(lines)


def figure(frame: pd.DataFrame, path: str, metric: str = "auroc") -> None:
    """Writes a PNG at `path`: one panel per target, `metric` (AUROC by default) of features,
    hparams, both and null features under both schemes, mean and 95% corrected t interval
    over folds; chance (0.5 AUROC, rho 0) dashed."""
    from jaxillusions.report import figures  # noqa: PLC0415 - matplotlib only for figures

    part = frame[(frame["metric"] == metric) & frame["predictors"].isin(PREDICTORS)]
    targets = list(dict.fromkeys(part["target"]))
    if not targets:
        raise ValueError(f"the frame has no {metric!r} rows to draw")
    fig, axes = figures._grid(len(targets), (3.8, 3.0))  # noqa: SLF001 - the same grid
    names = [*PREDICTORS, "null"]
    handles = {}
    for ax, target in zip(axes, targets, strict=True):
        rows = part[part["target"] == target]
        ticks = []
        present = [name for name in SCHEMES if name in set(rows["scheme"])]
        for s, scheme in enumerate(present):
            at = rows[rows["scheme"] == scheme]
            ticks.append(f"{_SCHEME_NAMES[scheme]}\n{_folds_phrase(at.iloc[0])}")
            for i, name in enumerate(names):
                row = at[(at["predictors"] == ("features" if name == "null" else name))
                         & (at["null"] == (name == "null"))]
                if not len(row):
                    continue
                r = row.iloc[0]
                err = np.nan_to_num([[r["mean"] - r["low"]], [r["high"] - r["mean"]]])
                handles[name] = ax.errorbar([s + (i - 1.5) * 0.15], [r["mean"]], yerr=err,
                                            linestyle="none", capsize=3, **figures.style(i))
        ax.axhline(0.5 if metric == "auroc" else 0.0, color="grey", linestyle="--", lw=0.8)
        ax.set_xticks(range(len(ticks)), ticks)
        ax.set_xlim(-0.6, len(ticks) - 0.4)
        low_end, high_end = _RANGE[metric]
        ax.set_ylim(low_end - 0.03 * (high_end - low_end), high_end + 0.03 * (high_end - low_end))
        ax.set_title(wrapped(target), fontsize=9)
        ax.set_ylabel("AUROC" if metric == "auroc" else "Spearman rho")
    inside = figures._legend_below(fig, list(handles.values()),  # noqa: SLF001
                                   [_PREDICTOR_NAMES[n] for n in handles], ncol=4)
    figures._title(fig, f"{'AUROC' if metric == 'auroc' else 'Spearman rho'} on held-out "  # noqa: SLF001
                   f"members, {part['members'].iloc[0]} members: mean and 95% corrected t interval")
    # (below: a legend's 0.45 inch, whatever the number of rows)
    figures.tight_layout(fig, rect=(0, 0 if inside else 0.45 / fig.get_size_inches()[1], 1, 1))
    figures.save(fig, path)
