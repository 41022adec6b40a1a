"""The benchmark runs end to end on a tiny config (no timing asserts), its FLOP count agrees with
XLA's, and its PyTorch baseline is the same model as jaxillusions.model."""

import dataclasses
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys

import jax
import numpy as np
import pytest
import tolerance as tol
from conftest import checked, tiny_config_file, xla_flags

from benchmarks import reference, suite
from jaxillusions import model as model_lib
from jaxillusions.config import settings
from jaxillusions.pipeline import validate
from jaxillusions.runtime import distributed
from jaxillusions.training import objective as objective_lib
from jaxillusions.training import train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_benchmark_smoke(config, monkeypatch):
    # The compilations counted below happen in this test whatever ran before it in this worker
    # process (a program another test compiled would be a cache hit, no compilation).
    jax.clear_caches()
    saved = []  # what `jaxillusions benchmark` would have written after each row and section
    said = []  # what it printed
    # Clipping on (a small grad_clip) for the compiled ensemble's first step checked below.
    config.train.grad_clip = 0.05
    config = checked(config)
    has_torch = importlib.util.find_spec("torch") is not None
    compiles = []  # torch.compile's calls: the benchmark's, one per seed count
    with monkeypatch.context() as patch:
        if has_torch:
            # torch.compile for real at the first seed count, whose graph the first-step check
            # below reuses; counted, and the step left eager, at the second: inductor builds a
            # graph per seed count (29 s each from an empty cache on a 2-core CPU), and a
            # second build would test torch, not the benchmark.
            import torch

            real_compile = torch.compile

            def compile_first(fn, **options):
                compiles.append(options)
                return real_compile(fn, **options) if len(compiles) == 1 else fn

            patch.setattr(torch, "compile", compile_first)
        report = suite.run(config, seed_counts=[2, 3], steps=2, repeats=1, loop_max_seeds=2,
                           proxy_seeds=2, with_torch=True, with_kmeans=False, bfloat16=True,
                           peak_n=256, sae_options=dict(num_seeds=2, widths=(4, 8), dim=4,
                                                        num_points=64, steps=3),
                           say=lambda *a, **k: said.append(" ".join(a)),
                           circuit_options=dict(num_seeds=2, sentences=8),
                           save=lambda r: saved.append(json.loads(json.dumps(r))))
    assert compiles == ([dict(dynamic=False, fullgraph=True)] * 2 if has_torch else [])
    rows = report["training"]
    assert [r["num_seeds"] for r in rows] == [2, 3]
    # rows, the proxies, the SAE, the circuits
    assert [len(s["training"]) for s in saved] == [1, 2, 2, 2, 2]
    assert "proxy_fit_and_evaluate" in saved[-1] and "proxy_fit_and_evaluate" not in saved[1]
    # SAE fitting: one program for all seeds x widths against a loop over (seed, width) of the
    # same fit, timed in the same run; the loop's fits are the batched ones.
    fits = report["sae"]
    assert (fits["num_seeds"], fits["widths"]) == (2, [4, 8]) and "sae" in saved[-1]
    assert fits["loop_over_batched"] == pytest.approx(fits["loop_s"] / fits["batched_s"])
    assert fits["max_abs_diff"] < 1e-5 and fits["compiles"] >= 3  # batched + one per width
    # Circuit discovery: one program for the seeds against a loop of the same per-seed function.
    found = report["circuits"]
    assert (found["num_seeds"], found["sentences"], found["units"]) == (2, 8, 23)
    assert found["loop_over_batched"] == pytest.approx(found["loop_s"] / found["batched_s"])
    # The PyTorch loop runs exactly when torch is installed (its note then names the version).
    assert ("torch_loop_seed_steps_per_s" in rows[0]) == has_torch
    assert report["torch"].startswith("torch not installed") != has_torch
    # The torch.func ensemble, eager and compiled, at every seed count the sweep ran (the loops
    # only up to loop_max_seeds); a torch.compile that fails on this machine is a one-line
    # reason in its row, not a crash.
    for row in rows:
        if not has_torch:
            assert not any(k.startswith("torch_ensemble") for k in row)
            continue
        rate = row["torch_ensemble_seed_steps_per_s"]
        assert rate > 0 and row["sweep_over_torch_ensemble"] == pytest.approx(
            row["sweep_seed_steps_per_s"] / rate)
        if "torch_ensemble_compiled_unavailable" in row:
            assert "\n" not in row["torch_ensemble_compiled_unavailable"]
        else:
            rate = row["torch_ensemble_compiled_seed_steps_per_s"]
            assert rate > 0 and row["sweep_over_torch_ensemble_compiled"] == pytest.approx(
                row["sweep_seed_steps_per_s"] / rate)
    if has_torch and "torch_ensemble_compiled_unavailable" not in rows[0]:
        # The compiled ensemble's first step is the per-seed loop's (eager: its own test), on
        # the graph the benchmark compiled for 2 seeds (its model, batch and clip), so that
        # inductor's cache has it: seeds 1 and 0, in that order.
        from benchmarks import torch_loop
        from benchmarks import training as bench_training

        splits, model_cfg, _ = train.build(config)
        objective = bench_training.peers_objective(config)
        assert objective.max_position_offset > 0  # the offsets drawn per seed are checked too
        train_cfg = _first_step_settings(config.train)
        ensemble = torch_loop.Ensemble(model_cfg, train_cfg, objective, compiled=True)
        _assert_first_step_is_the_loops(ensemble, model_cfg, train_cfg, objective,
                                        splits["train"].tokens, [1, 0])
    # The table: the sweep, the per-seed loop and both ensembles side by side, and the sweep's
    # ratio to each, under a header naming the CPU model.
    assert report["cpu_model"] and f"CPU: {report['cpu_model']}, " in "\n".join(said)
    # ... and the XLA flags it ran under (the suite's, here), which change compiled kernels.
    assert report["xla_flags"] == os.environ["XLA_FLAGS"] != ""
    assert any(line.endswith(f"XLA_FLAGS: {report['xla_flags']}") for line in said)
    # ... and, on one CPU device of several cores, the layout that gives each core its seeds.
    suggested = distributed.devices_to_suggest(3)  # the largest seed count
    assert [line for line in said if "JAX_NUM_CPU_DEVICES" in line] == (
        [] if suggested is None else [f"one CPU device on {distributed.cpu_cores()} cores: "
                                      f"JAX_NUM_CPU_DEVICES={suggested} runs the sweep with each "
                                      "core its own seeds, as the Quickstart does (docs/speed.md)"])
    (header,) = [line for line in said if line.lstrip().startswith("seeds |")]
    titles = [t.strip() for t in header.split("|")]
    assert titles[:10] == ["seeds", "sweep", "JAX loop", "PyTorch loop", "PT ensemble",
                           "PT ens.+compile", "sweep/JAX", "sweep/PyTorch", "sweep/PT ens.",
                           "sweep/PT ens.+c"]
    table = [line.split("|") for line in said if line.split("|")[0].strip() in ("2", "3")]
    assert [len(cells) for cells in table] == [len(titles)] * 2
    if has_torch:  # the rates and ratios of both ensembles in both rows (or n/a: unavailable)
        assert all(cells[i].strip() not in ("", "-") for cells in table for i in (4, 5, 8, 9))
    for row in rows:
        assert row["sweep_seed_steps_per_s"] > 0
        assert row["sweep_bf16_seed_steps_per_s"] > 0
        assert 0 < row["sweep_mfu"] < 1 and 0 < row["sweep_bf16_mfu"] < 1
    # Loops are timed up to loop_max_seeds; beyond, the ratio uses the loop's last rate.
    assert rows[0]["jax_loop_seed_steps_per_s"] > 0 and "jax_loop_seed_steps_per_s" not in rows[1]
    assert rows[1]["sweep_over_jax_loop_rate"] == pytest.approx(
        rows[1]["sweep_seed_steps_per_s"] / rows[0]["jax_loop_seed_steps_per_s"])
    # Counted matmul FLOPs vs XLA's count of every op of the compiled step (the rest is
    # elementwise work and the optimizer): same order of magnitude, XLA's larger. XLA's count
    # is compiled for the first seed count only.
    first = rows[0]
    assert first["model_flops_per_seed_step"] < first["xla_flops_per_seed_step"]
    assert first["xla_flops_per_seed_step"] < 3 * first["model_flops_per_seed_step"]
    assert rows[1]["xla_flops_per_seed_step"] is None
    pf = report["proxy_fit_and_evaluate"]
    assert pf["num_seeds"] == 2 and pf["fit_seed_ranks_per_s"] > 0
    # Both evaluations side by side: each rank's pass from the replaced block, and whole passes.
    assert pf["evaluate_seed_rank_sentences_per_s"] > 0
    assert pf["prefix_sharing_speedup"] == pytest.approx(
        pf["evaluate_whole_passes_s"] / pf["evaluate_s"])
    # Compilations per stage beside the rates: the first row compiles the training step; the
    # proxy stages compile their programs (at least one each) in their warm-up calls.
    assert rows[0]["compiles"] >= 1 and rows[0]["compile_s"] > 0
    assert pf["fit_compiles"] >= 1 and pf["evaluate_compiles"] >= 1
    assert report["compilation"]["count"] >= (rows[0]["compiles"] + rows[1]["compiles"]
                                              + pf["fit_compiles"] + pf["evaluate_compiles"])
    assert report["peak_memory"]["bytes"] > 0
    assert report["peak_matmul"]["flops_per_s"] > 0
    assert report["peak_matmul"]["bf16_flops_per_s"] > 0


