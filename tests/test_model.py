import dataclasses
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tolerance as tol

from jaxillusions import model as model_lib
from jaxillusions.config import settings


def _setup(**overrides):
    cfg = model_lib.ModelConfig(vocab_size=11, max_len=12, d_model=16, d_mlp=32, **overrides)
    params = model_lib.init_params(jax.random.PRNGKey(0), cfg)
    tokens = jax.random.randint(jax.random.PRNGKey(1), (3, 10), 0, 11)
    return cfg, params, tokens


def _within(got, want, cfg):
    """Logits of the same model computed by two float32 programs (other shapes or batching):
    each within its rounding through matmuls of up to d_mlp terms, per row."""
    want = np.asarray(want, np.float64)
    assert np.all(np.abs(np.asarray(got, np.float64) - want)
                  <= tol.two_ways(tol.activation_error(want, max(cfg.d_mlp, cfg.vocab_size))))


@pytest.mark.parametrize("pos", model_lib.POS_ENCODINGS)
def test_forward_shapes_and_every_site_cached(pos):
    cfg, params, tokens = _setup(pos_encoding=pos, n_heads=2)
    logits, cache = model_lib.forward(params, tokens, cfg, cache=model_lib.site_names(cfg))
    assert logits.shape == (3, 10, 11)
    assert set(cache) == set(model_lib.site_names(cfg))
    assert cache["blocks.1.attn.k"].shape == (3, 10, 2, 8)
    assert cache["blocks.0.attn.pattern"].shape == (3, 2, 10, 10)
    np.testing.assert_allclose(cache["blocks.0.attn.pattern"].sum(-1), 1.0, rtol=1e-5)
    np.testing.assert_array_equal(cache["logits"], logits)


def test_causal_prefix_invariance():
    cfg, params, tokens = _setup()
    full, _ = model_lib.forward(params, tokens, cfg)
    prefix, _ = model_lib.forward(params, tokens[:, :6], cfg)
    # Other shapes, other float32 programs: within the logits' rounding through the model's
    # matmuls (tests/tolerance.py), per row.
    _within(full[:, :6], prefix, cfg)


def test_intervention_identity_and_effect():
    cfg, params, tokens = _setup()
    base, _ = model_lib.forward(params, tokens, cfg)
    same, _ = model_lib.forward(params, tokens, cfg, intervention=lambda name, x: x)
    np.testing.assert_array_equal(base, same)
    seen = []

    def zero_keys(name, x):
        seen.append(name)
        return jnp.zeros_like(x) if name == "blocks.1.attn.k" else x

    changed, cache = model_lib.forward(params, tokens, cfg, intervention=zero_keys,
                                       cache=("blocks.1.attn.k", "blocks.1.attn.pattern"))
    assert seen == list(model_lib.site_names(cfg))
    assert not np.allclose(base, changed)
    np.testing.assert_array_equal(cache["blocks.1.attn.k"], 0.0)
    # Zero keys give equal scores, hence uniform causal attention in that layer.
    causal = np.tril(np.ones((10, 10)))
    np.testing.assert_allclose(cache["blocks.1.attn.pattern"][0, 0],
                               causal / causal.sum(-1, keepdims=True), rtol=1e-5)


@pytest.mark.parametrize("overrides", [{}, {"pos_encoding": "rotary", "n_heads": 2},
                                       {"n_layers": 3, "attn_only": True}])
def test_a_span_from_a_block_gives_the_logits_of_the_whole_pass(overrides):
    """forward(span=Span(layer, residual)) from the residual stream a whole pass had there
    visits only the sites from block `layer` on and gives that pass's logits, with or without
    an intervention there (within the rounding of two float32 programs)."""
    cfg, params, tokens = _setup(**overrides)
    for layer in range(cfg.n_layers + 1):
        later = [n for n in model_lib.site_names(cfg)
                 if model_lib.first_block(cfg, [n]) is not None
                 and model_lib.first_block(cfg, [n]) >= layer]

        def halve_later_keys(name, x, later=later):
            return x / 2 if name.endswith("attn.k") and name in later else x

        site = model_lib.residual_site(cfg, layer)
        for intervention in (None, halve_later_keys):
            whole, cache = model_lib.forward(params, tokens, cfg, cache=(site,),
                                             intervention=intervention)
            seen = []

            def visit(name, x, intervention=intervention, seen=seen):
                seen.append(name)
                return x if intervention is None else intervention(name, x)

            part, _ = model_lib.forward(params, tokens, cfg, intervention=visit,
                                        span=model_lib.Span(layer, cache[site]))
            _within(part, whole, cfg)
            assert seen == later
    assert model_lib.first_block(cfg, ["blocks.1.attn.k", "blocks.0.attn.out"]) == 0
    assert model_lib.first_block(cfg, ["logits"]) == cfg.n_layers
    assert model_lib.first_block(cfg, ["embed", "blocks.1.attn.k"]) is None
    with pytest.raises(ValueError, match="start layer"):
        model_lib.residual_site(cfg, cfg.n_layers + 1)


