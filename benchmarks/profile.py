"""Where the training step's time goes, from a jax.profiler trace of train_steps:

    python -m benchmarks.profile --seeds=8          # the reference model (benchmarks/reference.py)

The step is the one `jaxillusions benchmark` times: one sentence per row, as its PyTorch peers
train, also for a config that packs its batches (train.rows_per_sentence), whose own step does
less work per seed. Each XLA thunk of the compiled step is timed by the profiler; thunks are
grouped by what their fused computation does: matmul (contains a dot), transpose/copy,
reduction, or elementwise, and by the JAX operation they come from (forward, backward).
Per-thunk times are summed over the threads that ran them, so shares are of the summed thunk
time, not of wall time.
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import re
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import suite, training
from jaxillusions.config import settings
from jaxillusions.pipeline import validate
from jaxillusions.training import train
from jaxillusions.training.step import init_state, train_steps


def _fusion_kinds(hlo: str) -> dict[str, tuple[str, str]]:
    """{instruction name: (kind, jax op name)} for every instruction of the compiled module."""
    computations, current = {}, None
    for line in hlo.splitlines():
        header = re.match(r"^(?:ENTRY )?%([\w.\-]+) .*\{$", line)
        if header:
            current = computations.setdefault(header.group(1), [])
        elif current is not None:
            current.append(line)
    kinds = {}
    for line in hlo.splitlines():
        m = re.match(r"\s*(?:ROOT )?%([\w.\-]+) = \S+ (\w[\w-]*)\(", line)
        if not m:
            continue
        name, op = m.groups()
        called = re.search(r"calls=%([\w.\-]+)", line)
        body = "\n".join(computations.get(called.group(1), [])) if called else line
        if " dot(" in body or " convolution(" in body:
            kind = "matmul"
        elif " reduce(" in body:
            kind = "reduction"
        elif name.startswith(("copy", "transpose")) or op in ("copy", "transpose"):
            kind = "transpose/copy"
        else:
            kind = "elementwise"
        source = re.search(r'op_name="([^"]+)"', line)
        phase = "backward" if source and "transpose(" in source.group(1) else "forward/other"
        kinds[name] = (kind, phase)
    return kinds


def profile(config: settings.Settings, num_seeds: int, steps: int = 10) -> dict:
    splits, model_cfg, tx = train.build(config)
    tokens = jnp.asarray(splits["train"].tokens)
    run = dict(num_steps=steps, model_cfg=model_cfg, tx=tx, batch_size=config.train.batch_size,
               objective=training.peers_objective(config))
    state = init_state(np.arange(num_seeds), model_cfg, tx)
    hlo = train_steps.lower(state, tokens, **run).compile().as_text()
    jax.block_until_ready(train_steps(jax.tree.map(jnp.copy, state), tokens, **run))
    with tempfile.TemporaryDirectory() as logdir:
        with jax.profiler.trace(logdir, create_perfetto_trace=True):
            start = time.perf_counter()
            jax.block_until_ready(train_steps(state, tokens, **run))
            wall = time.perf_counter() - start
        (path,) = glob.glob(f"{logdir}/**/*.trace.json.gz", recursive=True)
        with gzip.open(path) as f:
            trace = json.load(f)["traceEvents"]
    # On a GPU the kernels run on the device's own tracks (named /device:GPU:N), each event
    # naming the HLO instruction it runs in args.hlo_op; on CPU the thunks are named directly.
    devices = {e["pid"] for e in trace if e.get("ph") == "M" and e.get("name") == "process_name"
               and "/device:" in str(e.get("args", {}).get("name", ""))}
    kinds = _fusion_kinds(hlo)
    total, by_op = collections.Counter(), collections.Counter()
    for e in trace:
        if e.get("ph") != "X" or (devices and e.get("pid") not in devices):
            continue
        op = e.get("args", {}).get("hlo_op", e["name"])
        if op in kinds:
            total[kinds[op]] += e["dur"]
            by_op[f"{op} [{kinds[op][0]}]"] += e["dur"]
        elif devices:  # a device kernel not named after its HLO instruction
            total[("unmatched kernel", "-")] += e["dur"]
            by_op[f"{e['name'][:90]} [kernel]"] += e["dur"]
    summed = sum(total.values())
    return {"num_seeds": num_seeds, "steps": steps, "thunk_ms_per_step": summed / 1e3 / steps,
            "wall_ms_per_step": wall * 1e3 / steps,
            "shares": {f"{k} ({p})": v / summed for (k, p), v in total.most_common()},
            "top_ops": {k: v / summed for k, v in by_op.most_common(15)}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default=None)
    parser.add_argument("--seeds", type=int, default=8)
    args = parser.parse_args()
    if args.seeds < 1:
        parser.error(f"--seeds={args.seeds}: must be >= 1")
    try:
        config, _ = validate.check(suite.load_config(args.config))
    except ValueError as err:  # an unknown config, a bad key: one line
        parser.exit(2, f"error: {str(err).splitlines()[0]}\n")
    out = profile(config, args.seeds)
    print(f"{out['num_seeds']} seeds: {out['thunk_ms_per_step']:.1f} ms of thunk time per step "
          f"(summed over threads; kernel time on a GPU), {out['wall_ms_per_step']:.1f} ms wall "
          "(traced)")
    for name, share in out["shares"].items():
        print(f"  {share:6.1%}  {name}")
    print("largest ops:")
    for name, share in out["top_ops"].items():
        print(f"  {share:6.1%}  {name}")


if __name__ == "__main__":
    main()
