"""Sparse dictionary proxies: the TopK SAE (proxies/sae.py) and the dictionary metrics
(proxies/_sparse_coding.py)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tolerance as tol
from conftest import checked, planted_dictionary
from scipy.optimize import linear_sum_assignment
from scipy.special import log_softmax, logsumexp

from jaxillusions import proxies
from jaxillusions.config import settings as run_settings
from jaxillusions.pipeline import validate
from jaxillusions.proxies import _sparse_coding as dictionary
from jaxillusions.proxies import sae


def _stats(x: np.ndarray, num_pad: int = 0) -> dict:
    """A "samples" statistic with `num_pad` garbage padding rows appended."""
    pad = np.full((num_pad, x.shape[-1]), 1e6, np.float32)
    valid = np.r_[np.ones(len(x), bool), np.zeros(num_pad, bool)]
    return {"x": jnp.asarray(np.r_[x, pad]), "valid": jnp.asarray(valid)}


def _one(params: dict, index: int) -> dict:
    return jax.tree.map(lambda a: a[index], params)


def test_planted_dictionary_is_recovered(users_compile_level):
    """Most planted directions are matched by a decoder row with cosine > 0.9, and the FVU is
    far below that of the best rank-k projection (what a k-dimensional linear proxy reaches)."""
    x, dirs = planted_dictionary()
    k = 3
    params = jax.jit(lambda s, key: sae.fit(s, (32, 64), key=key, k=k, steps=2000, lr=3e-3,
                                            batch_size=256))(_stats(x, 50), jax.random.key(0))
    pca_fvu = np.linalg.eigvalsh(np.cov(x.T))[:-k].sum() / np.trace(np.cov(x.T))
    assert pca_fvu > 0.5
    for index, width in enumerate((32, 64)):
        p = _one(params, index)
        cos = np.asarray(p["W_dec"])[:width] @ dirs.T
        rows, cols = linear_sum_assignment(-cos)
        matched = (cos[rows, cols] > 0.9).mean()
        fvu = float(dictionary.fvu(x, sae.apply(p, jnp.asarray(x))))
        codes = sae.encode(p, jnp.asarray(x))
        assert matched >= 0.9, (width, matched)
        assert fvu < 0.15, (width, fvu)
        assert float(dictionary.l0(codes)) <= k
        assert not np.any(np.asarray(codes)[:, width:])  # padded latents never fire
    np.testing.assert_allclose(np.linalg.norm(params["W_dec"], axis=-1), 1.0, rtol=1e-5)


def test_auxk_loss_trains_dead_latents_only():
    """A latent that is never in the top k gets no gradient from the reconstruction loss; the
    AuxK loss gives it one once it counts as dead (and only then, and only if its
    pre-activation is positive), and never touches padded latents."""
    rng = np.random.default_rng(0)
    f, width = 6, 8
    w_dec = rng.normal(size=(width, f))
    w_dec /= np.linalg.norm(w_dec, axis=1, keepdims=True)
    p = {"W_enc": jnp.asarray(w_dec.T, jnp.float32), "b_enc": jnp.zeros(width),
         "W_dec": jnp.asarray(w_dec, jnp.float32), "b_dec": jnp.zeros(f)}
    # Latent 6 always ranks below the top 2 but has positive pre-activation on every row.
    p["b_enc"] = p["b_enc"].at[:6].set(50.0).at[6].set(10.0)
    masks = {"mask": jnp.arange(width) < 7, "kmask": jnp.arange(2) < 2}  # latent 7 is padding
    xb = jnp.asarray(rng.normal(size=(32, f)), jnp.float32)

    loss_grad = jax.jit(lambda *a: jax.grad(sae._loss, has_aux=True)(  # noqa: SLF001
        *a[:5], variance=jnp.float32(1.0), k_aux=3, aux_coeff=a[5]))

    def grads(dead: np.ndarray, aux_coeff: float) -> dict:
        g, fired = loss_grad(p, masks, xb, xb, jnp.asarray(dead), jnp.float32(aux_coeff))
        assert not fired[6] and not fired[7]
        return jax.tree.map(np.asarray, g)

    none_dead = np.zeros(width, bool)
    six_dead = np.arange(width) == 6
    for g in (grads(none_dead, 1 / 32), grads(six_dead, 0.0)):
        assert not g["W_enc"][:, 6].any() and not g["W_dec"][6].any()
    g = grads(six_dead | (np.arange(width) == 7), 1 / 32)  # a padded latent is never dead
    assert np.abs(g["W_enc"][:, 6]).sum() > 0 and np.abs(g["W_dec"][6]).sum() > 0
    assert not g["W_enc"][:, 7].any() and not g["W_dec"][7].any()


@pytest.mark.slow
def test_vmapped_fit_equals_per_seed_and_width_fits():
    """Seeds x widths in one program (vmap over seeds, padding to the widest) equals each
    (seed, width) fitted alone. Tolerance 1e-5: the padded and batched matmuls may round
    differently (XLA picks kernels by shape) and 150 Adam steps carry that rounding along;
    measured difference ~4e-7. Padding rows (garbage 1e6, valid False) change nothing."""
    rng = np.random.default_rng(1)
    seeds, n, f = 2, 512, 8
    x = (rng.normal(size=(seeds, n, f)) * np.linspace(2.0, 0.2, f)).astype(np.float32)
    stats = [_stats(x[s], num_pad=37) for s in range(seeds)]
    batched = jax.tree.map(lambda *a: jnp.stack(a), *stats)
    keys = jax.random.split(jax.random.key(3), seeds)
    sizes = (4, 12)
    options = dict(k=2, steps=150, lr=3e-3, batch_size=64)
    together = jax.jit(jax.vmap(lambda s, key: sae.fit(s, sizes, key=key, **options)))(
        batched, keys)
    alone = jax.jit(lambda s, key, w: sae.fit(s, (w,), key=key, **options), static_argnums=2)
    for s in range(seeds):
        for index, width in enumerate(sizes):
            single = _one(alone(stats[s], keys[s], width), 0)
            both = _one(jax.tree.map(lambda a, s=s: a[s], together), index)
            trimmed = {"W_enc": both["W_enc"][:, :width], "b_enc": both["b_enc"][:width],
                       "W_dec": both["W_dec"][:width], "b_dec": both["b_dec"]}
            for name, value in trimmed.items():
                np.testing.assert_allclose(value, single[name], atol=1e-5, err_msg=name)
            np.testing.assert_array_equal(both["mask"], np.arange(max(sizes)) < width)


def test_fit_is_deterministic_from_the_key():
    x, _ = planted_dictionary(n=512, f=8, num_dirs=8, k=2)
    fit = jax.jit(lambda key: sae.fit(_stats(x), (8,), key=key, k=2, steps=50))
    a, b, c = fit(jax.random.key(0)), fit(jax.random.key(0)), fit(jax.random.key(1))
    jax.tree.map(np.testing.assert_array_equal, a, b)
    assert not np.array_equal(a["W_dec"], c["W_dec"])


def test_several_k_make_the_sizes_axis_widths_times_ks():
    cfg = dataclasses.replace(run_settings.proxies_class()(), sae_sizes=(8, 16), sae_k=(2, 4))
    sizes, options = sae.settings(cfg, dim=8)
    assert sizes == (200008, 400008, 200016, 400016)
    assert [sae.width_and_k(s, dict(options)["k"]) for s in sizes] == [(8, 2), (8, 4), (16, 2),
                                                                      (16, 4)]
    x, _ = planted_dictionary(n=256, f=8, num_dirs=8, k=2)
    params = jax.jit(lambda s: sae.fit(s, sizes, key=jax.random.key(0), steps=5))(_stats(x))
    np.testing.assert_array_equal(params["kmask"].sum(1), [2, 4, 2, 4])
    np.testing.assert_array_equal(params["mask"].sum(1), [8, 8, 16, 16])
    codes = jax.jit(jax.vmap(sae.encode, in_axes=(0, None)))(params, jnp.asarray(x))
    np.testing.assert_array_equal(np.asarray(codes != 0).sum(-1).max(1), [2, 4, 2, 4])
    # One k: the sizes are the widths themselves; configs without the sae_* keys get defaults.
    sizes, options = sae.settings(validate.parse({"proxies": {"sae_sizes": (8, 16)}})
                                  .proxies, dim=8)
    assert sizes == (8, 16)
    assert dict(options) == {"k": 4, "steps": 1000, "lr": 1e-3, "batch_size": 256}


@pytest.mark.parametrize(("settings", "message"), [
    ({"sae_sizes": (8, 0)}, r"sae width 0: must be 1\.\."),
    ({"sae_k": (2, 9)}, r"sae k=9 for width 8: must be 1\.\.width"),
    ({"sae_k": (0,)}, r"sae k=0 for width 8"),
    ({"sae_k": ()}, r"sae_k=\(\): must list at least one k"),
    ({"sae_steps": 0}, r"sae steps=0: must be >= 1"),
    ({"sae_lr": 0.0}, r"sae learning rate=0.0: must be > 0"),
    ({"sae_lr": -1e-3}, r"sae learning rate=-0.001: must be > 0"),
    ({"sae_batch": 0}, r"sae batch=0: must be >= 1"),
])
def test_bad_options_are_one_line_errors(settings, message):
    cfg = dataclasses.replace(run_settings.proxies_class()(), **{"sae_sizes": (8, 16), **settings})
    with pytest.raises(ValueError, match=message) as err:
        sae.check(sae.settings(cfg, 8)[0], cfg, 8, "blocks.1.attn.k (d_head 8)")
    assert "\n" not in str(err.value) and "blocks.1.attn.k" in str(err.value)


@pytest.mark.parametrize(("sizes", "options", "message"), [
    ((8, 0), {}, r"sae width 0: must be"),
    ((8,), {"k": 0}, r"sae k=0 for width 8"),
    ((8,), {"steps": 0}, r"sae steps=0: must be >= 1"),
    ((8,), {"lr": 0.0}, r"sae learning rate=0.0: must be > 0"),
    ((8,), {"batch_size": 0}, r"sae batch=0: must be >= 1"),
])
def test_fit_rejects_bad_options_before_any_work(sizes, options, message, monkeypatch):
    """fit checks as well, before building the optimizer or tracing a step (k > width is a
    config error in check(); fit clips it, as svd clips ranks to F)."""
    monkeypatch.setattr(sae.optax, "adam", lambda *a: pytest.fail("work started"))
    x = planted_dictionary(n=64, f=8, num_dirs=8, k=2)[0]
    with pytest.raises(ValueError, match=message) as err:
        sae.fit(_stats(x), sizes, key=jax.random.key(0), **options)
    assert "\n" not in str(err.value)


def test_validate_runs_the_checks(config):
    """A config that asks for the sae proxy gets the sizes rule and check() through validate."""
    from jaxillusions.pipeline import validate

    with config.unlocked():
        config.proxies.methods = ("sae",)
        config.proxies.sae_sizes = (8, 2)  # default k 4 > width 2
    with pytest.raises(ValueError, match=r"sae k=4 for width 2: must be 1\.\.width"):
        validate.validate(config)
    config.proxies.sae_sizes = (8, 0)
    with pytest.raises(ValueError, match=r"proxies.sae_sizes=\(8, 0\): must be"):
        validate.validate(config)
    config.proxies.sae_sizes = (8, 16)
    assert validate.validate(config) == []


def test_sae_is_available_but_never_enabled_by_default(config):
    """Adding the file adds a method; configs that do not name it fit nothing new."""
    from jaxillusions.faithfulness.specs import specs_from_config
    from jaxillusions.training import train

    assert "sae" in proxies.available() and proxies.get("sae") is sae
    assert "sae" not in config.proxies.methods
    _, model_cfg, _ = train.build(checked(config))
    assert all(s.method != "sae" for s in specs_from_config(config.proxies, model_cfg))


# ----------------------------------------------------------------------------- metrics


def _kl64(original, replaced) -> np.ndarray:
    """Per-position KL(softmax(original) || softmax(replaced)) of logits [..., V], in float64."""
    p = log_softmax(np.asarray(original, np.float64), -1)
    q = log_softmax(np.asarray(replaced, np.float64), -1)
    return (np.exp(p) * (p - q)).sum(-1)


def test_metrics_on_hand_built_cases():
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(5, 7, 6)), jnp.float32)
    valid = jnp.asarray(rng.random((5, 7)) > 0.3)
    assert float(dictionary.fvu(x, x, valid)) == 0.0
    mean = np.asarray(x)[np.asarray(valid)].mean(0)
    assert float(dictionary.fvu(x, jnp.broadcast_to(mean, x.shape), valid)) == pytest.approx(1.0)
    assert float(dictionary.fvu(x, jnp.zeros_like(x), valid)) > 1.0
    # Padding rows are ignored, whatever they hold.
    garbage = jnp.where(valid[..., None], x, 1e6)
    assert float(dictionary.fvu(garbage, jnp.where(valid[..., None], x, 0.0), valid)) == 0.0

    codes = jnp.asarray([[0, 2, 0, 1], [0, 0, 0, 3], [5, 5, 5, 5]], jnp.float32)
    rows = jnp.asarray([True, True, False])
    assert float(dictionary.l0(codes, rows)) == 1.5
    assert float(dictionary.dead_fraction(codes, rows)) == 0.5  # latents 0 and 2
    assert float(dictionary.dead_fraction(codes, rows, jnp.asarray([1, 1, 0, 0], bool))) == 0.5
    assert float(dictionary.dead_fraction(codes, None, jnp.asarray([1, 1, 0, 0], bool))) == 0.0

    logits = jnp.asarray(rng.normal(size=(4, 9, 11)) * 3, jnp.float32)
    zero = jnp.asarray(rng.normal(size=(4, 9, 11)), jnp.float32)
    targets = jnp.asarray(rng.integers(0, 11, (4, 9)))
    weight = jnp.asarray(rng.random((4, 9)) > 0.5)
    identity = dictionary.downstream_scores(logits, logits, zero, targets, weight)
    assert float(identity["ce_score"]) == pytest.approx(1.0)
    assert float(identity["kl_score"]) == pytest.approx(1.0)
    ablated = dictionary.downstream_scores(logits, zero, zero, targets, weight)
    assert float(ablated["ce_score"]) == pytest.approx(0.0, abs=1e-6)
    assert float(ablated["kl_score"]) == pytest.approx(0.0, abs=1e-6)
    # Halfway (in CE) between them: the score is a ratio of means over the weighted positions.
    mixed = 0.5 * (logits + zero)
    scores = dictionary.downstream_scores(logits, mixed, zero, targets, weight)
    w = np.asarray(weight, np.float64)

    def mean_ce(lg):
        lp = log_softmax(np.asarray(lg, np.float64), -1)
        return -(np.take_along_axis(lp, np.asarray(targets)[..., None], -1)[..., 0] * w).sum() \
            / w.sum()

    def mean_kl(lg):
        return (_kl64(logits, lg) * w).sum() / w.sum()

    ce = (mean_ce(zero) - mean_ce(mixed)) / (mean_ce(zero) - mean_ce(logits))
    kl = (mean_kl(zero) - mean_kl(mixed)) / mean_kl(zero)
    # float32 against float64: within the scores' rounding from their terms (tests/tolerance.py)
    bound = tol.score_tolerances(float(w.sum()), mean_ce(logits), mean_ce(zero), mean_ce(mixed),
                                 mean_kl(zero), mean_kl(mixed))
    assert float(scores["ce_score"]) == pytest.approx(ce, rel=0, abs=bound["ce_score"])
    assert float(scores["kl_score"]) == pytest.approx(kl, rel=0, abs=bound["kl_score"])
    assert 0.0 < kl < 1.0


def test_kl_divergence_with_an_axis_of_size_one_in_the_batch_shape():
    # A family of one size evaluates logits [seeds, 1, batch, positions, vocab]: the KL, one
    # product per position, is float64's within its terms' float32 rounding there as without
    # the axis (docs/speed.md: XLA:CPU's multiply-and-sum of that shape ran 7-50x slower).
    rng = np.random.default_rng(1)
    original = (rng.normal(size=(3, 1, 4, 9, 257)) * 4).astype(np.float32)
    replaced = (original + rng.normal(size=original.shape)).astype(np.float32)
    p = log_softmax(original.astype(np.float64), -1)
    q = log_softmax(replaced.astype(np.float64), -1)
    want = _kl64(original, replaced)
    # Each log-probability carries the rounding of its log-softmax, of the size of the largest
    # logit and the log-sum-exp it subtracts; weighted by p (summing to 1), then the sum's own.
    scale = sum(np.abs(x).max(-1) + np.abs(logsumexp(x.astype(np.float64), -1))
                for x in (original, replaced))
    bound = (tol.TERM_ULPS * tol.EPS32 * scale
             + tol.sum_error(p.shape[-1], (np.exp(p) * np.abs(p - q)).sum(-1)))
    got = np.asarray(dictionary.kl_divergence(original, replaced), np.float64)
    squeezed = np.asarray(dictionary.kl_divergence(original[:, 0], replaced[:, 0]), np.float64)
    assert got.shape == want.shape and np.all(np.abs(got - want) <= bound)
    assert np.all(np.abs(squeezed - want[:, 0]) <= bound[:, 0])
    assert np.all(want > 100 * bound)  # the bound is far below the values it checks


# ----------------------------------------------------------------------------- transcoder


def test_transcoder_fits_a_known_sparse_relu_map(users_compile_level):
    """y = relu(h E + c) D + b with ~1 active unit per row (up to 7): the transcoder's TopK
    dictionary reaches an FVU far below the best affine map's, with at most k active latents."""
    from jaxillusions.proxies import transcoder

    rng = np.random.default_rng(0)
    n, f_in, f_out, units = 4096, 12, 10, 24
    h = rng.normal(size=(n, f_in)).astype(np.float32)
    enc = rng.normal(size=(f_in, units))
    enc /= np.linalg.norm(enc, axis=0)
    acts = np.maximum(h @ enc - np.sort(np.abs(rng.normal(size=units)))[::-1] - 1.2, 0.0)
    dec = rng.normal(size=(units, f_out))
    y = (acts @ (dec / np.linalg.norm(dec, axis=1, keepdims=True)) + 0.5).astype(np.float32)
    assert (acts > 0).sum(1).mean() < 1.5
    affine = np.linalg.lstsq(np.c_[h, np.ones(n)], y, rcond=None)[0]
    affine_fvu = float(dictionary.fvu(y, np.c_[h, np.ones(n)] @ affine))
    assert affine_fvu > 0.5
    k = 8
    stats = {"x": jnp.asarray(h), "y": jnp.asarray(y), "valid": jnp.ones(n, bool)}
    params = _one(jax.jit(lambda s: transcoder.fit(s, (48,), key=jax.random.key(0), k=k,
                                                   steps=3000, lr=3e-3))(stats), 0)
    assert params["W_enc"].shape == (f_in, 48) and params["W_dec"].shape == (48, f_out)
    fvu = float(dictionary.fvu(y, transcoder.apply(params, jnp.asarray(h))))
    assert fvu < 0.1, fvu
    assert float(dictionary.l0(transcoder.encode(params, jnp.asarray(h)))) <= k
    assert proxies.get("transcoder") is transcoder  # a method: adding the file registered it