@pytest.mark.parametrize("overrides", [{}, {"parallel_residual": True, "n_heads": 2},
                                       {"n_layers": 3, "attn_only": True}])
def test_a_readout_span_gives_the_logits_of_the_whole_pass_at_its_positions(overrides):
    """forward(span=Span(readout=positions)) gives the whole pass's logits at those positions
    (within the rounding of two float32 programs: matrix products over other rows), from the
    tokens or from a block's residual stream; the sites up to the last block's values and keys
    keep every position (`before_readout`), the later ones hold the readout's (the scores and
    the pattern its query rows); the same positions listed twice give the same logits twice;
    a model with a standing intervention is never read out."""
    cfg, params, tokens = _setup(**overrides)
    last = cfg.n_layers - 1
    readout = jnp.array([[0, 3, 9], [2, 2, 5], [9, 8, 1]])
    names = model_lib.site_names(cfg)
    whole, cache = model_lib.forward(params, tokens, cfg, cache=names)
    at = np.take_along_axis(np.asarray(whole), np.asarray(readout)[..., None], 1)
    site = model_lib.residual_site(cfg, last)
    for span in (model_lib.Span(readout=readout),
                 model_lib.Span(last, cache[site], readout),
                 model_lib.Span(cfg.n_layers, cache[model_lib.residual_site(cfg, cfg.n_layers)],
                                readout)):
        part, seen = model_lib.forward(params, tokens, cfg, cache=names, span=span)
        assert part.shape == (3, 3, cfg.vocab_size)
        _within(part, at, cfg)
        np.testing.assert_array_equal(part[1, 0], part[1, 1])
        for name, value in seen.items():  # positions: [batch, head, query, key], [pos, d]
            positions = value.shape[2 if name.endswith(("scores", "pattern"))
                                    else 0 if name == "pos_embed" else 1]
            assert positions == (10 if model_lib.before_readout(cfg, [name]) else 3), name
    assert model_lib.before_readout(cfg, [f"blocks.{last}.attn.v", "embed"])
    assert not model_lib.before_readout(cfg, [f"blocks.{last}.attn.scores"])
    assert not model_lib.before_readout(cfg, ["ln_final"])
    uniform = dataclasses.replace(cfg, interventions=(model_lib.UniformAttention((0,)),))
    assert not model_lib.before_readout(uniform, ())


def test_frozen_uniform_attention_and_attn_only():
    cfg, params, tokens = _setup(interventions=(model_lib.UniformAttention((0,)),),
                                 attn_only=True)
    _, cache = model_lib.forward(params, tokens, cfg, cache=("blocks.0.attn.pattern",))
    causal = np.tril(np.ones((10, 10)))
    np.testing.assert_allclose(cache["blocks.0.attn.pattern"][1, 0],
                               causal / causal.sum(-1, keepdims=True), rtol=1e-6)
    assert "mlp" not in params["blocks"][0]
    assert "blocks.0.mlp.out" not in model_lib.site_names(cfg)


