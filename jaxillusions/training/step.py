"""The training step of a sweep: every member's parameters, optimizer state and RNG carry a
leading seed axis, and one jitted call runs `num_steps` optimizer steps for all of them
(`lax.scan` over a vmapped step; on a CPU, members in cache-sized groups). Each member draws
its own batch inside the step from its own RNG, so the host dispatches one call per logging
interval.

A member whose loss or gradients become non-finite is marked unhealthy: its parameters freeze at
the last finite values and the others train on untouched. An untrained null member (hparams'
null == objective.UNTRAINED, train.null) is kept where it is the same way: its parameters and
optimizer state stay at their initial values, bit for bit. train.train_sweep does not run the
step on them at all: they sit in chunks of their own that `hold_steps` advances (their RNG and
step counter as the step would move them; nothing else moves), so a run's untrained copies cost
no training.

The members' hyper-parameters (train.members' hparams, [S] arrays) reach the step as scalars:
the contrastive weight and the null kind the loss (objective.loss_and_grads), the learning rate
and the weight decay, where they vary, the optimizer's update (objective._member_optimizer).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxillusions import model as model_lib
from jaxillusions.runtime import distributed
from jaxillusions.training.objective import (
    NULL,
    OPTIMIZER_HPARAMS,
    UNTRAINED,
    Objective,
    loss_and_grads,
)

DEFAULT_OBJECTIVE = Objective()  # the next-token loss on every target


@flax.struct.dataclass
class SweepState:
    """Training state; every leaf has a leading seed axis [S, ...]."""

    params: dict
    opt_state: optax.OptState
    rng: jax.Array  # [S, 2] uint32 keys, one data/dropout stream per seed
    step: jax.Array  # [S] int32
    healthy: jax.Array  # [S] bool


def init_state(seeds: Sequence[int], model_cfg: model_lib.ModelConfig,
               tx: optax.GradientTransformation,
               init_scales: Sequence[float] | None = None) -> SweepState:
    """Initial state for each seed; seed s's state depends only on s (not on the other seeds).
    `init_scales` [S] (train.init_scales per member; None: 1): each member's randomly drawn
    parameters (model.random_paths) times its factor, one float32 product each, after the
    draw (so a factor of 1 changes no bit); the optimizer's state (zeros) is unchanged."""
    state = _init_state(jnp.asarray(seeds, jnp.uint32), model_cfg, tx)
    if init_scales is None or np.all(np.asarray(init_scales) == 1):
        return state
    drawn = set(model_lib.random_paths(model_cfg))
    factors = jnp.asarray(init_scales, jnp.float32)
    params = jax.tree_util.tree_map_with_path(
        lambda path, p: p * factors.reshape((-1,) + (1,) * (p.ndim - 1))
        if model_lib.path_str(path) in drawn else p, state.params)
    return state.replace(params=params)


def initial_params(seeds: Sequence[int], model_cfg: model_lib.ModelConfig):
    """Each seed's parameters as init_state draws them, without the optimizer's state: an
    untrained member of `model_cfg` (an imported run's null copies, training/imported.py)."""
    return _initial_params(jnp.asarray(seeds, jnp.uint32), model_cfg)


