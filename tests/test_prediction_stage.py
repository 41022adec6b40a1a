"""The prediction study as a stage of the main job (studies/prediction.py): a tiny Dyck run whose
members differ in one hyper-parameter (train.contrastive_weights) ends with prediction.csv,
prediction.txt and its figure, each member one row; bad settings are refused at the door."""

import glob
import json
import os

import numpy as np
import pandas as pd
import pytest
from conftest import tiny_sweep_config

from jaxillusions.pipeline import sweep, validate
from jaxillusions.report import heldout
from jaxillusions.studies import prediction
from jaxillusions.training import train

pytest.importorskip("sklearn")


def _config(cache_dir):
    config = tiny_sweep_config(cache_dir)
    config.train.num_seeds = 4
    config.train.contrastive_weights = (0.0, 1.0)  # 2 settings x 4 seeds
    config.prediction.enabled = True
    config.prediction.n_splits = 2
    config.prediction.n_repeats = 2
    config.figures = "none"
    return config


@pytest.mark.slow  # a whole sweep
def test_the_prediction_stage_predicts_every_member_out_of_distribution(tmp_path, cache_dir):
    config = _config(cache_dir)
    workdir = str(tmp_path / "run")
    sweep.run(validate.check(config)[0], workdir, verbose=False)
    rows = pd.read_csv(os.path.join(workdir, "prediction.csv")).to_dict("records")
    assert {r["scheme"] for r in rows} == {"random", "leave_one_setting_out"}
    assert {r["predictors"] for r in rows} >= {"features", "hparams", "both",
                                               "features - hparams"}
    assert {r["members"] for r in rows} == {8}  # every healthy member, once
    # Targets: the original model's accuracy on each OOD split, and each family's gap there.
    targets = {r["target"] for r in rows}
    assert {"acc:unseen_depth", "acc:longer"} <= targets
    assert any(t.startswith("gap:svd:") for t in targets)
    loso = [r for r in rows if r["scheme"] == "leave_one_setting_out"]
    assert {r["n_folds"] + r["n_skipped"] for r in loso} == {2}  # one per setting
    # Hyper-parameters alone cannot rank the members of a held-out setting: chance exactly.
    assert {float(r["mean"]) for r in loso if r["predictors"] == "hparams"
            and r["metric"] == "auroc"} == {0.5}
    text = open(os.path.join(workdir, "prediction.txt")).read()
    assert text.startswith("Held-out prediction: 8 trained members, 2 settings of "
                           "hp:contrastive_weight")
    assert os.path.getsize(os.path.join(workdir, "prediction_auroc.png")) > 0
    # Each setting is a group of its own; the population stage's files are in the workdir.
    assert os.path.isfile(os.path.join(workdir, "contrastive_weight_1", "results.csv"))


@pytest.mark.slow  # a whole sweep
def test_heads_probes_and_the_null_are_features_each_family_tested_alone(tmp_path, cache_dir):
    """With the untrained null, probes and the task's attention targets: the members frame
    (prediction_members.csv) has each head's stack-top attention and each probe's accuracy
    beside the proxies' features, for the trained members and their untrained copies; the test
    runs on all features and on each family alone, each with its null rows."""
    config = _config(cache_dir)
    config.train.null = ("untrained",)
    config.proxies.concepts = ("depth",)
    config.probes.sites = ("blocks.-1.resid_post",)
    workdir = str(tmp_path / "run")
    sweep.run(validate.check(config)[0], workdir, verbose=False)
    members = pd.read_csv(os.path.join(workdir, "prediction_members.csv"), index_col="member")
    assert sorted(members["kind"].value_counts().items()) == [("trained", 8), ("untrained", 8)]
    heads = [c for c in members if c.startswith("attn:stack_top:")]
    assert heads == ["attn:stack_top:L0H0", "attn:stack_top:L1H0"]  # 2 layers x 1 head
    assert ((members[heads] >= 0) & (members[heads] <= 1)).all().all()
    assert [c for c in members if c.startswith("probe:")] == ["probe:blocks.1.resid_post:depth"]
    trained, null = (members[members["kind"] == k] for k in ("trained", "untrained"))
    assert sorted(trained.index) == sorted(null.index)  # each member beside its own null copy
    # The untrained copies attend as initialised: not as their trained twins.
    assert not (trained[heads].to_numpy() == null.loc[trained.index, heads].to_numpy()).all()
    rows = pd.read_csv(os.path.join(workdir, "prediction.csv"))
    assert list(dict.fromkeys(rows["family"])) == ["all", "proxies", "heads", "probes"]
    for family, part in rows.groupby("family"):
        assert part["null"].any(), family  # every family's features beside their null values
    text = open(os.path.join(workdir, "prediction.txt")).read()
    assert "Features: heads (2)" in text and "Features: probes (1)" in text


