"""What one member minimizes and with which optimizer: the next-token loss (on every target or on
the task's closing brackets only), plus the task's contrastive regularizer when
train.contrastive_weights is set (its hooks contrastive_*; the Dyck task supplies Wen et al.'s),
under AdamW with warmup and cosine decay.

Per member (train.members' hparams, vmapped by step.py): the contrastive weight, the peak
learning rate and the weight decay (train.learning_rates, train.weight_decays: `make_optimizer`
gives the extra-args AdamW of `_member_optimizer` when they vary), and the null kind
(train.null): an untrained null member is kept at its initialisation by the step, a shuffled
one trains on `shuffled_targets`.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
from optax._src import numerics

from jaxillusions import model as model_lib
from jaxillusions import tasks
from jaxillusions.config.settings import NULL_KINDS, Settings, Train

NULL = "null"  # the hyper-parameter of the null kind, train.members' code: NULL_KINDS.index(kind)
UNTRAINED, SHUFFLED = NULL_KINDS.index("untrained"), NULL_KINDS.index("shuffled")
# The hyper-parameters the optimizer takes per member (extra arguments of its update), when
# train.members' hparams have them (they vary over the members).
OPTIMIZER_HPARAMS = ("learning_rate", "weight_decay")


@dataclasses.dataclass(frozen=True)
class Objective:
    """Static options of the training objective (a static jit argument).

    loss_on: next-token loss on every non-PAD target, or on closing brackets only (Wen et al.).
    contrastive: add weight * the task's contrastive regularizer (its hook contrastive_loss; the
    Dyck task's is Wen et al. eq. 22; the weight is a per-member hyper-parameter), called with
    contrastive_args (its hook contrastive_args); contrastive_width: the tokens its inputs add
    at most to a training row (its hook contrastive_width); brackets: the task's (open ids,
    close ids) (its hook bracket_ids; none: ((), ())). shuffled: train.null has "shuffled"
    (the members whose hyper-parameter null is SHUFFLED train on `shuffled_targets`).
    """

    loss_on: str = "all"
    contrastive: bool = False
    contrastive_args: tuple = ()
    contrastive_width: int = 0
    # > 0: each training sentence starts at a uniform random position in [0, this], so
    # positions past the training length are trained too (train.max_position_offset).
    max_position_offset: int = 0
    task: str = tasks.DEFAULT  # whose contrastive_loss the regularizer is
    brackets: tuple[tuple[int, ...], tuple[int, ...]] = ((), ())
    shuffled: bool = False
    # > 0: each member's batch packed into this many rows (train.rows_per_sentence;
    # `loss_and_grads`).
    packed_rows: int = 0


def from_settings(settings: Settings) -> Objective:
    """The objective of a run (its keys are checked in settings.py)."""
    tc, task = settings.train, tasks.get(settings.task)
    offset = tc.max_position_offset
    if offset == -1:  # a training input (width - 1 tokens) then reaches the widest split's last
        offset = task.widest_width(settings.data) - task.train_width(settings.data) + 1
    # The contrastive loss is computed whenever weights are given (also for weight 0), so that a
    # member of a weight sweep and the single run with its weight share one code path and equal
    # results.
    brackets = tasks.hook(task, "bracket_ids")(settings.data)
    if tc.loss_on == "closing" and not brackets[1]:
        raise ValueError(f"train.loss_on='closing': the {settings.task} task has no closing "
                         "brackets; set 'all'")
    contrastive = bool(tc.contrastive_weights)
    args, width = ((tasks.hook(task, "contrastive_args")(settings.data),
                    tasks.hook(task, "contrastive_width")(settings.data)) if contrastive
                   else ((), 0))
    return Objective(loss_on=tc.loss_on, contrastive=contrastive, contrastive_args=args,
                     contrastive_width=int(width), max_position_offset=offset,
                     task=settings.task, brackets=brackets, shuffled="shuffled" in tc.null,
                     packed_rows=packed_rows(tc))


def packed_rows(tc: Train) -> int:
    """The rows a member's batch is packed into (train.rows_per_sentence), 0 for unpacked."""
    return 0 if tc.rows_per_sentence == 1 else math.ceil(tc.rows_per_sentence * tc.batch_size)


def learning_rates(tc: Train) -> tuple[float, ...]:
    """The peak learning rates of the members (train.learning_rates; () -> train.learning_rate)."""
    return tuple(float(r) for r in tc.learning_rates) or (tc.learning_rate,)