@pytest.mark.slow
def test_transcoder_intervention_replaces_one_mlp():
    """Fitted on one block's (MLP input, MLP output) pairs of a small model, the transcoder
    replaces that MLP inside forward: the site holds the transcoder's output of the block's
    MLP input, earlier sites are untouched, and the model's next-token distribution stays far
    closer to the original than with the MLP zeroed (kl_score, ce_score well above 0)."""
    from jaxillusions import model as model_lib
    from jaxillusions.proxies import transcoder

    cfg = model_lib.ModelConfig(vocab_size=11, max_len=12, d_model=16, d_mlp=32)
    params = model_lib.init_params(jax.random.key(0), cfg)
    tokens = jax.random.randint(jax.random.key(1), (256, 12), 0, 11)
    layer, site = 1, "blocks.1.mlp.out"
    logits, cache = model_lib.forward(params, tokens, cfg, cache=("blocks.1.resid_mid", site))
    mlp_in = model_lib.mlp_input(params, layer, cache["blocks.1.resid_mid"]).reshape(-1, 16)
    stats = {"x": mlp_in, "y": cache[site].reshape(-1, 16), "valid": jnp.ones(len(mlp_in), bool)}
    tc = _one(jax.jit(lambda s: transcoder.fit(s, (64,), key=jax.random.key(2), k=8,
                                               steps=1500, lr=3e-3))(stats), 0)

    @jax.jit
    def run(tc):
        return model_lib.forward(params, tokens, cfg,
                                 intervention=transcoder.intervention({site: tc}, params, cfg),
                                 cache=("blocks.1.resid_mid", site))

    replaced, cache2 = run(tc)
    # jit and eager forward round differently: within twice an activation's rounding through
    # matmuls of up to d_mlp terms (resid_mid), then the transcoder's encoder and decoder.
    want = np.asarray(cache["blocks.1.resid_mid"], np.float64)
    assert np.all(np.abs(cache2["blocks.1.resid_mid"] - want)
                  <= tol.two_ways(tol.activation_error(want, cfg.d_mlp)))
    want = np.asarray(transcoder.apply(tc, mlp_in), np.float64)
    assert np.all(np.abs(cache2[site].reshape(-1, 16) - want)
                  <= tol.two_ways(tol.activation_error(want, cfg.d_mlp + 2 * 64)))
    assert float(dictionary.fvu(stats["y"], cache2[site].reshape(-1, 16))) < 0.2
    zeroed, _ = model_lib.forward(params, tokens, cfg,
                                  intervention=lambda n, v: jnp.zeros_like(v) if n == site else v)
    targets = jnp.roll(tokens, -1, axis=1)
    scores = dictionary.downstream_scores(logits, replaced, zeroed, targets, jnp.ones_like(tokens))
    assert float(scores["kl_score"]) > 0.8 and float(scores["ce_score"]) > 0.8, scores


