"""The whole benchmark: training throughput and MFU per seed count, the sweep against JAX and
PyTorch per-seed loops and a PyTorch torch.func ensemble of all seeds (eager and compiled), proxy
fitting and evaluation throughput, peak memory. Prints a table as it goes and returns everything
as a JSON-ready dict."""

from __future__ import annotations

import os
import platform
import time

import jax

from benchmarks import proxies, reference, training
from jaxillusions import configs
from jaxillusions.config import settings
from jaxillusions.runtime import distributed, timing
from jaxillusions.runtime.machine import cpu_model
from jaxillusions.training import objective as objective_lib
from jaxillusions.training import train


def load_config(path: str | None, compute_dtype: str | None = None):
    """The reference model (benchmarks/reference.py), or the config `path`: a shipped config's
    name or a config file (configs.locate), either with an optional `:argument`."""
    if path is None:
        config = reference.get_config()
    else:
        config = configs.load(configs.locate(path))
    if compute_dtype is not None:
        config.model.compute_dtype = compute_dtype
    return config


def _torch_status(config) -> tuple[bool, str]:
    try:
        from benchmarks import torch_loop  # noqa: PLC0415
    except ImportError:
        return False, "torch not installed (pip install -e '.[bench]')"
    objective = objective_lib.from_settings(config)
    if objective.loss_on != "all" or objective.contrastive:
        return False, "the PyTorch baseline implements the plain next-token objective only"
    return True, torch_loop.describe()


def _reraise_unless_out_of_memory(error: Exception) -> None:
    """Out of device memory is a result of the benchmark (reported, the run goes on); any other
    runtime error is not."""
    if "RESOURCE_EXHAUSTED" not in str(error):
        raise error


