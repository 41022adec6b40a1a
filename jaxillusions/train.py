"""Sweep training: every seed's parameters, optimizer state and RNG carry a leading seed axis.

One jitted call runs `steps` optimizer steps for all seeds at once (`lax.scan` over a vmapped
step). The training tokens live on the device and each seed draws its own batch inside the step
from its own RNG, so the host only dispatches one call per logging interval.

A seed whose loss or gradients become non-finite is marked unhealthy: its parameters freeze at the
last finite values, it is excluded from aggregates, and the other seeds train on untouched.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Sequence

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxillusions import distributed, memory, tasks
from jaxillusions import model as model_lib
from jaxillusions.data import dyck, padded_chunks


@flax.struct.dataclass
class SweepState:
    """Training state; every leaf has a leading seed axis [S, ...]."""

    params: dict
    opt_state: optax.OptState
    rng: jax.Array  # [S, 2] uint32 keys, one data/dropout stream per seed
    step: jax.Array  # [S] int32
    healthy: jax.Array  # [S] bool


def make_optimizer(train_cfg, frozen: tuple[str, ...] = ()) -> optax.GradientTransformation:
    """AdamW with linear warmup and cosine decay to 10% of the peak rate. The parameters at the
    '/'-joined paths `frozen` (model.frozen_paths) get zero updates (no decay either)."""
    return _optimizer(train_cfg.learning_rate, train_cfg.warmup_steps, train_cfg.num_steps,
                      train_cfg.weight_decay, train_cfg.grad_clip, tuple(frozen))


@functools.cache
def _optimizer(learning_rate: float, warmup_steps: int, num_steps: int, weight_decay: float,
               grad_clip: float, frozen: tuple[str, ...] = ()) -> optax.GradientTransformation:
    # Cached so equal hyper-parameters give the same object: `tx` is a static jit argument, and a
    # fresh (unhashably different) optimizer would recompile the training step.
    schedule = optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=learning_rate,
        warmup_steps=warmup_steps,
        decay_steps=max(num_steps, warmup_steps + 1),
        end_value=0.1 * learning_rate,
    )
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


def seed_list(config) -> np.ndarray:
    """The sweep's seeds: config.seed, config.seed + 1, ..., num_seeds of them."""
    return config.seed + np.arange(config.train.num_seeds)


def contrastive_weights(config) -> tuple[float, ...]:
    """The swept contrastive-regularization weights (train.contrastive_weights; () -> (0,))."""
    return tuple(float(w) for w in config.train.get("contrastive_weights", ())) or (0.0,)


@dataclasses.dataclass(frozen=True)
class Members:
    """The sweep's members: every (hyper-parameter, seed) pair, hyper-parameters major.

    The same seeds run under every weight (same init, same batches), so comparisons across
    weights are paired. With one weight the members are just the seeds.
    """

    seeds: np.ndarray  # [M] the seed of each member
    hparams: dict[str, np.ndarray]  # {"contrastive_weight": [M] float32}
    labels: list  # [M] TensorBoard run labels: the seed, or "<seed>_cw<weight>"


def members(config, seeds=None) -> Members:
    seeds = np.asarray(seed_list(config) if seeds is None else seeds)
    weights = contrastive_weights(config)
    labels = ([int(s) for s in seeds] if len(weights) == 1 else
              [f"{int(s)}_cw{w:g}" for w in weights for s in seeds])
    return Members(seeds=np.tile(seeds, len(weights)),
                   hparams={"contrastive_weight": np.repeat(np.asarray(weights, np.float32),
                                                            len(seeds))},
                   labels=labels)


LOSS_ON = ("all", "closing")


@dataclasses.dataclass(frozen=True)
class Objective:
    """Static options of the training objective (a static jit argument).

    loss_on: next-token loss on every non-PAD target, or on closing brackets only (Wen et al.).
    contrastive: add weight * the contrastive regularizer of Wen et al. eq. 22 (the weight is a
    per-member hyper-parameter); prefix_depth: the depth bound of its balanced prefixes.
    """

    loss_on: str = "all"
    contrastive: bool = False
    prefix_depth: int = 0
    # > 0: each training sentence starts at a uniform random position in [0, this], so
    # positions past the training length are trained too (train.max_position_offset).
    max_position_offset: int = 0


