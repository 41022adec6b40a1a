"""Speed, measured side by side in one run; prints a table and writes the figures to JSON.

    python -m launch.benchmark --out=runs/benchmark.json            # ~5 min on the 2-core CPU
    python -m launch.benchmark --quick                             # smaller, ~1 min

1. Training throughput (seed-steps/s) for 1, 8 and 32 seeds: the sweep step (train.train_steps)
   vs a Python loop over the seeds, each running the same jitted single-seed step, and vs the
   naive sweep that vmaps even a single seed (XLA:CPU runs the batched ops of a size-1 vmap ~25%
   slower than the plain step, which is why train_steps skips vmap for one seed). All run
   `steps` steps per call as a lax.scan; compilation excluded.
2. Dyck data generation time for the paper-size set (configs/dyck.py) and the CPU demo set.
3. Proxies: batched k-means over seeds and k vs scikit-learn KMeans (same k, n_init=1, same
   iteration count), and the batched rank sweep vs a loop over ranks.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import platform
import time

import jax
import numpy as np

from configs import dyck as dyck_config
from configs import dyck_small
from jaxillusions import faithfulness, train
from jaxillusions.data import dyck
from jaxillusions.proxies import bench as proxy_bench


def _best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return min(times)


@functools.partial(jax.jit, static_argnames=("num_steps", "model_cfg", "tx", "batch_size"))
def _single_seed_steps(state, tokens, *, num_steps, model_cfg, tx, batch_size):
    step = functools.partial(train.seed_step, model_cfg=model_cfg, tx=tx, batch_size=batch_size)
    return jax.lax.scan(lambda s, _: step(s, tokens), state, None, length=num_steps)


@functools.partial(jax.jit, static_argnames=("num_steps", "model_cfg", "tx", "batch_size"))
def _naive_vmapped_steps(state, tokens, *, num_steps, model_cfg, tx, batch_size):
    step = jax.vmap(functools.partial(train.seed_step, model_cfg=model_cfg, tx=tx,
                                      batch_size=batch_size), in_axes=(0, None))
    return jax.lax.scan(lambda s, _: step(s, tokens), state, None, length=num_steps)


def bench_training(config, seed_counts, steps: int, repeats: int) -> list[dict]:
    splits, model_cfg, tx = train.build(config)
    tokens = jax.numpy.asarray(splits["train"].tokens)
    results = []
    for num_seeds in seed_counts:
        row = _training_row(num_seeds, tokens, model_cfg, tx, config.train.batch_size, steps,
                            repeats)
        print(f"  {num_seeds:>3} seeds: sweep {row['sweep_seed_steps_per_s']:6.0f} | "
              f"naive vmap {row['naive_vmap_seed_steps_per_s']:6.0f} | "
              f"loop {row['loop_seed_steps_per_s']:6.0f} seed-steps/s | "
              f"sweep/loop {row['sweep_over_loop']:.2f}, naive/loop "
              f"{row['naive_vmap_over_loop']:.2f}", flush=True)
        results.append(row)
    return results


def _training_row(num_seeds, tokens, model_cfg, tx, batch_size, steps, repeats) -> dict:
    run = dict(num_steps=steps, model_cfg=model_cfg, tx=tx, batch_size=batch_size)
    state = train.init_state(np.arange(num_seeds), model_cfg, tx)
    singles = [jax.tree.map(lambda x, i=i: x[i], state) for i in range(num_seeds)]

    def sweep():
        # train_steps donates its input: hand it a fresh copy each call.
        return train.train_steps(jax.tree.map(lambda x: x.copy(), state), tokens, **run)[1]

    def naive():
        return _naive_vmapped_steps(state, tokens, **run)[1]

    def loop():
        return [_single_seed_steps(s, tokens, **run)[1] for s in singles]

    for fn in (sweep, naive, loop):
        jax.block_until_ready(fn())  # compile
    work = num_seeds * steps
    row = {"num_seeds": num_seeds, "steps": steps,
           "sweep_seed_steps_per_s": work / _best(sweep, repeats),
           "naive_vmap_seed_steps_per_s": work / _best(naive, repeats),
           "loop_seed_steps_per_s": work / _best(loop, repeats)}
    row["sweep_over_loop"] = row["sweep_seed_steps_per_s"] / row["loop_seed_steps_per_s"]
    row["naive_vmap_over_loop"] = (row["naive_vmap_seed_steps_per_s"]
                                   / row["loop_seed_steps_per_s"])
    return row


def bench_rank_evaluation(config, num_seeds: int, repeats: int) -> dict:
    """Faithfulness evaluation of an SVD proxy of the keys at every rank: one batched call over
    seeds x ranks (what the sweep does) vs a Python loop over ranks (one rank per call)."""
    splits, model_cfg, tx = train.build(config)
    params = train.init_state(np.arange(num_seeds), model_cfg, tx).params
    site = faithfulness.resolve_site("blocks.-1.attn.k", model_cfg)
    ranks = tuple(range(1, model_cfg.head_dim + 1))
    spec = faithfulness.ProxySpec("svd", (site,), ranks)
    stats = faithfulness.collect(params, splits["train"], model_cfg, [spec], num_samples=0,
                                 batch_size=config.proxies.collect_batch_size)
    (fitted,) = faithfulness.fit([spec], stats, jax.random.PRNGKey(0), num_seeds)
    eval_set = faithfulness.make_eval_set(splits, ["iid"])
    per_rank = [faithfulness.FittedProxy(
        dataclasses.replace(spec, sizes=(r,)),
        jax.tree.map(lambda x, i=i: x[:, :, i:i + 1], fitted.params))
        for i, r in enumerate(ranks)]
    evaluate = functools.partial(faithfulness.evaluate, params, model_cfg, eval_set,
                                 batch_size=config.proxies.eval_batch_size,
                                 seeds=list(range(num_seeds)))
    evaluate([fitted]), evaluate(per_rank[:1])  # compile
    batched_s = _best(lambda: evaluate([fitted]), repeats)
    loop_s = _best(lambda: evaluate(per_rank), repeats)
    return {"num_seeds": num_seeds, "ranks": len(ranks), "sentences": len(eval_set.tokens),
            "batched_s": batched_s, "loop_s": loop_s, "speedup": loop_s / batched_s}


def bench_data(config) -> float:
    start = time.perf_counter()
    dyck.make_splits(config.data)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="runs/benchmark.json", help="JSON output path")
    parser.add_argument("--quick", action="store_true", help="fewer steps and repeats")
    parser.add_argument("--seeds", default="1,8,32", help="seed counts, comma-separated")
    args = parser.parse_args()
    steps, repeats = (20, 2) if args.quick else (50, 3)
    seed_counts = [int(s) for s in args.seeds.split(",")]

    config = dyck_small.get_config()
    model_cfg = config.model
    print(f"jax {jax.__version__} on {jax.device_count()} {jax.default_backend()} device(s); "
          f"model of configs/dyck_small.py: {model_cfg.n_layers} layers, d_model "
          f"{model_cfg.d_model}, batch {config.train.batch_size}, {steps} steps per call")
    print("Training throughput (higher is better):", flush=True)
    report = {"platform": platform.platform(), "backend": jax.default_backend(),
              "device_count": jax.device_count(), "jax": jax.__version__,
              "training": bench_training(config, seed_counts, steps, repeats)}

    print("Data generation:", flush=True)
    report["data_generation_s"] = {"paper_dyck_20_10_200k": bench_data(dyck_config.get_config()),
                                   "cpu_demo": bench_data(config)}
    for name, seconds in report["data_generation_s"].items():
        print(f"  {name}: {seconds:.2f} s")

    print("Proxies:", flush=True)
    km = proxy_bench.bench_kmeans(repeats=1 if args.quick else 3)
    report["kmeans"] = km
    print(f"  k-means, {km['num_seeds']} seeds x k in {list(km['sizes'])}, {km['num_points']} "
          f"points, {km['num_iters']} iterations: batched JAX {km['jax_batched_s']:.2f} s vs "
          f"scikit-learn loop {km['sklearn_loop_s']:.2f} s -> {km['speedup']:.1f}x")
    rs = proxy_bench.bench_rank_sweep(repeats=1 if args.quick else 3)
    report["rank_sweep"] = rs
    print(f"  rank sweep, projection only (1..{rs['dim']}, {rs['num_seeds']} seeds): batched "
          f"{rs['batched_s']:.3f} s vs loop over ranks {rs['loop_s']:.3f} s -> "
          f"{rs['speedup']:.2f}x")
    ev = bench_rank_evaluation(config, num_seeds=4, repeats=1 if args.quick else 3)
    report["rank_sweep_evaluation"] = ev
    print(f"  rank sweep, faithfulness evaluation (ranks 1..{ev['ranks']}, {ev['num_seeds']} "
          f"seeds, {ev['sentences']} sentences): batched {ev['batched_s']:.2f} s vs loop over "
          f"ranks {ev['loop_s']:.2f} s -> {ev['speedup']:.2f}x")

    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
