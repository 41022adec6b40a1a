import os
import re
import subprocess
import sys

import ml_collections
import numpy as np
import pytest
from tensorboard.backend.event_processing import event_accumulator as ea

from jaxillusions.pipeline import validate
from jaxillusions.runtime import tensorboard as log_lib
from jaxillusions.runtime.tensorboard import SweepWriter, flatten_config, read_scalars

NAN = float("nan")


def _accumulator(path) -> ea.EventAccumulator:
    acc = ea.EventAccumulator(str(path), size_guidance={ea.IMAGES: 0})
    acc.Reload()
    return acc


def _hparams_backend(logdir):
    """What the HPARAMS tab asks TensorBoard's backend for: (multiplexer, data provider, session
    groups with their hparams and metrics)."""
    from tensorboard import context
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
    from tensorboard.plugins import base_plugin
    from tensorboard.plugins.hparams import api_pb2, backend_context, list_session_groups

    mux = plugin_event_multiplexer.EventMultiplexer()
    mux.AddRunsFromDirectory(str(logdir))
    mux.Reload()
    provider = data_provider.MultiplexerDataProvider(mux, str(logdir))
    ctx = backend_context.Context(base_plugin.TBContext(data_provider=provider))
    request = api_pb2.ListSessionGroupsRequest(
        allowed_statuses=[api_pb2.STATUS_SUCCESS], slice_size=100)
    response = list_session_groups.Handler(context.RequestContext(), ctx, "", request).run()
    return mux, provider, list(response.session_groups)


def test_scalars_per_seed_and_aggregates(tmp_path):
    # Non-contiguous seed ids: run names follow `seeds`, values follow its order.
    with SweepWriter(str(tmp_path), seeds=[0, 5, 7]) as w:
        w.scalars(
            10,
            {"train/loss": np.array([1.0, 100.0, 3.0]), "eval/iid/acc": [0.5, 0.25, NAN]},
            healthy=np.array([True, False, True]),
        )
        w.scalars(20, {"train/loss": [0.5, 2.5, 3.0], "sweep/lr": 0.125})
        w.scalars(30, {"train/loss": [1.0, 2.0, 3.0]}, healthy=[False, False, False])

    runs = read_scalars(str(tmp_path))
    assert set(runs) == {"seed_0", "seed_5", "seed_7", "mean", "min", "max", "all"}
    assert runs["seed_0"] == {
        "train/loss": [(10, 1.0), (20, 0.5), (30, 1.0)],
        "eval/iid/acc": [(10, 0.5)],
    }
    assert runs["seed_5"]["train/loss"] == [(10, 100.0), (20, 2.5), (30, 2.0)]
    assert runs["seed_7"]["train/loss"] == [(10, 3.0), (20, 3.0), (30, 3.0)]
    assert np.isnan(runs["seed_7"]["eval/iid/acc"][0][1])  # per-seed runs keep NaN
    # Step 10: seed 5 unhealthy; eval/iid/acc of seed 7 is NaN. Step 30: nobody usable.
    # (Values are float32-exact: TensorBoard stores scalars as float32.)
    assert runs["mean"] == {"train/loss": [(10, 2.0), (20, 2.0)], "eval/iid/acc": [(10, 0.5)]}
    assert runs["min"] == {"train/loss": [(10, 1.0), (20, 0.5)], "eval/iid/acc": [(10, 0.5)]}
    assert runs["max"] == {"train/loss": [(10, 3.0), (20, 3.0)], "eval/iid/acc": [(10, 0.5)]}
    assert runs["all"] == {"sweep/lr": [(20, 0.125)]}


def test_scalars_rejects_wrong_length(tmp_path):
    with SweepWriter(str(tmp_path), seeds=[0, 1]) as w, pytest.raises(ValueError):
        w.scalars(0, {"x": [1.0, 2.0, 3.0]})


def test_curve(tmp_path):
    with SweepWriter(str(tmp_path), seeds=[0]) as w:
        w.curve(
            "faithfulness/iid", "svd/blocks.1.attn.k/same_pred", [1, 2, 4, 8], [0.5, NAN, 0.75, 1.0]
        )
        w.curve("faithfulness/ood", "svd/blocks.1.attn.k/same_pred", [1, 2], [0.25, 0.5])
    runs = read_scalars(str(tmp_path))
    tag = "svd/blocks.1.attn.k/same_pred"
    assert runs == {
        "faithfulness/iid": {tag: [(1, 0.5), (4, 0.75), (8, 1.0)]},
        "faithfulness/ood": {tag: [(1, 0.25), (2, 0.5)]},
    }


