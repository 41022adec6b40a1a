"""Proxies fitted on other splits (jaxillusions/studies/fit_shift.py) and the reports on them
(studies/fit_shift.py): the halves, the fits, the table, the decomposition, the settings."""

import math
import os
import shutil

import jax
import numpy as np
import pytest
from conftest import checked, finished_sweep
from flax import serialization
from hypothesis import given, settings
from hypothesis import strategies as st
from ml_collections import ConfigDict
from test_tasks import FIXTURE, _read, regression_config

from jaxillusions import model as model_lib
from jaxillusions import tasks
from jaxillusions.faithfulness.specs import resolve_site
from jaxillusions.pipeline import sweep, validate
from jaxillusions.report import results, tables
from jaxillusions.studies import fit_shift
from jaxillusions.studies import fit_shift as report

FITS = ("train", "unseen_depth", "longer")


@given(n=st.integers(0, 500), seed=st.integers(0, 2**31))
@settings(max_examples=60, deadline=None)
def test_halves_are_disjoint_and_make_up_the_split(n, seed):
    fit, held = fit_shift.halves(n, seed)
    assert not set(fit.tolist()) & set(held.tolist())
    assert sorted([*fit.tolist(), *held.tolist()]) == list(range(n))
    assert len(fit) - len(held) in (0, 1)
    again = fit_shift.halves(n, seed)  # a pure function of (index, seed): the same cut
    np.testing.assert_array_equal(fit, again[0])
    np.testing.assert_array_equal(held, again[1])


def test_halves_depend_on_the_seed_and_the_cap_takes_a_prefix_of_the_fit_half(config):
    assert not np.array_equal(fit_shift.halves(64, 0)[0], fit_shift.halves(64, 1)[0])
    splits = {"iid": _FakeSplit(np.arange(64)[:, None], np.arange(64))}
    config.fit_shift.sentences = 10
    part = fit_shift.fit_data(splits, "iid", config)
    np.testing.assert_array_equal(part.tokens[:, 0], fit_shift.halves(64, config.seed)[0][:10])
    np.testing.assert_array_equal(part.lengths, part.tokens[:, 0])  # every sentence field


class _FakeSplit:
    """A split with two per-sentence arrays (dataclasses.replace needs a dataclass)."""

    def __new__(cls, tokens, lengths):
        import dataclasses

        kind = dataclasses.make_dataclass("Split", [("tokens", np.ndarray),
                                                    ("lengths", np.ndarray)], frozen=True)
        return kind(tokens, lengths)


def _shift_config(cache_dir: str):
    """The Dyck regression sweep, with proxies also fitted on two OOD splits."""
    config = regression_config(cache_dir)
    config.fit_shift.splits = FITS
    return config


@pytest.fixture(scope="session")
def shifted(tmp_path_factory):
    """A finished sweep of _shift_config, made once for the test run (conftest.finished_sweep;
    read it; copy it to change it)."""
    return finished_sweep(tmp_path_factory, "fit_shift",
                          lambda directory: _shift_config(str(directory / "cache")))


@pytest.mark.slow
def test_extra_fits_leave_results_csv_as_the_dyck_regression_fixture(shifted):
    """Fitting on OOD splits too changes no number of results.csv (the train fit, evaluated on
    whole splits): the same comparison as test_tasks' regression test."""
    want, got = _read(FIXTURE), _read(os.path.join(shifted, "results.csv"))
    keys = ("seed", "site", "method", "size", "split", "breakdown", "bin", "n")
    assert [tuple(r[k] for k in keys) for r in got] == [tuple(r[k] for k in keys) for r in want]
    for g, w in zip(got, want, strict=True):
        for column in set(w) - set(keys):
            a = float(g[column]) if g[column] else math.nan
            b = float(w[column]) if w[column] else math.nan
            assert (math.isnan(a) and math.isnan(b)) or abs(a - b) <= 1e-6, (column, g, w)


