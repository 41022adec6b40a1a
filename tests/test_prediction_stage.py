"""The prediction study as a stage of the main job (studies/prediction.py): a tiny Dyck run whose
members differ in one hyper-parameter (train.contrastive_weights) ends with prediction.csv,
prediction.txt and its figure, each member one row; bad settings are refused at the door."""

import os

import pandas as pd
import pytest
from conftest import tiny_sweep_config

from jaxillusions.pipeline import sweep, validate

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
])
def test_bad_prediction_settings_are_one_line_errors_at_the_door(cache_dir, change, message):
    config = _config(cache_dir)
    for key, value in change.items():
        section, name = key.split(".")
        config[section][name] = value
    with pytest.raises(ValueError) as err:
        validate.check(config)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)

