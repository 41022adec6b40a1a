"""Logit lens, tuned lens, LEACE erasure and the probe table (docs/lenses.md)."""

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import checked

from jaxillusions import model as model_lib
from jaxillusions import tasks
from jaxillusions.faithfulness.fit import fit_one, make_intervention
from jaxillusions.faithfulness.specs import ProxySpec
from jaxillusions.pipeline import sweep
from jaxillusions.proxies import erasure, logit_lens, tuned_lens
from jaxillusions.studies import probes

EPS = float(np.finfo(np.float32).eps)


def _labelled(n: int = 3000, f: int = 6, k: int = 4, seed: int = 0, strength: float = 2.0):
    """x [n, f] whose class means differ along two directions (the concept is linearly
    decodable), classes with unequal frequencies (so chance is one class), float32."""
    rng = np.random.default_rng(seed)
    z = rng.choice(k, n, p=np.arange(1, k + 1) / np.arange(1, k + 1).sum())
    means = strength * rng.normal(size=(k, 2)) @ rng.normal(size=(2, f))
    x = rng.normal(size=(n, f)) * np.linspace(0.5, 2.0, f) + means[z] + 3.0
    return x.astype(np.float32), z.astype(np.int32)


def _accuracy(x, z, fit_x=None):
    """A ridge probe fitted on (fit_x or x, z), its accuracy on (x, z)."""
    fit_x = x if fit_x is None else fit_x
    probe = probes.fit_probe(fit_x, z, np.ones(len(z)), 1e-6)
    return float((probes.predict(probe, x) == z).mean())


# ----------------------------------------------------------------------------- LEACE


def test_leace_makes_the_concept_undecodable_on_the_fit_data():
    x, z = _labelled()
    chance = np.bincount(z).max() / len(z)
    assert _accuracy(x, z) > chance + 0.2  # decodable before
    eraser = erasure.leace(jnp.asarray(x), jnp.asarray(z), jnp.ones(len(z), bool))
    erased = np.asarray(erasure.erase(eraser, jnp.asarray(x)), np.float64)
    # Cov(x', z) = 0: float32 rounding of the eraser's two matmuls over F features leaves
    # |x' - exact| <~ 2 F eps |x|, so each cross-covariance entry is below that times
    # E|onehot - p| <= 1.
    onehot = np.eye(4)[z]
    cross = (erased - erased.mean(0)).T @ (onehot - onehot.mean(0)) / len(z)
    bound = 2 * x.shape[1] * EPS * np.abs(x).max()
    assert np.abs(cross).max() < bound, (np.abs(cross).max(), bound)
    # A probe fitted on the erased data is at chance: it predicts the majority class.
    assert _accuracy(erased.astype(np.float32), z) == pytest.approx(chance, abs=1 / len(z))
    # The mean is kept (affine LEACE).
    np.testing.assert_allclose(erased.mean(0), x.mean(0), atol=bound)


def test_leace_is_the_identity_when_the_concept_is_independent():
    """Every class holds the same vectors, so Cov(x, z) = 0 exactly: the whitened
    cross-covariance's singular values are float32 rounding (~ sqrt(N) eps, far below
    erasure.TOL), no direction is erased, and x - 0 = x exactly."""
    rng = np.random.default_rng(1)
    base = (rng.normal(size=(250, 6)) * [3, 2, 1, 1, 0.5, 0.1] + 1).astype(np.float32)
    x = np.tile(base, (4, 1))
    z = np.repeat(np.arange(4), len(base)).astype(np.int32)
    eraser = erasure.leace(jnp.asarray(x), jnp.asarray(z), jnp.ones(len(z), bool))
    np.testing.assert_array_equal(np.asarray(eraser["left"]), 0)
    np.testing.assert_array_equal(np.asarray(erasure.erase(eraser, jnp.asarray(x))), x)


