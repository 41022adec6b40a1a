"""The code-completion task's wiring (tasks/code_completion/__init__.py): its view of a split,
the unigram baseline, its config checks, and an end-to-end tiny sweep on a corpus of Python and
JavaScript files written by the test."""

import copy
import csv
import gzip
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from conftest import checked, made_once
from ml_collections import ConfigDict

from jaxillusions import tasks
from jaxillusions.faithfulness.evaluate import make_eval_set
from jaxillusions.pipeline import sweep, validate
from jaxillusions.report import load_results, tables
from jaxillusions.runtime import stages
from jaxillusions.studies import induction, stage
from jaxillusions.tasks import code_completion as code_task
from jaxillusions.tasks.code_completion import copying
from jaxillusions.tasks.code_completion import splits as code_data
from jaxillusions.training import train

CATS = code_data.CATEGORIES
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _split(texts, width, chars=None):
    """A CodeSplit of `texts` labelled by the real lexer (vocabulary: `chars`, default the
    texts' own characters)."""
    vocab = code_data.Vocab(chars or "".join(sorted({c for t in texts for c in t})))
    tokens = np.zeros((len(texts), width), np.int32)
    category = np.full((len(texts), width), -1, np.int8)
    depth = np.zeros((len(texts), width), np.int32)
    for i, text in enumerate(texts):
        cat, dep = code_data.lexer.labels(text, "python")
        tokens[i, : len(text) + 2] = [1, *vocab.encode(text), 2]
        category[i, : len(text)], depth[i, : len(text)] = cat, dep
    return code_data.CodeSplit(tokens, category, depth, np.arange(len(texts), dtype=np.int32),
                               np.array([len(t) for t in texts], np.int32), "python")


def write_corpus(root) -> tuple[str, str]:
    """Python files (functions of varied length and bracket depth) and a JavaScript dir."""
    rng = np.random.default_rng(0)
    py, js = root / "py", root / "js"
    py.mkdir()
    js.mkdir()
    for f in range(24):
        funcs = []
        for j in range(5):
            d = int(rng.integers(1, 5))
            lines = range(1, int(rng.integers(1, 6)))
            body = "".join(f"    x{k} = x{k - 1} * {k}\n" for k in lines)
            funcs.append(f"def f{f}_{j}(x0):\n{body}    return {'h(' * d}x0{')' * d}\n")
        (py / f"m{f}.py").write_text("\n\n".join(funcs))
    for f in range(3):
        (js / f"s{f}.js").write_text("".join(
            f"function g{f}{j}(a) {{ return [a, {j}] }}\n" for j in range(4)))
    return str(py), str(js)


# The code_small config shrunk to seconds: a tiny model, few steps (data: a tiny corpus).
TINY = {
    "data.context": 96, "data.longer_context": 160, "data.min_chars": 8, "data.num_train": -1,
    "data.num_eval": -1, "data.iid_fraction": 0.3, "data.length_quantile": 0.6,
    "data.depth_quantile": 0.7,
    "model.d_model": 16, "model.d_mlp": 32,
    "train.num_seeds": 2, "train.num_steps": 30, "train.batch_size": 8, "train.warmup_steps": 5,
    "train.log_every": 10, "train.eval_every": 30, "train.checkpoint_every": 30,
    "train.eval_batch_size": 32,
    "proxies.methods": ("svd", "onehot_attention"), "proxies.targets": ("blocks.-1.attn.k",),
    "proxies.svd_ranks": (1, 4), "proxies.kmeans_sizes": (2, 4), "proxies.kmeans_samples": 200,
    "proxies.kmeans_iters": 3, "proxies.collect_batch_size": 32, "proxies.eval_batch_size": 32,
}


def tiny_code_small(settings: dict, **data) -> ConfigDict:
    """The code_small config with `settings` ({"section.key": value}) and `data` keys set."""
    from jaxillusions.configs import code_small

    config = code_small.get_config()
    for key, value in settings.items():
        section, name = key.split(".")
        config[section][name] = value
    config.data.update(data)
    return config


def code_config(root) -> ConfigDict:
    """The code_small config shrunk to seconds: a tiny corpus and model, few steps."""
    py, js = write_corpus(root)
    return tiny_code_small(TINY, source=py, other_source=js, cache_dir=str(root / "cache"))


