"""Per-member hyper-parameters and the null population in the member axis (train.members):
train.learning_rates, weight_decays, init_scales and null."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import checked, tiny_config

from jaxillusions import model as model_lib
from jaxillusions import tasks
from jaxillusions.training import memory, objective, train
from jaxillusions.training.step import init_state, train_steps


def _config(cache_dir, **train_keys):
    config = tiny_config(cache_dir)
    config.train.eval_every = 0  # evaluated once, at the end
    config.train.update(train_keys)
    return config


def _train(config, splits, seeds=None):
    """train_sweep's training on one device, without its evaluation: (members, initial state,
    final state, losses [step, member])."""
    _, model_cfg, tx = train.build(config, splits)
    sweep = train.members(config, seeds)
    start = init_state(sweep.seeds, model_cfg, tx, sweep.values["init_scale"])
    state, losses = train_steps(
        jax.tree.map(jnp.copy, start), splits["train"].tokens, sweep.hparams,
        num_steps=config.train.num_steps, model_cfg=model_cfg, tx=tx,
        batch_size=config.train.batch_size, objective=objective.from_settings(config))
    return sweep, start, state, np.asarray(losses)


def _member(tree, i):
    return [np.asarray(x)[i] for x in jax.tree.leaves(tree)]


def _bits_equal(a, b) -> bool:
    return all(x.dtype == y.dtype and x.tobytes() == y.tobytes() for x, y in zip(a, b, strict=True))


def test_members_order_labels_and_hparams(cache_dir):
    """Null kind major (code order, whatever train.null's), then contrastive weight, learning
    rate, weight decay, init scale, seed minor; hparams name what varies (contrastive_weight
    always) and null; null members keep their twins' values."""
    config = checked(_config(cache_dir, contrastive_weights=(0.0, 0.5), learning_rates=(1e-3, 3e-3),
                             weight_decays=(0.05,), null=("shuffled", "untrained")))
    sweep = train.members(config)
    trained = [f"{s}_cw{w}_lr{r}" for w in ("0", "0.5") for r in ("0.001", "0.003") for s in (0, 1)]
    assert sweep.labels == [*trained, *(f"{t}_untrained" for t in trained),
                            *(f"{t}_shuffled" for t in trained)]
    assert list(sweep.seeds) == [0, 1] * 12
    assert set(sweep.hparams) == {"contrastive_weight", "learning_rate", "null"}
    np.testing.assert_array_equal(sweep.hparams["null"], np.repeat([0, 1, 2], 8))
    np.testing.assert_array_equal(sweep.hparams["contrastive_weight"],
                                  np.tile(np.repeat(np.float32([0, 0.5]), 4), 3))
    np.testing.assert_array_equal(sweep.hparams["learning_rate"],
                                  np.tile(np.repeat(np.float32([1e-3, 3e-3]), 2), 6))
    np.testing.assert_array_equal(sweep.values["weight_decay"], np.full(24, np.float32(0.05)))
    np.testing.assert_array_equal(sweep.values["init_scale"], np.ones(24, np.float32))
    assert list(sweep.kinds()) == ["trained"] * 8 + ["untrained"] * 8 + ["shuffled"] * 8
    assert train.num_members(config.train) == 24
    # Without the new keys, the members and labels of before (only contrastive_weight).
    plain = train.members(checked(_config(cache_dir, contrastive_weights=(0.0, 0.5))))
    assert plain.labels == ["0_cw0", "1_cw0", "0_cw0.5", "1_cw0.5"]
    assert list(plain.hparams) == ["contrastive_weight"]
    alone = train.members(checked(_config(cache_dir, learning_rates=(1e-3,), init_scales=(2.0,))))
    assert alone.labels == [0, 1] and list(alone.hparams) == ["contrastive_weight"]
    assert list(alone.kinds()) == ["trained", "trained"]


@pytest.mark.parametrize("key, value", [
    ("learning_rates", (1e-3, 1e-3)), ("learning_rates", (1e-3, -1e-3)), ("learning_rates", (0.0,)),
    ("weight_decays", (0.1, 0.1)), ("weight_decays", (-0.1,)), ("init_scales", (1.0, 1.0)),
    ("init_scales", (0.0,)), ("null", ("untrained", "untrained")), ("null", ("random",)),
    ("null", ("trained",))])
def test_bad_values_are_one_line_errors_naming_the_key(cache_dir, key, value):
    with pytest.raises(ValueError, match=f"^train.{key}=") as err:
        checked(_config(cache_dir, **{key: value}))
    assert "\n" not in str(err.value)


def test_default_runs_take_the_optimizer_of_before(cache_dir):
    """No list, or lists of one value: optax's adamw with the scalars (the program of a run
    without these keys); several rates or decays: the per-member optimizer."""
    def tx(**keys):
        return objective.make_optimizer(checked(_config(cache_dir, **keys)).train)

    assert tx() is objective._optimizer(3e-3, 5, 20, 0.01, 1.0, (), 0)
    assert tx(learning_rates=(1e-3,), weight_decays=(0.0,)) is objective._optimizer(
        1e-3, 5, 20, 0.0, 1.0, (), 0)
    assert tx(weight_decays=(0.0, 0.1)) is objective._member_optimizer(
        (3e-3,), 5, 20, (0.0, 0.1), 1.0, (), 0)


def test_memory_plan_counts_every_member(cache_dir):
    """The plan's host copy of every member's parameters and moments grows with the product,
    train.num_members (the plan counts them itself: train.py imports memory.py)."""
    def host_bytes(**keys):
        config = checked(_config(cache_dir, **keys))
        terms = memory.plan(config, train.model_config(config), num_devices=1)
        members = dict(next(t for t in terms if "of every member on the host" in t.what).factors)
        assert members["train.num_seeds"] == train.num_members(config.train)
        return members["train.num_seeds"]

    assert host_bytes() == 2
    assert host_bytes(contrastive_weights=(0.0, 1.0), learning_rates=(1e-3, 3e-3),
                      weight_decays=(0.1,), init_scales=(0.5, 1.0, 2.0),
                      null=("untrained", "shuffled")) == 2 * 2 * 2 * 3 * 3


def test_init_scales_multiply_the_drawn_parameters_only(cache_dir):
    config = checked(_config(cache_dir, init_scales=(1.0, 2.0)))
    splits, model_cfg, tx = train.build(config)
    sweep = train.members(config)
    base = init_state(sweep.seeds, model_cfg, tx)
    scaled, _ = train.train_sweep(config, splits=splits, stop_at_step=0, verbose=False)
    drawn = set(model_lib.random_paths(model_cfg))
    assert "blocks/0/attn/w_q" in drawn and "blocks/0/ln1/scale" not in drawn
    assert "blocks/0/attn/b_q" not in drawn  # zeros
    factors = np.float32([1.0, 1.0, 2.0, 2.0])  # init scale major, seed minor
    for (path, b), s in zip(jax.tree_util.tree_leaves_with_path(base.params),
                            jax.tree.leaves(scaled.params), strict=True):
        b, s = np.asarray(b), np.asarray(s)
        if model_lib.path_str(path) in drawn:
            b = b * factors.reshape((-1,) + (1,) * (b.ndim - 1))
        np.testing.assert_array_equal(s, b, err_msg=model_lib.path_str(path))


@pytest.mark.fusion_emitters
def test_a_member_of_a_grid_equals_the_member_trained_alone_and_untrained_ones_stay(cache_dir):
    """Each member of a grid of learning rates x weight decays x init scales (and its untrained
    null copy) gets the bits of a run with its values as the scalar keys: same seed, same
    position in a run of as many members. Same position and count, because XLA:CPU's batched
    step rounds a member's numbers by where it sits in the batch and by the batch's size
    (measured on the tiny model at the suite's optimization level: of 8 seeds, the first two
    differ from a 2-seed run in the last bits, seeds 4 and 5 of 8 do not; a one-member run takes
    the unbatched step, see test_train.py): what the grid changes is only the per-member
    values, computed as the scalar run computes them (objective._member_optimizer), so nothing
    else may differ.

    The untrained null members end at their initialisation, bit for bit (parameters and
    optimizer state), while their trained twins moved."""
    grid = checked(_config(cache_dir, num_seeds=1, learning_rates=(3e-3, 1e-2),
                           weight_decays=(0.0, 0.1), init_scales=(1.0, 2.0), null=("untrained",)))
    splits, _, _ = train.build(grid)
    sweep, start, trained, _ = _train(grid, splits)
    assert len(sweep.seeds) == 16
    kinds = sweep.kinds()
    for rate, decay, scale in ((1e-2, 0.1, 2.0), (3e-3, 0.0, 1.0)):
        alone = checked(_config(cache_dir, num_seeds=1, learning_rate=rate, weight_decay=decay,
                                init_scales=(scale,)))
        _, _, state, _ = _train(alone, splits, seeds=sweep.seeds)
        mine = np.flatnonzero((sweep.values["learning_rate"] == np.float32(rate))
                              & (sweep.values["weight_decay"] == np.float32(decay))
                              & (sweep.values["init_scale"] == np.float32(scale))
                              & (kinds == "trained"))
        assert len(mine) == 1
        for i in mine:
            assert _bits_equal(_member(trained.params, i), _member(state.params, i)), \
                sweep.labels[i]
            assert _bits_equal(_member(trained.opt_state, i), _member(state.opt_state, i))
    for i in range(len(sweep.seeds)):
        same = _bits_equal(_member(trained.params, i), _member(start.params, i))
        assert same == (kinds[i] == "untrained"), sweep.labels[i]
        if kinds[i] == "untrained":
            assert _bits_equal(_member(trained.opt_state, i), _member(start.opt_state, i))
    assert np.asarray(trained.healthy).all()


@pytest.mark.fusion_emitters
def test_train_sweep_holds_untrained_members_without_stepping_them(cache_dir):
    """train_sweep runs no step on untrained null members (chunks of their own, held by
    step.hold_steps): they end at their initial parameters and optimizer state, with the RNG,
    step counter and health the step would have given them (their trained twin's: the RNG's
    course does not depend on the parameters); the trained members get the bits of the same run
    without train.null (same chunk, same positions); the evaluation and the health flags come
    back in the members' order."""
    config = checked(_config(cache_dir, num_seeds=2, learning_rates=(3e-3, 1e-2),
                             null=("untrained",)))
    bare = checked(_config(cache_dir, num_seeds=2, learning_rates=(3e-3, 1e-2)))
    splits, model_cfg, tx = train.build(config)
    sweep = train.members(config)
    chunks, held = train.member_chunks(sweep)
    assert held == [False, True]
    assert [list(c) for c in chunks] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    state, results = train.train_sweep(config, splits=splits, verbose=False)
    alone, alone_results = train.train_sweep(bare, splits=splits, verbose=False)
    start = init_state(sweep.seeds, model_cfg, tx, sweep.values["init_scale"])
    kinds = sweep.kinds()
    assert list(kinds) == ["trained"] * 4 + ["untrained"] * 4
    for i in range(4):
        twin = i + 4
        assert _bits_equal(_member(state.params, i), _member(alone.params, i)), sweep.labels[i]
        assert not _bits_equal(_member(state.params, i), _member(start.params, i))
        assert _bits_equal(_member(state.params, twin), _member(start.params, twin))
        assert _bits_equal(_member(state.opt_state, twin), _member(start.opt_state, twin))
        assert np.array_equal(state.rng[twin], state.rng[i])
        assert state.step[twin] == state.step[i] == config.train.num_steps
    assert np.asarray(state.healthy).all()
    for split, r in results.items():
        assert np.array_equal(r["acc"][:4], alone_results[split]["acc"]), split
        assert len(r["acc"]) == 8
    # The untrained members score as their initial parameters do, alike across their settings
    # only through the seed (the learning rate does not touch them).
    assert np.array_equal(results["iid"]["acc"][4:6], results["iid"]["acc"][6:8])


def test_shuffled_targets_permute_each_rows_tokens():
    tokens = np.array([[5, 6, 7, 8, 9, 0, 0], [3, 4, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0],
                       [1, 2, 3, 4, 5, 6, 7]])
    rows = [np.asarray(objective.shuffled_targets(jnp.asarray(tokens), jax.random.PRNGKey(k)))
            for k in range(20)]
    for out in rows:
        np.testing.assert_array_equal(out == tasks.PAD, tokens == tasks.PAD)  # PAD stays
        for got, want in zip(out, tokens, strict=True):
            assert sorted(got) == sorted(want)
    # Random orders: many different ones over keys, each non-PAD position moved sometimes.
    assert len({tuple(r[3]) for r in rows}) > 15
    assert all((np.stack([r[0] for r in rows])[:, j] != tokens[0, j]).any() for j in range(5))


def test_shuffled_members_stay_near_the_unigram_entropy_while_trained_ones_learn(cache_dir):
    """On targets permuted within each row, a member's loss at a position is at least the
    entropy of its row's target tokens (given the row, each target is uniform over them),
    whatever it learns: `bound`, the mean of that over the training targets. A shuffled member
    trains (its loss falls from log |vocab| to near the unigram entropy) but stays above the
    bound; its trained twin, same seed and batches, goes below it. A shuffle that leaked the
    real targets, or reached the trained members, fails one of the two."""
    config = checked(_config(cache_dir, num_seeds=1, num_steps=100, learning_rate=1e-2,
                             warmup_steps=10, null=("untrained", "shuffled")))
    splits, model_cfg, _ = train.build(config)
    sweep, _, _, losses = _train(config, splits)  # losses [step, member]
    tokens = splits["train"].tokens
    assert list(sweep.kinds()) == ["trained", "untrained", "shuffled"]
    targets = tokens[:, 1:]
    counts = np.stack([np.bincount(row[row != tasks.PAD], minlength=model_cfg.vocab_size)
                       for row in targets])
    per_row = counts / counts.sum(1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        row_entropy = -np.where(per_row > 0, per_row * np.log(per_row), 0.0).sum(1)
    bound = (counts.sum(1) * row_entropy).sum() / counts.sum()
    unigram = counts.sum(0)[counts.sum(0) > 0] / counts.sum()
    unigram = -(unigram * np.log(unigram)).sum()
    last = losses[-20:]
    mean, spread = last.mean(0), 3 * last.std(0) / np.sqrt(len(last))  # 3 standard errors
    trained, untrained, shuffled = mean
    assert shuffled > bound - spread[2], (shuffled, bound)
    assert shuffled < unigram + spread[2], (shuffled, unigram)
    assert losses[:5, 2].mean() > unigram  # it started above: it learned the unigram
    assert trained < bound - spread[0], (trained, bound)
    first = losses[:20, 1]  # the untrained member's loss, of its initial parameters, stays
    assert abs(untrained - first.mean()) < spread[1] + 3 * first.std() / np.sqrt(len(first))
