import fcntl
import gc
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time

import pytest
from failure_reports import pytest_runtest_makereport  # noqa: F401 - a hook of this conftest

from jaxillusions.configs import dyck_small
from jaxillusions.launch.common import settle_heap

# The suite's XLA compiles fast rather than well: most of the suite's time is compiling many
# small programs, and these programs run for milliseconds. LLVM's optimizations are off (level
# 0), and fusions are emitted by XLA:CPU's older elemental emitter rather than its MLIR fusion
# emitters, whose pipeline costs about twice the compile time at level 0 (a shrunk shipped
# config: compilation 9.2-10.0 s against 4.9-5.5 s; docs/speed.md, "The test suite"). Both
# change how XLA:CPU emits and vectorises a program, not which operations it runs, so results
# differ from the default by float32 rounding, which every tolerance of the suite is derived to
# cover (as it must be for AMD vs Intel); bit-for-bit comparisons are between two runs under the
# same flags. An XLA_FLAGS that names a flag keeps its value:
# `XLA_FLAGS="--xla_backend_optimization_level=2 --xla_cpu_use_fusion_emitters=true" pytest`
# runs the suite as users' programs are compiled. Launched subprocesses inherit the flags.
# jaxlib 0.12 (what pip installs on Python 3.12 and later) has no elemental emitter and no flag
# for it, and XLA ends a process whose XLA_FLAGS names a flag it does not know: there the suite
# compiles with the fusion emitters (xla_knows).
FUSION_EMITTERS = "--xla_cpu_use_fusion_emitters"
TEST_XLA_FLAGS = ("--xla_backend_optimization_level=0", f"{FUSION_EMITTERS}=false")


def xla_knows(flag: str) -> bool:
    """Whether the installed XLA takes `flag` in XLA_FLAGS, asked of a child process (about a
    second: XLA aborts a process over a flag it does not know, in its first backend)."""
    env = {**os.environ, "XLA_FLAGS": flag, "JAX_PLATFORMS": "cpu"}
    return subprocess.run([sys.executable, "-c", "import jax; jax.devices()"], env=env,
                          capture_output=True).returncode == 0


# Launches whose time goes to running programs more than to compiling them compile as users'
# programs do, not at the suite's LLVM level 0, which leaves XLA:CPU's loops unvectorised: the
# launch then sets the level itself (1 where JAX runs on the CPU alone,
# distributed.use_cpu_compile_level). Alone, AMD EPYC of family 25 model 17, empty compilation
# caches, levels 0 and 1 in turn, two pairs: the shipped `code` config as its test runs it 43.3
# and 40.1 s -> 31.4 and 29.0 s, `dyck_dictionaries` 31.3 and 29.5 s -> 26.4 and 23.1 s, the
# tutorial notebook 38.9 and 42.8 s -> 31.8 and 26.8 s; the other shipped configs gained nothing
# or lost (docs/speed.md, "The shipped-config test and the shared sweeps").
def users_xla_flags() -> str:
    """This process's XLA_FLAGS without the suite's LLVM level 0 (TEST_XLA_FLAGS), for a launch
    that runs more than it compiles; another level named in XLA_FLAGS stays."""
    return " ".join(f for f in os.environ.get("XLA_FLAGS", "").split()
                    if f != TEST_XLA_FLAGS[0])


@pytest.fixture
def users_compile_level(monkeypatch):
    """The programs this test compiles in its process at users' LLVM level, 1
    (distributed.use_cpu_compile_level), where the suite's is 0 (TEST_XLA_FLAGS; another level
    named in XLA_FLAGS stays): for a test that runs its programs far longer than it compiles
    them (the planted-dictionary fits of tests/test_sae.py and tests/test_dictionaries.py, the
    longest 22.8 -> 6.2 s). Only for programs of the test's own, which no other test compiles:
    JAX's in-memory cache holds an executable whatever its level, so a program compiled before
    at level 0 stays so, and one compiled here stays at level 1 for the process's later tests.
    The persistent cache's keys hold the level."""
    from jax._src import compiler

    if TEST_XLA_FLAGS[0] not in os.environ.get("XLA_FLAGS", "").split():
        return
    options = compiler.get_compile_options

    def at_users_level(*args, **kwargs):
        built = options(*args, **kwargs)
        built.executable_build_options.debug_options.xla_backend_optimization_level = 1
        return built

    monkeypatch.setattr(compiler, "get_compile_options", at_users_level)