def test_images(tmp_path):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(2, 1.5), dpi=50)
    fig.add_subplot().plot([0, 1], [1, 0])
    with SweepWriter(str(tmp_path), seeds=[0]) as w:
        w.image("fig", fig)
        w.image("rgb", np.full((6, 8, 3), 200, np.uint8), step=3)
        w.image("gray", np.linspace(-1, 2, 20).reshape(4, 5))  # float, clipped to [0, 1]
        w.image("other", np.zeros((2, 2, 3), np.uint8), run="attn")
    acc = _accumulator(tmp_path / "images")
    assert set(acc.Tags()["images"]) == {"fig", "rgb", "gray"}
    (fig_ev,) = acc.Images("fig")
    assert (fig_ev.width, fig_ev.height) == (100, 75)
    (rgb_ev,) = acc.Images("rgb")
    assert (rgb_ev.step, rgb_ev.width, rgb_ev.height) == (3, 8, 6)
    assert _accumulator(tmp_path / "attn").Tags()["images"] == ["other"]


def test_hparams_plugin(tmp_path):
    config = ml_collections.ConfigDict({"model": {"d_model": 64, "dims": (1, 2)}, "tag": None})
    with SweepWriter(str(tmp_path), seeds=[0, 1]) as w:
        w.scalars(0, {"train/loss": [1.0, 2.0]})
        w.hparams(flatten_config(config), {"final/eval/iid/acc": 0.75})

    acc = ea.EventAccumulator(str(tmp_path / "hparams"))
    acc.Reload()
    assert set(acc.PluginTagToContent("hparams")) == {
        "_hparams_/experiment",
        "_hparams_/session_start_info",
        "_hparams_/session_end_info",
    }

    _, _, groups = _hparams_backend(tmp_path)
    (group,) = groups
    assert group.name == "hparams"
    assert group.hparams["model.d_model"].number_value == 64
    assert group.hparams["model.dims"].string_value == "(1, 2)"
    assert group.hparams["tag"].string_value == "None"
    ((metric),) = group.metric_values
    assert metric.name.tag == "final/eval/iid/acc" and metric.value == 0.75


def test_flatten_config():
    config = ml_collections.ConfigDict(
        {
            "model": {"d_model": 64, "dims": (1, 2), "act": None, "bias": True},
            "optim": {"lr": 1e-3, "schedule": {"kind": "cosine", "warmup": np.int64(10)}},
            "seeds": [0, 1],
            "name": "run",
            "scale": np.float32(0.5),
        }
    )
    assert flatten_config(config) == {
        "model.d_model": 64,
        "model.dims": "(1, 2)",
        "model.act": "None",
        "model.bias": True,
        "optim.lr": 1e-3,
        "optim.schedule.kind": "cosine",
        "optim.schedule.warmup": 10,
        "seeds": "[0, 1]",
        "name": "run",
        "scale": 0.5,
    }
    flat = flatten_config({"a": {"b": False, "c": 2.5}})
    assert flat == {"a.b": False, "a.c": 2.5} and type(flat["a.b"]) is bool


def test_many_seeds_few_open_files(tmp_path):
    seeds = list(range(200))
    fd_dir = "/proc/self/fd"
    n_fds = (lambda: len(os.listdir(fd_dir))) if os.path.isdir(fd_dir) else None
    before = n_fds() if n_fds else 0
    w = SweepWriter(str(tmp_path), seeds)
    for step in range(3):
        w.scalars(step, {"train/loss": np.arange(200.0) + step, "eval/acc": np.ones(200)})
    if n_fds:
        assert n_fds() - before <= 210  # one file per run: 200 seeds + mean/min/max
    w.close()
    if n_fds:
        assert n_fds() - before <= 2
    runs = read_scalars(str(tmp_path))
    assert len(runs) == 203
    assert runs["seed_199"]["train/loss"] == [(0, 199.0), (1, 200.0), (2, 201.0)]
    assert runs["max"]["train/loss"][-1] == (2, 201.0)


