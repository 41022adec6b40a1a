"""Memory of the proxy stage: collect, fit and evaluate in sequential seed chunks, the chunk
size planned from XLA's memory analysis when the device reports its capacity (here: a patched
memory.capacity, since the CPU reports none), and the proxies.seed_chunk_size key.

Chunks are not bit-identical to one call on XLA:CPU (the vmapped program of 2 seeds rounds
some float32 reductions differently from that of 3: per-position JSD within ~1e-7), so floats
are compared to float32 rounding and counts, predictions and row keys exactly.
"""

import jax
import numpy as np
import pytest
from conftest import tiny_config

from jaxillusions import faithfulness, memory, sweep, train, validate
from jaxillusions.step import init_state

NUM_SEEDS = 3  # not a multiple of the chunk of 2: the last chunk is padded


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    config = tiny_config(str(tmp_path_factory.mktemp("cache")))
    config.proxies.targets = ("blocks.-1.attn.k",)
    config.proxies.methods = ("svd", "kmeans", "onehot_attention")
    config.proxies.kmeans_sizes = (2, 4)
    config.proxies.kmeans_samples = 300
    config.proxies.eval_splits = ("iid", "longer")
    splits, model_cfg, tx = train.build(config)
    params = jax.tree.map(np.asarray, init_state(range(NUM_SEEDS), model_cfg, tx).params)
    specs = faithfulness.specs_from_config(config.proxies, model_cfg)
    eval_set = faithfulness.make_eval_set(splits, config.proxies.eval_splits)
    return config, splits, model_cfg, params, specs, eval_set


def _run(setup, chunk: int, say=None):
    config, splits, model_cfg, params, specs, eval_set = setup
    pc = config.proxies
    stats = faithfulness.collect(params, splits["train"], model_cfg, specs,
                                 num_samples=pc.kmeans_samples, batch_size=pc.collect_batch_size,
                                 seed_chunk_size=chunk, say=say)
    fitted = faithfulness.fit(specs, stats, jax.random.PRNGKey(0), NUM_SEEDS,
                              seed_chunk_size=chunk, say=say)
    rows = faithfulness.evaluate(params, model_cfg, eval_set, fitted,
                                 batch_size=pc.eval_batch_size, seeds=[7, 8, 9],
                                 seed_chunk_size=chunk, say=say)
    return stats, [f.params for f in fitted], rows


@pytest.fixture(scope="module")
def one_call(setup):
    return _run(setup, 0)


def _assert_close(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        assert x.shape == y.shape and x.shape[0] == NUM_SEEDS
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


def _assert_same_rows(a, b):
    # Keys, counts, accuracies and same_pred exactly; JSD and the dictionary metrics up to
    # float32 rounding (NaN where a metric is undefined, e.g. l0 of svd). ce_score and kl_score
    # are ratios whose denominators can be near 0 on q/k sites (docs/sparse_dictionaries.md):
    # relative 1e-4 (measured up to 5e-5 between device layouts).
    assert len(a) == len(b) > 0
    floats = ("jsd", "jsd_p95", "jsd_p99", "fvu", "l0", "dead", "ce_score", "kl_score")
    for x, y in zip(a, b, strict=True):
        assert {k: v for k, v in x.items() if k not in floats} == {
            k: v for k, v in y.items() if k not in floats}
        for k in floats[:6]:
            np.testing.assert_allclose(x.get(k, np.nan), y.get(k, np.nan), atol=1e-6,
                                       err_msg=k)
        for k in floats[6:]:
            np.testing.assert_allclose(x.get(k, np.nan), y.get(k, np.nan), rtol=1e-4,
                                       atol=1e-6, err_msg=k)


def test_seed_chunks_equal_one_call(setup, one_call):
    # Chunks of 2 seeds (3 seeds: 2 + 1 padded) for collection, fitting and evaluation.
    stats, fitted, rows = _run(setup, 2)
    _assert_close(stats, one_call[0])
    _assert_close(fitted[:2], one_call[1][:2])  # svd, kmeans (onehot has no seed axis)
    _assert_same_rows(rows, one_call[2])
    assert {r["seed"] for r in rows} == {7, 8, 9}


def test_planner_picks_the_largest_chunk_that_fits(setup, one_call, monkeypatch):
    config, splits, model_cfg, params, specs, _ = setup
    tokens = splits["train"].tokens[:config.proxies.collect_batch_size]
    sites = ("blocks.1.attn.k",)

    def need(width):  # what the planner measures for activation collection
        return memory.compiled_bytes(faithfulness._collect_chunk,  # noqa: SLF001
                                     memory.seed_shapes(params, width), tokens,
                                     model_cfg=model_cfg, sites=sites, with_vectors=True)

    assert need(1) < need(2) < need(3)
    # A device of this capacity holds 2 of the 3 seeds within its 90%.
    monkeypatch.setattr(memory, "capacity", lambda: int(need(2) / 0.9) + 1)
    lines = []
    stats = faithfulness.collect(params, splits["train"], model_cfg, specs,
                                 num_samples=config.proxies.kmeans_samples,
                                 batch_size=config.proxies.collect_batch_size,
                                 say=lines.append)
    assert len(lines) == 1 and "3 seeds at once need" in lines[0]
    assert "running 2 seeds per chunk" in lines[0] and "2 chunks" in lines[0]
    _assert_close(stats, one_call[0])
    # All 3 fit: one call, nothing printed.
    monkeypatch.setattr(memory, "capacity", lambda: int(need(3) / 0.9) + 1)
    assert memory.plan_seed_chunk(need, NUM_SEEDS, what="x", lower="y", force="z") == (0, None)


def test_planner_error_names_the_key_to_lower(setup, monkeypatch):
    config, splits, model_cfg, params, specs, eval_set = setup
    monkeypatch.setattr(memory, "capacity", lambda: 1000)  # bytes: not even one seed fits
    with pytest.raises(ValueError, match=r"^activation collection does not fit in device memory "
                       r"even at one seed per device: XLA estimates .* MiB per device, capacity "
                       r"0.0 MiB; lower proxies.collect_batch_size \(now 256\)$"):
        faithfulness.collect(params, splits["train"], model_cfg, specs, num_samples=10,
                             batch_size=config.proxies.collect_batch_size)
    onehot = faithfulness.fit([specs[-1]], {}, jax.random.PRNGKey(0), NUM_SEEDS)
    with pytest.raises(ValueError, match=r"^evaluating onehot_attention on blocks.1.attn.pattern "
                       r"does not fit .* lower proxies.eval_batch_size \(now 64\)$"):
        faithfulness.evaluate(params, model_cfg, eval_set, onehot, batch_size=64,
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
    train.claim_workdir(str(tmp_path), config)
    config.proxies.seed_chunk_size = 0
    assert train.claim_workdir(str(tmp_path), config) == []
    config.proxies.seed_chunk_size = 4
    notes = train.claim_workdir(str(tmp_path), config)
    assert notes and "proxies.seed_chunk_size changed from 0 to 4" in notes[0]
    # It changes no result, so a finished sweep's analysis is not redone for it.
    assert "proxies.seed_chunk_size" not in sweep._analysis_settings(config)  # noqa: SLF001
