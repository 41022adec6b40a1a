"""Every shipped config runs to its end, shrunk to test size, through the launcher a user runs:
its model, proxies, studies and devices as shipped, with 2 seeds, 20 steps of batch 8 (a sparse
dictionary fits for 10 steps past its dead-latent window, so that its auxiliary loss runs) and
little data. The two configs meant for a GPU run at width 64 (MLP 256): `code`, a paper-scale
model, needs 32 GiB per device to evaluate at its own on the CPU and 12 min here, and `dyck`'s
width of 128 made evaluating its proxies most of its launch. A hang (a deadlock in a fit, a
stage that never returns) is the watchdog's one-line error or the suite's per-test timeout
here, not a user's silent process."""

import importlib
import json
import os
import pathlib
import subprocess
import sys

import pytest
from conftest import users_xla_flags

from jaxillusions import configs
from jaxillusions.proxies import sae

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Templates: configs whose paths are placeholders for files a user makes (checkpoints, text);
# the door refuses them until those exist. tests/test_text_task.py runs pretrained_code's setup
# on files it makes.
CONFIGS = sorted(p.stem for p in pathlib.Path(configs.__file__).parent.glob("*.py")
                 if p.name != "__init__.py" and not getattr(
                     importlib.import_module(f"jaxillusions.configs.{p.stem}"), "TEMPLATE", False))
# The arguments of configs that take one (the part after ':'), each a config of its own.
VARIANTS = {"wen_attention_variation": ("minimal", "standard_nope", "standard_linear")}

SHRINK = {"train.num_seeds": 2, "train.num_steps": 20, "train.warmup_steps": 5,
          "train.batch_size": 8, "train.log_every": 10, "train.checkpoint_every": 10,
          "figures": "none",
          "stall_seconds": 120, "proxies.kmeans_samples": 500}
# The evaluation sets: 32 Dyck sentences or 24 code functions of 64 characters (128 on
# `longer`) per split; evaluating every proxy size on them is most of a shrunk run's time.
SHRINK_TASK = {"dyck": {"data.num_train": 1000, "data.num_eval": 32},
               "code": {"data.num_train": 200, "data.num_eval": 24, "data.context": 64,
                        "data.longer_context": 128, "induction.code_rows": 16,
                        "induction.batch": 8}}
EVAL_BATCH = 64  # at most, for the proxies and training's evaluation
# At most, for the activation collection: `dyck`'s 2,048 padded the shrunk training split's
# rows fourfold (its collection 5-7 s against 1 s at 512).
COLLECT_BATCH = 512
# Configs whose shrunk run goes to running programs more than to compiling them (the code
# model's evaluation, the sparse dictionaries' fits): launched as users' (conftest.users_xla_flags).
RUN_HEAVY = {"code", "dyck_dictionaries"}
WIDE = {"code", "dyck"}  # configs meant for a GPU, at width 64 here (the docstring)


def _shrunk(name: str, arg: str | None) -> list[str]:
    module = importlib.import_module(f"jaxillusions.configs.{name}")
    config = module.get_config(arg) if arg else module.get_config()
    keys = {**SHRINK, **SHRINK_TASK[config.task]}
    keys["proxies.eval_batch_size"] = min(config.proxies.eval_batch_size, EVAL_BATCH)
    keys["train.eval_batch_size"] = min(config.train.eval_batch_size, EVAL_BATCH)
    keys["proxies.collect_batch_size"] = min(config.proxies.collect_batch_size, COLLECT_BATCH)
    if name in WIDE:  # a GPU's model: its width shrunk
        keys.update({"model.d_model": 64, "model.d_mlp": 256})
    if name == "code":
        keys["proxies.eval_batch_size"] = 16
    if {"sae", "transcoder"} & set(config.proxies.methods):  # dyck_dictionaries' 200: 68 s
        keys["proxies.sae_steps"] = sae.AuxK.dead_steps + 10  # alone, 41 s at 60 (speed.md)
    if config.train.decay_steps:
        keys["train.decay_steps"] = 10
    if config.train.eval_every:
        keys["train.eval_every"] = 20
    if "circuit" in config.proxies.methods:  # circuits found on 128 of the 1,000 sentences
        keys["proxies.circuit_sentences"] = 128  # (dyck_circuits: time 72, 74 s -> 62, 60 s)
    if config.prediction.enabled:  # 2 repeats of the random 5-fold splits, not 10
        keys["prediction.n_repeats"] = 2
    if config.wen.enabled:
        keys["wen.length_num_prefixes"] = 2
    return [f"--config.{k}={v}" for k, v in keys.items()]


@pytest.mark.slow
@pytest.mark.parametrize("name, arg", [(n, a) for n in CONFIGS
                                       for a in VARIANTS.get(n, (None,))])
def test_a_shipped_config_runs_to_the_end_at_test_size(name, arg, tmp_path, cache_dir):
    path = name + (f":{arg}" if arg else "")  # a shipped config, by its name
    workdir = tmp_path / "run"
    env = {**os.environ, "JAX_NUM_CPU_DEVICES": "2"}
    if name in RUN_HEAVY:
        env["XLA_FLAGS"] = users_xla_flags()
    done = subprocess.run(
        [sys.executable, "-m", "jaxillusions", "sweep", f"--config={path}", f"--workdir={workdir}",
         f"--config.data.cache_dir={cache_dir}", *_shrunk(name, arg)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"{path}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    points = ([workdir / p for p in json.loads((workdir / "grid.json").read_text())["points"]]
              if (workdir / "grid.json").exists() else [workdir])  # a grid: a run per point
    assert all((p / "sweep_done.json").exists() for p in points)
    assert "time " in done.stdout.splitlines()[-1]  # the job's last line: where the time went
