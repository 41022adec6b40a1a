"""Memory of the proxy stage: collect, fit and evaluate in sequential seed chunks, the chunk
size planned from XLA's memory analysis when the device reports its capacity (here: a patched
memory.capacity, since the CPU reports none), and the proxies.seed_chunk_size key.

Chunks are not bit-identical to one call on XLA:CPU (the vmapped program of 2 seeds may round
and order float32 reductions differently from that of 3), so floats are compared within their
float32 rounding, estimated from what is computed (tests/tolerance.py), and counts,
predictions and row keys exactly.
"""

import jax
import numpy as np
import pytest
import tolerance as tol
from conftest import checked, tiny_config

from jaxillusions.faithfulness import dictionary_metrics
from jaxillusions.faithfulness.collect import Chunking, _collect_chunk, collect, pack_rows
from jaxillusions.faithfulness.evaluate import EvalOptions, evaluate, make_eval_set
from jaxillusions.faithfulness.fit import fit
from jaxillusions.faithfulness.specs import specs_from_config
from jaxillusions.pipeline import sweep, validate
from jaxillusions.runtime import checkpoint
from jaxillusions.training import memory, train
from jaxillusions.training.step import init_state

NUM_SEEDS = 3  # not a multiple of the chunk of 2: the last chunk is padded
SEEDS = [7, 8, 9]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    config = tiny_config(str(tmp_path_factory.mktemp("cache")))
    config.proxies.targets = ("blocks.-1.attn.k",)
    config.proxies.methods = ("svd", "kmeans", "onehot_attention")
    config.proxies.kmeans_sizes = (2, 4)
    config.proxies.kmeans_samples = 300
    config.proxies.eval_splits = ("iid", "longer")
    splits, model_cfg, tx = train.build(checked(config))
    params = jax.tree.map(np.asarray, init_state(range(NUM_SEEDS), model_cfg, tx).params)
    specs = specs_from_config(config.proxies, model_cfg)
    eval_set = make_eval_set(splits, config.proxies.eval_splits)
    return config, splits, model_cfg, params, specs, eval_set


def _run(setup, chunk: int, say=None):
    """(stats, fitted params, rows, the dictionary metrics' sums per family): the sums that
    dictionary_metrics.columns forms its ratios from, kept to derive the ratios' tolerances."""
    config, splits, model_cfg, params, specs, eval_set = setup
    pc, chunking = config.proxies, Chunking(chunk, say)
    stats = collect(params, splits["train"], model_cfg, specs,
                    num_samples=pc.kmeans_samples, batch_size=pc.collect_batch_size,
                    chunking=chunking)
    fitted = fit(specs, stats, jax.random.PRNGKey(0), NUM_SEEDS, chunking=chunking)
    sums, columns = {}, dictionary_metrics.columns

    def keep(spec, params, seed, size):
        sums[(spec.method, spec.target)] = jax.tree.map(np.asarray, {**seed, **size})
        return columns(spec, params, seed, size)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(dictionary_metrics, "columns", keep)
        rows = evaluate(params, model_cfg, eval_set, fitted,
                        batch_size=pc.eval_batch_size, seeds=SEEDS,
                        options=EvalOptions(chunking=chunking))
    return stats, [f.params for f in fitted], rows, sums


@pytest.fixture(scope="module")
def one_call(setup):
    return _run(setup, 0)


def _assert_close_stats(a, b):
    """Collected statistics of the same activations, each within its float32 rounding (module
    tolerance): a moment is a float32 sum over the N training positions of products of
    activations, each activation rounded by the forward pass (tolerance.activation_error)."""
    assert jax.tree.structure(a) == jax.tree.structure(b)
    width = 16  # tiny_config's d_model: the widest matmul the activations come from
    for site, st in b.items():
        m = st["moments"]
        count = m["count"][..., None]  # [S, G, 1]
        assert np.array_equal(a[site]["moments"]["count"], m["count"])
        diag = np.diagonal(m["gram"], axis1=-2, axis2=-1)  # [S, G, F]
        scale = np.sqrt(diag[..., :, None] * diag[..., None, :])  # >= sum |x_i x_j|
        ulps = tol.TERM_ULPS * np.sqrt(width)  # each activation's rounding, twice per product
        gram = tol.two_ways(tol.EPS32 * (np.sqrt(count[..., None]) + 2 * ulps) * scale)
        total = tol.two_ways(tol.EPS32 * (np.sqrt(count) + ulps) * np.sqrt(count * diag))
        assert np.all(np.abs(a[site]["moments"]["gram"] - m["gram"]) <= gram), site
        assert np.all(np.abs(a[site]["moments"]["total"] - m["total"]) <= total), site
        if "samples" in st:
            x = st["samples"]["x"]
            np.testing.assert_array_equal(a[site]["samples"]["valid"], st["samples"]["valid"])
            assert np.all(np.abs(a[site]["samples"]["x"] - x)
                          <= tol.two_ways(tol.activation_error(x, width))), site