def test_extra_fits_leave_results_csv_byte_identical(shifted, tmp_path):
    """On one machine, the run with OOD fits writes the same results.csv, byte for byte, as the
    run of the default fit_shift.splits=("train",) (which test_tasks compares with the
    fixture)."""
    cache = os.path.join(os.path.dirname(shifted), "cache")
    sweep.run(checked(regression_config(cache)), str(tmp_path / "run"), verbose=False)
    with open(os.path.join(shifted, "results.csv"), "rb") as a, \
            open(tmp_path / "run" / "results.csv", "rb") as b:
        assert a.read() == b.read()
    assert not os.path.exists(tmp_path / "run" / "fit_shift_results.csv")  # nothing extra ran
    assert not os.path.exists(tmp_path / "run" / "proxies" / "fit_train")


def test_every_fit_is_evaluated_on_every_split_on_the_evaluation_halves(shifted):
    rows = tables.read_csv(os.path.join(shifted, "fit_shift_results.csv"))
    alls = [r for r in rows if r["breakdown"] == "all"]
    cells = {(r["fit_split"], r["method"], r["split"]) for r in alls}
    for fit in FITS:
        for split in ("iid", "unseen_depth", "longer"):
            assert (fit, "svd", split) in cells and (fit, "kmeans", split) in cells
    # Data-independent proxies do not depend on the fit: evaluated once, as fit_split train.
    assert {r["fit_split"] for r in alls if r["method"] == "uniform_attention"} == {"train"}
    # A fitted-on split is evaluated on its evaluation half, whole splits otherwise: the
    # positions counted are those of the half (results.csv counts the whole split).
    run = results.load_run(shifted)
    whole = {r["split"]: r["n"] for r in results.read_csv(os.path.join(shifted, "results.csv"))
             if r["breakdown"] == "all" and r["seed"] == 0 and r["method"] == "svd"}
    for split in ("unseen_depth", "longer", "iid"):
        view_split = run.splits[split]
        held = (fit_shift.halves(len(view_split.tokens), run.config.seed)[1]
                if split in FITS else np.arange(len(view_split.tokens)))
        want = int(view_split.is_close[held].sum())
        got = {r["n"] for r in alls if r["split"] == split and r["seed"] == 0}
        assert got == {want}, split
        assert (want < whole[split]) == (split in FITS)


def _activations(run, tokens: np.ndarray, site: str) -> np.ndarray:
    """[S, N*T, F] values of `site` at non-PAD positions, per seed."""
    def one(p):
        return model_lib.forward(p, tokens, run.model_config, cache=(site,))[1][site]

    values = np.asarray(jax.vmap(one)(run.params), np.float64)  # [S, N, T, H, F]
    return values.reshape(values.shape[0], -1, values.shape[-1])[:, (tokens != 0).reshape(-1)]


def test_a_proxy_fitted_on_a_splits_fit_half_uses_those_sentences_and_is_exact_at_full_rank(
        shifted):
    """The rank-2 SVD fitted on unseen_depth spans the top eigenvectors of the fit half's
    second moments (not those of train or of the whole split); at full rank (16 = d_head) it
    reproduces the model on every split: same prediction everywhere, JSD ~ 0."""
    run = results.load_run(shifted)
    site = resolve_site("blocks.-1.attn.k", run.model_config)
    path = [p for p in os.listdir(os.path.join(shifted, "proxies", "fit_unseen_depth"))
            if p.endswith(f"svd_{site}.msgpack")][0]
    with open(os.path.join(shifted, "proxies", "fit_unseen_depth", path), "rb") as f:
        fitted = serialization.msgpack_restore(f.read())["value"][site]
    data = fit_shift.fit_data(run.splits, "unseen_depth", run.config)
    x = _activations(run, data.tokens, site)
    for s in range(x.shape[0]):
        top = np.linalg.eigh(x[s].T @ x[s])[1][:, ::-1][:, :2]
        assert fitted["mask"][s, 0, 0].sum() == 2  # sizes sorted: rank 2 first
        basis = fitted["basis"][s, 0, 0][:, :2]
        np.testing.assert_allclose(basis @ basis.T, top @ top.T, atol=2e-3)
    rows = tables.read_csv(os.path.join(shifted, "fit_shift_results.csv"))
    full = [r for r in rows if r["method"] == "svd" and r["size"] == 16
            and r["fit_split"] == "unseen_depth" and r["breakdown"] == "all"]
    assert len(full) == 2 * 3  # seeds x evaluation splits
    assert all(r["same_pred"] == 1.0 and r["jsd"] < 1e-6 for r in full)
    low = [r for r in rows if r["method"] == "svd" and r["size"] == 2
           and r["fit_split"] == "unseen_depth" and r["breakdown"] == "all"]
    assert min(r["same_pred"] for r in low) < 1.0  # rank 2 is a real simplification