@pytest.mark.slow
def test_benchmark_reports_a_failing_torch_compile_in_one_line(config, monkeypatch):
    # torch.compile failing on the machine (no C++ compiler, an unsupported op) is a result:
    # the compiled ensemble's row reads n/a with the one-line reason, said once, and larger seed
    # counts do not try again; the eager ensemble is timed all the same.
    torch = pytest.importorskip("torch")
    compiles = []

    def failing_compile(fn, **options):
        compiles.append(options)

        def compiled(*args):
            raise RuntimeError("InductorError: no working C++ compiler found\n(traceback)")
        return compiled

    monkeypatch.setattr(torch, "compile", failing_compile)
    said = []
    report = suite.run(checked(config), seed_counts=[2, 3], steps=1, repeats=1,
                       loop_max_seeds=0, proxy_seeds=2, with_kmeans=False, with_sae=False,
                       circuit_options=False, peak_n=256,
                       say=lambda *a, **k: said.append(" ".join(a)))
    reason = "RuntimeError: InductorError: no working C++ compiler found"
    rows = report["training"]
    assert [r["torch_ensemble_compiled_unavailable"] for r in rows] == [reason] * 2
    assert len(compiles) == 1 and all(r["torch_ensemble_seed_steps_per_s"] > 0 for r in rows)
    assert not any("torch_ensemble_compiled_seed_steps_per_s" in r for r in rows)
    assert [line for line in said if reason in line] == [
        f"      PyTorch ensemble +compile at 2 seeds: unavailable ({reason})"]
    table = [line.split("|") for line in said if line.split("|")[0].strip() in ("2", "3")]
    assert [(cells[5].strip(), cells[9].strip()) for cells in table] == [("n/a", "n/a")] * 2


