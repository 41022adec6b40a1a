"""benchmarks/train_hf_population.py at a tiny size (2 seeds x 10 steps of a 2-layer GPT-NeoX,
trained by Hugging Face's Trainer): the seeds load with `load_pretrained` on a member axis of 2,
the tokenizer loads, the seeds differ, one seed's checkpoints load, and a seed trained twice
gives the same weights bit for bit (full_determinism on the CPU). Then benchmarks/imported_svd.py
on that population: jaxillusions' proxy stage and the TransformerLens loop fit the same
projection and give the same agreement (no timing asserts)."""

import glob
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from conftest import made_once

from jaxillusions.model import pretrained

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
pytest.importorskip("torch")
pytest.importorskip("accelerate")  # the Trainer needs it (with the export extra)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--tiny", "--steps=10", "--save_steps=4"]


def _train(out, *args):
    """The script in a process of its own: full_determinism switches torch to deterministic
    algorithms for the whole process."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run([sys.executable, "-m", "benchmarks.train_hf_population",
                           f"--out={out}", *TINY, *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.fixture(scope="session")
def population(tmp_path_factory):
    """The trained population, made once for the test run (conftest.made_once)."""
    def make(out):
        said = _train(out, "--seeds=2")
        assert "seed 2: 10 steps" in said
        return str(out)

    return made_once(tmp_path_factory, "hf_population", make)


def _weights(path):
    from safetensors.numpy import load_file

    return load_file(os.path.join(path, "model.safetensors"))


def test_the_seeds_load_on_a_member_axis(population):
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    paths = [os.path.join(population, f"seed{s}") for s in (1, 2)]
    params, cfg, labels = pretrained.load_pretrained_labelled(paths)
    assert labels == ["seed1", "seed2"]
    assert all(x.shape[0] == 2 for x in jax.tree.leaves(params))
    assert (cfg.n_layers, cfg.d_model, cfg.pos_encoding, cfg.parallel_residual) == (
        2, 32, "rotary", True)
    assert not np.allclose(params["embed"][0], params["embed"][1])  # two seeds, two models
    assert not np.allclose(params["blocks"][1]["attn"]["w_k"][0],
                           params["blocks"][1]["attn"]["w_k"][1])
    # The tokenizer: the same file beside every model, as tokenizers and transformers read it.
    tok = Tokenizer.from_file(os.path.join(paths[0], "tokenizer.json"))
    assert tok.get_vocab_size() == cfg.vocab_size
    assert (tok.token_to_id("<|pad|>"), tok.token_to_id("<|endoftext|>")) == (0, 1)
    code = "def f(x):\n    return x + 1\n"
    assert tok.decode(tok.encode(code).ids) == code
    hf = AutoTokenizer.from_pretrained(paths[1])
    assert hf(code)["input_ids"] == tok.encode(code).ids and hf.pad_token_id == 0
    # One seed's checkpoints along training, each a directory load_pretrained reads; the last
    # is the final model; the other seed leaves none.
    steps = sorted(glob.glob(os.path.join(paths[0], "checkpoint-*")),
                   key=lambda p: int(p.rsplit("-", 1)[1]))
    assert [os.path.basename(p) for p in steps] == ["checkpoint-4", "checkpoint-8",
                                                    "checkpoint-10"]
    assert not glob.glob(os.path.join(paths[1], "checkpoint-*"))
    along, along_cfg = pretrained.load_pretrained(steps)
    assert along_cfg == cfg and along["embed"].shape[0] == 3
    assert np.array_equal(along["embed"][-1], params["embed"][0])
    assert not np.array_equal(along["embed"][0], along["embed"][-1])


def test_the_text_files_keep_held_out_functions_apart(population):
    from jaxillusions.tasks.code_completion import splits

    text = os.path.join(population, "text")

    def functions(name):
        with open(os.path.join(text, f"{name}.txt"), encoding="utf-8") as f:
            return f.read().split("<|endoftext|>")

    train, held = functions("train"), functions("heldout_python")
    assert len(train) > 100 and len(held) > 100 and not set(train) & set(held)
    assert all(f.startswith(("def ", "async def ", "@")) for f in held[:50])
    has_js = os.path.isfile(os.path.join(text, "heldout_javascript.txt"))
    assert has_js == (splits.find_npm() is not None)


def test_a_seed_trained_twice_is_the_same_bit_for_bit(request, tmp_path):
    # Trainer(seed, full_determinism=True) on the CPU: the same initialisation, data order and
    # deterministic kernels; the data and tokenizer are the same files. The seed is trained
    # again before the population is asked for, so that this worker trains while the other
    # makes the population, rather than waiting for it first.
    _train(tmp_path, "--seeds=1", "--no_javascript")
    population = request.getfixturevalue("population")
    for name in ("tokenizer.json", os.path.join("text", "train.txt")):
        with open(os.path.join(population, name), "rb") as a, \
                open(os.path.join(tmp_path, name), "rb") as b:
            assert a.read() == b.read(), name
    first, again = _weights(os.path.join(population, "seed1")), _weights(tmp_path / "seed1")
    assert set(first) == set(again)
    assert all(np.array_equal(first[k], again[k]) for k in first)


def test_imported_svd_benchmark_fits_the_same_projection(population):
    from importlib import metadata

    pytest.importorskip("transformer_lens")
    if int(metadata.version("transformer-lens").split(".")[0]) < 4:
        pytest.skip("the TransformerLens loop boots TL 4.x's TransformerBridge")
    from benchmarks import imported_svd

    said = []
    paths = imported_svd.population_paths(population)
    windows, context = 12, 32
    report = imported_svd.run(
        paths, tokenizer=os.path.join(population, "tokenizer.json"),
        fit_text=os.path.join(population, "text", "train.txt"),
        eval_text=os.path.join(population, "text", "heldout_python.txt"), layer=-1, rank=3,
        fit_windows=windows, eval_windows=windows, batch_size=5, repeats=1, same_metrics=True,
        say=lambda *a: said.append(" ".join(a)))
    assert report["members"] == 2 and report["site"] == "blocks.1.attn.k"
    assert report["rank_jaxillusions"] == report["rank_transformer_lens"] == [3]
    # Eigenvectors of the keys' second moments (ours) and right singular vectors of the keys
    # (torch.linalg.svd): the same projection up to float32 rounding.
    assert report["max_projection_difference"] < 1e-4
    # Each path's argmax agreement: the same projection and the same models, so they differ
    # only where rounding flips a near tie; at most 2 of each member's positions.
    positions = windows * (context - 1)
    assert report["max_agreement_difference"] <= 2 / positions
    assert len(report["agreement_jaxillusions"]) == 2
    # The mean JSD (bits) of both paths: each position's carries float32 rounding of about
    # eps * its log-probabilities' size (at most log2 of the vocabulary, in bits).
    vocab = report["model"]["vocab_size"]
    assert np.allclose(report["jsd_jaxillusions"], report["jsd_transformer_lens"], rtol=1e-2,
                       atol=np.finfo(np.float32).eps * np.log2(vocab))
    assert report["transformer_lens_over_jaxillusions"] == pytest.approx(
        report["transformer_lens_s"] / report["jaxillusions_s"])
    assert any("TL/jaxillusions" in line for line in said)
    assert any(report["cpu_model"] in line for line in said)
