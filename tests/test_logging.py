import os
import subprocess
import sys

import ml_collections
import numpy as np
import pytest
from tensorboard.backend.event_processing import event_accumulator as ea

from jaxillusions.logging import SweepWriter, flatten_config, read_scalars

NAN = float("nan")


def _accumulator(path) -> ea.EventAccumulator:
    acc = ea.EventAccumulator(str(path), size_guidance={ea.IMAGES: 0})
    acc.Reload()
    return acc


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
    from tensorboard import context
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
    from tensorboard.plugins import base_plugin
    from tensorboard.plugins.hparams import api_pb2, backend_context, list_session_groups

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

    # What the HPARAMS tab asks the backend for: session groups with their hparams and metrics.
    mux = plugin_event_multiplexer.EventMultiplexer()
    mux.AddRunsFromDirectory(str(tmp_path))
    mux.Reload()
    provider = data_provider.MultiplexerDataProvider(mux, str(tmp_path))
    ctx = backend_context.Context(base_plugin.TBContext(data_provider=provider))
    request = api_pb2.ListSessionGroupsRequest(
        allowed_statuses=[api_pb2.STATUS_SUCCESS], slice_size=10
    )
    response = list_session_groups.Handler(context.RequestContext(), ctx, "", request).run()
    (group,) = response.session_groups
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
import jaxillusions.logging as L
assert not any(m.startswith(("tensorboard", "matplotlib", "PIL")) for m in sys.modules)
with L.SweepWriter({str(tmp_path)!r}, [0, 1]) as w:
    w.scalars(0, {{"x": [1.0, 2.0]}})
    w.image("im", [[0.0, 1.0]])
    w.hparams({{"a": 1}}, {{"m": 1.0}})
assert L.read_scalars({str(tmp_path)!r})["mean"] == {{"x": [(0, 1.5)]}}
assert "tensorflow" not in sys.modules
"""
    subprocess.run([sys.executable, "-c", code], check=True)