def test_leace_ignores_unlabelled_and_padding_rows():
    x, z = _labelled(n=800)
    ref = erasure.leace(jnp.asarray(x), jnp.asarray(z), jnp.ones(len(z), bool))
    x2 = np.r_[x, np.full((50, x.shape[1]), 1e6, np.float32), x[:30]]
    z2 = np.r_[z, np.zeros(50, np.int32), -np.ones(30, np.int32)]
    valid = np.r_[np.ones(len(z), bool), np.zeros(50, bool), np.ones(30, bool)]
    got = erasure.leace(jnp.asarray(x2), jnp.asarray(z2), jnp.asarray(valid))
    probe = jnp.asarray(x[:100])
    np.testing.assert_allclose(erasure.erase(got, probe), erasure.erase(ref, probe),
                               atol=1e-4 * np.abs(x).max())


def test_leace_agrees_with_the_concept_erasure_package():
    """The package's LeaceFitter with the paper's plain formula (no shrinkage, no trace
    constraint, the same singular-value threshold), in float64 on the same data."""
    torch = pytest.importorskip("torch")
    concept_erasure = pytest.importorskip("concept_erasure")
    x, z = _labelled(n=2000, seed=3)
    onehot = np.eye(4)[z]
    fitter = concept_erasure.LeaceFitter.fit(
        torch.from_numpy(x.astype(np.float64)), torch.from_numpy(onehot), shrinkage=False,
        constrain_cov_trace=False, svd_tol=erasure.TOL)
    theirs = fitter.eraser(torch.from_numpy(x.astype(np.float64))).numpy()
    eraser = erasure.leace(jnp.asarray(x), jnp.asarray(z), jnp.ones(len(z), bool))
    ours = np.asarray(erasure.erase(eraser, jnp.asarray(x)))
    # Ours in float32: the covariance's eigendecomposition (condition ~16 here) and four F x F
    # matmuls, relative error ~ 1e2 F eps of |x|.
    np.testing.assert_allclose(ours, theirs, atol=100 * x.shape[1] * EPS * np.abs(x).max())
    assert np.abs(ours - x).max() > 0.1  # it did erase something


def test_erasure_fit_batched_over_seeds_equals_a_loop():
    xs, zs = zip(*[_labelled(n=600, seed=s) for s in range(3)], strict=True)
    x = np.stack(xs)[:, None]  # [S, G=1, N, F]
    z = np.stack([np.stack([z_, (z_ + 1) % 4], -1) for z_ in zs])[:, None]  # two concepts
    stats = {"site": {"labelled": {"x": x, "z": z, "valid": np.ones(x.shape[:3], bool)}}}
    spec = ProxySpec("erasure", ("site",), (0, 1))
    batched = fit_one(spec, 0, stats, jax.random.key(0), 3).params["site"]
    for s in range(3):
        one = erasure.fit({"x": x[s, 0], "z": z[s, 0], "valid": np.ones(600, bool)}, (0, 1))
        for size in (0, 1):
            got = erasure.erase(jax.tree.map(lambda a, s=s, c=size: a[s, 0, c], batched), x[s, 0])
            want = erasure.erase(jax.tree.map(lambda a, c=size: a[c], one), x[s, 0])
            # vmap may reorder float32 sums: an eigh and an SVD of 6 x 6, ~1e2 F eps of |x|.
            np.testing.assert_allclose(got, want, atol=100 * 6 * EPS * np.abs(x).max())


def test_tuned_lens_fit_batched_over_seeds_equals_a_loop():
    rng = np.random.default_rng(5)
    x = rng.normal(size=(3, 1, 500, 6)).astype(np.float32)  # [S, G, N, F]
    y = (x @ rng.normal(size=(6, 6)) + 0.1 * rng.normal(size=x.shape)).astype(np.float32)
    stats = {"site": {"pairs": {"x": x, "y": y, "valid": np.ones(x.shape[:3], bool)}}}
    spec = ProxySpec("tuned_lens", ("site",), (0, 3, 6), (("ridge", 1e-4),))
    batched = fit_one(spec, 0, stats, jax.random.key(0), 3).params["site"]
    for s in range(3):
        one = tuned_lens.fit({"x": x[s, 0], "y": y[s, 0], "valid": np.ones(500, bool)},
                             (0, 3, 6), ridge=1e-4)
        for r in range(3):
            got = tuned_lens.apply(jax.tree.map(lambda a, s=s, r=r: a[s, 0, r], batched), x[s, 0])
            want = tuned_lens.apply(jax.tree.map(lambda a, r=r: a[r], one), x[s, 0])
            # vmap may reorder float32 sums: a solve and an eigh of 6 x 6, ~1e2 F eps of |y|.
            np.testing.assert_allclose(got, want, atol=100 * 6 * EPS * np.abs(y).max())