def run(config, *, seed_counts, steps: int, repeats: int, loop_max_seeds: int,
        proxy_seeds: int, with_torch: bool = True, with_kmeans: bool = True,
        bfloat16: bool = False, peak_n: int | None = None, with_sae: bool = True,
        with_torch_compile: bool = True,
        sae_options: dict | None = None, say=print, save=lambda report: None,
        circuit_options: dict | None = None) -> dict:
    """The whole benchmark; `save(report)` is called after every row and section, so a run that
    is stopped (or runs out of device memory) keeps what it measured. Beside each throughput:
    the XLA compilations of that stage, count and seconds (timing.Breakdown; a stage times
    its calls after warm-up calls, so its compilations do not count in its rates).
    sae_options: keyword arguments of proxies.bench_sae (default: its real size);
    circuit_options: keyword arguments of proxies.bench_circuits (default: 32 seeds), or False
    to skip circuit discovery. with_torch: the PyTorch loop (up to loop_max_seeds) and the
    torch.func ensemble (every seed count), where torch is installed; with_torch_compile: also
    the ensemble through torch.compile (a failure of torch.compile is reported in its row, one
    line, and not tried again at larger seed counts). `config`:
    settings.Settings (validate.check, as `jaxillusions benchmark` calls it)."""
    config = settings.require(config, "benchmarks.suite.run")
    with timing.Breakdown() as clock:
        start = time.perf_counter()
        splits, model_cfg, tx = train.build(config)
        seq = splits["train"].tokens.shape[1] - 1
        torch_ok, torch_note = _torch_status(config) if with_torch else (False, "skipped")
        peak = training.peak_flops(peak_n)
        report = {
            "platform": platform.platform(), "processor": platform.processor(),
            "cpu_model": cpu_model(), "cpu_count": os.cpu_count(), "backend": jax.default_backend(),
            "device": str(jax.devices()[0].device_kind), "device_count": jax.device_count(),
            "jax": jax.__version__, "torch": torch_note,
            "xla_flags": os.environ.get("XLA_FLAGS", ""),
            "model": {k: getattr(model_cfg, k) for k in ("n_layers", "n_heads", "d_model",
                                                          "d_mlp", "vocab_size", "compute_dtype")},
            "batch": [config.train.batch_size, seq], "peak_matmul": peak,
        }
        say(f"jax {jax.__version__}, {jax.device_count()} x {report['device']} "
            f"({jax.default_backend()}); PyTorch: {torch_note}")
        say(f"CPU: {report['cpu_model']}, {report['cpu_count']} logical cores; "
            f"XLA_FLAGS: {report['xla_flags'] or '(none)'}")
        suggested = distributed.devices_to_suggest(max(seed_counts))
        if suggested:
            say(f"one CPU device on {distributed.cpu_cores()} cores: JAX_NUM_CPU_DEVICES="
                f"{suggested} runs the sweep with each core its own seeds, as the Quickstart "
                "does (docs/speed.md)")
        say(f"model: {model_cfg.n_layers} layers, d_model {model_cfg.d_model}, {model_cfg.n_heads} "
            f"head(s), MLP {model_cfg.d_mlp}, vocabulary {model_cfg.vocab_size}, "
            f"{model_cfg.compute_dtype}; batch {config.train.batch_size} x {seq} tokens; "
            f"{steps} steps per call, best of {repeats}")
        say(f"peak: {peak['n']}x{peak['n']} matmul at {peak['flops_per_s'] / 1e9:.0f} GFLOP/s "
            f"in float32 (default precision), {peak['bf16_flops_per_s'] / 1e9:.0f} GFLOP/s in "
            "bfloat16")
        say("\nTraining (seed-steps/s, higher is better; ratios: the other's time over the "
            "sweep's; a ratio in parentheses uses the loop's rate at the most seeds it was timed "
            "with; PyTorch ensemble: all seeds as one torch.func ensemble (vmap of grad over the "
            "stacked parameters), eager, and +compile: its step through torch.compile; "
            "MFU: of the peak above or of that matmul timed in turn with the row's "
            "contenders, the higher; compiled: XLA programs of the row and their seconds):")
        say(" | ".join(f"{title:>{width}}" for title, _, _, width in _COLUMNS)
            + f" | {'compiled':>13}")
        rows = report["training"] = []
        compile_failed = False  # or the reason torch.compile failed at a smaller seed count
        for n in seed_counts:
            try:
                with timing.stage(f"training {n} seeds"):
                    row = training.training_row(
                        config, splits, model_cfg, tx, n, steps=steps, repeats=repeats,
                        peak=peak, loop=n <= loop_max_seeds,
                        torch_loop=torch_ok and n <= loop_max_seeds,
                        torch_ensemble=torch_ok,
                        torch_compile=compile_failed or (torch_ok and with_torch_compile),
                        bfloat16=bfloat16, xla_flops=not rows)
                row["compiles"], row["compile_s"] = clock.compiles[f"training {n} seeds"]
            except jax.errors.JaxRuntimeError as e:
                _reraise_unless_out_of_memory(e)
                say(f"{n:>5} | out of device memory; larger seed counts skipped")
                report["training_out_of_memory_at"] = n
                break
            for name in ("jax_loop", "torch_loop"):
                # A loop's rate does not depend on how many seeds it goes through: beyond
                # loop_max_seeds, compare with the rate it reached at the most seeds timed.
                timed = [r for r in rows + [row] if f"{name}_seed_steps_per_s" in r]
                if timed and f"sweep_over_{name}" not in row:
                    row[f"sweep_over_{name}_rate"] = (row["sweep_seed_steps_per_s"]
                                                      / timed[-1][f"{name}_seed_steps_per_s"])
            rows.append(row)
            say(_table_row(row), flush=True)
            for name, title in (("torch_loop", "PyTorch loop"),
                                ("torch_ensemble", "PyTorch ensemble"),
                                ("torch_ensemble_compiled", "PyTorch ensemble +compile")):
                reason = row.get(f"{name}_unavailable")
                if reason and reason != compile_failed:  # a compiler failure: said once
                    say(f"      {title} at {n} seeds: unavailable ({reason})")
            reason = row.get("torch_ensemble_compiled_unavailable")
            if reason and reason != "out of device memory":  # torch.compile: not tried again
                compile_failed = reason
            save(report)
        if rows:
            xla = rows[0]["xla_flops_per_seed_step"]
            say(f"model FLOPs per seed-step: {rows[0]['model_flops_per_seed_step'] / 1e9:.3f} G "
                "counted (matmuls x 3); XLA cost analysis: "
                + ("n/a" if xla is None else f"{xla / 1e9:.3f} G (all ops)"))

        say("\nProxies:", flush=True)
        try:
            with timing.stage("proxies"):
                pf = proxies.bench_fit_and_evaluate(config, proxy_seeds, repeats)
        except jax.errors.JaxRuntimeError as e:
            _reraise_unless_out_of_memory(e)
            say(f"  SVD fit and evaluation of {proxy_seeds} seeds: out of device memory (lower "
                "--proxy_batch_size or --proxy_seeds)")
            report["proxy_fit_and_evaluate"] = {"num_seeds": proxy_seeds,
                                                "error": "out of memory"}
        else:
            for stage in ("fit", "evaluate"):
                pf[f"{stage}_compiles"], pf[f"{stage}_compile_s"] = clock.compiles[
                    f"proxy {stage}"]
            report["proxy_fit_and_evaluate"] = pf
            say(f"  SVD of {pf['site']}, ranks {pf['rank_list']}, {pf['num_seeds']} seeds: fit "
                f"{pf['fit_s']:.2f} s ({pf['fit_seed_ranks_per_s']:.0f} seed-ranks/s, "
                f"{pf['fit_sentences']} training sentences; compiled "
                f"{_compiled(pf['fit_compiles'], pf['fit_compile_s'])}), evaluate "
                f"{pf['evaluate_s']:.2f} s ({pf['evaluate_seed_ranks_per_s']:.0f} seed-ranks/s, "
                f"{pf['eval_sentences']} sentences; compiled "
                f"{_compiled(pf['evaluate_compiles'], pf['evaluate_compile_s'])})")
            say(f"  evaluation throughput, seed x rank x sentence per s: "
                f"{pf['evaluate_seed_rank_sentences_per_s']:.0f} with each rank's pass from "
                f"the replaced block vs {pf['evaluate_whole_passes_seed_rank_sentences_per_s']:.0f}"
                f" with whole passes per rank ({pf['prefix_sharing_speedup']:.2f}x)")
        save(report)
        if with_kmeans:
            try:
                with timing.stage("kmeans"):
                    km = proxies.bench_kmeans(repeats=repeats)
            except ImportError as e:
                say(f"  k-means vs scikit-learn: skipped ({e})")
            else:
                km["compiles"], km["compile_s"] = clock.compiles["kmeans"]
                report["kmeans"] = km
                say(f"  k-means, {km['num_seeds']} seeds x k in {km['sizes']}, "
                    f"{km['num_points']} points, {km['num_iters']} iterations: batched JAX "
                    f"{km['jax_batched_s']:.2f} s vs scikit-learn loop {km['sklearn_loop_s']:.2f}"
                    f" s ({km['speedup']:.1f}x; compiled "
                    f"{_compiled(km['compiles'], km['compile_s'])})")
        if with_sae:
            fits = report["sae"] = _timed("sae", clock, lambda: proxies.bench_sae(
                **{"repeats": repeats, **(sae_options or {})}))
            say(f"  SAE fit, {fits['num_seeds']} seeds x widths {fits['widths']} (d {fits['dim']}"
                f", k {fits['k']}, {fits['steps']} steps of {fits['batch_size']}): one program "
                f"{fits['batched_s']:.2f} s vs JAX loop over (seed, width) {fits['loop_s']:.2f} s"
                f" ({fits['loop_over_batched']:.2f}x, the program doing {fits['padded_work']:.2f}x"
                f" the latent work: widths padded; fits equal to {fits['max_abs_diff']:.1e}; "
                f"compiled {_compiled(fits['compiles'], fits['compile_s'])})", flush=True)
            save(report)
        if circuit_options is not False:
            found = report["circuits"] = _timed("circuits", clock, lambda: proxies.bench_circuits(
                config, **{"repeats": repeats, **(circuit_options or {})}))
            say(f"  circuit discovery, {found['num_seeds']} seeds x {found['units']} "
                f"{found['granularity']}s, {found['sentences']} sentences: one program "
                f"{found['batched_s']:.2f} s vs JAX loop over seeds {found['loop_s']:.2f} s "
                f"({found['loop_over_batched']:.2f}x; scores equal to "
                f"{found['max_rel_diff']:.1e} relative; compiled "
                f"{_compiled(found['compiles'], found['compile_s'])})", flush=True)
            save(report)
        report["peak_memory"] = training.peak_memory_bytes()
        report["seconds"] = time.perf_counter() - start
        report["compilation"] = {"count": clock.compile_count, "seconds": clock.compile_seconds}
        say(f"\npeak memory ({report['peak_memory']['kind']}): "
            f"{report['peak_memory']['bytes'] / 2**20:.0f} MiB; benchmark took "
            f"{report['seconds']:.0f} s, of which compilation {clock.compile_seconds:.1f} s "
            f"({clock.compile_count} XLA programs)")
        return report


