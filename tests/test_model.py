import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tolerance as tol

from jaxillusions import model as model_lib


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


def test_frozen_uniform_attention_and_attn_only():
    cfg, params, tokens = _setup(uniform_attention_layers=(0,), attn_only=True)
    _, cache = model_lib.forward(params, tokens, cfg, cache=("blocks.0.attn.pattern",))
    causal = np.tril(np.ones((10, 10)))
    np.testing.assert_allclose(cache["blocks.0.attn.pattern"][1, 0],
                               causal / causal.sum(-1, keepdims=True), rtol=1e-6)
    assert "mlp" not in params["blocks"][0]
    assert "blocks.0.mlp.out" not in model_lib.site_names(cfg)


def test_vmap_over_seed_axis_matches_single_models():
    cfg, _, tokens = _setup()
    keys = jax.random.split(jax.random.PRNGKey(5), 3)
    stacked = jax.vmap(model_lib.init_params, in_axes=(0, None))(keys, cfg)
    batched = jax.vmap(lambda p: model_lib.forward(p, tokens, cfg)[0])(stacked)
    for i, key in enumerate(keys):
        single, _ = model_lib.forward(model_lib.init_params(key, cfg), tokens, cfg)
        _within(batched[i], single, cfg)


def test_bad_model_config_errors():
    with pytest.raises(ValueError, match="pos_encoding"):
        model_lib.ModelConfig(vocab_size=5, max_len=4, pos_encoding="rotary")
    with pytest.raises(ValueError, match="uniform_attention_layers"):
        model_lib.ModelConfig(vocab_size=5, max_len=4, uniform_attention_layers=(3,))
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