# ----------------------------------------------------------------------------- tuned lens


def test_tuned_lens_recovers_a_low_rank_affine_map():
    """y = x + (x - m) U V + c with U V of rank 2: rank 2 and full rank recover it (ridge off);
    rank 0 is the identity plus the mean shift."""
    rng = np.random.default_rng(0)
    f = 8
    x = (rng.normal(size=(2000, f)) * np.linspace(0.5, 2, f) + 1).astype(np.float32)
    low = rng.normal(size=(f, 2)) @ rng.normal(size=(2, f)) * 0.5
    y = (x + (x - x.mean(0)) @ low + 0.7).astype(np.float32)
    stats = {"x": x, "y": y, "valid": np.ones(len(x), bool)}
    params = tuned_lens.fit(stats, (0, 1, 2, f), ridge=0.0)
    out = np.asarray(jax.vmap(tuned_lens.apply, in_axes=(0, None))(params, jnp.asarray(x)))
    scale = np.abs(y).max()
    for r in (2, f):  # least squares in float32 on a condition-16 covariance
        np.testing.assert_allclose(out[(0, 1, 2, f).index(r)], y, atol=1e-4 * scale)
    np.testing.assert_allclose(out[0], x + (y.mean(0) - x.mean(0)), atol=1e-5 * scale)
    err = ((out - y) ** 2).sum((1, 2))
    assert err[0] > err[1] > 1e3 * err[2]  # each rank helps until the true one


# ----------------------------------------------------------------------------- in the model


@pytest.fixture(scope="module")
def small_model():
    cfg = model_lib.ModelConfig(vocab_size=11, max_len=12, n_layers=2, d_model=16, d_mlp=32)
    params = jax.vmap(model_lib.init_params, in_axes=(0, None))(
        jax.random.split(jax.random.key(0), 2), cfg)
    # A bigger residual stream than at init, so the layers matter.
    params = jax.tree.map(lambda a: a * 3, params)
    tokens = jnp.asarray(np.random.default_rng(0).integers(1, 11, (4, 12)), jnp.int32)
    return cfg, params, tokens


def _lens_logits(module, site, site_params, params, tokens, cfg):
    def one(p, sp):
        intervention = make_intervention(module, {site: sp}, model_params=p)
        return model_lib.forward(p, tokens, cfg, intervention=intervention)[0]
    return jax.vmap(one)(params, site_params)


def test_logit_lens_at_the_last_site_is_the_model(small_model):
    cfg, params, tokens = small_model
    logits = jax.vmap(lambda p: model_lib.forward(p, tokens, cfg)[0])(params)
    lens = _lens_logits(logit_lens, "blocks.1.resid_post", {}, params, tokens, cfg)
    np.testing.assert_array_equal(lens, logits)


def test_logit_lens_decodes_the_site(small_model):
    """At blocks.0.resid_mid: the final layer norm and unembedding of that site's value."""
    cfg, params, tokens = small_model
    site = "blocks.0.resid_mid"
    lens = _lens_logits(logit_lens, site, {}, params, tokens, cfg)

    def decode(p):
        h = model_lib.forward(p, tokens, cfg, cache=(site,))[1][site]
        ln = model_lib.transformer._layer_norm(h, p["ln_final"])  # noqa: SLF001 - the model's own
        return ln @ p["unembed"]["w"] + p["unembed"]["b"]

    want = jax.vmap(decode)(params)
    # The same operations; a different fusion may round the d_model-term dot products
    # differently: 16 float32 additions of terms up to |ln| |w|.
    terms = np.abs(np.asarray(params["unembed"]["w"])).max() * 10
    np.testing.assert_allclose(lens, want, atol=16 * EPS * terms)
    logits = jax.vmap(lambda p: model_lib.forward(p, tokens, cfg)[0])(params)
    assert np.abs(np.asarray(lens - logits)).max() > 0.1  # an earlier site: not the model


