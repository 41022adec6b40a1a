"""Scale: seeds sharded over devices (4 simulated CPU devices), sequential seed chunks, two
processes joined with jax.distributed, a signal to one of them, and the one-line error of a
process that does not join.

Each case trains the same 6 seeds and fits and evaluates proxies on them; the reference is the
same job in this (one-device) process. XLA flags and jax.distributed must be set up before jax
starts, so the sharded and multi-process cases run in child processes (`_child`).
"""

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tolerance as tol
from conftest import (
    FUSION_EMITTERS,
    TEST_XLA_FLAGS,
    checked,
    child_pytest,
    made_once,
    tiny_config,
    tiny_config_file,
    users_xla_flags,
    xla_flags,
    xla_knows,
)

import jaxillusions.faithfulness.collect
import jaxillusions.faithfulness.evaluate
import jaxillusions.faithfulness.fit
from jaxillusions import model as model_lib
from jaxillusions import tasks
from jaxillusions.faithfulness.collect import collect
from jaxillusions.faithfulness.evaluate import evaluate, make_eval_set
from jaxillusions.faithfulness.fit import fit
from jaxillusions.faithfulness.specs import specs_from_config
from jaxillusions.pipeline import validate
from jaxillusions.runtime import checkpoint, chunks, distributed
from jaxillusions.training import evaluation, train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NUM_SEEDS = 6  # not a multiple of 4 devices: 2 padding seeds


def _config(cache_dir: str, chunk: int = 0):
    config = tiny_config(cache_dir)
    config.train.num_seeds = NUM_SEEDS
    config.train.seed_chunk_size = chunk
    config.train.eval_every = 0
    config.proxies.targets = ("blocks.-1.attn.k",)
    config.proxies.methods = ("svd", "kmeans")
    config.proxies.eval_splits = ("iid", "longer")
    return config


def job(cache_dir: str, workdir: str | None = None, chunk: int = 0, proxies: bool = True,
        resume: bool = False) -> dict:
    """Trains the sweep (stopping once at step 10 and resuming when `resume`), then collects,
    fits and evaluates the proxies. Returns numpy arrays and the rows (as JSON text)."""
    config = checked(_config(cache_dir, chunk))
    splits = train.build(config)[0]
    splits, model_cfg, _ = train.build(config, {k: splits[k] for k in ("train", "iid", "longer")})
    if resume:
        train.train_sweep(config, workdir, splits=splits, stop_at_step=10, verbose=False)
    state, evals = train.train_sweep(config, workdir, splits=splits, verbose=False)
    out = {f"params/{jax.tree_util.keystr(p)}": x
           for p, x in jax.tree_util.tree_flatten_with_path(state.params)[0]}
    out["healthy"] = state.healthy
    out.update({f"eval/{split}/{k}": v for split, res in evals.items() for k, v in res.items()})
    if proxies:
        pc = config.proxies
        specs = specs_from_config(pc, model_cfg)
        stats = collect(state.params, splits["train"], model_cfg, specs,
                        num_samples=pc.kmeans_samples,
                        batch_size=pc.collect_batch_size)
        fitted = fit(specs, stats, jax.random.PRNGKey(config.seed), NUM_SEEDS)
        for i, proxy in enumerate(fitted):
            for p, x in jax.tree_util.tree_flatten_with_path(proxy.params)[0]:
                out[f"fitted/{i}/{jax.tree_util.keystr(p)}"] = np.asarray(x)
        rows = evaluate(
            state.params, model_cfg, make_eval_set(splits, pc.eval_splits),
            fitted, batch_size=pc.eval_batch_size, seeds=list(train.seed_list(config)),
            healthy=state.healthy)
        out["rows"] = np.asarray(json.dumps(rows))
    return {k: np.asarray(v) for k, v in out.items()}


def _spy_on_shardings(seen: dict) -> None:
    """Records the output sharding of every jitted computation over seeds."""
    def wrap(name, f):
        def spy(*args, **kwargs):
            out = f(*args, **kwargs)
            for path, x in jax.tree_util.tree_flatten_with_path(out)[0]:
                seen.setdefault(name, {})[jax.tree_util.keystr(path)] = (
                    len(x.sharding.device_set), tuple(x.sharding.spec))
            return out
        spy.lower = f.lower
        return spy

    # Patched where they are looked up: train_sweep calls train.train_steps (imported from
    # step.py), evaluation.evaluate its own _eval_batch.
    for module, name in [(train, "train_steps"), (evaluation, "_eval_batch"),
                         (jaxillusions.faithfulness.collect, "_collect_chunk"),
                         (jaxillusions.faithfulness.fit, "_fit_seeds_and_heads"),
                         (jaxillusions.faithfulness.evaluate, "_eval_chunk")]:
        setattr(module, name, wrap(name, getattr(module, name)))


def _blocks_run(cache_dir: str, num_seeds: int):
    """train_steps' arguments: `num_seeds` seeds of the tiny config with packed batches, 20
    steps."""
    from jaxillusions.training import objective as objective_lib
    from jaxillusions.training.step import init_state

    config = tiny_config(cache_dir)
    config.train.rows_per_sentence = 0.5  # packed batches, as the Dyck configs train
    config = checked(config)
    splits, model_cfg, tx = train.build(config)
    run = dict(num_steps=20, model_cfg=model_cfg, tx=tx, batch_size=config.train.batch_size,
               objective=objective_lib.from_settings(config))
    host = jax.tree.map(np.asarray, init_state(np.arange(num_seeds), model_cfg, tx))
    return host, splits["train"].tokens, run


