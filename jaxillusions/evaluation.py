"""Evaluation while training: accuracy and loss at the task's evaluated positions per split, and
accuracy by the task's TRAIN_BREAKDOWN (Dyck: closing brackets by depth), batched over seeds."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxillusions import distributed, tasks
from jaxillusions import model as model_lib
from jaxillusions.data import padded_chunks
from jaxillusions.settings import Settings


@functools.partial(jax.jit, static_argnames=("model_cfg", "num_depths"))
def _eval_batch(params, tokens, is_close, depth, *, model_cfg, num_depths: int):
    # (is_close, depth, num_depths: the evaluated positions, their bins and the bin count)
    def one_seed(p):
        logits, _ = model_lib.forward(p, tokens, model_cfg)
        targets = jnp.roll(tokens, -1, axis=1)
        nll = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
        correct = (logits.argmax(-1) == targets) & is_close
        depth_onehot = jax.nn.one_hot(depth, num_depths, dtype=jnp.float32) * is_close[..., None]
        return {
            "correct_by_depth": jnp.einsum("bt,btd->d", correct.astype(jnp.float32),
                                           depth_onehot),
            "nll_sum": (nll * is_close).sum(),
        }

    out = jax.vmap(one_seed)(params)
    out["count_by_depth"] = (jax.nn.one_hot(depth, num_depths) * is_close[..., None]).sum((0, 1))
    return out


def evaluate(params: dict, split, model_cfg: model_lib.ModelConfig, *, batch_size: int,
             num_depths: int, task=None) -> dict[str, np.ndarray]:
    """Accuracy [S] and loss [S] at the evaluated positions of a split (a task split; Dyck:
    closing brackets), and accuracy by the task's TRAIN_BREAKDOWN (Dyck: depth) [S, num_depths]
    as `acc_by_<breakdown>`, with the counts as `count_by_<breakdown>`.

    Bins with no evaluated position are NaN. Chunks over sentences are padded to a fixed batch
    size so the evaluation compiles once per sequence length. `task`: a tasks module (Dyck).
    """
    task = task or tasks.get("dyck")
    breakdown = task.TRAIN_BREAKDOWN
    view = task.view(split)
    bins = np.clip(view.bins[breakdown], 0, None)
    num_seeds = jax.tree.leaves(params)[0].shape[0]
    params = distributed.shard_seeds(params)  # seeds sharded over the devices (padded)
    totals = None
    for chunk in padded_chunks([view.tokens, view.evaluated, bins], batch_size):
        out = _eval_batch(params, *chunk, model_cfg=model_cfg, num_depths=num_depths)
        out = distributed.to_host(out)  # summed on the host: no jit(add) per shape
        totals = out if totals is None else jax.tree.map(np.add, totals, out)
    count, correct = totals["count_by_depth"], totals["correct_by_depth"][:num_seeds]
    with np.errstate(invalid="ignore", divide="ignore"):
        return {
            "acc": correct.sum(-1) / count.sum(),
            "loss": totals["nll_sum"][:num_seeds] / count.sum(),
            f"acc_by_{breakdown}": correct / count,
            f"count_by_{breakdown}": count,
        }


def evaluate_splits(params, splits, model_cfg: model_lib.ModelConfig,
                    settings: Settings) -> dict[str, dict[str, np.ndarray]]:
    task = tasks.get(settings.task)
    return {name: evaluate(params, split, model_cfg, batch_size=settings.train.eval_batch_size,
                           num_depths=task.train_num_bins(settings), task=task)
            for name, split in splits.items() if len(split.tokens)}  # (empty: none to score)


def log(writer, step: int, results: dict, healthy: np.ndarray, task) -> None:
    """eval/<split>/{acc,loss} and eval_by_<b>/<split>/<bin label> (Dyck: .../depth_03)."""
    b = task.TRAIN_BREAKDOWN
    labels = task.bin_labels(b)
    scalars = {}
    for split, res in results.items():
        scalars[f"eval/{split}/acc"] = res["acc"]
        scalars[f"eval/{split}/loss"] = res["loss"]
        for i, acc in enumerate(res[f"acc_by_{b}"].T):
            if np.isfinite(acc).any():
                name = labels[i] if labels else f"{b}_{i:02d}"
                scalars[f"eval_by_{b}/{split}/{name}"] = acc
    writer.scalars(step, scalars, healthy=healthy)