def test_the_decomposition_adds_up_per_seed_and_in_the_report(shifted):
    rows = tables.read_csv(os.path.join(shifted, "fit_shift_results.csv"))
    per_seed = report.decomposition_per_seed(rows)
    assert {r["split"] for r in per_seed} == {"unseen_depth", "longer"}
    for r in per_seed:
        assert r["halved_gap"] == pytest.approx(r["distribution"] + r["capacity"], abs=1e-12)
        if r["method"] == "uniform_attention":
            assert r["distribution"] == 0.0
    table = tables.read_csv(os.path.join(shifted, "gap_decomposition.csv"))
    groups = {}
    for r in table:
        groups.setdefault((r["site"], r["method"], r["size"], r["split"], r["metric"]),
                          {})[r["part"]] = r
    assert groups
    for parts in groups.values():
        assert parts["halved_gap"]["mean"] == pytest.approx(
            parts["distribution"]["mean"] + parts["capacity"]["mean"], abs=1e-12)
        assert {p["n_seeds"] for p in parts.values()} == {2}
    assert os.path.exists(os.path.join(shifted, "figures", "gap_decomposition.png"))
    for method in ("svd", "kmeans"):
        assert os.path.exists(os.path.join(shifted, "figures", f"fit_x_eval_{method}.png"))
    # A data-independent proxy is the same whatever it is fitted on: no figure of that.
    assert not os.path.exists(os.path.join(shifted, "figures", "fit_x_eval_uniform_attention.png"))


def _row(seed, fit, split, same_pred, jsd, method="svd"):
    return {"fit_split": fit, "seed": seed, "site": "k", "method": method, "size": 2,
            "split": split, "breakdown": "all", "bin": "", "same_pred": same_pred, "jsd": jsd}