def test_contenders_are_timed_in_an_order_turned_each_repeat():
    """Each contender runs once a repeat, and each starts a repeat in turn, so that none
    always runs first or after the same one; its seconds are its own calls'."""
    from benchmarks import training as bench_training

    calls = []
    fns = {name: (lambda name=name: calls.append(name)) for name in "abc"}
    seconds = bench_training.times(fns, repeats=4)
    assert calls == list("abc" "bca" "cab" "abc")
    assert {name: len(s) for name, s in seconds.items()} == {"a": 4, "b": 4, "c": 4}
    assert all(t >= 0 for s in seconds.values() for t in s)
    assert bench_training.times({}, repeats=4) == {}  # nothing to time (was: a division by 0)


def test_reference_flops_match_xla_for_the_reference_model():
    cfg = model_lib.ModelConfig(vocab_size=43, max_len=64, d_model=64, d_mlp=256)
    flops = reference.train_flops(cfg, batch=32, seq=64)
    assert flops == pytest.approx(1.443e9, rel=1e-3)  # matmuls: 3 x 481 MFLOP forward

    def loss(p, tokens):
        return model_lib.forward(p, tokens, cfg)[0].sum()

    params = model_lib.init_params(jax.random.PRNGKey(0), cfg)
    tokens = np.zeros((32, 64), np.int32)
    cost = jax.jit(jax.value_and_grad(loss)).lower(params, tokens).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, list | tuple) else cost
    assert flops <= cost["flops"] < 1.2 * flops  # the matmuls are nearly all of XLA's count