def weight_decays(tc: Train) -> tuple[float, ...]:
    """The weight decays of the members (train.weight_decays; () -> train.weight_decay)."""
    return tuple(float(d) for d in tc.weight_decays) or (tc.weight_decay,)


def make_optimizer(train_cfg: Train, frozen: tuple[str, ...] = ()) -> optax.GradientTransformation:
    """AdamW with linear warmup and cosine decay to 10% of the peak rate, over every step after
    the warmup or (train.decay_steps > 0) over the last decay_steps, the rate held at its peak
    until then. The parameters at the '/'-joined paths `frozen` (model.frozen_paths) get zero
    updates (no decay either).

    With one learning rate and one weight decay (train.learning_rates and train.weight_decays
    of at most one value), optax's adamw with them; with several, `_member_optimizer`, whose
    update takes each member's (step.py passes train.members' hparams learning_rate and
    weight_decay) and gives a member the bits of a run with its values alone."""
    rates, decays, tc = learning_rates(train_cfg), weight_decays(train_cfg), train_cfg
    if len(rates) == len(decays) == 1:
        return _optimizer(rates[0], tc.warmup_steps, tc.num_steps, decays[0], tc.grad_clip,
                          tuple(frozen), tc.decay_steps)
    return _member_optimizer(rates, tc.warmup_steps, tc.num_steps, decays, tc.grad_clip,
                             tuple(frozen), tc.decay_steps)


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
    return _freeze(tx, frozen)


def _freeze(tx: optax.GradientTransformation,
            frozen: tuple[str, ...]) -> optax.GradientTransformation:
    """`tx`, with zero updates for the parameters at the paths `frozen`."""
    if not frozen:
        return tx

    def labels(params):
        return jax.tree_util.tree_map_with_path(
            lambda path, _: "frozen" if model_lib.path_str(path) in frozen else "train", params)

    return optax.multi_transform({"train": tx, "frozen": optax.set_to_zero()}, labels)


@functools.cache
def _member_optimizer(learning_rates: tuple[float, ...], warmup_steps: int, num_steps: int,
                      weight_decays: tuple[float, ...], grad_clip: float,
                      frozen: tuple[str, ...] = (),
                      decay_steps: int = 0) -> optax.GradientTransformationExtraArgs:
    """`_optimizer`'s AdamW whose update takes a member's peak rate and weight decay as the
    extra arguments `learning_rate` and `weight_decay` (float32 scalars under vmap; one left out:
    the only value of its tuple). Each rate's schedule is computed as `_optimizer` computes it,
    from the same Python constants, and the member's chosen by its value (one of
    `learning_rates` in float32), so that every operation on a member's numbers is the one a run
    with its rate and decay alone does: the same bits where XLA batches the members alike."""
    schedules = tuple((np.float32(rate), learning_rate_schedule(rate, warmup_steps, num_steps,
                                                                decay_steps))
                      for rate in learning_rates)
    tx = optax.chain(
        optax.clip_by_global_norm(grad_clip),
        optax.scale_by_adam(b1=0.9, b2=0.98),  # optax.adamw's, then its decay and rate:
        _member_decay_and_rate(schedules, weight_decays),
    )
    return _freeze(tx, frozen)


def _member_decay_and_rate(schedules: tuple, weight_decays: tuple[float, ...]
                           ) -> optax.GradientTransformationExtraArgs:
    """optax.add_decayed_weights then optax.scale_by_learning_rate(schedule), per member: the
    decay and the peak rate (its schedule of `schedules`) are the extra arguments."""

    def init_fn(params):
        del params
        return optax.ScaleByScheduleState(count=jnp.zeros([], jnp.int32))

    def update_fn(updates, state, params=None, *, learning_rate=None, weight_decay=None,
                  **extra):
        del extra
        if weight_decay is not None:  # a decay of 0 adds nothing, as optax's skips it
            updates = jax.tree.map(lambda g, p: jnp.where(weight_decay == 0, g,
                                                          g + weight_decay * p),
                                   updates, params)
        elif weight_decays[0] != 0.0:
            updates = jax.tree.map(lambda g, p: g + weight_decays[0] * p, updates, params)
        rates = [-1 * schedule(state.count) for _, schedule in schedules]
        step_size = rates[0] if learning_rate is None else jnp.select(
            [learning_rate == value for value, _ in schedules], rates, 0.0)
        updates = jax.tree.map(lambda g: jnp.array(step_size, dtype=g.dtype) * g, updates)
        return updates, optax.ScaleByScheduleState(count=numerics.safe_increment(state.count))

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def lm_loss(params: dict, tokens: jax.Array, model_cfg: model_lib.ModelConfig, *,
            closing: tuple[int, ...] = (), position_offset: jax.Array | None = None
            ) -> jax.Array:
    """Mean next-token cross-entropy over all non-PAD targets (`closing`, the close bracket ids
    of loss_on="closing": over the targets that are one of them); position_offset [B]: see
    `model.forward`."""
    return _lm_loss_and_logits(params, tokens, model_cfg, closing, position_offset)[0]


