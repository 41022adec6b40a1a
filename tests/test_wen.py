"""Wen et al. on the same engine: model and objective options, measurements."""

import itertools
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import checked

from jaxillusions import model as model_lib
from jaxillusions.pipeline import validate
from jaxillusions.report.stats import pairs_jackknife
from jaxillusions.studies import wen
from jaxillusions.tasks import dyck as dyck_task
from jaxillusions.tasks import dyck_sentences as dyck
from jaxillusions.tasks.minimal_layer import FEATURES, MinimalFirstLayer
from jaxillusions.training import objective as objective_lib
from jaxillusions.training import train
from jaxillusions.training.step import init_state, train_steps

K, D = 2, 4  # Dyck-(2, 4)
OPEN = tuple(dyck.open_id(t, K) for t in range(K))
CLOSE = tuple(dyck.close_id(t, K) for t in range(K))


def _minimal(features: str = "onehot") -> MinimalFirstLayer:
    return MinimalFirstLayer(OPEN, CLOSE, max_depth=D, depth_bins=D + 2, features=features)


def _cfg(**overrides):
    kw = dict(vocab_size=dyck.vocab_size(K), max_len=40, n_layers=2, d_model=32, d_mlp=32,
              pos_encoding="none")
    return model_lib.ModelConfig(**{**kw, **overrides})


def _tokens(text: str) -> np.ndarray:
    """'([])' -> BOS + token ids (types: ( ) and [ ])."""
    ids = {"(": OPEN[0], "[": OPEN[1], ")": CLOSE[0], "]": CLOSE[1]}
    return np.array([dyck.BOS] + [ids[c] for c in text], np.int32)


def _leaves(tree):
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


# ----------------------------------------------------------------------------- model options


@pytest.mark.parametrize("embedding", FEATURES)
def test_minimal_first_layer_depends_only_on_type_and_depth(embedding):
    cfg = _cfg(front=_minimal(embedding))
    params = model_lib.init_params(jax.random.PRNGKey(0), cfg)
    # Position 5 of the first is ')' at depth 1 after "[(", position 9 of the second is ')' at
    # depth 1 after a different history; equal (token, depth) -> equal output.
    a, b = _tokens("[()[()]"), _tokens("(())[[]]([()])")
    _, ca = model_lib.forward(params, a[None], cfg, cache=("blocks.0.resid_post",))
    _, cb = model_lib.forward(params, b[None], cfg, cache=("blocks.0.resid_post",))
    out_a = np.asarray(ca["blocks.0.resid_post"][0])
    out_b = np.asarray(cb["blocks.0.resid_post"][0])
    depth_a = np.asarray(cfg.front.depth(a))
    depth_b = np.asarray(cfg.front.depth(b))
    pairs = 0
    for i in range(len(a)):
        for j in range(len(b)):
            same = a[i] == b[j] and depth_a[i] == depth_b[j]
            assert np.array_equal(out_a[i], out_b[j]) == same, (i, j)
            pairs += same
    assert pairs >= 5
    assert "embed" not in params and "blocks.0.attn.pattern" not in model_lib.site_names(cfg)
    assert "blocks.1.attn.pattern" in model_lib.site_names(cfg)


def test_minimal_features_match_the_paper_equations():
    tokens = _tokens("[[(")  # depths 1, 2, 3
    for embedding, expect in [
        ("onehot", None),
        ("type_depth", lambda tok, d: np.r_[np.eye(7)[tok], np.eye(D + 2)[d]]),
        ("yao", lambda tok, d: np.r_[np.eye(7)[tok], np.cos(np.arctan2(d, D + 2 - d)),
                                     np.sin(np.arctan2(d, D + 2 - d))]),
    ]:
        cfg = _cfg(front=_minimal(embedding))
        dim = cfg.front.dim(cfg.vocab_size)
        params = model_lib.init_params(jax.random.PRNGKey(0), cfg)
        _, c = model_lib.forward(params, tokens[None], cfg, cache=("blocks.0.minimal.out",))
        out = np.asarray(c["blocks.0.minimal.out"][0])
        assert out.shape == (4, 32) and np.all(out[:, dim:] == 0)
        if expect is None:  # one-hot: distinct unit vectors
            np.testing.assert_array_equal(out.sum(1), 1.0)
            assert len({int(np.argmax(r)) for r in out}) == 4
        else:
            for i, d in enumerate([0, 1, 2, 3]):
                np.testing.assert_allclose(out[i, :dim], expect(tokens[i], d),
                                           atol=1e-6)


def test_minimal_tables_equal_those_of_the_model_flag():
    """The part's fixed tables are the ones ModelConfig(first_layer="minimal") built before the
    layer became a part (tests/data/make_minimal_tables.py wrote them at commit c14e60b), and the
    task builds the part from its data as that config was built: bracket ids, D, depth bins."""
    old = np.load(os.path.join(os.path.dirname(__file__), "data", "minimal_tables.npz"))
    assert sorted(old) == sorted(FEATURES)
    for features in FEATURES:
        part = MinimalFirstLayer((3, 4), (5, 6), max_depth=2, depth_bins=4, features=features)
        cfg = _cfg(vocab_size=7, max_len=12, front=part)
        table = model_lib.init_params(jax.random.PRNGKey(0), cfg)["blocks"][0]["minimal"]
        np.testing.assert_array_equal(table["table"], old[features])
    data = dyck_task.Data(num_types=3, max_depth=5, depth_extra=2)
    assert dyck_task.first_layer(data, "yao") == MinimalFirstLayer(
        (3, 4, 5), (6, 7, 8), max_depth=5, depth_bins=8, features="yao")


def test_bad_minimal_configs_are_one_line_errors():
    with pytest.raises(ValueError, match="pos_encoding must be 'none'"):
        _cfg(front=_minimal(), pos_encoding="linear")
    with pytest.raises(ValueError, match="more than d_model=8"):
        _cfg(front=_minimal(), d_model=8)
    with pytest.raises(ValueError, match="minimal_embedding"):
        _minimal("rope")
    with pytest.raises(ValueError, match=r"uniform_attention_layers=\(0,\): layers \[0\] have no "
                       "attention"):  # the minimal layer 0 has none to make uniform
        _cfg(front=_minimal(), interventions=(model_lib.UniformAttention((0,)),))
    with pytest.raises(ValueError, match="d_model >= vocab_size"):
        _cfg(embedding="onehot", d_model=4)