def _child(mode: str, cache_dir: str, workdir: str, out: str, *args) -> None:
    """Runs in a child process: `sharded` (4 devices), `blocks` (2 devices) or `process` (one
    of 2 processes)."""
    if mode == "blocks":
        assert jax.device_count() == 2, jax.devices()
        host, tokens, run = _blocks_run(cache_dir, 4)
        state, tokens = distributed.shard_seeds(host), distributed.replicate(tokens)
        hlo = train.train_steps.lower(state, tokens, **run).compile().as_text()
        state, losses = train.train_steps(state, tokens, **run)
        leaves = {f"leaf{i}": np.asarray(x) for i, x in enumerate(jax.tree.leaves(state))}
        np.savez(out, **leaves, losses=np.asarray(losses), hlo=np.asarray(hlo),
                 spec=np.asarray(json.dumps([tuple(x.sharding.spec)
                                             for x in jax.tree.leaves(state)])))
        return
    if mode == "process":
        port, index = args
        distributed.initialize(f"127.0.0.1:{port}", 2, int(index), timeout_s=60)
        result = job(cache_dir, workdir)
        if distributed.is_main():
            np.savez(out, **result)
        return
    assert jax.device_count() == 4, jax.devices()
    seen: dict = {}
    _spy_on_shardings(seen)
    result = job(cache_dir, workdir, resume=True)
    chunked = job(cache_dir, chunk=4, proxies=False)  # 2 chunks of 4 (1 seed per device)
    np.savez(out, **result, **{f"chunked/{k}": v for k, v in chunked.items()},
             seen=np.asarray(json.dumps(seen)))


def _run_children(cmds: list[list[str]], env: dict, timeout: int = 240) -> list:
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env, cwd=ROOT) for c in cmds]
    outputs = [p.communicate(timeout=timeout) for p in procs]
    return [(p.returncode, *o) for p, o in zip(procs, outputs, strict=True)]


def _child_cmd(*args) -> list[str]:
    code = (f"import sys; sys.path[:0] = [{ROOT!r}, {os.path.join(ROOT, 'tests')!r}]; "
            f"import test_scale; test_scale._child(*{[str(a) for a in args]!r})")
    return [sys.executable, "-c", code]


def _child_on_devices(devices: int, mode: str, cache_dir: str, workdir, out) -> dict:
    """`_child(mode, ...)` in a process with `devices` CPU devices; the arrays it saved."""
    env = {**os.environ,
           "XLA_FLAGS": xla_flags(f"--xla_force_host_platform_device_count={devices}")}
    [(code, _, stderr)] = _run_children([_child_cmd(mode, cache_dir, workdir, out)], env)
    assert code == 0, stderr[-3000:]
    return dict(np.load(out))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def one_device(tmp_path_factory, cache_dir):
    """The 6 seeds' job on one device, made once for the test run (conftest.made_once)."""
    assert jax.device_count() == 1
    return made_once(tmp_path_factory, "one_device", lambda _: job(cache_dir))


def _rows_arrays(rows_json) -> dict:
    rows = json.loads(str(rows_json))
    keys = [k for k in rows[0] if isinstance(rows[0][k], float)]
    return {"rows_keys": np.asarray(json.dumps([[r[k] for k in rows[0] if k not in keys]
                                                for r in rows])),
            **{f"rows/{k}": np.asarray([r[k] for r in rows], np.float64) for k in keys}}


def _diffs(result: dict, reference: dict, prefix: str = "") -> dict:
    """Largest absolute difference per array (rows: per metric column; 0 = identical)."""
    out = {}
    for key, value in reference.items():
        got = result[prefix + key]
        if key == "rows":
            out.update(_diffs(_rows_arrays(got), _rows_arrays(value)))
        elif value.dtype.kind in "fc":
            assert got.shape == value.shape, key
            same_nan = np.array_equal(np.isnan(got), np.isnan(value))
            out[key] = float(np.nanmax(np.abs(got - value), initial=0)) if same_nan else np.inf
        else:
            out[key] = 0.0 if np.array_equal(got, value) else np.inf
    return out


def _assert_same(result: dict, reference: dict, prefix: str = "") -> None:
    diffs = _diffs(result, reference, prefix)
    assert not any(diffs.values()), {k: v for k, v in diffs.items() if v}


def _centroid_error(centroids: np.ndarray) -> np.ndarray:
    """Float32 rounding of k-means centroids [..., K, F] of the trained model's keys: each a
    mean of at most `proxies.kmeans_samples` key vectors near it, each vector within
    `activation_error` of its norm (matmuls of up to d_mlp terms), the mean's float32 sum
    within `sum_error` of the vectors' norms. Rounding scales with a centroid's norm, not
    with each of its entries, so an entry near 0 in a long row gets the row's bound."""
    config = _config("")
    norm = np.linalg.norm(np.asarray(centroids, np.float64), axis=-1, keepdims=True)
    return (tol.activation_error(centroids, max(config.model.d_model, config.model.d_mlp))
            + tol.sum_error(config.proxies.kmeans_samples, norm))


def _assert_close(result: dict, reference: dict, prefix: str = "") -> None:
    """Equal up to float32 rounding: integers, counts, row keys and accuracies exactly, k-means
    centroids within `_centroid_error` of each way, other floats within rtol 1e-5, atol 1e-6
    (measured: 2e-7 on parameters, 7e-7 on losses, 7e-8 on JSD; 0 on accuracies and
    same_pred). The SVD basis is compared through the rows only: its eigenvectors' signs and
    order within a degenerate eigenvalue are arbitrary, so rounding may flip them without
    changing the projection."""
    for key, value in reference.items():
        got = result[prefix + key]
        if key == "rows":
            _assert_close(_rows_arrays(got), _rows_arrays(value))
        elif key.endswith("['basis']"):
            continue
        elif key.endswith("['centroids']"):
            diff = np.abs(np.asarray(got, np.float64) - value)
            assert np.all(diff <= tol.two_ways(_centroid_error(value))), (key, diff.max())
        elif key == "rows/kl_score":
            # A ratio of float32 sums of KL taken in another order across processes (measured
            # 5.3e-5 relative at a row whose KL_zero is small): relative 1e-4.
            np.testing.assert_allclose(got, value, rtol=1e-4, atol=1e-6, err_msg=key)
        elif key == "rows/ce_score":
            # Ill-conditioned where zeroing the keys hardly changes the loss (Dyck): its
            # denominator CE_zero - CE_original is then near 0 and magnifies the logits' float32
            # rounding (measured 8.6e-5 relative, sharded vs one device). Its ingredients are
            # compared here through kl_score and acc; its value in tests/test_sae.py.
            continue
        elif value.dtype.kind == "f" and not key.endswith(("acc", "same_pred")):
            np.testing.assert_allclose(got, value, rtol=1e-5, atol=1e-6, err_msg=key)
        else:
            assert np.array_equal(got, value, equal_nan=value.dtype.kind == "f"), key