def test_tuned_lens_with_the_identity_translator_is_the_logit_lens(small_model):
    cfg, params, tokens = small_model
    for site in ("blocks.0.resid_pre", "blocks.1.resid_mid"):
        identity = {"a": jnp.broadcast_to(jnp.eye(16), (2, 1, 16, 16)),  # [S, G, F, F]
                    "b": jnp.zeros((2, 1, 16))}
        tuned = _lens_logits(tuned_lens, site, identity, params, tokens, cfg)
        logit = _lens_logits(logit_lens, site, {}, params, tokens, cfg)
        # x @ I + 0 at full precision: products by 1 and 0 and sums with zeros are exact.
        np.testing.assert_array_equal(tuned, logit)


def test_lens_targets_must_be_residual_sites():
    with pytest.raises(ValueError, match="residual-stream site"):
        logit_lens.check((0,), None, 16, "blocks.1.attn.k (d_head 16)")
    with pytest.raises(ValueError, match="residual-stream site"):
        tuned_lens.check((4,), None, 16, "blocks.0.resid_mid+blocks.1.resid_mid")


# ----------------------------------------------------------------------------- concepts


def test_dyck_concepts_match_a_stack(config):
    from jaxillusions.tasks import dyck_sentences as dyck

    split = tasks.get("dyck").load(checked(config).data, verbose=False)["unseen_depth"]
    labels = tasks.concept_labels(tasks.get("dyck"), split, ("depth", "bracket"))
    k = config.data.num_types
    for row, sentence in enumerate(split.tokens[:40]):
        stack = []
        for t, token in enumerate(sentence):
            if token == dyck.PAD:
                assert tuple(labels[row, t]) == (-1, -1)
                continue
            if 3 <= token < 3 + k:
                stack.append(token - 3)
            elif 3 + k <= token < 3 + 2 * k:
                assert stack.pop() == token - 3 - k
            assert tuple(labels[row, t]) == (len(stack), stack[-1] if stack else -1)
    with pytest.raises(ValueError, match="unknown concept 'category'"):
        tasks.concept_labels(tasks.get("dyck"), split, ("category",))


# ----------------------------------------------------------------------------- the sweep