def test_the_run_builds_its_variants_from_the_settings_keys(config):
    """model.first_layer/minimal_embedding: the task's part; model.uniform_attention_layers:
    the model's standing intervention."""
    config.model.update(first_layer="minimal", minimal_embedding="yao", pos_encoding="none",
                        d_model=64, uniform_attention_layers=(1,))
    run = checked(config)
    cfg = train.model_config(run)
    assert cfg.front == dyck_task.first_layer(run.data, "yao")
    assert cfg.front.open_ids == dyck_task.bracket_ids(run.data)[0]
    assert cfg.interventions == (model_lib.UniformAttention((1,)),)
    assert objective_lib.from_settings(run).brackets == dyck_task.bracket_ids(run.data)


@pytest.mark.slow
def test_frozen_tables_do_not_move_and_the_rest_trains(config):
    config.model.update(first_layer="minimal", pos_encoding="none", d_model=64, attn_only=True)
    _, model_cfg, tx = train.build(checked(config))
    assert model_lib.frozen_paths(model_cfg) == ("blocks/0/minimal/table",)
    config.model.update(first_layer="standard", embedding="onehot")
    _, onehot_cfg, onehot_tx = train.build(checked(config))
    assert model_lib.frozen_paths(onehot_cfg) == ("embed",)
    np.testing.assert_array_equal(model_lib.init_params(jax.random.PRNGKey(0), onehot_cfg)[
        "embed"], np.eye(onehot_cfg.vocab_size, 64))
    for cfg, opt, frozen in ((model_cfg, tx, "blocks/0/minimal/table"),
                             (onehot_cfg, onehot_tx, "embed")):
        params = model_lib.init_params(jax.random.PRNGKey(0), cfg)
        grads = jax.tree.map(jnp.ones_like, params)  # a gradient on every parameter
        state = opt.init(params)
        for _ in range(2):  # the first step has learning rate 0 (warmup)
            updates, state = opt.update(grads, state, params)
            params = optax.apply_updates(params, updates)
        for path, u in jax.tree_util.tree_flatten_with_path(updates)[0]:
            moved = bool(np.any(np.asarray(u) != 0))
            assert moved == (model_lib.path_str(path) != frozen), model_lib.path_str(path)


# ----------------------------------------------------------------------------- objective


def test_closing_only_loss_averages_over_closing_targets():
    cfg = _cfg()
    params = model_lib.init_params(jax.random.PRNGKey(1), cfg)
    tokens = np.stack([np.r_[_tokens("([])"), dyck.EOS, 0], np.r_[_tokens("[]()"), dyck.EOS, 0]])
    logits, _ = model_lib.forward(params, tokens[:, :-1], cfg)
    logp = np.asarray(jax.nn.log_softmax(logits))
    targets = tokens[:, 1:]
    nll = -np.take_along_axis(logp, targets[..., None], -1)[..., 0]
    closing = np.isin(targets, CLOSE)
    got = objective_lib.lm_loss(params, jnp.asarray(tokens), cfg, closing=CLOSE)
    np.testing.assert_allclose(got, nll[closing].mean(), rtol=1e-5)
    got_all = objective_lib.lm_loss(params, jnp.asarray(tokens), cfg)
    np.testing.assert_allclose(got_all, nll[targets != dyck.PAD].mean(), rtol=1e-5)


def test_contrastive_prefixes_are_balanced_with_exactly_one_extra_pair():
    tokens, lengths = dyck_task.contrastive_prefixes(jax.random.PRNGKey(0), 500, (OPEN, CLOSE),
                                                     D)
    tokens, lengths = np.asarray(tokens), np.asarray(lengths)
    shapes = set()
    for row, length in zip(tokens, lengths, strict=True):
        assert np.all(row[length:] == dyck.PAD) and np.all(row[:length] != dyck.PAD)
        stack, depth, skeleton = [], [], ""
        for tok in row[:length]:
            if tok in OPEN:
                stack.append(OPEN.index(tok))
                skeleton += "("
            else:
                assert stack.pop() == CLOSE.index(tok)  # matched type
                skeleton += ")"
            depth.append(len(stack))
        assert not stack and max(depth) <= D  # balanced, within the depth bound
        # n nested pairs with one pair "()" inserted at depth j <= n: "("*j + "()" + ... .
        n = length // 2 - 1
        matches = [j for j in range(n + 1)
                   if skeleton == "(" * j + "()" + "(" * (n - j) + ")" * n]
        assert len(matches) == 1, skeleton
        shapes.add((n, matches[0]))
    # Every (n, j) with n <= D and j <= min(n, D - 1) occurs.
    assert shapes == {(n, j) for n in range(D + 1) for j in range(min(n, D - 1) + 1)}


@pytest.mark.slow
def test_contrastive_regularizer_is_zero_iff_logits_ignore_balanced_prefixes():
    cfg = _cfg(max_len=60)
    params = model_lib.init_params(jax.random.PRNGKey(2), cfg)
    x = jnp.asarray(np.stack([np.r_[_tokens("([])[]"), dyck.EOS, 0, 0],
                              np.r_[_tokens("(())"), dyck.EOS, 0, 0, 0, 0]]))
    logits_x, _ = model_lib.forward(params, x, cfg)
    key = jax.random.PRNGKey(3)
    assert dyck_task.contrastive_loss(params, x, logits_x, key, cfg, (OPEN, CLOSE), D) > 1e-4
    # Attention writes nothing: each position's logits depend on its own token only.
    blind = jax.tree_util.tree_map_with_path(
        lambda path, v: jnp.zeros_like(v) if model_lib.path_str(path).endswith(
            ("attn/w_o", "attn/b_o")) else v, params)
    logits_x, _ = model_lib.forward(blind, x, cfg)
    assert float(dyck_task.contrastive_loss(blind, x, logits_x, key, cfg, (OPEN, CLOSE),
                                            D)) == 0.0


