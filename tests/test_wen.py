"""Wen et al. on the same engine: model and objective options, measurements."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxillusions import model as model_lib
from jaxillusions import train
from jaxillusions.data import dyck

K, D = 2, 4  # Dyck-(2, 4)
OPEN = tuple(dyck.open_id(t, K) for t in range(K))
CLOSE = tuple(dyck.close_id(t, K) for t in range(K))


def _cfg(**overrides):
    kw = dict(vocab_size=dyck.vocab_size(K), max_len=40, n_layers=2, d_model=32, d_mlp=32,
              pos_encoding="none", open_ids=OPEN, close_ids=CLOSE, max_depth=D,
              depth_bins=D + 2)
    return model_lib.ModelConfig(**{**kw, **overrides})


def _tokens(text: str) -> np.ndarray:
    """'([])' -> BOS + token ids (types: ( ) and [ ])."""
    ids = {"(": OPEN[0], "[": OPEN[1], ")": CLOSE[0], "]": CLOSE[1]}
    return np.array([dyck.BOS] + [ids[c] for c in text], np.int32)


def _leaves(tree):
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


# ----------------------------------------------------------------------------- model options


@pytest.mark.parametrize("embedding", model_lib.MINIMAL_EMBEDDINGS)
def test_minimal_first_layer_depends_only_on_type_and_depth(embedding):
    cfg = _cfg(first_layer="minimal", minimal_embedding=embedding)
    params = model_lib.init_params(jax.random.PRNGKey(0), cfg)
    # Position 5 of the first is ')' at depth 1 after "[(", position 9 of the second is ')' at
    # depth 1 after a different history; equal (token, depth) -> equal output.
    a, b = _tokens("[()[()]"), _tokens("(())[[]]([()])")
    _, ca = model_lib.forward(params, a[None], cfg, cache=("blocks.0.resid_post",))
    _, cb = model_lib.forward(params, b[None], cfg, cache=("blocks.0.resid_post",))
    out_a = np.asarray(ca["blocks.0.resid_post"][0])
    out_b = np.asarray(cb["blocks.0.resid_post"][0])
    depth_a = np.asarray(model_lib.bracket_depth(a, cfg))
    depth_b = np.asarray(model_lib.bracket_depth(b, cfg))
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
        cfg = _cfg(first_layer="minimal", minimal_embedding=embedding)
        params = model_lib.init_params(jax.random.PRNGKey(0), cfg)
        _, c = model_lib.forward(params, tokens[None], cfg, cache=("blocks.0.minimal.out",))
        out = np.asarray(c["blocks.0.minimal.out"][0])
        assert out.shape == (4, 32) and np.all(out[:, cfg.minimal_dim:] == 0)
        if expect is None:  # one-hot: distinct unit vectors
            np.testing.assert_array_equal(out.sum(1), 1.0)
            assert len({int(np.argmax(r)) for r in out}) == 4
        else:
            for i, d in enumerate([0, 1, 2, 3]):
                np.testing.assert_allclose(out[i, :cfg.minimal_dim], expect(tokens[i], d),
                                           atol=1e-6)


def test_bad_minimal_configs_are_one_line_errors():
    with pytest.raises(ValueError, match="pos_encoding must be 'none'"):
        _cfg(first_layer="minimal", pos_encoding="linear")
    with pytest.raises(ValueError, match="more than d_model=8"):
        _cfg(first_layer="minimal", d_model=8)
    with pytest.raises(ValueError, match="minimal_embedding"):
        _cfg(first_layer="minimal", minimal_embedding="rope")
    with pytest.raises(ValueError, match="d_model >= vocab_size"):
        _cfg(embedding="onehot", d_model=4)


def test_frozen_tables_do_not_move_and_the_rest_trains(config):
    config.model.first_layer = "minimal"
    config.model.pos_encoding = "none"
    config.model.d_model = 64
    splits, model_cfg, tx = train.build(config)
    assert model_lib.frozen_paths(model_cfg) == ("blocks/0/minimal/table",)
    before = train.init_state([0, 1], model_cfg, tx)
    table = np.asarray(before.params["blocks"][0]["minimal"]["table"])
    w_q = np.asarray(before.params["blocks"][1]["attn"]["w_q"])
    after, _ = train.train_steps(before, jnp.asarray(splits["train"].tokens), num_steps=5,
                                 model_cfg=model_cfg, tx=tx, batch_size=8)
    np.testing.assert_array_equal(after.params["blocks"][0]["minimal"]["table"], table)
    assert not np.allclose(after.params["blocks"][1]["attn"]["w_q"], w_q)
    # Frozen one-hot token embeddings of the standard first layer.
    config.model.first_layer, config.model.embedding = "standard", "onehot"
    _, model_cfg, tx = train.build(config)
    state = train.init_state([0], model_cfg, tx)
    np.testing.assert_array_equal(state.params["embed"][0], np.eye(model_cfg.vocab_size, 64))
    state, _ = train.train_steps(state, jnp.asarray(splits["train"].tokens), num_steps=5,
                                 model_cfg=model_cfg, tx=tx, batch_size=8)
    np.testing.assert_array_equal(state.params["embed"][0], np.eye(model_cfg.vocab_size, 64))


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
    got = train.lm_loss(params, jnp.asarray(tokens), cfg, loss_on="closing")
    np.testing.assert_allclose(got, nll[closing].mean(), rtol=1e-5)
    got_all = train.lm_loss(params, jnp.asarray(tokens), cfg)
    np.testing.assert_allclose(got_all, nll[targets != dyck.PAD].mean(), rtol=1e-5)


def test_contrastive_prefixes_are_balanced_with_exactly_one_extra_pair():
    cfg = _cfg()
    tokens, lengths = train.contrastive_prefixes(jax.random.PRNGKey(0), 500, cfg, D)
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


def test_contrastive_regularizer_is_zero_iff_logits_ignore_balanced_prefixes():
    cfg = _cfg(max_len=60)
    params = model_lib.init_params(jax.random.PRNGKey(2), cfg)
    x = jnp.asarray(np.stack([np.r_[_tokens("([])[]"), dyck.EOS, 0, 0],
                              np.r_[_tokens("(())"), dyck.EOS, 0, 0, 0, 0]]))
    logits_x, _ = model_lib.forward(params, x, cfg)
    key = jax.random.PRNGKey(3)
    assert train.contrastive_loss(params, x, logits_x, key, cfg, D) > 1e-4
    # Attention writes nothing: each position's logits depend on its own token only.
    blind = jax.tree_util.tree_map_with_path(
        lambda path, v: jnp.zeros_like(v) if model_lib.path_str(path).endswith(
            ("attn/w_o", "attn/b_o")) else v, params)
    logits_x, _ = model_lib.forward(blind, x, cfg)
    assert float(train.contrastive_loss(blind, x, logits_x, key, cfg, D)) == 0.0


def test_vmapped_lambda_sweep_equals_single_runs(config):
    config.train.contrastive_weights = (0.0, 0.5)
    config.train.loss_on = "closing"
    splits, model_cfg, tx = train.build(config)
    objective = train.objective_from_config(config)
    members = train.members(config)
    assert list(members.seeds) == [0, 1, 0, 1]
    np.testing.assert_array_equal(members.hparams["contrastive_weight"], [0, 0, 0.5, 0.5])
    tokens = jnp.asarray(splits["train"].tokens)
    run = dict(num_steps=8, model_cfg=model_cfg, tx=tx, batch_size=8, objective=objective)
    together, _ = train.train_steps(train.init_state(members.seeds, model_cfg, tx), tokens,
                                    members.hparams, **run)
    for i, (weight, seed) in enumerate([(0.0, 0), (0.0, 1), (0.5, 0), (0.5, 1)]):
        alone, _ = train.train_steps(train.init_state([seed], model_cfg, tx), tokens,
                                     {"contrastive_weight": np.float32([weight])}, **run)
        for a, b in zip(_leaves(together.params), _leaves(alone.params), strict=True):
            np.testing.assert_allclose(a[i], b[0], rtol=1e-5, atol=1e-6)
    # The weight matters: same seed, different weight, different parameters.
    w = together.params["unembed"]["w"]
    assert not np.allclose(w[0], w[2], atol=1e-4)


def test_bad_objective_options_are_one_line_errors(config):
    config.train.loss_on = "opening"
    with pytest.raises(ValueError, match="train.loss_on='opening'"):
        train.build(config)
    config.train.loss_on = "all"
    config.train.contrastive_weights = (0.3, -1.0)
    with pytest.raises(ValueError, match="contrastive_weights"):
        train.build(config)