# ----------------------------------------------------------------------------- the engine


def _dictionary_config(config):
    """tiny_config with both dictionaries: an SAE on the last keys and resid_mid, a
    transcoder on each MLP."""
    with config.unlocked():
        config.proxies.methods = ("svd", "sae", "transcoder")
        config.proxies.targets = ("blocks.-1.attn.k",)
        config.proxies.sae_targets = ("blocks.-1.attn.k", "blocks.0.resid_mid")
        config.proxies.transcoder_targets = ("blocks.0.mlp.out", "blocks.-1.mlp.out")
        config.proxies.sae_sizes = (8, 16)
        config.proxies.transcoder_sizes = (16,)
        config.proxies.sae_k = (2,)
        config.proxies.sae_steps = 50
        config.proxies.sae_batch = 64
        config.proxies.sae_lr = 3e-3
    return config


@pytest.mark.parametrize(("settings", "message"), [
    ({"sae_steps": 0}, r"^proxies\.sae_steps=0: must be >= 1$"),
    ({"sae_steps": 1.5}, r"^proxies\.sae_steps=1\.5: must be an integer"),
    ({"sae_lr": 0.0}, r"^proxies\.sae_lr=0\.0: must be > 0$"),
    ({"sae_lr": -1e-3}, r"^proxies\.sae_lr=-0\.001: must be > 0$"),
    ({"sae_batch": 0}, r"^proxies\.sae_batch=0: must be >= 1$"),
    ({"sae_k": (0, 2)}, r"^proxies\.sae_k=\(0, 2\): must be k values >= 1"),
    ({"sae_k": ()}, r"^proxies\.sae_k=\(\): must be k values >= 1"),
    ({"sae_k": (2, 9)}, r"sae k=9 for width 8: must be 1\.\.width"),
    ({"sae_sizes": (8, 0)}, r"^proxies\.sae_sizes=\(8, 0\): must be sae sizes >= 1"),
    ({"transcoder_sizes": (0,)}, r"^proxies\.transcoder_sizes=\(0,\): must be"),
    ({"transcoder_sizes": (1,)}, r"proxies\.transcoder_sizes=\(1,\), sae_k=\(2,\): sae k=2 "
                                 r"for width 1"),
    ({"transcoder_targets": ("blocks.-1.attn.k",)},
     r"transcoder target blocks\.1\.attn\.k: must be an MLP's output blocks\.<layer>\.mlp\.out"),
    # () means proxies.targets, here attention sites: refused by the transcoder's check.
    ({"transcoder_targets": ()}, r"transcoder target blocks\.1\.attn\.k: must be an MLP's"),
    ({"sae_targets": ("blocks.7.resid_mid",)}, r"^proxies\.sae_targets: .*blocks\.7"),
    ({"sae_targets": ("blocks.-1.attn.pattern",)}, r"^proxies\.sae_targets: .*attention pattern"),
])
def test_every_bad_dictionary_option_is_a_one_line_error_before_any_work(
        config, tmp_path, settings, message, monkeypatch):
    from jaxillusions.pipeline import sweep
    from jaxillusions.training import train

    monkeypatch.setattr(train, "train_sweep", lambda *a, **k: pytest.fail("work started"))
    config = _dictionary_config(config)
    for key, value in settings.items():  # replaced, not overridden: the type may change
        del config.proxies[key]
        config.proxies[key] = value
    workdir = tmp_path / "run"
    with pytest.raises(ValueError, match=message) as err:
        sweep.run(checked(config), str(workdir), verbose=False)
    assert "\n" not in str(err.value)
    assert not workdir.exists() or not any(workdir.iterdir())