def test_decomposition_and_table_on_known_numbers():
    """Train-fitted: 0.9 on iid, 0.6 on ood; ood-fitted: 0.8 on ood. Gap 0.3 = 0.2 removed by
    refitting (distribution) + 0.1 left (capacity); JSD signs flipped (lower = faithful)."""
    rows = []
    for seed, noise in enumerate((0.0, 0.02, -0.02)):
        rows += [_row(seed, "train", "iid", 0.9, 0.1), _row(seed, "train", "ood", 0.6 + noise, 0.4),
                 _row(seed, "ood", "iid", 0.7, 0.3), _row(seed, "ood", "ood", 0.8 + noise, 0.25)]
    parts = {(r["metric"], r["part"]): r for r in report.decomposition(
        report.decomposition_per_seed(rows, "iid"))}
    assert parts[("same_pred", "halved_gap")]["mean"] == pytest.approx(0.3)
    assert parts[("same_pred", "distribution")]["mean"] == pytest.approx(0.2)
    assert parts[("same_pred", "capacity")]["mean"] == pytest.approx(0.1)
    assert parts[("same_pred", "distribution")]["share_of_halved_gap"] == pytest.approx(2 / 3)
    assert parts[("jsd", "distribution")]["mean"] == pytest.approx(0.15)
    assert parts[("jsd", "capacity")]["mean"] == pytest.approx(0.15)
    assert parts[("same_pred", "halved_gap")]["n_seeds"] == 3
    table = {(r["fit_split"], r["split"], r["metric"]): r for r in report.fit_x_eval(rows)}
    assert table[("ood", "ood", "same_pred")]["vs_train"] == pytest.approx(0.2)
    assert table[("ood", "iid", "same_pred")]["vs_train"] == pytest.approx(-0.2)
    assert table[("ood", "iid", "jsd")]["vs_train"] == pytest.approx(-0.2)
    assert table[("train", "ood", "same_pred")]["vs_train"] == 0.0
    assert table[("ood", "ood", "same_pred")]["seeds_positive"] == 3
    # Two seeds (t = 12.7): a same_pred difference's interval stops at -1 and 1 (it read
    # [-1.813, +1.363]); JSD's is the plain t interval.
    two = [r for r in rows if r["seed"] < 2]
    two += [_row(s, "wide", split, 0.9 - 0.5 * s * (split == "ood"), 0.1 + 0.5 * s)
            for s in (0, 1) for split in ("iid", "ood")]
    table = {(r["fit_split"], r["split"], r["metric"]): r for r in report.fit_x_eval(two)}
    wide = table[("wide", "ood", "same_pred")]
    assert wide["ci_low"] == -1.0 and wide["ci_high"] == 1.0
    assert table[("wide", "ood", "jsd")]["ci_low"] < -1


def test_share_of_a_gap_within_resolution_of_zero_is_empty():
    """share_of_halved_gap is a ratio over the mean halved gap: where that mean is within the
    metric's resolution of 0 (here 0.0005 < 0.001 in same_pred) the cell is NaN, the parts
    themselves are still reported."""
    rows = []
    for seed, noise in enumerate((0.0, 0.001, -0.001)):
        rows += [_row(seed, "train", "iid", 0.9, 0.1),
                 _row(seed, "train", "ood", 0.8995 + noise, 0.1),
                 _row(seed, "ood", "ood", 0.9 + noise, 0.1)]
    parts = {(r["metric"], r["part"]): r for r in report.decomposition(
        report.decomposition_per_seed(rows, "iid"))}
    assert parts[("same_pred", "halved_gap")]["mean"] == pytest.approx(0.0005)
    assert all(math.isnan(parts[("same_pred", p)]["share_of_halved_gap"])
               for p in report.PARTS)
    assert parts[("same_pred", "distribution")]["mean"] == pytest.approx(0.0005)


def test_changing_the_fit_splits_refits_only_what_changed(shifted, tmp_path):
    """Dropping `longer` from fit_shift.splits: no fit is recomputed (the train fit and the
    unseen_depth fit stay, byte for byte), the evaluations on the new halved set are redone."""
    workdir = str(tmp_path / "run")
    shutil.copytree(shifted, workdir)
    config = _shift_config(os.path.join(os.path.dirname(shifted), "cache"))
    config.fit_shift.splits = ("train", "unseen_depth")
    fits = sorted(p for d in ("proxies", "proxies/fit_unseen_depth")
                  for p in _files(os.path.join(workdir, d), ".msgpack"))
    before = {p: os.stat(p).st_mtime_ns for p in fits}
    sweep.run(checked(config), workdir, verbose=False)
    assert {p: os.stat(p).st_mtime_ns for p in fits} == before
    moved = [p for p in _files(os.path.join(workdir, "superseded"), "")]
    assert moved and not [p for p in moved if p.endswith(".msgpack")]
    rows = tables.read_csv(os.path.join(workdir, "fit_shift_results.csv"))
    assert {r["fit_split"] for r in rows} == {"train", "unseen_depth"}