def _assert_close_fits(a, b, stats):
    """svd and k-means fitted on statistics that agree within rounding.

    svd: each basis vector is an eigenvector of M = gram / count; a perturbation E of M turns
    the i-th by at most |E| / (its gap to the other eigenvalues) (Davis-Kahan), with |E| the
    statistics' rounding (as in _assert_close_stats, at most eps (sqrt(N) + 2 ulps) |M|
    elementwise, times F for the norm) plus eigh's own backward error (a few F eps |M|).
    k-means: the same assignments give centroids that are means of the same samples, within
    the samples' rounding plus that of a mean of up to N samples."""
    svd, kmeans = b
    site = next(iter(svd))
    moments = stats[site]["moments"]
    m = moments["gram"] / moments["count"][..., None, None]  # [S, G, F, F]
    f = m.shape[-1]
    eig = np.linalg.eigvalsh(m)[..., ::-1]  # decreasing, as the basis
    gaps = np.abs(eig[..., :, None] - eig[..., None, :]) + np.diag(np.full(f, np.inf))
    norm = np.abs(eig).max(-1)[..., None]  # |M|
    n = moments["count"][..., None]
    ulps = tol.TERM_ULPS * np.sqrt(16)
    perturbation = tol.EPS32 * (f * (np.sqrt(n) + 2 * ulps) + tol.TERM_ULPS * f) * norm
    turn = tol.two_ways(perturbation / gaps.min(-1))  # [S, G, F] per basis vector
    basis_a, basis_b = a[0][site]["basis"], svd[site]["basis"]  # [S, G, R, F, F], columns
    assert np.all(np.abs(basis_a - basis_b) <= turn[:, :, None, None, :]), "svd basis"
    x = stats[site]["samples"]["x"]  # [S, G, N, F]
    bound = tol.two_ways(tol.EPS32 * np.sqrt(x.shape[2]) * np.abs(x).max((2, 3))
                         + tol.activation_error(x, 16).max((2, 3)))  # [S, G]
    diff = np.abs(a[1][site]["centroids"] - kmeans[site]["centroids"])  # [S, G, R, K, F]
    assert np.all(diff <= bound[:, :, None, None, None]), "k-means centroids"


def _ratio_tolerances(sums: dict) -> dict:
    """Per family, the tolerance of each dictionary ratio [S, R, K] between two computations,
    from the terms dictionary_metrics.columns forms it from (tolerance.score_tolerances and
    fvu_tolerance)."""
    out = {}
    for key, f in sums.items():
        f = {k: v.astype(np.float64) for k, v in f.items()}
        n = f["evaluated"][:, None]  # [S, 1, K]

        def mean(name, f=f, n=n):
            return (f[name][:, None] if f[name].ndim == 2 else f[name]) / n

        sites = [k.split("/", 1)[1] for k in f if k.startswith("err/")]
        count = f["count"][:, None]
        sumsq = sum(f[f"sumsq/{s}"].sum(-1) for s in sites)[:, None]
        total = sumsq - sum((f[f"sum/{s}"] ** 2).sum(-1) for s in sites)[:, None] / count
        err = sum(f[f"err/{s}"] for s in sites)
        out[key] = {**tol.score_tolerances(n, *(mean(m) for m in (
            "ce_original", "ce_zero", "ce_proxy", "kl_zero", "kl_proxy"))),
                    "fvu": tol.fvu_tolerance(count, sumsq, total, err, 16)}  # d_model
    return out


