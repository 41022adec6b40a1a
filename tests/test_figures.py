import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest
from conftest import checked, tiny_sweep_config
from test_logging import _gaps, _rows

from jaxillusions import model
from jaxillusions.model import patching
from jaxillusions.pipeline import sweep, validate
from jaxillusions.proxies import circuit
from jaxillusions.report import drawing, figures

SPLITS = ("iid", "unseen_depth", "longer")


def _check_readable(fig, min_pt: float = 8.0):
    """Every visible text >= min_pt at the saved size; legends outside every data panel."""
    fig.canvas.draw()
    texts = [t for t in fig.findobj(lambda a: hasattr(a, "get_fontsize") and
                                    hasattr(a, "get_text"))
             if t.get_visible() and t.get_text().strip()]
    assert texts and min(t.get_fontsize() for t in texts) >= min_pt
    renderer = fig.canvas.get_renderer()
    panels = [ax for ax in fig.axes if ax.get_visible() and ax.axison and ax.has_data()]
    legends = fig.legends + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
    assert legends
    for legend in legends:
        box = legend.get_window_extent(renderer)
        for ax in panels:
            assert not box.overlaps(ax.get_window_extent(renderer)), ax.get_title()


def test_result_figures_are_readable():
    rows, gaps = _rows(), _gaps(_rows())
    figs = [figures.faithfulness_curves(rows, "svd", SPLITS),
            figures.accuracy_by_depth(rows, "blocks.1.attn.k", "svd", SPLITS, max_depth=1),
            figures.gap_vs_size(gaps, "kmeans", SPLITS),
            figures.gaps_by_split(gaps, ["onehot_attention"], SPLITS)]
    for fig in figs:
        _check_readable(fig)
        # At most 3 panels per row, with text inside the image.
        width, height = fig.get_size_inches()
        assert width <= 12 and height <= 9
    # Accuracy by depth: the 3 sizes (smallest, middle, largest of 5) and the original, each
    # with intervals; the training bound is drawn.
    acc = figs[1]
    labels = acc.axes[0].get_legend_handles_labels()[1]
    assert labels == ["original", "svd, rank 1", "svd, rank 4", "svd, rank 16"]  # was "svd 1"
    drawn = [c.lines[0] for c in acc.axes[0].containers if c.get_label() in labels]
    assert len(drawn) == 4 and all(np.isfinite(line.get_ydata()).all() for line in drawn)
    assert any(line.get_linestyle() == ":" for line in acc.axes[0].lines)
    assert "3 seeds" in acc._suptitle.get_text()


def test_activation_figures_have_colour_bars_and_keys():
    rng = np.random.default_rng(0)
    pattern = np.tril(rng.random((2, 12, 12)))
    fig = figures.attention_patterns(pattern / pattern.sum(-1, keepdims=True),
                                     [f"t{i}" for i in range(12)], [0, 3], "blocks.1.attn.pattern")
    assert any(ax.get_ylabel() == "attention weight" for ax in fig.axes)  # the colour bar
    _check_readable_text_only(fig)
    tokens = rng.integers(1, 3 + 2 * 4, 300)
    fig = figures.key_projection(rng.normal(size=(300, 8)), rng.integers(0, 5, 300), tokens, 4,
                                 "blocks.1.attn.k")
    assert any(ax.get_ylabel().startswith("depth") for ax in fig.axes)  # the colour bar
    _, labels = fig.axes[2].get_legend_handles_labels()
    assert "( type 0" in labels and ") type 0" in labels
    colours = {lab: coll.get_facecolor()[0][:3].tolist()
               for coll, lab in zip(fig.axes[2].collections, ["other"] + labels[1:], strict=True)}
    assert colours["( type 0"] != colours[") type 0"]  # open and close: distinct colours
    _check_readable_text_only(fig)


def _check_readable_text_only(fig):
    fig.canvas.draw()
    sizes = [t.get_fontsize() for t in fig.findobj(lambda a: hasattr(a, "get_fontsize"))
             if t.get_visible() and getattr(t, "get_text", lambda: "")().strip()]
    assert sizes and min(sizes) >= 8


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    figures._pyplot().close("all")