def _files(directory: str, suffix: str) -> list[str]:
    return [os.path.join(d, f) for d, _, names in os.walk(directory) for f in names
            if f.endswith(suffix)]


@pytest.mark.parametrize(("settings_", "message"), [
    ({"splits": ("train", "nope")}, "fit_shift.splits: 'nope' is unknown in task dyck; "
                                     "available: train, "),
    ({"splits": ("train", "other_language")},
     "fit_shift.splits: 'other_language' is a split of task code, not task dyck"),
    ({"splits": ("unseen_depth",)}, "must list 'train'"),
    ({"splits": ("train", "longer", "longer")}, "fit_shift.splits=('train', 'longer', 'longer'): "
     "'longer' is given twice; give each value once"),
    ({"splits": "train"}, "fit_shift.splits='train': must be a tuple of strings"),
    ({"sentences": -1}, "fit_shift.sentences=-1: must be >= 0"),
    ({"sentences": 1.5}, "fit_shift.sentences=1.5: must be an integer"),
    ({"sentences": 1, "proxies.kmeans_sizes": (2, 64)},
     "fit_shift.sentences=1: at most {width} positions to fit kmeans on, fewer than its "
     "largest size 64"),
])
def test_a_bad_fit_setting_is_a_one_line_error_before_any_work(config, tmp_path, settings_,
                                                               message):
    config = ConfigDict(config.to_dict(), type_safe=False)  # wrong types reach validation
    for key, value in settings_.items():  # a key of fit_shift.*, or a section's dotted key
        section, _, name = key.rpartition(".")
        config[section or "fit_shift"][name] = value
    with pytest.raises(ValueError) as err:
        sweep.run(checked(config), str(tmp_path / "run"), verbose=False)
    message = message.format(width=tasks.get(config).widest_width(config.data))  # BOS..EOS
    assert message in str(err.value) and "\n" not in str(err.value), str(err.value)
    assert not os.path.exists(tmp_path / "run" / "config.json")  # nothing was started


def test_fit_settings_are_analysis_keys_with_defaults():
    assert validate.parse({}).is_analysis_key("fit_shift.splits")
    assert validate.parse({}).is_analysis_key("fit_shift.sentences")
    assert validate.parse({}).fit_shift == fit_shift.FitShift()
    assert fit_shift.FitShift().splits == ("train",)


def test_the_figure_draws_a_dictionarys_size_codes_at_their_widths_a_line_per_k():
    """Was: x ticks at the codes (400032, 800064 on a log2 axis) and one line zigzagging over
    both k. Now each k is its own line at the widths, named in the legend."""
    from jaxillusions.proxies import sae

    codes = [sae.size_code(w, k) for k in (4, 8) for w in (32, 64)]
    table = [{"site": "blocks.1.attn.q", "method": "sae", "size": code, "fit_split": fit,
              "split": "ood", "metric": "same_pred", "vs_train": 0.01 * i, "ci_low": 0.0,
              "ci_high": 0.02 * i + 0.01, "n_seeds": 3}
             for i, code in enumerate(codes) for fit in ("train", "ood")]
    fig = report.fit_x_eval_figure(table, "sae", ["iid", "ood"], ["train", "ood"], "same_pred")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["32", "64"]
    lines = {bars.get_label(): bars.lines[0] for bars in ax.containers}  # errorbar's line
    assert sorted(lines) == ["fit on ood, q, k = 4", "fit on ood, q, k = 8"]
    for k, line in zip((4, 8), (lines["fit on ood, q, k = 4"], lines["fit on ood, q, k = 8"]),
                       strict=True):
        assert np.allclose(np.log2(line.get_xdata()).round(), [5, 6])  # at the widths
        assert np.allclose(line.get_ydata(), [0.01 * codes.index(sae.size_code(w, k))
                                              for w in (32, 64)])
