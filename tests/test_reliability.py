"""Runs that survive preemption and bad input: checkpoint recovery, analysis keys that
may change on resume, validation before any work, signals, TensorBoard after a resume, the workdir
lock, all seeds diverged, stage-by-stage resume of the main job, one-line launcher errors.

Trained tiny runs are shared through module-scoped fixtures; each test works on a copy.
"""

import dataclasses
import errno
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import types
import warnings
from pathlib import Path

import jax
import numpy as np
import pytest
from conftest import checked, tiny_config, tiny_config_file, xla_flags

from jaxillusions.faithfulness.specs import specs_from_config
from jaxillusions.pipeline import reports, sweep, validate
from jaxillusions.report import drawing
from jaxillusions.runtime import checkpoint, interrupt, machine, stages
from jaxillusions.runtime import tensorboard as log_lib
from jaxillusions.training import train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config(cache_dir):
    config = tiny_config(cache_dir)
    config.train.log_every = 5
    return config


def _leaves(tree):
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def _assert_same(a, b):
    for x, y in zip(_leaves(a), _leaves(b), strict=True):
        np.testing.assert_array_equal(x, y)


def _logged_steps(workdir, run="seed_0", tag="train/loss"):
    return [s for s, _ in log_lib.read_scalars(os.path.join(workdir, "tensorboard"))[run][tag]]


def _listing(path):
    return sorted((os.path.relpath(os.path.join(d, f), path), os.path.getsize(os.path.join(d, f)),
                   os.path.getmtime(os.path.join(d, f)))
                  for d, _, files in os.walk(path) for f in files)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, cache_dir):
    """A finished 20-step run (checkpoints 10 and 20), the TensorBoard steps on disk at each
    checkpoint save, and the final state."""
    config = _config(cache_dir)
    splits, _, _ = train.build(checked(config))
    workdir = str(tmp_path_factory.mktemp("trained") / "run")
    on_disk_at_save = {}
    save = checkpoint.Checkpointer.save

    def save_and_look(self, step, state):
        save(self, step, state)
        on_disk_at_save[step] = max(_logged_steps(workdir))

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(checkpoint.Checkpointer, "save", save_and_look)
        state, _ = train.train_sweep(checked(config), workdir, splits=splits, verbose=False)
    return {"config": config, "splits": splits, "workdir": workdir, "state": state,
            "on_disk_at_save": on_disk_at_save}


def _copy(trained, tmp_path):
    workdir = str(tmp_path / "run")
    shutil.copytree(trained["workdir"], workdir)
    return workdir


def _resume(trained, workdir, **kwargs):
    return train.train_sweep(checked(trained["config"]), workdir, splits=trained["splits"],
                             **kwargs)[0]


# ---------------------------------------------------------------------------------------------
# 1, 2: checkpoint recovery.


@pytest.mark.slow
def test_broken_newest_checkpoint_falls_back_to_the_older_one(trained, tmp_path, capsys):
    # Was: checkpoints 20 and 10 both moved aside ("Must provide `args` of type `Composite`"),
    # the next relaunch trained from 0. Now a fresh manager restores 10.
    workdir = _copy(trained, tmp_path)
    assert _logged_steps(workdir) == [5, 10, 15, 20]
    shutil.rmtree(os.path.join(workdir, "checkpoints", "20", "default"))
    state = _resume(trained, workdir)
    out = capsys.readouterr().out
    assert "checkpoint 20" in out and "unreadable" in out
    assert "resumed from checkpoint at step 10" in out
    assert [n.split("-")[0] for n in os.listdir(os.path.join(workdir, "corrupt_checkpoints"))] \
        == ["20"]
    _assert_same(state, trained["state"])
    # Steps 15 and 20 of the stopped run are superseded by the resumed run's: none twice.
    assert _logged_steps(workdir) == [5, 10, 15, 20]


@pytest.mark.parametrize("damage", ["swap_contents", "flip_byte"])
def test_corrupt_bytes_are_detected(trained, tmp_path, capsys, damage):
    workdir = _copy(trained, tmp_path)
    newest = os.path.join(workdir, "checkpoints", "20", "default")
    if damage == "swap_contents":
        # Well-formed arrays with other values (those of step 10): only the checksums tell.
        shutil.rmtree(newest)
        shutil.copytree(os.path.join(workdir, "checkpoints", "10", "default"), newest)
    else:
        _flip_a_byte(newest)
    state = _resume(trained, workdir)
    out = capsys.readouterr().out
    assert "resumed from checkpoint at step 10" in out
    if damage == "swap_contents":
        assert "checksum" in out
    _assert_same(state, trained["state"])


def _flip_a_byte(step_dir):
    data = [os.path.join(d, f) for d, _, fs in os.walk(step_dir) for f in fs
            if os.sep + "d" + os.sep in os.path.join(d, f)]
    biggest = max(data, key=os.path.getsize)
    raw = bytearray(open(biggest, "rb").read())
    raw[len(raw) // 2] ^= 0xFF
    open(biggest, "wb").write(bytes(raw))


def test_a_checkpoint_killed_before_its_checksums_is_incomplete(trained, tmp_path, capsys):
    # Was: restored "without verification"; with damaged bytes the run trained on from them
    # ("seed 0 diverged", 111 of 113 leaves different from the uninterrupted run). A kill
    # between orbax's commit of step 20 and its checksums.json leaves step 20 without them;
    # then its data is damaged. The run falls back to step 10 and ends bit-identical.
    workdir = _copy(trained, tmp_path)
    newest = os.path.join(workdir, "checkpoints", "20")
    os.remove(os.path.join(newest, checkpoint.CHECKSUM_FILE))
    _flip_a_byte(os.path.join(newest, "default"))
    state = _resume(trained, workdir)
    out = capsys.readouterr().out
    assert "checkpoint 20" in out and f"incomplete: no {checkpoint.CHECKSUM_FILE}" in out, out
    assert "resumed from checkpoint at step 10" in out and "without verification" not in out
    _assert_same(state, trained["state"])
    assert [n.split("-")[0] for n in os.listdir(os.path.join(workdir, "corrupt_checkpoints"))] \
        == ["20"]
    assert checkpoint.Checkpointer(os.path.join(workdir, "checkpoints")).committed(20)


def test_a_half_deleted_older_checkpoint_is_moved_aside(trained, tmp_path, capsys):
    # Was: a kill during orbax's removal of an old step left 10/ with only default/; it stayed,
    # logging "Metadata file does not exist" at every launch. It is moved aside once the newer
    # checkpoint restores.
    workdir = _copy(trained, tmp_path)
    older = os.path.join(workdir, "checkpoints", "10")
    for name in os.listdir(older):
        if name != "default":
            os.remove(os.path.join(older, name))
    state = _resume(trained, workdir, stop_at_step=20)
    out = capsys.readouterr().out
    assert "resumed from checkpoint at step 20" in out
    assert "checkpoint 10" in out and "incomplete" in out, out
    _assert_same(state, trained["state"])
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["20"]
    assert [n.split("-")[0] for n in os.listdir(os.path.join(workdir, "corrupt_checkpoints"))] \
        == ["10"]


def test_a_truncated_checkpoint_warning_keeps_the_whole_reason(trained, tmp_path, capsys,
                                                               monkeypatch):
    # Was: the reason cut at 200 characters, mid-sentence ("Requested byte range ... is ").
    # And before it a screenful of "RuntimeError: Event loop is closed" tracebacks: the reads
    # still in flight when the restore failed, handing their results to orbax's closed loop.
    workdir = _copy(trained, tmp_path)
    data = [os.path.join(d, f) for d, _, fs in os.walk(os.path.join(workdir, "checkpoints", "20"))
            for f in fs if os.sep + "d" + os.sep in os.path.join(d, f)]
    biggest = max(data, key=os.path.getsize)
    os.truncate(biggest, 100)
    printed = []  # what Python would print as tracebacks with no owner
    monkeypatch.setattr(sys, "unraisablehook", printed.append)
    _resume(trained, workdir)
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("WARNING")]
    reason = line.split("is unreadable (", 1)[1].rsplit("); moved to", 1)[0]
    assert "Requested byte range" in reason and "not valid for value of size" in reason, line
    assert printed == [], [f"{type(u.exc_value).__name__}: {u.exc_value}" for u in printed]
    other = types.SimpleNamespace(object=None, exc_value=RuntimeError("Event loop is closed"),
                                  exc_traceback=None)  # not raised in call_soon_threadsafe
    sys.unraisablehook(other)
    assert printed == [other]  # any other error still reaches the hook