def xla_flags(*extra: str, base: str | None = None) -> str:
    """XLA_FLAGS for a test's subprocess: `base` (default: this process's XLA_FLAGS, which
    carry the suite's TEST_XLA_FLAGS) with `extra` flags added, and no device-count flag of the
    test process unless `extra` brings one."""
    flags = (os.environ.get("XLA_FLAGS", "") if base is None else base).split()
    flags = [f for f in flags if not f.startswith("--xla_force_host_platform_device_count")]
    return " ".join([*flags, *extra])


# `JAXILLUSIONS_TEST_COMPILES=FILE pytest ...` appends a JSON line per test to FILE (each xdist
# worker its own lines): its wall seconds and, in the test process (not in the launchers it
# starts), the XLA programs it compiled (not read from a cache), their seconds of compilation,
# of tracing and lowering, of Python's garbage collection, and of waiting for another worker to
# make a fixture made once per run (made_once) (docs/speed.md, "Where the quick suite's time
# goes").
COMPILE_REPORT = "JAXILLUSIONS_TEST_COMPILES"
_COMPILE_EVENTS = {"/jax/core/compile/backend_compile_duration": "compile_s",
                   "/jax/core/compile/jaxpr_trace_duration": "trace_s",
                   "/jax/core/compile/jaxpr_to_mlir_module_duration": "trace_s"}
_spent = {"compiles": 0, "compile_s": 0.0, "trace_s": 0.0, "gc_s": 0.0, "wait_s": 0.0}
_gc_started = [0.0]


def _time_gc(phase: str, info: dict) -> None:
    if phase == "start":
        _gc_started[0] = time.perf_counter()
    else:
        _spent["gc_s"] += time.perf_counter() - _gc_started[0]


def _count_compile(event: str, duration: float, **_) -> None:
    if event in _COMPILE_EVENTS:
        _spent[_COMPILE_EVENTS[event]] += duration
        _spent["compiles"] += event.endswith("backend_compile_duration")


# JAX lowers every program in an MLIR context of its own, and making one (its dialects loaded)
# costs about 2.5 ms, most of the tracing and lowering of an operation run eagerly, which the
# suite does thousands of times. The test processes (not the launchers they start) lower this
# many programs in turn in one context, then make a fresh one, so that what a context keeps
# (its types and attributes) stays bounded. The quick suite: 0.90-0.93x the wall time, half
# the peak memory (docs/speed.md, "The test suite").
IR_CONTEXT_PROGRAMS = 256


def _shared_ir_context(lowerings: int) -> None:
    """`jax._src.interpreters.mlir.make_ir_context` replaced by one that gives the same context
    to `lowerings` programs in turn. A program's text, and so its executable, is the one a
    context of its own gives (tests/test_scale.py checks it)."""
    from jax._src.interpreters import mlir

    make = mlir.make_ir_context
    current = [None, 0]

    def shared():
        if current[0] is None or current[1] >= lowerings:
            current[:] = [make(), 0]
        current[1] += 1
        return current[0]

    shared.fresh = make  # for the test that a shared context lowers the same text
    mlir.make_ir_context = shared


def pytest_configure(config):
    flags = os.environ.get("XLA_FLAGS", "")
    added = [f for f in TEST_XLA_FLAGS if f.split("=")[0] not in flags
             and (not f.startswith(FUSION_EMITTERS) or xla_knows(f))]
    os.environ["XLA_FLAGS"] = " ".join([flags, *added]).strip()  # before JAX starts its backend
    if os.environ.get(COMPILE_REPORT):
        import jax.monitoring
        jax.monitoring.register_event_duration_secs_listener(_count_compile)
        gc.callbacks.append(_time_gc)