def test_import_is_light_and_tensorflow_free(tmp_path):
    code = f"""
import sys
import jaxillusions.runtime.tensorboard as L
assert not any(m.startswith(("tensorboard", "matplotlib", "PIL")) for m in sys.modules)
with L.SweepWriter({str(tmp_path)!r}, [0, 1]) as w:
    w.scalars(0, {{"x": [1.0, 2.0]}})
    w.image("im", [[0.0, 1.0]])
    w.hparams({{"a": 1}}, {{"m": 1.0}})
assert L.read_scalars({str(tmp_path)!r})["mean"] == {{"x": [(0, 1.5)]}}
assert "tensorflow" not in sys.modules
"""
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------------------------------------
# The main job's TensorBoard reports (report/board.py), on synthetic result rows.


def _rows(seeds=(0, 1, 2), splits=("iid", "unseen_depth", "longer")):
    """Rows shaped like faithfulness.evaluate's: svd ranks 1..16, kmeans k 2..8, one-hot
    attention (size 0); values that differ per seed, size and split."""
    rows = []
    sized = [("svd", "blocks.1.attn.k", (1, 2, 4, 8, 16)), ("kmeans", "blocks.1.attn.k", (2, 4, 8)),
             ("onehot_attention", "blocks.1.attn.pattern", (0,))]
    for seed in seeds:
        for method, site, sizes in sized:
            for size in sizes:
                for j, split in enumerate(splits):
                    same = 1.0 - 0.1 / (size + 1) - 0.02 * j - 0.001 * seed
                    for breakdown, bin_ in (("all", ""), ("depth", 1), ("depth", 2)):
                        rows.append({"seed": seed, "site": site, "method": method, "size": size,
                                     "split": split, "breakdown": breakdown, "bin": bin_,
                                     "n": 50 + j, "jsd": 1.0 - same, "same_pred": same,
                                     "acc_original": 0.9 - 0.05 * j + 0.01 * seed,
                                     "acc_proxy": same - 0.1})
    return rows


def _gaps(rows):
    """Gap rows with the columns of report/stats.py (values: per-seed mean differences)."""
    out = []
    keys = {(r["site"], r["method"], r["size"], r["split"]) for r in rows if r["split"] != "iid"}
    for site, method, size, split in sorted(keys):
        def mean(s, site=site, method=method, size=size):
            return np.mean([r["same_pred"] for r in rows if r["breakdown"] == "all" and
                            (r["site"], r["method"], r["size"], r["split"]) ==
                            (site, method, size, s)])
        gap = mean("iid") - mean(split)
        out.append({"site": site, "method": method, "size": size, "split": split,
                    "metric": "same_pred", "gap": gap, "baseline_mean": mean("iid"),
                    "ci_low": gap - 0.01,
                    "ci_high": gap + 0.01, "n_seeds": 3, "seeds_positive": 3,
                    "baseline": "iid", "boot_low": gap - 0.01, "boot_high": gap + 0.01})
    return out


def _board_config(splits=("iid", "seen_structure", "unseen_depth", "longer", "iid_with_train")):
    from jaxillusions.configs import dyck_small

    config = dyck_small.get_config()
    config.proxies.eval_splits = splits
    config.proxies.svd_ranks = ()  # the default, resolved to 1, 2, 4, ... d_head
    return validate.parse(config)