def test_xla_flops_count_every_group_of_seeds(config, monkeypatch):
    """On a CPU, seeds train in cache-sized groups one after the other, a loop whose body XLA's
    cost analysis counts once: the benchmark's XLA count is the same with 3 groups as with one."""
    from benchmarks import training as bench_training
    from jaxillusions.training import step as step_lib
    from jaxillusions.training.step import init_state, train_steps

    splits, model_cfg, tx = train.build(checked(config))
    tokens = jax.numpy.asarray(splits["train"].tokens)
    run = dict(model_cfg=model_cfg, tx=tx, batch_size=8)
    one_member = step_lib.member_bytes(model_cfg, 8, tokens.shape[1])
    counts = []
    for budget in (step_lib.CPU_GROUP_BYTES, 2 * one_member):
        monkeypatch.setattr(step_lib, "CPU_GROUP_BYTES", budget)
        train_steps.clear_cache()  # the budget is read while tracing
        counts.append(bench_training.xla_step_flops(init_state(range(6), model_cfg, tx),
                                                    tokens, run))
    train_steps.clear_cache()
    assert step_lib.num_groups(6, one_member) == 3
    # The same matmuls and elementwise work; a grouped loop adds no arithmetic of its own.
    assert counts[1] == pytest.approx(counts[0], rel=0.01)


def _packing_config_spied(config, module, monkeypatch):
    """(settings of `config` packing two sentences a row, seen): `module.train_steps` (and its
    `.lower`) replaced by a spy that appends the packed rows of each call's objective to seen."""
    config.train.rows_per_sentence = 0.5
    settings = checked(config)
    assert objective_lib.from_settings(settings).packed_rows == 8
    seen, real = [], module.train_steps

    def spy(*args, objective, **kwargs):
        seen.append(objective.packed_rows)
        return real(*args, objective=objective, **kwargs)

    spy.lower = lambda *args, objective, **kwargs: (
        seen.append(objective.packed_rows) or real.lower(*args, objective=objective, **kwargs))
    monkeypatch.setattr(module, "train_steps", spy)
    return settings, seen


def test_the_sweep_is_timed_on_unpacked_rows_as_its_peers_train(config, monkeypatch):
    """A config that packs its batches (train.rows_per_sentence < 1) is benchmarked one sentence
    per row, the work its PyTorch peers do: the timed step's objective packs nothing."""
    from benchmarks import training as bench_training

    settings, seen = _packing_config_spied(config, bench_training, monkeypatch)
    splits, model_cfg, tx = train.build(settings)
    bench_training.training_row(settings, splits, model_cfg, tx, 2, steps=1, repeats=1,
                                peak=bench_training.peak_flops(64), loop=False, torch_loop=False,
                                xla_flops=False)
    assert seen and set(seen) == {0}


def test_a_rows_mfu_is_of_the_peak_timed_with_it_where_that_is_higher(config):
    """The peak matmul is timed again in turn with a row's contenders: a peak measured low at
    the start (a disturbed moment) does not inflate the row's MFU, and a higher one is kept."""
    from benchmarks import training as bench_training

    settings = checked(config)
    splits, model_cfg, tx = train.build(settings)
    rows = {}
    for name, rate in (("low", 1.0), ("high", 1e30)):
        peak = {"n": 64, "flops_per_s": rate, "bf16_flops_per_s": rate}
        rows[name] = bench_training.training_row(
            settings, splits, model_cfg, tx, 2, steps=1, repeats=2, peak=peak, loop=False,
            torch_loop=False, bfloat16=True, xla_flops=False)
    low, high = rows["low"], rows["high"]
    assert 1.0 < low["peak_flops_per_s"] < 1e30 and high["peak_flops_per_s"] == 1e30
    assert 1.0 < low["peak_bf16_flops_per_s"] < 1e30 and high["peak_bf16_flops_per_s"] == 1e30
    for row in rows.values():
        for sweep, peak in (("sweep", "peak"), ("sweep_bf16", "peak_bf16")):
            assert row[f"{sweep}_mfu"] == pytest.approx(
                row[f"{sweep}_seed_steps_per_s"] * row["model_flops_per_seed_step"]
                / row[f"{peak}_flops_per_s"])
    assert low["sweep_mfu"] > high["sweep_mfu"] and low["sweep_bf16_mfu"] > high["sweep_bf16_mfu"]