def pytest_collection_finish(session):
    """The test modules imported: their heap frozen, young collections less often (as in the
    launchers: common.settle_heap)."""
    settle_heap()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """A test's line of the COMPILE_REPORT file, where one is asked for."""
    before, start = dict(_spent), time.perf_counter()
    yield
    if os.environ.get(COMPILE_REPORT):
        line = {"test": item.nodeid, "wall_s": time.perf_counter() - start,
                **{k: v - before[k] for k, v in _spent.items()}}
        with open(os.environ[COMPILE_REPORT], "a") as f:
            f.write(json.dumps(line) + "\n")


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """A test marked `fusion_emitters` checks bits that XLA:CPU's fusion emitters (the default
    users get) keep across batch shapes (a member alone and in a grid, seed chunks and one call)
    and the suite's elemental emitter does not. Under the suite's flags it runs again in a child
    pytest with the fusion emitters on (the rest of XLA_FLAGS as here), and passes, skips or
    fails as the child does. Such a test asks for a costly fixture inside its body
    (`request.getfixturevalue`), since pytest sets up the fixtures it takes as arguments in
    this process too, where nothing reads them."""
    flags = os.environ.get("XLA_FLAGS", "").split()
    if (pyfuncitem.get_closest_marker("fusion_emitters") is None
            or f"{FUSION_EMITTERS}=false" not in flags):
        return None
    xla = " ".join([*(f for f in flags if not f.startswith(FUSION_EMITTERS)),
                    f"{FUSION_EMITTERS}=true"])
    base = tempfile.mkdtemp(prefix="fusion_emitters_")
    try:
        done = child_pytest([pyfuncitem.nodeid], cwd=str(pyfuncitem.config.rootpath),
                            basetemp=f"{base}/tmp", XLA_FLAGS=xla)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    said = done.stdout[-4000:] + done.stderr[-2000:]
    if done.returncode == 0 and " skipped" in done.stdout and " passed" not in done.stdout:
        pytest.skip(f"skipped with XLA:CPU's fusion emitters:\n{said}")
    assert done.returncode == 0 and " passed" in done.stdout, \
        f"failed with XLA:CPU's fusion emitters (XLA_FLAGS={xla}):\n{said}"
    return True


def child_pytest(args: list[str], *, cwd: str, basetemp: str, timeout: int = 600,
                 **env: str) -> subprocess.CompletedProcess:
    """pytest `args` in a child process, quiet, without the cache provider or the project's
    addopts, in this process's environment with `env` set, less pytest's own variables and the
    test processes' compilation cache (the child's programs are its own). Of the installed
    plugins only pytest-timeout is loaded (the per-test limit): loading the others, and
    rewriting the asserts of their packages (hypothesis's, anyio's, ...), took 1.7 s of each
    child's start, a third of it."""
    child = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")} | env
    child.pop("JAX_COMPILATION_CACHE_DIR", None)
    child["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    return subprocess.run([sys.executable, "-m", "pytest", *args, "-p", "pytest_timeout",
                           "-p", "no:cacheprovider", "-o", "addopts=", "-q",
                           f"--basetemp={basetemp}"], cwd=cwd,
                          env=child, capture_output=True, text=True, timeout=timeout)


def pytest_collection_modifyitems(items):
    """The slow tests first (stable: otherwise in file order): xdist hands tests out in this
    order one at a time (--maxschedchunk=1 in pyproject.toml), so that the short ones at the
    end fill both workers instead of one worker running a minute-long sweep while the other has
    nothing left. (xdist's default hands each worker a quarter of its share at once: one
    worker would get every slow test.)"""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def tiny_config(cache_dir: str = ""):
    """A config small enough that a few hundred steps take seconds on a 2-core CPU."""
    config = dyck_small.get_config()
    config.cpu_devices = 0  # the test process's JAX (one CPU device unless a test says)
    config.data.num_types = 4
    config.data.max_depth = 4
    config.data.num_train = 2000
    config.data.num_eval = 64
    config.data.max_len = 16
    config.data.longer_max_len = 24
    config.data.depth_extra = 2
    config.data.cache_dir = cache_dir
    config.model.d_model = 16
    config.model.d_mlp = 32
    config.train.num_seeds = 2
    config.train.num_steps = 20
    config.train.batch_size = 16
    config.train.warmup_steps = 5
    config.train.log_every = 10
    config.train.eval_every = 10
    config.train.checkpoint_every = 10
    config.train.eval_batch_size = 64
    # One sentence per row (the demo packs its batch into half the rows): the tests of
    # packing (test_train.py) turn it on.
    config.train.rows_per_sentence = 1.0
    # The targets and ranks of the tests written before the demo left some out.
    config.proxies.targets = ("blocks.-1.attn.q", "blocks.-1.attn.k",
                              "blocks.-1.attn.q+blocks.-1.attn.k")
    config.proxies.svd_ranks = ()
    config.proxies.kmeans_sizes = (2, 4, 8)
    config.proxies.kmeans_samples = 1000
    config.proxies.kmeans_iters = 5
    config.proxies.collect_batch_size = 256
    config.proxies.eval_batch_size = 64
    # No result or activation figures (seconds a sweep): the tests that look at figures ask for
    # them (the tiny_sweep fixture, test_figures.py, test_faithfulness.py).
    config.figures = "none"
    return config