def test_a_dictionary_method_without_its_sizes_is_a_one_line_error(config):
    from jaxillusions.pipeline import validate

    config = _dictionary_config(config)
    del config.proxies["transcoder_sizes"]
    with pytest.raises(ValueError, match=r"^proxy 'transcoder' needs "
                                         r"config\.proxies\.transcoder_sizes") as err:
        validate.validate(config)
    assert "\n" not in str(err.value)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from conftest import tiny_config, trained_tiny

    return trained_tiny(_dictionary_config(tiny_config(str(tmp_path_factory.mktemp("cache")))))


def _means(logits, replaced, zeroed, targets, weight) -> dict:
    """The means dictionary_metrics.py forms ce_score and kl_score from, in float64: CE of the
    original, the zero ablation and the proxy, KL(original || zero) and KL(original || proxy),
    over the weighted positions, and their number n."""
    w = np.asarray(weight, np.float64)
    lp = {k: log_softmax(np.asarray(v, np.float64), -1)
          for k, v in (("o", logits), ("z", zeroed), ("p", replaced))}
    t = np.asarray(targets)[..., None]

    def mean(v):
        return float((v * w).sum() / w.sum())

    ce = {k: mean(-np.take_along_axis(v, t, -1)[..., 0]) for k, v in lp.items()}
    kl = {k: mean((np.exp(lp["o"]) * (lp["o"] - lp[k])).sum(-1)) for k in ("z", "p")}
    return {"n": float(w.sum()), "ce_original": ce["o"], "ce_zero": ce["z"], "ce_proxy": ce["p"],
            "kl_zero": kl["z"], "kl_proxy": kl["p"]}