def test_the_profile_traces_the_step_the_benchmark_times(config, monkeypatch):
    """benchmarks.profile traces the benchmark's step (one sentence per row) for a config that
    packs, and attributes the step's thunk time to kinds of work that add up to all of it."""
    from benchmarks import profile as bench_profile

    settings, seen = _packing_config_spied(config, bench_profile, monkeypatch)
    out = bench_profile.profile(settings, 2, steps=2)
    assert len(seen) == 3 and set(seen) == {0}  # lowered, warmed up, traced
    assert out["thunk_ms_per_step"] > 0 and out["wall_ms_per_step"] > 0
    assert sum(out["shares"].values()) == pytest.approx(1.0)
    assert any(k.startswith("matmul") for k in out["shares"])


def test_torch_baseline_is_the_same_model():
    torch = pytest.importorskip("torch")
    from benchmarks import torch_loop

    cfg = model_lib.ModelConfig(vocab_size=11, max_len=12, d_model=16, d_mlp=32, n_heads=2)
    params = model_lib.init_params(jax.random.PRNGKey(0), cfg)
    params = jax.tree.map(lambda x: x + 0.1 * jax.random.normal(jax.random.PRNGKey(1), x.shape),
                          params)  # nonzero biases and layer-norm parameters too
    tokens = np.asarray(jax.random.randint(jax.random.PRNGKey(2), (3, 10), 0, 11))
    logits, _ = model_lib.forward(params, tokens, cfg)
    model = torch_loop.load_jax_params(torch_loop.Transformer(cfg), params)
    with torch.no_grad():
        theirs = model(torch.from_numpy(tokens.astype(np.int64))).numpy()
    # Two float32 implementations: within twice the logits' rounding through matmuls of up to
    # d_mlp terms (tests/tolerance.py), per row.
    want = np.asarray(logits, np.float64)
    assert np.all(np.abs(theirs - want) <= tol.two_ways(tol.activation_error(want, cfg.d_mlp)))


def _first_step_tolerance(p0, g, lr, width):
    """Between a parameter after AdamW's first step from p0 (no warmup: the peak rate lr) with
    its clipped gradient g computed two ways (a loop of single models against a vmapped
    ensemble: other matmul shapes, other roundings). The first step moves each element by
    lr * f(g) with f(g) = g / (|g| + eps) (m and v debiased: g and g^2; the weight decay term is
    the same elementwise computation of the same p0 both ways). g: within d = two_ways of
    activation_error over the whole leaf (backward matmuls of up to `width` terms; the leaf's
    norm, not the element's: a gradient element is a sum of terms that cancel), so f differs by
    at most d * eps / (max(|g| - d, 0) + eps)^2 (f's slope at the smallest |g| within d), and
    never by more than 2; plus TERM_ULPS roundings of the update and of p0."""
    g = np.asarray(g, np.float64)
    d = tol.two_ways(tol.activation_error(g.reshape(1, -1), width)[0, 0])
    smallest = np.maximum(np.abs(g) - d, 0.0)
    slope = np.minimum(2.0, d * 1e-8 / (smallest + 1e-8) ** 2)
    return lr * slope + tol.TERM_ULPS * tol.EPS32 * (np.abs(np.asarray(p0, np.float64)) + lr)