def _keys(seeds: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(the parameters' keys, the batches' keys) [S, 2] of each seed."""
    return jax.vmap(jax.random.split, out_axes=1)(jax.vmap(jax.random.PRNGKey)(seeds))


def _draw(init_keys: jax.Array, model_cfg):
    return jax.vmap(model_lib.init_params, in_axes=(0, None))(init_keys, model_cfg)


@functools.partial(jax.jit, static_argnums=(1,))
def _initial_params(seeds: jax.Array, model_cfg):
    return _draw(_keys(seeds)[0], model_cfg)


@functools.partial(jax.jit, static_argnums=(1, 2))
def _init_state(seeds: jax.Array, model_cfg, tx) -> SweepState:
    init_keys, data_keys = _keys(seeds)
    params = _draw(init_keys, model_cfg)
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


def _all_finite(tree) -> jax.Array:
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]))


def seed_step(state: SweepState, train_tokens: jax.Array, hparams: dict | None = None, *,
              model_cfg, tx, batch_size: int, objective: Objective = DEFAULT_OBJECTIVE):
    """One optimizer step of ONE member (the state has no seed axis here; hparams holds its
    scalar hyper-parameters). Returns (state, loss)."""
    hparams = hparams or {}
    rng, batch_key = jax.random.split(state.rng)
    idx = jax.random.randint(batch_key, (batch_size,), 0, train_tokens.shape[0])
    # The regularizer's prefixes come from their own stream: batches do not depend on it.
    loss, grads = loss_and_grads(state.params, train_tokens[idx], jax.random.fold_in(batch_key, 1),
                                 hparams, model_cfg, objective)
    # The per-member rate and decay, where they vary (train.members' hparams have them).
    extra = {name: hparams[name] for name in OPTIMIZER_HPARAMS if name in hparams}
    updates, opt_state = tx.update(grads, state.opt_state, state.params, **extra)
    params = optax.apply_updates(state.params, updates)
    healthy = state.healthy & jnp.isfinite(loss) & _all_finite(grads)
    # Freeze a diverged seed at its last finite parameters instead of propagating NaNs, and an
    # untrained null member at its initial ones (static: only runs with null members check).
    moves = healthy & (hparams[NULL] != UNTRAINED) if NULL in hparams else healthy
    keep = functools.partial(jnp.where, moves)
    new = SweepState(
        params=jax.tree.map(keep, params, state.params),
        opt_state=jax.tree.map(keep, opt_state, state.opt_state),
        rng=rng,
        step=state.step + 1,
        healthy=healthy,
    )
    return new, loss


@functools.partial(jax.jit, static_argnames=("num_steps",), donate_argnums=0)
def hold_steps(state: SweepState, num_steps: int) -> SweepState:
    """`num_steps` steps of members the step keeps still (untrained null members), without the
    model: their RNG and step counter move as `seed_step` moves them; parameters, optimizer
    state and health stay (the step keeps an untrained member's; its loss at the initial
    parameters, finite, leaves it healthy)."""
    def split(_, rng):
        return jax.vmap(lambda r: jax.random.split(r)[0])(rng)

    rng = jax.lax.fori_loop(0, num_steps, split, state.rng)
    return state.replace(rng=rng, step=state.step + num_steps)


@functools.partial(jax.jit, static_argnames=("num_steps", "model_cfg", "tx", "batch_size",
                                             "objective"), donate_argnums=0)
def train_steps(state: SweepState, train_tokens: jax.Array, hparams: dict | None = None, *,
                num_steps: int, model_cfg, tx, batch_size: int,
                objective: Objective = DEFAULT_OBJECTIVE) -> tuple[SweepState, jax.Array]:
    """`num_steps` steps for all members in one call. `hparams` maps names to per-member
    arrays [S] (Members.hparams). Returns (state, losses [num_steps, S]).

    On a CPU, members whose activations outgrow the cache run in groups (`num_groups`), each
    group all `num_steps` steps, one group after the other: 1.1-1.6x the rate of all members at
    once at 32 seeds (docs/speed.md). A group's batched kernels round like those of a run of
    that many members (the last bits can differ from one group of all members).

    Over several devices each trains its own block of the seed axis (`shard_map`): nothing
    in a step depends on another device's members, so no device waits on another. (Under
    jit's partitioner alone, a packed batch's second pass, a `while_loop` whose condition
    asks whether any member needs it, became an all-reduce over the devices twice a step.)
    The state and hparams must then be laid out over `distributed.mesh()`
    (`place_on_devices`), or be host arrays."""
    hparams = hparams or {}
    num = state.healthy.shape[0]
    groups = train_groups(num, model_cfg, batch_size, train_tokens.shape[1], objective)
    run = functools.partial(
        _train_members, groups=groups, alone=num == 1, one_per_group=groups == num,
        num_steps=num_steps,
        one_seed=functools.partial(seed_step, model_cfg=model_cfg, tx=tx,
                                   batch_size=batch_size, objective=objective))
    if seed_shards(num) == 1:
        return run(state, train_tokens, hparams)
    spec = jax.sharding.PartitionSpec
    # check_vma off: objective.pack's loop starts a carry replicated and ends it per member,
    # which the check rejects.
    return jax.shard_map(run, mesh=distributed.mesh(),
                         in_specs=(spec(distributed.AXIS), spec(), spec(distributed.AXIS)),
                         out_specs=(spec(distributed.AXIS), spec(None, distributed.AXIS)),
                         check_vma=False)(state, train_tokens, hparams)


def _train_members(state: SweepState, train_tokens: jax.Array, hparams: dict, *, groups: int,
                   alone: bool, one_per_group: bool, num_steps: int, one_seed
                   ) -> tuple[SweepState, jax.Array]:
    """train_steps' work on the members of `state` (all of them, or one device's block), in
    `groups` groups of the whole seed axis (num_groups spreads each group evenly over the
    devices, so a device's block splits into as many). The plain step of a seed alone where
    the whole axis is one member (`alone`) or each of its groups is (`one_per_group`: one
    device); a device's block or group of one member of a wider group keeps the batched
    step, as that group computes it."""
    def member(m):  # every step of one member, without a seed axis
        member_state, member_hparams = m
        return jax.lax.scan(lambda s, _: one_seed(s, train_tokens, member_hparams),
                            member_state, None, length=num_steps)

    num = state.healthy.shape[0]
    # One member at a time (one seed, or groups of one): the plain step, since vmap over a
    # size-1 axis still emits batched ops, which XLA:CPU runs slower (docs/speed.md).
    if alone:
        state, losses = member(jax.tree.map(lambda x: x[0], (state, hparams)))
        return jax.tree.map(lambda x: x[None], state), losses[:, None]
    if one_per_group:
        state, losses = jax.lax.map(member, (state, hparams))
        return state, losses.T
    step = jax.vmap(one_seed, in_axes=(0, None, 0))

    def run(members):  # every step of the members of one group
        group_state, group_hparams = members
        return jax.lax.scan(lambda s, _: step(s, train_tokens, group_hparams), group_state,
                            None, length=num_steps)

    if groups == 1:
        return run((state, hparams))
    # Member m is in group m % groups, so that a seed axis sharded over the devices in
    # contiguous blocks keeps every group spread evenly over them.
    split = jax.tree.map(lambda x: jnp.moveaxis(x.reshape((-1, groups) + x.shape[1:]), 1, 0),
                         (state, hparams))
    state, losses = jax.lax.map(run, split)  # [groups, num / groups, ...], [groups, steps, .]
    state = jax.tree.map(lambda x: jnp.moveaxis(x, 0, 1).reshape((num,) + x.shape[2:]), state)
    return state, jnp.moveaxis(losses, 0, 2).reshape(num_steps, num)


# The activations a CPU device keeps in flight at once: members train in groups whose largest
# activations (member_bytes) add up to at most this, a group after the other, so that a step's
# working set stays in the cache (measured on a 2-core AMD EPYC with 32 MiB of L3: docs/speed.md,
# "Seeds in cache-sized groups": 4 members of 2 MiB and 2 of 5 MiB per group ran fastest; on an
# Intel Xeon with 300 MiB of L3, larger groups ran slower too).
# GPUs run every member at once.
CPU_GROUP_BYTES = 12 * 2**20


def member_bytes(model_cfg, rows: int, width: int) -> int:
    """Bytes of one member's largest activation in a training step: the MLP's hidden layer,
    the residual stream or the attention pattern, float32, over `rows` rows of `width`
    tokens."""
    widest = max(model_cfg.d_model, 0 if model_cfg.attn_only else model_cfg.d_mlp,
                 model_cfg.n_heads * width)
    return 4 * rows * width * widest


def seed_shards(num: int) -> int:
    """How many devices `train_steps` splits `num` members over, each device a block of the
    seed axis of its own: every device when they divide `num`, else 1 (one program over all
    members). XLA's analysis of the compiled step (cost, memory) is of one such block."""
    devices = jax.device_count()
    return 1 if num == 1 or num % devices else devices


def train_groups(num: int, model_cfg, batch_size: int, width: int,
                 objective: Objective = DEFAULT_OBJECTIVE) -> int:
    """How many groups `train_steps` runs `num` members of `model_cfg` in, at `batch_size`
    sentences of `width` tokens (num_groups of member_bytes): a member's pass runs the rows its
    batch is packed into (objective.packed_rows), else one row per sentence."""
    return num_groups(num, member_bytes(model_cfg, objective.packed_rows or batch_size, width))


def num_groups(num: int, one_member: int) -> int:
    """How many groups `train_steps` splits `num` members into, one after the other: on a CPU,
    the fewest whose members per device take at most CPU_GROUP_BYTES (one member at least),
    each group holding the same number of members of every device; elsewhere one. Grouping
    changes the order of the work, not what a member computes."""
    if jax.default_backend() != "cpu" or num == 1:
        return 1
    devices = seed_shards(num)
    per_device = max(1, CPU_GROUP_BYTES // max(one_member, 1))
    return next(g for g in range(1, num + 1)
                if num % g == 0 and (num // g) % devices == 0 and num // g <= per_device * devices)