@pytest.mark.slow
def test_sharded_sweep_equals_one_device(one_device, cache_dir, tmp_path):
    # 6 seeds on 4 devices (2 padding seeds), stopped at step 10 and resumed from the sharded
    # checkpoint; then the same seeds in 2 chunks of 4. The one-device numbers up to float32
    # rounding: XLA:CPU rounds the sharded step (each device's block in a shard_map)
    # differently in the last bit, while unsharded runs of 2 and of 6 seeds agree bit for bit.
    result = _child_on_devices(4, "sharded", cache_dir, tmp_path / "run", tmp_path / "sharded.npz")
    _assert_close(result, one_device)
    _assert_close(result, {k: v for k, v in one_device.items()
                           if k.startswith(("params/", "eval/", "healthy"))}, "chunked/")
    seen = json.loads(str(result["seen"]))
    assert set(seen) == {"train_steps", "_eval_batch", "_collect_chunk",
                         "_fit_seeds_and_heads", "_eval_chunk"}
    for name, leaves in seen.items():  # every computation over seeds ran on all 4 devices,
        for leaf, (devices, spec) in leaves.items():  # each device on its own seeds
            assert devices == 4, (name, leaf)
            # Replicated: only outputs that do not depend on the seed (token counts, also the
            # dictionary metrics' counts of tokens and evaluated positions per split; the SVD's
            # mask and mean, which are constants without centering).
            assert spec in (["seed"], [None, "seed"]) or (
                spec == [] and leaf.endswith(("['count']", "['count_by_bin']", "['mask']",
                                              "['mean']", "['evaluated']"))), (name, leaf, spec)
    # The checkpoints hold the 6 seeds, without the padding.
    saved = checkpoint.Checkpointer(str(tmp_path / "run" / "checkpoints"))
    assert saved._manager.all_steps() == [10, 20]  # noqa: SLF001
    assert saved._manager.item_metadata(20)["healthy"].shape == (NUM_SEEDS,)  # noqa: SLF001