def _assert_first_step_is_the_loops(ensemble, cfg, train_cfg, objective, tokens, seeds):
    """The torch.func ensemble of the benchmark (vmap of grad over stacked parameters, clipping
    per seed, torch.optim's AdamW on the stacked leaves) takes, for each seed, the per-seed
    loop's first step: same initial parameters, same batch, same update. Seed s of the ensemble
    is the loop's seed s, wherever it stands in `seeds`."""
    import torch

    from benchmarks import torch_loop

    stacked, _ = ensemble.train_params(seeds, tokens, num_steps=1)
    width = max(cfg.d_mlp, train_cfg.batch_size * (tokens.shape[1] - 1))
    for i, seed in enumerate(seeds):
        torch.manual_seed(seed)
        initial = dict(torch_loop.Transformer(cfg).named_parameters())
        model, _ = torch_loop._train_model(seed, tokens, cfg, train_cfg, 1,
                                            objective.max_position_offset)
        for name, p in model.named_parameters():
            # The clipped gradients (each seed clipped by its own norm; AdamW's first step alone
            # would not show it: it is g / |g| elementwise), then the parameters.
            g = p.grad.numpy()
            gradient_limit = tol.two_ways(tol.activation_error(g.reshape(1, -1), width))
            assert np.all(np.abs(stacked[name].grad[i].numpy() - g) <= gradient_limit), name
            p0 = initial[name].detach().numpy()
            theirs, want = stacked[name][i].detach().numpy(), p.detach().numpy()
            assert np.any(theirs != p0), name  # it moved
            limit = _first_step_tolerance(p0, g, train_cfg.learning_rate, width)
            assert np.all(np.abs(theirs - want) <= limit), (seed, name)


def _first_step_settings(train_cfg):
    """No warmup (the first step at the peak rate, not 0) and a weight decay; the clipping and
    batch of `train_cfg` (a compiled step's graph holds them, not the rate)."""
    return dataclasses.replace(train_cfg, learning_rate=1e-2, warmup_steps=0, weight_decay=0.1)


def test_torch_ensemble_first_step_is_the_loops():
    # Eager here; compiled in test_benchmark_smoke, on the graph the benchmark compiled. Seeds 3
    # and 0, in that order; clipping on (a small grad_clip).
    pytest.importorskip("torch")
    from benchmarks import torch_loop

    cfg = model_lib.ModelConfig(vocab_size=11, max_len=14, d_model=16, d_mlp=32, n_heads=2)
    train_cfg = _first_step_settings(dataclasses.replace(settings.Train(), batch_size=4,
                                                         grad_clip=0.05))
    objective = objective_lib.Objective(max_position_offset=2)
    tokens = np.random.default_rng(0).integers(1, 11, (50, 11))
    tokens[::3, 7:] = 0  # PAD targets, left out of the loss
    _assert_first_step_is_the_loops(torch_loop.Ensemble(cfg, train_cfg, objective), cfg,
                                    train_cfg, objective, tokens, [3, 0])


def test_torch_ensemble_clips_each_seed_by_its_own_norm():
    # vmapped over seeds, clip_by_global_norm is nn.utils.clip_grad_norm_ of each seed: one
    # seed above max_norm (scaled down), one below (unchanged).
    torch = pytest.importorskip("torch")
    from benchmarks import torch_loop

    gen = torch.Generator().manual_seed(0)
    shapes = {"a": (3, 5), "b": (7,), "c": (2, 2, 4)}
    grads = {k: torch.randn((2, *s), generator=gen) for k, s in shapes.items()}
    for g in grads.values():
        g[1] *= 0.01  # seed 1's norm is below max_norm
    clipped = torch.func.vmap(lambda g: torch_loop.clip_by_global_norm(g, 1.0))(grads)
    n = sum(int(np.prod(s)) for s in shapes.values())
    for i in range(2):
        params = [torch.nn.Parameter(torch.zeros(s)) for s in shapes.values()]
        for p, g in zip(params, grads.values(), strict=True):
            p.grad = g[i].clone()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        for p, name in zip(params, grads, strict=True):
            want = p.grad.numpy().astype(np.float64)
            # Both scale by 1 / norm: the norm's sum of n squares, in another order.
            limit = tol.two_ways(np.abs(want) * (tol.sum_error(n, 1.0) + tol.TERM_ULPS
                                                 * tol.EPS32))
            assert np.all(np.abs(clipped[name][i].numpy() - want) <= limit), (i, name)
    assert torch.equal(clipped["a"][1], grads["a"][1])  # below max_norm: unchanged