@pytest.mark.slow
def test_vmapped_lambda_sweep_equals_single_runs(config):
    config.train.contrastive_weights = (0.0, 0.5)
    config.train.loss_on = "closing"
    config.model.update(n_layers=1, attn_only=True)  # small graphs: two compilations
    splits, model_cfg, tx = train.build(checked(config))
    objective = objective_lib.from_settings(validate.parse(config))
    members = train.members(checked(config))
    assert list(members.seeds) == [0, 1, 0, 1]
    np.testing.assert_array_equal(members.hparams["contrastive_weight"], [0, 0, 0.5, 0.5])
    tokens = jnp.asarray(splits["train"].tokens)
    run = dict(num_steps=4, model_cfg=model_cfg, tx=tx, batch_size=8, objective=objective)
    together, _ = train_steps(init_state(members.seeds, model_cfg, tx), tokens,
                                    members.hparams, **run)
    for i, (weight, seed) in enumerate([(0.0, 0), (0.0, 1), (0.5, 0), (0.5, 1)]):
        alone, _ = train_steps(init_state([seed], model_cfg, tx), tokens,
                                     {"contrastive_weight": np.float32([weight])}, **run)
        for a, b in zip(_leaves(together.params), _leaves(alone.params), strict=True):
            np.testing.assert_allclose(a[i], b[0], rtol=1e-5, atol=1e-6)
    # The weight matters: same seed, different weight, different parameters.
    w = together.params["unembed"]["w"]
    assert not np.allclose(w[0], w[2], atol=1e-4)


def test_bad_objective_options_are_one_line_errors(config):
    config.train.loss_on = "opening"
    with pytest.raises(ValueError, match="train.loss_on='opening'"):
        train.build(checked(config))
    config.train.loss_on = "all"
    config.train.contrastive_weights = (0.3, -1.0)
    with pytest.raises(ValueError, match="contrastive_weights"):
        train.build(checked(config))


# ----------------------------------------------------------------------------- measurements


def test_pattern_figure_shows_healthy_members_only():
    prefix = wen.attention_prefix(2, 2)
    patterns = {0: np.ones((3, 1, len(prefix), len(prefix))) / len(prefix)}
    patterns[0][0] = np.nan  # member 0 diverged
    # Members, not seeds (was "seed 0_cw0.3"): a label names the seed and the weight.
    fig = wen._patterns_figure(patterns, prefix, 2, ["0", "0_cw0.3", "1_cw0.3"],
                               [False, True, True])
    *panels, bar = fig.axes
    assert [ax.get_title() for ax in panels] == ["layer 0, member 0_cw0.3",
                                                 "layer 0, member 1_cw0.3"]
    assert fig.axes[0].get_xticklabels()[0].get_text() == "BOS"
    assert bar.get_ylabel() == "attention weight"  # the colour bar
    assert "the first 2 healthy members" in fig._suptitle.get_text()


def test_length_and_balance_figures_bound_proportions_and_count_seeds():
    # Was: a plain t interval on a share (2 seeds: -1.1 to 1.9) and no count of seeds.
    rows = [{"contrastive_weight": w, "seed": s, "healthy": not (w == 1 and s == 2),
             "length_gen_acc": acc, "length_gen_argmax_acc": 0.98 - 0.01 * s,
             "balance_violation": 0.5 + s}
            for w in (0, 1) for s, acc in enumerate((0.2, 0.9, 0.05))]
    fig = wen.length_figure(rows)
    assert "3 and 2 seeds at λ = 0, 1" in fig._suptitle.get_text()
    for ax in fig.axes:
        assert ax.get_ylim() == (-0.02, 1.02)
        for bars in ax.containers:
            (ends,) = bars.lines[2]  # the error bar's segments
            for segment in ends.get_segments():
                assert 0 <= segment[:, 1].min() and segment[:, 1].max() <= 1
    fig = wen.balance_figure(rows)
    assert fig._suptitle.get_text().endswith("a point per seed (3 and 2 seeds at λ = 0, 1)")
    # The log axis (0.5 to 2.5 here) labelled in plain numbers at 1, 2, 5 a decade, not in
    # matplotlib's crowded minor labels (3x10^-1 4x10^-1 ...).
    fig.canvas.draw()
    ax = fig.axes[0]
    low, high = ax.get_xlim()
    shown = [t.get_text() for t in ax.get_xticklabels() if low <= t.get_position()[0] <= high]
    assert shown == ["0.5", "1", "2"]
    assert not any(t.get_text() for t in ax.get_xminorticklabels())


def test_the_summary_bounds_shares_and_keeps_plus_minus_for_ratios_and_differences():
    # Was: every cell mean ± a t half-width, so 2 seeds' share read 0.550 ± 4.447.
    import re
    import types

    from jaxillusions.report import stats

    rows = [{"contrastive_weight": w, "seed": s, "healthy": True, "acc_iid": 1.0,
             "length_gen_acc": acc + w / 10, "length_gen_argmax_acc": 0.5,
             "balance_violation": 0.5 + s}
            for w in (0, 1) for s, acc in enumerate((0.2, 0.9))]
    attention = [{"prefix_len": 8, "random_baseline": 0.2, "random_baseline_square": 0.3,
                  "contrastive_weight": 0, "layer": 1, "head": 0, "num_seeds": 2,
                  "variation": 0.1, "low": 0.05, "high": 0.15}]
    text = wen.summary(rows, attention, types.SimpleNamespace(wen=types.SimpleNamespace(
        label="t")))
    line = next(t for t in text.splitlines() if t.startswith("  weight 0 (2 seeds)"))
    low, high = map(float, re.search(r"length_gen_acc 0\.550 \[([-\d.]+), ([-\d.]+)\]",
                                     line).groups())
    expected = stats.bounded_interval(np.array([0.2, 0.9]))
    assert 0 <= low < 0.2 and 0.9 < high <= 1
    assert (low, high) == (round(expected[1], 3), round(expected[2], 3))
    assert "length_gen_argmax_acc 0.500 [0.500, 0.500]" in line  # identical seeds: a point
    assert "balance_violation 1.000 ± " in line and "(median 1.000)" in line
    diff = next(t for t in text.splitlines() if t.startswith("  weight 1 - 0"))
    assert "length_gen_acc 0.100 ± 0.000" in diff  # a difference may be negative: ± stays


