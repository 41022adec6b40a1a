"""What one member minimizes and with which optimizer: the next-token loss (on every target or on
closing brackets only), plus the task's contrastive regularizer when train.contrastive_weights is
set (the Dyck task supplies Wen et al.'s), under AdamW with warmup and cosine decay."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import optax

from jaxillusions import model as model_lib
from jaxillusions import tasks
from jaxillusions.config.settings import Settings, Train


@dataclasses.dataclass(frozen=True)
class Objective:
    """Static options of the training objective (a static jit argument).

    loss_on: next-token loss on every non-PAD target, or on closing brackets only (Wen et al.).
    contrastive: add weight * the contrastive regularizer of Wen et al. eq. 22 (the weight is a
    per-member hyper-parameter); prefix_depth: the depth bound of its balanced prefixes;
    brackets: the task's (open ids, close ids) (tasks.dyck.bracket_ids; none: ((), ())).
    """

    loss_on: str = "all"
    contrastive: bool = False
    prefix_depth: int = 0
    # > 0: each training sentence starts at a uniform random position in [0, this], so
    # positions past the training length are trained too (train.max_position_offset).
    max_position_offset: int = 0
    task: str = "dyck"  # whose contrastive_loss the regularizer is
    brackets: tuple[tuple[int, ...], tuple[int, ...]] = ((), ())


def from_settings(settings: Settings) -> Objective:
    """The objective of a run (its keys are checked in settings.py)."""
    tc, task = settings.train, tasks.get(settings.task)
    offset = tc.max_position_offset
    if offset == -1:  # a training input (width - 1 tokens) then reaches the widest split's last
        offset = task.widest_width(settings.data) - task.train_width(settings.data) + 1
    # The contrastive loss is computed whenever weights are given (also for weight 0), so that a
    # member of a weight sweep and the single run with its weight share one code path and equal
    # results.
    brackets = task.bracket_ids(settings.data) if hasattr(task, "bracket_ids") else ((), ())
    if tc.loss_on == "closing" and not brackets[1]:
        raise ValueError(f"train.loss_on='closing': the {settings.task} task has no closing "
                         "brackets; set 'all'")
    return Objective(loss_on=tc.loss_on, contrastive=bool(tc.contrastive_weights),
                     prefix_depth=int(getattr(settings.data, "max_depth", 0)),
                     max_position_offset=offset, task=settings.task, brackets=brackets)


def make_optimizer(train_cfg: Train, frozen: tuple[str, ...] = ()) -> optax.GradientTransformation:
    """AdamW with linear warmup and cosine decay to 10% of the peak rate, over every step after
    the warmup or (train.decay_steps > 0) over the last decay_steps, the rate held at its peak
    until then. The parameters at the '/'-joined paths `frozen` (model.frozen_paths) get zero
    updates (no decay either)."""
    return _optimizer(train_cfg.learning_rate, train_cfg.warmup_steps, train_cfg.num_steps,
                      train_cfg.weight_decay, train_cfg.grad_clip, tuple(frozen),
                      train_cfg.decay_steps)


def learning_rate_schedule(learning_rate: float, warmup_steps: int, num_steps: int,
                           decay_steps: int = 0) -> optax.Schedule:
    """The schedule of `make_optimizer` (decay_steps 0: the cosine over every step after the
    warmup)."""
    if not decay_steps:
        return optax.warmup_cosine_decay_schedule(
            init_value=0.0, peak_value=learning_rate, warmup_steps=warmup_steps,
            decay_steps=max(num_steps, warmup_steps + 1), end_value=0.1 * learning_rate)
    return optax.join_schedules(
        [optax.linear_schedule(0.0, learning_rate, max(warmup_steps, 1)),
         optax.constant_schedule(learning_rate),
         optax.cosine_decay_schedule(learning_rate, decay_steps, alpha=0.1)],
        boundaries=[warmup_steps, num_steps - decay_steps])


@functools.cache
def _optimizer(learning_rate: float, warmup_steps: int, num_steps: int, weight_decay: float,
               grad_clip: float, frozen: tuple[str, ...] = (),
               decay_steps: int = 0) -> optax.GradientTransformation:
    # Cached so equal hyper-parameters give the same object: `tx` is a static jit argument, and a
    # fresh (unhashably different) optimizer would recompile the training step.
    schedule = learning_rate_schedule(learning_rate, warmup_steps, num_steps, decay_steps)
    tx = optax.chain(
        optax.clip_by_global_norm(grad_clip),
        optax.adamw(schedule, b1=0.9, b2=0.98, weight_decay=weight_decay),
    )
    if not frozen:
        return tx

    def labels(params):
        return jax.tree_util.tree_map_with_path(
            lambda path, _: "frozen" if model_lib.path_str(path) in frozen else "train", params)

    return optax.multi_transform({"train": tx, "frozen": optax.set_to_zero()}, labels)


def lm_loss(params: dict, tokens: jax.Array, model_cfg: model_lib.ModelConfig, *,
            closing: tuple[int, ...] = (), position_offset: jax.Array | None = None
            ) -> jax.Array:
    """Mean next-token cross-entropy over all non-PAD targets (`closing`, the close bracket ids
    of loss_on="closing": over the targets that are one of them); position_offset [B]: see
    `model.forward`."""
    return _lm_loss_and_logits(params, tokens, model_cfg, closing, position_offset)[0]


def _lm_loss_and_logits(params, tokens, model_cfg, closing, position_offset=None):
    logits, _ = model_lib.forward(params, tokens[:, :-1], model_cfg,
                                  position_offset=position_offset)
    targets = tokens[:, 1:]
    if closing:
        mask = jnp.isin(targets, jnp.asarray(closing)).astype(logits.dtype)
    else:
        mask = (targets != tasks.PAD).astype(logits.dtype)
    nll = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    return (nll * mask).sum() / jnp.maximum(mask.sum(), 1.0), logits


def objective_loss(params: dict, tokens: jax.Array, key: jax.Array, hparams: dict,
                   model_cfg: model_lib.ModelConfig, objective: Objective) -> jax.Array:
    """The training loss of one member: the LM loss, plus weight * the contrastive term."""
    offset = None
    if objective.max_position_offset > 0:  # static: without offsets no extra random draws
        offset = jax.random.randint(jax.random.fold_in(key, 1), (tokens.shape[0],), 0,
                                    objective.max_position_offset + 1)
    closing = objective.brackets[1] if objective.loss_on == "closing" else ()
    loss, logits = _lm_loss_and_logits(params, tokens, model_cfg, closing, offset)
    if objective.contrastive:
        loss = loss + hparams["contrastive_weight"] * tasks.get(objective.task).contrastive_loss(
            params, tokens[:, :-1], logits, key, model_cfg, objective.brackets,
            objective.prefix_depth)
    return loss