def test_a_figure_is_measured_once_and_drawn_once(tmp_path, monkeypatch):
    # Was: given a rect, tight_layout measured every axes twice, and savefig drew the whole
    # figure twice (once more for the placeholder layout engine tight_layout leaves). The PNG
    # is the same byte for byte, and save returns its pixels (TensorBoard's image).
    import matplotlib.axes
    import matplotlib.figure
    from PIL import Image

    calls = {"measure": 0, "draw": 0}
    measure, draw = matplotlib.axes.Axes.get_tightbbox, matplotlib.figure.Figure.draw

    def counted(name, method):
        def wrapper(self, *args, **kwargs):
            calls[name] += 1
            return method(self, *args, **kwargs)
        return wrapper

    monkeypatch.setattr(matplotlib.axes.Axes, "get_tightbbox", counted("measure", measure))
    monkeypatch.setattr(matplotlib.figure.Figure, "draw", counted("draw", draw))
    once = figures.tight_layout
    measured, png = {}, {}
    for name, layout in (("plain", lambda fig, rect: fig.tight_layout(rect=rect)),
                         ("once", once)):
        monkeypatch.setattr(figures, "tight_layout", layout)
        calls.update(measure=0, draw=0)
        fig = figures.accuracy_by_depth(_rows(), "blocks.1.attn.k", "svd", SPLITS, max_depth=1)
        measured[name] = calls["measure"]
        path = str(tmp_path / f"{name}.png")
        pixels = figures.save(fig, path)
        assert calls["draw"] == 1
        with Image.open(path) as image:
            assert np.array_equal(pixels, np.asarray(image.convert("RGBA")))
        with open(path, "rb") as f:
            png[name] = f.read()
    assert measured["plain"] == 2 * measured["once"] > 0
    assert png["plain"] == png["once"]


def test_a_helper_process_shares_the_figures_and_draws_the_same_files(tmp_path, monkeypatch):
    # With two cores a helper process draws from the last figure while this process draws from
    # the first, each taking the figures the other has not (drawing is single-threaded); the
    # files and TensorBoard's images (in order) are those of one process drawing them all; a
    # helper that fails leaves its figures to this process, and one that took none, or took one
    # but has not drawn it, by the time this process reaches it is not waited for: this process
    # draws that figure too, and the helper is ended (a slow start delays nothing). Nothing of
    # theirs is left behind.
    rows, gaps = _rows(), _gaps(_rows())
    jobs = [("a", "curves", figures.faithfulness_curves, (rows, "svd", SPLITS)),
            ("b", "gaps", figures.gap_vs_size, (gaps, "kmeans", SPLITS)),
            ("c", "attention", figures.gaps_by_split, (gaps, ["onehot_attention"], SPLITS))]

    class Writer:
        def image(self, tag, pixels):
            self.images.append((tag, pixels))

    helpers, start = [], drawing._start_helper
    monkeypatch.setattr(drawing, "_start_helper", lambda jobs, claims: helpers.append(
        start(jobs, claims)) or helpers[-1])
    drawn_here, render = [], figures.render
    monkeypatch.setattr(figures, "render", lambda f, args, path: drawn_here.append(
        os.path.basename(path)) or render(f, args, path))
    claim = figures.claim

    def waiting_claim(claims, index):  # the first figure waits for the helper to draw the last
        deadline = time.monotonic() + 120
        while index == 0 and not figures.drawn(claims, len(jobs) - 1):
            assert time.monotonic() < deadline, "the helper drew no figure in 2 min"
            time.sleep(0.05)
        return claim(claims, index)

    def taken_claim(claims, index):  # as if the (slow) helper had taken the last figure
        if index == 0:
            assert claim(claims, len(jobs) - 1)
        return claim(claims, index)

    slow = tmp_path / "slow_python"  # a helper that would start after 10 min
    slow.write_text("#!/bin/sh\nsleep 600\n")
    slow.chmod(0o755)
    temp = tmp_path / "temp"  # the helper's job file and the claims
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    images, here = {}, {}
    for name, cores, executable, claiming in (("alone", {0}, sys.executable, claim),
                                              ("helped", {0, 1}, sys.executable, waiting_claim),
                                              ("failed", {0, 1}, "false", claim),
                                              ("slow", {0, 1}, str(slow), claim),
                                              ("taken", {0, 1}, str(slow), taken_claim)):
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid, cores=cores: cores)
        monkeypatch.setattr(sys, "executable", executable)
        monkeypatch.setattr(figures, "claim", claiming)
        writer, drawn_here[:] = Writer(), []
        writer.images = []
        began = time.monotonic()
        drawing.draw(jobs, writer, str(tmp_path / name))
        images[name], here[name] = writer.images, list(drawn_here)
        assert list(temp.iterdir()) == []
        assert sorted(os.listdir(tmp_path / name / "figures")) == [
            "attention.png", "curves.png", "gaps.png"]  # no helper's temporary file
        assert all(h.poll() is not None for h in helpers)  # none is left running
    assert time.monotonic() - began < 300  # the slow helper did not delay the drawing
    assert len(helpers) == 4
    everything = ["curves.png", "gaps.png", "attention.png"]
    assert here["alone"] == here["failed"] == here["slow"] == here["taken"] == everything
    assert here["helped"][0] == "curves.png" and "attention.png" not in here["helped"]
    for name in ("helped", "failed", "slow", "taken"):
        assert [tag for tag, _ in images[name]] == ["a", "b", "c"]
        for (_, x), (_, y) in zip(images["alone"], images[name], strict=True):
            assert np.array_equal(x, y)
        for file in ("curves", "gaps", "attention"):
            with open(tmp_path / "alone" / "figures" / f"{file}.png", "rb") as a, \
                    open(tmp_path / name / "figures" / f"{file}.png", "rb") as b:
                assert a.read() == b.read()


