"""TensorBoard logging for a sweep of seeds, written with tensorboardX (no TensorFlow): the one
writer of the job's board (`board`, then the write_* functions, which own its runs and tags).

One TensorBoard run per subdirectory of `logdir`:
  seed_<s>/          per-seed scalars
  mean/ min/ max/    aggregates over the seeds that are healthy and finite
  all/               sweep-level scalars (a single value for the whole sweep)
  images/            images (default run of `SweepWriter.image`)
  hparams/           config + final metrics for the HPARAMS tab (`hparams(run=...)` can put a
                     session in any run, e.g. one per seed_<s>)
  <run>/             what `curve` and `text` are given: the main job's headline cards
                     (split/<split>, `write_headline`) and report (`write_report`)

Scalars are stored as `simple_value`, i.e. float32.
"""

from __future__ import annotations

import dataclasses
import io
import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

AGGREGATES = {"mean": np.mean, "min": np.min, "max": np.max}


def _import_tensorboardx() -> None:
    """Imports tensorboardX without PyTorch. Its package imports torch, when installed, only to
    accept torch tensors (we write numpy): 2.3 s and about 300 MB of every launch on the 2-core
    AMD EPYC machine. A torch the process already imported is used as it is, and one imported
    later imports normally."""
    if "tensorboardX" in sys.modules or "torch" in sys.modules:
        return
    sys.modules["torch"] = None  # type: ignore[assignment]  # `import torch` -> ImportError
    try:
        import tensorboardX  # noqa: F401, PLC0415
    finally:
        del sys.modules["torch"]