def checked(config):
    """The Settings of a test's ConfigDict, read and checked once at the door as the launchers
    and a notebook do (validate.check); the library takes Settings only."""
    from jaxillusions.pipeline import validate

    return validate.check(config)[0]


def tiny_config_file(path, cache_dir: str, settings: dict | None = None) -> str:
    """Writes a config file for the launchers (--config=path): tiny_config(cache_dir) with
    `settings` ({"train.num_steps": 20, ...}) applied. Returns the path."""
    tests = os.path.dirname(os.path.abspath(__file__))
    lines = [f"    config.{key} = {value!r}\n" for key, value in (settings or {}).items()]
    path.write_text(f"import sys\nsys.path.insert(0, {tests!r})\nfrom conftest import tiny_config"
                    f"\n\n\ndef get_config():\n    config = tiny_config({cache_dir!r})\n"
                    + "".join(lines) + "    return config\n")
    return str(path)


def _shared_compilation_cache(directory: str) -> None:
    """JAX's persistent compilation cache in `directory`, for this test process only (launched
    subprocesses keep their own settings): a program another test, or the other xdist worker,
    already compiled is loaded instead of compiled again (the same executable, so the same
    numbers; compilations are still counted by timing.Breakdown). Entries are written to a
    temporary name and renamed, so that the other worker never reads half an entry."""
    from jax._src import lru_cache

    put = lru_cache.LRUCache.put

    def put_whole(self, key, value):
        if getattr(self, "eviction_enabled", True) or not key:
            return put(self, key, value)
        path = self.path / f"{key}{lru_cache._CACHE_SUFFIX}"  # noqa: SLF001
        if not path.exists():
            temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            temporary.write_bytes(value)
            os.replace(temporary, path)
        return None

    import jax

    os.makedirs(directory, exist_ok=True)
    lru_cache.LRUCache.put = put_whole
    jax.config.update("jax_compilation_cache_dir", directory)
    if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
        # JAX keeps only programs that took a second or more to compile; most here take less.
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


@pytest.fixture(scope="session", autouse=True)
def jax_started(tmp_path_factory):
    """JAX starts before any test, as the test process has it (one CPU device unless
    JAX_NUM_CPU_DEVICES says): validate.check applies a config's cpu_devices before JAX starts,
    so the first check of a session must not lay out the devices of every test after it. From
    here on a config naming another count is refused, and configs checked in this process set
    cpu_devices = 0 (as tiny_config does). Its programs are then compiled through the run's
    compilation cache and lowered in shared MLIR contexts (`_shared_ir_context`)."""
    import jax

    # One directory for the whole run, shared by the xdist workers; $JAX_COMPILATION_CACHE_DIR
    # names one that outlives the run (then a rerun on the same machine loads what the last one
    # compiled).
    _shared_compilation_cache(os.environ.get("JAX_COMPILATION_CACHE_DIR")
                              or str(run_folder(tmp_path_factory) / "xla_cache"))
    _shared_ir_context(IR_CONTEXT_PROGRAMS)
    return jax.devices()


def run_folder(tmp_path_factory):
    """The test run's folder, shared by its xdist workers (their base temporaries are folders of
    it); without xdist, this process's base temporary."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def made_once(tmp_path_factory, name: str, make):
    """`make(directory)`'s value, made once per test session however many xdist workers ask
    for it: the first to ask makes it in a directory of the run's, under a lock, and keeps the
    value (pickled) beside it; the others wait for it and load that value. A session fixture
    is otherwise made in every worker, and a module fixture again each time a worker comes
    back to its module (the slow tests run first). Without xdist, made in a fresh directory of
    this process. For fixtures of finished sweeps, which their users read and copy to
    change."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return make(tmp_path_factory.mktemp(name))
    run = run_folder(tmp_path_factory)
    directory, value = run / name, run / f"{name}.pickle"
    with open(run / f"{name}.lock", "w") as lock:
        asked = time.perf_counter()
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        _spent["wait_s"] += time.perf_counter() - asked
        if not value.exists():
            shutil.rmtree(directory, ignore_errors=True)  # a failed attempt's leftovers
            directory.mkdir()
            made = make(directory)
            with open(f"{value}.tmp", "wb") as f:
                pickle.dump(made, f)
            os.replace(f"{value}.tmp", value)
        with open(value, "rb") as f:
            return pickle.load(f)