def test_board_headline_is_one_true_point_per_card_and_names_the_headline_proxies(tmp_path):
    """The Headline cards: per proxy of gap_table.txt's headline (same order, same sizes) and
    OOD split, one point (gaps.csv's mean) at the final training step, in run split/<split>,
    and no card has a second run: nothing for smoothing or outlier clipping to move."""
    from jaxillusions.report import board

    splits = ("iid", "seen_structure", "unseen_depth", "longer", "iid_with_train")
    rows, config = _rows(splits=splits), _board_config(splits)
    gaps = _gaps(rows)
    with SweepWriter(str(tmp_path), seeds=[0, 1, 2]) as w:
        tags = board.write_headline(w, gaps, rows, config, step=3000)
    runs = read_scalars(str(tmp_path))
    # OOD splits only (iid_with_train is in-distribution for Dyck), in their own runs.
    assert set(runs) == {"split/seen_structure", "split/unseen_depth", "split/longer"}
    where = {}
    for run, scalars in runs.items():
        for tag, points in scalars.items():
            assert tag not in where, f"{tag} in two runs"
            where[tag] = (run, points)
    assert sorted(where) == sorted(tags)
    by_key = {(g["method"], g["site"], g["size"], g["split"]): g["gap"] for g in gaps}
    # svd: ranks 1..16 reach 0.99 on iid from rank 16 (1 - 0.1/17 - 0.001*seed); kmeans
    # never does (its largest size, 8); one-hot attention has no size.
    proxies = board.headline_proxies(gaps, rows, "iid")
    assert [p[:3] for p in proxies] == [("svd", "blocks.1.attn.k", 16),
                                        ("kmeans", "blocks.1.attn.k", 8),
                                        ("onehot_attention", "blocks.1.attn.pattern", 0)]
    assert [p[3] for p in proxies] == [True, False, False]  # one-hot: 0.9 on iid
    for method, site, size, _ in proxies:
        name = {"svd": "1_svd_k_16", "kmeans": "2_kmeans_k_8",
                "onehot_attention": "3_onehot_attention_pattern"}[method]
        for split in ("seen_structure", "unseen_depth", "longer"):
            run, points = where[f"Headline/{name}/gap_{split}"]
            assert run == f"split/{split}"
            assert points == [(3000, pytest.approx(by_key[(method, site, size, split)],
                                                   abs=1e-7))]  # float32 storage
    # The same proxies as the headline of gap_table.txt, in its order.
    text, _ = tables_report(rows, splits)
    rows_named = [m.group(1) for m in map(re.compile(r"^(\S+ \S+(?: \d+)?) \(\d\.\d{3}").match,
                                          text.splitlines()[:15]) if m]
    assert rows_named == ["svd k 16", "kmeans k 8", "onehot_attention pattern"]
    # Every Headline tag sorts first in TensorBoard: it is the only tag group not starting
    # with a lowercase letter (the job's other tags all do; see test_faithfulness).
    assert all(t.startswith(log_lib.HEADLINE + "/") for t in tags)


def tables_report(rows, splits):
    from jaxillusions.report import tables

    return tables.statistics_report(rows, list(splits), in_distribution=("iid", "iid_with_train"))


def test_board_text_report_and_scalar_descriptions(tmp_path, caplog):
    from jaxillusions.report import board

    text = "SUMMARY, 3 seeds.\nproxy  a\n\n====\nall the tables"
    with SweepWriter(str(tmp_path), seeds=[0]) as w:
        board.write_report_text(w, text, step=7)
        w.curve("split/x", "Headline/y", [7], [0.5], "what y is")
    acc = ea.EventAccumulator(str(tmp_path / "report"), size_guidance={ea.TENSORS: 0})
    acc.Reload()
    shown = {t: acc.Tensors(t)[0] for t in acc.Tags()["tensors"]}
    assert set(shown) == {log_lib.SUMMARY_TAG, "gap_table"}
    assert shown[log_lib.SUMMARY_TAG].step == 7
    # Indented: markdown shows a fixed-width block, so the columns stay aligned.
    assert shown[log_lib.SUMMARY_TAG].tensor_proto.string_val[0].decode() == (
        "    SUMMARY, 3 seeds.\n    proxy  a")
    assert acc.SummaryMetadata(log_lib.SUMMARY_TAG).plugin_data.plugin_name == "text"
    # A scalar's description is kept, and names the scalars plugin (TensorBoard's readers
    # warn about metadata without a plugin).
    with caplog.at_level("WARNING"):
        acc = ea.EventAccumulator(str(tmp_path / "split" / "x"))
        acc.Reload()
    assert "oddly" not in caplog.text
    meta = acc.SummaryMetadata("Headline/y")
    assert (meta.summary_description, meta.plugin_data.plugin_name) == ("what y is", "scalars")