def objective_from_config(config) -> Objective:
    tc = config.train
    loss_on = tc.get("loss_on", "all")
    if loss_on not in LOSS_ON:
        raise ValueError(f"train.loss_on={loss_on!r}: expected one of {LOSS_ON}")
    weights = contrastive_weights(config)
    if not all(np.isfinite(w) and w >= 0 for w in weights):
        raise ValueError(f"train.contrastive_weights={weights}: must be finite and >= 0")
    if len(set(weights)) != len(weights):
        raise ValueError(f"train.contrastive_weights={weights}: has repeated values")
    offset = config.train.get("max_position_offset", 0)
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < -1:
        raise ValueError(f"train.max_position_offset={offset!r}: must be -1 (every position "
                         "the `longer` split uses), 0 (off) or a positive integer")
    if offset == -1:  # a training input (width - 1 tokens) then reaches the widest split's last
        task = tasks.get(config)
        offset = task.widest_width(config) - task.train_width(config) + 1
    # The contrastive loss is computed whenever weights are given (also for weight 0), so that a
    # member of a weight sweep and the single run with its weight share one code path and equal
    # results.
    return Objective(loss_on=loss_on, contrastive=bool(config.train.get("contrastive_weights")),
                     prefix_depth=int(config.data.get("max_depth", 0)),
                     max_position_offset=offset)


def init_state(seeds: Sequence[int], model_cfg: model_lib.ModelConfig,
               tx: optax.GradientTransformation) -> SweepState:
    """Initial state for each seed; seed s's state depends only on s (not on the other seeds)."""
    return _init_state(jnp.asarray(seeds, jnp.uint32), model_cfg, tx)


@functools.partial(jax.jit, static_argnums=(1, 2))
def _init_state(seeds: jax.Array, model_cfg, tx) -> SweepState:
    keys = jax.vmap(jax.random.PRNGKey)(seeds)
    init_keys, data_keys = jax.vmap(jax.random.split, out_axes=1)(keys)
    params = jax.vmap(model_lib.init_params, in_axes=(0, None))(init_keys, model_cfg)
    return SweepState(
        params=params,
        opt_state=jax.vmap(tx.init)(params),
        rng=data_keys,
        step=jnp.zeros(len(seeds), jnp.int32),
        healthy=jnp.ones(len(seeds), bool),
    )


def place_on_devices(state: SweepState, hparams: dict, train_tokens: np.ndarray,
                     chunks: Sequence[np.ndarray]) -> tuple[list, jax.Array]:
    """Each chunk's members (distributed.seed_chunks: indices into the host state's seed axis)
    as (state, hparams) with the seed axis sharded over the mesh of all devices, and the tokens
    on every device. jit then runs each device's seeds where they live: the same config runs
    on 1 CPU, 8 GPUs or several hosts. Padding members are copies of the last member."""
    placed = [distributed.shard_seeds(jax.tree.map(lambda x, i=index: np.asarray(x)[i],
                                                   (state, hparams)))
              for index in chunks]
    return placed, distributed.replicate(train_tokens)


def lm_loss(params: dict, tokens: jax.Array, model_cfg: model_lib.ModelConfig, *,
            loss_on: str = "all", position_offset: jax.Array | None = None) -> jax.Array:
    """Mean next-token cross-entropy over all non-PAD targets (loss_on="closing": over the
    targets that are closing brackets); position_offset [B]: see `model.forward`."""
    return _lm_loss_and_logits(params, tokens, model_cfg, loss_on, position_offset)[0]