def test_a_tiny_sweep_with_lenses_erasure_and_probes(tiny_sweep, tmp_path, cache_dir):
    """The lenses, erasure and the probe table added to a finished tiny sweep: training and
    the earlier families are reused; the logit lens at the last site is the model on every
    split; probes.csv and its report are written."""
    from conftest import tiny_sweep_config

    workdir = str(tmp_path / "run")
    shutil.copytree(tiny_sweep, workdir)
    config = tiny_sweep_config(cache_dir)
    config.proxies.methods = ("svd", "onehot_attention", "logit_lens", "tuned_lens", "erasure")
    config.proxies.logit_lens_targets = ("blocks.0.resid_post", "blocks.-1.resid_post")
    config.proxies.tuned_lens_targets = ("blocks.0.resid_post",)
    config.proxies.tuned_lens_ranks = (0, 16)
    config.proxies.concepts = ("depth", "bracket")
    config.proxies.erasure_targets = ("blocks.0.resid_post",)
    config.probes.sites = ("blocks.0.resid_post",)
    stage = os.path.join(workdir, "proxies", "00_svd_blocks.1.attn.k_rows.json")
    before = os.path.getmtime(stage)
    rows = sweep.run(checked(config), workdir, verbose=False)
    assert os.path.getmtime(stage) == before  # the earlier families were not redone

    def all_rows(method, site):
        return [r for r in rows if (r["method"], r["site"], r["breakdown"]) == (method, site,
                                                                              "all")]
    final = all_rows("logit_lens", "blocks.1.resid_post")
    assert {r["split"] for r in final} == {"iid", "unseen_depth", "longer"}
    assert all(r["same_pred"] == 1.0 and r["jsd"] == 0.0 for r in final)
    assert {r["size"] for r in all_rows("tuned_lens", "blocks.0.resid_post")} == {0, 16}
    assert {r["size"] for r in all_rows("erasure", "blocks.0.resid_post")} == {0, 1}
    # Erasing the bracket to close, at a site every later layer reads, changes predictions.
    bracket = all_rows("erasure", "blocks.0.resid_post")
    assert min(r["same_pred"] for r in bracket if r["size"] == 1) < 0.9

    with open(os.path.join(workdir, "probes.csv")) as f:
        header, *lines = f.read().splitlines()
    assert header.split(",") == list(probes.COLUMNS)
    # seeds x concepts x (splits and train_heldout, training sentences the fit did not read)
    assert len(lines) == 2 * 2 * 4
    with open(os.path.join(workdir, "gap_table.txt")) as f:
        assert "Linear probes and concept erasure" in f.read()
    with open(os.path.join(workdir, "proxies", probes.ROWS_FILE)) as f:
        table = json.load(f)["value"]
    for r in table:
        assert 0 <= r["refit_chance_acc"] <= 1 and r["n_seen"] <= r["n"]
    assert {r["split"] for r in table} == {"train_heldout", "iid", "unseen_depth", "longer"}
    deep = [r for r in table if (r["concept"], r["split"]) == ("depth", "unseen_depth")]
    assert all(r["n_seen"] < r["n"] for r in deep)  # depths beyond training's


@pytest.mark.parametrize("keys, message", [
    # Its sizes are names: what they may be, not a numeric example (was "e.g. '(32,64)'").
    ({"methods": ("erasure",)}, r"^proxy 'erasure' needs config.proxies.concepts \(distinct "
     r"concepts of the task \(dyck: depth, bracket; .*\); none by default\)$"),
    ({"concepts": ("category",)}, "'category' is not a concept of task dyck"),
    ({"concepts": ("depth",), "probes.sites": ("blocks.0.attn.pattern",)}, "not a vector site"),
    ({"probes.sites": ("blocks.0.resid_mid",)}, "needs proxies.concepts"),
    ({"methods": ("tuned_lens",), "tuned_lens_targets": ("blocks.0.resid_mid",),
      "tuned_lens_ranks": (17,)}, r"ranks \[17\] exceed d_model 16"),
    ({"methods": ("logit_lens",)}, "must be one residual-stream site"),  # proxies.targets: k
])
def test_bad_lens_probe_and_erasure_settings_are_one_line_errors(config, keys, message):
    from jaxillusions.pipeline import validate

    for key, value in keys.items():  # a key of proxies.*, or a section's dotted key
        section, _, name = key.rpartition(".")
        setattr(config[section or "proxies"], name, value)
    with pytest.raises(ValueError, match=message) as err:
        validate.check(config)
    assert "\n" not in str(err.value)


def test_probes_txt_gives_the_gap_on_seen_classes_where_a_split_has_unseen_ones():
    """Was: only the gap over every position, where docs/lenses.md's depth-probe gap is on
    unseen_depth's seen depths: a number probes.txt did not show."""
    rows = [{"seed": s, "site": "blocks.0.resid_post", "concept": "depth", "split": split,
             "n": 100, "n_seen": 100 if split == "iid" else 60, "probe_acc": acc - 0.01 * s,
             "probe_acc_seen": seen - 0.01 * s, "erased_refit_acc": 0.2, "refit_acc": 0.6,
             "refit_chance_acc": 0.1}
            for s in range(3) for split, acc, seen in (("iid", 0.7, 0.7),
                                                      ("unseen_depth", 0.3, 0.4))]
    text = probes.report(rows, "iid", "iid")
    line = next(t for t in text.splitlines() if t.strip().startswith("unseen_depth"))
    # (the same difference in every seed: no interval)
    assert "+0.400 (in every seed) 3/3" in line and "+0.300 (in every seed) 3/3" in line, line
    assert line.index("+0.400") < line.index("+0.300")  # the gap, then the one on seen classes


