"""The package as a user installs it: a wheel built from the repository's files, installed into a
fresh virtual environment, and the `jaxillusions` command run from an empty directory, where
nothing of the clone can be imported. The shipped configs travel in the wheel
(`--config=dyck_small`); the benchmarks do not (`jaxillusions benchmark` says it needs a clone).

Offline: the wheel is built without build isolation (setuptools of this environment) and
installed without its dependencies, which the new environment reads from this one's
site-packages through a .pth file (`venv --system-site-packages` would give the base
interpreter's, not this environment's). By hand, the same steps:

    pip wheel --no-deps --no-build-isolation . -w /tmp/dist
    python -m venv --without-pip /tmp/venv
    python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' \\
        > /tmp/venv/lib/python3.11/site-packages/_parent_env.pth
    pip --python /tmp/venv/bin/python install --no-deps --no-index /tmp/dist/*.whl
    cd "$(mktemp -d)" && /tmp/venv/bin/jaxillusions sweep --config=dyck_small --workdir=w ...
"""

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from conftest import xla_flags

ROOT = Path(__file__).resolve().parent.parent

# The tests' tiny run (conftest.tiny_config) as overrides of the shipped demo config; its summary
# figures are drawn, as the Quickstart's are (in a helper process of the installed interpreter).
TINY = {"cpu_devices": 0, "data.num_types": 4, "data.max_depth": 4, "data.num_train": 2000,
        "data.num_eval": 64, "data.max_len": 16, "data.longer_max_len": 24,
        "data.depth_extra": 2, "model.d_model": 16, "model.d_mlp": 32, "train.num_seeds": 2,
        "train.num_steps": 20, "train.batch_size": 16, "train.warmup_steps": 5,
        "train.log_every": 10, "train.eval_every": 10, "train.checkpoint_every": 10,
        "train.eval_batch_size": 64, "proxies.svd_ranks": "(1,2)", "proxies.kmeans_sizes": "(2,4)",
        "proxies.kmeans_samples": 1000, "proxies.kmeans_iters": 5,
        "proxies.collect_batch_size": 256, "proxies.eval_batch_size": 64}


def _run(cmd, cwd, env=None, timeout=600):
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(the new environment's bin folder, an empty directory): the wheel installed there."""
    if shutil.which("pip") is None and subprocess.run(
            [sys.executable, "-m", "pip", "--version"], capture_output=True).returncode:
        pytest.skip("pip is not available")
    import importlib.util

    if importlib.util.find_spec("setuptools") is None:
        pytest.skip("setuptools is not installed (the wheel is built without build isolation)")
    base = tmp_path_factory.mktemp("install")
    source = base / "source"  # the files a wheel is built from (no build/ in the clone)
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "jaxillusions", source / "jaxillusions",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
          source, "-w", base / "dist"], cwd=base)
    (wheel,) = (base / "dist").glob("jaxillusions-*.whl")
    venv = base / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=base)
    python = venv / "bin" / "python"
    site = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                cwd=base).stdout.strip()
    parent = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    Path(site, "_parent_env.pth").write_text("\n".join(parent) + "\n")
    _run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index",
          "-q", wheel], cwd=base)
    empty = base / "empty"
    empty.mkdir()
    return venv / "bin", empty


def _env(tmp_path) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV") and not k.startswith("JAX_")}
    return {**env, "XLA_FLAGS": xla_flags(), "JAXILLUSIONS_CACHE": str(tmp_path / "cache")}


@pytest.mark.slow
def test_the_wheel_installs_the_command_and_the_configs(installed, tmp_path):
    bin_dir, empty = installed
    env = _env(tmp_path)
    where = _run([bin_dir / "python", "-c", "import jaxillusions; print(jaxillusions.__file__)"],
                 cwd=empty, env=env).stdout.strip()
    assert where.startswith(str(bin_dir.parent)), where  # the wheel's copy, not the clone
    assert _run([bin_dir / "jaxillusions", "--version"], cwd=empty,
                env=env).stdout.strip() == "jaxillusions 0.1.0"
    assert "dyck_small" in _run([bin_dir / "python", "-m", "jaxillusions", "--help"], cwd=empty,
                                env=env).stdout
    proc = subprocess.run([bin_dir / "jaxillusions", "benchmark"], cwd=empty, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("error: jaxillusions benchmark needs a clone of the "
                                  "repository"), proc.stderr


@pytest.mark.slow
def test_a_tiny_sweep_through_the_installed_command(installed, tmp_path):
    bin_dir, empty = installed
    workdir = empty / "w"
    proc = _run([bin_dir / "jaxillusions", "sweep", "--config=dyck_small", "--workdir=w",
                 *(f"--config.{key}={value}" for key, value in TINY.items())],
                cwd=empty, env=_env(tmp_path), timeout=900)
    assert (workdir / "results.csv").stat().st_size > 0, proc.stdout[-2000:]
    assert (workdir / "sweep_done.json").exists()
    assert len(list((workdir / "figures").glob("*.png"))) >= 4
    assert "time " in proc.stdout.splitlines()[-1]  # the job's last line
    shutil.rmtree(workdir)