def _lm_loss_and_logits(params, tokens, model_cfg, loss_on, position_offset=None):
    logits, _ = model_lib.forward(params, tokens[:, :-1], model_cfg,
                                  position_offset=position_offset)
    targets = tokens[:, 1:]
    if loss_on == "closing":
        mask = jnp.isin(targets, jnp.asarray(model_cfg.close_ids)).astype(logits.dtype)
    else:
        mask = (targets != tasks.PAD).astype(logits.dtype)
    nll = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    return (nll * mask).sum() / jnp.maximum(mask.sum(), 1.0), logits


def contrastive_prefixes(key: jax.Array, batch: int, model_cfg: model_lib.ModelConfig,
                         max_depth: int) -> tuple[jax.Array, jax.Array]:
    """Balanced prefixes for the contrastive regularizer: n ~ U{0..D} nested pairs of random
    types, with one extra matched pair of random type inserted at depth j ~ U{0..min(n, D-1)}
    (so no prefix is deeper than D). Returns PAD-padded tokens [batch, 2D+2] and lengths 2n+2."""
    depth = max_depth
    kn, kj, kt, ke = jax.random.split(key, 4)
    n = jax.random.randint(kn, (batch, 1), 0, depth + 1)
    j = jax.random.randint(kj, (batch, 1), 0, jnp.minimum(n, depth - 1) + 1)
    types = jax.random.randint(kt, (batch, depth), 0, len(model_cfg.open_ids))
    extra = jax.random.randint(ke, (batch, 1), 0, len(model_cfg.open_ids))
    p = jnp.arange(2 * depth + 2)[None]
    # Layout: open types[0..j-1] | open extra | close extra | open types[j..n-1] | closes of
    # types[n-1..0].
    before, after = p < j, (p >= j + 2) & (p <= n + 1)
    closing = (p >= n + 2) & (p <= 2 * n + 1)
    index = jnp.clip(jnp.where(before, p, jnp.where(after, p - 2, 2 * n + 1 - p)), 0, depth - 1)
    t = jnp.where((p == j) | (p == j + 1), extra, jnp.take_along_axis(types, index, 1))
    is_open = before | after | (p == j)
    is_close = closing | (p == j + 1)
    tokens = jnp.where(is_open, jnp.asarray(model_cfg.open_ids)[t],
                       jnp.where(is_close, jnp.asarray(model_cfg.close_ids)[t], dyck.PAD))
    return tokens, 2 * n[:, 0] + 2


def contrastive_loss(params: dict, x: jax.Array, logits_x: jax.Array, key: jax.Array,
                     model_cfg: model_lib.ModelConfig, max_depth: int) -> jax.Array:
    """Wen et al. eq. 22: mean squared error between the logits of x ([B, T], starting with BOS)
    and those of BOS + prefix + x[1:] at the positions of x's tokens (non-PAD, after BOS), per
    logit entry; every row draws its own prefix (contrastive_prefixes)."""
    batch, length = x.shape
    prefix, plen = contrastive_prefixes(key, batch, model_cfg, max_depth)
    pos = jnp.arange(length + prefix.shape[1])[None]
    plen = plen[:, None]
    from_prefix = jnp.take_along_axis(prefix, jnp.clip(pos - 1, 0, prefix.shape[1] - 1), 1)
    from_x = jnp.take_along_axis(x, jnp.clip(pos - plen, 0, length - 1), 1)
    joined = jnp.where(pos == 0, x[:, :1], jnp.where(
        pos <= plen, from_prefix, jnp.where(pos - plen < length, from_x, dyck.PAD)))
    logits_joined, _ = model_lib.forward(params, joined, model_cfg)
    aligned = jnp.take_along_axis(logits_joined, (jnp.arange(length)[None] + plen)[..., None], 1)
    mask = ((x != dyck.PAD) & (jnp.arange(length) > 0)).astype(logits_x.dtype)[..., None]
    sq = ((aligned - logits_x) ** 2 * mask).sum()
    return sq / jnp.maximum(mask.sum() * logits_x.shape[-1], 1.0)