def test_attention_variation_of_two_seeds_says_it_has_no_interval():
    """Was: "0.124 [nan, nan]" in the summary, and bars with zero-width caps under a title
    promising a 95% CI."""
    import types

    rows = [{"contrastive_weight": 0, "seed": s, "healthy": True, "acc_iid": 1.0,
             "length_gen_acc": 0.5, "length_gen_argmax_acc": 0.5} for s in range(2)]
    mean, low, high = pairs_jackknife(np.array([[0.0, 0.124], [0.124, 0.0]]))
    attention = [{"prefix_len": 8, "random_baseline": 0.2, "random_baseline_square": 0.3,
                  "contrastive_weight": 0, "layer": 1, "head": 0, "num_seeds": 2,
                  "variation": mean, "low": low, "high": high, "label": "wen"}]
    text = wen.summary(rows, attention, types.SimpleNamespace(wen=types.SimpleNamespace(
        label="t")))
    assert "0.124 (no interval: the jackknife over seeds takes 3 or more)" in text, text
    assert "nan" not in text
    fig = wen.attention_figure(attention)
    (ax,) = fig.axes
    assert ax.get_title().endswith("no interval: it takes 3 seeds or more)")
    assert not [c for c in ax.containers if getattr(c, "errorbar", None) is not None]


def test_attention_variation_matches_numpy_on_hand_built_patterns():
    causal = np.tril(np.ones((4, 4)))
    uniform = causal / causal.sum(1, keepdims=True)
    first = np.eye(4)[[0, 0, 0, 0]]  # every query attends to BOS
    diagonal = np.eye(4)  # every query attends to itself
    for a, b in [(uniform, first), (first, diagonal), (uniform, diagonal)]:
        want = np.mean([np.sum((a[i] - b[i]) ** 2) for i in range(4)])
        np.testing.assert_allclose(wen.attention_variation(a, b), want, rtol=1e-6)
    # uniform vs first: row i differs by (1 - 1/(i+1))^2 + i/(i+1)^2.
    np.testing.assert_allclose(wen.attention_variation(uniform, first),
                               np.mean([1 - 1 / (i + 1) for i in range(4)]), rtol=1e-6)
    patterns = np.stack([uniform, first, diagonal, uniform])
    matrix = wen.pairwise_variation(patterns)
    assert matrix.shape == (4, 4) and np.all(np.diag(matrix) == 0) and matrix[0, 3] == 0
    mean, low, high = pairs_jackknife(matrix, bounds=(0.0, np.inf))  # as the stage calls it
    pairs = [matrix[i, j] for i in range(4) for j in range(i + 1, 4)]
    np.testing.assert_allclose(mean, np.mean(pairs), rtol=1e-6)
    # Jackknife by brute force: drop each seed, average the remaining pairs.
    loo = [np.mean([matrix[i, j] for i in range(4) for j in range(i + 1, 4) if s not in (i, j)])
           for s in range(4)]
    se = np.sqrt(3 / 4 * np.sum((np.array(loo) - np.mean(loo)) ** 2))
    np.testing.assert_allclose(high - mean, 3.182446305 * se, rtol=1e-6)
    np.testing.assert_allclose(low, max(mean - 3.182446305 * se, 0.0), rtol=1e-6, atol=1e-9)


def test_random_baseline_closed_form_matches_monte_carlo():
    # T = 2, causal: row 0 has one key (distance 0), row 1 two keys: E = 2 * 1 / (2 * 3).
    assert wen.random_baseline(2) == pytest.approx(1 / 6)
    for length, causal in [(17, True), (6, False)]:
        exact = wen.random_baseline(length, causal)
        mc = wen.random_baseline_mc(jax.random.PRNGKey(0), length, 4000, causal)
        assert mc == pytest.approx(exact, rel=0.03), (length, causal)


def _balanced_minimal_model(seed: int = 0):
    """A minimal-first-layer model whose last layer satisfies the balance condition exactly:
    the keys of an open bracket at depth d and of its close at depth d-1 are equal (so are their
    scores under any query) and their values are opposite."""
    cfg = _cfg(front=_minimal(), d_model=32)
    params = model_lib.init_params(jax.random.PRNGKey(seed), cfg)
    table, bins = np.asarray(params["blocks"][0]["minimal"]["table"]), cfg.front.depth_bins
    slot = {(tok, d): int(np.argmax(table[tok * bins + d]))
            for tok in range(cfg.vocab_size) for d in range(bins)}
    rng = np.random.default_rng(seed)
    w_k = np.zeros((32, 1, 32), np.float32)
    w_v = np.zeros((32, 1, 32), np.float32)
    for t in range(K):
        for d in range(1, D + 1):
            o, c = slot[(OPEN[t], d)], slot[(CLOSE[t], d - 1)]
            w_k[o] = w_k[c] = 0.2 * rng.normal(size=(1, 32))
            w_v[o] = rng.normal(size=(1, 32))
            w_v[c] = -w_v[o]
    attn = {**params["blocks"][1]["attn"], "w_k": jnp.asarray(w_k), "w_v": jnp.asarray(w_v),
            "b_v": jnp.zeros((1, 32))}
    params["blocks"][1] = {**params["blocks"][1], "attn": attn}
    return cfg, params, slot