def test_checkpoint_of_another_model_is_refused_and_nothing_is_moved(trained, tmp_path):
    # Was: every checkpoint moved to corrupt_checkpoints/ and training restarted from 0.
    workdir = _copy(trained, tmp_path)
    before = _listing(os.path.join(workdir, "checkpoints"))
    trained["config"].model.d_model = 24
    try:
        # config.json agrees (as after a code change to the model's shapes): the checkpoint not.
        with open(os.path.join(workdir, checkpoint.CONFIG_FILE), "w") as f:
            json.dump(validate.parse(trained["config"]).to_dict(), f)
        with pytest.raises(checkpoint.CheckpointMismatch,
                           match=r"params\.blocks\.0\.attn\.b_o: checkpoint \(2, 16\) float32 "
                                 r"vs config \(2, 24\) float32"):
            train.train_sweep(checked(trained["config"]), workdir, verbose=False)
    finally:
        trained["config"].model.d_model = 16
    assert _listing(os.path.join(workdir, "checkpoints")) == before
    assert not os.path.exists(os.path.join(workdir, "corrupt_checkpoints"))


def test_no_restorable_checkpoint_is_refused_unless_start_over(trained, tmp_path):
    # Was: silently trained from step 0 and exited 0.
    workdir = _copy(trained, tmp_path)
    for step in ("10", "20"):
        for d, _, files in os.walk(os.path.join(workdir, "checkpoints", step, "default")):
            for f in files:
                open(os.path.join(d, f), "wb").write(b"garbage")
    before = _listing(os.path.join(workdir, "checkpoints"))
    with pytest.raises(ValueError,
                       match=r"none of the checkpoints .* \(steps 20, 10\) .*--start_over"):
        _resume(trained, workdir, verbose=False)
    assert _listing(os.path.join(workdir, "checkpoints")) == before
    state = _resume(trained, workdir, verbose=False, start_over=True)
    assert sorted(n.split("-")[0] for n in
                  os.listdir(os.path.join(workdir, "corrupt_checkpoints"))) == ["10", "20"]
    _assert_same(state, trained["state"])


# ---------------------------------------------------------------------------------------------
# 3: analysis keys may change on resume, training keys may not.


def _history(workdir):
    with open(os.path.join(workdir, checkpoint.HISTORY_FILE)) as f:
        return [json.loads(line) for line in f]


def test_analysis_keys_may_change_on_resume_and_are_recorded(trained, tmp_path, capsys):
    workdir = _copy(trained, tmp_path)
    config = _config(trained["config"].data.cache_dir)
    config.proxies.eval_batch_size = 32
    config.train.eval_batch_size = 32
    state = train.train_sweep(checked(config), workdir, splits=trained["splits"])[0]
    assert "proxies.eval_batch_size changed from 64 to 32" in capsys.readouterr().out
    _assert_same(state, trained["state"])
    assert _history(workdir)[-1]["changes"] == {"proxies.eval_batch_size": [64, 32],
                                                "train.eval_batch_size": [64, 32]}
    with open(os.path.join(workdir, checkpoint.CONFIG_FILE)) as f:
        assert json.load(f)["proxies"]["eval_batch_size"] == 32
    config.train.learning_rate = 1e-3
    with pytest.raises(ValueError, match="train.learning_rate: 0.003 there vs 0.001 now"):
        train.train_sweep(checked(config), workdir, splits=trained["splits"], verbose=False)
    assert validate.parse({}).is_analysis_key("proxies.kmeans_sizes")
    assert not validate.parse({}).is_analysis_key("model.d_model")


def test_a_relaunch_on_another_machine_is_noted_and_recorded(trained, tmp_path, capsys,
                                                             monkeypatch):
    # Was: a run resumed on another CPU model or jax version went on without a word, so its
    # numbers mixed two machines' rounding and nothing in the workdir said which machine
    # either was.
    workdir = _copy(trained, tmp_path)
    here = machine.describe()
    assert _history(workdir)[0]["machine"] == here  # the run that trained it, in this process
    assert here["cpu"] == machine.cpu_model() and here["jax"] == jax.__version__
    assert here["devices"] == f"{jax.device_count()} x {jax.devices()[0].device_kind}"
    assert here["matmul_precision"] == "default"
    _resume(trained, workdir, verbose=True)
    assert "another machine" not in capsys.readouterr().out
    assert len(_history(workdir)) == 1  # the same machine: nothing new
    # (Not a real CPU's name: one would be this machine's on that CPU, and then no change.)
    elsewhere = {**here, "cpu": "Test CPU, family 0 model 0", "jax": "0.9.0"}
    monkeypatch.setattr(machine, "describe", lambda: elsewhere)
    state = _resume(trained, workdir, verbose=True)
    notes = [line for line in capsys.readouterr().out.splitlines() if "another machine" in line]
    assert notes == [
        f"note: this workdir last ran on another machine (cpu: {here['cpu']} -> Test CPU, "
        f"family 0 model 0; jax: {here['jax']} -> 0.9.0): what it trains or computes from here "
        "rounds as this machine does, so its last bits differ from a run on one machine "
        f"(recorded in {checkpoint.HISTORY_FILE}; docs/reliability.md, Reproducibility)"]
    assert [r["event"] for r in _history(workdir)] == ["created", "machine"]
    assert _history(workdir)[-1]["machine"] == elsewhere
    _assert_same(state, trained["state"])  # a note, not a refusal: the checkpoint is kept
    _resume(trained, workdir, verbose=True)  # again there: nothing new
    assert "another machine" not in capsys.readouterr().out
    assert len(_history(workdir)) == 2


def test_a_workdir_from_before_the_machine_record_gets_one_without_a_note(tmp_path):
    config = checked(_config(str(tmp_path / "data")))
    workdir = str(tmp_path / "run")
    checkpoint.claim_workdir(workdir, config)  # no machine: as before the record
    with open(os.path.join(workdir, checkpoint.HISTORY_FILE), "a") as f:
        f.write('{"torn": \n')  # a torn line is skipped, not an error
    a = {"cpu": "A", "devices": "1 x cpu", "jax": "1", "jaxlib": "1", "xla_flags": ""}
    assert checkpoint.claim_workdir(workdir, config, machine=a) == []
    assert checkpoint.claim_workdir(workdir, config, machine=a) == []
    assert checkpoint.claim_workdir(workdir, config, machine=a, record=False) == []
    notes = checkpoint.claim_workdir(workdir, config, machine={**a, "xla_flags": "--x=1"})
    assert len(notes) == 1 and "(xla_flags: (none) -> --x=1)" in notes[0]
    # An entry the last record predates (the matmul precision) is added without a note; a
    # change of it, once recorded, is noted.
    b = {**a, "xla_flags": "--x=1", "matmul_precision": "default"}
    assert checkpoint.claim_workdir(workdir, config, machine=b) == []
    notes = checkpoint.claim_workdir(workdir, config, machine={**b, "matmul_precision": "highest"})
    assert len(notes) == 1 and "(matmul_precision: default -> highest)" in notes[0]
    # The flags as they take effect: the same ones in another order are the same machine.
    assert machine.flags("--b=2 --x=0  --a --x=1") == "--a --b=2 --x=1"
    assert machine.flags("--x=1 --b=2 --a") == machine.flags("--a --b=2 --x=1")
    with open(os.path.join(workdir, checkpoint.HISTORY_FILE)) as f:
        machines = [json.loads(line).get("machine") for line in f if "torn" not in line]
    assert machines == [None, a, {**a, "xla_flags": "--x=1"}, b,
                        {**b, "matmul_precision": "highest"}]


def test_cpu_model_names_the_family_and_model(monkeypatch):
    """The CPU's name tells apart generations that share a model name (lscpu says "AMD EPYC" on
    three of them): the family and model numbers follow the name; without them, the name alone;
    without lscpu, /proc/cpuinfo's fields."""
    lscpu = ("Architecture:  x86_64\nModel name:   AMD EPYC\nBIOS Model name: pc\n"
             "CPU family:    25\nModel:         17\nStepping:  1\n")

    def run_lscpu(*args, **kwargs):
        return subprocess.CompletedProcess(args, 0, stdout=lscpu)

    monkeypatch.setattr(machine.subprocess, "run", run_lscpu)
    assert machine.cpu_model() == "AMD EPYC, family 25 model 17"
    lscpu = "Model name:   Intel(R) Xeon(R) Processor\n"
    assert machine.cpu_model() == "Intel(R) Xeon(R) Processor"

    def no_lscpu(*args, **kwargs):
        raise FileNotFoundError("lscpu")

    cpuinfo = ("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\nmodel\t\t: 2\n"
               "model name\t: AMD EPYC\n\nprocessor\t: 1\ncpu family\t: 99\nmodel\t\t: 9\n")
    monkeypatch.setattr(machine.subprocess, "run", no_lscpu)
    monkeypatch.setattr(machine, "_read", lambda path: cpuinfo if path == "/proc/cpuinfo" else "")
    assert machine.cpu_model() == "AMD EPYC, family 26 model 2"


