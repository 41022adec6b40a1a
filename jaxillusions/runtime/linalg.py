"""The package's LAPACK calls (eigh, svd, solve), one matrix per call, so that no program hangs.

jaxlib 0.10's CPU LAPACK kernels split a batch of matrices into chunks on XLA's intra-op thread
pool and block until the chunks are done (`ParallelBatchMap`). The kernel itself runs on a
thread of that pool; when as many batched calls are running as the pool has threads (2 on a
2-core machine: two CPU devices running the same fit, or two independent calls of one
program), every thread waits for chunks queued behind the others, and the process hangs with
no CPU in use. A batch is split only above about 2e5 FLOP of work, so small runs pass and real
ones hang, on whichever CPU model the timing allows. jax 0.11 no longer splits in its public
builds; until it can be required, every call here reaches LAPACK with one matrix, which the
kernel runs inline: a batch (leading axes, or the axes `jax.vmap` adds) becomes a sequential
`lax.map` over single matrices. LAPACK computes each matrix alone either way, so the results
are the same bits; the cost is that a batch no longer uses the pool's threads, which the
fits barely notice (docs/reliability.md, No hang).

tests/test_lapack.py lowers every program of a sweep that uses these and checks that each
LAPACK custom call has one matrix, and that no module calls jnp.linalg or jax.scipy.linalg's
decompositions directly.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


def _one_matrix_at_a_time(fn, core: int):
    """fn on arguments whose last `core` axes are one problem -> the same function, run by
    LAPACK one problem at a time however it is batched (leading axes or vmap)."""

    @jax.custom_batching.custom_vmap
    def call(*args):
        batch = args[0].shape[:args[0].ndim - core]
        if not batch:
            return fn(*args)
        flat = [a.reshape(-1, *a.shape[a.ndim - core:]) for a in args]
        out = jax.lax.map(lambda xs: call(*xs), flat)
        return jax.tree.map(lambda o: o.reshape(*batch, *o.shape[1:]), out)

    @call.def_vmap
    def _rule(axis_size, in_batched, *args):
        args = [a if b else jnp.broadcast_to(a, (axis_size, *a.shape))
                for a, b in zip(args, in_batched, strict=True)]
        out = jax.lax.map(lambda xs: call(*xs), args)
        return out, jax.tree.map(lambda _: True, out)

    return call


@functools.cache
def _eigh():
    return _one_matrix_at_a_time(jnp.linalg.eigh, core=2)


@functools.cache
def _svd(full_matrices: bool, compute_uv: bool):
    return _one_matrix_at_a_time(functools.partial(
        jnp.linalg.svd, full_matrices=full_matrices, compute_uv=compute_uv), core=2)


@functools.cache
def _solve():
    return _one_matrix_at_a_time(jnp.linalg.solve, core=2)


def eigh(a: jax.Array):
    """jnp.linalg.eigh of symmetric a [..., F, F]: (eigenvalues ascending [..., F], vectors)."""
    return tuple(_eigh()(a))


def svd(a: jax.Array, *, full_matrices: bool = True, compute_uv: bool = True):
    """jnp.linalg.svd of a [..., M, N]: (u, s, vt), or s alone without compute_uv."""
    out = _svd(full_matrices, compute_uv)(a)
    return tuple(out) if compute_uv else out


def solve(a: jax.Array, b: jax.Array) -> jax.Array:
    """jnp.linalg.solve of a [..., F, F] and b [..., F, K] (a matrix right-hand side)."""
    return _solve()(a, b)