# The training table: (title, row key, format, width); a rate or ratio beyond loop_max_seeds
# is the loop's last rate's ratio, in parentheses; "n/a": a contender that could not run.
_COLUMNS = (("seeds", "num_seeds", "d", 5),
            ("sweep", "sweep_seed_steps_per_s", ".0f", 7),
            ("JAX loop", "jax_loop_seed_steps_per_s", ".0f", 8),
            ("PyTorch loop", "torch_loop_seed_steps_per_s", ".0f", 12),
            ("PT ensemble", "torch_ensemble_seed_steps_per_s", ".0f", 11),
            ("PT ens.+compile", "torch_ensemble_compiled_seed_steps_per_s", ".0f", 15),
            ("sweep/JAX", "sweep_over_jax_loop", ".2f", 9),
            ("sweep/PyTorch", "sweep_over_torch_loop", ".2f", 13),
            ("sweep/PT ens.", "sweep_over_torch_ensemble", ".2f", 13),
            ("sweep/PT ens.+c", "sweep_over_torch_ensemble_compiled", ".2f", 15),
            ("MFU", "sweep_mfu", ".1%", 6),
            ("bf16 sweep", "sweep_bf16_seed_steps_per_s", ".0f", 10),
            ("bf16 MFU", "sweep_bf16_mfu", ".1%", 8))


def _table_row(row: dict) -> str:
    """One line of the training table (_COLUMNS, then the row's XLA compilations)."""
    def cell(key, spec):
        if key in row:
            return format(row[key], spec)
        if key + "_rate" in row:
            return f"({row[key + '_rate']:{spec}})"
        for name in training.TORCH:  # a rate of it, or the sweep's ratio to it
            if key in (f"{name}_seed_steps_per_s", f"sweep_over_{name}"):
                return "n/a" if f"{name}_unavailable" in row else "-"
        return "-"

    return " | ".join(f"{cell(key, spec):>{width}}" for _, key, spec, width in _COLUMNS) + (
        f" | {_compiled(row['compiles'], row['compile_s']):>13}")


def _timed(name: str, clock, bench) -> dict:
    """bench()'s report, timed as stage `name`, with its XLA compilations (count, seconds)."""
    with timing.stage(name):
        out = bench()
    out["compiles"], out["compile_s"] = clock.compiles[name]
    return out


def _compiled(count: int, seconds: float) -> str:
    """'3 in 4.2 s': XLA compilations of a stage and their seconds."""
    return f"{count} in {seconds:.1f} s"