def test_view_evaluates_every_character_and_bins_brackets_at_closers():
    split = _split(["f(a[1])"], 10)
    view = code_task.view(split)
    # Every character is predicted (positions 0..6); the EOS target and PAD are not.
    np.testing.assert_array_equal(view.evaluated[0], [1] * 7 + [0] * 3)
    c = {name: i for i, name in enumerate(CATS)}
    np.testing.assert_array_equal(
        view.bins["category"][0, :7],
        [c["identifier_first"], c["open_bracket"], c["identifier_first"], c["open_bracket"],
         c["digit"], c["close_bracket"], c["close_bracket"]])
    # Bracket depth only at closing-bracket targets: `]` closes depth 2, `)` depth 1.
    np.testing.assert_array_equal(view.bins["bracket_depth"][0, :7], [-1] * 5 + [2, 1])
    eval_set = make_eval_set({"iid": split}, ["iid"], code_task)
    assert eval_set.breakdowns == ("all", "category", "bracket_depth")
    assert eval_set.per_split == (1, len(CATS), 3)
    assert (eval_set.bins[0, :5, 2] == -1).all()  # outside the bracket_depth breakdown


def test_unigram_baseline_counts_training_targets():
    train, test = _split(["aab", "a"], 6), _split(["bb"], 6, "ab")
    # Training targets a a b a: 'a' is the most frequent; ids 0..5 (PAD BOS EOS UNK a b) are
    # add-one smoothed: p(b) = (1 + 1) / (4 + 6).
    out = code_task.unigram(train, test)
    assert out["unigram_acc"] == 0.0
    assert out["unigram_xent"] == pytest.approx(-np.log(2 / 10))


def test_validate_refuses_dyck_only_options_and_bad_values(tmp_path):
    config = code_config(tmp_path)
    validate.validate(config)
    assert tasks.get(config) is code_task
    for key, value, message in (("train.loss_on", "closing", "the code task needs 'all'"),
                                ("data.iid_fraction", 1.5, "data.iid_fraction"),
                                ("task", "nope", "task='nope'")):
        bad = ConfigDict(config.to_dict())
        node, name = (bad, key) if "." not in key else (bad[key.split(".")[0]],
                                                       key.split(".")[1])
        node[name] = value
        with pytest.raises(ValueError, match=message):
            validate.validate(bad)
    bad = ConfigDict(config.to_dict())
    bad.data.num_types = 3  # a Dyck key
    with pytest.raises(ValueError, match="unknown config key data.num_types"):
        validate.validate(bad)


@pytest.fixture(scope="session")
def code_sweep(tmp_path_factory) -> tuple[ConfigDict, str]:
    """(its config, a copy for each test; the workdir) of a finished sweep of code_config,
    made once for the test run (conftest.made_once): read the workdir; copy it to change it."""
    def make(root):
        config, workdir = code_config(root), str(root / "run")
        sweep.run(checked(config), workdir, verbose=False)
        return config, workdir

    return made_once(tmp_path_factory, "code_sweep", make)


@pytest.mark.slow
def test_tiny_code_sweep_end_to_end(code_sweep):
    config, workdir = copy.deepcopy(code_sweep[0]), code_sweep[1]
    with open(os.path.join(workdir, "results.csv")) as f:
        rows = list(csv.DictReader(f))
    assert {r["breakdown"] for r in rows} == {"all", "category", "bracket_depth"}
    assert {r["split"] for r in rows} == set(config.proxies.eval_splits)
    data = code_task.load(checked(config).data, verbose=False)
    for name in config.proxies.eval_splits:
        # Every character target of the split is evaluated, for every seed and proxy...
        n = {int(r["n"]) for r in rows if r["split"] == name and r["breakdown"] == "all"}
        assert n == {int((data[name].category >= 0).sum())}
        # ...and the category bins partition them; bracket_depth counts the closing brackets.
        for breakdown, mask in (("category", data[name].category >= 0),
                                ("bracket_depth", data[name].category == CATS.index(
                                    "close_bracket"))):
            counts = [int(r["n"]) for r in rows if r["split"] == name and r["seed"] == "0"
                      and r["breakdown"] == breakdown and r["method"] == "original"]
            assert sum(counts) == int(mask.sum())
    with open(os.path.join(workdir, "gap_table.txt")) as f:
        text = f.read()
    assert "next-character accuracy" in text and "unigram_acc" in text
    assert "Generalization gap in same_pred by category" in text
    with open(os.path.join(workdir, "baselines.csv")) as f:
        assert [r["split"] for r in csv.DictReader(f)] == list(config.proxies.eval_splits)
    with open(os.path.join(workdir, "gaps_by_category.csv")) as f:
        labels = {r["label"] for r in csv.DictReader(f)}
    assert labels <= set(CATS) and "close_bracket" in labels
    # The summary figures (figures="summary", the default): the categorical ones among them;
    # accuracy per bracket depth only with "all" (or jaxillusions figures).
    figs = set(os.listdir(os.path.join(workdir, "figures")))
    assert {"same_pred_by_category_svd.png", "same_pred_by_category_onehot_attention.png",
            "attention_patterns.png"} <= figs
    assert not [name for name in figs if name.startswith("accuracy_by_")]


