import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tolerance as tol

from jaxillusions import model, proxies
from jaxillusions.proxies import kmeans, onehot_attention, svd, uniform_attention

F = 8


def _data(n: int = 300, f: int = F, seed: int = 0) -> np.ndarray:
    """Anisotropic data with a nonzero mean: well separated spectrum, centering matters."""
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(n, f)) * 2.0 ** -np.arange(f) * 3 + 1.5).astype(np.float32)


def _blobs(n: int = 400, f: int = 4, k: int = 6, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = 10 * rng.normal(size=(k, f))
    return (centres[rng.integers(0, k, n)] + rng.normal(size=(n, f))).astype(np.float32)


def _softmax_np(shape, seed=0):
    # numpy, not jax.random: compiling threefry for each new shape costs seconds on CPU.
    z = np.exp(np.random.default_rng(seed).normal(size=shape))
    return jnp.asarray(z / z.sum(-1, keepdims=True), jnp.float32)


def _apply_sizes(mod, params, x):
    return jax.vmap(mod.apply, in_axes=(0, None))(params, x)


def _samples(x: np.ndarray, num_pad: int = 0) -> dict:
    """A "samples" statistic with `num_pad` garbage padding rows appended."""
    pad = np.full((num_pad, x.shape[1]), 1e6, np.float32)
    valid = np.r_[np.ones(len(x), bool), np.zeros(num_pad, bool)]
    return {"x": jnp.asarray(np.r_[x, pad]), "valid": jnp.asarray(valid)}


# ----------------------------------------------------------------------------- registry


def test_available_and_get():
    assert set(proxies.available()) == {
        "svd",
        "pca",
        "kmeans",
        "onehot_attention",
        "uniform_attention",
        "sae",
        "transcoder",
        "logit_lens",
        "tuned_lens",
        "erasure",
        "circuit",
    }
    assert proxies.get("svd") is svd
    with pytest.raises(ValueError, match="nope.*kmeans.*svd"):
        proxies.get("nope")


@pytest.mark.parametrize("name", proxies.available())
def test_contract(name):
    """Every proxy: leaves have a leading size axis, apply keeps shape and dtype under jit."""
    mod = proxies.get(name)
    assert mod.STATISTIC in ("moments", "samples", "pairs", "labelled", "model", None)
    assert mod.SITE in ("vector", "pattern", "model")
    if mod.SITE == "model":  # a whole-model proxy: tests/test_circuits.py's own contract test
        assert mod.STATISTIC == "model" and mod.PASSES >= 1
        assert all(callable(getattr(mod, f)) for f in ("families", "statistic", "fit", "logits"))
        return
    x = _blobs(64, F)
    stats = {
        "moments": lambda: svd.moments(jnp.asarray(x), jnp.ones(len(x), bool)),
        "samples": lambda: _samples(x),
        "pairs": lambda: {**_samples(x), "y": _samples(x)["x"][:, ::-1]},  # input -> target
        # classes of 5 concepts (sizes index them), one undefined (-1) in ten
        "labelled": lambda: {**_samples(x), "z": np.arange(len(x) * 5).reshape(-1, 5) % 11 - 1},
        None: lambda: None,
    }[mod.STATISTIC]()
    sizes = (1, 2, 4)
    params = jax.jit(lambda s, k: mod.fit(s, sizes, key=k))(stats, jax.random.key(0))
    assert all(leaf.shape[0] == len(sizes) for leaf in jax.tree.leaves(params))
    if mod.SITE == "vector":
        inp = jnp.asarray(x[:30].reshape(2, 15, F), jnp.bfloat16)
    else:
        inp = _softmax_np((2, 3, 5, 5))
    apply = jax.jit(jax.vmap(mod.apply, in_axes=(0, None), axis_size=len(sizes)))
    out = apply(params, inp)
    assert out.shape == (len(sizes),) + inp.shape and out.dtype == inp.dtype


# ----------------------------------------------------------------------------- svd / pca


@functools.partial(jax.jit, static_argnums=(0, 2))
def _project(name, x, sizes):
    """Moments of x, fit of every size, projection of x at every size [R, N, F]."""
    mod = proxies.get(name)
    stats = svd.moments(x, jnp.ones(len(x), bool))  # the "moments" statistic
    return stats, _apply_sizes(mod, mod.fit(stats, sizes), x)


def test_svd_error_is_discarded_spectrum():
    x = _data()
    sizes = tuple(range(1, F + 1)) + (F + 5,)  # ranks beyond F are clipped
    stats, out = _project("svd", x, sizes)
    err = ((x - np.asarray(out)) ** 2).sum((1, 2))
    s2 = np.linalg.svd(x.astype(np.float64), compute_uv=False) ** 2
    gram_eig = np.linalg.eigvalsh(np.asarray(stats["gram"], np.float64))[::-1]
    np.testing.assert_allclose(gram_eig, s2, rtol=1e-5, atol=1e-7 * s2.sum())
    expected = [s2[min(r, F) :].sum() for r in sizes]
    np.testing.assert_allclose(err, expected, rtol=1e-3, atol=1e-5 * s2.sum())
    np.testing.assert_allclose(out[F - 1], x, atol=1e-4)
    np.testing.assert_allclose(out[-1], x, atol=1e-4)


def test_pca_error_is_discarded_covariance_spectrum():
    x = _data()
    sizes = tuple(range(1, F + 1))
    _, out = _project("pca", x, sizes)
    cov_eig = np.linalg.eigvalsh(np.cov(x.astype(np.float64).T, bias=True))[::-1]
    expected = [len(x) * cov_eig[r:].sum() for r in sizes]
    err = ((x - np.asarray(out)) ** 2).sum((1, 2))
    np.testing.assert_allclose(err, expected, rtol=1e-3, atol=1e-5 * len(x) * cov_eig.sum())
    np.testing.assert_allclose(out[-1], x, atol=1e-4)
    np.testing.assert_allclose(out[0].mean(0), x.mean(0), atol=1e-4)  # through the mean


def test_moments_chunks_add_and_ignore_padding():
    x = _data(94)
    garbage = np.full((3, F), np.nan, np.float32)  # padding rows may hold anything
    chunks = [np.r_[x[:47], garbage], np.r_[garbage, x[47:]]]
    valids = [np.arange(50) < 47, np.arange(50) >= 3]
    moments = jax.jit(svd.moments)
    summed = jax.tree.map(jnp.add, *[moments(c, v) for c, v in zip(chunks, valids, strict=True)])
    assert float(summed["count"]) == 94.0
    x64 = x.astype(np.float64)
    # float32 sums of n terms (and their products' rounding) against float64 (tolerance.py).
    n, magnitude = len(x), np.abs(x64)
    assert np.all(np.abs(summed["total"] - x64.sum(0))
                  <= tol.sum_error(n, magnitude.sum(0)) + tol.EPS32 * magnitude.sum(0))
    assert np.all(np.abs(summed["gram"] - x64.T @ x64)
                  <= tol.EPS32 * (np.sqrt(n) + 2) * (magnitude.T @ magnitude))


# ----------------------------------------------------------------------------- k-means


# The k-means tests share data shapes and configurations: compiling dominates their time.
SIZES = (2, 3, 5, 8)


@functools.cache
def _fitter(sizes=SIZES, num_iters=10):
    # 64-row chunks do not divide the 405 rows: exercises the row padding of Lloyd.
    fit = functools.partial(kmeans.fit, sizes=sizes, num_iters=num_iters, chunk_size=64)
    return jax.jit(lambda x, valid, key: fit({"x": x, "valid": valid}, key=key))


def _fit(x, seed=0, **kw):
    stats = _samples(x, num_pad=5)
    return _fitter(**kw)(stats["x"], stats["valid"], jax.random.key(seed))


def test_kmeans_reproduces_few_distinct_points():
    rng = np.random.default_rng(0)
    points = rng.integers(-5, 6, size=(5, 4)).astype(np.float32)
    points[0] = points[1] + 1  # distinct for sure
    x = rng.permutation(np.repeat(points, 80, axis=0))
    out = np.asarray(_apply_sizes(kmeans, _fit(x), jnp.asarray(x)))
    # k = 5 and k = 8 (duplicate centres). Exact up to one rounding: XLA turns the division of
    # sums by counts into a multiplication by the reciprocal.
    np.testing.assert_allclose(out[2:], np.broadcast_to(x, (2,) + x.shape), rtol=3e-7, atol=0)


def test_kmeans_mask_limits_centroids():
    x = _blobs()
    params = _fit(x)
    assert np.asarray(params["mask"]).sum(1).tolist() == list(SIZES)
    k2 = jax.tree.map(lambda a: a[0], params)
    assert int(jnp.max(kmeans.assign(k2, jnp.asarray(x)))) < 2
    assert len(np.unique(np.asarray(kmeans.apply(k2, jnp.asarray(x))), axis=0)) == 2


def _centroid_bound(x: np.ndarray) -> float:
    """Two computations of k-means centroids with the same assignments (float32 and another
    program, or float64): each centroid a mean of at most len(x) points, within its float32
    summation's rounding plus one point's (tests/tolerance.py)."""
    return float(tol.two_ways(tol.EPS32 * (np.sqrt(len(x)) + 1) * np.abs(x).max()))


def _lloyd_numpy(x, c, num_iters):
    c = c.astype(np.float64)
    for _ in range(num_iters):
        a = ((x[:, None] - c[None]) ** 2).sum(-1).argmin(1)
        for j in range(len(c)):
            if (a == j).any():
                c[j] = x[a == j].mean(0)
    return c


def test_kmeans_batched_sizes_equal_single_and_reference():
    x = _blobs()
    batched, init = _fit(x), _fit(x, num_iters=0)
    # Same key: the k-means++ sequence for k = 5 is a prefix of the one for K_max = 8, and the
    # masked Lloyd of the batch equals a fit of k = 5 alone.
    single = _fit(x, sizes=(5,))["centroids"][0]
    np.testing.assert_allclose(batched["centroids"][2, :5], single, atol=_centroid_bound(x))
    for i, k in enumerate(SIZES):
        ref = _lloyd_numpy(x, np.asarray(init["centroids"][i, :k]), 10)
        np.testing.assert_allclose(batched["centroids"][i, :k], ref, atol=_centroid_bound(x))
        # Masked entries keep the k-means++ centres.
        np.testing.assert_array_equal(batched["centroids"][i, k:], init["centroids"][i, k:])


def test_kmeans_lloyd_does_not_increase_inertia():
    x = _blobs(k=12)
    stats = _samples(x, num_pad=5)
    inertia = jax.vmap(kmeans.inertia, in_axes=(0, None, None))
    for seed in range(3):
        before = inertia(_fit(x, seed, num_iters=0), stats["x"], stats["valid"])
        after = inertia(_fit(x, seed), stats["x"], stats["valid"])
        assert np.all(np.asarray(after) <= np.asarray(before) * (1 + 1e-6))
        assert np.asarray(after)[-1] < np.asarray(after)[0]


def test_kmeans_vmap_over_seeds_equals_loop():
    stats = [_samples(_blobs(seed=s), num_pad=5) for s in range(3)]
    xs, valid = jnp.stack([s["x"] for s in stats]), stats[0]["valid"]  # valid: not batched
    keys = jnp.stack([jax.random.key(s) for s in range(3)])
    batched = jax.jit(jax.vmap(_fitter(), in_axes=(0, None, 0)))(xs, valid, keys)
    for s in range(3):
        one = _fitter()(xs[s], valid, keys[s])
        np.testing.assert_allclose(batched["centroids"][s], one["centroids"],
                                   atol=_centroid_bound(np.asarray(xs[s])[valid]))


# ----------------------------------------------------------------------------- attention


def test_onehot_attention():
    t = 6
    idx = jnp.array([0, 0, 1, 3, 2, 5])
    onehot = jax.nn.one_hot(idx, t)
    np.testing.assert_array_equal(onehot_attention.apply({}, onehot), onehot)
    attn = _softmax_np((2, 3, t, t))
    out = onehot_attention.apply({}, attn)
    np.testing.assert_allclose(out.sum(-1), 1.0)
    np.testing.assert_array_equal(jnp.argmax(out, -1), jnp.argmax(attn, -1))
    # Ties go to the first index.
    np.testing.assert_array_equal(onehot_attention.apply({}, jnp.array([0.5, 0.5])), [1.0, 0.0])


def test_uniform_attention_spreads_each_query_over_the_keys_its_scores_allow():
    # It reads the layer's scores (-inf where masked): causal scores give the model's uniform
    # pattern bit for bit, whatever their values; a packed row's scores, masked to each
    # sentence, give each query its own sentence's keys up to itself.
    t = 5
    assert uniform_attention.input_site("blocks.1.attn.pattern") == "blocks.1.attn.scores"
    scores = np.random.default_rng(0).normal(size=(2, t, t)).astype(np.float32) * 30
    causal = np.tril(np.ones((t, t), bool))
    masked = np.where(causal, scores, -np.inf)
    out = uniform_attention.apply({}, jnp.asarray(masked))
    np.testing.assert_array_equal(out, model.uniform_pattern((2, t, t)))
    expected = np.tril(np.ones((t, t))) / np.arange(1, t + 1)[:, None]
    np.testing.assert_allclose(out[1], expected, rtol=1e-6)
    low = np.asarray(uniform_attention.apply({}, jnp.asarray(masked, jnp.bfloat16)), np.float32)
    np.testing.assert_allclose(low, np.broadcast_to(expected, low.shape), rtol=1e-2)
    segments = np.array([0, 0, 0, 1, 1])  # two sentences side by side
    packed = np.where(causal & (segments[:, None] == segments[None, :]), scores, -np.inf)
    out = np.asarray(uniform_attention.apply({}, jnp.asarray(packed)))
    first = np.tril(np.ones((3, 3))) / np.arange(1, 4)[:, None]
    second = np.tril(np.ones((2, 2))) / np.arange(1, 3)[:, None]
    want = np.zeros((t, t))
    want[:3, :3], want[3:, 3:] = first, second
    np.testing.assert_array_equal(out, np.broadcast_to(want.astype(np.float32), out.shape))


_NEW_PROXY = '''"""A proxy added as one file: x -> x * size / 10 (proxies.scaled_sizes)."""
import jax.numpy as jnp

STATISTIC = "moments"
SITE = "vector"


def fit(stats, sizes, *, key=None):
    return {"factor": jnp.asarray(sizes, jnp.float32) / 10}


def apply(params, x):
    return x * params["factor"]
'''


def test_a_new_proxy_is_one_file(tmp_path, monkeypatch):
    """A module dropped into the proxies package is a method: its sizes key is checked, its
    specs built and its figures labelled, with no other change."""
    from conftest import checked, tiny_config

    from jaxillusions.faithfulness.specs import specs_from_config
    from jaxillusions.pipeline import validate
    from jaxillusions.training import train

    monkeypatch.setattr(proxies, "__path__", [*proxies.__path__, str(tmp_path)])
    assert "scaled" not in proxies.available()
    (tmp_path / "scaled.py").write_text(_NEW_PROXY)  # dropped into a folder already listed
    assert "scaled" in proxies.available()
    config = tiny_config(str(tmp_path / "cache"))
    config.proxies.methods = ("scaled",)
    with pytest.raises(ValueError, match=r"^proxy 'scaled' needs config.proxies.scaled_sizes "
                       r"\(.*; none by default\), e.g. --config.proxies.scaled_sizes='\(32,64\)'$"):
        validate.validate(config)
    with config.unlocked():
        config.proxies.scaled_sizes = (5, 10)
    assert validate.validate(config) == []
    _, model_cfg, _ = train.build(checked(config))
    specs = specs_from_config(config.proxies, model_cfg)
    assert {s.method for s in specs} == {"scaled"} and {s.sizes for s in specs} == {(5, 10)}
    assert proxies.size_label("scaled") == "size" and proxies.size_label("svd") == "rank"
    config.proxies.scaled_sizes = (0, 10)
    with pytest.raises(ValueError, match=r"proxies.scaled_sizes=\(0, 10\): must be scaled sizes"):
        validate.validate(config)
