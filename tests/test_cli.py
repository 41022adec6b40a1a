"""The `jaxillusions` command (jaxillusions/launch/cli.py, `python -m jaxillusions`): its
subcommands, help and version, and --config by a shipped config's name or a file's path, each
bad value one line before JAX starts. The command as installed from a wheel: test_install.py."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from jaxillusions import configs
from jaxillusions.launch import cli

ROOT = Path(__file__).resolve().parent.parent


def _command(*args, cwd=ROOT, timeout=120, **variables):
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, **variables}
    return subprocess.run([sys.executable, "-m", "jaxillusions", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_the_subcommands_are_the_launchers():
    launchers = {p.stem for p in (ROOT / "jaxillusions" / "launch").glob("*.py")}
    named = {module.rsplit(".", 1)[1] for module, _ in cli.SUBCOMMANDS.values()}
    assert named == launchers - {"__init__", "common", "cli"}
    assert set(cli.SUBCOMMANDS) == {"sweep", "train", "figures", "wen-attention", "benchmark"}


def test_help_and_version_start_no_jax(tmp_path):
    proc = _command("--help", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert all(f"  {name} " in proc.stdout for name in cli.SUBCOMMANDS), proc.stdout
    assert "dyck_small" in proc.stdout and "wen_attention_variation" in proc.stdout
    proc = _command(cwd=tmp_path)  # no subcommand: the help, and a usage error's status
    assert proc.returncode == 2 and proc.stdout.startswith("usage: jaxillusions")
    proc = _command("--version", cwd=tmp_path)
    from importlib.metadata import version

    assert proc.returncode == 0 and proc.stdout.strip() == f"jaxillusions {version('jaxillusions')}"
    proc = _command("swep", "--config=dyck_small", cwd=tmp_path)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("error: jaxillusions: no subcommand 'swep'; choose from sweep,")


@pytest.mark.parametrize("args", [("jaxillusions", "--help",), ("jaxillusions", "sweep", "--help"),
                                  ("jaxillusions.launch.sweep", "--help")])
def test_help_into_a_closed_pipe_ends_quietly(args, tmp_path):
    """`jaxillusions sweep --help | head -1`: a reader that stops reading ends the command with
    SIGPIPE's status and nothing on stderr (it had printed 'error: BrokenPipeError', and
    `python -m jaxillusions.launch.sweep` a traceback)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.Popen([sys.executable, "-m", *args], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # before it writes: it starts in about a second
    assert proc.wait(timeout=120) == 141 and proc.stderr.read() == b""


@pytest.mark.parametrize("name", ["sweep", "train", "figures", "wen-attention", "benchmark"])
def test_every_subcommand_has_its_help(name, tmp_path):
    proc = _command(name, "--help", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"usage: jaxillusions {name}"), proc.stdout[:200]
    assert "--workdir" in proc.stdout or name == "benchmark"
    if name == "benchmark":
        assert "--seeds" in proc.stdout
    else:  # figures and wen-attention refuse a config, so their help offers none
        assert ("  --config:" in proc.stdout) == (name in ("sweep", "train")), proc.stdout
    if name == "wen-attention":
        assert "--variants" in proc.stdout  # the launcher's own flag, beside the shared ones
    # figures trains nothing: its help offers no --start_over, and given, it is refused (was:
    # listed, accepted and ignored)
    assert ("start_over" in proc.stdout) == (name in ("sweep", "train", "wen-attention"))
    if name == "figures":
        proc = _command(name, str(tmp_path), "--start_over", cwd=tmp_path)
        assert (proc.returncode, proc.stderr) == (1, "error: --start_over: jaxillusions figures "
                                                     "does not take it (jaxillusions figures "
                                                     "--help)\n")


def test_help_and_a_bad_value_import_no_analysis_library(tmp_path):
    # SciPy, pandas, orbax and scikit-learn (about 1.4 s of a launch's imports) are imported
    # where the work uses them, so that `--help` and a bad value's one-line error, found by
    # the config check, do not wait for them (docs/speed.md: 4.75 -> 2.68 s for such an error).
    def launch(*args):  # (what it printed on stderr, less the import times; what it imported)
        proc = _command("sweep", *args, cwd=tmp_path, PYTHONPROFILEIMPORTTIME="1")
        lines = proc.stderr.splitlines()
        times = [line for line in lines if line.startswith("import time:")]
        return proc, [line for line in lines if line not in times], {
            line.split("|")[-1].strip().split(".")[0] for line in times}

    helped, _, help_imports = launch("--help")
    assert helped.returncode == 0 and helped.stdout.startswith("usage: jaxillusions sweep")
    refused, said, refusal_imports = launch("--config=dyck_small", f"--workdir={tmp_path / 'run'}",
                                            "--config.train.num_steps=-1")
    assert refused.returncode == 1 and said[0].startswith("error: train.num_steps"), said
    for launched, imported in (("--help", help_imports), ("a bad value", refusal_imports)):
        assert "jaxillusions" in imported, launched  # the check sees the imports
        assert not imported & {"scipy", "pandas", "orbax", "sklearn"}, launched


def test_locate_names_and_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert configs.locate("dyck_small") == os.path.join(configs.FOLDER, "dyck_small.py")
    assert configs.locate("wen_attention_variation:minimal").endswith(
        os.path.join("configs", "wen_attention_variation.py:minimal"))
    (tmp_path / "mine.py").write_text("from jaxillusions.configs.dyck_small import get_config\n")
    assert configs.locate("mine.py") == "mine.py"
    monkeypatch.setenv("HOME", str(tmp_path))
    assert configs.locate("~/mine.py:x") == f"{tmp_path / 'mine.py'}:x"
    assert configs.locate(f"{tmp_path / 'mine.py'}:x") == f"{tmp_path / 'mine.py'}:x"
    (tmp_path / "plain.py").write_text("def get_config():\n    return None\n")
    assert configs.locate("plain.py") == "plain.py"
    (tmp_path / "dyck_small").mkdir()  # a folder of that name: still the shipped config
    assert configs.locate("dyck_small").startswith(configs.FOLDER)
    (tmp_path / "none.py").write_text("config = 1\n")
    (tmp_path / "broken.py").write_text("def get_config(:\n")
    for value, message in [
            ("dyck_smal", "no shipped config named 'dyck_smal'; the shipped configs: code, "),
            ("configs/dyck_small.py", "config file configs/dyck_small.py not found; the shipped "
                                      "one is named without a path: --config=dyck_small"),
            ("nope.py", "config file nope.py not found; the shipped configs: code, "),
            ("none.py", "config file none.py defines no get_config()"),
            ("broken.py", "config file broken.py does not parse as Python: "),
            ("", "--config=: give a shipped config's name"),
            # Was: "cannot load config file dyck_small:foo: TypeError: get_config() takes 0
            # positional arguments but 1 was given".
            ("dyck_small:foo", "--config=dyck_small:foo: dyck_small takes no argument (its "
                               "get_config() has no parameter); drop ':foo'"),
            ("plain.py:x", "--config=plain.py:x: plain.py takes no argument")]:
        with pytest.raises(ValueError) as err:
            configs.locate(value)
        assert str(err.value).startswith(message) and "\n" not in str(err.value), err.value
    assert set(configs.names()) >= {"dyck_small", "dyck", "code_small", "wen_contrastive"}


def test_a_config_file_of_ones_own_starts_from_a_shipped_one(tmp_path):
    # From a directory that is not the repository: the file imports the shipped config by its
    # package, the launcher adds every key at its default, and the override names a known key
    # (refused as a bad value, so that nothing runs).
    (tmp_path / "my_study.py").write_text(
        "from jaxillusions.configs import dyck_small\n\n\ndef get_config():\n"
        "    config = dyck_small.get_config()\n    config.train.num_seeds = 3\n"
        "    return config\n")
    proc = _command("train", "--config=my_study.py", "--workdir=w", "--config.train.foo=1",
                    cwd=tmp_path)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("error: unknown config key train.foo; train has: batch_size,")
    proc = _command("sweep", "--config=wen_attention_variation:bogus", "--workdir=w",
                    cwd=tmp_path)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.rstrip().endswith(
        "wen_attention_variation:bogus: expected one of ('minimal', 'standard_nope', "
        "'standard_linear')"), proc.stderr
    # An error in one's own file names the file and its line (was: a traceback for a NameError,
    # and "error: 'boom'" for a KeyError).
    (tmp_path / "broken.py").write_text(
        "from jaxillusions.configs import dyck_small\n\n\ndef get_config():\n"
        "    config = dyck_small.get_config()\n    config.train.num_seeds = num_seed\n"
        "    return config\n")
    proc = _command("sweep", "--config=broken.py", "--workdir=w", cwd=tmp_path)
    assert proc.returncode == 1 and proc.stderr == (
        "error: cannot load config file broken.py, line 6: NameError: name 'num_seed' is not "
        "defined\n"), proc.stderr
    assert not (tmp_path / "w").exists()


def test_a_config_file_loads_without_importlibs_load_module(tmp_path):
    # Python 3.15 removed importlib's load_module(), which ml-collections' loader of a config
    # file calls (was, there: "error: cannot load config file dyck_small: AttributeError:
    # 'SourceFileLoader' object has no attribute 'load_module'", for every config). Here it is
    # taken away as 3.15 has it, and the file's own value reaches the check.
    (tmp_path / "my_study.py").write_text(
        "from jaxillusions.configs import dyck_small\n\n\ndef get_config():\n"
        "    config = dyck_small.get_config()\n    config.train.num_seeds = 0\n"
        "    return config\n")
    (tmp_path / "as_315.py").write_text(
        "import importlib.abc  # (keeps its own reference)\nimport sys\n"
        "from importlib import _bootstrap_external, machinery\n\n"
        "for cls in (_bootstrap_external.FileLoader, _bootstrap_external._LoaderBasics):\n"
        "    if 'load_module' in vars(cls):  # (gone on 3.15)\n"
        "        delattr(cls, 'load_module')\n"
        "assert not hasattr(machinery.SourceFileLoader, 'load_module')\n"
        "sys.argv = ['jaxillusions', *sys.argv[1:]]\n"
        "from jaxillusions.launch.cli import main\n\nmain()\n")
    for args, value in ((["--config=my_study.py"], 0),  # the file's own value
                        (["--config=wen_attention_variation:minimal",  # a shipped one's, with
                          "--config.train.num_seeds=-1"], -1)):  # an argument, overridden
        proc = subprocess.run([sys.executable, "as_315.py", "sweep", *args, "--workdir=w"],
                              cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 1 and proc.stderr == (
            f"error: train.num_seeds={value}: must be >= 1\n"), proc.stderr
    assert not (tmp_path / "w").exists()


def test_a_leading_tilde_in_a_path_flag_is_the_home_folder(tmp_path):
    # No shell expands a '~' after '=': `--workdir=~/runs/x` made a folder named '~' in the
    # current one, and `--config=~/my.py` was "not found". The launchers expand it themselves.
    home, here = tmp_path / "home", tmp_path / "here"
    home.mkdir()
    here.mkdir()
    (home / "my_study.py").write_text("from jaxillusions.configs.dyck_small import get_config\n")
    (home / "out").mkdir()
    runs = [(["train", "--config=~/my_study.py", "--workdir=~/w", "--config.train.foo=1"],
             "error: unknown config key train.foo; "),
            (["figures", "--workdir=~/nothing"], f"error: {home / 'nothing'} is not a directory"),
            (["figures", "~/nothing"], f"error: {home / 'nothing'} is not a directory"),
            (["benchmark", "--out=~/out"], f"error: --out={home / 'out'} is a directory")]
    for args, message in runs:
        proc = _command(*args, cwd=ROOT if args[0] == "benchmark" else here, HOME=str(home))
        assert proc.returncode == 1 and proc.stderr.startswith(message), (args, proc.stderr)
    assert not list(here.iterdir()) and not (ROOT / "~").exists()


@pytest.mark.parametrize("args, message", [
    (["--config=dyck_smal"], "error: no shipped config named 'dyck_smal'; the shipped configs: "),
    (["--config=configs/dyck_small.py"], "error: config file configs/dyck_small.py not found; "
                                         "the shipped one is named without a path"),
    (["--config=dyck_small"], "error: --config and --workdir are required, e.g. "
                              "--config=dyck_small --workdir=runs/dyck_small"),
    # Was: "Unknown command line flag 'config.train.num_seeds'".
    (["--workdir=w", "--config.train.num_seeds=3"], "error: --config.train.num_seeds: a config "
     "override needs --config, e.g. --config=dyck_small --config.train.num_seeds=VALUE"),
])
def test_a_bad_config_value_is_one_line_before_jax_starts(args, message, tmp_path):
    proc = _command("train", *args, cwd=tmp_path, timeout=60)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(message), proc.stderr


@pytest.mark.parametrize("args, message", [
    # Was: ignored, and the config run as shipped (96 seeds of wen_contrastive for 6 minutes).
    (["sweep", "--config=dyck_small", "--workdir=w", "config.train.num_seeds=2"],
     "error: unexpected argument 'config.train.num_seeds=2' (a flag starts with --: "
     "--config.train.num_seeds=2); jaxillusions sweep takes flags only"),
    (["train", "--config=dyck_small", "--workdir=w", "w2"], "error: unexpected argument 'w2'; "
     "jaxillusions train takes flags only (jaxillusions train --help)"),
    (["wen-attention", "--workdir=w", "minimal"], "error: unexpected argument 'minimal'; "
     "jaxillusions wen-attention takes flags only"),
    # Both names of a renamed key given: the new one at its default had counted as unset.
    (["sweep", "--config=dyck_small", "--workdir=w", "--config.proxies.geometry=True",
      "--config.geometry.enabled=False"], "error: proxies.geometry=True and "
     "geometry.enabled=False: proxies.geometry is the old name of geometry.enabled; set "
     "geometry.enabled only")])
def test_a_stray_argument_is_one_line_before_any_work(args, message, tmp_path):
    proc = _command(*args, cwd=tmp_path, timeout=60)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(message), proc.stderr
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("variable, value, start, end", [
    # Was: the Quickstart's job trained, then failed in k-means' fit with a TypeError from
    # lax.scan (the other settings of machine.REQUIRED_JAX_CONFIG: tests/test_settings.py).
    ("JAX_ENABLE_X64", "1", "error: JAX_ENABLE_X64=True (JAX's jax_enable_x64): the code "
     "computes in 32 bits", "jax.config.update('jax_enable_x64', False) before the run"),
    # Was: JAX's own error, then a second traceback from the launcher's error handler, which
    # asked JAX for its process count (`cuda` on a CPU-only install: JAX's AssertionError).
    ("JAX_PLATFORMS", "nosuchplatform", "error: JAX could not start: RuntimeError: Unable to "
     "initialize backend 'nosuchplatform'", "JAX_PLATFORMS=nosuchplatform names the platforms "
     "JAX may start: unset it, or name one this install has (cpu)"),
    # Was: a traceback from JAX's import, before the launcher could say anything.
    ("JAX_NUM_CPU_DEVICES", "abc", 'error: ValueError: Invalid value "abc" for JAX flag '
     "jax_num_cpu_devices", "(--debug shows the traceback)"),
    # Was: "unset the variable, or set --config.cpu_devices=0", a config that would not help.
    ("JAX_NUM_CPU_DEVICES", "0", "error: JAX_NUM_CPU_DEVICES=0 is not a device count (1 or "
     "more)", "unset it, or set it to 2 as cpu_devices does")],
    ids=["x64", "platform", "devices-abc", "devices-0"])
def test_a_bad_jax_environment_is_one_line_before_any_work(variable, value, start, end,
                                                           tmp_path):
    proc = _command("sweep", "--config=dyck_small", "--workdir=w", cwd=tmp_path,
                    **{variable: value})
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(start) and proc.stderr.rstrip().endswith(end), proc.stderr
    assert not (tmp_path / "w").exists()
    if variable == "JAX_ENABLE_X64":  # as docs/reliability.md shows it
        assert f"\n{proc.stderr}" in (ROOT / "docs" / "reliability.md").read_text()


def test_benchmark_outside_a_clone_is_one_line(tmp_path, monkeypatch):
    # Installed from a wheel there is no benchmarks/ folder: the subcommand says it needs a
    # clone (test_install.py runs it so); here the clone is hidden from the launcher.
    import importlib

    from jaxillusions.launch import benchmark

    real = importlib.import_module

    def no_benchmarks(name, *args):
        if name.split(".")[0] == "benchmarks":
            raise ModuleNotFoundError(f"No module named {name!r}", name="benchmarks")
        return real(name, *args)

    monkeypatch.setattr(importlib, "import_module", no_benchmarks)
    monkeypatch.setattr(benchmark, "__file__", str(tmp_path / "lib" / "launch" / "benchmark.py"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as err:
        benchmark.load_suite()
    assert err.value.code == benchmark.NEEDS_CLONE
    assert str(err.value.code).startswith("error: jaxillusions benchmark needs a clone of the "
                                          "repository")


@pytest.mark.parametrize("args, message", [
    # Was: "workdir  cannot be written: No such file or directory", after the config's checks.
    (["sweep", "--config=dyck_small", "--workdir="], "error: flag --workdir=: an empty path"),
    (["figures", ""], "error: the workdir is an empty path (jaxillusions figures WORKDIR"),
    # Was: "No such file or directory: .tmp29516".
    (["benchmark", "--out="], "error: --out= is empty; give the JSON file to write"),
])
def test_an_empty_path_is_one_line(args, message, tmp_path):
    proc = _command(*args, cwd=ROOT if args[0] == "benchmark" else tmp_path, timeout=60)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(message), proc.stderr
    assert not list(tmp_path.iterdir())


def test_a_config_file_that_returns_no_config_is_one_line(tmp_path):
    # Was: "--config and --workdir are required" (None), or "'int' object has no attribute".
    for value, name in (("None", "None"), ("3", "int")):
        (tmp_path / "mine.py").write_text(f"def get_config():\n    return {value}\n")
        proc = _command("sweep", "--config=mine.py", "--workdir=w", cwd=tmp_path, timeout=60)
        assert proc.returncode == 1 and proc.stderr == (
            f"error: config file mine.py: get_config() returned {name}; it should return a "
            "ConfigDict\n"), proc.stderr
        assert not (tmp_path / "w").exists()


def test_a_config_file_that_returns_a_dict_takes_every_override(tmp_path):
    # Was: a key the dict leaves out could not be overridden ("unknown config key
    # train.num_steps; train has: num_seeds"), and a section it lacks gave "error: 'model'".
    (tmp_path / "mine.py").write_text("def get_config():\n"
                                      "    return {'train': {'num_seeds': 2}}\n")
    for override, message in (("--config.train.num_steps=0", "train.num_steps=0: must be >= 1"),
                              ("--config.model.d_model=0", "model.d_model=0: must be >= 1")):
        proc = _command("sweep", "--config=mine.py", "--workdir=w", override, cwd=tmp_path,
                        timeout=60)
        assert (proc.returncode, proc.stderr) == (1, f"error: {message}\n"), proc.stderr
    assert not (tmp_path / "w").exists()
