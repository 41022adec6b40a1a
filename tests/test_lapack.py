"""No program of the package can deadlock XLA:CPU in LAPACK (jaxillusions/runtime/linalg.py).

jaxlib 0.10 splits a batched LAPACK call over the intra-op thread pool and blocks a pool thread
until its chunks are done; enough such calls at once hang the process. A call on one matrix
runs inline. The tests: every LAPACK custom call of every program a sweep compiles (SVD, PCA,
k-means, the lenses, erasure, geometry, fit on other splits, probes; two CPU devices) has one
matrix, and no module reaches LAPACK except through runtime.linalg.
"""

import ast
import os
import pathlib
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import tiny_config_file, xla_flags

from jaxillusions.runtime import linalg

ROOT = pathlib.Path(__file__).resolve().parents[1]

# A custom call line of XLA's optimized HLO text: "%name = (shapes) custom-call(...), ...,
# custom_call_target="lapack_..."".
_CALL = re.compile(r"=\s*(\(?[^=]*?\)?)\s+custom-call\(.*custom_call_target=\"(lapack_\w+)\"")
_SHAPE = re.compile(r"\b([a-z]\w*)\[([\d,]*)\]")


def lapack_calls(hlo_text: str) -> list[tuple[str, list[tuple[str, tuple[int, ...]]]]]:
    """(target, [(dtype, shape) of each result]) of every LAPACK custom call in HLO text."""
    calls = []
    for line in hlo_text.splitlines():
        match = _CALL.search(line)
        if match:
            shapes = [(t, tuple(int(d) for d in dims.split(",") if d))
                      for t, dims in _SHAPE.findall(match.group(1))]
            calls.append((match.group(2), shapes))
    return calls


def one_matrix(shapes: list[tuple[str, tuple[int, ...]]]) -> bool:
    """Whether a LAPACK call's results are those of a single matrix: its first result (the
    factored or decomposed matrix, [..., M, N]) has no batch axis."""
    return len(shapes[0][1]) == 2


def _hlo(fn, *args) -> str:
    return jax.jit(fn).lower(*args).compile().as_text()


def test_the_check_sees_a_batched_call_and_a_single_one():
    # The check can fail: jnp.linalg on a batch is one LAPACK call on the whole batch.
    x = jnp.ones((3, 5, 6, 6))
    batched = lapack_calls(_hlo(jax.vmap(jnp.linalg.eigh), x))
    assert [t for t, _ in batched] == ["lapack_ssyevd_ffi"]
    assert not one_matrix(batched[0][1])
    single = lapack_calls(_hlo(jnp.linalg.eigh, x[0, 0]))
    assert one_matrix(single[0][1])


@pytest.mark.parametrize("name, fn, args", [
    ("eigh", linalg.eigh, (6,)),
    ("svd", lambda a: linalg.svd(a, full_matrices=False), (6, 4)),
    ("singular values", lambda a: linalg.svd(a, compute_uv=False), (4, 6)),
    ("solve", lambda a: linalg.solve(a, a[..., :3]), (6,)),
])
def test_one_matrix_per_call_under_vmap_and_leading_axes_same_bits(name, fn, args):
    rng = np.random.default_rng(0)
    rows, cols = (args[0], args[-1])
    x = rng.normal(size=(3, 2, rows, cols)).astype(np.float32)
    x = x @ np.swapaxes(x, -1, -2) + np.eye(rows, dtype=np.float32) if rows == cols else x
    reference = {"eigh": jnp.linalg.eigh,
                 "svd": lambda a: jnp.linalg.svd(a, full_matrices=False),
                 "singular values": lambda a: jnp.linalg.svd(a, compute_uv=False),
                 "solve": lambda a: jnp.linalg.solve(a, a[..., :3])}[name]
    for wrap in (jax.vmap(jax.vmap(fn)), jax.vmap(fn), fn):  # vmap twice, once, leading axes
        calls = lapack_calls(_hlo(wrap, x))
        assert calls and all(one_matrix(shapes) for _, shapes in calls), calls
    # LAPACK computes each matrix alone either way: the same bits as jnp.linalg's batch.
    ours, theirs = jax.jit(jax.vmap(fn))(x), jax.jit(jax.vmap(reference))(x)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), strict=True):
        np.testing.assert_array_equal(a, b)


_DECOMPOSITIONS = {"svd", "eigh", "eig", "eigvalsh", "eigvals", "solve", "inv", "qr", "cholesky",
                   "lstsq", "pinv", "det", "slogdet", "matrix_rank", "lu", "lu_factor",
                   "cho_solve", "cho_factor", "solve_triangular", "polar", "schur", "expm"}


