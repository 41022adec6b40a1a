"""Speed, measured side by side in one run: prints a table and writes the figures to JSON.

    jaxillusions benchmark --out=runs/benchmark.json   # reference model, 1/8/32 seeds
    jaxillusions benchmark --bfloat16                    # + the bf16 sweep
    jaxillusions benchmark --seeds=1,8,32,128,256        # more seeds (GPU)
    jaxillusions benchmark --config=dyck                 # the paper config's model

It needs a clone of the repository: the benchmarks live in its benchmarks/ folder, which the
package does not ship (run it from the clone's root, or from an editable install of the clone).

Training seed-steps/s of the sweep (train_steps, all seeds in one call) against a JAX loop
over seeds and, with the `bench` extra installed, the PyTorch peers of the same model, optimizer
and batches (benchmarks/torch_loop.py): a loop over seeds, and all seeds as one torch.func
ensemble (vmap of grad over the stacked parameters), eager and through torch.compile, at every
seed count; the table puts their rates side by side with the sweep's ratio to each, under a
header naming the CPU model (lscpu). Model FLOP utilization against a large matmul timed in the
same run; proxy fitting and evaluation throughput; SAE fitting of 32 seeds x 4 widths in one
program against a JAX loop over (seed, width); circuit discovery (attribution patching) of 32
seeds in one program against a JAX loop over seeds; peak memory. The defaults took 2 min 50 s on
the 2-core CPU machine before the SAE row (per-seed loops up to 8 seeds; README "Speed" has the
table); the SAE row alone took about 10 min there (shared machine; --no_sae skips it).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

from jaxillusions import configs

NEEDS_CLONE = ("error: jaxillusions benchmark needs a clone of the repository: its benchmarks/ "
               "folder is not installed with the package (run it from the clone's root, or "
               "pip install -e the clone)")


def load_suite():
    """benchmarks.suite of a clone of the repository: importable as it is (`python -m` from the
    clone's root), or found in the working directory or beside the package of an editable
    install; a one-line exit (NEEDS_CLONE) where there is none (a wheel's install)."""
    import importlib  # noqa: PLC0415

    try:
        return importlib.import_module("benchmarks.suite")
    except ModuleNotFoundError as err:
        if err.name not in ("benchmarks", "benchmarks.suite"):
            raise
    here = os.path.dirname(os.path.abspath(__file__))
    for root in dict.fromkeys((os.getcwd(), os.path.dirname(os.path.dirname(here)))):
        if os.path.isfile(os.path.join(root, "benchmarks", "suite.py")):
            sys.path.insert(0, root)
            importlib.invalidate_caches()
            return importlib.import_module("benchmarks.suite")
    sys.exit(NEEDS_CLONE)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, as the other launchers
        sys.exit(f"error: {message} (jaxillusions benchmark --help)")


def _saved(out: str) -> str:
    """The end of a stopped or failed run's line: where the rows measured so far are."""
    return f"; what was measured is in {out}" if os.path.exists(out) else ""


def _stop_handler(out: str):
    """SIGTERM and SIGINT end the run at once (interrupt.exit_now): the row in progress is lost,
    the rows before it are in `out` (written after every row)."""
    from jaxillusions.runtime import interrupt  # noqa: PLC0415

    def stop(signum, frame):
        del frame
        interrupt.exit_now(128 + signum, f"stopped by {signal.Signals(signum).name}"
                                         f"{_saved(out)}")

    return stop


def _checked(args, suite) -> tuple[list[int], object]:
    """(seed counts, config), or a one-line exit for the first bad argument: before any work."""
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        seeds = []
    if not seeds or min(seeds) < 1:
        sys.exit(f"error: --seeds={args.seeds}: expected positive integers separated by commas")
    if len(set(seeds)) < len(seeds):  # (a row per seed count: one timing each)
        sys.exit(f"error: --seeds={args.seeds}: each seed count once")
    for name, low in (("steps", 1), ("repeats", 1), ("loop_max_seeds", 0), ("proxy_seeds", 1),
                      ("proxy_batch_size", 1)):
        value = getattr(args, name)
        if value is not None and value < low:
            sys.exit(f"error: --{name}={value}: must be >= {low}")
    if not args.out or os.path.isdir(args.out):
        sys.exit(f"error: --out={args.out} is {'a directory' if args.out else 'empty'}; give "
                 "the JSON file to write")
    above = os.path.dirname(os.path.abspath(args.out))
    while not os.path.exists(above):
        above = os.path.dirname(above)
    if not os.path.isdir(above):
        sys.exit(f"error: --out={args.out}: {above} is a file, not a folder")
    if args.config is not None:  # a shipped config's name or a file: before JAX starts
        try:
            configs.locate(args.config)
        except ValueError as err:
            sys.exit(f"error: {err}")
    from jaxillusions.pipeline import validate  # noqa: PLC0415

    try:
        config = suite.load_config(args.config, args.compute_dtype)
        if args.proxy_batch_size:
            config.proxies.collect_batch_size = args.proxy_batch_size
            config.proxies.eval_batch_size = args.proxy_batch_size
        config, notes = validate.check(config)  # the benchmarks read typed settings
        for note in notes:
            print(note)
    except Exception as err:  # noqa: BLE001 - a missing or bad config file is one line
        from jaxillusions.runtime import checkpoint  # noqa: PLC0415

        sys.exit(f"error: config {args.config or 'benchmarks/reference.py'}: "
                 f"{checkpoint.error_line(err)}")
    return seeds, config


def _keep_earlier(path: str) -> None:
    """An earlier report at `path` is renamed after its time, never overwritten."""
    if os.path.exists(path):
        stem, ext = os.path.splitext(path)
        stem = f"{stem}.{time.strftime('%Y%m%dT%H%M%S', time.localtime(os.path.getmtime(path)))}"
        kept, n = stem + ext, 0
        while os.path.exists(kept):  # never over an earlier kept report
            n += 1
            kept = f"{stem}.{n}{ext}"
        os.replace(path, kept)
        print(f"note: the earlier report {path} is kept as {kept}")


def main() -> None:
    parser = _Parser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default=None,
                        help="a shipped config's name or a config file (default: the "
                             "reference model, benchmarks/reference.py)")
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
    parser.add_argument("--no_torch", action="store_true",
                        help="skip the PyTorch loop and ensembles")
    parser.add_argument("--no_torch_compile", action="store_true",
                        help="skip the torch.compile'd PyTorch ensemble (its compilation takes "
                             "a minute or more per seed count on a CPU)")
    parser.add_argument("--no_kmeans", action="store_true", help="skip k-means vs scikit-learn")
    parser.add_argument("--no_sae", action="store_true",
                        help="skip SAE fitting (32 seeds x 4 widths, one program vs a loop)")
    parser.add_argument("--no_circuits", action="store_true",
                        help="skip circuit discovery (32 seeds, one program vs a loop)")
    parser.add_argument("--out", default="runs/benchmark.json", type=os.path.expanduser,
                        help="JSON output path (an earlier file there is renamed, not replaced)")
    parser.add_argument("--debug", action="store_true", help="tracebacks instead of one line")
    args = parser.parse_args()
    suite = load_suite()
    seeds, config = _checked(args, suite)
    from jaxillusions.runtime import checkpoint  # noqa: PLC0415

    def save(report: dict) -> None:  # after every row: a stopped run keeps what it measured
        checkpoint.write_atomic(args.out, json.dumps({**report, "args": vars(args)}, indent=2))

    try:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        _keep_earlier(args.out)
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, _stop_handler(args.out))
        report = suite.run(config, seed_counts=seeds, steps=args.steps, repeats=args.repeats,
                           loop_max_seeds=args.loop_max_seeds, proxy_seeds=args.proxy_seeds,
                           with_torch=not args.no_torch, with_kmeans=not args.no_kmeans,
                           bfloat16=args.bfloat16, with_sae=not args.no_sae, save=save,
                           with_torch_compile=not args.no_torch_compile,
                           circuit_options=False if args.no_circuits else None)
        save(report)
    except Exception as err:
        if args.debug:
            raise
        sys.exit(f"error: {checkpoint.root_cause(err)}{_saved(args.out)} (--debug shows the "
                 "traceback)")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