def test_balance_violation_zero_for_a_balanced_model_positive_otherwise():
    cfg, params, slot = _balanced_minimal_model()
    stacked = jax.tree.map(lambda x: x[None], params)
    out = wen.balance_violation(stacked, cfg)
    # Zero up to float32 rounding of terms exp(score) * value of size ~10.
    assert out["Delta"][0] > 0.1 and out["balance_violation"][0] < 1e-4
    # Break one pair (open type 1 at depth 2): the violation is that pair's norm.
    w_v = params["blocks"][1]["attn"]["w_v"].at[slot[(OPEN[1], 2)]].multiply(2.0)
    broken = {**params, "blocks": [params["blocks"][0], {
        **params["blocks"][1], "attn": {**params["blocks"][1]["attn"], "w_v": w_v}}]}
    out = wen.balance_violation(jax.tree.map(lambda x: x[None], broken), cfg)
    assert out["balance_violation"][0] > 1e-2
    # Random models are far from balanced.
    random_cfg = _cfg(front=_minimal())
    keys = jax.random.split(jax.random.PRNGKey(1), 2)
    random = jax.vmap(model_lib.init_params, in_axes=(0, None))(keys, random_cfg)
    assert np.all(wen.balance_violation(random, random_cfg)["balance_violation"] > 1e-2)
    with pytest.raises(ValueError, match="minimal first layer"):
        wen.balance_violation(random, _cfg())


def test_balance_delta_matches_the_model_forward_pass():
    # Delta from the closed-form tables equals the distance between the unnormalized attention
    # outputs computed from the model's own scores and values on the two prefixes.
    cfg = _cfg(front=_minimal())
    params = model_lib.init_params(jax.random.PRNGKey(4), cfg)
    sites = ("blocks.1.attn.scores", "blocks.1.attn.v")

    forward = jax.jit(lambda tokens: model_lib.forward(params, tokens, cfg, cache=sites)[1])

    def unnormalized(text):
        c = forward(_tokens(text)[None])
        w = np.exp(np.asarray(c[sites[0]])[0, 0, -1])  # last query row
        out = np.einsum("khe,hed->kd", np.asarray(c[sites[1]])[0],
                        np.asarray(params["blocks"][1]["attn"]["w_o"]))
        out -= out.mean(-1, keepdims=True)
        return (w[:, None] * out).sum(0)

    prefixes = ["".join(p) for p in itertools.product("([", repeat=D)]
    brute = min(np.linalg.norm(unnormalized(a) - unnormalized(b))
                for a in prefixes for b in prefixes if a[:-1] == b[:-1] and a != b)
    got = wen.balance_terms(params, cfg)["Delta"]
    np.testing.assert_allclose(got, brute, rtol=1e-4)


def test_length_prefixes_are_valid_and_scoring_matches_numpy():
    tokens = wen.length_prefixes(np.random.default_rng(0), 64, K, D, 60)
    assert tokens.shape == (64, 61) and np.all(tokens[:, 0] == dyck.BOS)
    depth = np.asarray(_minimal().depth(tokens))
    assert depth.min() >= 0 and depth.max() == D
    for row in tokens[:8]:  # closes match the innermost open
        stack = []
        for tok in row[1:]:
            if tok in OPEN:
                stack.append(OPEN.index(tok))
            else:
                assert stack.pop() == CLOSE.index(tok)
    cfg = _cfg(max_len=61)
    keys = jax.random.split(jax.random.PRNGKey(5), 3)
    params = jax.vmap(model_lib.init_params, in_axes=(0, None))(keys, cfg)
    out = wen.length_generalization(params, cfg, tokens, 20, close_ids=CLOSE, threshold=0.4,
                                    batch_size=24, members_per_call=2)
    logits = np.asarray(jax.vmap(lambda p: model_lib.forward(p, tokens[:, :-1], cfg)[0])(params))
    probs = np.asarray(jax.nn.softmax(logits, -1))
    targets = tokens[:, 1:]
    ok = np.isin(targets, CLOSE) & (np.arange(1, 61) >= 20)
    p_target = np.take_along_axis(probs, np.broadcast_to(targets[None, ..., None],
                                                         probs.shape[:-1] + (1,)), -1)[..., 0]
    share = p_target / probs[..., list(CLOSE)].sum(-1)
    np.testing.assert_allclose(out["acc"], [(s > 0.4)[ok].mean() for s in share], rtol=1e-6)
    np.testing.assert_allclose(out["argmax_acc"],
                               [(lg.argmax(-1) == targets)[ok].mean() for lg in logits],
                               rtol=1e-6)
    with pytest.raises(ValueError, match="pos_encoding 'none' or 'linear'"):
        wen.length_generalization(params, _cfg(pos_encoding="learned", max_len=61), tokens, 20,
                                  close_ids=CLOSE)
    with pytest.raises(ValueError, match="set model.max_len >= 61"):
        wen.length_generalization(params, _cfg(max_len=40), tokens, 20, close_ids=CLOSE)


# ----------------------------------------------------------------------------- the main job