def _direct_lapack_uses(path: pathlib.Path) -> list[str]:
    """'line name' for every jnp.linalg / jax.scipy.linalg / lax.linalg decomposition that a
    module names (numpy's and scipy's run on the host and are not counted)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr in _DECOMPOSITIONS:
            owner = ast.unparse(node.value)
            if owner in {"jnp.linalg", "jax.numpy.linalg", "jax.scipy.linalg", "jsp.linalg",
                         "lax.linalg", "jax.lax.linalg"}:
                found.append(f"{node.lineno} {owner}.{node.attr}")
        if isinstance(node, ast.ImportFrom) and (node.module or "") in {
                "jax.numpy.linalg", "jax.scipy.linalg", "jax.lax.linalg", "jax._src.lax.linalg"}:
            found.append(f"{node.lineno} from {node.module}")
    return sorted(found, key=lambda u: int(u.split()[0]))


def test_no_module_calls_lapack_except_through_runtime_linalg(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("import jax.numpy as jnp\nfrom jax.scipy.linalg import cho_solve\n"
                       "def f(a):\n    return jnp.linalg.eigh(a), jnp.linalg.norm(a)\n")
    # The check can fail: it finds both planted uses, and not the norm.
    assert _direct_lapack_uses(planted) == ["2 from jax.scipy.linalg", "4 jnp.linalg.eigh"]
    home = ROOT / "jaxillusions" / "runtime" / "linalg.py"
    direct = [f"{path.relative_to(ROOT)}:{use}"
              for path in sorted((ROOT / "jaxillusions").rglob("*.py")) if path != home
              for use in _direct_lapack_uses(path)]
    assert not direct, f"LAPACK called around runtime.linalg (it can deadlock): {direct}"


@pytest.mark.slow
def test_every_lapack_call_of_a_sweep_has_one_matrix(tmp_path, cache_dir):
    """A tiny sweep with every family and study that decomposes a matrix, on two CPU devices,
    its compilation cache off so that every program is compiled and dumped: each program with a
    LAPACK call is listed, and every call has one matrix."""
    dump = tmp_path / "hlo"
    config = tiny_config_file(tmp_path / "config.py", cache_dir, {
        "cpu_devices": 2,
        "stall_seconds": 120,  # a deadlock is an error, not a hang
        "train.num_seeds": 4,
        "proxies.methods": ("svd", "kmeans", "tuned_lens", "erasure", "logit_lens"),
        "proxies.targets": ("blocks.-1.attn.k",),
        "proxies.svd_ranks": (1, 4),
        "proxies.kmeans_sizes": (2,),
        "proxies.logit_lens_targets": ("blocks.0.resid_post",),
        "proxies.tuned_lens_targets": ("blocks.0.resid_post",),
        "proxies.tuned_lens_ranks": (0, 4),
        "proxies.concepts": ("depth", "bracket"),
        "proxies.erasure_targets": ("blocks.0.resid_post",),
        "proxies.eval_splits": ("iid", "unseen_depth"),
        "probes.sites": ("blocks.0.resid_post",),
        "geometry.enabled": True,
        "geometry.repair_sentences": (4,),
        "fit_shift.splits": ("train", "unseen_depth"),
    })
    env = {**os.environ, "JAX_ENABLE_COMPILATION_CACHE": "false",
           "XLA_FLAGS": xla_flags(f"--xla_dump_to={dump}", "--xla_dump_hlo_as_text")}
    done = subprocess.run([sys.executable, "-m", "jaxillusions.launch.sweep", f"--config={config}",
                           f"--workdir={tmp_path / 'run'}"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    programs = {}
    for path in sorted(dump.glob("*after_optimizations.txt")):
        calls = lapack_calls(path.read_text())
        if calls:
            programs[path.name] = calls
    targets = {t for calls in programs.values() for t, _ in calls}
    # The decompositions of the SVD proxy (eigh), the tuned lens (solve: LU; eigh), LEACE and
    # geometry (SVD) were all compiled.
    assert {"lapack_ssyevd_ffi", "lapack_sgesdd_ffi", "lapack_sgetrf_ffi"} <= targets, targets
    batched = {name: [t for t, shapes in calls if not one_matrix(shapes)]
               for name, calls in programs.items()}
    batched = {name: ts for name, ts in batched.items() if ts}
    assert not batched, f"programs with a batched LAPACK call (can deadlock): {batched}"