@pytest.mark.parametrize("damage", ["missing", "garbage", "a_list"])
def test_checkpoints_without_a_readable_config_json_are_refused(trained, tmp_path, damage):
    # Was (missing): `train --config.train.learning_rate=0.001` resumed a run trained at
    # 0.003 and wrote 0.001 into config.json for the whole run; (garbage) "JSONDecodeError:
    # Expecting value", naming no file; (a list) "AttributeError: 'list' object has no ...".
    workdir = _copy(trained, tmp_path)
    path = os.path.join(workdir, checkpoint.CONFIG_FILE)
    if damage == "missing":
        os.remove(path)
    else:
        Path(path).write_text("{\"train\": {\"learning" if damage == "garbage" else "[1]")
    before = _listing(workdir)
    config = _config(trained["config"].data.cache_dir)
    config.train.learning_rate = 1e-3
    expected = {"missing": f"{path} is missing, but {workdir}/checkpoints holds checkpoints",
                "garbage": f"{path} is unreadable (JSONDecodeError: ",
                "a_list": f"{path} is unreadable (valid JSON, but a list, not a config)"}
    for run in (lambda: train.train_sweep(checked(config), workdir, splits=trained["splits"]),
                lambda: sweep.run(checked(config), workdir)):
        with pytest.raises(ValueError) as err:
            run()
        assert str(err.value).startswith(expected[damage]) and "\n" not in str(err.value)
    assert _listing(workdir) == before  # nothing trained, written or moved


# ---------------------------------------------------------------------------------------------
# 4: validation of the whole config, before any work.


@pytest.mark.parametrize("key, value, message", [
    ("proxies.svd_ranks", ("abc",), "proxies.svd_ranks=('abc',): must be a tuple of integers"),
    ("proxies.svd_ranks", (0, 2), "proxies.svd_ranks=(0, 2): must be ranks >= 1"),
    ("proxies.svd_ranks", (-1,), "must be ranks >= 1"),
    ("proxies.svd_ranks", (4, 64), "ranks [64] exceed the dimension 16 of blocks.1.attn.q"),
    ("proxies.kmeans_sizes", (0, 2), "proxies.kmeans_sizes=(0, 2): must be cluster counts >= 1"),
    ("proxies.kmeans_sizes", (2, 5000), "k [5000] exceed proxies.kmeans_samples=1000"),
    ("proxies.kmeans_samples", 0, "proxies.kmeans_samples=0: must be >= 1"),
    ("proxies.pattern_site", "blocks.1.attn.k", "must be an attention pattern site"),
    ("proxies.pattern_site", "blocks.7.attn.pattern", "unknown activation site"),
    ("proxies.targets", ("blocks.-1.attn.q+blocks.0.mlp.nope",), "proxies.targets: unknown"),
    ("proxies.methods", ("svd", "lasso"),
     "unknown method 'lasso'; available: circuit, erasure, kmeans"),
    ("proxies.eval_splits", ("longer",), "must include 'iid'"),
    ("proxies.eval_splits", ("iid", "ood"), "unknown split 'ood'"),
    ("train.learning_rate", float("nan"), "train.learning_rate=nan: must be a finite number"),
    ("train.learning_rate", 1e300,  # finite, but inf once float32 as the run computes it
     "train.learning_rate=1e+300: 1e+300 is past float32's range (|x| <= 3.4e+38)"),
    ("train.weight_decays", (0.1, -1e39), "train.weight_decays=(0.1, -1e+39): -1e+39 is past"),
    ("train.num_seeds", 0, "train.num_seeds=0: must be >= 1"),
    ("model.pos_encoding", "rope", "model.pos_encoding='rope': must be one of"),
    ("data.max_len", 9, "data.max_len must be >= 2*(max_depth+1)"),
])
def test_bad_settings_are_one_line_errors(config, key, value, message):
    section, name = key.split(".")
    config[section][name] = value
    with pytest.raises(ValueError) as err:
        validate.validate(config)
    assert message in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_unknown_key_and_duplicate_sizes(config):
    with config.unlocked():
        config.train.foo = 1
    with pytest.raises(ValueError, match="unknown config key train.foo; allowed in train: "
                                         "batch_size, checkpoint_every"):
        validate.validate(config)
    config = tiny_config(config.data.cache_dir)
    config.proxies.kmeans_sizes = (8, 2, 4, 2)  # each value once, as in every tuple setting
    with pytest.raises(ValueError, match=r"^proxies.kmeans_sizes=\(8, 2, 4, 2\): 2 is given "
                       "twice; give each value once$"):
        validate.validate(config)
    config.proxies.kmeans_sizes = (8, 2, 4)
    _, model_cfg, _ = train.build(checked(config))
    specs = specs_from_config(config.proxies, model_cfg)
    assert {s.sizes for s in specs if s.method == "kmeans"} == {(2, 4, 8)}  # sorted


def test_shipped_configs_validate(monkeypatch):
    import importlib
    import pkgutil

    from jaxillusions import configs
    from jaxillusions.training import memory

    check = memory.check_config
    for info in pkgutil.iter_modules(configs.__path__):
        module = importlib.import_module(f"jaxillusions.configs.{info.name}")
        if getattr(module, "TEMPLATE", False):  # the user's paths (the door names them)
            continue
        config = module.get_config()
        config.cpu_devices = 0  # the test process's devices (conftest.jax_started)
        try:
            assert validate.validate(config) == [], info.name
        except ValueError as err:  # a GPU config on a smaller machine: only the memory plan
            assert "more than this machine's" in str(err), (info.name, str(err))
            monkeypatch.setattr(memory, "check_config", lambda *a: None)
            assert validate.validate(config) == [], info.name
            monkeypatch.setattr(memory, "check_config", check)


def test_more_cpu_devices_than_cores_is_a_one_line_warning(monkeypatch):
    # Was: cpu_devices=1000 on a 2-core machine accepted without a word, training 400x slower.
    from jaxillusions.runtime import distributed

    jax.devices()  # JAX has started: use_cpu_devices can no longer change this process
    monkeypatch.delenv("JAX_NUM_CPU_DEVICES", raising=False)
    monkeypatch.setattr(distributed, "cpu_cores", lambda: 2)
    running = jax.local_device_count()
    with pytest.warns(UserWarning) as warned, pytest.raises(ValueError, match="already runs"):
        distributed.use_cpu_devices(running + 1000)
    (line,) = [str(w.message) for w in warned]
    assert line.startswith(f"cpu_devices={running + 1000} is more than the 2 CPU core(s) this "
                           "process may use") and "\n" not in line
    assert "--config.cpu_devices=2 or 0 runs at full speed" in line
    monkeypatch.setattr(distributed, "cpu_cores", lambda: running)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # as many devices as cores: no warning
        distributed.use_cpu_devices(running)


# ---------------------------------------------------------------------------------------------
# 5, 6: signals and TensorBoard.


def test_tensorboard_is_on_disk_at_every_checkpoint(trained):
    # Was: buffered up to 60 s, so a kill lost up to a minute of curves for good.
    assert trained["on_disk_at_save"] == {10: 10, 20: 20}


def _config_file(tmp_path, cache_dir, steps=20):
    return tiny_config_file(tmp_path / "tiny_config.py", cache_dir, {
        "train.num_steps": steps, "train.log_every": 1, "train.eval_every": 0,
        "train.checkpoint_every": 0})


def _launch(module, config_file, workdir, *args, **kwargs):
    cmd = [sys.executable, "-m", module, f"--config={config_file}", f"--workdir={workdir}",
           *args]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **kwargs)


def _signal_after(proc, marker, signum):
    """Sends `signum` once a stdout line contains `marker`; returns (rc, stdout, stderr)."""
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if marker in line:
            proc.send_signal(signum)
            break
    out, err = proc.communicate(timeout=300)
    return proc.returncode, "".join(lines) + out, err


