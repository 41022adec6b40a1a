"""Evaluation while training: accuracy and loss at the task's evaluated positions per split, and
accuracy by the bins of the task's TRAIN_BREAKDOWN (Dyck: closing brackets by depth), batched
over seeds.

The seeds are evaluated in the chunks that train them (`train.seed_chunk_size`): one chunk's
activations are live at a time, which is what the memory plan (memory.plan) counts. A seed's
numbers come from that seed's forward pass alone and are summed over the sentence batches on the
host in the same order, whatever the chunk.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxillusions import model as model_lib
from jaxillusions import tasks
from jaxillusions.config.settings import Settings
from jaxillusions.runtime import chunks as chunks_lib
from jaxillusions.runtime import distributed, tensorboard


@functools.partial(jax.jit, static_argnames=("model_cfg", "num_bins"))
def _eval_batch(params, tokens, evaluated, bins, readout=None, *, model_cfg, num_bins: int):
    """The sums of K chunks [K, B, T] of rows: tokens, evaluated (the evaluated positions),
    their bins (of num_bins), and readout [K, B, P], the rows' evaluated positions
    (chunks.readout), where the logits are computed (None: at every position). The chunks run
    one after another in the program (chunks.in_turn: a large vocabulary's logits,
    chunks.logit_rows); their sums are added in order."""
    def one_chunk(chunk):
        tokens, evaluated, bins, readout = chunk
        targets = jnp.roll(tokens, -1, axis=1)
        if readout is not None:
            targets, bins = (model_lib.at_positions(a, readout) for a in (targets, bins))
            evaluated = readout >= 0

        def one_seed(p):
            logits, _ = model_lib.forward(p, tokens, model_cfg,
                                          span=model_lib.Span(readout=readout))
            nll = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
            correct = (logits.argmax(-1) == targets) & evaluated
            bin_onehot = jax.nn.one_hot(bins, num_bins, dtype=jnp.float32) * evaluated[..., None]
            return {
                "correct_by_bin": jnp.einsum("bt,btd->d", correct.astype(jnp.float32),
                                             bin_onehot),
                "nll_sum": (nll * evaluated).sum(),
            }

        out = jax.vmap(one_seed)(params)
        out["count_by_bin"] = (jax.nn.one_hot(bins, num_bins) * evaluated[..., None]).sum((0, 1))
        return out

    return chunks_lib.in_turn(lambda chunk: (one_chunk(chunk), None),
                              (tokens, evaluated, bins, readout))[0]


def seed_chunks(params: dict, chunk_size: int = 0) -> list[dict]:
    """The members' params (leading seed axis) in the sequential chunks that training uses
    (distributed.seed_chunks: `chunk_size` seeds, 0: all; the last chunk padded)."""
    num = jax.tree.leaves(params)[0].shape[0]
    return [jax.tree.map(lambda x, i=index: x[i], params)
            for index in distributed.seed_chunks(num, chunk_size)]


def evaluate(chunks: Sequence[dict], split, model_cfg: model_lib.ModelConfig, *,
             num_seeds: int, batch_size: int, num_bins: int, task=None,
             readout: bool = True) -> dict[str, np.ndarray]:
    """Accuracy [S] and loss [S] at the evaluated positions of a split (a task split; Dyck:
    closing brackets), and accuracy by the bins of the task's TRAIN_BREAKDOWN (Dyck: depth)
    [S, num_bins] as `acc_by_<breakdown>`, with the counts as `count_by_<breakdown>`.

    `chunks`: the members' params in chunks of seeds (leading seed axis; `seed_chunks`, or
    train_sweep's placed chunks), evaluated one after the other and joined; the first
    `num_seeds` are kept (a last chunk's padding is dropped). Bins with no evaluated position
    are NaN. Chunks over sentences are padded to a fixed batch size so the evaluation compiles
    once per sequence length and number of read-out positions (and, where a large vocabulary's
    rows run in chunks, per number of chunks a call: _eval_batch). `task`: a tasks module
    (default: tasks.DEFAULT's). `readout`: the logits at the evaluated positions only
    (model.Span; as many per row as the split's most, chunks.readout_width: the Dyck demo's
    rows of 26 tokens 12, of 42 tokens 20), the same numbers within float32 rounding as at
    every position (False), and a split's numbers its own whatever else is evaluated.
    """
    task = task or tasks.get(tasks.DEFAULT)
    breakdown = task.TRAIN_BREAKDOWN
    view = task.view(split)
    bins = np.clip(view.bins[breakdown], 0, None)
    read = chunks_lib.readout_width(view.evaluated) if readout and model_lib.before_readout(
        model_cfg, ()) else 0  # positions per row
    # A large vocabulary's logits and log-softmax: in chunks of the rows that fit, as many
    # chunks a call as batch_size rows allow (chunks.steps), one after another in its scan
    rows = chunks_lib.logit_rows(batch_size, view.tokens.shape[1], model_cfg.vocab_size, 2)
    steps = chunks_lib.steps(len(view.tokens), rows, batch_size)
    sums = []  # per chunk: {correct_by_bin [W, B], nll_sum [W], count_by_bin [B]}
    for params in chunks:
        width = jax.tree.leaves(params)[0].shape[0]
        params = distributed.shard_seeds(params)  # seeds sharded over the devices (padded)
        totals = None
        for batch in chunks_lib.calls([view.tokens, view.evaluated, bins], steps, rows):
            positions = chunks_lib.readout(batch[1], read) if read else None
            out = _eval_batch(params, *batch, positions, model_cfg=model_cfg,
                              num_bins=num_bins)
            out = distributed.to_host(out)  # summed on the host: no jit(add) per shape
            totals = out if totals is None else jax.tree.map(np.add, totals, out)
        sums.append({k: v if k == "count_by_bin" else v[:width] for k, v in totals.items()})
    count = sums[0]["count_by_bin"]  # of the data: the same in every chunk
    correct, nll = (np.concatenate([t[k] for t in sums])[:num_seeds]
                    for k in ("correct_by_bin", "nll_sum"))
    with np.errstate(invalid="ignore", divide="ignore"):
        return {
            "acc": correct.sum(-1) / count.sum(),
            "loss": nll / count.sum(),
            f"acc_by_{breakdown}": correct / count,
            f"count_by_{breakdown}": count,
        }


def evaluate_splits(chunks: Sequence[dict], num_seeds: int, splits,
                    model_cfg: model_lib.ModelConfig,
                    settings: Settings) -> dict[str, dict[str, np.ndarray]]:
    """`evaluate` of the chunks of seeds on every non-empty split; of the training split, its
    first train.eval_train_sentences sentences when set (the whole of it can be most of the
    evaluation's work: 20,000 sentences against 300 per split in the Dyck demo)."""
    task = tasks.get(settings.task)
    cap = settings.train.eval_train_sentences
    if cap and "train" in splits and len(splits["train"].tokens) > cap:
        splits = {**splits, "train": tasks.subset(splits["train"], np.arange(cap))}
    return {name: evaluate(chunks, split, model_cfg, num_seeds=num_seeds,
                           batch_size=settings.train.eval_batch_size,
                           num_bins=task.train_num_bins(settings.data), task=task)
            for name, split in splits.items() if len(split.tokens)}  # (empty: none to score)


def log(writer, step: int, results: dict, healthy: np.ndarray, task) -> None:
    """eval/<split>/{acc,loss} and eval_by_<b>/<split>/<bin label> (Dyck: .../depth_03)."""
    b = task.TRAIN_BREAKDOWN
    labels = task.bin_labels(b)
    overall, by_bin = {}, {}
    for split, res in results.items():
        overall[f"{split}/acc"] = res["acc"]
        overall[f"{split}/loss"] = res["loss"]
        for i, acc in enumerate(res[f"acc_by_{b}"].T):
            if np.isfinite(acc).any():
                by_bin[f"{split}/{labels[i] if labels else f'{b}_{i:02d}'}"] = acc
    tensorboard.write_scalars(writer, step, {"eval": overall, f"eval_by_{b}": by_bin}, healthy)


def summary_lines(task, results: dict, healthy: np.ndarray, kinds: np.ndarray) -> list[str]:
    """The printed evaluation: per kind of member (kinds [M]: "trained", then train.null's
    kinds), each split's accuracy, mean over its healthy members."""
    lines = []
    for kind in dict.fromkeys(kinds):  # the trained members, then each null kind
        mine = healthy & (kinds == kind)
        who = "seeds" if len(set(kinds)) == 1 else f"{kind} members"
        lines.append(f"  eval {task.EVALUATED} acc (mean over healthy {who}): " + ", ".join(
            f"{k} {np.nanmean(np.where(mine, v['acc'], np.nan)):.3f}" for k, v in results.items()))
    return lines