def objective_loss(params: dict, tokens: jax.Array, key: jax.Array, hparams: dict,
                   model_cfg: model_lib.ModelConfig, objective: Objective) -> jax.Array:
    """The training loss of one member: the LM loss, plus weight * the contrastive term."""
    offset = None
    if objective.max_position_offset > 0:  # static: without offsets no extra random draws
        offset = jax.random.randint(jax.random.fold_in(key, 1), (tokens.shape[0],), 0,
                                    objective.max_position_offset + 1)
    loss, logits = _lm_loss_and_logits(params, tokens, model_cfg, objective.loss_on, offset)
    if objective.contrastive:
        loss = loss + hparams["contrastive_weight"] * contrastive_loss(
            params, tokens[:, :-1], logits, key, model_cfg, objective.prefix_depth)
    return loss


def _all_finite(tree) -> jax.Array:
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]))


def seed_step(state: SweepState, train_tokens: jax.Array, hparams: dict | None = None, *,
              model_cfg, tx, batch_size: int, objective: Objective = Objective()):
    """One optimizer step of ONE member (the state has no seed axis here; hparams holds its
    scalar hyper-parameters). Returns (state, loss)."""
    rng, batch_key = jax.random.split(state.rng)
    idx = jax.random.randint(batch_key, (batch_size,), 0, train_tokens.shape[0])
    # The regularizer's prefixes come from their own stream: batches do not depend on it.
    loss, grads = jax.value_and_grad(objective_loss)(
        state.params, train_tokens[idx], jax.random.fold_in(batch_key, 1), hparams or {},
        model_cfg, objective)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    healthy = state.healthy & jnp.isfinite(loss) & _all_finite(grads)
    # Freeze a diverged seed at its last finite parameters instead of propagating NaNs.
    keep = functools.partial(jnp.where, healthy)
    new = SweepState(
        params=jax.tree.map(keep, params, state.params),
        opt_state=jax.tree.map(keep, opt_state, state.opt_state),
        rng=rng,
        step=state.step + 1,
        healthy=healthy,
    )
    return new, loss


@functools.partial(jax.jit, static_argnames=("num_steps", "model_cfg", "tx", "batch_size",
                                             "objective"), donate_argnums=0)
def train_steps(state: SweepState, train_tokens: jax.Array, hparams: dict | None = None, *,
                num_steps: int, model_cfg, tx, batch_size: int,
                objective: Objective = Objective()) -> tuple[SweepState, jax.Array]:
    """`num_steps` steps for all members in one call. `hparams` maps names to per-member
    arrays [S] (Members.hparams). Returns (state, losses [num_steps, S])."""
    one_seed = functools.partial(seed_step, model_cfg=model_cfg, tx=tx, batch_size=batch_size,
                                 objective=objective)
    hparams = hparams or {}
    if state.healthy.shape[0] == 1:
        # vmap over a size-1 axis still emits batched ops, which XLA:CPU runs ~25% slower than
        # the plain step (measured: README "Speed"); one seed needs no vmap.
        hp = jax.tree.map(lambda x: x[0], hparams)
        state, losses = jax.lax.scan(lambda s, _: one_seed(s, train_tokens, hp),
                                     jax.tree.map(lambda x: x[0], state), None, length=num_steps)
        return jax.tree.map(lambda x: x[None], state), losses[:, None]
    step = jax.vmap(one_seed, in_axes=(0, None, 0))
    return jax.lax.scan(lambda s, _: step(s, train_tokens, hparams), state, None,
                        length=num_steps)


# ---------------------------------------------------------------------------------------------
# Evaluation: accuracy at the task's evaluated positions per split and by one breakdown (Dyck:
# closing brackets by depth), batched over seeds.


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
        totals = out if totals is None else jax.tree.map(jnp.add, totals, out)
    totals = distributed.to_host(totals)
    count, correct = totals["count_by_depth"], totals["correct_by_depth"][:num_seeds]
    with np.errstate(invalid="ignore", divide="ignore"):
        return {
            "acc": correct.sum(-1) / count.sum(),
            "loss": totals["nll_sum"][:num_seeds] / count.sum(),
            f"acc_by_{breakdown}": correct / count,
            f"count_by_{breakdown}": count,
        }