def _assert_same_rows(a, b, sums, setup):
    """Keys, counts, accuracies and same_pred exactly (counts of the same argmaxes); latent
    counts (l0, dead) exactly; every mean and ratio within its float32 tolerance (tolerance.py,
    module docstring): JSD a mean of per-position values computed from three entropies of up to
    log2(V) bits, its quantiles one position's rounding, the dictionary ratios from their terms
    (_ratio_tolerances). A ratio undefined in one computation (NaN: its denominator is not 1000x
    its rounding, dictionary_metrics.py) is undefined in the other."""
    _, _, model_cfg, _, specs, eval_set = setup
    assert len(a) == len(b) > 0
    floats = ("jsd", "jsd_p95", "jsd_p99", "fvu", "l0", "dead", "ce_score", "kl_score")
    bits = 3 * np.log2(model_cfg.vocab_size)
    ratios = _ratio_tolerances(sums)
    compared = {c: 0 for c in ("ce_score", "kl_score", "fvu")}
    for x, y in zip(a, b, strict=True):
        assert {k: v for k, v in x.items() if k not in floats} == {
            k: v for k, v in y.items() if k not in floats}
        np.testing.assert_allclose(x["jsd"], y["jsd"], rtol=0, err_msg="jsd",
                                   atol=tol.two_ways(tol.mean_error(y["n"], y["jsd"], bits)))
        for k in ("jsd_p95", "jsd_p99"):
            np.testing.assert_allclose(x[k], y[k], rtol=0, atol=tol.two_ways(
                tol.TERM_ULPS * tol.EPS32 * bits), err_msg=k)
        if "fvu" not in y:
            continue
        for k in ("l0", "dead"):
            np.testing.assert_array_equal(x[k], y[k], err_msg=k)
        if y["breakdown"] != "all":
            continue
        family = ratios[(y["method"], y["site"])]
        spec = next(s for s in specs if (s.method, s.target) == (y["method"], y["site"]))
        cell = (SEEDS.index(y["seed"]), spec.sizes.index(y["size"]),
                eval_set.split_names.index(y["split"]))
        for k in compared:
            assert np.isnan(x[k]) == np.isnan(y[k]), (k, x, y)
            if not np.isnan(y[k]):
                compared[k] += 1
                assert abs(x[k] - y[k]) <= family[k][cell], (k, family[k][cell], x, y)
    assert all(compared.values()), compared  # each ratio is compared where it is defined


@pytest.mark.slow
def test_seed_chunks_equal_one_call(setup, one_call):
    # Chunks of 2 seeds (3 seeds: 2 + 1 padded) for collection, fitting and evaluation.
    stats, fitted, rows, _ = _run(setup, 2)
    _assert_close_stats(stats, one_call[0])
    _assert_close_fits(fitted[:2], one_call[1][:2], one_call[0])  # onehot has no seed axis
    _assert_same_rows(rows, one_call[2], one_call[3], setup)
    assert {r["seed"] for r in rows} == set(SEEDS)


def test_planner_picks_the_largest_chunk_that_fits(setup, one_call, monkeypatch):
    config, splits, model_cfg, params, specs, _ = setup
    # Collection runs the sentences packed side by side (their segments and offsets).
    layout = pack_rows(splits["train"].tokens, in_order=True)
    assert 0 < layout.rows < len(splits["train"].tokens)
    batch = (config.proxies.collect_batch_size, splits["train"].tokens.shape[1])
    tokens = jax.ShapeDtypeStruct(batch, splits["train"].tokens.dtype)
    packed = (jax.ShapeDtypeStruct(batch, layout.segments.dtype),
              jax.ShapeDtypeStruct(batch, layout.offsets.dtype))
    sites = ("blocks.1.attn.k",)

    def need(width):  # what the planner measures for activation collection
        return memory.compiled_bytes(_collect_chunk,
                                     memory.seed_shapes(params, width), tokens, packed,
                                     model_cfg=model_cfg, sites=sites, with_vectors=True)

    assert need(1) < need(2) < need(3)
    # A device of this capacity holds 2 of the 3 seeds within its 90%.
    monkeypatch.setattr(memory, "capacity", lambda: int(need(2) / 0.9) + 1)
    lines = []
    stats = collect(params, splits["train"], model_cfg, specs,
                    num_samples=config.proxies.kmeans_samples,
                    batch_size=config.proxies.collect_batch_size,
                    chunking=Chunking(say=lines.append))
    assert len(lines) == 1 and "3 seeds at once need" in lines[0]
    assert "running 2 seeds per chunk" in lines[0] and "2 chunks" in lines[0]
    _assert_close_stats(stats, one_call[0])
    # All 3 fit: one call, nothing printed.
    monkeypatch.setattr(memory, "capacity", lambda: int(need(3) / 0.9) + 1)
    assert memory.plan_seed_chunk(need, NUM_SEEDS, what="x", lower="y", force="z") == (0, None)


