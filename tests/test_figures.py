import numpy as np
import pytest
from test_logging import _gaps, _rows

from jaxillusions.analysis import figures

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
    assert labels == ["original", "svd 1", "svd 4", "svd 16"]
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


def test_a_helper_process_draws_every_other_figure_into_the_same_files(tmp_path, monkeypatch):
    # With two cores a helper process draws every other figure (drawing is single-threaded);
    # the files and TensorBoard's images (in order) are those of one process drawing them all,
    # and a helper that fails leaves its figures to this process.
    import os
    import sys

    from jaxillusions import sweep

    rows, gaps = _rows(), _gaps(_rows())
    jobs = [("a", "curves", figures.faithfulness_curves, (rows, "svd", SPLITS)),
            ("b", "gaps", figures.gap_vs_size, (gaps, "kmeans", SPLITS)),
            ("c", "attention", figures.gaps_by_split, (gaps, ["onehot_attention"], SPLITS))]

    class Writer:
        def image(self, tag, pixels):
            self.images.append((tag, pixels))

    helped, start = [], sweep._start_helper
    monkeypatch.setattr(sweep, "_start_helper", lambda jobs: helped.append(len(jobs)) or
                        start(jobs))
    images = {}
    for name, cores, executable in (("alone", {0}, sys.executable),
                                    ("helped", {0, 1}, sys.executable),
                                    ("failed", {0, 1}, "false")):
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid, cores=cores: cores)
        monkeypatch.setattr(sys, "executable", executable)
        writer = Writer()
        writer.images = []
        sweep.draw(jobs, writer, str(tmp_path / name))
        images[name] = writer.images
    assert helped == [1, 1]  # job b, in the runs with two cores
    for name in ("helped", "failed"):
        assert [tag for tag, _ in images[name]] == ["a", "b", "c"]
        for (_, x), (_, y) in zip(images["alone"], images[name], strict=True):
            assert np.array_equal(x, y)
        for file in ("curves", "gaps", "attention"):
            with open(tmp_path / "alone" / "figures" / f"{file}.png", "rb") as a, \
                    open(tmp_path / name / "figures" / f"{file}.png", "rb") as b:
                assert a.read() == b.read()