def test_uniform_attention_is_a_standing_intervention_with_the_old_arithmetic():
    """The layer's pattern is the one forward computed in place of the softmax before it became
    an intervention (bit for bit), forward applies it before the caller's intervention, and the
    layer's queries and keys get no gradient, as before."""
    plain, params, tokens = _setup(n_layers=3)
    cfg = model_lib.ModelConfig(**{**plain.__dict__,
                                   "interventions": (model_lib.UniformAttention((0, 2)),)})
    section = dataclasses.replace(settings.Model(), n_layers=3, d_model=16, d_mlp=32,
                                  uniform_attention_layers=[0, 2])
    assert cfg == model_lib.ModelConfig.from_settings(section, vocab_size=11, max_len=12)

    def old(site, value):  # the code that forward ran for a frozen layer
        if site in ("blocks.0.attn.pattern", "blocks.2.attn.pattern"):
            causal = jnp.tril(jnp.ones(value.shape[-2:], bool))
            return jnp.broadcast_to(causal / causal.sum(-1, keepdims=True), value.shape)
        return value

    sites = ("blocks.0.attn.pattern", "blocks.1.attn.pattern", "logits")
    got, got_cache = model_lib.forward(params, tokens, cfg, cache=sites)
    want, want_cache = model_lib.forward(params, tokens, plain, intervention=old, cache=sites)
    np.testing.assert_array_equal(got, want)
    for site in sites:
        np.testing.assert_array_equal(got_cache[site], want_cache[site])
    # The caller's intervention sees the frozen pattern (it runs after the standing one).
    seen = {}
    model_lib.forward(params, tokens, cfg, intervention=lambda s, v: seen.setdefault(s, v))
    np.testing.assert_array_equal(seen["blocks.0.attn.pattern"],
                                  got_cache["blocks.0.attn.pattern"])
    grads = jax.grad(lambda p: model_lib.forward(p, tokens, cfg)[0].sum())(params)
    for layer, frozen in ((0, True), (1, False), (2, True)):
        for name in ("w_q", "b_q", "w_k"):
            assert bool((grads["blocks"][layer]["attn"][name] == 0).all()) == frozen
    with pytest.raises(ValueError, match=r"uniform_attention_layers=\(3,\): layers \[3\]"):
        model_lib.ModelConfig(vocab_size=5, max_len=4,
                              interventions=(model_lib.UniformAttention((3,)),))


def test_forward_has_no_variant_branch_and_the_config_no_task_fields():
    """Variants are parts (ModelConfig.front) and standing interventions, not flags: forward
    and the config name none of them, nor the data a part is built from."""
    source = inspect.getsource(model_lib).lower()
    for word in ("first_layer", "minimal_embedding", "open_ids",
                 "close_ids", "depth_bins", "max_depth", "bracket"):
        assert word not in source, word
    body = inspect.getsource(model_lib.forward)
    assert "uniform" not in body and "minimal" not in body
    assert {f.name for f in dataclasses.fields(model_lib.ModelConfig)} == {
        "vocab_size", "max_len", "n_layers", "n_heads", "d_model", "d_head", "d_mlp",
        "pos_encoding", "rotary_base", "attn_only", "embedding", "compute_dtype", "front",
        "interventions"} | set(model_lib.IMPORTED_FIELDS)  # what checkpoints set (pretrained.py)


def test_attention_pattern_is_the_softmax_with_its_own_derivative():
    """The model's attention softmax gives jax.nn.softmax's values bit for bit; its gradient is
    softmax's own rule, p (g - sum(g p)) (a custom_jvp in the traced program, not autodiff
    through exp and the quotient), within float32 rounding of the exact one, as is autodiff's."""
    k = 7
    scores = jax.random.normal(jax.random.PRNGKey(0), (2, 3, k, k)) * 4
    scores = jnp.where(jnp.tril(jnp.ones((k, k), bool)), scores, -jnp.inf)
    g = jax.random.normal(jax.random.PRNGKey(1), scores.shape)
    p = model_lib.attention_pattern(scores)
    np.testing.assert_array_equal(p, jax.nn.softmax(scores, axis=-1))
    assert "custom_jvp_call" in str(jax.make_jaxpr(model_lib.attention_pattern)(scores))

    s64, g64 = np.asarray(scores, np.float64), np.asarray(g, np.float64)
    p64 = np.exp(s64 - s64.max(-1, keepdims=True))
    p64 /= p64.sum(-1, keepdims=True)
    exact = p64 * (g64 - np.sum(g64 * p64, -1, keepdims=True))
    # p's error moves each term of p (g - sum(g p)); the rule's own roundings (a product, a sum
    # of k terms, a difference, a product) add (TERM_ULPS + sqrt(k)) EPS32 of its magnitude.
    p_err = tol.softmax_error(p64, s64, 0.0)
    bound = (p_err * np.abs(g64 - np.sum(g64 * p64, -1, keepdims=True))
             + p64 * np.sum(np.abs(g64) * p_err, -1, keepdims=True)
             + (tol.TERM_ULPS + np.sqrt(k)) * tol.EPS32 * p64
             * (np.abs(g64) + np.sum(np.abs(g64) * p64, -1, keepdims=True)))
    for f in (model_lib.attention_pattern, lambda x: jax.nn.softmax(x, axis=-1)):
        _, vjp = jax.vjp(f, scores)
        grad = np.asarray(vjp(g)[0], np.float64)
        assert np.all(np.abs(grad - exact) <= bound)