# ---------------------------------------------------------------------------------------------
# Which figures the main job draws (the setting `figures`), and `jaxillusions figures` for the rest.

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# conftest.tiny_sweep_config: svd (sized) and onehot_attention (not) on blocks.1.attn.k, seeds
# 0 and 1; Dyck's training bounds are depth and position.
SUMMARY = {"gap_vs_size_svd", "faithfulness_svd", "gaps_attention_proxies", "attention_patterns",
           "key_projection_seed0"}
REST = {f"accuracy_by_{b}_{family}" for b in ("depth", "position")
        for family in ("svd_blocks.1.attn.k", "onehot_attention_blocks.1.attn.pattern")
        } | {"key_projection_seed1"}


def _figures(workdir) -> dict[str, bytes]:
    """figures/: {name without .png: its bytes}."""
    directory = os.path.join(workdir, "figures")
    out = {}
    for name in os.listdir(directory):
        with open(os.path.join(directory, name), "rb") as f:
            out[name.removesuffix(".png")] = f.read()
    return out


def _images(workdir) -> dict[str, int]:
    """TensorBoard IMAGES: how many images each tag has."""
    from tensorboard.backend.event_processing import event_accumulator as ea

    acc = ea.EventAccumulator(os.path.join(workdir, "tensorboard", "images"),
                              size_guidance={ea.IMAGES: 0})
    acc.Reload()
    return {tag: len(acc.Images(tag)) for tag in acc.Tags()["images"]}


