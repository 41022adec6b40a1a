import jax
import jax.numpy as jnp
import numpy as np

from jaxillusions.faithfulness import metrics

# Jitted once: eager mode compiles every small op separately, which dominates test time.
jsd, jsd_probs = jax.jit(metrics.jsd), jax.jit(metrics.jsd_probs)


def _jsd_numpy(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    p, q = p.astype(np.float64), q.astype(np.float64)
    m = (p + q) / 2

    def kl(a: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(a > 0, a * np.log2(a / m), 0.0).sum(-1)

    return (kl(p) + kl(q)) / 2


def _dirichlet(shape, seed, alpha=0.5):
    return np.random.default_rng(seed).dirichlet(np.full(shape[-1], alpha), shape[:-1])


def test_jsd_probs_matches_numpy_and_is_symmetric():
    p, q = _dirichlet((4, 10, 7), 0), _dirichlet((4, 10, 7), 1)
    p[0, 0, :3] = 0  # zero probabilities: 0 log 0 = 0
    p[0, 0] /= p[0, 0].sum()
    js = np.asarray(jsd_probs(jnp.asarray(p), jnp.asarray(q)))
    assert js.shape == (4, 10)
    np.testing.assert_allclose(js, _jsd_numpy(p, q), atol=1e-6)
    np.testing.assert_allclose(js, jsd_probs(jnp.asarray(q), jnp.asarray(p)), atol=1e-7)


def test_jsd_probs_extremes():
    p = jnp.array([[0.2, 0.3, 0.5, 0.0], [1.0, 0.0, 0.0, 0.0]])
    np.testing.assert_array_equal(jsd_probs(p, p), [0.0, 0.0])
    disjoint = jnp.array([[0.0, 0.0, 0.0, 1.0], [0.0, 0.5, 0.5, 0.0]])
    np.testing.assert_allclose(jsd_probs(p, disjoint), [1.0, 1.0], atol=1e-6)


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_jsd_logits_equals_probs_and_is_bounded():
    rng = np.random.default_rng(0)  # sharp distributions, underflowing probabilities
    a, b = (30 * rng.normal(size=(64, 50)).astype(np.float32) for _ in range(2))
    js = np.asarray(jsd(a, b))
    assert np.all((js >= 0) & (js <= 1))
    np.testing.assert_allclose(js, _jsd_numpy(_softmax(a), _softmax(b)), atol=1e-5)
    soft_a, soft_b = a[:4] / 30, b[:4] / 30
    expected = jsd_probs(_softmax(soft_a), _softmax(soft_b))
    np.testing.assert_allclose(jsd(soft_a, soft_b), expected, atol=1e-6)
    np.testing.assert_array_equal(jsd(a, a), 0.0)
    # A masked vocabulary (-inf logits) gives no NaN.
    a[:, :10] = -np.inf
    assert np.all(np.isfinite(jsd(a, b)))


def test_same_pred_and_correct_ties_first_index():
    p = jnp.array([[1.0, 1.0, 0.0], [0.0, 2.0, 1.0], [3.0, 0.0, 3.0]])
    q = jnp.array([[1.0, 0.0, 1.0], [0.0, 1.0, 2.0], [0.0, 0.0, 0.0]])
    # argmaxes (first index on ties): p -> 0, 1, 0; q -> 0, 2, 0
    np.testing.assert_array_equal(metrics.same_pred(p, q), [1.0, 0.0, 1.0])
    np.testing.assert_array_equal(metrics.correct(p, jnp.array([0, 1, 2])), [1.0, 1.0, 0.0])
    assert metrics.same_pred(p, q).dtype == jnp.float32


def test_jsd_with_broadcast_operands_matches_materialized():
    # Under vmap over proxy sizes the original logits are broadcast along a middle axis. An
    # earlier two-reduction JSD was miscompiled by XLA:CPU for exactly these shapes.
    rng = np.random.default_rng(1)
    original = (rng.normal(size=(4, 1, 256, 42, 19)) * 4).astype(np.float32)
    noise = rng.normal(size=(4, 6, 256, 42, 19)) * np.arange(6)[None, :, None, None, None] * 0.1
    proxy = (original + noise).astype(np.float32)
    materialized = np.broadcast_to(original, proxy.shape).copy()
    broadcast = np.asarray(jax.jit(metrics.jsd)(original, proxy))
    reference = np.asarray(jax.jit(metrics.jsd)(materialized, proxy))
    np.testing.assert_allclose(broadcast, reference, atol=1e-6)
    assert np.abs(broadcast[:, 0]).max() < 1e-6  # size 0 has no noise: identical distributions