def test_planner_error_names_the_key_to_lower(setup, monkeypatch):
    config, splits, model_cfg, params, specs, eval_set = setup
    monkeypatch.setattr(memory, "capacity", lambda: 1000)  # bytes: not even one seed fits
    with pytest.raises(ValueError, match=r"^activation collection does not fit in device memory "
                       r"even at one seed per device: XLA estimates .* MiB per device, capacity "
                       r"0.0 MiB; lower proxies.collect_batch_size \(now 256\)$"):
        collect(params, splits["train"], model_cfg, specs, num_samples=10,
                batch_size=config.proxies.collect_batch_size)
    onehot = fit([specs[-1]], {}, jax.random.PRNGKey(0), NUM_SEEDS)
    with pytest.raises(ValueError, match=r"^evaluating onehot_attention on blocks.1.attn.pattern "
                       r"does not fit .* lower proxies.eval_batch_size \(now 64 rows a call\)$"):
        evaluate(params, model_cfg, eval_set, onehot, batch_size=64,
                 seeds=[0, 1, 2])


def test_plan_with_several_devices(monkeypatch):
    # 8 devices (patched), 60 seeds (64 with padding), capacity 10 GiB (9 usable); a device
    # needs 5 GiB + 1 GiB per seed on it. The linear first guess (13 GiB / 8 seeds per seed:
    # 5 per device) does not fit once compiled (10 GiB), so it is lowered to 4 per device
    # (9 GiB), the most that fits.
    gib = memory.GiB
    monkeypatch.setattr(jax, "device_count", lambda: 8)
    monkeypatch.setattr(memory, "capacity", lambda: 10 * gib)
    widths = []

    def need(width):
        widths.append(width)
        return 5 * gib + width // 8 * gib

    chunk, line = memory.plan_seed_chunk(need, 60, what="evaluating", lower="a", force="b")
    assert (chunk, widths) == (32, [64, 40, 32])
    assert line == ("evaluating: 60 seeds at once need 13.0 GiB per device (XLA estimate), "
                    "over 90% of its 10.0 GiB; running 32 seeds per chunk (9.0 GiB), 2 chunks "
                    "(b forces a size)")
    monkeypatch.setattr(memory, "capacity", lambda: 5 * gib)
    with pytest.raises(ValueError, match="at one seed per device: XLA estimates 6.0 GiB"):
        memory.plan_seed_chunk(need, 60, what="evaluating", lower="a", force="b")


def test_seed_chunk_size_key(config, tmp_path):
    config.proxies.seed_chunk_size = -1
    with pytest.raises(ValueError, match=r"^proxies.seed_chunk_size=-1: must be >= 0 \(0: as "
                       r"many as fit the device\)$"):
        validate.validate(config)
    del config.proxies["seed_chunk_size"]  # typed: a config file could set a float
    config.proxies.seed_chunk_size = 2.5
    with pytest.raises(ValueError, match="proxies.seed_chunk_size=2.5: must be an integer"):
        validate.validate(config)
    # An analysis key: a finished training may be resumed with another value (a note, not an
    # error), and a workdir whose config predates the key matches the default 0.
    del config.proxies["seed_chunk_size"]
    checkpoint.claim_workdir(str(tmp_path), config)  # the config.json of a run before the key
    config.proxies.seed_chunk_size = 0
    assert train.claim_workdir(str(tmp_path), checked(config)) == []
    config.proxies.seed_chunk_size = 4
    notes = train.claim_workdir(str(tmp_path), checked(config))
    assert notes and "proxies.seed_chunk_size changed from 0 to 4" in notes[0]
    # It changes no result, so a finished sweep's analysis is not redone for it.
    assert "proxies.seed_chunk_size" not in sweep._analysis_settings(config)  # noqa: SLF001