def test_board_hparams_one_session_per_seed_and_few_tags(tmp_path):
    from tensorboard import context
    from tensorboard.plugins import base_plugin

    from jaxillusions import model
    from jaxillusions.report import board

    splits = ("iid", "unseen_depth", "longer", "iid_with_train")
    config = _board_config(splits)
    model_cfg = model.ModelConfig.from_settings(config.model, vocab_size=19, max_len=26)
    rows, seeds = _rows(splits=splits), [0, 1, 2]
    with SweepWriter(str(tmp_path), seeds) as w:
        # What training logs (the final accuracy per split), then the reports.
        w.scalars(3000, {f"eval/{s}/acc": [0.9, 0.8, 0.7] for s in config.proxies.eval_splits})
        board.write_all(w, rows, config, model_cfg, board.Sessions(seeds, [True, True, False]),
                        "runs/demo", gaps=_gaps(rows), report="SUMMARY\n\nthe rest")

    mux, provider, groups = _hparams_backend(tmp_path)
    groups = {g.name: g for g in groups}
    assert set(groups) == {"seed_0", "seed_1", "seed_2"}
    g0, g2 = groups["seed_0"], groups["seed_2"]
    assert g0.hparams["model.d_head"].number_value == 32  # resolved from d_head = 0
    assert g0.hparams["proxies.svd_ranks"].string_value == "1,2,4,8,16,32"  # resolved from ()
    assert g0.hparams["workdir"].string_value == "demo"
    assert g0.hparams["healthy"].bool_value and not g2.hparams["healthy"].bool_value
    assert g2.hparams["seed"].number_value == 2
    assert len(g0.hparams) <= 25
    metrics = {m.name.tag: m.value for m in g0.metric_values}
    # seed 0, svd rank 16 (the headline's size): iid minus longer = 0.02 * 2
    assert metrics["hparams/gap_same_pred/svd_16/blocks.1.attn.k/longer"] == pytest.approx(
        0.04, abs=1e-6)
    assert metrics["eval/iid/acc"] == pytest.approx(0.9)

    # What HPARAMS shows by default: the first 5 hparams after TensorBoard's sort (differing
    # ones first: the seed, and `healthy` here since seed 2 diverged) and the first 5 metrics.
    from tensorboard.plugins.hparams import backend_context

    ctx = backend_context.Context(base_plugin.TBContext(data_provider=provider))
    request = context.RequestContext()
    experiment = ctx.experiment_from_metadata(request, "", True,
                                              ctx.hparams_metadata(request, ""),
                                              ctx.hparams_from_data_provider(request, "", 0))
    shown = [h.name for h in experiment.hparam_infos][:5]
    assert shown[:2] == ["healthy", "seed"]
    # Metrics: the headline proxies' gaps on the OOD splits (proxy by proxy, splits in the
    # configured order), then the in-distribution control, then the final accuracies.
    listed = [m.name.tag for m in experiment.metric_infos]
    proxies = ("svd_16/blocks.1.attn.k", "kmeans_8/blocks.1.attn.k", "onehot_attention")
    assert listed == [f"hparams/gap_same_pred/{p}/{s}" for p in proxies
                      for s in ("unseen_depth", "longer")] + [
        f"hparams/gap_same_pred/{p}/iid_with_train" for p in proxies] + [
        f"eval/{s}/acc" for s in splits]
    assert set(metrics) == set(listed)
    names = [m.display_name for m in experiment.metric_infos]
    assert names[:2] == ["gap iid-unseen_depth: svd 16 blocks.1.attn.k",
                         "gap iid-longer: svd 16 blocks.1.attn.k"]
    assert names[-1] == "accuracy on iid_with_train (end of training)"

    # A small number of scalar tags: nothing per size or per bin; every report tag is one
    # point.
    scalars = read_scalars(str(tmp_path))
    tags = {t for run in scalars.values() for t in run}
    report = {t for t in tags if not t.startswith("eval/")}
    # 3 headline proxies x 2 OOD splits, and the 9 HPARAMS gaps.
    assert len(report) == 3 * 2 + 3 * 3
    assert all(len(points) == 1 for run in scalars.values() for t, points in run.items()
               if t in report)
    assert not any(t.split("/")[-1].isdigit() for t in tags)
    assert os.path.isdir(tmp_path / "report")  # the TEXT tab


def test_board_hparams_gaps_use_the_configured_baseline(tmp_path):
    """With proxies.gap_baseline = "longer", HPARAMS gaps are same_pred on longer minus the
    split's, as in gaps.csv, and there is no gap of the baseline to itself."""
    from jaxillusions.configs import dyck_small
    from jaxillusions.report import board

    config = dyck_small.get_config()
    config.proxies.eval_splits = ("iid", "unseen_depth", "longer")
    config.proxies.gap_baseline = "longer"
    with SweepWriter(str(tmp_path), [0]) as w:
        board.write_hparams(w, config, None, board.Sessions([0], [True]), _rows(seeds=(0,)))
    _, _, groups = _hparams_backend(tmp_path)
    metrics = {m.name.tag: m.value for m in groups[0].metric_values}
    # seed 0, svd rank 4: same_pred on longer minus on iid = -0.02 * 2
    assert metrics["hparams/gap_same_pred/svd_4/blocks.1.attn.k/iid"] == pytest.approx(
        -0.04, abs=1e-6)
    assert not any(t.endswith("/longer") for t in metrics if t.startswith("hparams/"))