def write_codesearchnet(root, n_python: int = 300, n_js: int = 60) -> tuple[str, str]:
    """A directory shaped like the CodeSearchNet download: <language>/final/jsonl/{train,valid,
    test}/<language>_<partition>_<i>.jsonl.gz with its records' fields, and the .pkl files that
    sit beside them (not jsonl: never read). Returns the python and javascript globs, as a user
    passes them."""
    rng = np.random.default_rng(1)

    def record(language, partition, repo, path, name, code):
        return {"repo": repo, "path": path, "func_name": name, "original_string": code,
                "language": language, "code": code, "code_tokens": code.split(),
                "docstring": "", "docstring_tokens": [], "sha": "0" * 40,
                "url": f"https://github.com/{repo}/blob/{'0' * 40}/{path}#L1-L9",
                "partition": partition}

    def python(i):
        d, lines = int(rng.integers(1, 5)), int(rng.integers(0, 5))
        body = "".join(f"    x{k} = x{k - 1} * {k}\n" for k in range(1, lines + 1))
        return (f"def f{i}(x0, name):\n    \"\"\"Scale x{i}.\"\"\"\n{body}"
                f"    return {'h(' * d}x0{')' * d}\n")

    def javascript(i):
        return f"function g{i}(a, b) {{\n  const c = [a, b, {i}];\n  return c.map(x => x + a)\n}}"

    for language, n, make in (("python", n_python, python), ("javascript", n_js, javascript)):
        ext = "py" if language == "python" else "js"
        base = root / language / "final" / "jsonl"
        by_file = {}
        for i in range(n):
            partition = ("train", "train", "train", "valid", "test")[i % 5]
            repo = f"owner{i // 5 % 7}/repo{i // 5 % 7}"
            path = f"src/mod{i // 5}.{ext}"  # five functions per file
            by_file.setdefault(partition, []).append(
                record(language, partition, repo, path, f"f{i}", make(i)))
        for partition, recs in by_file.items():
            (base / partition).mkdir(parents=True)
            for j in range(2):  # the download shards each partition
                with gzip.open(base / partition / f"{language}_{partition}_{j}.jsonl.gz",
                               "wt") as f:
                    f.writelines(json.dumps(r) + "\n" for r in recs[j::2])
        (root / language / f"{language}_dedupe_definitions_v2.pkl").write_bytes(b"\x80\x04N.")
    return (str(root / "python" / "final" / "jsonl" / "**" / "*.jsonl.gz"),
            str(root / "javascript" / "final" / "jsonl" / "**" / "*.jsonl.gz"))


