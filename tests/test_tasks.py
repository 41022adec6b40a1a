"""The task interface (jaxillusions/tasks): Dyck results unchanged by it, and its contract."""

import csv
import dataclasses
import math
import os

import numpy as np
import pytest
import tolerance as tol
from conftest import checked

from jaxillusions import tasks
from jaxillusions.faithfulness import dictionary_metrics
from jaxillusions.pipeline import sweep

FIXTURE = os.path.join(os.path.dirname(__file__), "data", "dyck_regression_results.csv")


def regression_config(cache_dir: str):
    """The tiny Dyck sweep whose results.csv the code of commit dfaa7c8 (before the task
    interface) wrote to tests/data/dyck_regression_results.csv."""
    from conftest import tiny_config

    config = tiny_config(cache_dir)
    config.proxies.methods = ("svd", "kmeans", "uniform_attention")
    config.proxies.targets = ("blocks.-1.attn.k",)
    config.proxies.svd_ranks = (2, 16)
    config.proxies.kmeans_sizes = (4,)
    config.proxies.eval_splits = ("iid", "unseen_depth", "longer")
    return config


def _read(path: str) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_dyck_results_unchanged_by_the_task_interface_and_by_adding_dictionaries(tmp_path):
    """Same rows (keys and position counts exactly) and metrics as before the refactor, with
    an SAE and a transcoder added to the run (they change no number of the other proxies);
    the dictionary metrics are new columns after the fixture's.

    On the machine that wrote the fixture, at XLA's default optimization level, the file is
    byte-identical. Elsewhere, or under the suite's flags (conftest.TEST_XLA_FLAGS), XLA:CPU
    vectorises differently (AVX2 vs AVX-512 reductions round differently), and 20 training
    steps carry that rounding into the parameters, so floats are compared to 1e-6.
    """
    config = regression_config(str(tmp_path / "cache"))
    config.proxies.methods = (*config.proxies.methods, "sae", "transcoder")
    config.proxies.sae_targets = ("blocks.-1.attn.k", "blocks.0.resid_mid")
    config.proxies.transcoder_targets = ("blocks.-1.mlp.out",)
    config.proxies.sae_sizes = (8, 32)
    config.proxies.transcoder_sizes = (16,)
    config.proxies.sae_k = (2, 4)
    config.proxies.sae_steps = 50
    sums, columns = {}, dictionary_metrics.columns

    def keep(spec, params, seed, size):  # the sums each family's ratios are formed from
        sums[(spec.method, spec.target)] = {k: np.asarray(v, np.float64)
                                            for k, v in (*seed.items(), *size.items())}
        return columns(spec, params, seed, size)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(dictionary_metrics, "columns", keep)
        sweep.run(checked(config), str(tmp_path / "run"), verbose=False)
    want, got = _read(FIXTURE), _read(str(tmp_path / "run" / "results.csv"))
    new = [r for r in got if r["method"] in ("sae", "transcoder")]
    got = [r for r in got if r["method"] not in ("sae", "transcoder")]
    keys = ("seed", "site", "method", "size", "split", "breakdown", "bin", "n")
    assert [tuple(r[k] for k in keys) for r in got] == [tuple(r[k] for k in keys) for r in want]
    # The same columns, in the same order, then the dictionary metrics.
    assert list(got[0]) == [*want[0], "fvu", "l0", "dead", "ce_score", "kl_score"]
    # Every (seed, target, size, split) of both dictionaries, each metric filled in, but for
    # a score whose denominator is within 1000x of its float32 rounding (dictionary_metrics.py),
    # which tolerance.mean_error estimates at least as generously as the engine does.
    alls = [r for r in new if r["breakdown"] == "all"]
    assert len(alls) == 2 * (2 * 4 + 1 * 2) * 3
    assert all(r[c] != "" for r in alls for c in ("fvu", "l0", "dead", "kl_score"))
    splits = list(config.proxies.eval_splits)
    for r in alls:
        f = sums[(r["method"], r["site"])]
        s, k = int(r["seed"]), splits.index(r["split"])
        n = f["evaluated"][s, k]
        ce_o, ce_z = f["ce_original"][s, k] / n, f["ce_zero"][s, k] / n
        rounding = tol.mean_error(n, ce_o, max(ce_o, ce_z)) + tol.mean_error(
            n, ce_z, max(ce_o, ce_z))
        assert r["ce_score"] != "" or ce_z - ce_o <= 1e3 * rounding, (r, ce_z - ce_o)
    assert sum(r["ce_score"] != "" for r in alls) >= len(alls) // 2, "most scores defined"
    gaps = _read(str(tmp_path / "run" / "gaps.csv"))
    assert {(g["method"], g["metric"]) for g in gaps if g["metric"] in ("fvu", "kl_score")} \
        == {(m, c) for m in ("svd", "kmeans", "sae", "transcoder") for c in ("fvu", "kl_score")}
    for g, w in zip(got, want, strict=True):
        for column in w:
            if column in keys:
                continue
            a = float(g[column]) if g[column] else math.nan
            b = float(w[column]) if w[column] else math.nan
            assert (math.isnan(a) and math.isnan(b)) or abs(a - b) <= 1e-6, (column, g, w)