def test_board_hparams_sessions_for_sweep_members(tmp_path):
    """Members of a contrastive-weight sweep: one session each, told apart by the weight."""
    from jaxillusions.configs import dyck_small
    from jaxillusions.report import board

    config = dyck_small.get_config()
    config.proxies.eval_splits = ("iid",)
    labels = ["0_cw0", "1_cw0", "0_cw0.5", "1_cw0.5"]
    with SweepWriter(str(tmp_path), labels) as w:
        w.scalars(10, {"eval/iid/acc": [0.9, 0.8, 0.7, 0.6]})
        board.write_hparams(w, config, None, board.Sessions(labels, [True] * 4, {
            "contrastive_weight": np.array([0, 0, 0.5, 0.5], np.float32)}))
    _, _, groups = _hparams_backend(tmp_path)
    found = {g.name: (g.hparams["seed"].number_value,
                      g.hparams["contrastive_weight"].number_value,
                      g.metric_values[0].value) for g in groups}
    assert found == {"seed_0_cw0": (0, 0, pytest.approx(0.9)),
                     "seed_1_cw0": (1, 0, pytest.approx(0.8)),
                     "seed_0_cw0.5": (0, 0.5, pytest.approx(0.7)),
                     "seed_1_cw0.5": (1, 0.5, pytest.approx(0.6))}


def test_board_hparams_of_a_weight_group_show_its_own_weight_decay(tmp_path):
    """A group of a weight-decay sweep (its members share one decay): each session shows the
    member's weight_decay and null kind, not the config's single train.weight_decay (it showed
    0.01 for the groups of 0.0 and 1.0)."""
    from jaxillusions.configs import dyck_small
    from jaxillusions.report import board

    config = dyck_small.get_config()
    config.proxies.eval_splits = ("iid",)
    labels = ["0_wd1_untrained", "1_wd1_untrained"]
    with SweepWriter(str(tmp_path), labels) as w:
        board.write_hparams(w, config, None, board.Sessions(labels, [True] * 2, {
            "weight_decay": [1.0, 1.0], "null": ["untrained", "untrained"]}))
    _, _, groups = _hparams_backend(tmp_path)
    for g in groups:
        assert g.hparams["weight_decay"].number_value == 1.0
        assert g.hparams["null"].string_value == "untrained"
        assert "train.weight_decay" not in g.hparams


@pytest.mark.slow
def test_tensorboard_in_a_browser_shows_the_headline_first(tmp_path):
    """benchmarks/tensorboard_check on what the reports write: in TensorBoard at its defaults,
    in headless Chromium, the Headline group comes first on the landing page and in SCALARS,
    its cards show their logged value unsmoothed, HPARAMS' default metric columns are the
    headline gaps, and TEXT starts with the summary. Skips without Playwright or Chromium
    (CI has neither)."""
    pytest.importorskip("playwright")
    from benchmarks import tensorboard_check
    from jaxillusions import model
    from jaxillusions.report import board

    chromium = tensorboard_check.find_chromium()
    if chromium is None:
        pytest.skip("no Chromium on PATH")
    splits = ("iid", "unseen_depth", "longer", "iid_with_train")
    config = _board_config(splits)
    model_cfg = model.ModelConfig.from_settings(config.model, vocab_size=19, max_len=26)
    rows, seeds = _rows(splits=splits), [0, 1, 2]
    logdir = str(tmp_path / "tensorboard")
    with SweepWriter(logdir, seeds) as w:
        for step in (1000, 2000, 3000):  # training's curves, whose groups sort after Headline
            w.scalars(step, {"train/loss": [1.0 / step] * 3,
                             **{f"eval/{s}/acc": [0.9, 0.8, 0.7] for s in splits}})
        w.image("accuracy_by_depth/svd", np.zeros((8, 8, 3), np.uint8))
        board.write_all(w, rows, config, model_cfg, board.Sessions(seeds, [True] * 3),
                        "runs/demo", gaps=_gaps(rows), report="SUMMARY, 3 seeds.\n\nthe tables")
    seen = tensorboard_check.check(logdir, str(tmp_path / "shots"), chromium, timeout=120)
    assert seen["failures"] == []
    assert [g for g in seen["landing"]["groups"] if g != "Pinned"][:3] == [
        "Headline", "accuracy_by_depth", "eval"]
    assert seen["hparams"]["metric_columns"][0] == "gap iid-unseen_depth: svd 16 blocks.1.attn.k"
    assert os.path.getsize(tmp_path / "shots" / "landing.png") > 10_000