def _lm_loss_and_logits(params, tokens, model_cfg, closing, position_offset=None,
                        targets=None):
    # targets: the next tokens, tokens[:, 1:], unless given (a shuffled null member's)
    targets = tokens[:, 1:] if targets is None else targets
    mask = scored(targets, closing).astype(jnp.float32)  # the logits' dtype
    total, logits = _nll_sum(params, tokens[:, :-1], targets, mask, model_cfg,
                             position_offset=position_offset)
    return total / jnp.maximum(mask.sum(), 1.0), logits


def _nll_sum(params, inputs, targets, weights, model_cfg, **where):
    """The next-token losses of `inputs` [B, T] against `targets`, weighted and summed, and the
    logits (`where`: model.forward's position offsets and segments)."""
    logits, _ = model_lib.forward(params, inputs, model_cfg, **where)
    nll = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    return (nll * weights).sum(), logits


def _closing(objective: Objective) -> tuple[int, ...]:
    """The targets the loss scores alone: the closing brackets with loss_on="closing", else
    none (every non-PAD target: `scored`)."""
    return objective.brackets[1] if objective.loss_on == "closing" else ()


def scored(targets: jax.Array, closing: tuple[int, ...] = ()) -> jax.Array:
    """Which targets the loss scores: the closing brackets `closing` where given (loss_on=
    "closing"), else every non-PAD one."""
    return jnp.isin(targets, jnp.asarray(closing)) if closing else targets != tasks.PAD


def shuffled_targets(targets: jax.Array, key: jax.Array) -> jax.Array:
    """The targets [B, T] with each row's non-PAD entries in a uniformly random order (argsort
    of one uniform draw per position; `key` gives the draws) and PAD where they were: the j-th
    non-PAD position of a row, in order, gets the target of the j-th non-PAD position in the
    draws' order."""
    live = targets != tasks.PAD
    draws = jax.random.uniform(key, targets.shape)
    # Both orders list the PAD positions last, in order: there they map each PAD to itself.
    order = jnp.argsort(jnp.where(live, draws, 2.0), axis=-1, stable=True)
    slots = jnp.argsort(~live, axis=-1, stable=True)
    rows = jnp.arange(targets.shape[0])[:, None]
    return targets.at[rows, slots].set(jnp.take_along_axis(targets, order, axis=-1))


def _offsets_and_targets(tokens: jax.Array, key: jax.Array, hparams: dict,
                         objective: Objective) -> tuple[jax.Array | None, jax.Array | None]:
    """Each row's random position offset (None without them) and, for a shuffled null member,
    its targets (None: tokens[:, 1:]), drawn from `key` (its batch's)."""
    offset = None
    if objective.max_position_offset > 0:  # static: without offsets no extra random draws
        offset = jax.random.randint(jax.random.fold_in(key, 1), (tokens.shape[0],), 0,
                                    objective.max_position_offset + 1)
    targets = None
    if objective.shuffled:  # static: no draws without shuffled members
        targets = tokens[:, 1:]
        targets = jnp.where(hparams[NULL] == SHUFFLED,
                            shuffled_targets(targets, jax.random.fold_in(key, 2)), targets)
    return offset, targets


def objective_loss(params: dict, tokens: jax.Array, key: jax.Array, hparams: dict,
                   model_cfg: model_lib.ModelConfig, objective: Objective) -> jax.Array:
    """The training loss of one member: the LM loss, plus weight * the contrastive term.

    A shuffled null member (objective.shuffled, hyper-parameter null == SHUFFLED) scores its
    predictions against `shuffled_targets` (its own draw each step: `key` is its batch's), so
    that its inputs are the task's and its targets each row's tokens in a random order; with
    loss_on="closing" the closing brackets among the shuffled targets are scored. The
    contrastive term, of the inputs, is unchanged."""
    offset, targets = _offsets_and_targets(tokens, key, hparams, objective)
    loss, logits = _lm_loss_and_logits(params, tokens, model_cfg, _closing(objective), offset,
                                       targets)
    if objective.contrastive:
        regularizer = tasks.require(tasks.get(objective.task), "contrastive_loss",
                                    "train.contrastive_weights")
        loss = loss + hparams["contrastive_weight"] * regularizer(
            params, tokens[:, :-1], logits, key, model_cfg, *objective.contrastive_args)
    return loss