class SweepWriter:
    """Writes TensorBoard event files for a sweep of seeds (leading seed axis).

    Each run gets one synchronous tensorboardX `EventsWriter`, opened on first use. We avoid
    `tensorboardX.SummaryWriter` because each one holds 3 file descriptors and 2 threads (a
    multiprocessing queue + logger thread); with hundreds of seeds that is ~600 fds and ~400
    threads, while an `EventsWriter` is a single open file.
    """

    def __init__(self, logdir: str, seeds: Sequence[int | str], flush_secs: float = 60.0) -> None:
        self.logdir = os.fspath(logdir)
        # Run labels: seeds, or strings for members of a hyper-parameter sweep ("3_cw0.3").
        self.seeds = [s if isinstance(s, str) else int(s) for s in seeds]
        self.flush_secs = flush_secs
        self._writers: dict[str, Any] = {}
        self._last_flush = time.monotonic()
        _import_tensorboardx()

    def _writer(self, run: str) -> Any:
        if run not in self._writers:
            from tensorboardX.event_file_writer import EventsWriter

            path = os.path.join(self.logdir, run)
            os.makedirs(path, exist_ok=True)
            # File names only carry the second and the file is opened 'wb': without a sub-second
            # suffix, reopening a run within the same second would truncate the earlier file.
            suffix = f".{time.time_ns() % 10**9:09d}"
            self._writers[run] = EventsWriter(os.path.join(path, "events"), suffix)
        return self._writers[run]

    def _write(self, run: str, values: list[Any], step: int) -> None:
        from tensorboardX.proto.event_pb2 import Event
        from tensorboardX.proto.summary_pb2 import Summary

        event = Event(wall_time=time.time(), step=int(step), summary=Summary(value=values))
        self._writer(run).write_event(event)

    def _maybe_flush(self) -> None:
        if time.monotonic() - self._last_flush >= self.flush_secs:
            self.flush()

    def scalars(
        self, step: int, values: Mapping[str, ArrayLike], healthy: ArrayLike | None = None
    ) -> None:
        """Per-seed values (length-S arrays, in the order of `seeds`) to every `seed_<s>` run,
        plus mean/min/max over healthy seeds with finite values; 0-d values go to run "all"."""
        from tensorboardX.proto.summary_pb2 import Summary

        n = len(self.seeds)
        ok = np.ones(n, bool) if healthy is None else np.asarray(healthy, bool).reshape(n)
        per_run: dict[str, list[Any]] = {}

        def add(run: str, tag: str, x: float) -> None:
            per_run.setdefault(run, []).append(Summary.Value(tag=tag, simple_value=float(x)))

        for tag, value in values.items():
            v = np.asarray(value, np.float64)
            if v.ndim == 0:
                add("all", tag, v)
                continue
            if v.shape != (n,):
                raise ValueError(f"{tag}: expected shape ({n},), got {v.shape}")
            for s, x in zip(self.seeds, v.tolist(), strict=True):
                add(f"seed_{s}", tag, x)
            usable = ok & np.isfinite(v)
            if usable.any():
                for run, fn in AGGREGATES.items():
                    add(run, tag, fn(v[usable]))
        # One event per run per call keeps the files small with many tags.
        for run, vals in per_run.items():
            self._write(run, vals, step)
        self._maybe_flush()

    def curve(self, run: str, tag: str, xs: Sequence[int], ys: Sequence[float],
              description: str = "") -> None:
        """Writes `ys` as scalar `tag` with step = `xs` into `run`; non-finite ys are skipped.
        `description` (markdown) is shown with the tag's card (set on its first point).

        Writing the same (run, tag) again with smaller steps: TensorBoard's data server treats a
        step going back as a restart and may show only the newest curve; `read_scalars` returns
        both. Put the training step in the run or tag to keep several curves.
        """
        from tensorboardX.proto.summary_pb2 import Summary

        meta = _scalar_metadata(description) if description else None
        for x, y in zip(xs, ys, strict=True):
            if np.isfinite(y):
                value = Summary.Value(tag=tag, simple_value=float(y))
                if meta is not None:
                    value.metadata.CopyFrom(meta)
                    meta = None  # TensorBoard keeps a tag's first metadata
                self._write(run, [value], int(x))
        self._maybe_flush()

    def image(self, tag: str, image: Any, step: int = 0, run: str = "images") -> None:
        """image: a matplotlib Figure, or an array [H, W], [H, W, 1|3|4] (uint8, or float in
        [0, 1], clipped)."""
        from PIL import Image
        from tensorboardX.proto.summary_pb2 import Summary

        arr = _image_array(image)
        buf = io.BytesIO()
        Image.fromarray(arr).save(buf, format="PNG")
        h, w = arr.shape[:2]
        channels = 1 if arr.ndim == 2 else arr.shape[2]
        img = Summary.Image(
            height=h, width=w, colorspace=channels, encoded_image_string=buf.getvalue()
        )
        self._write(run, [Summary.Value(tag=tag, image=img)], step)
        self._maybe_flush()

    def hparams(
        self,
        hparams: Mapping[str, Any],
        metrics: Mapping[str, float],
        run: str = "hparams",
        step: int = 0,
        metric_tags: Sequence[str] = (),
        varying: Sequence[str] = (),
        display_names: Mapping[str, str] | None = None,
        description: str = "",
    ) -> None:
        """Config + final metrics for the HPARAMS tab: experiment, session start/end and the
        metric scalars, all in `run` (the plugin reads a session's metrics from its own run).

        `metric_tags` names further metrics whose scalars the run already has (e.g. the last
        `eval/iid/acc` of a seed run): listed in the experiment, not written again. The
        experiment lists them first, in this order (TensorBoard shows the first 5 metrics by
        default). `varying`: hparams that differ between sessions (e.g. the seed), marked so in
        the experiment; TensorBoard shows those first (else the first 5 by name, constants).
        `display_names`: {metric tag: the column title HPARAMS shows instead of the tag}.
        `description`: shown with the metric scalars' cards (SCALARS' info).
        Call once per run: TensorBoard keeps the first hparams metadata it sees in a run.
        """
        from tensorboardX.proto.summary_pb2 import Summary
        from tensorboardX.summary import hparams as hparams_summaries

        hp = {k: _hparam_value(v) for k, v in hparams.items()}
        mt = {k: float(v) for k, v in metrics.items()}
        listed = {**{k: 0.0 for k in metric_tags}, **mt}
        # tensorboardX's add_hparams would put these in a timestamped sub-run; write them directly.
        summaries = hparams_summaries(hp, listed)
        if varying or display_names:  # HParamInfo.differs, MetricInfo.display_name:
            # tensorboardX's proto has no such fields; TensorBoard's has.
            from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

            value = summaries[0].value[0]  # the experiment
            data = HParamsPluginData.FromString(value.metadata.plugin_data.content)
            for info in data.experiment.hparam_infos:
                info.differs = info.name in varying
            for metric in data.experiment.metric_infos:
                metric.display_name = (display_names or {}).get(metric.name.tag, "")
            value.metadata.plugin_data.content = data.SerializeToString()
        for summary in summaries:
            self._write(run, list(summary.value), step)
        if mt:
            values = [Summary.Value(tag=k, simple_value=v) for k, v in mt.items()]
            for value in values if description else ():
                value.metadata.CopyFrom(_scalar_metadata(description))
            self._write(run, values, step)
        self._maybe_flush()

    def text(self, run: str, tag: str, text: str, step: int = 0) -> None:
        """Markdown `text` for the TEXT tab, as tag `tag` of run `run`."""
        from tensorboardX.summary import text as text_summary

        value = text_summary(tag, text).value[0]
        value.tag = tag  # tensorboardX appends "/text_summary"
        self._write(run, [value], step)
        self._maybe_flush()

    @staticmethod
    def seed_runs(seeds: Sequence[int]) -> list[str]:
        """The runs `scalars` writes: one per seed, the aggregates and "all"."""
        return [f"seed_{s}" for s in seeds] + list(AGGREGATES) + ["all"]

    def restart(self, step: int, runs: Sequence[str]) -> None:
        """Marks a resumption from `step` in each run that already has events: a SessionLog
        START event at step + 1, TensorBoard's restart marker. Its readers (and `read_scalars`)
        then drop the events at steps > `step` written before it, i.e. those of the stopped
        run after its last checkpoint, so no step is shown twice."""
        from tensorboardX.proto.event_pb2 import Event, SessionLog

        for run in runs:
            path = os.path.join(self.logdir, run)
            if os.path.isdir(path) and any("tfevents" in f for f in os.listdir(path)):
                self._writer(run).write_event(Event(wall_time=time.time(), step=int(step) + 1,
                                                    session_log=SessionLog(
                                                        status=SessionLog.START)))
        self.flush()

    def flush(self) -> None:
        for w in self._writers.values():
            w.flush()
        self._last_flush = time.monotonic()

    def close(self) -> None:
        for w in self._writers.values():
            w.close()
        self._writers.clear()

    def __enter__(self) -> SweepWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------------------------------------