@pytest.mark.slow
def test_codesearchnet_directory_through_the_launcher(tmp_path):
    """The documented CodeSearchNet command (`jaxillusions sweep` with data.source and
    data.other_source overrides) on a generated directory of 360 functions: every function is
    read, the JavaScript gives other_language, and the main job writes its results."""
    py_glob, js_glob = write_codesearchnet(tmp_path / "csn")
    config_file = tmp_path / "code_csn_tiny.py"
    settings = {**TINY, "data.cache_dir": str(tmp_path / "cache")}
    config_file.write_text("from jaxillusions.configs import code_small\n\n\ndef get_config():\n"
                           "    config = code_small.get_config()\n"
                           + "".join(f"    config.{k} = {v!r}\n" for k, v in settings.items())
                           + "    return config\n")
    workdir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "jaxillusions.launch.sweep", f"--config={config_file}",
         f"--workdir={workdir}", f"--config.data.source={py_glob}",
         f"--config.data.other_source={js_glob}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    read = {line.split(":")[1].strip(): line for line in proc.stdout.splitlines()
            if line.startswith("code data: ") and "'records'" in line}
    assert "'files': 6, 'records': 300, 'malformed': 0" in read["python"]
    assert "'files': 6, 'records': 60, 'malformed': 0" in read["javascript"]
    with open(workdir / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert {r["split"] for r in rows} == {"iid", "longer", "deeper", "other_language"}
    config = tiny_code_small(settings, source=py_glob, other_source=js_glob)
    data = code_task.load(checked(config).data, verbose=False)  # the launcher's cached data
    assert data["other_language"].language == "javascript" and len(data["other_language"].tokens)
    n = {int(r["n"]) for r in rows if r["split"] == "other_language" and r["breakdown"] == "all"}
    assert n == {int((data["other_language"].category >= 0).sum())}
    # The mechanism measure on the trained members, as the population run will use it.
    found = induction.probe(str(workdir), batch=4)
    vocab = int(data.vocab.size)
    assert found.length == (vocab - 4) // 2 and found.score.shape == (2, 2, 2)
    assert np.isfinite(found.score).all() and np.isfinite(found.loss_drop).all()
    induction.write(found, str(workdir))
    assert len(tables.read_csv(str(workdir / "induction.csv"))) == 2 * 2 * 2
    gap = copying.identifier_gap(load_results(str(workdir)))
    assert set(gap["split"]) == {"iid", "longer", "deeper", "other_language"}
    assert sorted(set(gap["seed"])) == [0, 1]



@pytest.mark.slow
def test_sweep_probes_induction_heads_once_and_again_when_its_settings_change(code_sweep,
                                                                             tmp_path):
    """The main job's induction stage: induction.csv per seed/layer/head, the per-seed best head
    and loss drop, identifier_repeat vs identifier_first accuracy, TensorBoard scalars and a
    headline line; a relaunch keeps the stage, a changed induction.* setting on a finished sweep
    recomputes only the probe (the earlier CSVs go to superseded/, the proxy stages are kept)."""
    from jaxillusions.runtime.tensorboard import read_scalars  # noqa: PLC0415

    config, workdir = copy.deepcopy(code_sweep[0]), str(tmp_path / "run")
    shutil.copytree(code_sweep[1], workdir)
    heads = tables.read_csv(os.path.join(workdir, "induction.csv"))
    # 2 seeds x 2 layers x 2 heads (code_small's model), each a score in [0, 1].
    assert sorted((r["seed"], r["layer"], r["head"]) for r in heads) == [
        (s, layer, h) for s in (0, 1) for layer in (0, 1) for h in (0, 1)]
    assert all(0 <= r["induction_score"] <= 1 for r in heads)
    best = tables.read_csv(os.path.join(workdir, "induction_seeds.csv"))
    assert [r["seed"] for r in best] == [0, 1]
    for r in best:
        assert r["max_induction_score"] == max(h["induction_score"] for h in heads
                                               if h["seed"] == r["seed"])
        assert r["loss_drop"] == pytest.approx(r["loss_first"] - r["loss_second"], abs=1e-6)
    # The probe is the library's, on the trained parameters: the same numbers from the workdir.
    again = induction.probe(workdir, batch=config.induction.batch, key=config.seed)
    np.testing.assert_allclose(again.max_score, [r["max_induction_score"] for r in best],
                               rtol=1e-6)
    # The code task's second test, on identifier characters: its own columns, the same numbers.
    names = induction.probe(workdir, batch=config.induction.batch, key=config.seed,
                            pool="identifier")
    vocab = code_task.load(checked(config).data, verbose=False).vocab
    assert names.length == len(copying.identifier_pool(vocab)) // 2 < again.length
    assert list(best[0])[-4:] == [f"identifier_{c}" for c in induction.POOL_SEED_COLUMNS]
    np.testing.assert_allclose([r["identifier_loss_drop"] for r in best], names.loss_drop,
                               rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose([h["identifier_score"] for h in heads], names.score.ravel(),
                               rtol=1e-6)
    gap = tables.read_csv(os.path.join(workdir, "identifier_gap.csv"))
    expected = copying.identifier_gap(load_results(workdir))
    assert [(r["seed"], r["split"]) for r in gap] == list(
        zip(expected["seed"], expected["split"], strict=True))
    assert {r["split"] for r in gap} == set(config.proxies.eval_splits)
    np.testing.assert_allclose([r["repeat_minus_first"] for r in gap],
                               expected["repeat_minus_first"], atol=1e-9)
    with open(os.path.join(workdir, "gap_table.txt")) as f:
        headline = tables.summary_of(f.read())
    assert "Induction heads: " in headline and "of 2 seeds" in headline
    assert "by the test on identifier characters" in headline and "; code task: " in headline
    assert "identifier_repeat - identifier_first accuracy (original model): iid " in headline
    board = read_scalars(os.path.join(workdir, "tensorboard"))
    step = config.train.num_steps
    assert board["seed_1"]["induction/max_score"] == [
        (step, pytest.approx(best[1]["max_induction_score"], rel=1e-6))]
    assert "induction/score/layer1_head0" in board["seed_0"]

    # A relaunch after the sweep's end marker is gone: the stage is kept, not probed again.
    stage = stages.stage_file(workdir, "induction")  # the stage saved whole (Stage.stamped)
    before = {name: os.stat(os.path.join(workdir, name)).st_mtime_ns
              for name in (stage, "induction.csv")}
    proxy_files = {p: os.stat(os.path.join(workdir, "proxies", p)).st_mtime_ns
                   for p in os.listdir(os.path.join(workdir, "proxies"))
                   if p != "stage_induction.json"}
    os.remove(os.path.join(workdir, sweep.DONE_FILE))
    sweep.run(checked(config), workdir, verbose=False)
    assert {name: os.stat(os.path.join(workdir, name)).st_mtime_ns for name in before} == before

    # A changed analysis key on the finished sweep: the probe alone runs again.
    config.induction.batch = 8
    sweep.run(checked(config), workdir, verbose=False)
    assert os.stat(stage).st_mtime_ns != before[stage]
    assert {p: os.stat(os.path.join(workdir, "proxies", p)).st_mtime_ns
            for p in proxy_files} == proxy_files
    moved = [os.path.relpath(os.path.join(d, f), workdir)
             for d, _, files in os.walk(os.path.join(workdir, "superseded")) for f in files]
    assert any(p.endswith("/induction.csv") for p in moved)
    assert any(p.endswith("/identifier_gap.csv") for p in moved)
    rerun = induction.probe(workdir, batch=8, key=config.seed)
    np.testing.assert_allclose(
        [r["max_induction_score"]
         for r in tables.read_csv(os.path.join(workdir, "induction_seeds.csv"))],
        rerun.max_score, rtol=1e-6)
    bad = ConfigDict(config.to_dict())
    bad.induction.length = 1000
    with pytest.raises(ValueError, match=r"induction.length=1000: must be 0"):
        validate.validate(bad)


def test_an_induction_length_past_the_datas_vocabulary_stops_before_training(tmp_path):
    """Was: passed the door, which counts data.max_vocab's tokens before the data exists, then
    failed after training ("induction length=120: must be in [2, 87]")."""
    config = code_config(tmp_path)
    config.induction.enabled = True
    settings = checked(config)
    _, model_cfg, _ = train.build(settings)
    pool = len(induction.drawable(model_cfg.vocab_size, induction.task_tokens(settings)))
    config.induction.length = pool + 1
    settings = checked(config)  # the door lets it through: its vocabulary is data.max_vocab's
    with pytest.raises(ValueError, match=rf"^induction.length={pool + 1}: must be 0 \(the "
                                         rf"default, \d+ here\) or in \[2, {pool}\] \({pool} "):
        sweep.run(settings, str(tmp_path / "run"), verbose=False)
    assert not os.path.exists(tmp_path / "run" / "checkpoints")


def test_induction_stage_on_code_leaves_a_diverged_seed_out_of_the_code_analyses(tmp_path):
    """The induction stage of a code run (randomly initialised members, the second diverged):
    the first seed's heads in induction_code.csv and induction_ablation.csv (every evaluated
    split), none of the second's, whose summary in induction_seeds.csv is empty."""
    from types import SimpleNamespace  # noqa: PLC0415

    import jax  # noqa: PLC0415

    from jaxillusions import model  # noqa: PLC0415
    from jaxillusions.training import train  # noqa: PLC0415

    settings = checked(code_config(tmp_path))
    splits, model_cfg, _ = train.build(settings)
    params = jax.vmap(lambda k: model.init_params(k, model_cfg))(
        jax.random.split(jax.random.key(0), 2))
    state = SimpleNamespace(params=params, healthy=np.array([True, False]),
                            step=np.zeros(2, np.int32))
    workdir = tmp_path / "run"
    workdir.mkdir()
    ctx = stage.Context(settings=settings, workdir=str(workdir), say=lambda *a, **k: None,
                         verbose=False, move_aside=None, splits=splits, model_cfg=model_cfg,
                         state=state)
    found = induction.run(ctx).made["induction"]["found"]
    assert np.isfinite(found.analyses.code.values["prev_token_attention"][0]).all()
    assert np.isnan(found.analyses.code.values["target_attention"][1]).all()
    code = tables.read_csv(str(workdir / "induction_code.csv"))
    assert {r["seed"] for r in code} == {0} and len(code) == 4
    ablation = tables.read_csv(str(workdir / "induction_ablation.csv"))
    assert {r["seed"] for r in ablation} == {0}
    assert {r["split"] for r in ablation} == set(settings.proxies.eval_splits)
    per_seed = tables.read_csv(str(workdir / "induction_seeds.csv"))
    assert np.isfinite(per_seed[0]["ablation_repeat_minus_other"])
    assert all(np.isnan(per_seed[1][k]) for k in copying.CODE_SEED_COLUMNS)


def test_induction_stage_in_seed_chunks_equals_one_call(tmp_path):
    """With train.seed_chunk_size (the code config: 8 chunks of 8, so that the stage fits where
    the evaluation does) the stage gives what one call over every seed gives: 3 seeds in chunks
    of 2 (the last padded with a copy of seed 2) against all 3 at once. Attention and loss are
    means of float32 terms computed in programs of another seed width, so they agree within a
    mean's rounding (tolerance.mean_error); correct predictions are counts, and a near-tie of two
    logits may flip one of them."""
    import dataclasses  # noqa: PLC0415
    from types import SimpleNamespace  # noqa: PLC0415

    import jax  # noqa: PLC0415
    from tolerance import mean_error, two_ways  # noqa: PLC0415

    from jaxillusions import model  # noqa: PLC0415
    from jaxillusions.training import train  # noqa: PLC0415

    settings = checked(code_config(tmp_path))
    splits, model_cfg, _ = train.build(settings)
    params = jax.vmap(lambda k: model.init_params(k, model_cfg))(
        jax.random.split(jax.random.key(0), 3))
    state = SimpleNamespace(params=params, healthy=np.ones(3, bool), step=np.zeros(3, np.int32))
    found = {}
    for size in (0, 2):
        config = dataclasses.replace(settings, train=dataclasses.replace(
            settings.train, num_seeds=3, seed_chunk_size=size))
        workdir = tmp_path / f"chunks_{size}"
        workdir.mkdir()
        ctx = stage.Context(settings=config, workdir=str(workdir), say=lambda *a, **k: None,
                             verbose=False, move_aside=None, splits=splits, model_cfg=model_cfg,
                             state=state)
        found[size] = induction.run(ctx).made["induction"]["found"]
    whole, chunked = found[0], found[2]
    assert chunked.seeds == whole.seeds == (0, 1, 2)
    rows = settings.induction.code_rows * settings.data.context
    attention = two_ways(mean_error(rows, 1.0, 1.0))
    np.testing.assert_allclose(chunked.score, whole.score, rtol=0, atol=attention)
    for k, v in whole.analyses.code.values.items():
        np.testing.assert_allclose(chunked.analyses.code.values[k], v, rtol=0, atol=attention,
                                   err_msg=k)
    nats = np.log(model_cfg.vocab_size)  # an untrained model's loss per position, about ln V
    loss = two_ways(mean_error(settings.induction.batch * whole.length, nats, nats))
    np.testing.assert_allclose(chunked.loss_first, whole.loss_first, rtol=0, atol=loss)
    np.testing.assert_allclose(chunked.loss_second, whole.loss_second, rtol=0, atol=loss)
    assert chunked.analyses.ablation.correct.shape == whole.analyses.ablation.correct.shape
    assert np.abs(chunked.analyses.ablation.correct - whole.analyses.ablation.correct).sum() <= 3
    np.testing.assert_array_equal(chunked.analyses.ablation.count, whole.analyses.ablation.count)


@pytest.mark.slow
def test_sweep_ablates_each_head_and_measures_attention_on_the_repeats_of_code(code_sweep):
    """The induction stage's code analyses in the main job: induction_code.csv (every head's
    attention at identifier_repeat queries), induction_ablation.csv (accuracy per category with
    each head mean-ablated, on iid and the evaluated splits; its acc_original is the original
    model's accuracy of results.csv), the best heads' summary in induction_seeds.csv and the
    headline's line on it."""
    config, workdir = code_sweep
    heads = [(s, layer, h) for s in (0, 1) for layer in (0, 1) for h in (0, 1)]
    code = tables.read_csv(os.path.join(workdir, "induction_code.csv"))
    assert list(code[0]) == list(copying.CODE_COLUMNS)
    assert [(r["seed"], r["layer"], r["head"]) for r in code] == heads
    assert all(r["queries"] > 0 and 0 <= r["target_attention"] <= 1 for r in code)
    assert all(r["uniform_on_target"] == code[0]["uniform_on_target"] for r in code)
    ablation = tables.read_csv(os.path.join(workdir, "induction_ablation.csv"))
    assert list(ablation[0]) == list(copying.ABLATION_COLUMNS)
    assert {r["split"] for r in ablation} == set(config.proxies.eval_splits)
    assert sorted({(r["seed"], r["layer"], r["head"]) for r in ablation}) == heads
    df = load_results(workdir)
    original = df[(df["method"] == "original") & (df["breakdown"] == "category")].set_index(
        ["seed", "split", "bin"])
    for r in ablation:
        row = original.loc[(r["seed"], r["split"], CATS.index(r["category"]))]
        assert r["n"] == row["n"] and r["acc_original"] == pytest.approx(row["acc"], abs=1e-6)
    per_seed = tables.read_csv(os.path.join(workdir, "induction_seeds.csv"))
    assert list(per_seed[0]) == list(induction.SEED_COLUMNS + copying.CODE_SEED_COLUMNS) + [
        f"identifier_{c}" for c in induction.POOL_SEED_COLUMNS]
    for seed in per_seed:
        (best,) = [r for r in ablation if r["seed"] == seed["seed"] and r["best"]
                   and r["split"] == "iid" and r["category"] == "identifier_repeat"]
        assert (best["layer"], best["head"]) == (seed["best_layer"], seed["best_head"])
        assert seed["ablation_drop_repeat"] == pytest.approx(best["drop"], abs=1e-6)
        rest = [r for r in ablation if r["seed"] == seed["seed"] and r["best"]
                and r["split"] == "iid" and r["category"] != "identifier_repeat"]
        assert seed["ablation_drop_other"] == pytest.approx(
            sum(r["drop"] * r["n"] for r in rest) / sum(r["n"] for r in rest), abs=1e-6)
    with open(os.path.join(workdir, "gap_table.txt")) as f:
        headline = tables.summary_of(f.read())
    assert "Best head mean-ablated (iid, 2 seeds): accuracy drop on identifier_repeat " in headline


def test_code_claims_tables_the_paired_gaps_per_category_and_depth(code_sweep):
    """benchmarks/code_claims.py (the docs' tables of a code population): one table per proxy
    family and size, a row per category with the gap and interval of gaps_by_category.csv, and
    the seeds' induction verdict."""
    from benchmarks import code_claims

    _, workdir = code_sweep
    population = code_claims.load([workdir])
    by_family = code_claims.gap_tables(population, "category", sizes={1})
    written = [g for g in tables.read_csv(os.path.join(workdir, "gaps_by_category.csv"))
               if g["metric"] == "same_pred"]
    assert set(by_family) == {(g["method"], g["site"], g["size"]) for g in written
                              if g["size"] in (0, 1)}
    g = next(g for g in written if (g["method"], g["size"], g["split"], g["label"])
             == ("svd", 1, "deeper", "identifier_repeat"))
    (line,) = [ln for ln in by_family["svd", g["site"], 1].splitlines()
               if ln.startswith("| identifier_repeat |")]
    assert f"{g['gap']:+.3f} [{g['ci_low']:+.3f}, {g['ci_high']:+.3f}]" in line
    # The last cell: the seeds with a positive gap per split, in the header's order, of n.
    header = by_family["svd", g["site"], 1].splitlines()[0].split("|")[-2].strip()
    splits = header.removeprefix("seeds > 0 (").removesuffix(")").split("/")
    positive, n = line.split("|")[-2].strip().split(" of ")
    assert positive.split(", ")[splits.index("deeper")] == str(g["seeds_positive"])
    assert n == str(g["n_seeds"])
    assert len(by_family["svd", g["site"], 1].splitlines()) == 2 + len(
        {r["label"] for r in written if (r["method"], r["size"]) == ("svd", 1)})
    depth = code_claims.gap_tables(population, "bracket_depth")
    assert set(depth) == {(g["method"], g["site"], g["size"]) for g in written}
    text = code_claims.mechanism(population)
    assert "of 2 seeds by the random-token test" in text
    # At 2 seeds Spearman's rho and its bootstrap interval are undefined: said, not printed.
    assert "nan" not in text
    assert "loss_drop vs the identifier_repeat gap: undefined at 2 seeds" in text


def test_code_claims_pools_the_seeds_of_runs_of_one_config(code_sweep, tmp_path):
    """Two runs of one config with disjoint seeds are one population (here the tiny sweep and a
    copy of it relabeled as seeds 2 and 3); runs sharing seeds, or of another config, are
    refused."""
    import pandas as pd

    from benchmarks import code_claims

    _, workdir = code_sweep
    other = tmp_path / "seeds2"
    shutil.copytree(workdir, other)
    with open(other / "config.json") as f:
        stored = json.load(f)
    stored["seed"] = 2
    with open(other / "config.json", "w") as f:
        json.dump(stored, f)
    for name in ("results.csv", *code_claims.INDUCTION_FILES.values()):
        table = pd.read_csv(other / name, keep_default_na=False, na_values={})
        table.assign(seed=table["seed"] + 2).to_csv(other / name, index=False)
    with pytest.raises(ValueError, match="share seeds"):
        code_claims.load([workdir, workdir])
    pooled = code_claims.load([workdir, str(other)])
    assert sorted(set(pooled.df["seed"])) == [0, 1, 2, 3]
    one = code_claims.gap_tables(code_claims.load([workdir]), "category", sizes={1})
    both = code_claims.gap_tables(pooled, "category", sizes={1})
    assert set(both) == set(one)
    for key, table in both.items():  # each seed twice: the same mean gaps, of 4 seeds
        rows = [ln for ln in table.splitlines() if ln.startswith("| identifier_repeat |")]
        assert rows and rows[0].endswith(" of 4 |")
        single = [ln for ln in one[key].splitlines() if ln.startswith("| identifier_repeat |")]
        mean = [c.split(" [")[0] for c in rows[0].split(" | ")[4:-1]]
        assert mean == [c.split(" [")[0] for c in single[0].split(" | ")[4:-1]]
    assert "of 4 seeds by the random-token test" in code_claims.mechanism(pooled)
    stored["train"]["num_steps"] += 1
    with open(other / "config.json", "w") as f:
        json.dump(stored, f)
    with pytest.raises(ValueError, match="differ in train.num_steps"):
        code_claims.load([workdir, str(other)])


def test_code_claims_compares_two_populations_of_the_same_seeds(code_sweep, tmp_path):
    """`compare`: per seed, this population's measures minus another's on their shared seeds
    (here the tiny sweep against a copy whose loss drops on identifier characters are 0.1
    lower): the accuracies differ by 0, that loss drop by +0.1 in every seed (exact sign-flip
    p of 2 seeds: 2/4); populations without 2 shared seeds are refused."""
    import pandas as pd

    from benchmarks import code_claims

    _, workdir = code_sweep
    other = tmp_path / "lower"
    shutil.copytree(workdir, other)
    per_seed = pd.read_csv(other / "induction_seeds.csv")
    per_seed["identifier_loss_drop"] -= 0.1
    per_seed.to_csv(other / "induction_seeds.csv", index=False)
    table = code_claims.compare(code_claims.load([workdir]), code_claims.load([str(other)]))
    rows = {ln.split(" | ")[0].removeprefix("| "): ln.split(" | ")
            for ln in table.splitlines() if ln.startswith("| ")}
    assert table.startswith("2 seeds in both (0, 1):")
    assert rows["accuracy iid"][3].startswith("+0.000 [") and rows["accuracy iid"][4] == "0/2"
    drop = rows["identifier_loss_drop"]
    assert drop[3] == "+0.100 (the same in every seed)" and drop[4] == "2/2"  # no spread
    assert drop[5] == "0.5000 |"
    relabeled = pd.read_csv(other / "results.csv", keep_default_na=False, na_values={})
    relabeled.assign(seed=relabeled["seed"] + 2).to_csv(other / "results.csv", index=False)
    with pytest.raises(ValueError, match="share 0 seed"):
        code_claims.compare(code_claims.load([workdir]), code_claims.load([str(other)]))