def loss_and_grads(params: dict, tokens: jax.Array, key: jax.Array, hparams: dict,
                   model_cfg: model_lib.ModelConfig, objective: Objective
                   ) -> tuple[jax.Array, dict]:
    """`objective_loss` of one member's batch and its gradient. With objective.packed_rows, the
    batch is packed (`pack`) and run in passes of that many rows, one unless it does not fit:
    the same loss and gradient up to float32 rounding, from fewer rows."""
    if not objective.packed_rows:
        return jax.value_and_grad(objective_loss)(params, tokens, key, hparams, model_cfg,
                                                  objective)
    offset, targets = _offsets_and_targets(tokens, key, hparams, objective)
    targets = tokens[:, 1:] if targets is None else targets
    mask = scored(targets, _closing(objective))
    offset = jnp.zeros(tokens.shape[0], jnp.int32) if offset is None else offset
    rows = objective.packed_rows
    grid, passes = pack(tokens[:, :-1], targets, mask, offset, rows)
    count = jnp.maximum(mask.sum(), 1).astype(jnp.float32)  # the unpacked loss's denominator

    def pass_loss(p, first):  # the rows first .. first + rows - 1 of the grid
        inputs, goal, weight, at, segments = (jax.lax.dynamic_slice_in_dim(x, first, rows)
                                              for x in grid)
        total, _ = _nll_sum(p, inputs, goal, weight, model_cfg, position_offset=at,
                            segments=segments)
        return total / count

    def one_pass(carry):
        done, loss, grads = carry
        value, grad = jax.value_and_grad(pass_loss)(params, done * rows)
        return done + 1, loss + value, jax.tree.map(jnp.add, grads, grad)

    zero = (jnp.zeros((), jnp.int32), jnp.zeros((), jnp.float32),
            jax.tree.map(jnp.zeros_like, params))
    _, loss, grads = jax.lax.while_loop(lambda carry: carry[0] < passes, one_pass, zero)
    return loss, grads


def pack(inputs: jax.Array, targets: jax.Array, mask: jax.Array, offset: jax.Array, rows: int
         ) -> tuple[tuple[jax.Array, ...], jax.Array]:
    """A batch's sentences side by side in rows of its width: inputs, targets and the loss
    mask ([batch, width]; the mask as float32 weights) and the rows' position offsets
    ([batch]) laid out in a grid of ceil(batch / rows) * rows rows, with each token's position
    offset and segment (its sentence; -1 for none), and the number of passes of `rows` rows
    that hold the used rows.

    A sentence keeps its positions up to its last scored one (the later ones change no loss:
    attention is causal) and goes to the first row with room, the longest first (first-fit
    decreasing); unused rows come last and stay empty (PAD, unscored). model.forward with the
    offsets and segments computes for each sentence what it computes for the sentence alone."""
    batch, width = inputs.shape
    length = jnp.where(mask.any(1), width - jnp.argmax(mask[:, ::-1], axis=1), 0)
    order = jnp.argsort(-length, stable=True)

    def place(i, carry):  # sentence order[i] at the first row it fits in
        fill, row, start = carry
        s = order[i]
        r = jnp.argmax(fill + length[s] <= width)  # there is one: `batch` rows, <= one each
        return fill.at[r].add(length[s]), row.at[s].set(r), start.at[s].set(fill[r])

    zeros = jnp.zeros(batch, jnp.int32)
    fill, row, start = jax.lax.fori_loop(0, batch, place, (zeros, zeros, zeros))
    grid_rows = -(-batch // rows) * rows
    column = jnp.arange(width)
    kept = column[None, :] < length[:, None]
    at = (jnp.where(kept, row[:, None], grid_rows), start[:, None] + column[None, :])

    def lay(values, empty):
        values = jnp.broadcast_to(values, (batch, width))
        return jnp.full((grid_rows, width), empty, values.dtype).at[at].set(values, mode="drop")

    grid = (lay(inputs, tasks.PAD), lay(targets, tasks.PAD), lay(mask.astype(jnp.float32), 0),
            lay((offset - start)[:, None], 0), lay(jnp.arange(batch)[:, None], -1))
    return grid, -(-jnp.sum(fill > 0) // rows)