# The job's board: every stage's TensorBoard output goes through these functions, which own the
# logdir, the runs and the tags; a stage hands over what to show (per-member values, figures,
# the headline gaps, the report's text, the members' HPARAMS sessions) and nothing else opens or
# writes a SweepWriter (tests/test_architecture.py).

LOGDIR = "tensorboard"  # <workdir>/tensorboard: the README's logdir
# The first tag group of Time Series and SCALARS: both sort tags character by character with
# '/' and digits first, then by character code, so an uppercase first letter sorts before every
# lowercase tag the job writes (accuracy_by_depth, eval, train, ...).
HEADLINE = "Headline"
SUMMARY_TAG = f"{HEADLINE}/summary"  # TEXT: gap_table.txt's headline
HPARAMS_GAP = "hparams/gap_same_pred/"  # the prefix of HPARAMS' per-seed gap metrics
REPORT_RUN = "report"  # TEXT: the summary and the whole gap table
SESSION_DESCRIPTION = (
    "This seed's gap (one point per seed run; x: the training step of the evaluated model). "
    "'Ignore outliers in chart scaling' (on by default) can leave the highest and lowest seed "
    "off a chart of 3 or more seeds: HPARAMS' table has every seed's value.")


def board(workdir: str, labels: Sequence[int | str]) -> SweepWriter:
    """The writer of a workdir's board, <workdir>/tensorboard, with a seed_<label> run per member
    (`labels`: the members' run labels, in the order of their values)."""
    return SweepWriter(os.path.join(workdir, LOGDIR), labels)


def write_scalars(writer: SweepWriter, step: int,
                  groups: Mapping[str, Mapping[str, ArrayLike]],
                  healthy: ArrayLike | None = None) -> None:
    """Per-member values ({group: {name: [M]}}, a group per stage or kind) as tags
    <group>/<name> at `step`, in each seed_<label> run and aggregated over the `healthy`
    members in mean/min/max (train/loss, eval/<split>/acc, wen/..., induction/...)."""
    writer.scalars(step, {f"{group}/{name}": v for group, values in groups.items()
                          for name, v in values.items()}, healthy=healthy)


def write_figure(writer: SweepWriter, tag: str, image: Any) -> None:
    """A figure (a matplotlib Figure or its pixels) under IMAGES, tag `tag`, run images."""
    writer.image(tag, image)


def headline_tag(i: int, method: str, site: str, size: int, split: str) -> str:
    """Headline/<i>_<method>_<site>[_<size>]/gap_<split>: the card of the i-th headline proxy
    (tags then sort in the configured order) on `split`, its site as gap_table.txt's headline
    names it (the last part of each joined site: one site per method, so no two share a name).
    Short, because Time Series cuts a long card title in its middle."""
    short = "+".join(part.split(".")[-1] for part in site.split("+"))
    return f"{HEADLINE}/{i}_{method}_{short}" + (f"_{size}" if size else "") + f"/gap_{split}"


def write_headline(writer: SweepWriter, tag: str, split: str, step: int, gap: float,
                   description: str) -> None:
    """One Headline card's point: the gap at `step` (the training step of the evaluated model),
    in run split/<split> (a run per split: each keeps one colour in every card)."""
    writer.curve(f"split/{split}", tag, [step], [gap], description)