@pytest.mark.parametrize("d, f", [(8, 32), (32, 8), (16, 16)])  # widening, narrowing, equal
def test_projections_have_einsums_values_and_gradients_by_their_own_rule(d, f):
    """model.projection (the MLP's two projections, the unembedding, the attention's output
    projection) gives einsum's values bit for bit under vmap over seeds; its gradients,
    computed by its own rule (a narrowing one's weight gradient as a product behind
    optimization barriers; a widening or equal one's as x^T g), are the exact
    ones (float64) within float32 rounding of sums of n terms, as are autodiff's of the
    einsum; in bfloat16 they keep the operands' dtypes."""
    s, n = 3, 40  # seeds, positions (2 x 20)
    kx, kw, kg = jax.random.split(jax.random.PRNGKey(2), 3)
    x = jax.random.normal(kx, (s, 2, n // 2, d))
    w = jax.random.normal(kw, (s, d, f)) / np.sqrt(d)
    g = jax.random.normal(kg, (s, 2, n // 2, f))

    def einsum(x, w):
        return jnp.einsum("...d,df->...f", x, w, preferred_element_type=jnp.float32)

    y = jax.vmap(model_lib.projection)(x, w)
    np.testing.assert_array_equal(y, jax.vmap(einsum)(x, w))
    assert "custom_vjp_call" in str(jax.make_jaxpr(model_lib.projection)(x[0], w[0]))
    backward = str(jax.make_jaxpr(lambda a, b, c: jax.vjp(model_lib.projection, a, b)[1](c))(
        x[0], w[0], g[0]))
    assert backward.count("optimization_barrier") == (2 if f < d else 0)

    x64, w64, g64 = (np.asarray(a, np.float64) for a in (x, w, g))
    exact_dx = np.einsum("sbtf,sdf->sbtd", g64, w64)
    exact_dw = np.einsum("sbtd,sbtf->sdf", x64, g64)
    bound_dx = (tol.sum_error(f, np.einsum("sbtf,sdf->sbtd", np.abs(g64), np.abs(w64)))
                + tol.TERM_ULPS * tol.EPS32 * np.abs(exact_dx))
    bound_dw = (tol.sum_error(n, np.einsum("sbtd,sbtf->sdf", np.abs(x64), np.abs(g64)))
                + tol.TERM_ULPS * tol.EPS32 * np.abs(exact_dw))
    for fn in (model_lib.projection, einsum):
        _, vjp = jax.vjp(jax.vmap(fn), x, w)
        dx, dw = (np.asarray(a, np.float64) for a in vjp(g))
        assert np.all(np.abs(dx - exact_dx) <= bound_dx)
        assert np.all(np.abs(dw - exact_dw) <= bound_dw)

    xb, wb = x[0].astype(jnp.bfloat16), w[0].astype(jnp.bfloat16)
    out, vjp = jax.vjp(model_lib.projection, xb, wb)
    assert out.dtype == jnp.float32
    assert [a.dtype for a in vjp(g[0])] == [jnp.bfloat16, jnp.bfloat16]


def test_the_model_projects_through_the_rule_where_it_pays():
    # The attention's output projection and the MLP's input and output in every layer (d_mlp
    # 32, d_model 16), and the unembedding unless the vocabulary is as wide as the model (11
    # and 17, not 16).
    for vocab, calls in ((11, 7), (16, 6), (17, 7)):
        cfg = model_lib.ModelConfig(vocab_size=vocab, max_len=12, n_layers=2, d_model=16,
                                    d_mlp=32)
        params = model_lib.init_params(jax.random.PRNGKey(0), cfg)
        jaxpr = str(jax.make_jaxpr(lambda p, c=cfg: model_lib.forward(
            p, jnp.zeros((1, 4), int), c)[0])(params))
        assert jaxpr.count("custom_vjp_call") == calls, vocab


def test_vmap_over_seed_axis_matches_single_models():
    cfg, _, tokens = _setup()
    keys = jax.random.split(jax.random.PRNGKey(5), 3)
    stacked = jax.vmap(model_lib.init_params, in_axes=(0, None))(keys, cfg)
    batched = jax.vmap(lambda p: model_lib.forward(p, tokens, cfg)[0])(stacked)
    for i, key in enumerate(keys):
        single, _ = model_lib.forward(model_lib.init_params(key, cfg), tokens, cfg)
        _within(batched[i], single, cfg)


def test_forward_refuses_unknown_cached_sites_and_stacked_params_at_tracing():
    """One-line errors on the static names and shapes, before any computation: a cached site
    the model does not have (a plain string is one site), and params with a leading member
    axis (one model's are expected; several go through jax.vmap)."""
    cfg, params, tokens = _setup()
    for cache in [("blocks.1.attn.pattern", "blocks.1.attn.patern"), ("blocks.5.attn.pattern",)]:
        with pytest.raises(ValueError, match=f"^unknown activation site '{cache[-1]}'; this "
                           "model has: embed, .*blocks.1.attn.pattern"):
            model_lib.forward(params, tokens, cfg, cache=cache)
    with pytest.raises(ValueError, match="unknown activation site 'nope'"):
        jax.jit(lambda p: model_lib.forward(p, tokens, cfg, cache="nope"))(params)
    _, one = model_lib.forward(params, tokens, cfg, cache="blocks.1.attn.pattern")
    assert set(one) == {"blocks.1.attn.pattern"}
    stacked = jax.tree.map(lambda x: jnp.stack([x] * 3), params)
    with pytest.raises(ValueError, match=r"params have a leading member axis \(ln_final scale "
                       r"\(3, 16\)\): pass one member's, run.seed_params\(seed\), or jax.vmap"):
        model_lib.forward(stacked, tokens, cfg)
    batched = jax.vmap(lambda p: model_lib.forward(p, tokens, cfg)[0])(stacked)
    _within(batched[2], model_lib.forward(params, tokens, cfg)[0], cfg)


def test_forward_refuses_params_tokens_and_interventions_that_do_not_fit():
    """One line naming what is wrong, before any computation (they had run through with another
    model's numbers, clamped token ids, or failed in an einsum naming nothing): params of another
    architecture (the first parameter that differs, or one missing), tokens not [batch, pos],
    known token ids outside the vocabulary, and an intervention that returns something other
    than an array of its site's shape."""
    cfg, params, tokens = _setup()
    for other, match in [(dataclasses.replace(cfg, n_layers=3), r"blocks/2/attn/b_o: shape "
                          r"\(16,\) in params, no such parameter in the model config"),
                         (dataclasses.replace(cfg, vocab_size=12), r"embed: shape \(12, 16\) in "
                          r"params, shape \(11, 16\) in the model config \(n_layers 2, d_model "
                          r"16, n_heads 1, vocab_size 11\)")]:
        with pytest.raises(ValueError, match=f"^params: {match}"):
            jax.jit(lambda p: model_lib.forward(p, tokens, cfg)[0])(
                model_lib.init_params(jax.random.PRNGKey(0), other))
    missing = {**params, "ln_final": {"scale": params["ln_final"]["scale"]}}
    with pytest.raises(ValueError, match=r"^params: ln_final/bias: no such parameter in params, "
                       r"shape \(16,\) in the model config"):
        model_lib.forward(missing, tokens, cfg)
    with pytest.raises(ValueError, match=r"^model.forward: tokens \[batch, pos\], not of shape "
                       r"\(10,\)$"):
        model_lib.forward(params, tokens[0], cfg)
    with pytest.raises(ValueError, match=r"^model.forward: token ids 0..11 outside the "
                       r"vocabulary 0..10$"):
        model_lib.forward(params, tokens.at[0, 0].set(11), cfg)
    for returned, got in [(lambda v: None, "None"), (lambda v: v[..., :2], r"shape \(3, 10, 1, "
                                                     r"2\)")]:
        def intervention(site, value, returned=returned):
            return returned(value) if site == "blocks.1.attn.k" else value
        with pytest.raises(ValueError, match=rf"^intervention at blocks.1.attn.k returned {got}, "
                           r"which does not broadcast to the site's shape \(3, 10, 1, 16\)"):
            jax.jit(lambda t, i=intervention: model_lib.forward(
                params, t, cfg, intervention=i)[0])(tokens)
    # What broadcasts to the site's shape is taken (zeros of the last axis: a zero ablation).
    zeroed = [model_lib.forward(params, tokens, cfg, intervention=lambda site, value, z=z: (
        z if site == "blocks.1.attn.out" else value))[0]
        for z in (jnp.zeros(16), jnp.zeros((3, 10, 16)))]
    np.testing.assert_array_equal(zeroed[0], zeroed[1])


def test_bad_model_config_errors():
    with pytest.raises(ValueError, match="pos_encoding"):
        model_lib.ModelConfig(vocab_size=5, max_len=4, pos_encoding="alibi")
    with pytest.raises(ValueError, match="needs an even d_head"):
        model_lib.ModelConfig(vocab_size=5, max_len=4, d_model=6, d_head=3,
                              pos_encoding="rotary")
    cfg = model_lib.ModelConfig(vocab_size=5, max_len=4)
    with pytest.raises(ValueError, match="unknown activation site"):
        model_lib.check_site(cfg, "blocks.7.attn.k")


@pytest.mark.parametrize("pos", ["learned", "sinusoidal", "linear"])
def test_position_offset_shifts_positions(pos):
    cfg, params, tokens = _setup(pos_encoding=pos)
    tokens = tokens[:, :8]
    offset = jnp.array([0, 2, 4])
    shifted, cache = model_lib.forward(params, tokens, cfg, position_offset=offset,
                                       cache=("pos_embed",))
    for i, o in enumerate([0, 2, 4]):
        # Row i equals the model run on o filler tokens + the row, from position o on.
        padded = jnp.concatenate([jnp.zeros((1, o), tokens.dtype), tokens[i:i + 1]], axis=1)
        full, full_cache = model_lib.forward(params, padded, cfg, cache=("pos_embed",))
        np.testing.assert_allclose(cache["pos_embed"][i], full_cache["pos_embed"][o:], atol=1e-6)
        if o == 0:
            _within(shifted[i], full[0], cfg)
    plain, _ = model_lib.forward(params, tokens, cfg)
    np.testing.assert_array_equal(plain[0], shifted[0])


@pytest.mark.slow
def test_bfloat16_compute_dtype_is_mixed_precision():
    cfg32, params, tokens = _setup(n_heads=2)
    cfg16 = model_lib.ModelConfig(**{**cfg32.__dict__, "compute_dtype": "bfloat16"})
    seen = {}

    def record(name, x):
        seen[name] = x.dtype
        return x

    logits32, _ = model_lib.forward(params, tokens, cfg32)
    logits16, cache = model_lib.forward(params, tokens, cfg16, intervention=record,
                                        cache=("blocks.0.mlp.hidden",))
    # Logits and loss-side values stay f32; interventions and the cache see f32 at every site.
    assert logits16.dtype == jnp.float32
    assert set(seen) == set(model_lib.site_names(cfg16))
    assert set(seen.values()) == {jnp.dtype(jnp.float32)}
    assert cache["blocks.0.mlp.hidden"].dtype == jnp.float32
    # bf16 rounding (8 mantissa bits) changes the logits a little, not a lot; f32 is untouched.
    diff = np.abs(np.asarray(logits16) - np.asarray(logits32))
    assert 0 < diff.max() < 0.05 * np.abs(np.asarray(logits32)).max()

    def loss(p, cfg):
        return model_lib.forward(p, tokens, cfg)[0].sum()

    grads = jax.grad(loss)(params, cfg16)  # parameters (and so optimizer state) stay f32
    assert {g.dtype for g in jax.tree.leaves(grads)} == {jnp.dtype(jnp.float32)}
    with pytest.raises(ValueError, match="compute_dtype='float16'"):
        model_lib.ModelConfig(vocab_size=11, max_len=12, compute_dtype="float16")


def test_rotary_scores_depend_on_relative_positions_only():
    # Every position shifted by 40: the same scores up to float32 rounding, in every layer.
    cfg = model_lib.ModelConfig(vocab_size=11, max_len=64, d_model=16, d_mlp=32, n_heads=2,
                                pos_encoding="rotary", rotary_base=100)
    params = model_lib.init_params(jax.random.PRNGKey(0), cfg)
    tokens = jax.random.randint(jax.random.PRNGKey(1), (3, 20), 0, 11)
    sites = model_lib.site_names(cfg)
    assert "pos_embed" not in sites and "blocks.1.attn.rot_k" in sites
    runs = [model_lib.forward(params, tokens, cfg, cache=sites,
                              position_offset=jnp.full((3,), shift))[1] for shift in (0, 40)]
    u, e = 2.0**-24, cfg.head_dim  # float32 unit roundoff; terms of a score's dot product
    # Nothing but the rotation sees positions: the first layer's q and k are the same bits.
    np.testing.assert_array_equal(runs[0]["blocks.0.attn.k"], runs[1]["blocks.0.attn.k"])
    for layer in range(cfg.n_layers):
        q, k = (np.asarray(runs[0][f"blocks.{layer}.attn.{n}"], np.float64) for n in "qk")
        dq, dk = (np.asarray(runs[1][f"blocks.{layer}.attn.{n}"], np.float64)
                  - np.asarray(runs[0][f"blocks.{layer}.attn.{n}"]) for n in "qk")
        s0, s1 = (np.asarray(r[f"blocks.{layer}.attn.scores"]) for r in runs)
        # The rounding of a turned pair (x_a cos - x_b sin, x_b cos + x_a sin): cos and sin
        # rounded to float32, two products and a sum, each a relative error u, so each turned
        # component is within 3u (|x_a| + |x_b|) of the exact one, and bounded by |x_a| + |x_b|.
        # A score adds e products (error e u of the sum of |terms|) and is divided by sqrt(e)
        # (u), and the exact rotated dot products of the two runs are equal, so the runs differ
        # by at most 2 (e + 3 + 3 + 1) u S / sqrt(e), S = sum over pairs of
        # 2 (|q_a| + |q_b|)(|k_a| + |k_b|): the "+ 3 + 3" for the rotation of q and of k.
        qa, ka = np.abs(q[..., 0::2]) + np.abs(q[..., 1::2]), np.abs(k[..., 0::2]) + np.abs(
            k[..., 1::2])
        terms = 2 * np.einsum("bqhi,bkhi->bhqk", qa, ka)
        bound = 1.01 * 2 * (e + 7) * u * terms / np.sqrt(e)  # 1.01: the u^2 terms
        # From the second layer on q and k differ by what the layers below let through; the
        # rotation keeps lengths, so that adds (|dq| |k| + |q + dq| |dk|) / sqrt(e).
        norm = np.linalg.norm
        bound += np.einsum("bqh,bkh->bhqk", norm(dq, axis=-1), norm(k, axis=-1)) / np.sqrt(e)
        bound += np.einsum("bqh,bkh->bhqk", norm(q + dq, axis=-1), norm(dk, axis=-1)) / np.sqrt(e)
        causal = np.isfinite(s0)
        assert np.array_equal(causal, np.isfinite(s1))
        diff = np.abs(np.where(causal, s1, 0) - np.where(causal, s0, 0))
        assert (diff <= np.where(causal, bound, 0)).all(), (layer, (diff - bound).max())
        # The bound is far below the scores' own size: absolute positions would break it.
        assert bound[causal].max() < 1e-4 * np.abs(s0[causal]).max(), layer


def test_rotary_runs_past_max_len_and_a_position_table_does_not():
    # Rotary positions have no table to run out of: max_len is only the export's n_ctx.
    cfg, params, tokens = _setup(pos_encoding="rotary")
    longer = jnp.concatenate([tokens, tokens], axis=1)  # 20 tokens, max_len 12
    logits, _ = model_lib.forward(params, longer, cfg)
    assert logits.shape == (3, 20, 11) and np.isfinite(np.asarray(logits)).all()
    cfg, params, _ = _setup(pos_encoding="learned")
    with pytest.raises(ValueError, match="exceeds the model's max_len 12"):
        model_lib.forward(params, longer, cfg)