def test_a_signal_stops_a_main_thread_blocked_in_native_code(tmp_path):
    # Was: a launcher blocked in JAX (BlockUntilReady of an allocation that never finished)
    # ignored SIGTERM: Python runs handlers only between bytecodes, so only kill -9 ended it.
    # Here the main thread blocks in C (a second lock of a pthread mutex) as it did in XLA:
    # the first SIGTERM is announced at once, the second ends the process with 143.
    code = ("import ctypes; from jaxillusions.runtime import interrupt\n"
            "libc, mutex = ctypes.CDLL(None), ctypes.create_string_buffer(64)\n"
            "with interrupt.catch_signals():\n"
            "    libc.pthread_mutex_lock(mutex)\n"
            "    print('blocked', flush=True)\n"
            "    libc.pthread_mutex_lock(mutex)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    lines = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True).start()
    try:
        assert lines.get(timeout=60) == "blocked\n"
        time.sleep(1)  # into the second lock call
        proc.send_signal(signal.SIGTERM)
        assert lines.get(timeout=30) == "\n"  # (old code: nothing, the handler never ran)
        assert lines.get(timeout=30).startswith("received SIGTERM: stopping")
        time.sleep(interrupt.SAME_DELIVERY_S)  # (sooner, it is the first delivered twice)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        err = proc.stderr.read()
    finally:
        proc.kill()
    assert proc.returncode == 143, err
    (line,) = err.strip().splitlines()
    assert line.startswith("error: stopped at once by a second SIGTERM"), err


def _caught(pid, signum):
    """Whether process `pid` has a handler for `signum` (Linux: SigCgt of /proc/<pid>/status)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            mask = next(line for line in f if line.startswith("SigCgt:")).split()[1]
    except (OSError, StopIteration):
        return False
    return bool(int(mask, 16) >> (signum - 1) & 1)


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)],
                         ids=["SIGINT", "SIGTERM"])
def test_a_signal_during_start_up_is_one_line(tmp_path, signum, code):
    # Was: Ctrl-C in the first seconds (the imports of JAX and co., before catch_signals) gave a
    # 37-line KeyboardInterrupt traceback; SIGTERM killed the launcher with no line at all.
    workdir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "jaxillusions.launch.sweep",
                             "--config=dyck_small", f"--workdir={workdir}",
                             f"--config.data.cache_dir={tmp_path}"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # As soon as the launcher catches SIGTERM (its first lines; the imports take seconds),
        # or after 0.3 s (the old launcher never caught it there).
        deadline = time.monotonic() + 0.3
        while not _caught(proc.pid, signal.SIGTERM) and time.monotonic() < deadline:
            time.sleep(0.005)
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == code, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert err.splitlines() == [f"stopped by {signum.name} during start-up; nothing was "
                                "computed"], err[-3000:]
    assert not workdir.exists()


@pytest.mark.parametrize("install, line", [
    ("interrupt.catch_start_up()", "stopped by SIGINT during start-up; nothing was computed"),
    ("signal.signal(signal.SIGINT, benchmark._stop_handler(OUT))",
     "stopped by SIGINT; what was measured is in OUT")], ids=["start-up", "benchmark"])
def test_a_signal_handled_inside_a_gc_callback_still_stops(install, line, tmp_path):
    # Was: a SIGINT 2.5-3.5 s into `jaxillusions sweep` was handled inside JAX's garbage-collector
    # callback, which printed and dropped the handler's SystemExit: the launcher said "stopped by
    # SIGINT during start-up" and then trained and evaluated to the end, exit code 0. The
    # benchmark's handler raised an exception the same way.
    out = tmp_path / "benchmark.json"
    out.write_text("{}")
    code = ("import gc, os, signal, time\nfrom jaxillusions.runtime import interrupt\n"
            "from jaxillusions.launch import benchmark\n"
            f"OUT = {str(out)!r}\n{install}\n"
            "def callback(phase, info):\n"
            "    if phase == 'start':\n"
            "        gc.callbacks.remove(callback)\n"
            "        os.kill(os.getpid(), signal.SIGINT)\n"
            "        time.sleep(0.1)  # the handler runs here, inside the callback\n"
            "print('printed before', flush=False)\n"
            "gc.callbacks.append(callback)\ngc.collect()\nprint('went on')\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 130, proc
    assert proc.stderr == line.replace("OUT", str(out)) + "\n", proc.stderr
    assert proc.stdout == "printed before\n"  # flushed, and nothing after it


def _watch(signums, clock=None):
    """interrupt._watch on these signal numbers, as the C handler writes them to the wakeup fd
    (`clock`: the watcher's clock, if given)."""
    read_fd, write_fd = os.pipe()
    os.write(write_fd, bytes(signums))
    os.close(write_fd)
    try:
        interrupt._watch(read_fd, **({"clock": iter(clock).__next__} if clock else {}))
    finally:
        os.close(read_fd)


def test_a_signal_while_the_data_loads_stops_before_the_first_step_compiles(
        tmp_path, cache_dir, monkeypatch):
    """Was: "received SIGTERM: stopping after the current chunk of work", then the training
    step compiled and a whole chunk trained before the stop (22 s at d_model 128; minutes on
    the code configs, past a scheduler's grace period)."""
    def compiled(*args, **kwargs):
        raise AssertionError("the training step compiled after the signal")

    monkeypatch.setattr(train.memory, "estimate", compiled)
    workdir = str(tmp_path / "run")
    with interrupt.catch_signals():
        interrupt._received.append(signal.SIGTERM)  # noqa: SLF001 - as the handler sets it
        with pytest.raises(interrupt.Stopped, match=r"^stopped by SIGTERM before training "
                                                    r"\(step 0\); nothing was lost") as err:
            train.train_sweep(checked(_config(cache_dir)), workdir, verbose=False)
    assert err.value.exit_code == 143
    assert not checkpoint.has_checkpoints(workdir)


def test_one_signal_delivered_twice_at_once_counts_once(monkeypatch, capfd):
    # Was: under coreutils `timeout`, which sends SIGTERM to the process and then to its group,
    # the watcher saw a "second SIGTERM" and stopped at once, unsaved (1 run in 7).
    stops = []
    monkeypatch.setattr(interrupt, "_stop_at_once", lambda signum, frame=None: stops.append(signum))
    term, sigint = int(signal.SIGTERM), int(signal.SIGINT)
    _watch([term, term])  # both bytes in one read: the same delivery
    assert stops == []
    assert capfd.readouterr().out.count("received SIGTERM: stopping") == 1
    window = interrupt.SAME_DELIVERY_S
    _watch([term, term, term], clock=[0.0, window / 2, window + 0.5])  # a later one stops
    assert stops == [term]
    _watch([term, sigint], clock=[0.0, 0.01])  # another signal at once is no repeat
    assert stops == [term, sigint]


def test_sigterm_to_the_process_and_its_group_stops_once_with_everything_saved(tmp_path):
    # A real pair, as `timeout` sends it: os.kill(pid), then os.killpg 50 ms later (apart enough
    # that the kernel does not merge them into one pending signal, as it mostly did).
    code = ("import sys, time\nfrom jaxillusions.runtime import interrupt\n"
            "with interrupt.catch_signals():\n"
            "    print('ready', flush=True)\n"
            "    while not interrupt.requested():\n"
            "        time.sleep(0.01)\n"
            "    signum = interrupt.requested()\n"
            "    time.sleep(float(sys.argv[1]))  # saving\n"
            "print('saved', flush=True)\n"
            "sys.exit(interrupt.EXIT_CODES[signum])\n")
    for later in (False, True):
        saving = 3 * interrupt.SAME_DELIVERY_S if later else 1.5
        proc = subprocess.Popen([sys.executable, "-c", code, str(saving)], cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)  # its own group, for os.killpg
        try:
            assert proc.stdout.readline() == "ready\n"
            os.kill(proc.pid, signal.SIGTERM)
            time.sleep(0.05)
            os.killpg(proc.pid, signal.SIGTERM)
            if later:  # a signal after the window still stops at once
                time.sleep(interrupt.SAME_DELIVERY_S + 0.3)
                assert proc.poll() is None, proc.stderr.read()
                os.kill(proc.pid, signal.SIGTERM)
            out, err = proc.communicate(timeout=60)
        finally:
            proc.kill()
        assert proc.returncode == 143, err
        assert out.count("received SIGTERM: stopping") == 1, out
        if later:
            assert "saved" not in out.splitlines()
            (line,) = err.strip().splitlines()
            assert line.startswith("error: stopped at once by a second SIGTERM"), err
        else:
            assert out.splitlines()[-1] == "saved" and err == "", (out, err)


@pytest.mark.parametrize("config_file", ["dyck_small", "code_small"])
def test_a_model_that_cannot_fit_is_a_one_line_error_before_any_work(config_file, tmp_path):
    # Was: a hang after "data: loaded", in the allocation of the initial state.
    # The timeout catches a hang; that nothing was allocated shows in the absent run and cache.
    line = _one_line_error([sys.executable, "-m", "jaxillusions.launch.sweep",
                            f"--config={config_file}", "--config.model.max_len=100000000",
                            f"--workdir={tmp_path / 'run'}",
                            f"--config.data.cache_dir={tmp_path / 'cache'}"], timeout=120)
    assert line.startswith("error: model.max_len=100000000: needs an estimated "), line
    assert "GiB of RAM (CPU: device memory is host RAM)" in line and line.endswith(
        "; lower model.max_len"), line
    assert not (tmp_path / "run").exists() and not (tmp_path / "cache").exists()


@pytest.mark.slow
def test_sigterm_saves_and_the_resumed_run_is_bit_identical(tmp_path, cache_dir):
    # Was: exit 143 with nothing saved (up to checkpoint_every steps lost).
    steps = 60
    config_file, workdir = _config_file(tmp_path, cache_dir, steps), str(tmp_path / "run")
    rc, out, err = _signal_after(_launch("jaxillusions.launch.train", config_file, workdir),
                                 f"step      3/{steps}", signal.SIGTERM)
    assert rc == 143, err[-2000:]
    (line,) = err.strip().splitlines()
    assert line.startswith("stopped by SIGTERM at step ") and "relaunch" in line, err
    stopped = int(line.split("at step ")[1].split(";")[0])
    assert 3 <= stopped < steps
    assert os.listdir(os.path.join(workdir, "checkpoints")) == [str(stopped)]
    assert max(_logged_steps(workdir)) == stopped  # flushed before exiting
    proc = _launch("jaxillusions.launch.train", config_file, workdir)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    assert f"resumed from checkpoint at step {stopped}" in out
    assert out.strip().splitlines()[-1].startswith(f"trained 2 members to step {steps} (2 "
                                                   f"healthy); checkpoints in {workdir}/"), out
    proc = _launch("jaxillusions.launch.train", config_file, workdir)  # finished: says so
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0 and f"already at step {steps}: nothing to train" in out, err
    config = tiny_config(cache_dir)  # the same chunks of jitted steps as the launched runs
    config.train.num_steps, config.train.log_every = steps, 1
    config.train.eval_every = config.train.checkpoint_every = 0
    straight, _ = train.train_sweep(checked(config), verbose=False)
    ckpt = checkpoint.Checkpointer(os.path.join(workdir, "checkpoints"))
    step, resumed = ckpt.restore_latest(straight)
    ckpt.close()
    assert step == steps
    _assert_same(resumed, straight)
    assert _logged_steps(workdir) == list(range(1, steps + 1))


# ---------------------------------------------------------------------------------------------
# 7: the workdir lock.


def test_second_launch_is_refused_and_a_dead_holder_is_taken_over(tmp_path, cache_dir):
    # Was: an 810-line orbax traceback, or two runs writing the same workdir.
    workdir = str(tmp_path / "run")
    lock = checkpoint.WorkdirLock(workdir)
    assert lock.acquire() is None
    try:
        proc = _launch("jaxillusions.launch.train", _config_file(tmp_path, cache_dir), workdir)
        _, err = proc.communicate(timeout=300)
    finally:
        lock.release()
    assert proc.returncode != 0
    (line,) = err.strip().splitlines()
    assert f"is in use by pid {os.getpid()} on " in line, err
    # A holder killed with SIGKILL cannot release the lock: the kernel does, and the next run
    # takes over, naming the dead holder.
    killed = subprocess.run(
        [sys.executable, "-c", "import os, signal\nfrom jaxillusions.runtime import checkpoint\n"
         f"checkpoint.WorkdirLock({workdir!r}).acquire()\nprint(os.getpid(), flush=True)\n"
         "os.kill(os.getpid(), signal.SIGKILL)"], cwd=ROOT, capture_output=True, text=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    note = checkpoint.WorkdirLock(workdir).acquire()
    assert note and f"pid {killed.stdout.strip()} on " in note


# ---------------------------------------------------------------------------------------------
# 8: every seed diverged.


@pytest.mark.slow
def test_all_seeds_diverged_stops_with_an_error(config):
    # Was: trained to the end, fitted proxies on nothing, wrote an empty table, exited 0.
    config.train.learning_rate = 1e30
    config.train.warmup_steps = 0
    with pytest.raises(interrupt.Stopped, match=r"all 2 seeds diverged .* by step 10; stopped") \
            as err:
        train.train_sweep(checked(config), verbose=False)
    assert err.value.exit_code != 0


# ---------------------------------------------------------------------------------------------
# 9: the main job resumes stage by stage.


@pytest.fixture(scope="module")
def no_reports():
    """The stage tests leave out the tables and figures (~20 s a sweep on the 2-core CPU);
    test_faithfulness covers them end to end."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(reports, "write_reports", lambda *args, **kwargs: None)
        mp.setattr(drawing, "write_activation_figures", lambda *args, **kwargs: None)
        yield


@pytest.fixture(scope="module")
def swept(tmp_path_factory, cache_dir, no_reports):
    config = _config(cache_dir)
    config.proxies.targets = ("blocks.-1.attn.k",)
    config.proxies.methods = ("svd", "kmeans", "uniform_attention")  # 3 proxy families
    config.proxies.eval_splits = ("iid", "unseen_depth", "longer")
    workdir = str(tmp_path_factory.mktemp("swept") / "run")
    sweep.run(checked(config), workdir, verbose=False)
    with open(os.path.join(workdir, "results.csv"), "rb") as f:
        return {"config": config, "workdir": workdir, "csv": f.read()}


def test_a_checkpoint_of_another_shape_moves_and_claims_nothing(swept, tmp_path, monkeypatch):
    """Was: the relaunch of a finished code sweep whose data.source had gained files (so a
    larger vocabulary) with an analysis key changed moved results.csv and the reports to
    superseded/ and rewrote config.json, then stopped at the checkpoint: "nothing was
    changed". The check now comes before both (the vocabulary grown by hand here)."""
    import dataclasses

    workdir = str(tmp_path / "run")
    shutil.copytree(swept["workdir"], workdir)
    before = _listing(workdir)
    build = train.build

    def grown(config, splits=None):
        splits, model_cfg, tx = build(config, splits)
        return splits, dataclasses.replace(model_cfg, vocab_size=model_cfg.vocab_size + 1), tx

    monkeypatch.setattr(train, "build", grown)
    config = swept["config"].copy_and_resolve_references()
    config.proxies.eval_splits = ("iid", "longer")  # an analysis key: the reports would move
    with pytest.raises(checkpoint.CheckpointMismatch, match=r"does not match this config or "
                       r"code: params.embed: .*; nothing was changed \(use another --workdir"):
        sweep.run(checked(config), workdir, verbose=False)
    assert _listing(workdir) == before
    # Training alone (jaxillusions train) restores before it claims the workdir: the same.
    with pytest.raises(checkpoint.CheckpointMismatch, match="nothing was changed"):
        train.train_sweep(checked(config), workdir, verbose=False)
    assert _listing(workdir) == before


@pytest.mark.slow
def test_finished_sweep_is_left_as_it_is(swept, tmp_path, capsys):
    # Was: all proxy work redone, results rewritten, hparams and images duplicated.
    workdir = str(tmp_path / "run")
    shutil.copytree(swept["workdir"], workdir)
    before = _listing(workdir)
    sweep.run(checked(swept["config"]), workdir)
    assert "is finished" in capsys.readouterr().out
    assert _listing(workdir) == before
    # A changed analysis setting redoes only the analysis: fitted proxies are reused, and the
    # earlier results are kept under superseded/.
    config = _config(swept["config"].data.cache_dir)
    config.proxies.targets = swept["config"].proxies.targets
    config.proxies.methods = swept["config"].proxies.methods
    config.proxies.eval_splits = ("iid", "longer")
    fitted_before = [f for f in before if f[0].endswith(".msgpack")]
    rows = sweep.run(checked(config), workdir, verbose=False)
    assert {r["split"] for r in rows} == {"iid", "longer"}
    after = _listing(workdir)
    assert [f for f in after if f[0].endswith(".msgpack")] == fitted_before
    assert any(f[0].startswith("superseded") and f[0].endswith("results.csv") for f in after)


def _earlier_reports_and_config(swept, workdir, reports: list[str]):
    """Writes a stand-in for each report (this fixture writes none), each with its own bytes,
    and returns a config of the swept run's proxies."""
    for name in reports:
        (workdir / name).parent.mkdir(exist_ok=True)
        (workdir / name).write_text(f"earlier {name}")
    config = _config(swept["config"].data.cache_dir)
    config.proxies.targets = swept["config"].proxies.targets
    config.proxies.methods = swept["config"].proxies.methods
    return config


def test_every_report_of_an_earlier_analysis_is_kept(swept, tmp_path):
    # Was: only results.csv, gap_table.txt and figures/ were moved aside; gaps.csv and the other
    # tables, and the Wen files, were overwritten in place.
    workdir = tmp_path / "run"
    shutil.copytree(swept["workdir"], workdir)
    reports = ["gaps.csv", "proxy_vs_original.csv", "id_predicts_gap.csv", "min_size.csv",
               "baselines.csv", "gaps_by_category.csv", "wen_results.csv", "wen_summary.txt",
               "figures/faithfulness_svd.png", "dictionaries_equal_id.csv"]
    config = _earlier_reports_and_config(swept, workdir, reports)
    config.proxies.eval_splits = ("iid", "longer")
    sweep.run(checked(config), str(workdir), verbose=False)
    (aside,) = (workdir / "superseded").iterdir()
    for name in reports + ["results.csv"]:
        assert (aside / name).exists(), name
        if name != "results.csv":
            assert (aside / name).read_text() == f"earlier {name}"
            assert not (workdir / name).exists(), name


def test_reports_of_an_unfinished_sweep_are_kept_when_the_analysis_changes(swept, tmp_path,
                                                                          capsys):
    # Was: a sweep killed during its figures (no sweep_done.json), relaunched with a changed
    # analysis key, overwrote results.csv, the tables and the figures in place, no copy kept.
    workdir = tmp_path / "run"
    shutil.copytree(swept["workdir"], workdir)
    os.remove(workdir / sweep.DONE_FILE)
    reports = ["gap_table.txt", "gaps.csv", "figures/faithfulness_svd.png"]
    config = _earlier_reports_and_config(swept, workdir, reports)
    config.proxies.eval_splits = swept["config"].proxies.eval_splits
    config.proxies.kmeans_sizes = (2, 4)  # was (2, 4, 8)
    rows = sweep.run(checked(config), str(workdir))
    out = capsys.readouterr().out
    # One note for the reports moved together (was a note per file).
    (note,) = [line for line in out.splitlines() if "files moved to superseded/" in line]
    assert re.fullmatch(r"note: \d+ files moved to superseded/\w+/ \(results.csv, .*\): each "
                        r"is from a sweep that did not finish \(no sweep_done.json\); the "
                        r"reports are written again", note), note
    assert {r["size"] for r in rows if r["method"] == "kmeans"} == {2, 4}
    (aside,) = (workdir / "superseded").iterdir()
    assert (aside / "results.csv").read_bytes() == swept["csv"]
    assert (workdir / "results.csv").read_bytes() != swept["csv"]
    for name in reports:
        assert (aside / name).read_text() == f"earlier {name}", name
        assert not (workdir / name).exists(), name


def test_a_signal_a_stage_does_not_check_stops_the_run_after_it(swept, tmp_path, monkeypatch,
                                                                 capsys):
    # Was: a stage that checks for no signal inside it (the prediction test) ran on, and so did
    # every stage after it: the run finished with exit 0. And a relaunch after a stop in a
    # re-analysis noted its own reports as "computed with other analysis settings" (the earlier
    # sweep_done.json had stayed): that file is moved aside with the reports it vouched for.
    workdir = tmp_path / "run"
    shutil.copytree(swept["workdir"], workdir)
    config = _earlier_reports_and_config(swept, workdir, [])
    config.proxies.eval_splits = swept["config"].proxies.eval_splits
    config.proxies.kmeans_sizes = (2, 4)  # was (2, 4, 8)
    received = []
    monkeypatch.setattr(interrupt, "_received", received)
    monkeypatch.setattr(reports, "write_reports", lambda *a, **k: received.append(
        signal.SIGTERM))  # the signal arrives late in the report stage, after its own check
    with pytest.raises(interrupt.Stopped) as err:
        sweep.run(checked(config), str(workdir), verbose=False)
    assert (str(err.value), err.value.exit_code) == (
        "stopped by SIGTERM after the reports stage; relaunch the same command to resume", 143)
    assert not (workdir / sweep.DONE_FILE).exists()
    (aside,) = (workdir / "superseded").iterdir()
    assert json.loads((aside / sweep.DONE_FILE).read_text())["analysis"][
        "proxies.kmeans_sizes"] == "[2, 4, 8]"
    received.clear()
    monkeypatch.setattr(reports, "write_reports", lambda *a, **k: None)
    capsys.readouterr()
    sweep.run(checked(config), str(workdir))
    (note,) = [line for line in capsys.readouterr().out.splitlines()
               if "moved to superseded/" in line]
    assert "is from a sweep that did not finish (no sweep_done.json); the reports are written " \
           "again" in note, note
    assert (workdir / sweep.DONE_FILE).exists()


def test_damaged_stage_files_are_recomputed_and_kept(swept, tmp_path, capsys):
    # Was: "error: JSONDecodeError: ..." or "error: Unpack failed: incomplete input", naming no
    # file, and no way on but deleting files by hand.
    workdir = tmp_path / "run"
    shutil.copytree(swept["workdir"], workdir)
    files = sorted((workdir / stages.STAGE_DIR).iterdir())
    damaged = [next(p for p in files if p.suffix == ".msgpack"),
               next(p for p in files if p.name.endswith("_rows.json")),
               workdir / sweep.DONE_FILE]
    for path in damaged:
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    sweep.run(checked(swept["config"]), str(workdir))
    out = capsys.readouterr().out
    for path in damaged:
        assert f"note: {path.relative_to(workdir)} is unreadable (" in out
    with open(workdir / "results.csv", "rb") as f:
        assert f.read() == swept["csv"]
    (aside,) = (workdir / "superseded").iterdir()
    assert sorted(p.relative_to(aside) for p in aside.rglob("*") if p.is_file()) == sorted(
        [p.relative_to(workdir) for p in damaged] + [Path("results.csv")])


def test_stage_files_of_valid_json_but_the_wrong_shape_are_recomputed_and_kept(swept, tmp_path,
                                                                               capsys):
    # Was: sweep_done.json holding [1] stopped every relaunch with "TypeError: list indices
    # must be integers or slices, not str", naming no file; a _rows.json with the right stamp
    # and a row less was reported as it was.
    from flax import serialization

    workdir = tmp_path / "run"
    shutil.copytree(swept["workdir"], workdir)
    files = sorted((workdir / stages.STAGE_DIR).iterdir())
    rows, fit = files[3], files[0]  # 01_kmeans_..._rows.json, 00_svd_....msgpack
    content = json.loads(rows.read_text())
    content["value"] = content["value"][:-1]  # the last bin of the last seed and size
    rows.write_text(json.dumps(content))
    content = stages.read_msgpack(fit)
    content["value"] = {site: {"basis": np.zeros(3)} for site in content["value"]}
    fit.write_bytes(serialization.msgpack_serialize(content))
    (workdir / sweep.DONE_FILE).write_text("[1]")
    sweep.run(checked(swept["config"]), str(workdir))
    out = capsys.readouterr().out
    assert (f"note: {sweep.DONE_FILE} is unreadable (valid JSON, but a list without the time and "
            "analysis settings of a finished sweep); the reports are written again") in out
    assert (f"note: {rows.relative_to(workdir)} is unreadable (its stamp is right, but its seeds "
            "and sizes do not have the same bins, each once)") in out
    assert (f"note: {fit.relative_to(workdir)} is unreadable (its stamp is right, but an array "
            "of it is not one per seed (2))") in out
    with open(workdir / "results.csv", "rb") as f:
        assert f.read() == swept["csv"]
    (aside,) = (workdir / "superseded").iterdir()
    assert sorted(p.relative_to(aside) for p in aside.rglob("*") if p.is_file()) == sorted(
        [rows.relative_to(workdir), fit.relative_to(workdir), Path(sweep.DONE_FILE),
         Path("results.csv")])


def test_a_finished_sweeps_emptied_or_cut_report_is_written_again(swept, tmp_path, capsys):
    # Was: "finished; nothing to do", keeping the damaged file. sweep_done.json records the
    # sha256 of every report, and a relaunch checks them.
    workdir = tmp_path / "run"
    shutil.copytree(swept["workdir"], workdir)
    done = json.loads((workdir / sweep.DONE_FILE).read_text())
    assert set(done["reports"]) == {"results.csv"}  # this fixture writes no other report
    results = workdir / "results.csv"
    lines = swept["csv"].splitlines(keepends=True)
    for damage, content, why in [
            ("emptied", b"", "its results.csv is empty"),
            ("cut at a row boundary", b"".join(lines[:len(lines) // 2]),
             f"its results.csv differs from the sha256 recorded in {sweep.DONE_FILE}")]:
        results.write_bytes(content)
        sweep.run(checked(swept["config"]), str(workdir))
        out = capsys.readouterr().out
        assert (f"warning: the sweep in {workdir} finished, but {why}; the reports are written "
                "again from the saved stages") in out, damage
        assert "fitting" not in out  # from the stage files: nothing is fitted again
        # The note of the move says why (it said "each was computed with other analysis
        # settings", where none had changed).
        assert f"results.csv is written again ({why}); moved to superseded/" in out, out
        assert results.read_bytes() == swept["csv"], damage
        kept = sorted((workdir / "superseded").rglob("results.csv*"))
        assert kept[-1].read_bytes() == content, damage  # the damaged file, kept
    sweep.run(checked(swept["config"]), str(workdir))
    assert "is finished" in capsys.readouterr().out
    # A sweep_done.json written before the checksums: its reports are unverified, so written
    # again (with a note), as above.
    del done["reports"]
    assert "predates the checksums of the reports" in sweep._unverified(done, str(workdir))
    # Without a checkpoint to write them from, one line says which file and what to do.
    results.write_bytes(b"")
    shutil.rmtree(workdir / checkpoint.CHECKPOINT_DIR)
    with pytest.raises(ValueError, match=r"^the sweep in .* finished, but its results.csv is "
                                         r"empty, and .*/checkpoints holds no checkpoint to "
                                         r"write the reports again from: restore the file") as err:
        sweep.run(checked(swept["config"]), str(workdir))
    assert "\n" not in str(err.value)


def test_sweep_stopped_during_proxy_work_resumes_with_identical_results(swept, tmp_path,
                                                                        cache_dir):
    workdir = str(tmp_path / "run")
    shutil.copytree(swept["workdir"], workdir)
    for name in ("results.csv", sweep.DONE_FILE, stages.STAGE_DIR):
        path = os.path.join(workdir, name)
        shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
    proxies = swept["config"].proxies
    config_file = tiny_config_file(tmp_path / "swept_config.py", cache_dir, {
        "train.num_steps": 20, "train.log_every": 5, "proxies.targets": proxies.targets,
        "proxies.methods": proxies.methods, "proxies.eval_splits": proxies.eval_splits})
    rc, out, err = _signal_after(_launch("jaxillusions.launch.sweep", config_file, workdir),
                                 "fitting", signal.SIGINT)
    assert rc == 130, err[-2000:]
    (line,) = err.strip().splitlines()
    assert line.startswith("stopped by SIGINT while") and "saved in" in line, err
    assert not os.path.exists(os.path.join(workdir, "results.csv"))
    sweep.run(checked(swept["config"]), workdir, verbose=False)
    with open(os.path.join(workdir, "results.csv"), "rb") as f:
        assert f.read() == swept["csv"]


@pytest.mark.parametrize("signals", [1, 2])
def test_sigterm_in_the_report_stage_exits_143(swept, tmp_path, cache_dir, signals):
    # Was: "stopping..." then 58 s more of figures and exit 0; two SIGTERMs exited 130. The
    # relaunch after the stop writes the reports (training and proxy stages are kept).
    workdir = str(tmp_path / "run")
    shutil.copytree(swept["workdir"], workdir)
    for name in ("results.csv", sweep.DONE_FILE):
        os.remove(os.path.join(workdir, name))
    proxies = swept["config"].proxies
    config_file = tiny_config_file(tmp_path / "swept_config.py", cache_dir, {
        "train.num_steps": 20, "train.log_every": 5, "proxies.targets": proxies.targets,
        "proxies.methods": proxies.methods, "proxies.eval_splits": proxies.eval_splits,
        "figures": "summary"})  # the figures keep the report stage busy for the signal
    proc = _launch("jaxillusions.launch.sweep", config_file, workdir)
    signalled = False
    for line in proc.stdout:  # the headline is printed first, then the figures are drawn
        if line.startswith("(full tables: "):
            for _ in range(signals):
                proc.send_signal(signal.SIGTERM)
                time.sleep(0.3 if signals == 1 else interrupt.SAME_DELIVERY_S + 0.2)
            signalled = True
            break
    out, err = proc.communicate(timeout=300)
    assert signalled, "the report stage printed no '(full tables: ...)' line"
    assert proc.returncode == 143, err[-2000:]
    lines = err.strip().splitlines()
    graceful = "stopped by SIGTERM while writing the reports"
    if signals == 1:
        assert len(lines) == 1 and lines[0].startswith(graceful), lines
    else:  # the second stops at once, or arrives once the first has stopped the run: both 143
        assert 1 <= len(lines) <= 2 and lines[0].startswith(
            (graceful, "error: stopped at once by a second SIGTERM")), lines
    assert "proxies done" not in out and not os.path.exists(os.path.join(workdir, sweep.DONE_FILE))


@pytest.mark.parametrize("stage, target", [("proxy fitting", ".msgpack"),
                                           ("proxy evaluation", "_rows.json"),
                                           ("report", "results.csv")])
def test_a_full_disk_in_the_proxy_or_report_stage_names_the_file(swept, tmp_path, monkeypatch,
                                                                 stage, target):
    # Was: "error: [Errno 28] No space left on device", naming neither file nor stage.
    workdir = str(tmp_path / "run")
    shutil.copytree(swept["workdir"], workdir)
    for name in ("results.csv", sweep.DONE_FILE, stages.STAGE_DIR):
        path = os.path.join(workdir, name)
        shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
    write_atomic, write_csv = checkpoint.write_atomic, sweep.results.write_csv

    def full(path, *args, **kwargs):
        if path.endswith(target):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        if path.endswith(".csv"):
            return write_csv(args[0], path)
        return write_atomic(path, *args, **kwargs)

    monkeypatch.setattr(checkpoint, "write_atomic", full)
    monkeypatch.setattr(stages, "write_atomic", full)  # the stage files' writer
    monkeypatch.setattr(sweep.results, "write_csv", lambda rows, path: full(path, rows))
    with pytest.raises(OSError) as err:
        sweep.run(checked(swept["config"]), workdir, verbose=False)
    message = str(err.value)
    assert message.startswith(f"the {stage} stage could not write {workdir}/"), message
    assert f"{target}: No space left on device; what was saved before is intact" in message


# ---------------------------------------------------------------------------------------------
# 10: every bad input to a launcher is one line on stderr, and no work is done.


def _one_line_error(cmd, cwd=ROOT, timeout=300):
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=timeout)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-3000:]
    return lines[0]


@pytest.mark.parametrize("case", ["missing_config", "unknown_config", "no_get_config",
                                  "unknown_key", "workdir_is_a_file", "bad_rank",
                                  "checkpoints_is_a_file", "other_training_config"])
def test_launcher_bad_input_is_exactly_one_line(case, tmp_path):
    cache = tmp_path / "cache"  # stays empty: errors come before any data generation
    args = {"missing_config": ["--config=nope.py"], "unknown_config": ["--config=nope"],
            "no_get_config": [f"--config={tmp_path / 'empty.py'}"],
            "unknown_key": ["--config=dyck_small", "--config.train.foo=1"],
            "workdir_is_a_file": ["--config=dyck_small"],
            "bad_rank": ["--config=dyck_small", "--config.proxies.svd_ranks=abc"],
            "checkpoints_is_a_file": ["--config=dyck_small"],
            "other_training_config": ["--config=dyck_small", "--config.data.seed=7"]}
    workdir = tmp_path / "run"
    (tmp_path / "empty.py").write_text("config = None\n")
    if case == "workdir_is_a_file":
        workdir.write_text("")
    if case == "checkpoints_is_a_file":  # was: trained, then failed at the first checkpoint
        workdir.mkdir()
        (workdir / "checkpoints").write_text("")
    if case == "other_training_config":  # was: `jaxillusions train` generated the data first
        from jaxillusions.configs import dyck_small

        config = dyck_small.get_config()
        config.data.cache_dir = str(cache)
        checkpoint.claim_workdir(str(workdir), config)
    command = "train" if case == "other_training_config" else "sweep"
    line = _one_line_error([sys.executable, "-m", "jaxillusions", command, *args[case],
                            f"--workdir={workdir}", f"--config.data.cache_dir={cache}"])
    expected = {"missing_config": "config file nope.py not found; the shipped configs: code,",
                "unknown_config": "no shipped config named 'nope'; the shipped configs: code,",
                "no_get_config": "empty.py defines no get_config()",
                "unknown_key": "unknown config key train.foo; train has: batch_size,",
                "workdir_is_a_file": "exists and is not a directory",
                "bad_rank": "proxies.svd_ranks=('abc',): must be a tuple of integers",
                "checkpoints_is_a_file": "checkpoints is not a directory, so no checkpoint",
                "other_training_config": "data.seed: 0 there vs 7 now"}
    assert expected[case] in line
    assert not cache.exists() or not os.listdir(cache)


def test_degenerate_code_data_is_refused_before_training(tmp_path):
    # Was: data.min_char_count=1e9 mapped every character to UNK; the run reported accuracy
    # 1.000 on every split and exited 0.
    from test_code_task import code_config

    config = code_config(tmp_path)
    config.data.min_char_count = 1_000_000_000
    with pytest.raises(ValueError, match=r"^data: split train has an UNK rate of 1\.000 .*"
                                         r"lower data\.min_char_count \(now 1000000000\)") as err:
        train.train_sweep(checked(config), str(tmp_path / "run"), verbose=False)
    assert "\n" not in str(err.value)
    assert not (tmp_path / "run" / checkpoint.CONFIG_FILE).exists()


def test_split_checks_refuse_one_class_and_no_evaluated_positions(config):
    splits, _, _ = train.build(checked(config))
    one_class = dict(splits)  # every closing bracket of `iid` made the same type
    iid = splits["iid"]
    close = iid.tokens[:, 1:][iid.is_close[:, :-1]].max()
    tokens = iid.tokens.copy()
    tokens[:, 1:][iid.is_close[:, :-1]] = close
    one_class["iid"] = dataclasses.replace(iid, tokens=tokens)
    with pytest.raises(ValueError, match=r"every one of the \d+ evaluated targets of split iid "
                                         rf"is token {close}, so any model scores accuracy 1\.0"):
        train.build(checked(config), one_class)
    none = dict(splits)
    none["longer"] = dataclasses.replace(splits["longer"],
                                         is_close=np.zeros_like(splits["longer"].is_close))
    with pytest.raises(ValueError, match=r"split longer has \d+ rows but no evaluated position"):
        train.build(checked(config), none)


@pytest.mark.slow
def test_a_data_error_leaves_a_fresh_workdir_unclaimed(tmp_path, cache_dir):
    # Was: config.json written before the data error, so the relaunch with the fixed data config
    # was refused as "a different config". (Dyck-1 with these sizes: the data cannot be made.)
    config_file = _config_file(tmp_path, cache_dir, steps=2)
    workdir = tmp_path / "run"
    line = _one_line_error([sys.executable, "-m", "jaxillusions.launch.train",
                            f"--config={config_file}", "--config.data.num_types=1",
                            f"--workdir={workdir}"])
    assert line.startswith("error: dyck split 'seen_structure': found 0 of 64"), line
    assert not (workdir / checkpoint.CONFIG_FILE).exists()
    proc = _launch("jaxillusions.launch.train", config_file, workdir)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    assert (workdir / checkpoint.CONFIG_FILE).exists()


def test_a_repeated_config_override_the_last_one_wins(tmp_path):
    # Was: repeated tuple overrides concatenated, (2,4) then (0,) gave (2, 4, 0).
    line = _one_line_error([sys.executable, "-m", "jaxillusions.launch.sweep",
                            "--config=dyck_small", "--config.proxies.kmeans_sizes=(2,4)",
                            "--config.proxies.kmeans_sizes=(0,)", f"--workdir={tmp_path / 'run'}"])
    assert line.startswith("error: proxies.kmeans_sizes=(0,): must be cluster counts"), line


@pytest.mark.parametrize("case", ["bad_variant", "no_variant", "workdir_is_a_file", "override",
                                  "workdir_holds_a_run"])
def test_wen_attention_launcher_bad_input_is_exactly_one_line(case, tmp_path):
    workdir = tmp_path / "run"
    args = {"bad_variant": ["--variants=minimal,bogus"], "no_variant": ["--variants="],
            "workdir_is_a_file": ["--variants=minimal"], "workdir_holds_a_run": [],
            "override": ["--config.train.num_seeds=2"]}[case]
    if case == "workdir_is_a_file":
        workdir.write_text("")
    if case == "workdir_holds_a_run":  # was: the variants trained in its subfolders
        workdir.mkdir()
        (workdir / checkpoint.CONFIG_FILE).write_text("{}")
    line = _one_line_error([sys.executable, "-m", "jaxillusions.launch.wen_attention", *args,
                            f"--workdir={workdir}"])
    assert {"bad_variant": "expected one of ('minimal',",
            "no_variant": "--variants is empty; choose from minimal,standard_nope",
            "workdir_is_a_file": "exists and is not a directory",
            # Was: "Unknown command line flag 'config.train.num_seeds'".
            "override": "error: jaxillusions wen-attention takes no --config and no config "
                        "overrides: it runs the variants of the config wen_attention_variation "
                        "(choose them with --variants); for other settings run each with "
                        "`jaxillusions sweep --config=wen_attention_variation:<variant> ",
            "workdir_holds_a_run": f"error: workdir {workdir} holds another run (config.json): "
                                   "the variants would train in its subfolders"}[case] in line
    if case == "workdir_holds_a_run":
        assert set(os.listdir(workdir)) - {checkpoint.LOCK_FILE} == {checkpoint.CONFIG_FILE}
    else:
        assert case == "workdir_is_a_file" or not workdir.exists()  # was: locked and created


def test_a_config_file_argument_error_gives_its_reason(tmp_path):
    # Was: "error: flag --config=...: Error whilst parsing config file:", the reason cut off.
    line = _one_line_error([sys.executable, "-m", "jaxillusions.launch.sweep",
                            "--config=wen_attention_variation:bogus",
                            f"--workdir={tmp_path / 'run'}"])
    assert line.endswith("bogus: expected one of ('minimal', 'standard_nope', "
                         "'standard_linear')"), line


def _can_mount_tmpfs():
    return shutil.which("unshare") is not None and subprocess.run(
        ["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=1k tmpfs /mnt"],
        capture_output=True).returncode == 0


@pytest.mark.skipif(not _can_mount_tmpfs(), reason="needs unprivileged mounts (unshare -rm)")
@pytest.mark.parametrize("mount, expected", [
    ("ro,size=1m", "cannot be written: Read-only file system"),
    ("size=200k", "could not save checkpoint 10 in"),  # a full disk, at the first checkpoint
])
def test_read_only_or_full_disk_is_one_line(mount, expected, tmp_path, cache_dir):
    config_file = _config_file(tmp_path, cache_dir)
    disk = tmp_path / "disk"
    disk.mkdir()
    launch = (f"mount -t tmpfs -o {mount} tmpfs {disk} && exec {sys.executable} -m "
              f"jaxillusions.launch.train --config={config_file} "
              f"--config.train.checkpoint_every=10 --workdir={disk}/run")
    line = _one_line_error(["unshare", "-rm", "sh", "-c", launch])
    assert expected in line, line


# ---------------------------------------------------------------------------------------------
# 11: the launchers keep XLA's compiled programs on disk.


def _env_without_jax_settings():
    """The environment without JAX's settings (the launcher's own defaults apply), but for the
    suite's compiler flags (conftest.xla_flags)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_FLAGS"))}
    return {**env, "XLA_FLAGS": xla_flags()}


@pytest.mark.slow
def test_compiled_programs_are_reused_and_an_unreadable_entry_is_rewritten(tmp_path, cache_dir):
    # Was: every launch compiled every program again (on a GPU, minutes of the Quickstart job).
    config_file, xla = _config_file(tmp_path, cache_dir), tmp_path / "cache" / "xla"
    base = _env_without_jax_settings()

    def launch(name, **env):
        proc = _launch("jaxillusions.launch.train", config_file, str(tmp_path / name),
                       env={**base, "JAXILLUSIONS_CACHE": str(tmp_path / "cache"), **env})
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-2000:]
        return log_lib.read_scalars(str(tmp_path / name / "tensorboard")), out, err

    off, out, _ = launch("off", JAX_ENABLE_COMPILATION_CACHE="false")
    assert not xla.exists() and "compiled programs" not in out
    cold, out, err = launch("cold")
    assert f"compiled programs: cached in {xla} " in out and err == ""
    (step_entry,) = xla.glob("jit_train_steps-*")
    # The second launch loads the training step instead of compiling it; same numbers.
    warm, _, err = launch("warm", JAX_LOG_COMPILES="1")
    assert "Persistent compilation cache hit for 'jit_train_steps'" in err
    assert warm == cold == off
    # An unreadable entry: one warning line, the step compiled again and its entry rewritten.
    step_entry.write_bytes(b"not an executable")
    damaged, _, err = launch("damaged")
    lines = err.splitlines()
    assert any("entry for 'jit_train_steps'" in line for line in lines), err
    assert all(line.startswith("warning: Error reading persistent compilation cache entry for ")
               and line.endswith(" (compiled instead)") for line in lines), err
    assert damaged == cold
    (step_entry,) = xla.glob("jit_train_steps-*")
    assert step_entry.read_bytes() != b"not an executable"
    _, _, err = launch("healed")
    assert err == ""


@pytest.mark.slow
@pytest.mark.skipif(not _can_mount_tmpfs(), reason="needs unprivileged mounts (unshare -rm)")
def test_compilation_cache_on_a_full_disk_is_one_warning(tmp_path, cache_dir):
    config_file, disk = _config_file(tmp_path, cache_dir), tmp_path / "disk"
    disk.mkdir()
    launch = (f"mount -t tmpfs -o size=60k tmpfs {disk} && JAX_COMPILATION_CACHE_DIR={disk}/xla "
              f"exec {sys.executable} -m jaxillusions.launch.train --config={config_file} "
              f"--workdir={tmp_path}/run")
    proc = subprocess.run(["unshare", "-rm", "sh", "-c", launch], capture_output=True, text=True,
                          cwd=ROOT, timeout=300, env=_env_without_jax_settings())
    assert proc.returncode == 0, proc.stderr[-2000:]
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("warning: Error writing persistent compilation cache entry for ")
    assert "No space left on device" in line and "not cached; the run goes on" in line


@pytest.mark.slow
def test_a_cache_path_that_is_a_file_is_two_warning_lines(tmp_path):
    # Was: the data cache's warning on two lines (shown twice: the train launcher loaded the data a
    # second time) and a read error of the compilation cache reported as if an entry were bad.
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("")
    config_file = _config_file(tmp_path, "")  # data.cache_dir "": $JAXILLUSIONS_CACHE
    proc = subprocess.run([sys.executable, "-m", "jaxillusions.launch.train",
                           f"--config={config_file}", f"--workdir={tmp_path / 'run'}"],
                          capture_output=True, text=True,
                          cwd=ROOT, timeout=300,
                          env={**_env_without_jax_settings(), "JAXILLUSIONS_CACHE": str(blocker)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    compiled, data = proc.stderr.strip().splitlines()
    assert compiled.startswith("warning: compiled programs are not cached: NotADirectoryError")
    assert data.startswith("warning: dyck data: could not write cache ") and str(blocker) in data
    assert proc.stdout.count("dyck data: generated") == 1
