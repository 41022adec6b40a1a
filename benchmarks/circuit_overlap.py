"""Overlap of the circuits found on another split with those found on train, for a finished
run's circuit families, without the fit-shift stage's evaluation of every proxy:

    python -m benchmarks.circuit_overlap runs/dyck_population unseen_depth

Refits each circuit family of the run (its stage files, proxies/*_circuit_*.msgpack, hold the
train fits) on the split's fit half (fit_shift.fit_data, the half the fit-shift stage fits on),
batched over seeds, and prints studies/circuits.py's overlap rows: Jaccard of the two circuits
per seed, mean over seeds with a 95% interval, at every size strictly between 0 and every unit,
beside the overlap between seeds of the train fits.
"""

from __future__ import annotations

import argparse
import glob
import os

import jax
from flax import serialization

from jaxillusions.faithfulness.collect import collect
from jaxillusions.faithfulness.fit import fit_one
from jaxillusions.faithfulness.specs import specs_from_config
from jaxillusions.report import load_run
from jaxillusions.studies import circuits, fit_shift


def overlap(workdir: str, split: str) -> list[dict]:
    run = load_run(workdir)
    pc = run.config.proxies
    specs = specs_from_config(pc, run.model_config)
    data = fit_shift.fit_data(run.splits, split, run.config)
    out = []
    for index, spec in enumerate(specs):
        if spec.method != circuits.METHOD:
            continue
        (path,) = glob.glob(os.path.join(workdir, "proxies", f"{index:02d}_circuit_*.msgpack"))
        with open(path, "rb") as f:
            train_fit = serialization.msgpack_restore(f.read())["value"]
        stats = collect(run.params, data, run.model_config, [spec], num_samples=0,
                        batch_size=pc.collect_batch_size)
        refit = fit_one(spec, index, stats, jax.random.PRNGKey(run.config.seed),
                        len(run.seeds))
        out += circuits.overlap_rows(spec, train_fit, {split: refit.params}, run.model_config,
                                     run.healthy)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("workdir")
    parser.add_argument("split")
    args = parser.parse_args()
    rows = overlap(args.workdir, args.split)
    print(f"{'site':28} {'size':>5} {'between':>18} {'Jaccard [95% CI]':>26} {'seeds':>5}")
    for r in rows:
        print(f"{r['site']:28} {r['size']:5d} {r['between']:>18} {r['mean']:8.3f} "
              f"[{r['ci_low']:.3f}, {r['ci_high']:.3f}] {r['n_seeds']:5d}")


if __name__ == "__main__":
    main()
