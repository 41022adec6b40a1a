"""The held-out prediction test (report/heldout.py) on planted populations: a feature that
is the target by construction, a null feature that is pure noise, hyper-parameters that shift
the target between settings but say nothing inside one."""

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("sklearn")

from tolerance import TERM_ULPS  # noqa: E402

from jaxillusions.report import heldout  # noqa: E402

# 6 settings (depth x weight decay) of 36 members, plus one (depth 4) whose members all lie
# above the median: its leave-one-setting-out AUROC fold has one class and is skipped.
DEPTHS, DECAYS, PER_SETTING = (1, 2, 3), (0.0, 1.0), 36
DESIGN = heldout.Design(features=("signal",), hparams=("depth", "wd"), targets=("ood",),
                           n_splits=5, n_repeats=5)


def population(seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(members, null): ood = shift(setting) + u, u ~ N(0, 1) per member; the feature `signal`
    IS ood (it determines the target by construction); the null frame's `signal` is fresh
    N(0, 1) noise for the same members."""
    rng = np.random.default_rng(seed)
    rows = []
    for depth in (*DEPTHS, 4):
        for wd in DECAYS if depth < 4 else (0.0,):
            for _ in range(PER_SETTING):
                shift = 5.0 if depth == 4 else 0.8 * (depth - 2) + 0.5 * (wd - 0.5)
                ood = shift + (0.1 if depth == 4 else 1.0) * rng.normal()
                rows.append({"depth": depth, "wd": wd, "setting": f"d{depth}-wd{wd:g}",
                             "signal": ood, "ood": ood})
    members = pd.DataFrame(rows, index=[f"m{i:03d}" for i in range(len(rows))])
    null = members.copy()
    null["signal"] = rng.normal(size=len(null))
    return members, null


@pytest.fixture(scope="module")
def planted():
    members, null = population()
    return members, null, heldout.predict(members, DESIGN, null, random_state=0)


def cell(frame, metric, scheme, predictors="features", null=False) -> pd.Series:
    (i,) = np.flatnonzero((frame["metric"] == metric) & (frame["scheme"] == scheme)
                          & (frame["predictors"] == predictors) & (frame["null"] == null))
    return frame.iloc[i]


def hanley_mcneil_se(auc: float, n1: int, n0: int) -> float:
    """Standard error of an AUROC over n1 positives and n0 negatives (Hanley & McNeil 1982)."""
    q1, q2 = auc / (2 - auc), 2 * auc**2 / (1 + auc)
    return math.sqrt((auc * (1 - auc) + (n1 - 1) * (q1 - auc**2) + (n0 - 1) * (q2 - auc**2))
                     / (n1 * n0))


def chance_se(members, scheme: str) -> float:
    """SE of the mean held-out AUROC of a predictor with no information (true AUROC 0.5): the
    test folds of one repeat (random splits) or of the scheme (one per setting) are disjoint,
    so their mean has SE sqrt(sum SE_k^2) / K with SE_k Hanley-McNeil's for fold k; the mean
    over repeats, an average of such means, is no more variable than the largest of them."""
    kept, _ = heldout.folds(members, DESIGN, "ood", "auroc", scheme)
    y = members["ood"].to_numpy() > np.median(members["ood"])
    per_repeat = DESIGN.n_splits if scheme == "random" else len(kept)
    ses = [hanley_mcneil_se(0.5, int(y[test].sum()), int((~y[test]).sum())) for _, test in kept]
    return max(math.sqrt(sum(s**2 for s in ses[r:r + per_repeat])) / per_repeat
               for r in range(0, len(ses), per_repeat))


def test_planted_feature_predicts_perfectly_and_noise_at_chance(planted):
    members, _, frame = planted
    for scheme in heldout.SCHEMES:
        for metric in heldout.METRICS:  # signal == ood: every fold ranks perfectly
            row = cell(frame, metric, scheme)  # (spearmanr's rho of equal ranks: 1 - 1 ulp)
            assert (row["mean"], row["sd"]) == pytest.approx((1.0, 0.0), abs=1e-12)
            assert math.isnan(row["low"]) and math.isnan(row["high"])  # no spread, no interval
        # Pure noise: the mean AUROC within 4 standard errors of 0.5.
        noise = cell(frame, "auroc", scheme, null=True)
        assert abs(noise["mean"] - 0.5) < 4 * chance_se(members, scheme), (scheme, noise["mean"])
        assert noise["low"] < 0.5 < noise["high"]
        assert cell(frame, "auroc", scheme, "features - null", null=True)["verdict"] == "beats"
        # Held out, the hyper-parameters score 0.5 in every fold, so the difference is 0.5 in
        # every fold: no spread to scale an interval. Random splits: theirs varies.
        vs = "beats" if scheme == "random" else "undefined"
        assert cell(frame, "auroc", scheme, "features - hparams")["verdict"] == vs
        assert cell(frame, "auroc", scheme)["verdict"] == f"vs hparams: {vs}; vs null: beats"
    assert (frame["members"] == len(members)).all()
    assert (frame.loc[frame["metric"] == "auroc", "threshold"] == np.median(members["ood"])).all()
    assert frame.loc[frame["metric"] == "spearman", "threshold"].isna().all()


def test_hyperparameters_predict_across_settings_but_not_inside_a_held_out_one(planted):
    # Li et al.'s finding by construction: the settings' shifts separate members drawn from
    # different settings (random splits), but a held-out setting's members share their
    # hyper-parameters, so the hyper-parameter model scores them all alike: AUROC 0.5 (ties)
    # and rho 0 in every fold, whatever it learnt from the other settings.
    members, _, frame = planted
    random = cell(frame, "auroc", "random", "hparams")
    assert random["mean"] > 0.5 + 4 * chance_se(members, "random") and random["low"] > 0.5
    for metric, chance in (("auroc", 0.5), ("spearman", 0.0)):
        held_out = cell(frame, metric, "leave_one_setting_out", "hparams")
        assert (held_out["mean"], held_out["sd"]) == (chance, 0.0)
    assert cell(frame, "spearman", "random", "hparams")["low"] > 0


def test_one_class_folds_are_skipped_and_counted(planted):
    members, _, frame = planted
    y = members["ood"] > np.median(members["ood"])
    one_class = int((y.groupby(members["setting"]).nunique() == 1).sum())
    assert one_class >= 1  # the depth-4 setting, all above the median
    loso = frame[frame["scheme"] == "leave_one_setting_out"]
    settings = members["setting"].nunique()
    auroc, spearman = loso[loso["metric"] == "auroc"], loso[loso["metric"] == "spearman"]
    assert (auroc["n_skipped"] == one_class).all()
    assert (auroc["n_folds"] == settings - one_class).all()
    assert (spearman["n_skipped"] == 0).all() and (spearman["n_folds"] == settings).all()
    random = frame[frame["scheme"] == "random"]
    assert (random["n_folds"] == DESIGN.n_splits * DESIGN.n_repeats).all()
    assert (random["n_skipped"] == 0).all()


FITTED = []  # the training rows of every fit (each fold fits a fresh estimator)


def test_leave_one_setting_out_never_trains_on_the_held_out_setting(monkeypatch):
    members, _ = population()
    setting = members["setting"].to_numpy()
    for metric in heldout.METRICS:
        kept, skipped = heldout.folds(members, DESIGN, "ood", metric, "leave_one_setting_out")
        held_out = [set(setting[test]) for _, test in kept]
        assert all(len(h) == 1 for h in held_out)
        assert all(not set(setting[train]) & h for (train, _), h in zip(kept, held_out,
                                                                         strict=True))
        assert len({h.pop() for h in held_out}) == len(kept) == len(set(setting)) - skipped
    # And what is fitted: a member id as a second feature shows which rows each fit saw.
    members["member"] = np.arange(len(members), dtype=np.float64)
    members["noise"] = np.random.default_rng(2).normal(size=len(members))
    real = heldout._fit  # noqa: SLF001
    monkeypatch.setattr(heldout, "_fit", lambda metric, x, y: FITTED.append(
        np.array(x, copy=True)) or real(metric, x, y))
    monkeypatch.setattr(heldout, "SCHEMES", ("leave_one_setting_out",))
    FITTED.clear()
    design = heldout.Design(("signal", "member", "noise"), DESIGN.hparams, DESIGN.targets)
    heldout.predict(members, design)
    num_folds = sum(len(heldout.folds(members, design, "ood", metric,
                                         "leave_one_setting_out")[0])
                    for metric in heldout.METRICS)
    width = heldout.hparam_matrix(members, design).shape[1]  # indicators of values, settings
    assert width > 3
    with_ids = [x for x in FITTED if x.shape[1] in (3, 3 + width)]  # features, both
    hparams = [x for x in FITTED if x.shape[1] == width]
    assert len(FITTED) == 3 * num_folds and len(with_ids) == 2 * num_folds
    for x in with_ids:
        seen = setting[x[:, 1].astype(int)]
        missing = set(setting) - set(seen)
        assert len(missing) == 1  # one setting held out, every member of the others trained on
        assert len(seen) == (setting != missing.pop()).sum()
    # The hyper-parameter fits see every setting's indicator row but the held-out one's.
    assert all(len(set(map(tuple, x))) == len(set(setting)) - 1 for x in hparams)


def test_a_fit_scores_rows_as_its_pipeline_does():
    """heldout._fit applies model(metric)'s steps by hand: the numbers of its decision_function
    (AUROC) and predict (Spearman), bit for bit; _auroc is roc_auc_score's area, ties
    included, up to the rounding of its trapezoid sum."""
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(4)
    x = rng.normal(size=(40, 3)) * [1.0, 10.0, 0.1] + [0.0, 5.0, -2.0]
    y = (x[:, 0] + rng.normal(size=40) > 0).astype(np.int64)
    rows = rng.normal(size=(7, 3)) * [1.0, 10.0, 0.1]
    fitted = heldout._fit("auroc", x, y)  # noqa: SLF001
    assert np.array_equal(fitted(rows), heldout.model("auroc").fit(x, y).decision_function(rows))
    fitted = heldout._fit("spearman", x, x[:, 0])  # noqa: SLF001
    assert np.array_equal(fitted(rows), heldout.model("spearman").fit(x, x[:, 0]).predict(rows))
    # The area: exact on a separating and on a constant score; else within roc_auc_score's
    # float64 rounding, a few roundings (TERM_ULPS) in each of its at most 40 trapezoids of
    # values at most 1.
    assert heldout._auroc(y + 0.5, y) == 1.0 and heldout._auroc(np.ones(40), y) == 0.5  # noqa: SLF001
    bound = (len(y) + 1) * TERM_ULPS * np.finfo(np.float64).eps
    for scores in (rng.normal(size=40), np.round(rng.normal(size=40), 1), rng.integers(0, 3, 40)):
        assert abs(heldout._auroc(scores, y) - roc_auc_score(y, scores)) <= bound  # noqa: SLF001


def bad(members, null, case):
    """(members, null, design) with one planted problem."""
    design = DESIGN
    if case == "missing column":
        members = members.drop(columns="wd")
    elif case == "NaN in a feature":
        members.loc[members.index[3], "signal"] = np.nan
    elif case == "NaN in the null features":
        null.loc[null.index[5], "signal"] = np.nan
    elif case == "one class after binarising":  # the median is the common value 1.0
        members["ood"] = np.where(np.arange(len(members)) < 3, 0.5, 1.0)
    elif case == "threshold outside the range":
        design = dataclasses.replace(DESIGN, threshold={"ood": 9.5})
    elif case == "not numeric":
        members["depth"] = members["depth"].astype(str)
    elif case == "null of other members":
        null = null.iloc[1:]
    return members, null, design


CASES = {"missing column": "'wd'", "NaN in a feature": "'signal'",
         "NaN in the null features": "'signal'",
         "one class after binarising": "'ood'", "threshold outside the range": "9.5",
         "not numeric": "'depth'", "null of other members": "null frame"}


@pytest.mark.parametrize("case", CASES)
def test_bad_input_raises_a_one_line_error_before_fitting(case, monkeypatch):
    def fitted(*args, **kwargs):
        raise AssertionError("fitted before the input was checked")

    monkeypatch.setattr(heldout, "model", fitted)
    members, null, design = bad(*population(), case)
    with pytest.raises(ValueError) as error:
        heldout.predict(members, design, null)
    message = str(error.value)
    assert "\n" not in message and CASES[case] in message, message


def test_one_setting_is_tested_under_the_random_splits_against_chance():
    # A population of seeds alone (no hyper-parameter varies; was refused, "leave-one-setting-
    # out needs at least 2 settings"): the random splits only; the hyper-parameters are one
    # constant column, so they score chance in every fold, and `both` would be the features.
    members, null = population()
    one = members["setting"] == "d2-wd1"  # 36 seeds
    members, null = members[one].copy(), null[one]
    # The target and a noisy reading of it (signal alone ranks every fold perfectly: no spread)
    members["ood"] += 0.5 * np.random.default_rng(1).normal(size=len(members))
    design = dataclasses.replace(DESIGN, hparams=(), n_repeats=2)
    frame = heldout.predict(members, design, null)
    assert set(frame["scheme"]) == {"random"} and set(frame["members"]) == {len(members)}
    assert set(frame["predictors"]) == {"features", "hparams", "features - hparams",
                                        "features - null"}
    for metric, chance in (("auroc", 0.5), ("spearman", 0.0)):
        hparams = cell(frame, metric, "random", "hparams")
        assert (hparams["mean"], hparams["sd"]) == (chance, 0.0)
        assert cell(frame, metric, "random")["mean"] > 0.6  # signal reads the target
        assert cell(frame, metric, "random", "features - hparams")["verdict"] == "beats"
    assert "random splits (10 folds, 0 skipped)" in "\n".join(heldout.report_lines(frame))


def test_same_seed_gives_the_identical_frame():
    members, null = population(seed=1)
    members, null = members.iloc[::3], null.iloc[::3]  # 84 members: quicker
    design = dataclasses.replace(DESIGN, n_repeats=2, n_splits=3)
    first = heldout.predict(members, design, null, random_state=3)
    pd.testing.assert_frame_equal(first, heldout.predict(members, design, null,
                                                            random_state=3))
    other = heldout.predict(members, design, null, random_state=4)
    loso = first["scheme"] == "leave_one_setting_out"
    pd.testing.assert_frame_equal(first[loso], other[loso])  # no randomness in these folds
    assert not first[~loso].equals(other[~loso])
    assert list(first.columns) == list(heldout.COLUMNS)


def test_between_is_called_after_each_target_and_may_stop_the_test():
    """The stage passes its check for a signal (was: a signal waited for the whole test): it
    runs after each target's folds, and an exception it raises ends the test there."""
    members, null = population(seed=1)
    members, null = members.iloc[::3].copy(), null.iloc[::3].copy()
    members["ood2"] = -members["ood"]
    design = dataclasses.replace(DESIGN, n_repeats=1, n_splits=3, targets=("ood", "ood2"))
    calls = []
    frame = heldout.predict(members, design, null, between=lambda: calls.append(len(calls)))
    assert calls == [0, 1] and set(frame["target"]) == {"ood", "ood2"}

    def stop():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        heldout.predict(members, design, null, between=stop)


def test_calls_that_share_what_they_fitted_fit_the_hparams_baseline_once(monkeypatch):
    """Two feature sets on the same members and folds, as the prediction stage calls it per
    feature family: with one `fitted` dict the second call fits all but the hyper-parameter
    baseline again, and both frames are those of separate calls."""
    members, null = population(seed=1)
    members, null = members.iloc[::3].copy(), null.iloc[::3].copy()
    rng = np.random.default_rng(5)
    members["other"], null["other"] = rng.normal(size=(2, len(members)))
    designs = [dataclasses.replace(DESIGN, n_repeats=2, n_splits=3, features=f)
               for f in (("signal",), ("signal", "other"))]
    alone = [heldout.predict(members, d, null, random_state=3) for d in designs]
    widths, real = [], heldout._scores  # noqa: SLF001
    monkeypatch.setattr(heldout, "_scores", lambda x, *a: widths.append(x.shape[1]) or real(x, *a))
    fitted = {}
    shared = [heldout.predict(members, d, null, random_state=3, fitted=fitted) for d in designs]
    for one, other in zip(alone, shared, strict=True):
        pd.testing.assert_frame_equal(one, other)
    hparams = heldout.hparam_matrix(members, designs[0]).shape[1]
    fits = len(widths) // 7  # (target, metric, scheme) cells with folds: 4 sets, then 3
    assert fits >= 3 and len(widths) == 7 * fits
    assert widths.count(hparams) == fits and hparams not in widths[4 * fits:]


def test_fold_interval_and_verdicts():
    values = np.array([0.6, 0.7, 0.8, 0.5, 0.9])
    mean, sd, low, high = heldout.fold_interval(values, test_over_train=0.25)
    half = 2.7764451051977987 * values.std(ddof=1) * math.sqrt(1 / 5 + 0.25)  # t_{4, 0.975}
    assert (mean, sd) == pytest.approx((0.7, values.std(ddof=1)))
    assert (low, high) == pytest.approx((0.7 - half, 0.7 + half))
    assert math.isnan(heldout.fold_interval([0.5], 0.25)[2])
    assert heldout.compare(0.01, 0.2) == "beats"
    assert heldout.compare(-0.2, -0.01) == "loses"
    assert heldout.compare(-0.1, 0.1) == "within noise"
    assert heldout.compare(math.nan, math.nan) == "undefined"


def test_folds_of_one_value_carry_no_interval_and_no_verdict():
    """Identical per-fold values (up to rounding) have no spread to scale a t interval: no
    interval, verdict undefined, and the text says why. Was: 2 folds of tiny settings gave
    `-0.500 ± 0.000 [-0.500, -0.500]: loses`."""
    for values in ([-0.5, -0.5], [1.0] * 50, [1.0, 1.0 - 2**-53, 1.0]):
        mean, sd, low, high = heldout.fold_interval(values, 0.25)
        assert mean == pytest.approx(values[0]) and sd < 1e-12
        assert math.isnan(low) and math.isnan(high)
        assert heldout.compare(low, high) == "undefined"
    assert not math.isnan(heldout.fold_interval([0.5, 0.5, 0.75], 0.25)[2])
    # 2 settings of 4 members: each held-out fold scores the feature 0 or 1.
    rows = [{"setting": f"s{s}", "h": float(s), "f": f, "y": y}
            for s in (0, 1) for f, y in ((0.0, 1.0), (1.0, 0.0), (2.0, 3.0), (3.0, 2.0))]
    members = pd.DataFrame(rows, index=[f"m{i}" for i in range(len(rows))])
    design = heldout.Design(features=("f",), hparams=("h",), targets=("y",), n_splits=2,
                            n_repeats=1)
    frame = heldout.predict(members, design)
    loso = frame[frame["scheme"] == "leave_one_setting_out"]
    paired = loso[loso["predictors"] == "features - hparams"]
    assert (paired["sd"] == 0).all() and set(paired["verdict"]) == {"undefined"}
    text = "\n".join(heldout.report_lines(frame))
    assert "(no interval: every fold has the same value): undefined" in text
    assert ": loses" not in text.split("leave one setting out")[1].split("random")[0]


@pytest.mark.parametrize("args, message", [
    (("ood", "auroc", "loso"), "scheme 'loso': give one of random, leave_one_setting_out"),
    (("ood", "aucroc", "random"), "metric 'aucroc': give one of auroc, spearman"),
    (("acc", "auroc", "random"), "target 'acc': give one of ood"),
])
def test_folds_refuses_an_unknown_target_metric_or_scheme(args, message):
    members, _ = population()
    with pytest.raises(ValueError) as err:  # was: random folds, Spearman folds, a KeyError
        heldout.folds(members, DESIGN, *args)
    assert str(err.value) == message


@pytest.mark.parametrize("field, value, message", [
    ("features", "signal", "Design.features='signal': give a tuple of column names"),
    ("targets", "ood", "Design.targets='ood': give a tuple of column names"),
    ("threshold", True, "Design.threshold=True: give a number or 'median'"),
    ("threshold", {"ood": "mean"}, "Design.threshold={'ood': 'mean'}: give a number"),
    ("n_splits", 2.5, "Design.n_splits=2.5: give an integer >= 2"),
    ("n_splits", 1, "Design.n_splits=1: give an integer >= 2"),
    ("n_repeats", True, "Design.n_repeats=True: give an integer >= 1"),
])
def test_a_design_field_of_another_type_is_a_one_line_error(field, value, message):
    with pytest.raises(ValueError) as err:  # was: "no column 'f'", 1.0, accepted
        dataclasses.replace(DESIGN, **{field: value})
    assert str(err.value).startswith(message) and "\n" not in str(err.value)
    design = dataclasses.replace(DESIGN, features=["signal"], threshold=np.float64(0.1))
    assert design.features == ("signal",)  # a list is a tuple of columns too


def test_report_lines_and_figure(planted, tmp_path):
    _, _, frame = planted
    lines = heldout.report_lines(frame)
    text = "\n".join(lines)
    assert f"AUROC of ood > {frame['threshold'].iloc[0]:g}" in text
    loso = cell(frame, "auroc", "leave_one_setting_out")
    assert (f"leave one setting out ({loso['n_folds']} folds, {loso['n_skipped']} skipped)"
            in text)
    assert ("features - hparams +0.500 ± 0.000 (no interval: every fold has the same value): "
            "undefined") in text
    one = frame.assign(n_folds=1)  # was: "1 folds"
    assert "(1 fold, " in "\n".join(heldout.report_lines(one))
    path = tmp_path / "heldout.png"
    heldout.figure(frame, str(path))
    assert path.stat().st_size > 10_000


def test_attention_targets_name_the_matched_bracket_and_the_copied_token():
    """Dyck's stack_top: at a position whose next token closes a bracket, the open bracket it
    closes; the text and code tasks' induction target: the position after the previous
    occurrence of the current token."""
    from jaxillusions.tasks import _text_copying, dyck, dyck_sentences

    # BOS ( [ ] ) EOS PAD, 2 bracket types: opens 3, 4; closes 5, 6.
    split = dyck_sentences.annotate(np.array([[1, 3, 4, 6, 5, 2, 0]]), num_types=2)
    top = dyck.attention_targets(split)["stack_top"][0]
    assert top.tolist() == [-1, -1, 2, 1, -1, -1, -1]
    tokens = np.array([[1, 7, 8, 9, 7, 8, 0], [1, 5, 5, 5, 6, 0, 0]])
    assert _text_copying.induction_targets(tokens).tolist() == [[-1, -1, -1, -1, 2, 3, -1],
                                                                [-1, -1, 2, 3, -1, -1, -1]]


def test_members_with_the_same_inputs_get_the_same_score():
    """A scorer whose numbers drift with a row's place (as a matrix product's last bits can)
    still scores identical rows alike: held-out members of one setting tie, AUROC 0.5."""
    x = np.repeat(np.array([[0.0, 1.0], [1.0, 0.0]]), 50, axis=0)
    drifting = lambda rows: rows[:, 0] + 1e-9 * np.arange(len(rows))  # noqa: E731
    scores = heldout._per_row(drifting, x)  # noqa: SLF001
    assert len(np.unique(scores[:50])) == len(np.unique(scores[50:])) == 1
    y = np.tile([0, 1], 50)
    from sklearn.metrics import roc_auc_score
    assert roc_auc_score(y[:50], scores[:50]) == 0.5