@pytest.mark.parametrize("name", tasks.TASKS)
def test_every_task_provides_the_interface(name):
    """What the shared code calls (the members of tasks.Task), with consistent values; its
    optional hooks (tasks.Hooks) are resolved by tasks.hook."""
    task = tasks.get(name)
    methods = [n for n in vars(tasks.Task) if not n.startswith("_")]
    assert {"check_config", "load", "view", "train_num_bins"} <= set(methods)
    for attr in methods:
        assert callable(getattr(task, attr)), attr
    for attr in tasks.Task.__annotations__:
        assert getattr(task, attr, None) is not None, attr
    for hook in tasks.DEFAULTS:
        found = tasks.hook(task, hook)
        assert found is None or callable(found), hook
    assert task.CONCEPTS and len(set(task.CONCEPTS)) == len(task.CONCEPTS)
    assert task.NAME == name and task.SPLITS[0] == "train"
    assert set(task.DEFAULT_EVAL_SPLITS) <= set(task.SPLITS) and "iid" in task.DEFAULT_EVAL_SPLITS
    assert task.TRAIN_BREAKDOWN in task.BREAKDOWNS and "all" not in task.BREAKDOWNS
    assert dataclasses.is_dataclass(task.Data) and dataclasses.fields(task.Data)


def test_unknown_task_is_a_one_line_error():
    with pytest.raises(ValueError, match="task='nope': unknown task; available: dyck, code"):
        tasks.get("nope")


def test_optional_hooks_are_the_protocols_and_a_missing_one_is_named():
    """tasks.Hooks lists the optional hooks, DEFAULTS their defaults; a task without one that a
    setting needs gets a one-line error naming the hook."""
    import types

    assert set(tasks.DEFAULTS) == {n for n in vars(tasks.Hooks) if not n.startswith("_")}
    bare = types.ModuleType("bare")
    bare.NAME = "bare"
    assert tasks.hook(bare, "bracket_ids")(None) == ((), ())
    assert tasks.hook(bare, "copying_analyses") is None
    with pytest.raises(ValueError, match=r"^induction.enabled=True: the bare task does not "
                                         r"define the hook special_tokens \(tasks.Hooks\)$"):
        tasks.require(bare, "special_tokens", "induction.enabled=True")
    with pytest.raises(KeyError, match="not an optional task hook"):
        tasks.hook(bare, "speical_tokens")


def test_dyck_view_is_the_closing_bracket_positions(config):
    splits = tasks.get(config).load(checked(config).data, verbose=False)
    view = tasks.get("dyck").view(splits["iid"])
    np.testing.assert_array_equal(view.evaluated, splits["iid"].is_close)
    np.testing.assert_array_equal(view.bins["depth"], splits["iid"].depth)
    assert view.num_bins["position"] == splits["iid"].tokens.shape[1]
    assert tasks.get(config) is tasks.get("dyck")  # no config.task: Dyck