def test_each_device_trains_its_own_members_without_waiting_on_another(cache_dir, tmp_path):
    # 4 seeds of the tiny config with packed batches (a member's second pass is a while_loop)
    # on 2 devices: the compiled step holds no collective (under jit's partitioner alone the
    # loop's condition was an all-reduce over the devices), every leaf stays sharded by seed,
    # and each device's 2 members train as those 2 seeds do on one device, up to the float32
    # rounding of another compiled program (the tolerance of seeds trained together against
    # alone, tests/test_train.py).
    sharded = _child_on_devices(2, "blocks", cache_dir, tmp_path / "unused",
                                tmp_path / "blocks.npz")
    hlo = str(sharded["hlo"])
    assert "ENTRY" in hlo and not any(f" {op}(" in hlo for op in (
        "all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute"))
    assert all(spec[:1] == ["seed"] for spec in json.loads(str(sharded["spec"])))
    host, tokens, run = _blocks_run(cache_dir, 4)
    assert run["objective"].packed_rows  # the config packs: the loop is in the step
    blocks = [train.train_steps(jax.tree.map(lambda x, i=i: x[i:i + 2], host), tokens, **run)
              for i in (0, 2)]
    for i, leaf in enumerate(jax.tree.leaves(blocks[0][0])):
        joined = np.concatenate([leaf, jax.tree.leaves(blocks[1][0])[i]])
        np.testing.assert_allclose(sharded[f"leaf{i}"], joined, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(sharded["losses"], np.concatenate([b[1] for b in blocks], axis=1),
                               rtol=1e-5)


@pytest.mark.fusion_emitters
def test_seed_chunks_equal_one_chunk(cache_dir):
    # 3 sequential chunks of 2 seeds on one device: the same parameters bit for bit. (A 1-seed
    # chunk is refused by validate: it would run the unbatched step.) The evaluation runs in
    # the same chunks, which XLA:CPU rounds differently from one call for 6 seeds: accuracies
    # and counts equal, losses within float32 rounding (measured: up to 7e-7; the
    # tolerance is derived in test_chunked_evaluation_equals_one_call).
    # The one-chunk run is trained here without its proxies (the `one_device` fixture's): under
    # the suite's flags this test runs in a child pytest (tests/conftest.py), where that
    # fixture would be made again, proxies and all, for the parameters and evaluation alone.
    one_device = job(cache_dir, proxies=False)
    chunked = job(cache_dir, chunk=2, proxies=False)
    _assert_same(chunked, {k: v for k, v in one_device.items()
                           if k.startswith(("params/", "healthy"))})
    _assert_close(chunked, {k: v for k, v in one_device.items() if k.startswith("eval/")})
    assert distributed.seed_chunks(6, 4)[1].tolist() == [4, 5, 5, 5]


@pytest.mark.fusion_emitters
def test_a_test_marked_fusion_emitters_runs_with_them():
    # tests/conftest.py reruns a test so marked in a child pytest with XLA:CPU's fusion emitters
    # on where the suite's flags turn them off: it never runs with them off.
    assert f"{FUSION_EMITTERS}=false" not in os.environ.get("XLA_FLAGS", "").split()


def test_the_suites_flags_are_asked_of_the_installed_xla_first():
    # tests/conftest.py: XLA ends a process whose XLA_FLAGS names a flag it does not know, and
    # jaxlib 0.12 (Python 3.12 and later) has no FUSION_EMITTERS: the suite adds it only where
    # the installed XLA takes it.
    assert not xla_knows("--xla_cpu_no_such_flag=true")
    assert xla_knows(TEST_XLA_FLAGS[0])
    if FUSION_EMITTERS not in os.environ["XLA_FLAGS"]:  # left out: only where XLA lacks it
        assert not xla_knows(f"{FUSION_EMITTERS}=false")


def test_runs_that_run_more_than_they_compile_leave_out_the_suites_llvm_level(monkeypatch):
    # tests/conftest.py: those launches get the suite's flags but its level 0, so that they set
    # their own (distributed.use_cpu_compile_level); a level other than 0 stays.
    level = "--xla_backend_optimization_level"
    monkeypatch.setenv("XLA_FLAGS", f"--xla_dump_to=/tmp/x {level}=0 {FUSION_EMITTERS}=false")
    assert users_xla_flags() == f"--xla_dump_to=/tmp/x {FUSION_EMITTERS}=false"
    monkeypatch.setenv("XLA_FLAGS", f"{level}=2 {FUSION_EMITTERS}=false")
    assert users_xla_flags() == f"{level}=2 {FUSION_EMITTERS}=false"


def test_users_compile_level_compiles_a_tests_programs_at_level_1(users_compile_level,
                                                                    monkeypatch):
    # tests/conftest.py: a test with the fixture compiles its programs at users' LLVM level,
    # through the compile options that JAX builds for each program; the rest of the suite at 0.
    from jax._src import compiler

    if TEST_XLA_FLAGS[0] not in os.environ["XLA_FLAGS"].split():
        pytest.skip("the suite runs at the LLVM level that XLA_FLAGS names")
    levels, patched = [], compiler.get_compile_options

    def spy(*args, **kwargs):
        built = patched(*args, **kwargs)
        levels.append(built.executable_build_options.debug_options.xla_backend_optimization_level)
        return built

    monkeypatch.setattr(compiler, "get_compile_options", spy)
    assert float(jax.jit(lambda x: (x * 3.0 + 1.0).sum())(np.arange(5.0))) == 35.0
    assert levels == [1]


def test_a_shared_ir_context_lowers_the_same_programs():
    # tests/conftest.py lowers the suite's programs in MLIR contexts that serve many programs in
    # turn: a program's text, with its source locations, and its compiled text are those that a
    # context of its own gives. (The first compilation of a function numbers the compiled
    # text's stack frames in another order than the next ones, whatever the context: the
    # texts compared come after one.)
    from jax._src.interpreters import mlir

    shared = mlir.make_ir_context
    texts = []
    for make in (shared, shared, shared.fresh, shared):
        def f(x, w):  # a new function each time, so that no lowering is reused
            h = jax.nn.gelu(x @ w)
            return jax.nn.softmax(h, axis=-1).sum(0), jnp.cumsum(h, axis=1)

        mlir.make_ir_context = make
        try:
            program = jax.jit(f).lower(jnp.ones((5, 3)), jnp.arange(12.0).reshape(3, 4))
        finally:
            mlir.make_ir_context = shared
        texts.append((program.as_text(debug_info=True), program.compile().as_text()))
    assert texts[2] == texts[1] and texts[3] == texts[1]


def test_the_compile_report_counts_each_tests_own_compilations(tmp_path):
    # JAXILLUSIONS_TEST_COMPILES=FILE (tests/conftest.py): a line per test, with the programs
    # that test compiled (in its process) and their seconds, none for a test that compiles none.
    probe = tmp_path / "test_probe.py"
    probe.write_text("import jax, jax.numpy as jnp\n\n\n"
                     "def test_compiles():\n"
                     "    assert float(jax.jit(lambda x: jnp.sin(x) * 2)(jnp.ones(3))[0]) > 0\n\n\n"
                     "def test_compiles_nothing():\n"
                     "    assert 1 + 1 == 2\n")
    report = tmp_path / "compiles.jsonl"
    done = child_pytest([str(probe), "-p", "conftest"], cwd=str(tmp_path),
                        basetemp=str(tmp_path / "tmp"), timeout=300,
                        JAXILLUSIONS_TEST_COMPILES=str(report),
                        PYTHONPATH=os.path.dirname(os.path.abspath(__file__)))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    lines = {json.loads(line)["test"].split("::")[-1]: json.loads(line)
             for line in report.read_text().splitlines()}
    assert set(lines) == {"test_compiles", "test_compiles_nothing"}
    assert lines["test_compiles"]["compiles"] >= 1 and lines["test_compiles"]["compile_s"] > 0
    assert lines["test_compiles"]["trace_s"] > 0
    assert all(line["gc_s"] >= 0 for line in lines.values())
    assert all(line["wait_s"] == 0 for line in lines.values())  # no fixture made once here
    assert lines["test_compiles_nothing"]["compiles"] == 0
    assert all(line["wall_s"] > 0 for line in lines.values())


def test_a_failure_is_reported_when_cpythons_ast_race_breaks_its_traceback(tmp_path):
    # Was: on CPython 3.11.7, pytest's `ast.parse` of a failing test's source raised CPython's
    # race (tests/failure_reports.py) and the xdist worker died, ending the run. Made to happen
    # once here: without the plugin the failure is an INTERNALERROR that loses the test after
    # it; with it (as tests/conftest.py uses it) both tests are reported, the failure with
    # Python's traceback, and pytest's own style is back for the next failure.
    (tmp_path / "conftest.py").write_text(
        "import ast, sys\n\n"
        "_parse, _raised = ast.parse, []\n\n\n"
        "def _racing_parse(*args, **kwargs):  # raises once, where pytest reads a statement\n"
        "    if not _raised and sys._getframe(1).f_code.co_name == 'getstatementrange_ast':\n"
        "        _raised.append(1)\n"
        "        raise SystemError('AST constructor recursion depth mismatch (before=147, "
        "after=200)')\n"
        "    return _parse(*args, **kwargs)\n\n\n"
        "ast.parse = _racing_parse\n")
    (tmp_path / "test_probe.py").write_text(
        "def test_fails():\n    value = 1\n    assert value == 2\n\n\n"
        "def test_passes():\n    assert True\n\n\n"
        "def test_fails_again():\n    assert [1] == [2]\n")
    runs = {plugin: child_pytest(["test_probe.py", "-rA",
                                  *(["-p", plugin] if plugin else [])],
                                 cwd=str(tmp_path), basetemp=str(tmp_path / "tmp"), timeout=120,
                                 PYTHONPATH=os.path.dirname(os.path.abspath(__file__)))
            for plugin in ("", "failure_reports")}
    assert "INTERNALERROR" in runs[""].stdout + runs[""].stderr
    assert "test_passes" not in runs[""].stdout  # lost
    done = runs["failure_reports"]
    said = done.stdout + done.stderr
    assert done.returncode == 1 and "INTERNALERROR" not in said, said[-3000:]
    assert "2 failed, 1 passed" in done.stdout, said[-3000:]
    assert "Traceback (most recent call last)" in done.stdout  # the raced one: Python's
    assert "E       assert [1] == [2]" in done.stdout  # the next: pytest's own style


@pytest.mark.slow
def test_two_processes_equal_one(one_device, cache_dir, tmp_path):
    # Two processes with one CPU device each, joined with jax.distributed over 127.0.0.1
    # (gloo collectives): each trains and evaluates its 3 seeds; process 0 gathers them and
    # writes the files once. The merged arrays and rows equal the one-process run (up to the
    # rounding of a partitioned program, as above).
    port, out, workdir = _free_port(), tmp_path / "merged.npz", tmp_path / "run"
    env = {**os.environ, "XLA_FLAGS": xla_flags()}  # one device per process
    results = _run_children([_child_cmd("process", cache_dir, workdir, out, port, i)
                             for i in range(2)], env)
    for code, _, stderr in results:
        assert code == 0, stderr[-3000:]
    _assert_close(dict(np.load(out)), one_device)
    runs = sorted(os.listdir(workdir / "tensorboard"))
    assert [r for r in runs if r.startswith("seed_")] == [f"seed_{s}" for s in range(6)]
    assert os.path.exists(workdir / "checkpoints" / "20" / "checksums.json")


def test_several_processes_need_each_its_id(monkeypatch):
    """Was: without --process_id every process ran as process 0: the second failed to bind the
    coordinator's port ("Address already in use"), the first waited out the join timeout."""
    monkeypatch.delenv("JAX_PROCESS_ID", raising=False)
    with pytest.raises(ValueError, match=r"^2 processes: give each its id, --process_id=0 \.\. 1"):
        distributed.settings("127.0.0.1:1234", 2)
    assert distributed.settings("127.0.0.1:1234", 2, 1) == ("127.0.0.1:1234", 2, 1)
    assert distributed.settings(None, 1) == (None, 1, 0)  # one process needs no id
    monkeypatch.setenv("JAX_PROCESS_ID", "1")
    assert distributed.settings("127.0.0.1:1234", 2) == ("127.0.0.1:1234", 2, 1)


def test_missing_process_is_named(tmp_path, cache_dir):
    # Process 0 of 2 is started alone: after the join timeout it names process 1, in one line.
    port = _free_port()
    cmd = [sys.executable, "-m", "jaxillusions.launch.train", "--config=dyck_small",
           f"--workdir={tmp_path}", f"--config.data.cache_dir={cache_dir}",
           f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2", "--process_id=0",
           "--join_timeout=3"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: process 1 of 2 did not join the coordinator at 127.0.0.1:{port} within 3 s")


@pytest.mark.slow
def test_a_signal_to_one_process_stops_all_at_the_same_proxy_family(tmp_path, cache_dir):
    # Was: the signalled process left after its family, and process 0 failed in the next
    # collective with "error: JaxRuntimeError: ... Gloo AllGather failed ..." (exit 1).
    config_file = tiny_config_file(tmp_path / "config.py", cache_dir, {
        "train.num_steps": 20, "train.eval_every": 0, "train.checkpoint_every": 0,
        "proxies.targets": ("blocks.-1.attn.k",),
        "proxies.methods": ("svd", "kmeans", "uniform_attention")})  # 3 proxy families
    port, workdir = _free_port(), tmp_path / "run"
    procs = _two_processes("jaxillusions.launch.sweep", config_file, workdir, port)
    for line in procs[0].stdout:  # process 0 reports progress; process 1 gets the signal
        if "fitting" in line:
            procs[1].send_signal(signal.SIGTERM)
            break
    ends = [(p.communicate(timeout=120)[1], p.returncode) for p in procs]
    for stderr, code in ends:
        assert code == 143, stderr[-2000:]
        (line,) = stderr.strip().splitlines()
        assert line.startswith("stopped by SIGTERM while fitting proxies; 1 of 3 families"), line
    assert ends[0][0] == ends[1][0]
    assert not os.path.exists(workdir / "results.csv")


def test_seed_chunk_size_is_a_checked_training_key(config, tmp_path):
    config.train.seed_chunk_size = 1
    with pytest.raises(ValueError, match=r"train.seed_chunk_size=1: must be 0 \(all at once\)"):
        validate.validate(config)
    # A workdir whose config.json predates the key matches the default (0), not another value.
    del config.train["seed_chunk_size"]
    checkpoint.claim_workdir(str(tmp_path), config)  # the config.json of a run before the key
    config.train.seed_chunk_size = 0
    assert train.claim_workdir(str(tmp_path), checked(config)) == []
    config.train.seed_chunk_size = 4
    with pytest.raises(ValueError, match="train.seed_chunk_size: 0 there vs 4 now"):
        train.claim_workdir(str(tmp_path), checked(config))


def test_memory_estimate_suggests_a_chunk_size_that_fits():
    from jaxillusions.training import memory  # noqa: PLC0415

    mib = 2**20
    est = memory.Estimate(step_bytes=10 * 1024 * mib, fixed_bytes=32 * mib, seeds_per_device=64,
                          num_devices=8, num_chunks=1, capacity=8 * 1024 * mib)
    per_seed = (10 * 1024 - 32) / 64 * mib
    assert est.per_seed_bytes == per_seed and est.fits is False
    chunk = est.max_chunk_size()  # seeds over all 8 devices, within 90% of the capacity
    assert chunk % 8 == 0 and 32 * mib + chunk / 8 * per_seed <= 0.9 * 8 * 1024 * mib
    assert 32 * mib + (chunk / 8 + 1) * per_seed > 0.9 * 8 * 1024 * mib
    text = memory.describe(est)
    assert f"set --config.train.seed_chunk_size={chunk}" in text and "WARNING" in text
    fits = memory.Estimate(1024 * mib, 32 * mib, 4, 1, 1, 8 * 1024 * mib)
    assert fits.fits and "WARNING" not in memory.describe(fits)


@pytest.mark.slow
def test_chunked_evaluation_equals_one_call(config):
    # Evaluation runs in the chunks that training uses: 5 seeds in chunks of 2 (the last one
    # padded) against one call for all 5. Each seed's numbers come from its own forward pass,
    # but XLA:CPU blocks the float32 sums differently for 2 seeds than for 5 (the logits
    # differ in their last bits), so the loss agrees within float32 rounding, derived below.
    config.train.eval_batch_size = 16  # several sentence batches per split
    parsed = validate.parse(config)
    splits, model_cfg, params = _perturbed_models(parsed, 5)
    chunks = evaluation.seed_chunks(params, 2)
    assert [jax.tree.leaves(c)[0].shape[0] for c in chunks] == [2, 2, 2]
    for name in ("iid", "longer"):
        one, chunked = (evaluation.evaluate_splits(p, 5, {name: splits[name]}, model_cfg,
                                                   parsed)[name] for p in ([params], chunks))
        assert one.keys() == chunked.keys() and one["acc"].shape == (5,)
        np.testing.assert_array_equal(chunked["count_by_depth"], one["count_by_depth"])
        # Argmaxes agree unless a top-2 logit gap is below the logits' rounding (~1e-5).
        np.testing.assert_array_equal(chunked["acc_by_depth"], one["acc_by_depth"])
        tol = _loss_rounding(params, splits[name].tokens, model_cfg, parsed, one["loss"])
        assert (np.abs(chunked["loss"] - one["loss"]) <= tol).all(), (name, tol)
        # The seeds are told apart far beyond it (a seed in the wrong place would show).
        assert np.diff(np.sort(one["loss"])).min() > 10 * tol.max(), name


def _perturbed_models(parsed, num_seeds: int):
    """(splits, model config, params) of `num_seeds` initial models moved far from init by
    noise: clearly different models, their argmaxes rarely near a tie."""
    from jaxillusions.training.step import init_state  # noqa: PLC0415

    splits, model_cfg, tx = train.build(parsed)
    params = init_state(np.arange(num_seeds), model_cfg, tx).params

    @jax.jit  # one program, not an eager one per leaf and operation
    def perturbed(params):
        leaves, tree = jax.tree.flatten(params)
        keys = jax.random.split(jax.random.PRNGKey(1), len(leaves))
        return jax.tree.unflatten(tree, [x + 0.3 * jax.random.normal(k, x.shape)
                                         for x, k in zip(leaves, keys, strict=True)])

    return splits, model_cfg, perturbed(params)


def _loss_rounding(params, tokens, m, parsed, loss):
    """How far two float32 programs' evaluation losses of the same models on `tokens` may lie
    apart. A logit ends a chain of k float32 dot products (per layer: q/k/v, scores, pattern
    @ v, output, MLP in and out; then the unembedding) of at most n terms, each within n u of
    the size of its terms: to first order (the layer norms rescale the residual between
    layers), within k n u max|logit|, in each of the two runs. A position's loss, logsumexp
    minus the target's logit, moves by at most twice a logit's change; and the mean over N
    positions sums N float32 terms (N u relative)."""
    u = 2.0**-24  # float32 unit roundoff
    logits = jax.jit(jax.vmap(lambda p: model_lib.forward(p, tokens, m)[0]))(params)
    k, n = 6 * m.n_layers + 1, max(m.d_model, m.d_mlp, tokens.shape[1])
    positions = parsed.train.eval_batch_size * tokens.shape[1] + len(tokens)
    return (2 * 2 * k * n * u * float(np.abs(np.asarray(logits)).max())
            + 2 * positions * u * loss)


def test_evaluation_reads_out_the_evaluated_positions_only(config):
    """Training's evaluation computes the logits at each row's evaluated positions only (as
    many per row as the split's most: model.Span's readout): the counts of the same positions,
    the accuracies up to a near-tie of two logits within their rounding (none here), the loss
    within the rounding of two float32 programs (`_loss_rounding`), of every position's
    logits."""
    config.train.eval_batch_size = 16
    parsed = validate.parse(config)
    splits, model_cfg, params = _perturbed_models(parsed, 3)
    for name in ("iid", "longer"):
        task = tasks.get(parsed.task)
        view = task.view(splits[name])
        assert 0 < chunks.readout_width(view.evaluated) < view.tokens.shape[1]
        read, whole = (evaluation.evaluate([params], splits[name], model_cfg, num_seeds=3,
                                           batch_size=16, task=task, readout=r,
                                           num_bins=task.train_num_bins(parsed.data))
                       for r in (True, False))
        np.testing.assert_array_equal(read["count_by_depth"], whole["count_by_depth"])
        np.testing.assert_array_equal(read["acc_by_depth"], whole["acc_by_depth"])
        tol = _loss_rounding(params, splits[name].tokens, model_cfg, parsed, whole["loss"])
        assert (np.abs(read["loss"] - whole["loss"]) <= tol).all(), (name, tol)


def test_memory_plan_admits_configs_code_on_one_80gb_gpu_and_not_on_8gb():
    # The plan from the config alone, against a given machine: no GPU needed.
    from jaxillusions.configs import code  # noqa: PLC0415
    from jaxillusions.training import memory  # noqa: PLC0415

    gib = 2**30
    parsed = validate.parse(code.get_config())
    model_cfg = train.model_config(parsed)

    def gpu(device_gib: float):  # one GPU, 128 GiB of host RAM
        return memory.Machine("gpu", 1, int(device_gib * gib), 128 * gib, "test GPU")

    # JAX's share of an 80 GB H100 (its default 75% preallocation), as measured in
    # docs/scaling_out.md: 59.4 GiB. An 8 GB GPU gives it 6 GiB.
    memory.check_config(parsed, model_cfg, gpu(59.4))
    with pytest.raises(ValueError, match=r"needs an estimated 30.3 GiB at least .* more than "
                                         r"the 6.0 GiB of memory of each device \(test GPU\)"):
        memory.check_config(parsed, model_cfg, gpu(6))
    # The arithmetic: activations of one chunk of 8 seeds (train.seed_chunk_size), float32.
    # Training: 2 layers x 64 rows x 511 inputs x (4 heads x 511 scores + 1024 MLP units + 256
    # residual) kept for the backward pass; evaluation: one layer of 128 rows x 1024 positions x
    # (4 x 1024 scores + 256); parameters and both AdamW moments of all 64 seeds stay on the
    # device, gradients for the chunk's 8.
    terms = {t.what: t for t in memory.plan(parsed, model_cfg, num_devices=1, platform="gpu")}
    train_batch = terms["the attention scores and activations of a training batch"]
    eval_batch = terms["one layer's attention scores of an evaluation batch"]
    assert train_batch.num_bytes == 8 * 2 * 64 * 511 * (4 * 511 + 1024 + 256) * 4
    assert eval_batch.num_bytes == 8 * 128 * 1024 * (4 * 1024 + 256) * 4 == 17 * gib
    assert ("train.seed_chunk_size", 8) in eval_batch.factors
    params = sum(np.prod(x.shape) for x in jax.tree.leaves(jax.eval_shape(
        lambda: model_lib.init_params(jax.random.PRNGKey(0), model_cfg))))
    assert terms["parameters, gradients and AdamW moments"].num_bytes == (64 * 12 + 8 * 4) * params
    # All 64 seeds at once (the config before the chunking): the evaluation batch alone is
    # 136 GiB, which no 80 GB GPU holds.
    whole = parsed.replace(train={"seed_chunk_size": 0})
    with pytest.raises(ValueError, match=r"\(136.0 GiB for one layer's attention scores of an "
                                         r"evaluation batch\), more than the 59.4 GiB"):
        memory.check_config(whole, model_cfg, gpu(59.4))


@pytest.mark.slow
def test_a_killed_peer_is_named_in_one_line(tmp_path, cache_dir):
    # Was: "error: UNKNOWN: Gloo AllGather failed ... Connection reset by peer" on the survivor.
    config_file = tiny_config_file(tmp_path / "config.py", cache_dir, {
        "train.num_steps": 100_000, "train.log_every": 10, "train.eval_every": 0,
        "train.checkpoint_every": 0})
    port, workdir = _free_port(), tmp_path / "run"
    procs = _two_processes("jaxillusions.launch.train", config_file, workdir, port)
    try:
        for line in procs[0].stdout:
            if line.startswith("step     20/"):
                procs[1].kill()
                break
        _, err = procs[0].communicate(timeout=120)
    finally:
        for p in procs:
            p.kill()
    assert procs[0].returncode == 1, err[-2000:]
    (line,) = err.strip().splitlines()
    assert line.startswith("error: lost process 1 of 2 (this is process 0; it stopped or cannot "
                           "be reached: "), line
    assert line.endswith("relaunch all 2 processes with the same command to resume from the "
                         "last checkpoint"), line


def _two_processes(module: str, config_file, workdir, port: int) -> list[subprocess.Popen]:
    """`python -m <module>` as processes 0 and 1 of a 2-process run over 127.0.0.1."""
    env = {**os.environ, "XLA_FLAGS": xla_flags()}  # one device per process
    return [subprocess.Popen(
        [sys.executable, "-m", module, f"--config={config_file}", f"--workdir={workdir}",
         f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2", f"--process_id={i}"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i in range(2)]


@pytest.mark.slow
def test_config_cpu_devices_sets_the_launchers_devices(tmp_path, cache_dir):
    # cpu_devices=2 (the Quickstart config's value): the launcher splits the CPU before JAX
    # starts, and training says it runs on both devices.
    config_file = tiny_config_file(tmp_path / "two.py", cache_dir,
                                   {"cpu_devices": 2, "train.num_steps": 10})
    env = {k: v for k, v in os.environ.items() if k != "JAX_NUM_CPU_DEVICES"}
    cmd = [sys.executable, "-m", "jaxillusions.launch.train", f"--config={config_file}"]
    [(code, stdout, stderr)] = _run_children([cmd + [f"--workdir={tmp_path / 'two'}"]], env)
    assert code == 0, stderr[-3000:]
    assert "on 2 cpu device(s)" in stdout
    # A JAX_NUM_CPU_DEVICES that disagrees is a one-line error before any work.
    [(code, stdout, stderr)] = _run_children(
        [cmd + [f"--workdir={tmp_path / 'clash'}"]], {**env, "JAX_NUM_CPU_DEVICES": "3"})
    assert code == 1
    assert stderr.strip().splitlines() == [
        "error: cpu_devices=2, but JAX_NUM_CPU_DEVICES=3: unset the variable, or set "
        "--config.cpu_devices=3 (0 follows it)"]
    assert not os.path.exists(tmp_path / "clash" / "config.json")


def test_cpu_devices_after_jax_started_must_match(config, tmp_path, monkeypatch):
    # In a process where JAX already runs (this one: 1 CPU device), a config asking for another
    # count stops before any work instead of computing on another layout than it names.
    assert jax.device_count() == 1
    distributed.use_cpu_devices(0)
    distributed.use_cpu_devices(1)
    config.cpu_devices = 2
    with pytest.raises(ValueError, match=r"already runs on 1 CPU device\(s\)"):
        validate.check(config)  # the door sets the devices, or refuses
    # Settings read without the door's check (as a notebook could) are refused by the jobs too.
    from jaxillusions.pipeline import sweep  # noqa: PLC0415

    unchecked = validate.parse(config)
    with pytest.raises(ValueError, match=r"already runs on 1 CPU device\(s\)"):
        train.train_sweep(unchecked, str(tmp_path / "run"), verbose=False)
    assert not os.path.exists(tmp_path / "run")
    with pytest.raises(ValueError, match=r"already runs on 1 CPU device\(s\)"):
        sweep.run(unchecked, str(tmp_path / "run"), verbose=False)
    assert not os.path.exists(tmp_path / "run")
    monkeypatch.setenv("JAX_NUM_CPU_DEVICES", "3")
    with pytest.raises(ValueError, match="JAX_NUM_CPU_DEVICES=3"):
        distributed.use_cpu_devices(2)


def test_deterministic_gpu_kernels_are_asked_for_before_jax_starts(monkeypatch):
    # gpu_deterministic=True adds XLA's flag to XLA_FLAGS while the backends are not started
    # (XLA reads the variable once, when they start), keeps the user's other flags and the
    # user's own choice of this one, and adds nothing when False or once JAX runs on a CPU.
    flag = "--xla_gpu_deterministic_ops"
    monkeypatch.setattr(distributed, "_backends_started", lambda: False)
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/tmp/x")
    distributed.use_deterministic_gpu(False)
    assert os.environ["XLA_FLAGS"] == "--xla_dump_to=/tmp/x"
    distributed.use_deterministic_gpu(True)
    assert os.environ["XLA_FLAGS"] == f"--xla_dump_to=/tmp/x {flag}=true"
    distributed.use_deterministic_gpu(True)  # once only
    assert os.environ["XLA_FLAGS"].count(flag) == 1
    monkeypatch.setenv("XLA_FLAGS", f"{flag}=false")  # the user's choice stands
    distributed.use_deterministic_gpu(True)
    assert os.environ["XLA_FLAGS"] == f"{flag}=false"
    monkeypatch.delenv("XLA_FLAGS")
    monkeypatch.undo()  # the real check: this process's JAX has started, on the CPU
    jax.devices()
    before = os.environ.get("XLA_FLAGS")
    distributed.use_devices(0, True)
    assert os.environ.get("XLA_FLAGS") == before


def test_cpu_kernels_compile_at_llvm_level_1_only_where_jax_runs_on_the_cpu(monkeypatch):
    # Before JAX starts, on a CPU-only install, the flag is added once, beside the user's
    # other flags; the user's own level stands; where an accelerator may run (XLA:GPU refuses
    # levels under 2) nothing is added; once JAX has started without it, one warning.
    flag = "--xla_backend_optimization_level"
    monkeypatch.setattr(distributed, "_backends_started", lambda: False)
    monkeypatch.setattr(distributed, "cpu_only", lambda: True)
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/tmp/x")
    distributed.use_cpu_compile_level()
    assert os.environ["XLA_FLAGS"] == f"--xla_dump_to=/tmp/x {flag}=1"
    distributed.use_devices(0, False)  # once only
    assert os.environ["XLA_FLAGS"].count(flag) == 1
    monkeypatch.setenv("XLA_FLAGS", f"{flag}=2")
    distributed.use_cpu_compile_level()
    assert os.environ["XLA_FLAGS"] == f"{flag}=2"
    monkeypatch.delenv("XLA_FLAGS")
    monkeypatch.setattr(distributed, "cpu_only", lambda: False)
    distributed.use_cpu_compile_level()
    assert "XLA_FLAGS" not in os.environ
    monkeypatch.setattr(distributed, "cpu_only", lambda: True)
    monkeypatch.setattr(distributed, "_backends_started", lambda: True)
    monkeypatch.setattr(distributed, "_warned_cpu_level", False)
    with pytest.warns(UserWarning, match=f"JAX started before {flag}=1"):
        distributed.use_cpu_compile_level()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        distributed.use_cpu_compile_level()  # once per process
    assert "XLA_FLAGS" not in os.environ


@pytest.mark.parametrize(("platforms", "plugin", "expected"), [
    ("cpu", True, True), ("cuda,cpu", True, False), ("tpu", True, False), (None, True, False),
    # Without an accelerator plugin JAX starts on the CPU whatever else the platforms name (was:
    # "cpu,cuda" on a CPU-only install compiled at level 2, to other bits than the launchers').
    ("cuda,cpu", False, True), (None, False, True)])
def test_cpu_only_reads_the_platforms_jax_is_told_to_use(platforms, plugin, expected,
                                                         monkeypatch):
    monkeypatch.setattr(distributed, "_accelerator_plugin", lambda: plugin)
    before = jax.config.jax_platforms
    jax.config.update("jax_platforms", platforms)
    try:
        assert distributed.cpu_only() is expected
    finally:
        jax.config.update("jax_platforms", before)


def test_evaluation_during_training_scores_the_first_training_sentences(config):
    """train.eval_train_sentences = N: the evaluations during training score the training
    split's first N sentences (the same numbers as evaluating that subset), the other splits
    whole; 0 scores all of them."""
    from jaxillusions import tasks  # noqa: PLC0415
    from jaxillusions.training.step import init_state  # noqa: PLC0415

    config.train.eval_train_sentences = 100
    parsed = validate.parse(config)
    splits, model_cfg, tx = train.build(parsed)
    params = init_state(np.arange(2), model_cfg, tx).params
    some = {"train": splits["train"], "iid": splits["iid"]}
    capped = evaluation.evaluate_splits([params], 2, some, model_cfg, parsed)
    first = tasks.subset(splits["train"], np.arange(100))
    alone = evaluation.evaluate_splits([params], 2, {"train": first, "iid": splits["iid"]},
                                       model_cfg, parsed)
    whole = evaluation.evaluate_splits([params], 2, some, model_cfg, dataclasses.replace(
        parsed, train=dataclasses.replace(parsed.train, eval_train_sentences=0)))
    for name in ("train", "iid"):
        for key, value in capped[name].items():
            np.testing.assert_array_equal(value, alone[name][key])
    np.testing.assert_array_equal(capped["iid"]["acc"], whole["iid"]["acc"])
    assert capped["train"]["count_by_depth"].sum() == first.is_close.sum()
    assert whole["train"]["count_by_depth"].sum() == splits["train"].is_close.sum() > \
        capped["train"]["count_by_depth"].sum()