@pytest.mark.parametrize("change, message", [
    # One setting (seeds alone) is tested under the random splits, which need the members.
    ({"train.contrastive_weights": (), "train.num_seeds": 3},
     "prediction.n_splits=2: the random splits need at least 4 trained members (each class of "
     "a target split at its median holds at most half of them); this run has 3 (3 seeds x 1 "
     "setting): more train.num_seeds, or fewer prediction.n_splits"),
    ({"proxies.methods": ()}, "prediction.enabled=True: needs proxies"),
    ({"prediction.threshold": "2.5"},
     "prediction.threshold='2.5': must be 'median' or a number in [-1, 1]"),
    # Was: the whole sweep ran, then the prediction stage stopped on a target "with 1 members
    # in its smaller class".
    ({"train.num_seeds": 1}, "prediction.n_splits=2: the random splits need at least 4 trained "
     "members (each class of a target split at its median holds at most half of them); this "
     "run has 2 (1 seed x 2 settings)"),
    # Was: the whole sweep ran, then "no target varies over the 8 healthy members".
    ({"proxies.eval_splits": ("iid", "iid_with_train")}, "prediction.enabled=True: the targets "
     "are behaviour out of distribution, and proxies.eval_splits=('iid', 'iid_with_train') has "
     "no split outside the task's iid, iid_with_train; add one"),
    # Was: the whole sweep ran, then "no feature varies over the 8 healthy members".
    ({"prediction.features": ("probes",)}, "prediction.features=('probes',): no features to "
     "read (probes: probes.sites is empty); add proxies to the features, or set what they read"),
    # Was: one number applied to accuracies (~0.6) and gaps (~0.05), failing after training.
    ({"prediction.threshold": "0.6"}, "prediction.threshold='0.6': one number for every "
     "target, but prediction.gaps=True adds gap targets (near 0) beside the accuracies; set "
     "prediction.gaps=False, or threshold 'median'"),
    # Was: features measured out of distribution, called "in-distribution measurements".
    ({"proxies.gap_baseline": "longer"}, "prediction.enabled=True: the features are measured "
     "on proxies.gap_baseline='longer', which is out of distribution (the targets' side); set "
     "it to one of the task's iid, iid_with_train"),
])
def test_bad_prediction_settings_are_one_line_errors_at_the_door(cache_dir, change, message):
    config = _config(cache_dir)
    for key, value in change.items():
        section, name = key.split(".")
        config[section][name] = value
    with pytest.raises(ValueError) as err:
        validate.check(config)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)



def test_a_numeric_threshold_passes_the_door_without_gap_targets(cache_dir):
    config = _config(cache_dir)
    config.prediction.threshold, config.prediction.gaps = "0.6", False
    assert validate.check(config)[0].prediction.threshold == "0.6"


def _point(depth: int, kinds=(0, 1, 2), seeds: int = 4) -> pd.DataFrame:
    """A grid point's members frame as the grid reads it (prediction_members.csv of a point
    of depth `depth`, weight decays 0.001 and 0.01 as float32 values, every null kind),
    its grid key added: the feature reads the target on the trained members; the untrained
    copies' feature is near +100, the shuffled ones' near -100."""
    rng = np.random.default_rng(depth)
    rows = []
    for wd in np.float32([0.001, 0.01]):
        for seed in range(seeds):
            acc = rng.normal()
            for kind in kinds:
                rows.append({"hp:weight_decay": float(wd), "hp:null": float(kind), "seed": seed,
                             "same_pred:svd:blocks.0.attn.q:2": (acc, 100, -100)[kind]
                             + 0.3 * rng.normal(), "acc:unseen_depth": acc})
    return prediction.with_setting(pd.DataFrame(rows)).assign(**{"hp:model.n_layers": depth})