# ---------------------------------------------------------------------------------------------
# The sweep driver: data, training of all seeds, periodic evaluation, checkpoints, TensorBoard.

def check_train_config(tc) -> None:
    """One-line errors for training settings that cannot work (before any data or compile)."""
    for key in ("num_seeds", "num_steps", "batch_size", "log_every", "eval_batch_size"):
        if tc[key] < 1:
            raise ValueError(f"train.{key}={tc[key]}: must be >= 1")
    for key in ("eval_every", "checkpoint_every", "warmup_steps"):
        if tc[key] < 0:
            raise ValueError(f"train.{key}={tc[key]}: must be >= 0 (0 disables it)")
    if not tc.learning_rate > 0:
        raise ValueError(f"train.learning_rate={tc.learning_rate}: must be > 0")


def build(config, splits: dict | None = None):
    """Data (the task's splits), model config and optimizer for a config (shared by training
    and the proxy sweep)."""
    check_train_config(config.train)
    if splits is None:
        splits = tasks.get(config).load(config)
    tasks.check_data(config, splits)  # degenerate data is refused before any training
    model_cfg = model_config(config, max(s.tokens.shape[1] for s in splits.values()), splits)
    return splits, model_cfg, make_optimizer(config.train, model_lib.frozen_paths(model_cfg))


def model_config(config, widest_split: int | None = None,
                 splits: dict | None = None) -> model_lib.ModelConfig:
    """The model config; `widest_split`: the longest split's token width and `splits` the data
    (None: from the data config, as validate does before any data exists)."""
    task = tasks.get(config)
    objective = objective_from_config(config)
    if widest_split is None:
        widest_split = task.widest_width(config)
    fields = task.model_fields(config, splits)
    max_len = max([widest_split]
                  # BOS + a contrastive prefix (<= 2D+2 tokens) + a training sentence + EOS
                  + [task.train_width(config) + 2 * fields.get("max_depth", 0) + 2]
                  * objective.contrastive
                  + [config.model.get("max_len", 0)])
    model_cfg = model_lib.ModelConfig.from_config(config.model, max_len=max_len, **fields)
    used = task.train_width(config) - 1 + objective.max_position_offset  # BOS ... EOS-1
    if used > max_len:
        raise ValueError(f"train.max_position_offset={objective.max_position_offset}: training "
                         f"inputs would reach position {used - 1}, but the model has {max_len} "
                         f"positions (at most {max_len - used + objective.max_position_offset})")
    return model_cfg


def evaluate_splits(params, splits, model_cfg, config) -> dict[str, dict[str, np.ndarray]]:
    task = tasks.get(config)
    return {name: evaluate(params, split, model_cfg, batch_size=config.train.eval_batch_size,
                           num_depths=task.train_num_bins(config), task=task)
            for name, split in splits.items() if len(split.tokens)}  # (empty: none to score)


def _format_eta(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}"


def _log_eval(writer, step: int, results: dict, healthy: np.ndarray, task) -> None:
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


def claim_workdir(workdir: str, config, record: bool = True) -> list[str]:
    """checkpoint.claim_workdir with validate's analysis keys and defaults, in process 0 (the
    notes of a changed analysis setting; none in the other processes). `record=False`: check
    only, write nothing (before the data has loaded)."""
    from jaxillusions import checkpoint as ckpt_lib  # noqa: PLC0415 - keeps orbax off pure use
    from jaxillusions import validate  # noqa: PLC0415

    return distributed.on_main(lambda: ckpt_lib.claim_workdir(
        workdir, config, validate.is_analysis_key, validate.DEFAULTS, record),
        "checking the workdir") or []


def _next_stop(step: int, end: int, tc) -> int:
    """The next step at which training pauses: `end` or the next log, eval or checkpoint step."""
    return min([end] + [step - step % every + every for every in
                        (tc.log_every, tc.eval_every, tc.checkpoint_every) if every > 0])