@pytest.mark.slow
def test_sweep_runs_the_wen_stage_and_proxies_with_a_lambda_axis(config, tmp_path):
    import pandas as pd

    from jaxillusions.configs import wen_attention_variation
    from jaxillusions.pipeline import sweep

    config.wen = wen_attention_variation.get_config().wen
    config.wen.length_min_len, config.wen.length_max_len = 17, 40
    config.wen.length_num_prefixes = 4
    config.model.update(first_layer="minimal", pos_encoding="none", d_model=64, max_len=41)
    config.train.update(num_seeds=3, contrastive_weights=(0.0, 0.5), loss_on="closing",
                        num_steps=10)
    # The bridge: proxies on the same models, one directory per weight.
    config.proxies.update(methods=("svd",), targets=("blocks.-1.attn.k",),
                          eval_splits=("iid", "unseen_depth"))
    proxy_rows = sweep.run(checked(config), str(tmp_path), verbose=False)
    assert {r["seed"] for r in proxy_rows} == {0, 1, 2}
    for weight in ("0", "0.5"):
        table = pd.read_csv(tmp_path / f"contrastive_weight_{weight}" / "results.csv")
        assert set(table.seed) == {0, 1, 2} and set(table.split) == {"iid", "unseen_depth"}
        # Each group's summary names its members (it read "SUMMARY, 3 seeds." in every one).
        head = (tmp_path / f"contrastive_weight_{weight}" / "gap_table.txt").read_text()
        assert head.startswith(f"SUMMARY of the members with contrastive_weight "
                               f"{weight}, 3 seeds. Gap = "), head[:120]
    # A finished sweep is not redone; its rows are read back from every weight's directory.
    assert len(sweep.run(checked(config), str(tmp_path), verbose=False)) == len(proxy_rows)
    rows = pd.read_csv(tmp_path / "wen_results.csv")
    assert list(rows.seed) == [0, 1, 2, 0, 1, 2]
    assert list(rows.contrastive_weight) == [0, 0, 0, 0.5, 0.5, 0.5]
    for key in ("length_gen_acc", "length_gen_argmax_acc", "balance_violation", "acc_iid"):
        assert rows[key].between(0, np.inf).all(), key
    att = pd.read_csv(tmp_path / "wen_attention.csv")
    assert list(att.layer) == [1, 1] and list(att.num_pairs) == [3, 3]
    assert (att.random_baseline > 0).all()
    text = (tmp_path / "wen_summary.txt").read_text()
    assert "Paired differences vs weight 0" in text and "Spearman" in text
    assert (tmp_path / "figures" / "wen_length_generalization.png").exists()
    assert (tmp_path / "tensorboard" / "seed_2_cw0.5").exists()
    # Reports written again (a group's table lost) keep the Wen stage's figures, which share
    # figures/ with the reports' (the whole folder had moved aside, and the stage, done, drew
    # none again); without one of its figures the stage runs again and draws them.
    def drawn():  # name: when written
        return {p.name: p.stat().st_mtime_ns for p in (tmp_path / "figures").glob("wen_*.png")}

    wen_figures = drawn()
    assert len(wen_figures) == 4, wen_figures
    (tmp_path / "contrastive_weight_0" / "gaps.csv").unlink()
    sweep.run(checked(config), str(tmp_path), verbose=False)
    assert drawn() == wen_figures  # kept, not moved aside and drawn again
    for path in (tmp_path / "figures").glob("wen_*.png"):
        path.unlink()
    sweep.run(checked(config), str(tmp_path), verbose=False)
    assert sorted(drawn()) == sorted(wen_figures)


def test_wen_stage_leaves_out_the_balance_violation_where_it_is_undefined(config, tmp_path,
                                                                          capsys):
    # Was: a minimal first layer under a uniform last layer trained, then the stage stopped with
    # "balance violation: uniform_attention_layers is not supported" and wrote nothing.
    import pandas as pd

    from jaxillusions.configs import wen_attention_variation
    from jaxillusions.pipeline import sweep

    config.wen = wen_attention_variation.get_config().wen
    config.wen.length_min_len, config.wen.length_max_len = 17, 40
    config.wen.length_num_prefixes = 4
    config.model.update(first_layer="minimal", pos_encoding="none", d_model=64, max_len=41,
                        uniform_attention_layers=(1,))
    config.train.update(num_seeds=2, num_steps=10)
    config.proxies.methods = ()
    sweep.run(checked(config), str(tmp_path))
    assert ("balance violation: left out (the attention of model.uniform_attention_layers is "
            "not the model's own)") in capsys.readouterr().out
    rows = pd.read_csv(tmp_path / "wen_results.csv")
    assert list(rows.seed) == [0, 1] and "balance_violation" not in rows
    assert rows["length_gen_acc"].between(0, 1).all()


# ----------------------------------------------------------------------------- the audit's defects


def _summary(rows, attention=None):
    import types

    attention = attention or [{"prefix_len": 8, "random_baseline": 0.2,
                               "random_baseline_square": 0.3, "contrastive_weight": 0,
                               "layer": 1, "head": 0, "num_seeds": 3, "variation": 0.1,
                               "low": 0.05, "high": 0.15}]
    return wen.summary(rows, attention, types.SimpleNamespace(wen=types.SimpleNamespace(
        label="t")))


@pytest.mark.parametrize("axis", ["learning_rates", "null"])
def test_a_second_member_axis_is_refused_at_the_door(config, axis):
    """Was: accepted; the summary's {(weight, seed): row} kept one of each seed's learning rates,
    the attention groups pooled both as seeds, wen_results.csv had no column to tell them apart
    (and a null population's untrained members joined the weight groups the same way)."""
    config.wen.enabled = True
    config.train.contrastive_weights = (0.0, 1.0)
    checked(config)  # the weight axis alone is what the stage measures
    if axis == "null":
        config.train.null = ("untrained",)
    else:
        config.train.learning_rates = (0.003, 0.3)
    value = {"null": r"\('untrained',\)", "learning_rates": r"\(0\.003, 0\.3\)"}[axis]
    with pytest.raises(ValueError, match=rf"^train\.{axis}={value}: wen\.enabled measures one "
                       r"member per train\.contrastive_weights value and seed"):
        checked(config)
    config.wen.enabled = False  # without the stage the axis is the proxies' to group
    checked(config)


def test_length_generalization_must_start_beyond_the_training_length(config):
    """Was: wen.length_min_len was compared with wen.length_max_len only, so lengths seen in
    training were scored as generalization."""
    config.wen.update(enabled=True, length_max_len=40, length_min_len=config.data.max_len)
    config.model.update(pos_encoding="none", max_len=41)
    with pytest.raises(ValueError, match=rf"^wen\.length_min_len={config.data.max_len}: must be "
                       rf"in \[data\.max_len \+ 1 = {config.data.max_len + 1}, "):
        checked(config)
    config.wen.length_min_len = config.data.max_len + 1
    checked(config)


def test_rows_hold_the_configs_own_weights(config, tmp_path):
    """Was: float(float32(0.3)) = 0.30000001192092896 in wen_results.csv, which
    `df[df.contrastive_weight == 0.3]` does not match."""
    import types

    import pandas as pd

    from jaxillusions.report import tables

    config.train.contrastive_weights = (0.0, 0.3, 1.0)
    run = checked(config)
    members = train.members(run)
    state = types.SimpleNamespace(healthy=np.ones(len(members.seeds), bool))
    rows = wen._member_rows(state, None, run)
    tables.write_csv(rows, str(tmp_path / "wen_results.csv"), list(rows[0]))
    frame = pd.read_csv(tmp_path / "wen_results.csv")
    for weight in (0.0, 0.3, 1.0):
        assert (frame.contrastive_weight == weight).sum() == config.train.num_seeds, weight