def test_a_grids_members_are_named_by_every_varying_setting_and_the_null_kind_is_named(
        tmp_path):
    """The joined frame of a 2-depth x 2-decay grid: each trained member named once, its setting
    holding the depth and the decay as the group directories write them (was: `0.0/seed0` twice,
    float32 digits, leave-one-setting-out pooling depths); the null population is train.null's
    first kind, named in prediction.csv and prediction.txt (was: untrained, whatever the order,
    and never named)."""
    pc = prediction.Prediction(enabled=True, features=("proxies",), gaps=False, n_splits=2,
                               n_repeats=2)
    frame = pd.concat([_point(1), _point(2)])
    result = prediction.test(frame, pc, str(tmp_path), lambda *a: None, ("shuffled", "untrained"))
    written = pd.read_csv(tmp_path / "prediction_members.csv", index_col="member")
    trained = written[written["kind"] == "trained"].drop(columns="kind")
    assert trained.index.is_unique and len(trained) == 16
    assert sorted(set(trained["setting"])) == ["0.001/1", "0.001/2", "0.01/1", "0.01/2"]
    assert "0.001/2/seed3" in trained.index
    design = heldout.Design(features=("same_pred:svd:blocks.0.attn.q:2",),
                            hparams=("hp:weight_decay", "hp:model.n_layers"),
                            targets=("acc:unseen_depth",), n_splits=2, n_repeats=1)
    assert len(heldout.folds(trained, design, "acc:unseen_depth", "spearman",
                             "leave_one_setting_out")[0]) == 4
    assert set(result["null_kind"]) == {"shuffled"}
    assert set(pd.read_csv(tmp_path / "prediction.csv")["null_kind"]) == {"shuffled"}
    head = (tmp_path / "prediction.txt").read_text().splitlines()[0]
    assert head.startswith("Held-out prediction: 16 trained members, 4 settings of "
                           "hp:weight_decay, hp:model.n_layers;")
    assert head.endswith("null: the shuffled copies (the untrained ones are in "
                         "prediction_members.csv only)")
    _, null, _ = prediction.population(frame, pc, ("shuffled", "untrained"))
    assert set(null["hp:null"]) == {train.NULL_KINDS.index("shuffled")}
    assert (null["same_pred:svd:blocks.0.attn.q:2"] < -90).all()
    _, null, _ = prediction.population(frame, pc, ("untrained", "shuffled"))
    assert set(null["hp:null"]) == {train.NULL_KINDS.index("untrained")}


@pytest.mark.slow  # a whole sweep, then the relaunch
def test_other_prediction_settings_on_a_finished_sweep_redo_the_test(tmp_path, cache_dir,
                                                                      capsys):
    """A finished sweep relaunched with another prediction.* setting tests again: the earlier
    outputs moved to superseded/ with a note, config.json records the change, training and
    the proxies kept (was: "finished ...; nothing to do", the old files kept)."""
    config = _config(cache_dir)
    workdir = str(tmp_path / "run")
    sweep.run(validate.check(config)[0], workdir, verbose=False)
    before = pd.read_csv(os.path.join(workdir, "prediction.csv"))
    config.prediction.n_repeats = 3
    sweep.run(validate.check(config)[0], workdir)
    out = capsys.readouterr().out
    assert "analysis settings changed since the sweep finished" in out
    kept = glob.glob(os.path.join(workdir, "superseded", "*", "prediction.csv"))
    assert len(kept) == 1 and pd.read_csv(kept[0]).equals(before)
    after = pd.read_csv(os.path.join(workdir, "prediction.csv"))
    random = after["scheme"] == "random"
    assert set(after.loc[random, "n_folds"] + after.loc[random, "n_skipped"]) == {2 * 3}
    assert json.load(open(os.path.join(workdir, "config.json")))["prediction"]["n_repeats"] == 3
    # The relaunch with the same settings is finished, and says which settings redo it.
    sweep.run(validate.check(config)[0], workdir)
    assert "prediction.*" in capsys.readouterr().out


def test_the_analysis_settings_hold_the_prediction_keys_while_the_test_runs(cache_dir):
    """A run records prediction.* among its analysis settings while the test is enabled (a
    change redoes it); a grid point only those its members frame depends on (the grid redoes
    the test alone); a run without the test none of them."""
    from jaxillusions.pipeline import job

    config = validate.check(_config(cache_dir))[0]
    run, point = sweep._analysis_settings(config), sweep._analysis_settings(  # noqa: SLF001
        config, job.POINT_PIPELINE)
    assert {"prediction.n_repeats", "prediction.threshold", "prediction.gaps"} <= set(run)
    assert "prediction.gaps" in point and "prediction.n_repeats" not in point
    off = _config(cache_dir)
    off.prediction.enabled = False
    assert not any(k.startswith("prediction.") for k in sweep._analysis_settings(  # noqa: SLF001
        validate.check(off)[0]))
