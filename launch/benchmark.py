"""Speed, measured side by side in one run: prints a table and writes the figures to JSON.

    python -m launch.benchmark --out=runs/benchmark.json   # reference model, 1/8/32 seeds
    python -m launch.benchmark --bfloat16                    # + the bf16 sweep
    python -m launch.benchmark --seeds=1,8,32,128,256        # more seeds (GPU)
    python -m launch.benchmark --config=configs/dyck.py      # the paper config's model

Training seed-steps/s of the sweep (train.train_steps, all seeds in one call) against a JAX loop
over seeds and, with the `bench` extra installed, a PyTorch loop over seeds of the same model and
optimizer (benchmarks/torch_loop.py); model FLOP utilization against a large matmul timed in the
same run; proxy fitting and evaluation throughput; peak memory. The defaults took 2 min 50 s on
the 2-core CPU machine (per-seed loops up to 8 seeds; README "Speed" has the table).
"""

from __future__ import annotations

import argparse
import json
import os

from benchmarks import suite


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default=None,
                        help="config file (default: the reference model, benchmarks/reference.py)")
    parser.add_argument("--compute_dtype", default=None, choices=("float32", "bfloat16"),
                        help="override config.model.compute_dtype")
    parser.add_argument("--seeds", default="1,8,32", help="seed counts, comma-separated")
    parser.add_argument("--steps", type=int, default=20, help="training steps per timed call")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls (best is kept)")
    parser.add_argument("--loop_max_seeds", type=int, default=8,
                        help="time the per-seed loops only up to this many seeds")
    parser.add_argument("--proxy_seeds", type=int, default=8, help="seeds of the proxy benchmark")
    parser.add_argument("--proxy_batch_size", type=int, default=None,
                        help="override config.proxies.collect_batch_size and eval_batch_size "
                             "(sentences per call, all seeds at once: lower it for many seeds)")
    parser.add_argument("--bfloat16", action="store_true",
                        help="also time the sweep with model.compute_dtype=bfloat16")
    parser.add_argument("--no_torch", action="store_true", help="skip the PyTorch loop")
    parser.add_argument("--no_kmeans", action="store_true", help="skip k-means vs scikit-learn")
    parser.add_argument("--out", default="runs/benchmark.json", help="JSON output path")
    args = parser.parse_args()
    config = suite.load_config(args.config, args.compute_dtype)
    if args.proxy_batch_size:
        config.proxies.collect_batch_size = config.proxies.eval_batch_size = args.proxy_batch_size
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)

    def save(report: dict) -> None:  # after every row: a stopped run keeps what it measured
        with open(args.out + ".tmp", "w") as f:
            json.dump({**report, "args": vars(args)}, f, indent=2)
        os.replace(args.out + ".tmp", args.out)

    report = suite.run(config, seed_counts=[int(s) for s in args.seeds.split(",")],
                       steps=args.steps, repeats=args.repeats,
                       loop_max_seeds=args.loop_max_seeds, proxy_seeds=args.proxy_seeds,
                       with_torch=not args.no_torch, with_kmeans=not args.no_kmeans,
                       bfloat16=args.bfloat16, save=save)
    save(report)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