def _large_score_model(factor: float = 40.0):
    """A random minimal-first-layer model whose last layer's queries are `factor` times larger:
    its largest attention scores pass 88, where exp overflows float32."""
    cfg = _cfg(front=_minimal())
    params = model_lib.init_params(jax.random.PRNGKey(4), cfg)
    attn = {**params["blocks"][1]["attn"]}
    attn["w_q"] = attn["w_q"] * factor
    params["blocks"][1] = {**params["blocks"][1], "attn": attn}
    return cfg, params


def test_balance_violation_is_finite_where_exp_of_the_scores_overflows_float32():
    """Was: u = exp(score) * value in float32, inf past a score of 88.7, and delta / Delta NaN
    (inf - inf in Delta). Now each exp is taken less the largest score it is compared with;
    both terms match float64 references: delta from the same scores and values, Delta from the
    model's own forward pass (as test_balance_delta_matches_the_model_forward_pass)."""
    import tolerance

    cfg, params = _large_score_model()
    part = cfg.front
    depth = jnp.arange(1, D + 1)
    open_f = part.features_of(params, jnp.asarray(OPEN)[:, None], depth[None])
    close_f = part.features_of(params, jnp.asarray(CLOSE)[:, None], depth[None] - 1)
    bos_f = part.features_of(params, jnp.asarray([dyck.BOS]), jnp.zeros(1, jnp.int32))
    queries = jnp.concatenate([open_f.reshape(-1, 32), close_f.reshape(-1, 32), bos_f])
    terms = [wen._last_layer_terms(params, cfg, f, queries) for f in (open_f, close_f)]
    top = max(float(np.abs(s).max()) for s, _ in terms)
    assert top > 88.8  # exp(top) is not a float32
    pair = sum(np.exp(np.asarray(s, np.float64))[..., None] * np.asarray(v, np.float64)
               for s, v in terms)  # [Q, k, D, h, d]
    delta = np.linalg.norm(pair.reshape(*pair.shape[:3], -1), axis=-1).max()

    sites = ("blocks.1.attn.scores", "blocks.1.attn.v")
    forward = jax.jit(lambda tokens: model_lib.forward(params, tokens, cfg, cache=sites)[1])

    def unnormalized(text):
        c = forward(_tokens(text)[None])
        w = np.exp(np.asarray(c[sites[0]], np.float64)[0, 0, -1])  # last query row
        out = np.einsum("khe,hed->kd", np.asarray(c[sites[1]], np.float64)[0],
                        np.asarray(params["blocks"][1]["attn"]["w_o"], np.float64))
        out -= out.mean(-1, keepdims=True)
        return (w[:, None] * out).sum(0)

    prefixes = ["".join(p) for p in itertools.product("([", repeat=D)]
    big_delta = min(np.linalg.norm(unnormalized(a) - unnormalized(b))
                    for a in prefixes for b in prefixes if a[:-1] == b[:-1] and a != b)
    out = wen.balance_violation(jax.tree.map(lambda x: x[None], params), cfg)
    assert all(np.isfinite(v[0]) for v in out.values())
    # exp(score) is off by the score's own float32 rounding, relative (scores through width-32
    # matmuls and a LayerNorm), computed two ways.
    rtol = tolerance.two_ways(tolerance.TERM_ULPS * tolerance.EPS32 * np.sqrt(32) * top)
    np.testing.assert_allclose(out["delta"][0], delta, rtol=rtol)
    np.testing.assert_allclose(out["Delta"][0], big_delta, rtol=rtol)
    np.testing.assert_allclose(out["balance_violation"][0], delta / big_delta, rtol=2 * rtol)


def test_the_summary_leaves_out_values_that_are_not_finite_and_says_how_many():
    """Was: one member's NaN made the weight's cell 'nan ± nan (median nan)' under a header
    that counted every seed."""
    rows = [{"contrastive_weight": w, "seed": s, "healthy": True, "acc_iid": 1.0,
             "length_gen_acc": 0.5 + 0.1 * s + 0.05 * w, "length_gen_argmax_acc": 0.5,
             "balance_violation": np.inf if (w, s) == (1, 2) else 1.0 + s + w}
            for w in (0, 1) for s in range(4)]
    text = _summary(rows)
    assert "nan" not in text, text
    line = next(t for t in text.splitlines() if t.startswith("  weight 1 (4 seeds)"))
    finite = [2.0, 3.0, 5.0]
    mean, low, high = wen.interval_stats.t_interval(np.array(finite))
    assert (f"balance_violation {mean:.3f} ± {(high - low) / 2:.3f} (1 of 4 not finite, left "
            f"out) (median {np.median(finite):.3f})") in line, line
    diff = next(t for t in text.splitlines() if t.startswith("  weight 1 - 0 (4 seeds)"))
    assert "(1 of 4 not finite, left out)" in diff
    spearman = text.splitlines()[-1]
    assert spearman.startswith("  weight 1 (3 seeds, 1 with a value not finite left out): ")