def test_heldout_training_sentences_follow_the_fit_sample(config):
    """The fit sample reads the first num_samples positions; the held-out reference starts at
    the first sentence it did not touch."""
    train = tasks.get("dyck").load(checked(config).data, verbose=False)["train"]
    counts = (train.tokens != tasks.PAD).sum(1)
    held = probes.heldout_train(train, int(counts[:10].sum()) + 1, 5)  # 1 position of row 10
    np.testing.assert_array_equal(held.tokens, train.tokens[11:16])
    assert probes.heldout_train(train, int(counts.sum()), 5) is None


@pytest.mark.parametrize("whole_train", [True, False])
def test_probes_txt_and_the_console_say_why_train_heldout_is_missing(config, tmp_path,
                                                                      whole_train):
    """Was: with data.num_train=2000 and kmeans_samples 20000 the fit sample used up the
    training set, so probes.txt had no train_heldout rows and an empty 'left - left on
    train_heldout' column, with no word on why."""
    import types

    train = tasks.get("dyck").load(checked(config).data, verbose=False)["train"]
    positions = int((train.tokens != tasks.PAD).sum())
    # The whole of train, or all but its last sentence.
    config.proxies.kmeans_samples = positions if whole_train else int(
        (train.tokens[:-1] != tasks.PAD).sum())
    config.proxies.concepts = ("depth",)
    config.probes.sites = ("blocks.0.resid_post",)
    settings = checked(config)
    rows = [{"seed": s, "site": "blocks.0.resid_post", "concept": "depth", "split": "iid",
             "n": 100, "n_seen": 100, "probe_acc": 0.7, "probe_acc_seen": 0.7,
             "chance_acc": 0.3, "refit_acc": 0.6, "erased_refit_acc": 0.2,
             "refit_chance_acc": 0.1} for s in range(2)]
    said = []
    ctx = types.SimpleNamespace(
        settings=settings, directory=str(tmp_path), say=said.append, params=None,
        healthy=None, seeds=[0, 1], model_cfg=None,
        splits=tasks.get("dyck").load(settings.data, verbose=False),
        files=types.SimpleNamespace(dir=str(tmp_path), load=lambda *_: rows))
    ctx.produced = lambda *_, **__: ctx
    probes.run(ctx)
    with open(tmp_path / "probes.txt") as f:
        text = f.read()
    note = (f"No train_heldout rows, so no 'left - left on train_heldout': no training sentence "
            f"is left after the fit sample's {config.proxies.kmeans_samples} positions "
            f"(proxies.kmeans_samples={config.proxies.kmeans_samples}; train has "
            f"{len(train.tokens)} sentences, {positions} positions).")
    if whole_train:
        assert text.splitlines()[1] == note and said == [f"probes: {note}"], (text, said)
    else:  # one sentence is left: rows there would be, and no note
        assert probes.heldout_train(train, config.proxies.kmeans_samples, 5) is not None
        assert "No train_heldout" not in text and not said


def test_probe_fit_batched_over_seeds_equals_a_loop():
    xs, zs = zip(*[_labelled(n=400, seed=s) for s in range(3)], strict=True)
    z = zs[0]  # shared labels, as at the same positions of every seed
    weight = (np.arange(400) % 3 > 0).astype(np.float64)
    batched = probes.fit_probe(np.stack(xs), z, weight, 1e-3)
    for s in range(3):
        one = probes.fit_probe(xs[s], z, weight, 1e-3)
        # float64 throughout: a solve of 6 x 6 (condition ~1e2), far below 1e-9.
        for key in ("coef", "bias"):
            np.testing.assert_allclose(batched[key][s], one[key], rtol=1e-9, atol=1e-12)
        np.testing.assert_array_equal(probes.predict(batched, np.stack(xs))[s],
                                      probes.predict(one, xs[s]))