def _stop_if_all_diverged(healthy: np.ndarray, step: int) -> None:
    from jaxillusions import interrupt  # noqa: PLC0415

    if not healthy.any():
        raise interrupt.Stopped(
            f"all {len(healthy)} seeds diverged (non-finite loss or gradients) by step {step}; "
            "stopped there (lower train.learning_rate or raise train.warmup_steps)")


def train_sweep(config, workdir: str | None = None, *, splits=None, seeds=None,
                stop_at_step: int | None = None, verbose: bool = True,
                start_over: bool = False):
    """Trains every seed of the sweep together; resumes from `workdir` if it has checkpoints.

    Returns (state, eval_results): the final state as numpy arrays with a leading member axis
    (no padding), and eval_results[split] with per-member arrays (see `evaluate`).
    `stop_at_step` ends early (as an interrupted run would), for tests.
    `start_over`: if the workdir has checkpoints and none of them can be restored, move them
    aside and train from step 0 (otherwise that is an error).

    The members are sharded over all devices (of all processes, see distributed.py), padded to
    a multiple of the device count, and trained in sequential chunks of
    `train.seed_chunk_size` members (0: all at once) to bound device memory. Padding never
    reaches results, logs, health reports or checkpoints; with several processes, process 0
    writes the files.

    Raises interrupt.Stopped when every seed has diverged, or after a SIGTERM/SIGINT (under
    interrupt.catch_signals), having saved a checkpoint at the step reached.
    """
    from jaxillusions import checkpoint as ckpt_lib  # noqa: PLC0415 - keeps orbax off pure use
    from jaxillusions import interrupt  # noqa: PLC0415
    from jaxillusions import logging as log_lib  # noqa: PLC0415

    tc, task = config.train, tasks.get(config)
    say = print if verbose and distributed.is_main() else (lambda *a, **k: None)
    checkpointer = writer = None
    saved_step = None
    if workdir is not None:  # the workdir is checked before any data or compilation,
        claim_workdir(workdir, config, record=False)
    splits, model_cfg, tx = build(config, splits)
    if workdir is not None:  # and claimed once the data has loaded and passed its checks
        for note in claim_workdir(workdir, config):
            say(note)
        checkpointer = ckpt_lib.Checkpointer(f"{workdir}/{ckpt_lib.CHECKPOINT_DIR}")
    objective = objective_from_config(config)
    sweep = members(config, seeds)
    seeds, num = sweep.seeds, len(sweep.seeds)
    chunks = distributed.seed_chunks(num, tc.get("seed_chunk_size", 0))
    state = distributed.to_host(init_state(seeds, model_cfg, tx))

    if workdir is not None:
        saved_step, state = checkpointer.restore_latest(state, start_over=start_over)
        if saved_step is not None:
            say(f"resumed from checkpoint at step {saved_step} in {workdir}")
        if distributed.is_main():
            writer = log_lib.SweepWriter(f"{workdir}/tensorboard", sweep.labels)
            # Events logged after the restored step by the run that was stopped are superseded.
            writer.restart(saved_step or 0, log_lib.SweepWriter.seed_runs(sweep.labels))
    placed, train_tokens = place_on_devices(state, sweep.hparams, splits["train"].tokens, chunks)

    def host_state() -> SweepState:  # every member, no padding, as numpy
        return distributed.concat_host([s for s, _ in placed], num)

    def final_params():  # for evaluation: no host round trip unless padded or chunked
        if len(placed) == 1 and len(chunks[0]) == num:
            return placed[0][0].params
        return distributed.concat_host([s.params for s, _ in placed], num)

    step = int(state.step[0])
    end = tc.num_steps if stop_at_step is None else min(stop_at_step, tc.num_steps)
    layout = (f"{len(chunks)} chunks of {len(chunks[0])} members" if len(chunks) > 1
              else f"{len(chunks[0]) - num} padding members" if len(chunks[0]) > num else "")
    say(f"training {num} members x {tc.num_steps} steps ({model_cfg.n_layers} layers, "
        f"d_model {model_cfg.d_model}) on {jax.device_count()} {jax.default_backend()} device(s)"
        + (f" in {jax.process_count()} processes" if jax.process_count() > 1 else "")
        + (f" ({layout})" if layout else ""))
    if step < end:  # compiles the first call's step (jit keeps it) and reads its memory use
        say(memory.describe(memory.estimate(
            train_steps, placed[0][0], train_tokens, placed[0][1], num_chunks=len(chunks),
            num_steps=_next_stop(step, end, tc) - step, model_cfg=model_cfg, tx=tx,
            batch_size=tc.batch_size, objective=objective)))
    reported_unhealthy: set[int] = set()
    start_time, start_step = time.perf_counter(), step
    results = None
    try:
        _stop_if_all_diverged(state.healthy, step)
        while step < end:
            steps = _next_stop(step, end, tc) - step
            losses = []
            for k, (chunk_state, chunk_hparams) in enumerate(placed):  # sequential chunks
                chunk_state, chunk_losses = train_steps(
                    chunk_state, train_tokens, chunk_hparams, num_steps=steps,
                    model_cfg=model_cfg, tx=tx, batch_size=tc.batch_size, objective=objective)
                placed[k] = (chunk_state, chunk_hparams)
                losses.append(chunk_losses)
            step += steps
            losses = np.concatenate([distributed.to_host(x) for x in losses], axis=1)[:, :num]
            healthy = distributed.concat_host([s.healthy for s, _ in placed], num)
            for i in np.flatnonzero(~healthy):
                if i not in reported_unhealthy:
                    reported_unhealthy.add(i)
                    say(f"WARNING: seed {sweep.labels[i]} diverged (non-finite loss or "
                        f"gradients) by step {step}; its parameters are frozen and it is "
                        "excluded from aggregates")
            _stop_if_all_diverged(healthy, step)
            last = np.where(healthy, losses[-1], np.nan)
            if writer is not None:
                writer.scalars(step, {"train/loss": losses[-1]}, healthy=healthy)
            if step % tc.log_every == 0 or step == end:
                rate = (step - start_step) / (time.perf_counter() - start_time)
                say(f"step {step:>6}/{tc.num_steps} | loss {np.nanmean(last):.4f} "
                    f"(min {np.nanmin(last):.4f}) | {num} seeds | {rate:.1f} steps/s | "
                    f"ETA {_format_eta((end - step) / rate)}", flush=True)
            if (tc.eval_every > 0 and step % tc.eval_every == 0) or step == tc.num_steps:
                results = evaluate_splits(final_params(), splits, model_cfg, config)
                say(f"  eval {task.EVALUATED} acc (mean over healthy seeds): " + ", ".join(
                    f"{k} {np.nanmean(np.where(healthy, v['acc'], np.nan)):.3f}"
                    for k, v in results.items()))
                if writer is not None:
                    _log_eval(writer, step, results, healthy, task)
            # Every process stops at the same step, if any of them received a signal.
            signum = distributed.max_over_processes(interrupt.requested() or 0)
            stopping = signum > 0
            if checkpointer is not None and saved_step != step and (
                    (tc.checkpoint_every > 0 and step % tc.checkpoint_every == 0)
                    or step == end or stopping):
                if writer is not None:
                    writer.flush()  # TensorBoard on disk is never behind the newest checkpoint
                checkpointer.save(step, host_state())
                saved_step = step
            if stopping:
                interrupt.raise_if_requested(
                    f"at step {step}; " + (f"checkpoint saved in {workdir}/checkpoints, relaunch "
                                           "the same command to resume" if workdir else
                                           "nothing saved (no workdir)"), signum)
        if results is None and step == tc.num_steps:  # resumed a finished run
            results = evaluate_splits(final_params(), splits, model_cfg, config)
        state = host_state()
    except BaseException:
        for closable in (writer, checkpointer):  # the error in flight is the one to report
            try:
                if closable is not None:
                    closable.close()
            except Exception:  # noqa: BLE001, S110
                pass
        raise
    if writer is not None:
        writer.close()
    if checkpointer is not None:
        checkpointer.close()
    return state, results