def finished_sweep(tmp_path_factory, name: str, config) -> str:
    """The workdir of a finished main job of `config`, or of `config(directory)` for a config
    whose files live in the fixture's directory, made once per test run (made_once)."""
    from jaxillusions.pipeline import sweep

    def make(directory):
        settings = config(directory) if callable(config) else config
        sweep.run(checked(settings), str(directory / "run"), verbose=False)
        return str(directory / "run")

    return made_once(tmp_path_factory, name, make)


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    """The tests' data cache: one for the run, shared by its xdist workers (the data cache makes
    a file once for processes that share it: the code corpus is labelled once, not per worker)."""
    directory = run_folder(tmp_path_factory) / "data_cache"
    directory.mkdir(exist_ok=True)
    return str(directory)


@pytest.fixture
def config(cache_dir):
    return tiny_config(cache_dir)


def tiny_sweep_config(cache_dir: str = ""):
    """tiny_config with fewer proxies and splits, so that a whole main job takes seconds: the SVD
    of the last layer's keys (ranks 1, 2, 4) and one-hot attention on iid, unseen_depth, longer."""
    config = tiny_config(cache_dir)
    config.proxies.methods = ("svd", "onehot_attention")
    config.proxies.targets = ("blocks.-1.attn.k",)
    config.proxies.svd_ranks = (1, 2, 4)
    config.proxies.eval_splits = ("iid", "unseen_depth", "longer")
    return config


@pytest.fixture(scope="session")
def tiny_sweep(tmp_path_factory, cache_dir) -> str:
    """The workdir of a finished main job (sweep.run) of tiny_sweep_config, shared by the whole
    session: tables, figures, TensorBoard and checkpoints. Read it; copy it to change it."""
    config = tiny_sweep_config(cache_dir)
    config.figures = "summary"  # the default; test_figures.py looks at them
    return finished_sweep(tmp_path_factory, "tiny_sweep", config)


@pytest.fixture(scope="session")
def sae_sweep(tmp_path_factory, cache_dir) -> str:
    """The workdir of a finished main job of tiny_sweep_config with SVD and the SAE proxy
    (widths 4, 8) on the last layer's keys, two heads (d_head 8), on iid and unseen_depth, the
    seed-match analysis on the first seed; shared by test_dictionaries and test_export. Read it;
    copy it to change it."""
    config = tiny_sweep_config(cache_dir)
    config.model.n_heads = 2
    config.proxies.methods = ("svd", "sae")
    config.proxies.sae_sizes = (4, 8)
    config.proxies.eval_splits = ("iid", "unseen_depth")
    config.dictionaries.match_seeds = 1
    return finished_sweep(tmp_path_factory, "sae_sweep", config)


def planted_dictionary(n: int = 4096, f: int = 16, num_dirs: int = 32, k: int = 3,
                       seed: int = 0):
    """x = 0.3 + codes @ dirs: k-sparse positive codes over num_dirs known unit directions.
    Returns (x [n, f] float32, dirs [num_dirs, f])."""
    import numpy as np

    rng = np.random.default_rng(seed)
    dirs = rng.normal(size=(num_dirs, f))
    dirs /= np.linalg.norm(dirs, axis=1, keepdims=True)
    codes = np.zeros((n, num_dirs))
    for row in codes:
        row[rng.choice(num_dirs, k, replace=False)] = rng.uniform(0.5, 2.0, k)
    return (codes @ dirs + 0.3).astype(np.float32), dirs


def trained_tiny(config):
    """(config, splits, model_cfg, params) of a 100-step sweep of a tiny config (the
    ConfigDict, which a test may change and check again)."""
    from jaxillusions.training import train

    config.train.num_steps = 100
    config.train.eval_every = 100
    config.train.learning_rate = 1e-2
    settings = checked(config)
    splits, model_cfg, _ = train.build(settings)
    state, _ = train.train_sweep(settings, splits=splits, verbose=False)
    return config, splits, model_cfg, state.params