def test_compute_dtype_is_a_validated_training_key(config):
    assert not validate.parse({}).is_analysis_key("model.compute_dtype")
    assert settings.Model().compute_dtype == "float32"  # workdirs from before the key
    config.model.compute_dtype = "float16"
    with pytest.raises(ValueError, match="model.compute_dtype"):
        validate.validate(config)
    config.model.compute_dtype = "bfloat16"
    validate.validate(config)
    assert train.model_config(checked(config)).compute_dtype == "bfloat16"


def _xla_flops_of_4_seeds(config):
    from benchmarks import training as bench_training
    from jaxillusions.training.step import init_state

    splits, model_cfg, tx = train.build(config)
    run = dict(model_cfg=model_cfg, tx=tx, batch_size=config.train.batch_size)
    return bench_training.xla_step_flops(init_state(range(4), model_cfg, tx),
                                         jax.numpy.asarray(splits["train"].tokens), run)


@pytest.mark.slow
def test_benchmark_sweep_runs_on_every_device(cache_dir):
    # With 4 CPU devices, 3 seeds run as the train command runs them: padded to 4, one per device;
    # the reported rate counts the 3 real seeds.
    code = ("import json, sys; sys.path[:0] = ['tests']; import conftest, jax; "
            "import test_benchmark; "
            "from benchmarks import training; from jaxillusions.pipeline import validate; "
            "from jaxillusions.training import train; "
            f"config = validate.parse(conftest.tiny_config({cache_dir!r})); "
            "splits, m, tx = train.build(config); "
            "row = training.training_row(config, splits, m, tx, 3, steps=2, repeats=1, "
            "peak=training.peak_flops(256), loop=False, torch_loop=False, xla_flops=False); "
            "row['xla_flops_of_4_seeds'] = test_benchmark._xla_flops_of_4_seeds(config); "
            "print(json.dumps(row))")
    env = {**os.environ, "XLA_FLAGS": xla_flags("--xla_force_host_platform_device_count=4")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    row = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (row["num_seeds"], row["devices"], row["padded_seeds"]) == (3, 4, 4)
    assert 0 < row["sweep_mfu"] < 1
    # XLA's count of 4 seeds, one per device (each device's program counts its own seed): per
    # seed, above the counted matmuls and within 3x, as on one device (the smoke test).
    per_seed, counted = row["xla_flops_of_4_seeds"] / 4, row["model_flops_per_seed_step"]
    assert counted < per_seed < 3 * counted


def _benchmark(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "jaxillusions", "benchmark", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("args, message", [
    (["--seeds=1,,2"], "--seeds=1,,2: expected positive integers"),
    (["--seeds=-1"], "--seeds=-1: expected positive integers"),
    (["--repeats=0"], "--repeats=0: must be >= 1"),
    (["--proxy_seeds=0"], "--proxy_seeds=0: must be >= 1"),
    (["--config=nope.py"], "config file nope.py not found; the shipped configs: code,"),
    (["--config=nope"], "no shipped config named 'nope'; the shipped configs: code,"),
    (["--config=dyck_small", "--compute_dtype=float16"], "invalid choice: 'float16'"),
    (["--seeds=2,2"], "--seeds=2,2: each seed count once"),  # was: timed twice, one count
    (["--out=b.json/x.json"], "b.json is a file, not a folder"),  # was: "File exists: ..."
])
def test_benchmark_bad_input_is_one_line(args, message, tmp_path):
    # Was: tracebacks (ZeroDivisionError, ValueError), some after the first row was timed, and
    # negative throughputs recorded for --seeds=-1.
    (tmp_path / "b.json").write_text("an earlier report")  # (a file, where --out goes under it)
    proc = _benchmark(f"--out={tmp_path / 'b.json'}", *args, cwd=tmp_path)
    (line,) = proc.stderr.strip().splitlines()
    assert proc.returncode != 0 and line.startswith("error: ") and message in line, proc.stderr
    assert (tmp_path / "b.json").read_text() == "an earlier report"


@pytest.mark.parametrize("args, message", [
    (["--seeds=0"], "--seeds=0: must be >= 1"),  # was: a StopIteration traceback
    (["--config=nosuch"], "error: no shipped config named 'nosuch'"),  # was: a traceback
])
def test_the_profile_refuses_bad_arguments_in_one_line(args, message):
    proc = subprocess.run([sys.executable, "-m", "benchmarks.profile", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_benchmark_keeps_an_earlier_report(tmp_path, cache_dir, monkeypatch, capsys):
    # Was: a rerun to the same --out replaced a finished report at its first row.
    # In this process (the launcher's main; its one-line errors are tested as subprocesses
    # above): the training step is then the one test_benchmark_smoke compiled.
    from jaxillusions.launch import benchmark

    config = tiny_config_file(tmp_path / "tiny.py", cache_dir)
    out = tmp_path / "b.json"
    out.write_text('{"earlier": true}')
    monkeypatch.setattr(sys, "argv", [
        "benchmark", f"--config={config}", "--seeds=2", "--steps=2", "--repeats=1",
        "--loop_max_seeds=0", "--proxy_seeds=2", "--no_torch", "--no_kmeans", "--no_sae",
        "--no_circuits",
        f"--out={out}"])
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        benchmark.main()  # exits (SystemExit) on an error
    finally:
        for signum, handler in handlers.items():  # main installs its own
            signal.signal(signum, handler)
    stdout = capsys.readouterr().out
    (kept,) = [p for p in tmp_path.iterdir() if p.name.startswith("b.2")]
    assert json.loads(kept.read_text()) == {"earlier": True}
    assert f"note: the earlier report {out} is kept as {kept}" in stdout
    assert [r["num_seeds"] for r in json.loads(out.read_text())["training"]] == [2]


def test_matmul_benchmark_times_each_of_the_steps_shapes_in_both_libraries(capsys):
    pytest.importorskip("torch")
    from benchmarks import matmuls

    assert matmuls.flops("sij,sjk->sik", (2, 15, 8), (2, 8, 16)) == 2 * 2 * 15 * 8 * 16
    rows = matmuls.shapes(seeds=2, d=8, f=16, e=4, batch=3, seq=5)
    for _, spec, lhs, rhs in rows:  # each row is an einsum of its operands' shapes
        assert np.einsum(spec, np.ones(lhs), np.ones(rhs)).size > 0
    timed = matmuls.run(rows, calls=1, repeats=1)
    assert [r["name"] for r in timed] == [r[0] for r in rows]
    assert all(r["jax_gflops"] > 0 and r["torch_gflops"] > 0 for r in timed)
    # The reference model's rows: its weight gradient contracts the group's 2,048 positions.
    shown = matmuls.main(["--seeds=1", "--calls=1", "--repeats=1"])
    said = capsys.readouterr().out
    assert "MLP in, weight gradient" in said and said.count("\n") == len(shown) + 2
    weight_gradient = next(r for r in shown if r["name"] == "MLP in, weight gradient")
    assert weight_gradient["lhs"] == (1, 2048, 64) and weight_gradient["rhs"] == (1, 2048, 256)
    with pytest.raises(SystemExit):
        matmuls.main(["--calls=0"])


@pytest.mark.slow
@pytest.mark.skipif(subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True)
                    .returncode != 0, reason="needs the repository's git history")
def test_side_by_side_runs_a_config_at_two_commits_and_compares_their_results(tmp_path,
                                                                               cache_dir):
    # Was: its data step imported modules from where they lived before the package's layout
    # changed, so the script stopped before timing anything.
    config = tiny_config_file(tmp_path / "tiny.py", cache_dir, {"figures": "none"})
    # PYTHON: this interpreter, so that the suite run as `.venv/bin/pytest` from a shell whose
    # `python` is another (no environment activated) still runs the commits with its packages.
    env = {**os.environ, "OUT": str(tmp_path / "out"), "CONFIG": config, "PYTHON": sys.executable}
    done = subprocess.run(["bash", "benchmarks/side_by_side.sh", "HEAD", "HEAD", "1"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert re.fullmatch(r"mean: before [\d.]+ s, after [\d.]+ s, after/before \d+%",
                        next(x for x in lines if x.startswith("mean: ")))
    assert "results.csv: identical" in lines  # the same commit twice: the same bits