def test_the_main_job_draws_the_summary_and_launch_figures_the_rest(tiny_sweep, tmp_path,
                                                                    cache_dir, capsys):

    # The default (figures="summary"): the summary set, each figure once in TensorBoard.
    summary = _figures(tiny_sweep)
    assert set(summary) == SUMMARY
    tags = _images(tiny_sweep)
    assert len(tags) == len(SUMMARY) and set(tags.values()) == {1}
    workdir = tmp_path / "run"
    shutil.copytree(tiny_sweep, workdir)
    done = json.loads((workdir / sweep.DONE_FILE).read_text())
    assert done["figures"] == "summary"

    proc = subprocess.run([sys.executable, "-m", "jaxillusions", "figures", str(workdir)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (f"{workdir}: drawing {len(REST)} figures ({len(SUMMARY)} of "
            f"{len(SUMMARY) + len(REST)} are there and kept)") in proc.stdout
    figs = _figures(workdir)
    assert set(figs) == SUMMARY | REST
    assert {name: figs[name] for name in SUMMARY} == summary  # byte for byte
    images = _images(workdir)  # the new figures added, none twice
    assert len(images) == len(SUMMARY | REST) and set(images.values()) == {1}
    # The finished marker still verifies, and vouches for the new figures too.
    done = json.loads((workdir / sweep.DONE_FILE).read_text())
    assert sweep._unverified(done, str(workdir)) is None and done["figures"] == "all"
    assert {f"figures/{name}.png" for name in REST} <= set(done["reports"])
    # A relaunch of the sweep finds it finished (with either setting), and changes nothing but
    # the record of its config: figures="all" is a change from the launch's "summary".
    records = {workdir / "config.json", workdir / "config_history.jsonl"}
    before = {p: p.stat().st_mtime_ns for p in workdir.rglob("*") if p.is_file()}
    config = tiny_sweep_config(cache_dir)
    for which in ("summary", "all"):
        config.figures = which
        sweep.run(checked(config), str(workdir))
        out = capsys.readouterr().out
        assert "is finished (finished " in out
        assert ("note: figures changed from 'summary' to 'all'" in out) == (which == "all")
    after = {p: p.stat().st_mtime_ns for p in workdir.rglob("*") if p.is_file()}
    assert {p: t for p, t in after.items() if p not in records} == {
        p: t for p, t in before.items() if p not in records}
    assert json.loads((workdir / "config.json").read_text())["figures"] == "all"


@pytest.mark.slow  # a launcher subprocess
def test_a_signal_stops_launch_figures_with_a_line_that_names_it(tiny_sweep, tmp_path):
    """Was: "stopped by SIGTERM while writing the reports; results.csv and the proxy stages are
    saved ...; relaunch the same command to write the reports": the sweep's words, whose
    relaunch then found the sweep finished and drew nothing."""
    workdir = tmp_path / "run"
    shutil.copytree(tiny_sweep, workdir)
    proc = subprocess.Popen([sys.executable, "-m", "jaxillusions", "figures", str(workdir)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in proc.stdout:
        if ": drawing " in line:
            proc.send_signal(signal.SIGTERM)
            break
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 143, err[-2000:]
    assert err.strip().splitlines() == [
        f"stopped by SIGTERM while drawing the figures of {workdir}; those drawn are kept: run "
        f"`jaxillusions figures {workdir}` again to draw the rest"], err


def test_figures_none_draws_no_figure_and_launch_figures_draws_every_one_later(
        tiny_sweep, tmp_path, cache_dir, capsys):
    # figures="none" (batch work, the test suite): the reports without a figure or an image;
    # The figures command (complete_figures) then draws them all, the summary byte for byte as the
    # sweep draws it, and the marker vouches for them.
    workdir = tmp_path / "run"
    shutil.copytree(tiny_sweep, workdir)
    for name in ("figures", os.path.join("tensorboard", "images")):
        shutil.rmtree(workdir / name)
    os.remove(workdir / sweep.DONE_FILE)  # as if stopped in the report stage: written again
    config = tiny_sweep_config(cache_dir)
    config.figures = "none"
    sweep.run(checked(config), str(workdir))
    assert (f"figures: none (setting figures); jaxillusions figures {workdir} draws the "
            "rest") in capsys.readouterr().out
    assert not (workdir / "figures").exists()
    assert not (workdir / "tensorboard" / "images").exists()  # no image was logged
    assert json.loads((workdir / sweep.DONE_FILE).read_text())["figures"] == "none"
    sweep.run(checked(config), str(workdir))  # finished: nothing to draw with "none"
    assert "is finished (finished " in capsys.readouterr().out
    assert not (workdir / "figures").exists()

    sweep.complete_figures(checked(config), str(workdir), say=lambda *a, **k: None)
    drawn = _figures(workdir)
    assert set(drawn) == SUMMARY | REST
    assert {name: drawn[name] for name in SUMMARY} == _figures(tiny_sweep)
    assert set(_images(workdir).values()) == {1} and len(_images(workdir)) == len(drawn)
    done = json.loads((workdir / sweep.DONE_FILE).read_text())
    assert sweep._unverified(done, str(workdir)) is None and done["figures"] == "all"


def test_figures_all_on_a_finished_sweep_draws_the_rest_as_the_sweep_draws_them(
        tiny_sweep, tmp_path, cache_dir, capsys):
    # The relaunch with figures="all" draws what the summary left out (from results.csv,
    # gaps.csv and the checkpoint), and a sweep that writes its reports again with "all" draws
    # every figure itself, from its rows in memory: the same bytes.

    workdir = tmp_path / "run"
    shutil.copytree(tiny_sweep, workdir)
    config = tiny_sweep_config(cache_dir)
    config.figures = "all"
    sweep.run(checked(config), str(workdir))
    out = capsys.readouterr().out
    assert f"drew the {len(REST)} figures it had left out (figures=all)" in out
    # and recorded, as any analysis setting changed on a relaunch (was: config.json still said
    # "summary", and config_history.jsonl had no record of the change)
    assert "note: figures changed from 'summary' to 'all' (analysis setting; recorded in " \
           "config_history.jsonl)" in out
    assert json.loads((workdir / "config.json").read_text())["figures"] == "all"
    history = [json.loads(line) for line in (workdir / "config_history.jsonl").open()]
    assert history[-1]["event"] == "changed" and history[-1]["changes"] == {
        "figures": ["summary", "all"]}
    drawn = _figures(workdir)
    assert set(drawn) == SUMMARY | REST
    done = json.loads((workdir / sweep.DONE_FILE).read_text())
    assert sweep._unverified(done, str(workdir)) is None and done["figures"] == "all"
    os.remove(workdir / sweep.DONE_FILE)  # as if stopped in the report stage: written again
    sweep.run(checked(config), str(workdir), verbose=False)
    assert _figures(workdir) == drawn
    done = json.loads((workdir / sweep.DONE_FILE).read_text())
    assert sweep._unverified(done, str(workdir)) is None and done["figures"] == "all"


def test_launch_figures_refuses_what_is_not_a_run_with_results_in_one_line(tmp_path, tiny_sweep,
                                                                           cache_dir):

    (tmp_path / "empty").mkdir()
    for args, message in [([str(tmp_path / "nope")], f"error: {tmp_path / 'nope'} is not a "
                           "directory (jaxillusions figures WORKDIR"),
                          ([str(tmp_path / "empty")], f"error: {tmp_path / 'empty'} is not the "
                           "workdir of a run: it has no config.json"),
                          ([], "error: give one workdir (jaxillusions figures WORKDIR"),
                          (["--config=dyck_small", tiny_sweep],
                           "error: jaxillusions figures takes no --config"),
                          # Was: "Unknown command line flag 'config.figures'".
                          (["--config.figures=all", tiny_sweep],
                           "error: jaxillusions figures takes no --config and no config "
                           "overrides: it reads the run's config.json")]:
        proc = subprocess.run([sys.executable, "-m", "jaxillusions.launch.figures", *args],
                              cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 1 and proc.stderr.startswith(message), proc.stderr
        assert proc.stderr.count("\n") == 1
    # A run without results yet (training only), and a finished one whose reports changed
    # since: one line each, before anything is drawn.
    config = validate.parse(tiny_sweep_config(cache_dir))
    trained = tmp_path / "trained"
    trained.mkdir()
    shutil.copy(os.path.join(tiny_sweep, "config.json"), trained)
    with pytest.raises(ValueError, match=r"^.*trained has no results yet \(no results.csv"):
        sweep.complete_figures(config, str(trained))
    changed = tmp_path / "changed"
    shutil.copytree(tiny_sweep, changed)
    with open(changed / "gaps.csv", "a") as f:
        f.write("\n")
    with pytest.raises(ValueError) as err:
        sweep.complete_figures(config, str(changed))
    assert str(err.value).startswith(
        f"the sweep in {changed} finished, but its gaps.csv differs from the sha256 recorded in "
        f"{sweep.DONE_FILE}; relaunch") and "\n" not in str(err.value)
    assert json.loads((changed / sweep.DONE_FILE).read_text())["figures"] == "summary"
    assert set(_figures(changed)) == SUMMARY


def _circuit_rows(families, seeds=(0, 1, 2)):
    """faithfulness.evaluate-shaped rows of circuit families [(target, sizes, units)]: a size of
    every unit is the original model (same predictions, JSD 0); smaller ones are not."""
    rows = []
    for seed in seeds:
        for site, sizes, units in families:
            for size in sizes:
                for j, split in enumerate(SPLITS):
                    whole = size == units
                    same = 1.0 if whole else 0.9 - 0.02 * j - 0.001 * seed + 0.01 * size / units
                    for breakdown, bin_ in (("all", ""), ("depth", 1), ("depth", 2)):
                        rows.append({"seed": seed, "site": site, "method": "circuit",
                                     "size": size, "split": split, "breakdown": breakdown,
                                     "bin": bin_, "n": 50, "jsd": 1.0 - same, "same_pred": same,
                                     "acc_original": 0.9,
                                     "acc_proxy": 0.9 if whole else same - 0.1})
    return rows


@pytest.mark.parametrize("sizes", [(10**9,), "every edge", (5,), (0, 3, 10**9)])
def test_circuit_figures_draw_any_size_set(sizes, tmp_path):
    # Was: proxies.circuit_sizes=(1000000000,) (clipped to every unit) or (23,) on a model of 23
    # edges left faithfulness_curves no line to draw (the whole model is not drawn), and its
    # legend of no labels failed in matplotlib ("number sections must be larger than 0").
    cfg = model.ModelConfig(vocab_size=11, max_len=10, n_layers=1, d_model=16, d_mlp=24)
    edges = patching.num_units(cfg, "edge")
    proxy_cfg = validate.parse({"proxies": {
        "circuit_sizes": (edges,) if sizes == "every edge" else sizes,
        "circuit_granularity": ("edge", "node")}}).proxies
    families = [(target, found, patching.num_units(cfg, target.split(".")[1]))
                for target, found, _ in circuit.families(proxy_cfg, cfg)]
    for _, found, units in families:  # clipped to the units there are, each size once
        assert found == tuple(sorted({min(s, units) for s in proxy_cfg.circuit_sizes}))
    rows = _circuit_rows(families)
    site = families[0][0]
    for name, fig in (("curves", figures.faithfulness_curves(rows, "circuit", SPLITS)),
                      ("gaps", figures.gap_vs_size(_gaps(rows), "circuit", SPLITS)),
                      ("depth", figures.accuracy_by_depth(rows, site, "circuit", SPLITS, 1))):
        assert figures.save(fig, str(tmp_path / f"{name}.png")).size


def test_a_size_axis_places_size_0_and_each_column_keeps_its_own_sizes():
    # Was: a size 0 (an empty circuit, the first concept erased) on a log2 axis stretched it
    # towards 2^-1000, every other size bunched at its right end, with matplotlib's "no
    # positive values" warning where 0 was the only size; and the columns shared one x axis,
    # so the last column's ticks (the node circuit's 0-4) stood under the edge circuit's 0-23.
    import warnings

    cfg = model.ModelConfig(vocab_size=11, max_len=10, n_layers=1, d_model=16, d_mlp=24)
    proxy_cfg = validate.parse({"proxies": {"circuit_sizes": (0, 1, 2, 4, 8, 10**9),
                                            "circuit_granularity": ("edge", "node")}}).proxies
    families = [(target, found, patching.num_units(cfg, target.split(".")[1]))
                for target, found, _ in circuit.families(proxy_cfg, cfg)]
    rows = _circuit_rows(families)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        curves = figures.faithfulness_curves(rows, "circuit", SPLITS)  # the whole model hidden
        gaps = figures.gap_vs_size(_gaps(rows), "circuit", SPLITS)
        only_zero = figures.gap_vs_size(_gaps(_circuit_rows([("circuit.node.zero", (0,), 4)])),
                                        "circuit", SPLITS)
    drawn = {"curves": (curves, [[s for s in found if s < units] for _, found, units in families]),
             "gaps": (gaps, [list(found) for _, found, _ in families])}
    for name, (fig, expected) in drawn.items():
        bottom = [ax for ax in fig.axes if ax.get_xlabel()]  # one per column, in family order
        assert [list(ax.get_xticks()) for ax in bottom] == expected, name
        assert expected[0] != expected[1]  # the edge and node circuits' sizes differ
        for ax, sizes in zip(bottom, expected, strict=True):
            assert ax.get_xscale() == "symlog" and "0" in [t.get_text()
                                                           for t in ax.get_xticklabels()]
            low, high = ax.get_xlim()
            assert -1 < low < 0 and max(sizes) < high < 2 * max(sizes), (name, low, high)
    (ax,) = [ax for ax in only_zero.axes if ax.get_xlabel()]
    assert list(ax.get_xticks()) == [0] and -1 < ax.get_xlim()[0] < 0 < ax.get_xlim()[1] < 1


def test_one_size_proxies_at_several_sites_get_a_marker_each():
    # Was: one marker per method, so the logit lens at five sites showed the last site's gaps
    # alone (the final residual: the model itself, a gap of exactly 0), under the title
    # "Attention proxies".
    sites = ("blocks.0.resid_pre", "blocks.0.resid_post", "blocks.1.resid_post")
    rows = []
    for seed in (0, 1, 2):
        for k, site in enumerate(sites):
            for j, split in enumerate(SPLITS):
                same = 0.95 - 0.1 * j * (len(sites) - 1 - k) - 0.001 * seed
                rows.append({"seed": seed, "site": site, "method": "logit_lens", "size": 0,
                             "split": split, "breakdown": "all", "bin": "", "n": 50,
                             "jsd": 1.0 - same, "same_pred": same, "acc_original": 0.9,
                             "acc_proxy": same - 0.1})
    gaps = _gaps(rows + _rows())
    fig = figures.gaps_by_split(gaps, ["onehot_attention", "logit_lens"], SPLITS)
    ax = fig.axes[0]  # same_pred
    drawn = {c.get_label(): c.lines[0].get_ydata() for c in ax.containers}
    assert list(drawn) == ["onehot_attention", *(f"logit_lens {site}" for site in sites)]
    for site in sites:
        want = [g["gap"] for split in SPLITS[1:] for g in gaps
                if (g["method"], g["site"], g["metric"], g["split"]) ==
                ("logit_lens", site, "same_pred", split)]
        np.testing.assert_allclose(drawn[f"logit_lens {site}"], want)
    assert drawn["logit_lens blocks.0.resid_pre"].max() > 0.1  # not the last site's zeros
    assert fig._suptitle.get_text().startswith("onehot_attention and logit_lens: paired gap")
    styles = {(c.lines[0].get_color(), c.lines[0].get_marker()) for c in ax.containers}
    assert len(styles) == len(drawn)


@pytest.mark.parametrize("method", ["sae", "transcoder"])
def test_sae_size_codes_are_drawn_against_width_with_a_line_style_per_k(method):
    # Was: with several sae_k the size codes k * 100000 + width (400032, 400064, ...) sat on a
    # log2 axis on top of each other, only some ticks labelled, the axis reading "width (k *
    # 100000 + width with several sae_k)".
    from jaxillusions.proxies import sae

    widths, ks, site = (32, 64, 128), (4, 8), "blocks.0.resid_mid"
    rows = [{"seed": seed, "site": site, "method": method, "size": sae.size_code(w, k),
             "split": split, "breakdown": breakdown, "bin": bin_, "n": 50,
             "jsd": 0.05 + 0.01 * j, "same_pred": same, "acc_original": 0.9,
             "acc_proxy": same - 0.1}
            for seed in range(3) for w in widths for k in ks
            for j, split in enumerate(SPLITS)
            for same in [0.95 - 0.02 * j * (1 + k / w) - 0.001 * seed]
            for breakdown, bin_ in (("all", ""), ("depth", 1), ("depth", 2))]
    gaps = _gaps(rows)
    for name, fig, splits in (("curves", figures.faithfulness_curves(rows, method, SPLITS),
                               SPLITS),
                              ("gaps", figures.gap_vs_size(gaps, method, SPLITS), SPLITS[1:])):
        _check_readable(fig)
        (ax,) = [ax for ax in fig.axes if ax.get_xlabel()]
        assert ax.get_xlabel() == "width (line style: k)", name
        assert list(ax.get_xticks()) == list(widths), name
        assert [t.get_text() for t in ax.get_xticklabels()] == ["32", "64", "128"], name
        drawn = [c.lines[0] for c in ax.containers]
        assert len(drawn) == len(splits) * len(ks), name
        assert {line.get_linestyle() for line in drawn} == {"-", "--"}, name
        for line in drawn:  # dodged around its widths, within a quarter of a doubling
            ratio = np.log2(np.asarray(line.get_xdata()) / widths)
            assert np.all(np.abs(ratio) < 0.25), (name, line.get_xdata())
        assert {"k = 4", "k = 8"} <= {t.get_text() for t in fig.legends[0].get_texts()}, name
    # The gap figure's last dashed line (longer, k = 8) is that k's gaps, in width order.
    longer = [line for line in drawn if line.get_linestyle() == "--"][-1]
    want = [next(g["gap"] for g in gaps if (g["size"], g["split"]) ==
                 (sae.size_code(w, 8), "longer")) for w in widths]
    np.testing.assert_allclose(longer.get_ydata(), want)
    acc = figures.accuracy_by_depth(rows, site, method, SPLITS, max_depth=1)
    assert acc.axes[0].get_legend_handles_labels()[1] == [
        "original", f"{method}, w32k4", f"{method}, w32k8", f"{method}, w128k8"]


@pytest.mark.parametrize("rows", [1, 10])
def test_the_title_stays_above_the_first_row_of_a_tall_grid(rows, tmp_path, monkeypatch):
    # Was: at 2% of the height below the top, among the first row's panels of the held-out
    # prediction's 28 targets (10 rows of 3, 34 inches); its legend's strip there was 2.7 in.
    import pandas as pd

    from jaxillusions.report import heldout

    frame = pd.DataFrame([
        {"target": f"acc:split{t}", "metric": "auroc", "predictors": p, "scheme": "random",
         "null": False, "mean": 0.7, "sd": 0.1, "low": 0.6, "high": 0.8, "n_folds": 5,
         "n_skipped": 0, "members": 32, "threshold": 0.5, "verdict": ""}
        for t in range(3 * rows) for p in ("features", "hparams")])
    drawn = {}

    def measure(fig, path):
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        drawn["title"] = fig._suptitle.get_window_extent(renderer)
        drawn["panels"] = [ax.title.get_window_extent(renderer) for ax in fig.axes
                           if ax.get_title()]
        drawn["top"], drawn["dpi"] = fig.get_size_inches()[1] * fig.dpi, fig.dpi
        figures._pyplot().close(fig)

    monkeypatch.setattr(figures, "save", measure)
    heldout.figure(frame, str(tmp_path / "p.png"))
    assert len(drawn["panels"]) == 3 * rows
    assert drawn["title"].y0 > max(p.y1 for p in drawn["panels"])  # above every panel's title
    assert drawn["top"] - drawn["title"].y1 < 0.2 * drawn["dpi"]  # within 0.2 inch of the top
