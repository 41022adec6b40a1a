"""The training step's matmuls one at a time, JAX against PyTorch, side by side:

    python -m benchmarks.matmuls                  # the reference model, 4 seeds per group
    taskset -c 0 python -m benchmarks.matmuls     # the same on one core

Each row is one einsum of the reference model's training step (benchmarks/reference.py) as
vmap batches it over a group of seeds (`step.train_steps` runs 8 seeds on one CPU device as 2
groups of 4): the weight matmuls of the forward pass, their two backward forms (the input
gradient contracts the weight's output axis, the weight gradient the seed's 2,048 positions),
and the attention's per-sentence products. It runs alone, as jit of the einsum, and as
torch.einsum on the same arrays (torch's default threads), best of `--repeats` rounds of
`--calls` calls, the two interleaved (training.best_times); GFLOP/s and their ratio. What it
shows, and what the step does with the same shapes, is in docs/speed.md (Why one device trails
the compiled ensemble).
"""

from __future__ import annotations

import argparse
import functools

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import reference
from benchmarks.training import best_times


def shapes(seeds: int, d: int, f: int, e: int, batch: int, seq: int) -> list[tuple]:
    """(name, einsum, lhs shape, rhs shape) of the step's matmuls for `seeds` seeds."""
    n = batch * seq
    s, b = seeds, seeds * batch
    return [
        ("MLP in, forward", "sij,sjk->sik", (s, n, d), (s, d, f)),
        ("MLP out, forward", "sij,sjk->sik", (s, n, f), (s, f, d)),
        ("MLP in, input gradient", "sij,skj->sik", (s, n, f), (s, d, f)),
        ("MLP in, weight gradient", "sji,sjk->sik", (s, n, d), (s, n, f)),
        ("q/k/v, weight gradient", "sji,sjk->sik", (s, n, d), (s, n, e)),
        ("attention scores (q k^T)", "bij,bkj->bik", (b, seq, e), (b, seq, e)),
        ("attention pattern @ v", "bij,bjk->bik", (b, seq, seq), (b, seq, e)),
    ]


def flops(spec: str, lhs: tuple, rhs: tuple) -> float:
    sizes = dict(zip(spec.split("->")[0].replace(",", ""), (*lhs, *rhs), strict=True))
    return 2.0 * float(np.prod(list(sizes.values())))


def run(rows: list[tuple], calls: int, repeats: int) -> list[dict]:
    """Times each row in JAX and torch; a dict per row (GFLOP/s of each, ratio JAX / torch)."""
    import torch  # the `bench` extra

    def repeated(fn, *args):  # one sample: `calls` calls, waiting for the last (JAX's queue)
        return lambda: [fn(*args) for _ in range(calls)][-1]

    rng = np.random.default_rng(0)
    out = []
    for name, spec, lhs, rhs in rows:
        a = rng.standard_normal(lhs, dtype=np.float32)
        b = rng.standard_normal(rhs, dtype=np.float32)
        jitted = jax.jit(functools.partial(jnp.einsum, spec))
        ja, jb, ta, tb = jnp.asarray(a), jnp.asarray(b), torch.from_numpy(a), torch.from_numpy(b)
        jax.block_until_ready(jitted(ja, jb))  # compiled before it is timed
        seconds = best_times({"jax": repeated(jitted, ja, jb),
                              "torch": repeated(torch.einsum, spec, ta, tb)}, repeats)
        gf = flops(spec, lhs, rhs) * calls / 1e9
        out.append(dict(name=name, einsum=spec, lhs=lhs, rhs=rhs,
                        jax_gflops=gf / seconds["jax"], torch_gflops=gf / seconds["torch"],
                        ratio=seconds["torch"] / seconds["jax"]))
    return out


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=4, help="seeds per group (default 4)")
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    if min(args.seeds, args.calls, args.repeats) < 1:
        parser.error("--seeds, --calls and --repeats must be at least 1")
    import torch

    config = reference.get_config()
    m, seq = config.model, config.data.max_len + 1  # input tokens: BOS + max_len brackets
    rows = run(shapes(args.seeds, m.d_model, m.d_mlp, m.d_head or m.d_model // m.n_heads,
                      config.train.batch_size, seq), args.calls, args.repeats)
    print(f"{args.seeds} seeds per group; jax {jax.__version__} ({jax.devices()[0].platform}), "
          f"torch {torch.__version__} ({torch.get_num_threads()} threads); GFLOP/s, best of "
          f"{args.repeats} x {args.calls} calls")
    print(f"{'matmul':28s} {'einsum':14s} {'JAX':>7s} {'torch':>7s} {'JAX/torch':>9s}")
    for r in rows:
        print(f"{r['name']:28s} {r['einsum']:14s} {r['jax_gflops']:7.1f} "
              f"{r['torch_gflops']:7.1f} {r['ratio']:9.2f}")
    return rows


if __name__ == "__main__":
    main()
