import dataclasses
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import tolerance as tol
from conftest import checked, tiny_config

from jaxillusions import model as model_lib
from jaxillusions.pipeline import validate
from jaxillusions.runtime import distributed
from jaxillusions.runtime import tensorboard as log_lib
from jaxillusions.tasks import dyck_sentences as dyck
from jaxillusions.training import objective as objective_lib
from jaxillusions.training import step as step_lib
from jaxillusions.training import train
from jaxillusions.training.step import init_state, train_steps


def _leaves(tree):
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


@pytest.mark.slow
def test_seeds_trained_together_equal_seeds_trained_alone(config):
    splits, _, _ = train.build(checked(config))
    together, _ = train.train_sweep(checked(config), splits=splits, seeds=[3, 7], verbose=False)
    for i, seed in enumerate([3, 7]):
        alone, _ = train.train_sweep(checked(config), splits=splits, seeds=[seed], verbose=False)
        for a, b in zip(_leaves(together.params), _leaves(alone.params), strict=True):
            np.testing.assert_allclose(a[i], b[0], rtol=1e-5, atol=1e-6)


def test_members_in_cache_sized_groups_train_as_in_one_group(config, monkeypatch):
    # On a CPU, train_steps runs the members in groups, one after the other, when their
    # activations exceed step.CPU_GROUP_BYTES. Forced here to 3 groups of 2 (the tiny model fits
    # one group), with hyper-parameters that vary: each member trains as in one group of 6, up
    # to the float32 rounding of a batch of another width (the tolerance of seeds trained
    # together against alone, above), and two grouped runs give the same bits.
    splits, model_cfg, tx = train.build(checked(config))
    tokens = jnp.asarray(splits["train"].tokens)
    run = dict(num_steps=3, model_cfg=model_cfg, tx=tx, batch_size=8)
    hparams = {"contrastive_weight": np.float32([0, 1, 2, 3, 4, 5])}
    one_member = step_lib.member_bytes(model_cfg, 8, tokens.shape[1])
    assert step_lib.num_groups(6, one_member) == 1
    results = []
    for budget in (step_lib.CPU_GROUP_BYTES, 2 * one_member, 2 * one_member):
        monkeypatch.setattr(step_lib, "CPU_GROUP_BYTES", budget)
        train_steps.clear_cache()  # the budget is read while tracing
        results.append(train_steps(init_state(range(6), model_cfg, tx), tokens, hparams, **run))
        assert step_lib.num_groups(6, one_member) == (1 if len(results) == 1 else 3)
    train_steps.clear_cache()
    (one, one_losses), (grouped, grouped_losses), (again, again_losses) = results
    np.testing.assert_allclose(np.asarray(grouped_losses), np.asarray(one_losses), rtol=1e-5)
    for a, b, c in zip(_leaves(one), _leaves(grouped), _leaves(again), strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(c, b)
    np.testing.assert_array_equal(np.asarray(again_losses), np.asarray(grouped_losses))


def test_members_one_at_a_time_train_as_each_alone(config, monkeypatch):
    # Members whose activations each fill the budget train one group of one after the other,
    # with the step of a seed alone (no vmap over a size-1 axis): each member's bits are those
    # of its state trained alone, and its losses too.
    splits, model_cfg, tx = train.build(checked(config))
    tokens = jnp.asarray(splits["train"].tokens)
    run = dict(num_steps=3, model_cfg=model_cfg, tx=tx, batch_size=8)
    hparams = {"contrastive_weight": np.float32([0, 1, 2])}
    start = init_state(range(3), model_cfg, tx)
    alone = [train_steps(jax.tree.map(lambda x, i=i: x[i:i + 1], start), tokens,
                         {"contrastive_weight": hparams["contrastive_weight"][i:i + 1]}, **run)
             for i in range(3)]
    monkeypatch.setattr(step_lib, "CPU_GROUP_BYTES", 1)
    train_steps.clear_cache()  # the budget is read while tracing
    together, losses = train_steps(start, tokens, hparams, **run)
    train_steps.clear_cache()
    assert step_lib.num_groups(3, step_lib.member_bytes(model_cfg, 8, tokens.shape[1])) == 3
    for i, (state, loss) in enumerate(alone):
        for a, b in zip(_leaves(together), _leaves(state), strict=True):
            np.testing.assert_array_equal(a[i:i + 1], b)
        np.testing.assert_array_equal(np.asarray(losses)[:, i:i + 1], np.asarray(loss))


def test_a_packed_batch_is_grouped_by_the_rows_of_its_pass(config, monkeypatch):
    # A member whose batch is packed into fewer rows (train.rows_per_sentence) holds the
    # activations of those rows at once, not of one row per sentence: train_steps sizes its
    # groups by them, so twice as many members of a batch packed into half the rows fit one.
    config.train.rows_per_sentence = 0.5
    settings = checked(config)
    splits, model_cfg, tx = train.build(settings)
    tokens = jnp.asarray(splits["train"].tokens)
    objective = objective_lib.from_settings(settings)
    batch, width = settings.train.batch_size, tokens.shape[1]
    assert objective.packed_rows == batch // 2
    one_row_each = step_lib.member_bytes(model_cfg, batch, width)
    assert step_lib.member_bytes(model_cfg, objective.packed_rows, width) == one_row_each // 2
    monkeypatch.setattr(jax, "device_count", lambda: 1)
    monkeypatch.setattr(step_lib, "CPU_GROUP_BYTES", 2 * one_row_each)
    assert step_lib.train_groups(8, model_cfg, batch, width) == 4  # 2 unpacked per group
    assert step_lib.train_groups(8, model_cfg, batch, width, objective) == 2  # 4 packed
    seen = []
    monkeypatch.setattr(step_lib, "num_groups",
                        lambda num, one_member: seen.append(one_member) or 2)
    train_steps.clear_cache()  # the groups are decided while tracing
    train_steps.trace(init_state(range(8), model_cfg, tx), tokens, num_steps=1,
                      model_cfg=model_cfg, tx=tx, batch_size=batch, objective=objective)
    train_steps.clear_cache()
    assert seen == [one_row_each // 2]


@pytest.mark.parametrize("num, devices, one_member, groups", [
    (32, 1, 2 * 2**20, 8),   # 4 members of 2 MiB per group (6 fit, 4 divides 32)
    (32, 2, 2 * 2**20, 4),   # 4 per device and group
    (8, 1, 1 * 2**20, 1),    # all fit
    (128, 1, 5 * 2**20, 64),  # 2 members of 5 MiB per group (the paper model's)
    (32, 1, 13 * 2**20, 32),  # one member at a time
    (6, 4, 6 * 2**20, 3),    # 6 members do not divide 4 devices: grouped as on one
    (12, 2, 7 * 2**20, 6),   # 2 per device would exceed the budget: 1 per device and group
])
def test_number_of_groups(num, devices, one_member, groups, monkeypatch):
    monkeypatch.setattr(jax, "device_count", lambda: devices)
    assert step_lib.num_groups(num, one_member) == groups


def test_one_cpu_device_on_several_cores_suggests_a_device_per_core(config, monkeypatch,
                                                                   capsys):
    # A config left at cpu_devices = 0 trains on one device where JAX_NUM_CPU_DEVICES is unset;
    # on a CPU of several cores the first line of training says how to give each core its own
    # members (docs/speed.md, "Why one device trails the compiled ensemble").
    if jax.default_backend() != "cpu" or jax.device_count() != 1:
        pytest.skip("needs one CPU device in the test process")
    monkeypatch.delenv("JAX_NUM_CPU_DEVICES", raising=False)
    cores = 4
    monkeypatch.setattr(distributed, "cpu_cores", lambda: cores)
    assert [distributed.devices_to_suggest(n) for n in (1, 2, 3, 12)] == [None, 2, 3, 4]
    cores = 1
    assert distributed.devices_to_suggest(12) is None
    cores = 2
    monkeypatch.setenv("JAX_NUM_CPU_DEVICES", "1")  # a layout asked for
    assert distributed.devices_to_suggest(12) is None
    monkeypatch.delenv("JAX_NUM_CPU_DEVICES")
    splits, _, _ = train.build(checked(config))
    line = ("  one CPU device on 2 cores: --config.cpu_devices=2 gives each core its own members "
            "(1.1-1.5x faster training on 2-core CPUs, docs/speed.md; other last bits)")
    capsys.readouterr()
    train.train_sweep(checked(config), splits=splits, stop_at_step=1)
    said = capsys.readouterr().out.splitlines()
    assert said[said.index(line) - 1].startswith(f"training {config.train.num_seeds} members")
    config.cpu_devices = 1  # the one device chosen: nothing to suggest
    train.train_sweep(checked(config), splits=splits, stop_at_step=1)
    assert line not in capsys.readouterr().out.splitlines()


def test_interrupted_then_resumed_run_ends_with_same_parameters(config, tmp_path, capsys):
    splits, _, _ = train.build(checked(config))
    straight, _ = train.train_sweep(checked(config), str(tmp_path / "straight"), splits=splits,
                                    verbose=False)
    workdir = str(tmp_path / "interrupted")
    train.train_sweep(checked(config), workdir, splits=splits, stop_at_step=10, verbose=False)
    resumed, _ = train.train_sweep(checked(config), workdir, splits=splits)
    assert "resumed from checkpoint at step 10" in capsys.readouterr().out
    assert int(resumed.step[0]) == config.train.num_steps
    for a, b in zip(_leaves(straight), _leaves(resumed), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_tiny_config_learns_closing_brackets(config):
    config.train.num_steps = 400
    config.train.learning_rate = 1e-2
    config.train.eval_every = 400
    _, results = train.train_sweep(checked(config), verbose=False)
    # Chance for the closing bracket's type is 1/num_types = 0.25.
    assert np.all(results["iid"]["acc"] > 0.8), results["iid"]["acc"]
    assert np.all(results["train"]["acc"] > 0.8)
    by_depth = results["iid"]["acc_by_depth"]
    assert np.isnan(by_depth[:, 0]).all()  # a closing bracket never leaves depth 0
    assert np.isfinite(by_depth[:, 1]).all()


@pytest.mark.slow
def test_position_offset_trains_positions_past_the_training_length(config):
    splits, model_cfg, tx = train.build(checked(config))
    width = splits["train"].tokens.shape[1] - 1  # training inputs: positions 0 .. width - 1
    goal = objective_lib.from_settings(validate.parse(config))
    assert goal.max_position_offset == model_cfg.max_len - width
    longest = np.argsort(-splits["train"].lengths, kind="stable")[:256]
    tokens = jnp.asarray(splits["train"].tokens[longest])  # long sentences at large offsets
    params = jax.tree.map(lambda x: x[0], init_state([0], model_cfg, tx).params)
    objective = objective_lib.from_settings(validate.parse(config))

    def pos_grad(objective):
        grads = jax.grad(objective_lib.objective_loss)(params, tokens, jax.random.PRNGKey(0), {},
                                               model_cfg, objective)
        return np.abs(np.asarray(grads["pos_embed"])).sum(-1)

    with_offset = pos_grad(objective)
    without = pos_grad(objective_lib.Objective())
    assert (with_offset > 0).all()  # every position, up to the last one of `longer`
    assert (without[:width] > 0).all() and (without[width:] == 0).all()
    config.train.max_position_offset = model_cfg.max_len - width + 1
    with pytest.raises(ValueError, match="max_position_offset"):
        train.build(checked(config), splits)


@pytest.mark.slow
def test_nan_seed_is_isolated_and_flagged(config):
    splits, model_cfg, tx = train.build(checked(config))
    tokens = jnp.asarray(splits["train"].tokens)
    run = dict(num_steps=5, model_cfg=model_cfg, tx=tx, batch_size=16)
    clean, _ = train_steps(init_state([0, 1, 2], model_cfg, tx), tokens, **run)
    state = init_state([0, 1, 2], model_cfg, tx)
    poisoned = state.params["unembed"]["w"].at[1].set(jnp.nan)
    state = state.replace(params={**state.params, "unembed": {**state.params["unembed"],
                                                               "w": poisoned}})
    state, losses = train_steps(state, tokens, **run)
    np.testing.assert_array_equal(np.asarray(state.healthy), [True, False, True])
    assert np.isnan(np.asarray(losses)[:, 1]).all()
    for a, b in zip(_leaves(clean.params), _leaves(state.params), strict=True):
        np.testing.assert_array_equal(a[[0, 2]], b[[0, 2]])


def test_tensorboard_events_read_back(config, tmp_path):
    workdir = str(tmp_path / "run")
    _, results = train.train_sweep(checked(config), workdir, verbose=False)
    scalars = log_lib.read_scalars(os.path.join(workdir, "tensorboard"))
    assert {"seed_0", "seed_1", "mean", "min", "max"} <= set(scalars)
    steps = [s for s, _ in scalars["seed_0"]["train/loss"]]
    assert steps == [10, 20]
    iid_acc = results["iid"]["acc"]
    (_, last0), = [p for p in scalars["seed_0"]["eval/iid/acc"] if p[0] == 20]
    (_, mean), = [p for p in scalars["mean"]["eval/iid/acc"] if p[0] == 20]
    assert last0 == pytest.approx(iid_acc[0], rel=1e-6)
    assert mean == pytest.approx(iid_acc.mean(), rel=1e-6)
    assert "eval_by_depth/iid/depth_01" in scalars["max"]


def test_workdir_with_a_different_config_is_refused(config, tmp_path):
    splits, _, _ = train.build(checked(config))
    train.train_sweep(checked(config), str(tmp_path), splits=splits, stop_at_step=10, verbose=False)
    config.model.d_model = 8
    with pytest.raises(ValueError, match="model.d_model: 16 there vs 8 now"):
        train.train_sweep(checked(config), str(tmp_path), splits=splits, verbose=False)


def test_a_relaunch_on_other_data_is_refused_before_it_trains(config, tmp_path):
    """The workdir records each split's tokens (sha256) at the first launch; a relaunch whose
    data differ (files under data.source or data.files changed in between: the splits are made
    again from them) is one line naming the split, with nothing trained or moved. It had gone
    on, mixing results of the two datasets in one run."""
    splits, _, _ = train.build(checked(config))
    train.train_sweep(checked(config), str(tmp_path), splits=splits, stop_at_step=10, verbose=False)
    record = tmp_path / train.DATA_RECORD
    assert set(json.loads(record.read_text())) == set(splits)
    before = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    other = dict(splits)
    other["iid"] = dataclasses.replace(splits["iid"], tokens=np.roll(splits["iid"].tokens, 1, 0))
    with pytest.raises(ValueError, match=r"^data: the iid split is not the one this run was "
                       r"computed from \(its tokens' sha256 differs from .*data_sha256.json\)"):
        train.train_sweep(checked(config), str(tmp_path), splits=other, verbose=False)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == before
    train.train_sweep(checked(config), str(tmp_path), splits=splits, verbose=False)  # the same


def test_corrupt_checkpoint_falls_back_to_older_and_is_kept(config, tmp_path, capsys):
    splits, _, _ = train.build(checked(config))
    workdir = tmp_path / "run"
    train.train_sweep(checked(config), str(workdir), splits=splits, verbose=False)
    steps = sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
    assert steps == [10, 20]
    for f in (workdir / "checkpoints" / "20").rglob("*"):
        if f.is_file():
            f.write_bytes(b"garbage")
    capsys.readouterr()
    state, _ = train.train_sweep(checked(config), str(workdir), splits=splits)
    out = capsys.readouterr().out
    assert "checkpoint 20" in out and "unreadable" in out
    assert "resumed from checkpoint at step 10" in out
    assert (workdir / "corrupt_checkpoints").exists()
    straight, _ = train.train_sweep(checked(config), str(tmp_path / "straight"), splits=splits,
                                    verbose=False)
    for a, b in zip(_leaves(straight), _leaves(state), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("override, message", [
    ("--config.train.no_such_key=1", "no_such_key"),
    ("--config.data.max_depth=0", "max_depth"),
    ("--config.train.log_every=0", "train.log_every=0"),
])
def test_launcher_bad_input_is_a_one_line_error(override, message, tmp_path, cache_dir):
    cmd = [sys.executable, "-m", "jaxillusions.launch.train", "--config=dyck_small",
           f"--workdir={tmp_path}", override, f"--config.data.cache_dir={cache_dir}"]
    root = os.path.dirname(os.path.dirname(__file__))
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=root, timeout=120)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error:") and message in last, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def test_splits_share_the_model_max_len(config):
    splits, model_cfg, _ = train.build(checked(config))
    assert model_cfg.max_len == splits["longer"].tokens.shape[1]
    assert model_cfg.vocab_size == dyck.vocab_size(config.data.num_types)


def test_decay_steps_hold_the_peak_rate_then_decay_over_the_last_steps(config):
    default = objective_lib.learning_rate_schedule(3e-3, 10, 100)
    cosine = optax.warmup_cosine_decay_schedule(0.0, 3e-3, 10, 100, 3e-4)
    steps = np.arange(0, 121)
    np.testing.assert_array_equal(default(steps), cosine(steps))  # decay_steps 0: unchanged
    held = np.asarray(objective_lib.learning_rate_schedule(3e-3, 10, 100, decay_steps=30)(steps))
    np.testing.assert_allclose(held[:11], np.asarray(cosine(steps))[:11], rtol=1e-6)  # warmup
    np.testing.assert_allclose(held[10:71], 3e-3, rtol=1e-6)  # the peak up to step 70
    assert np.all(np.diff(held[70:101]) < 0)
    np.testing.assert_allclose(held[[85, 100, 120]], [1.65e-3, 3e-4, 3e-4], rtol=1e-5)
    config.train.num_steps, config.train.warmup_steps, config.train.decay_steps = 100, 10, 91
    with pytest.raises(ValueError, match="train.decay_steps"):
        validate.parse(config)


def test_the_torch_loop_follows_the_same_schedule(config):
    pytest.importorskip("torch")
    from benchmarks import torch_loop

    for decay in (0, 30):
        config.train.num_steps, config.train.warmup_steps, config.train.decay_steps = 100, 10, decay
        train_cfg = validate.parse(config).train
        factor = torch_loop._schedule(train_cfg)
        ours = objective_lib.learning_rate_schedule(3e-3, 10, 100, decay)
        np.testing.assert_allclose([3e-3 * factor(s) for s in range(0, 101, 5)],
                                   [float(ours(s)) for s in range(0, 101, 5)], rtol=1e-5)


def _packing_setup(config, num: int = 24):
    """The tiny model at its initialisation, `num` training sentences of every length the
    split has (the longest first, so that some fill a row), and the objective with offsets."""
    config.train.batch_size = num
    splits, model_cfg, tx = train.build(checked(config))
    order = np.argsort(-splits["train"].lengths, kind="stable")
    pick = np.concatenate([order[: num // 4], order[-num // 4:], order[num // 2: num]])
    tokens = jnp.asarray(splits["train"].tokens[pick])
    params = jax.tree.map(lambda x: x[0], init_state([0], model_cfg, tx).params)
    return tokens, params, model_cfg, objective_lib.from_settings(validate.parse(config))


def test_pack_lays_each_sentence_in_one_row_at_its_own_positions(config):
    """objective.pack: every sentence up to its last scored target, once, in a row with room
    (first-fit, longest first), its tokens, targets, loss mask, positions (its offset + index)
    and segment (its index) at consecutive columns; nothing else scored; the passes of `rows`
    rows that hold the used rows."""
    tokens, _, _, _ = _packing_setup(config)
    num, width = tokens.shape[0], tokens.shape[1] - 1
    inputs, targets = np.asarray(tokens[:, :-1]), np.asarray(tokens[:, 1:])
    mask = targets != 0
    offset = np.arange(num, dtype=np.int32) % 5
    needed = {}
    for rows in (num // 2, 5, 1):
        grid, passes = objective_lib.pack(jnp.asarray(inputs), jnp.asarray(targets),
                                          jnp.asarray(mask), jnp.asarray(offset), rows)
        g_in, g_tg, g_mask, g_off, g_seg = (np.asarray(x) for x in grid)
        assert g_in.shape == (-(-num // rows) * rows, width)
        positions = g_off + np.arange(width)
        for s in range(num):
            length = np.flatnonzero(mask[s]).max() + 1
            where = np.argwhere(g_seg == s)
            row, cols = where[0, 0], where[:, 1]
            assert (where[:, 0] == row).all()
            np.testing.assert_array_equal(cols, cols[0] + np.arange(length))
            np.testing.assert_array_equal(g_in[row, cols], inputs[s, :length])
            np.testing.assert_array_equal(g_tg[row, cols], targets[s, :length])
            np.testing.assert_array_equal(g_mask[row, cols], mask[s, :length])
            np.testing.assert_array_equal(positions[row, cols], offset[s] + np.arange(length))
        assert g_mask.sum() == mask.sum() and (g_mask[g_seg == -1] == 0).all()
        used = int((g_seg >= 0).any(1).sum())
        assert (g_seg[used:] == -1).all()  # the used rows come first
        assert int(passes) == -(-used // rows)
        needed[rows] = int(passes)
    assert needed[num // 2] < needed[5] < needed[1] < num  # short sentences share rows


def test_packed_batches_give_the_unpacked_logits_loss_and_gradient(config):
    """The model on packed rows (model.forward's per-token offsets and segments) gives each
    scored position of a sentence the logits it gives the sentence alone, within the rounding
    of two float32 programs; `loss_and_grads` on the batch packed in one, two or many passes
    gives the unpacked loss and gradient within float32 rounding of their sums over the
    positions: with random position offsets, a closing-bracket loss and a shuffled null member's
    targets."""
    tokens, params, model_cfg, goal = _packing_setup(config)
    num = tokens.shape[0]
    mask = tokens[:, 1:] != 0
    offset = jnp.arange(num) % 5
    grid, _ = objective_lib.pack(tokens[:, :-1], tokens[:, 1:], mask, offset, num)
    forward = jax.jit(model_lib.forward, static_argnums=2)  # (eagerly: an op at a time)
    packed, _ = forward(params, grid[0], model_cfg, position_offset=grid[3], segments=grid[4])
    alone, _ = forward(params, tokens[:, :-1], model_cfg, position_offset=offset)
    seg = np.asarray(grid[4])
    for s in range(num):
        rows, cols = np.nonzero(seg == s)
        want = np.asarray(alone[s, : len(cols)], np.float64)
        got = np.asarray(packed[rows, cols], np.float64)
        assert np.all(np.abs(got - want) <= tol.two_ways(
            tol.activation_error(want, max(model_cfg.d_mlp, model_cfg.vocab_size))))

    key = jax.random.PRNGKey(4)
    closing = dataclasses.replace(goal, loss_on="closing")
    shuffled = dataclasses.replace(goal, shuffled=True)
    shuffled_hp = {objective_lib.NULL: jnp.asarray(objective_lib.SHUFFLED)}
    loss_and_grads = jax.jit(objective_lib.loss_and_grads, static_argnums=(4, 5))
    for objective, hp in ((goal, {}), (closing, {}), (shuffled, shuffled_hp)):
        loss, grads = loss_and_grads(params, tokens, key, hp, model_cfg, objective)
        # The gradient is a sum over the sentences of each one's share (its scored positions'
        # losses over the batch's count): their magnitudes bound the terms of the sums.
        offset, targets = objective_lib._offsets_and_targets(tokens, key, hp, objective)
        targets = tokens[:, 1:] if targets is None else targets
        mask = objective_lib.scored(targets, objective_lib._closing(objective))
        count = float(mask.sum())

        def share(p, inputs, target, keep, at, count=count):
            logits, _ = model_lib.forward(p, inputs[None], model_cfg, position_offset=at[None])
            nll = optax.softmax_cross_entropy_with_integer_labels(logits[0], target)
            return (nll * keep).sum() / count

        shares = jax.jit(jax.vmap(jax.grad(share), in_axes=(None, 0, 0, 0, 0)))(
            params, tokens[:, :-1], targets, mask, offset)
        for rows in (num // 2, 7, 1):  # one pass, then more
            p_loss, p_grads = loss_and_grads(params, tokens, key, hp, model_cfg,
                                             dataclasses.replace(objective, packed_rows=rows))
            assert abs(float(p_loss) - float(loss)) <= tol.two_ways(
                tol.mean_error(count, float(loss), float(loss) + np.log(model_cfg.vocab_size)))
            for g, p_g, terms in zip(jax.tree.leaves(grads), jax.tree.leaves(p_grads),
                                     jax.tree.leaves(shares), strict=True):
                magnitude = np.abs(np.asarray(terms, np.float64)).sum(0)
                bound = tol.two_ways(tol.TERM_ULPS * tol.sum_error(count, magnitude))
                assert np.all(np.abs(np.asarray(p_g, np.float64) - np.asarray(g)) <= bound)


def test_rows_per_sentence_packs_each_members_batch_and_is_refused_where_rows_are_sentences(
        config):
    """train.rows_per_sentence below 1 packs each member's batch into ceil(that x batch_size)
    rows (objective.packed_rows; 1: unpacked, the step of before); the step's first loss is the
    unpacked one within rounding, and it trains on; configs whose rows must be one sentence
    (a contrastive regularizer, a minimal first layer, a uniform-attention layer) are refused
    in one line naming the key, as are values outside (0, 1]."""
    assert objective_lib.from_settings(validate.parse(config)).packed_rows == 0
    config.train.rows_per_sentence = 0.5
    goal = objective_lib.from_settings(validate.parse(config))
    assert goal.packed_rows == 8  # of 16
    splits, model_cfg, tx = train.build(checked(config))
    tokens = jnp.asarray(splits["train"].tokens)
    run = dict(num_steps=3, model_cfg=model_cfg, tx=tx, batch_size=16)
    unpacked, packed = (np.asarray(train_steps(init_state([0, 1], model_cfg, tx), tokens,
                                               objective=o, **run)[1], np.float64)
                        for o in (dataclasses.replace(goal, packed_rows=0), goal))
    # The first step's loss (at the initial parameters, on the same batch) two ways: within the
    # rounding of a mean over the batch's scored targets (at most 16 x width of them).
    count = 16 * (tokens.shape[1] - 1)
    bound = tol.two_ways(tol.mean_error(count, unpacked[0], unpacked[0] + np.log(
        model_cfg.vocab_size)))
    assert np.all(np.abs(packed[0] - unpacked[0]) <= bound)
    assert np.isfinite(packed).all()  # later steps: Adam's updates amplify the last bits
    for key, changes in (("train.contrastive_weights", {"train.contrastive_weights": (0.0, 1.0)}),
                         ("model.first_layer", {"model.first_layer": "minimal",
                                                "model.pos_encoding": "none",
                                                "model.d_model": 64}),
                         ("model.uniform_attention_layers",
                          {"model.uniform_attention_layers": (0,)})):
        bad = tiny_config(config.data.cache_dir)
        bad.train.rows_per_sentence = 0.5
        for name, value in changes.items():
            section, field = name.split(".")
            setattr(getattr(bad, section), field, value)
        with pytest.raises(ValueError, match=rf"train.rows_per_sentence=0.5: .*{key}="):
            validate.check(bad)
    for value in (0.0, 1.5):
        config.train.rows_per_sentence = value
        with pytest.raises(ValueError, match="rows_per_sentence"):
            validate.check(config)