def write_report(writer: SweepWriter, summary: str, text: str, step: int = 0) -> None:
    """TEXT tab, run `report`: the summary (SUMMARY_TAG) and the whole table (tag gap_table),
    as fixed-width blocks."""
    def block(t: str) -> str:  # markdown: an indented block keeps the columns
        return "\n".join("    " + line for line in t.splitlines())

    writer.text(REPORT_RUN, SUMMARY_TAG, block(summary), step)
    writer.text(REPORT_RUN, "gap_table", block(text), step)


def gap_metric(method: str, site: str, size: int, split: str) -> str:
    """HPARAMS' tag of a seed's gap: hparams/gap_same_pred/<method>_<size>/<site>/<split>
    (data-independent proxies: hparams/gap_same_pred/<method>/<split>)."""
    label = method if size == 0 else f"{method}_{size}/{site}"
    return f"{HPARAMS_GAP}{label}/{split}"


@dataclasses.dataclass(frozen=True)
class Session:
    """One member's HPARAMS session: its run label, hyper-parameters and metrics ({tag: value});
    `names`: {metric tag: column title}, every tag the experiment lists, in HPARAMS' order;
    `varying`: the hyper-parameters that differ between sessions."""

    label: int | str
    hparams: Mapping[str, Any]
    metrics: Mapping[str, float]
    names: Mapping[str, str]
    varying: Sequence[str]


def write_session(writer: SweepWriter, session: Session, step: int = 0) -> None:
    """A member's HPARAMS session in its run seed_<label>, its metrics' scalars at `step`."""
    writer.hparams(session.hparams, session.metrics, run=f"seed_{session.label}",
                   metric_tags=list(session.names), varying=session.varying, step=step,
                   display_names=session.names, description=SESSION_DESCRIPTION)


def _scalar_metadata(description: str) -> Any:
    """A scalar's metadata with a description (markdown, shown with its card). Named as the
    scalars plugin's, as TensorBoard's own scalar summaries are: TensorBoard's event readers
    warn about metadata that names no plugin."""
    from tensorboardX.proto.summary_pb2 import SummaryMetadata

    return SummaryMetadata(summary_description=description,
                           plugin_data=SummaryMetadata.PluginData(plugin_name="scalars"))


def _image_array(image: Any) -> np.ndarray:
    if hasattr(image, "savefig"):  # matplotlib Figure; savefig works with any backend/canvas
        from PIL import Image

        buf = io.BytesIO()
        image.savefig(buf, format="png")
        buf.seek(0)
        return np.asarray(Image.open(buf).convert("RGB"))
    arr = np.asarray(image)
    if arr.ndim == 3 and arr.shape[2] == 1:
        arr = arr[..., 0]
    if not (arr.ndim == 2 or (arr.ndim == 3 and arr.shape[2] in (3, 4))):
        raise ValueError(f"expected an image [H, W] or [H, W, 1|3|4], got shape {arr.shape}")
    if arr.dtype != np.uint8:
        arr = np.round(np.clip(np.nan_to_num(arr.astype(np.float64)), 0, 1) * 255).astype(np.uint8)
    return np.ascontiguousarray(arr)


def _hparam_value(v: Any) -> bool | int | float | str:
    """Leaf -> bool/int/float/str (what the hparams plugin accepts); anything else -> str."""
    if getattr(v, "ndim", None) == 0 and hasattr(v, "item"):  # numpy / jax scalars
        v = v.item()
    if isinstance(v, bool | str):
        return v
    if isinstance(v, int):
        return int(v)
    if isinstance(v, float):
        return float(v)
    return str(v)


def flatten_config(config: Any) -> dict[str, Any]:
    """ConfigDict or nested mapping -> {"model.d_model": 64, ...} with bool/int/float/str leaves."""
    out: dict[str, Any] = {}

    def visit(node: Any, prefix: str) -> None:
        if hasattr(node, "to_dict"):  # ConfigDict / FrozenConfigDict (resolves field references)
            node = node.to_dict()
        for k, v in node.items():
            if isinstance(v, Mapping) or hasattr(v, "to_dict"):
                visit(v, f"{prefix}{k}.")
            else:
                out[f"{prefix}{k}"] = _hparam_value(v)

    visit(config, "")
    return out


def read_scalars(logdir: str) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """{run: {tag: [(step, value), ...]}} for every run under `logdir` that has scalars."""
    from tensorboard.backend.event_processing import event_accumulator as ea

    logdir = os.fspath(logdir)
    out: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for root, _, files in sorted(os.walk(logdir)):
        if not any("tfevents" in f for f in files):
            continue
        acc = ea.EventAccumulator(root, size_guidance={ea.SCALARS: 0})  # 0 = keep everything
        acc.Reload()
        tags = acc.Tags()[ea.SCALARS]
        if tags:
            run = os.path.relpath(root, logdir).replace(os.sep, "/")
            out[run] = {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in tags}
    return out
