"""Drawing the main job's figures: which figures the result rows and the activations make
(`figure_jobs`, `activation_jobs`; the setting `figures` chooses), and `draw`, which renders
them into figures/*.png and TensorBoard's IMAGES, with a helper process drawing every other
figure where two cores are free. `write_views` adds the TensorBoard reports (report/board.py).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import shutil
import subprocess
import sys
import tempfile

import jax
import numpy as np
from PIL import Image

from jaxillusions import model, tasks
from jaxillusions.config.settings import Settings
from jaxillusions.faithfulness.specs import resolve_site
from jaxillusions.report import board, figures
from jaxillusions.runtime import cache, distributed, interrupt, stages, tensorboard
from jaxillusions.training import objective


def stop_in_reports(workdir: str) -> None:
    """Raises interrupt.Stopped if this process received a signal while writing the reports
    (process 0 alone writes them: no collective here)."""
    interrupt.raise_if_requested(
        f"while writing the reports; results.csv and the proxy stages are saved in {workdir}; "
        "relaunch the same command to write the reports")


def write_views(rows, config, workdir: str, seeds, healthy, *, model_cfg=None,
                gaps=(), hparams=None) -> None:
    """Figures (figures/*.png, also under TensorBoard's IMAGES; those of `figure_jobs` that the
    setting `figures` chooses) and the TensorBoard reports (report/board.py) from the result
    rows and, when given, the paired gaps (report/stats.py); `hparams`: the members' own
    hyper-parameters (board.Sessions)."""
    jobs = figure_jobs(rows, config, gaps, config.figures)
    with stages.writing("report", os.path.join(workdir, "tensorboard")), \
            tensorboard.board(workdir, seeds) as writer:
        draw(jobs, writer, workdir)
        board.write_all(writer, rows, config, model_cfg,
                        board.Sessions(seeds, healthy, hparams), workdir, gaps)


def figure_jobs(rows, config: Settings, gaps=(), which: str = "all") -> list[tuple]:
    """The figures of the result rows and the paired gaps (those of the gap baseline), as jobs of
    `draw`. `which`="summary" (settings.FIGURES): the paired gaps per split (gap_vs_size_<method>,
    gaps_attention_proxies; with `gaps`), faithfulness against size (faithfulness_<method>) and
    the task's categorical breakdowns (same_pred_by_<breakdown>_<method>); "all": also accuracy
    per bin of every breakdown with a training bound, one figure per proxy family
    (accuracy_by_<breakdown>_<method>_<site>); "none": no figure."""
    if which == "none":
        return []
    splits = list(config.proxies.eval_splits)
    methods = list(dict.fromkeys(r["method"] for r in rows))
    sized = [m for m in methods if any(r["method"] == m and r["size"] > 0 for r in rows)]
    unsized = [m for m in methods if m not in sized]
    task = tasks.get(config)
    labelled = {b: task.bin_labels(b) for b in task.BREAKDOWNS
                if task.bin_labels(b) and any(r["breakdown"] == b for r in rows)}
    jobs = []  # (TensorBoard tag, file name, figure function, its arguments)
    for method in sized:
        if gaps:
            jobs.append((f"gaps/{method}", f"gap_vs_size_{method}", figures.gap_vs_size,
                         (gaps, method, splits)))
        jobs.append((f"faithfulness/{method}", f"faithfulness_{method}",
                     figures.faithfulness_curves, (rows, method, splits)))
    if gaps and unsized:
        jobs.append(("gaps/attention_proxies", "gaps_attention_proxies", figures.gaps_by_split,
                     (gaps, unsized, splits)))
    for breakdown, labels in labelled.items():  # categorical breakdowns (code: category)
        for method in methods:
            jobs.append((f"same_pred_by_{breakdown}/{method}",
                         f"same_pred_by_{breakdown}_{method}", figures.faithfulness_by_label,
                         (rows, method, splits, breakdown, labels)))
    if which == "summary":
        return jobs
    bounds = task.bounds(config.data)  # the largest bin seen in training, per breakdown
    if "position" in bounds:  # position offsets (train.max_position_offset) train later ones
        bounds["position"] += objective.from_settings(config).max_position_offset
    breakdowns = [b for b in bounds if any(r["breakdown"] == b for r in rows)]
    for site, method in dict.fromkeys((r["site"], r["method"]) for r in rows):
        # The family's rows, all that the figure reads: it aggregates every row it is
        # given (over seeds, per bin), the most costly part of the reports on all rows.
        family = [r for r in rows if r["site"] == site and r["method"] == method]
        for breakdown in breakdowns:
            jobs.append((f"accuracy_by_{breakdown}/{method}/{site}",
                         f"accuracy_by_{breakdown}_{method}_{site.replace('+', '_and_')}",
                         figures.accuracy_by_bin,
                         (family, site, method, splits, breakdown, bounds[breakdown])))
    return jobs


def write_activation_figures(params, splits, model_cfg, config, workdir: str, seeds,
                             healthy=None, max_seeds: int = 4) -> None:
    """The activation figures of `activation_jobs` that the setting `figures` chooses, under
    figures/ and TensorBoard IMAGES."""
    jobs = activation_jobs(params, splits, model_cfg, config, seeds, healthy, config.figures,
                           max_seeds)
    if not jobs:
        return
    with stages.writing("report", os.path.join(workdir, "tensorboard")), \
            tensorboard.board(workdir, seeds) as writer:
        draw(jobs, writer, workdir)


def activation_jobs(params, splits, model_cfg, config: Settings, seeds, healthy=None,
                    which: str = "all", max_seeds: int = 4) -> list[tuple]:
    """The task's figures of activations, as jobs of `draw` (Dyck: last-layer attention patterns
    on one iid sentence for the first healthy seeds, and the 2-D SVD projection of the last
    layer's keys at training positions of the first 3 healthy seeds, one figure each).
    `which`="summary": the first figure of each kind (the attention patterns, the first healthy
    seed's key projection); "all": every one; "none": none."""
    healthy = np.ones(len(seeds), bool) if healthy is None else np.asarray(healthy, bool)
    if which == "none" or not healthy.any():
        return []
    index = np.flatnonzero(healthy)[:max_seeds]  # diverged seeds are not drawn
    shown = [seeds[i] for i in index]
    pattern_site = resolve_site("blocks.-1.attn.pattern", model_cfg)
    key_site = resolve_site("blocks.-1.attn.k", model_cfg)

    def run(tokens, site):
        def one(p):
            return model.forward(p, tokens, model_cfg, cache=(site,))[1][site]
        return np.asarray(jax.jit(jax.vmap(one))(jax.tree.map(lambda x: x[index], params)))

    plots = tasks.get(config.task).activation_plots(run, splits, config.data, shown, pattern_site,
                                                    key_site)
    if which == "summary":
        first: dict[str, str] = {}  # figure function -> the first figure drawn with it
        for name, (kind, _) in plots.items():
            first.setdefault(kind, name)
        plots = {name: plots[name] for name in first.values()}
    return [(f"activations/{name}", name, getattr(figures, kind), args)
            for name, (kind, args) in plots.items()]


def figure_path(directory: str, name: str) -> str:
    return os.path.join(directory, "figures", name + ".png")


def draw(jobs, writer, workdir: str) -> None:
    """Draws each figure of `jobs` ([(TensorBoard tag, file name under figures/, a figure
    function of report/figures.py, its arguments)]) once, into its PNG and TensorBoard's IMAGES
    (in the order of `jobs`). Drawing is single-threaded Python: where this process may use two
    cores, a helper process draws from the last figure while this one draws from the first,
    each taking the next figure that the other has not taken (`figures.claim`; the same PNG,
    byte for byte). This process never waits on the helper: a figure the helper took but has
    not written yet (its start, about 0.5 s of imports, and its first figure, matplotlib's
    warm-up, take longer than a few quick figures here) is drawn here too, and the helper is
    ended once every figure is drawn. Should it fail, its figures are drawn here."""
    paths = [os.path.join(workdir, "figures", name + ".png") for _, name, _, _ in jobs]
    two_cores = distributed.cpu_cores() > 1
    claims = tempfile.mkdtemp(prefix="figures_") if len(jobs) > 1 and two_cores else None
    helper = _start_helper([(f, a, p) for (_, _, f, a), p in zip(jobs, paths, strict=True)],
                           claims) if claims else None
    pixels = {}
    try:
        for i in range(len(jobs)):
            if helper is not None and not figures.claim(claims, i) and figures.drawn(claims, i):
                continue  # the helper's, read back below
            stop_in_reports(workdir)  # each figure takes a while: a signal stops between them
            with stages.writing("report", paths[i]):
                pixels[i] = figures.render(*jobs[i][2:], paths[i])
    finally:
        if helper is not None:
            if helper.poll() is None:  # at a figure this process drew too, or stopped (the
                helper.kill()  # relaunch draws every figure again)
                helper.wait()
            for path in paths:  # a figure it was writing when ended
                with contextlib.suppress(FileNotFoundError):
                    os.remove(cache.temporary_path(path, helper.pid))
            os.remove(helper.args[-2])
            shutil.rmtree(claims, ignore_errors=True)
    for i, (tag, _, _, _) in enumerate(jobs):
        if i not in pixels:  # written whole by the helper
            with Image.open(paths[i]) as image:
                pixels[i] = np.asarray(image.convert("RGBA"))
        tensorboard.write_figure(writer, tag, pixels[i][..., :3])


def _start_helper(jobs: list, claims: str) -> subprocess.Popen:
    """A process that draws `jobs` ([(figure function, arguments, path)]) from the last, each
    it `figures.claim`s in the folder `claims` (figures.render_file), in a session of its own (a
    Ctrl-C stops this process, which ends it); its last two arguments are the jobs' file, for
    the caller to remove, and `claims`."""
    fd, path = tempfile.mkstemp(suffix=".pkl", prefix="figures_")
    with os.fdopen(fd, "wb") as f:
        pickle.dump(jobs, f)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    return subprocess.Popen(
        [sys.executable, "-c", "import sys; from jaxillusions.report import figures; "
         "figures.render_file(*sys.argv[1:])", path, claims],
        env=env, stdout=subprocess.DEVNULL, start_new_session=True)