def test_spearman_is_a_permutation_test_per_weight_with_an_interval_where_it_has_one():
    """Was: scipy's asymptotic p (n = 3, a perfect ranking: p = 0), no interval, and an 'all
    weights' line pooling the same seeds under every weight as independent models."""
    from jaxillusions.report import stats

    def rows_of(num_seeds):
        rng = np.random.default_rng(num_seeds)
        return [{"contrastive_weight": w, "seed": s, "healthy": True, "acc_iid": 1.0,
                 "length_gen_acc": acc, "length_gen_argmax_acc": 0.5, "balance_violation": bv}
                for w in (0, 1) for s, (acc, bv) in enumerate(zip(
                    rng.uniform(0.3, 0.9, num_seeds), rng.uniform(0.5, 2, num_seeds),
                    strict=True))]

    for num_seeds in (3, stats.MIN_BOOTSTRAP_SEEDS):
        rows = rows_of(num_seeds)
        text = _summary(rows)
        assert "all weights" not in text and "not pooled over weights" in text
        for w in (0, 1):
            x, y = (np.array([r[k] for r in rows if r["contrastive_weight"] == w])
                    for k in ("balance_violation", "length_gen_acc"))
            rho, low, high, p = stats.spearman_interval(x, y)
            interval = (f"[{low:+.3f}, {high:+.3f}]" if num_seeds >= stats.MIN_BOOTSTRAP_SEEDS
                        else "(no interval: the bootstrap takes "
                             f"{stats.MIN_BOOTSTRAP_SEEDS} seeds or more)")
            noise = ", within noise" if p >= 0.05 else ""
            assert (f"  weight {w} ({num_seeds} seeds): rho = {rho:+.3f} {interval}, "
                    f"p = {p:.2g}{noise}") in text.splitlines(), text
    # A perfect ranking of 3 seeds: the exact permutation p is 2/6, not 0.
    rows = [{**r, "length_gen_acc": 0.1 * r["balance_violation"]} for r in rows_of(3)]
    assert "rho = +1.000 (no interval: the bootstrap takes 16 seeds or more), p = 0.33, within " \
           "noise" in _summary(rows)


def test_paired_differences_say_which_are_within_noise():
    """Was: mean ± half-width alone, so an interval containing 0 read like an effect."""
    from jaxillusions.report import stats

    gain = np.array([0.10, 0.12, 0.11, 0.13])  # every seed gains: the interval excludes 0
    noise = np.array([0.05, -0.04, 0.03, -0.05])  # the interval contains 0
    rows = [{"contrastive_weight": w, "seed": s, "healthy": True, "acc_iid": 0.9,
             "length_gen_acc": 0.5 + w * gain[s], "length_gen_argmax_acc": 0.5 + w * noise[s]}
            for w in (0, 1) for s in range(4)]
    text = _summary(rows)
    assert "* where the interval excludes 0, unmarked: within noise" in text
    diff = next(t for t in text.splitlines() if t.startswith("  weight 1 - 0 (4 seeds)"))
    for key, marked in (("length_gen_acc", True), ("length_gen_argmax_acc", False)):
        diffs = np.array([rows[4 + s][key] - rows[s][key] for s in range(4)])
        mean, low, high = stats.t_interval(diffs)
        assert (low > 0) == marked and (low < 0 < high) != marked
        mark = "*" if marked else ""
        assert f"{key} {mean:.3f} ± {(high - low) / 2:.3f}{mark}," in diff + ",", diff
    assert "acc_iid 0.000 ± 0.000," in diff  # no difference at all: unmarked
    # 8d: no "balance violation also as median" for models that have none.
    assert "median" not in text


def test_attention_figure_labels_every_weight_including_zero():
    """Was: 'cw0.3', 'cw1' and a bare λ = 0 bar."""
    attention = [{"label": "contrastive", "contrastive_weight": w, "layer": 1, "variation": 0.2,
                  "low": 0.1, "high": 0.3, "random_baseline": 0.18} for w in (0.0, 0.3, 1.0)]
    fig = wen.attention_figure(attention)
    names = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert names == [f"contrastive\nL1 cw{w:g}" for w in (0.0, 0.3, 1.0)]
    one = wen.attention_figure(attention[:1])  # one weight (wen-attention's variants): no tag
    assert [t.get_text() for t in one.axes[0].get_xticklabels()] == ["contrastive\nL1"]


def _variant_configs(variants):
    from jaxillusions.configs import wen_attention_variation

    return {v: checked(wen_attention_variation.get_config(v)) for v in variants}


def test_wen_attention_checks_every_variant_workdir_before_training_any(tmp_path, monkeypatch):
    """Was: the first variant trained for minutes, then the second's workdir, holding another
    config, stopped the launch."""
    from jaxillusions.configs import wen_attention_variation
    from jaxillusions.launch import wen_attention

    other = wen_attention_variation.get_config("standard_nope")
    other.train.num_steps = 7
    train.claim_workdir(str(tmp_path / "standard_nope"), checked(other))
    trained = []
    monkeypatch.setattr(wen_attention.sweep, "run", lambda config, workdir, **kw: trained.append(
        workdir))
    with pytest.raises(ValueError, match=r"standard_nope holds a run with a different config "
                       r"\(1 training key differs, e.g. train.num_steps: 7 there vs 1000 now\)"):
        wen_attention.run_variants(_variant_configs(("minimal", "standard_nope")),
                                   str(tmp_path), False)
    assert trained == [] and not (tmp_path / "minimal").exists()


def test_wen_attention_joins_every_variant_there_and_names_them(tmp_path, monkeypatch, capsys):
    """Was: a --variants subset rewrote the joined table, CSV and figure with that subset only."""
    import pandas as pd

    from jaxillusions.launch import wen_attention
    from jaxillusions.report import tables

    for variant in ("minimal", "standard_linear"):
        os.makedirs(tmp_path / variant)
        row = {"label": variant, "contrastive_weight": 0.0, "layer": 1, "head": 0,
               "variation": 0.2, "low": 0.1, "high": 0.3, "num_seeds": 3, "num_pairs": 3,
               "prefix_len": 17, "random_baseline": 0.18, "random_baseline_square": 0.1}
        tables.write_csv([row], str(tmp_path / variant / "wen_attention.csv"), list(row))
    monkeypatch.setattr(wen_attention.sweep, "run", lambda *a, **k: None)
    wen_attention.run_variants(_variant_configs(("standard_linear",)), str(tmp_path), False)
    assert list(pd.read_csv(tmp_path / "wen_attention.csv").label) == ["minimal",
                                                                       "standard_linear"]
    head = (tmp_path / "wen_attention_table.txt").read_text().splitlines()[0]
    assert head == ("variants: minimal, standard_linear (minimal from an earlier launch); not "
                    "run yet: standard_nope")
    assert head in capsys.readouterr().out
    assert (tmp_path / "wen_attention_variation.png").exists()