def _fvu_terms(x, x_hat, valid) -> dict:
    """fvu's terms over the valid tokens, in float64 (dictionary_metrics.py): count, sumsq, total,
    err."""
    x = np.asarray(x, np.float64)[np.asarray(valid)].reshape(int(np.sum(valid)), -1)
    x_hat = np.asarray(x_hat, np.float64)[np.asarray(valid)].reshape(x.shape)
    return {"count": float(len(x)), "sumsq": float((x**2).sum()),
            "total": float(((x - x.mean(0)) ** 2).sum()), "err": float(((x - x_hat) ** 2).sum())}


@pytest.mark.slow
def test_engine_fits_and_scores_dictionaries(trained):
    """The engine collects the transcoder's (MLP input, MLP output) pairs, fits SAEs and
    transcoders per seed, and its results carry fvu, l0, dead, ce_score and kl_score equal to
    the metrics computed directly from one seed's forward passes; full-rank SVD has fvu 0 and
    scores 1; each proxy method compiles one evaluation program, whatever its targets.
    "Equal" within float32 rounding estimated from the terms (tests/tolerance.py): activations
    through the model's matmuls (d_mlp = 32 terms at most), fvu and the scores from their sums
    and conditioning; latent counts exactly."""
    from jaxillusions import model as model_lib
    from jaxillusions import tasks
    from jaxillusions.faithfulness import dictionary_metrics
    from jaxillusions.faithfulness.collect import collect
    from jaxillusions.faithfulness.evaluate import EvalOptions, _eval_chunk, evaluate, make_eval_set
    from jaxillusions.faithfulness.fit import fit
    from jaxillusions.faithfulness.specs import ProxySpec, specs_from_config
    from jaxillusions.proxies import transcoder
    from jaxillusions.runtime import timing

    config, splits, model_cfg, params = trained
    width = model_cfg.d_mlp  # the widest matmul on the way to any site compared here
    specs = specs_from_config(config.proxies, model_cfg)
    specs.append(ProxySpec("kmeans", ("blocks.1.attn.k",), (4,), (("num_iters", 5),)))
    stats = collect(params, splits["train"], model_cfg, specs, num_samples=500,
                    batch_size=256)
    # The pairs statistic: the MLP's input (after its layer norm) and output, same positions.
    tokens = splits["train"].tokens
    p0 = jax.tree.map(lambda a: a[0], params)
    _, cache = model_lib.forward(p0, jnp.asarray(tokens), model_cfg,
                                 cache=("blocks.0.resid_mid", "blocks.0.mlp.out"))
    valid = (tokens != tasks.PAD).reshape(-1)
    pairs = stats["blocks.0.mlp.out"]["pairs"]
    mlp_in = np.asarray(model_lib.mlp_input(p0, 0, cache["blocks.0.resid_mid"])
                        ).reshape(-1, 16)[valid][:500]
    mlp_out = np.asarray(cache["blocks.0.mlp.out"]).reshape(-1, 16)[valid][:500]
    for got, want in ((pairs["x"][0, 0], mlp_in), (pairs["y"][0, 0], mlp_out)):
        assert np.all(np.abs(got - want) <= tol.two_ways(tol.activation_error(want, width)))

    fitted = fit(specs, stats, jax.random.PRNGKey(0), num_seeds=2)
    eval_set = make_eval_set(splits, ["iid", "longer"])
    _eval_chunk.clear_cache()  # count its compilations; other programs stay compiled
    sums, columns = {}, dictionary_metrics.columns

    def keep(spec, params, seed, size):  # the sums the engine forms its ratios from
        sums[(spec.method, spec.target)] = jax.tree.map(np.asarray, {**seed, **size})
        return columns(spec, params, seed, size)

    with timing.Breakdown() as clock, pytest.MonkeyPatch.context() as patch:
        patch.setattr(dictionary_metrics, "columns", keep)
        rows = [r for proxy in fitted for r in evaluate(  # one family at a time, as the sweep
            params, model_cfg, eval_set, [proxy], batch_size=64, seeds=[0, 1],
            options=EvalOptions(shared=fitted))]
    assert clock.programs["jit(_eval_chunk)"] == 4, clock.programs  # svd, sae, transcoder, km
    alls = [r for r in rows if r["breakdown"] == "all"]
    assert {r["method"] for r in alls} == {"svd", "kmeans", "sae", "transcoder"}
    svd_sums = sums[("svd", "blocks.1.attn.k")]
    full_rank = [r for r in alls if r["method"] == "svd" and r["size"] == 16]
    for r in alls:
        assert all(c in r for c in ("fvu", "l0", "dead", "ce_score", "kl_score")), r
        if r["method"] == "svd":
            assert np.isnan(r["l0"]) and np.isnan(r["dead"])
        elif r["method"] == "kmeans":
            assert r["l0"] == 1.0 and 0.0 <= r["dead"] < 1.0
        else:
            assert 0.0 < r["l0"] <= 2.0 and 0.0 <= r["dead"] < 1.0 and 0.0 < r["fvu"] < 1.0
    assert all(np.isnan(r["fvu"]) for r in rows if r["breakdown"] != "all")
    # Full rank: the original model itself, up to rounding. fvu at the activations' rounding
    # (err = sum of squared rounding, about (ulps * |x|)^2 per token, against the variance);
    # the scores 1 within their tolerance from the engine's own terms, where defined.
    compared = 0
    for r in full_rank:
        s, k = r["seed"], eval_set.split_names.index(r["split"])
        f = {key: np.asarray(v, np.float64) for key, v in svd_sums.items()}
        n = f["evaluated"][s, k]
        sumsq = f["sumsq/blocks.1.attn.k"][s, k].sum()
        total = sumsq - (f["sum/blocks.1.attn.k"][s, k] ** 2).sum() / f["count"][s, k]
        rounding = float(tol.two_ways(tol.activation_error(np.ones(1), width)[0]))  # of |x|
        assert r["fvu"] <= rounding**2 * sumsq / total
        size = svd_sums["ce_proxy"].shape[1] - 1  # the largest rank, 16
        means = [f[m][s, k] / n for m in ("ce_original", "ce_zero")] + [
            f["ce_proxy"][s, size, k] / n, f["kl_zero"][s, k] / n, f["kl_proxy"][s, size, k] / n]
        bound = tol.score_tolerances(n, *means)
        for score in ("ce_score", "kl_score"):
            if not np.isnan(r[score]):
                compared += 1
                assert abs(r[score] - 1.0) <= bound[score], (score, r, bound)
    assert compared, "no defined score of the full-rank svd"

    # Direct computation for seed 1 on `longer`: the sae on blocks.0.resid_mid (size 16) and
    # the transcoder on blocks.1.mlp.out.
    split = eval_set.split_names.index("longer")
    in_split = eval_set.bins[:, 0, 0] == split
    tokens = jnp.asarray(eval_set.tokens[in_split])
    weight = jnp.asarray(eval_set.evaluated[in_split])
    targets = jnp.roll(tokens, -1, axis=1)
    valid = tokens != tasks.PAD
    p1 = jax.tree.map(lambda a: a[1], params)
    logits, cache = model_lib.forward(p1, tokens, model_cfg,
                                      cache=("blocks.0.resid_mid", "blocks.1.resid_mid",
                                             "blocks.1.mlp.out"))
    by_method = {proxy.spec.method + proxy.spec.target: proxy for proxy in fitted}

    def row(method, site, size):
        (r,) = [r for r in alls if (r["method"], r["site"], r["size"], r["seed"], r["split"])
                == (method, site, size, 1, "longer")]
        return r

    sae_params = jax.tree.map(lambda a: a[1, 0, 1], by_method["saeblocks.0.resid_mid"]
                              .params["blocks.0.resid_mid"])  # seed 1, head 0, width 16
    x = cache["blocks.0.resid_mid"]
    codes = sae.encode(sae_params, x)
    r = row("sae", "blocks.0.resid_mid", 16)
    terms = _fvu_terms(x, sae.apply(sae_params, x), valid)
    assert r["fvu"] == pytest.approx(terms["err"] / terms["total"],
                                     abs=tol.fvu_tolerance(**terms, width=width))
    # l0 and dead: ratios of exact counts; the direct ones' float32 division rounds (eps / 2).
    assert r["l0"] == pytest.approx(float(dictionary.l0(codes, valid)), rel=tol.EPS32)
    assert r["dead"] == pytest.approx(float(dictionary.dead_fraction(
        codes, valid, sae_params["mask"])), rel=tol.EPS32)

    proxy = by_method["transcoderblocks.1.mlp.out"]
    tc = proxy.intervention(1, 0, p1, model_cfg)
    replaced, _ = model_lib.forward(p1, tokens, model_cfg, intervention=tc)
    zeroed, _ = model_lib.forward(
        p1, tokens, model_cfg,
        intervention=lambda n, v: jnp.zeros_like(v) if n == "blocks.1.mlp.out" else v)
    means = _means(logits, replaced, zeroed, targets, weight)
    n = means.pop("n")
    tc_params = jax.tree.map(lambda a: a[1, 0, 0], proxy.params["blocks.1.mlp.out"])
    mlp_out = cache["blocks.1.mlp.out"]
    transcoder_apply = transcoder.apply(
        tc_params, model_lib.mlp_input(p1, 1, cache["blocks.1.resid_mid"]))
    terms = _fvu_terms(mlp_out, transcoder_apply, valid)
    r = row("transcoder", "blocks.1.mlp.out", 16)
    assert r["fvu"] == pytest.approx(terms["err"] / terms["total"],
                                     abs=tol.fvu_tolerance(**terms, width=width))
    bound = tol.score_tolerances(n, *means.values())
    ce = (means["ce_zero"] - means["ce_proxy"]) / (means["ce_zero"] - means["ce_original"])
    kl = (means["kl_zero"] - means["kl_proxy"]) / means["kl_zero"]
    # Empty only where the denominator is within 1000x its rounding (dictionary_metrics.py),
    # which tolerance.mean_error estimates at least as generously as the engine.
    loss = max(means["ce_original"], means["ce_zero"], means["ce_proxy"])
    floors = {"ce_score": (means["ce_zero"] - means["ce_original"],
                           tol.mean_error(n, means["ce_zero"], loss)
                           + tol.mean_error(n, means["ce_original"], loss)),
              "kl_score": (means["kl_zero"],
                           tol.mean_error(n, means["kl_zero"], 2 * loss + means["kl_zero"]))}
    for score, value in (("ce_score", ce), ("kl_score", kl)):
        if np.isnan(r[score]):
            den, rounding = floors[score]
            assert den <= 1e3 * rounding, (score, den, rounding)
        else:
            assert r[score] == pytest.approx(value, abs=bound[score]), (score, bound)
    assert not np.isnan(r["kl_score"])  # zeroing an MLP moves the distribution
