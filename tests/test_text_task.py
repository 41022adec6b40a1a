"""The text task (tasks/text.py) and runs on imported checkpoints (model.pretrained,
training/imported.py): a BPE tokenizer trained here with `tokenizers` on this repository's own
source, text files in a temporary directory, tiny random GPT-NeoX checkpoints saved with
`transformers`. The splits, breakdowns and concepts on planted rows and text; the one-line
refusals at the door; evaluation in row chunks at a large vocabulary; and a main job through
the launcher on two imported checkpoints, training skipped, a transcoder among its proxies."""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest
from conftest import users_xla_flags, xla_flags
from ml_collections import ConfigDict

from jaxillusions import configs, tasks
from jaxillusions.pipeline import validate
from jaxillusions.runtime import chunks
from jaxillusions.tasks import text
from jaxillusions.training import memory, train

tokenizers = pytest.importorskip("tokenizers")

ROOT = pathlib.Path(__file__).resolve().parents[1]
SOURCES = sorted((ROOT / "jaxillusions" / "tasks").glob("*.py"))


def _tokenizer(files: list[str], path: str, vocab: int = 300, specials=("<|pad|>",
                                                                          "<|endoftext|>")):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train(files, trainers.BpeTrainer(vocab_size=vocab, special_tokens=list(specials),
                                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(path)
    return tok


def _neox(path, vocab: int, seed: int, **options):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(seed)
    cfg = transformers.GPTNeoXConfig(**{
        "vocab_size": vocab, "num_hidden_layers": 2, "hidden_size": 32,
        "num_attention_heads": 2, "intermediate_size": 64, "max_position_embeddings": 64,
        "rotary_pct": 0.25, "use_parallel_residual": True, "bos_token_id": 1,
        "eos_token_id": 1, "initializer_range": 0.2, **options})
    transformers.GPTNeoXForCausalLM(cfg).eval().save_pretrained(str(path))
    return str(path)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """{name: path}: train.txt (four of the task modules, functions joined by <|endoftext|>),
    other.jsonl (a fifth, a paragraph per line), the tokenizer trained on train.txt, and two
    tiny GPT-NeoX checkpoints of its vocabulary (seed1, seed2)."""
    root = tmp_path_factory.mktemp("text")
    out = {"train": str(root / "train.txt"), "other": str(root / "other.jsonl"),
           "tokenizer": str(root / "tokenizer.json"), "cache": str(root / "cache")}
    pathlib.Path(out["train"]).write_text("\n<|endoftext|>\n".join(
        p.read_text() for p in SOURCES[:4]))
    with open(out["other"], "w") as f:
        for paragraph in SOURCES[4].read_text().split("\n\n"):
            f.write(json.dumps({"text": paragraph}) + "\n")
    tok = _tokenizer([out["train"]], out["tokenizer"])
    out["vocab"] = tok.get_vocab_size()
    for seed in (1, 2):
        out[f"seed{seed}"] = _neox(root / "ckpt" / f"seed{seed}", out["vocab"], seed)
    return out


def _config(corpus, **keys) -> ConfigDict:
    """A text config on `corpus` (imported seed1 and seed2), `keys` ({"data.window": 16})
    set on it."""
    config = configs.defaults("text")
    config.cpu_devices = 0
    config.data.files = {"train": (corpus["train"],), "other": (corpus["other"],)}
    config.data.tokenizer = corpus["tokenizer"]
    config.data.window = 32
    config.data.longer_window = 64
    config.data.max_rows = 200
    config.data.cache_dir = corpus["cache"]
    config.model.pretrained = (corpus["seed1"], corpus["seed2"])
    config.proxies.methods = ("svd", "kmeans")
    config.proxies.targets = ("blocks.1.attn.k",)
    config.proxies.eval_splits = ("iid", "other", "longer")
    config.proxies.kmeans_sizes = (2, 4)
    config.proxies.kmeans_samples = 500
    config.proxies.kmeans_iters = 5
    for key, value in keys.items():
        *path, last = key.split(".")
        node = config
        for part in path:
            node = node[part]
        node[last] = value
    return config


# ---------------------------------------------------------------------------------------------
# Breakdowns and splits.


def test_copyable_marks_a_repeated_bigram_and_nothing_else():
    tokens = np.array([[1, 5, 6, 7, 5, 6, 8, 5],
                       [1, 5, 5, 5, 0, 9, 9, 9]])
    got = text.copyable(tokens)
    # Row 0: the bigram (5, 6) at positions 1 and 4: position 4 predicts a copyable 6.
    np.testing.assert_array_equal(got[0], [0, 0, 0, 0, 1, 0, 0, -1])
    # Row 1: (5, 5) again at 2; PAD (token 0) at 4 is not evaluated; (9, 9) again at 6.
    np.testing.assert_array_equal(got[1], [0, 0, 1, 0, -1, 0, 1, -1])


def test_frequency_bands_are_quarters_of_the_train_targets():
    counts = np.array([0, 50, 30, 10, 5, 5, 0])
    # Occurrences of more frequent ids before each: 1: 0, 2: 50, 3: 80, 4: 90, 5: 95.
    np.testing.assert_array_equal(text.frequency_bands(counts), [4, 0, 2, 3, 3, 3, 4])
    assert text.bin_labels("frequency")[4] == "unseen"
    np.testing.assert_array_equal(text.position_bins(8), [0, 1, 1, 2, 2, 2, 2, 3])
    assert text.bin_labels("position")[:4] == ("0", "1-2", "3-6", "7-14")


def _brute_copyable(row) -> list[int]:
    out = []
    for t in range(len(row) - 1):
        seen = any(row[s] == row[t] and row[s + 1] == row[t + 1] for s in range(t))
        out.append(-1 if row[t] == tasks.PAD else int(seen))
    return [*out, -1]


def test_splits_are_windows_of_the_text_with_their_annotations(corpus, tmp_path):
    settings = validate.parse(_config(corpus, **{"data.cache_dir": str(tmp_path)}))
    data = settings.data
    splits = text.load(data, verbose=False)
    assert text.split_names(data) == ("train", "iid", "other", "longer")
    assert set(splits) == set(text.split_names(data))
    tok = text.tokenizer(data)
    bos = tok.token_to_id("<|endoftext|>")  # auto: the first of text.AUTO_BOS it has
    assert text.bos_id(data) == bos
    stream = np.concatenate([tok.encode(open(corpus["train"]).read(),
                                        add_special_tokens=False).ids])
    windows = {tuple(stream[i:i + 31]) for i in range(len(stream) - 30)}
    for name, width in (("train", 32), ("iid", 32), ("longer", 64), ("other", 32)):
        rows = splits[name].tokens
        assert rows.shape[1] == width and 0 < len(rows) <= data.max_rows, name
        assert (rows[:, 0] == bos).all(), name
        if name != "other":  # contiguous text of the train files
            assert all(tuple(r[1:32]) in windows for r in rows[:20]), name
    # iid and longer are held-out text that train never contains; iid's windows lie in longer's.
    train_rows = {tuple(r) for r in splits["train"].tokens}
    assert not any(tuple(r) in train_rows for r in splits["iid"].tokens)
    longer_text = {tuple(r[1 + i:32 + i]) for r in splits["longer"].tokens for i in (0, 31)}
    assert all(tuple(r[1:]) in longer_text for r in splits["iid"].tokens)
    # The annotations: copyable against a brute force, frequency bands of train's targets.
    for name in ("train", "other"):
        split = splits[name]
        for row, copy in zip(split.tokens[:10], split.copyable[:10], strict=True):
            assert list(copy) == _brute_copyable(list(row))
        view = text.view(split)
        np.testing.assert_array_equal(view.evaluated, split.copyable >= 0)
        assert not view.evaluated[:, -1].any() and view.evaluated[:, :-1].all()
        assert set(np.unique(view.bins["frequency"][view.evaluated])) <= set(range(5))
        assert view.num_bins["position"] == 5  # 32 positions: bins 0 .. 4 (15-30: bin 4)
        labels = tasks.concept_labels(text, split, ("copyable",))[..., 0]
        np.testing.assert_array_equal(labels, split.copyable)
    train = splits["train"]
    targets = train.tokens[:, 1:]
    share = [np.mean(train.frequency[:, :-1] == b) for b in range(4)]
    assert all(0.1 < s < 0.45 for s in share), share  # about a quarter each
    assert int(train.frequency[:, :-1][targets == np.bincount(targets.ravel()).argmax()][0]) == 0
    # The same data again (the cache) and a check_data that passes.
    again = text.load(data, verbose=False)
    np.testing.assert_array_equal(again["iid"].tokens, splits["iid"].tokens)
    tasks.check_data(settings, splits)
    # From Python, a config's own data section reads the same cached splits (the Python API's
    # route on imported checkpoints). Was: TypeError, asdict() on a ConfigDict.
    config_data = _config(corpus, **{"data.cache_dir": str(tmp_path)}).data
    assert text._cache_key(config_data) == text._cache_key(data)  # noqa: SLF001
    from_config = text.load(config_data, verbose=False)
    for name in splits:
        np.testing.assert_array_equal(from_config[name].tokens, splits[name].tokens)


def test_a_repeated_phrase_in_the_text_is_copyable_where_it_repeats(corpus, tmp_path):
    tok = text.tokenizer(validate.parse(_config(corpus)).data)
    phrase = " zebra quokka narwhal axolotl"
    body = "Some words come first and then" + phrase + " and more words follow" + phrase
    (tmp_path / "planted.txt").write_text(body)
    ids = tok.encode(body, add_special_tokens=False).ids
    first = len(tok.encode("Some words come first and then", add_special_tokens=False).ids)
    span = len(tok.encode(phrase, add_special_tokens=False).ids)
    window = 1 + len(ids)  # one row: the BOS and the whole text
    settings = validate.parse(_config(corpus, **{
        "data.files": {"train": (corpus["train"],), "planted": (str(tmp_path / "planted.txt"),)},
        "data.window": window, "data.longer_window": 0, "data.cache_dir": str(tmp_path)}))
    row = text.load(settings.data, verbose=False)["planted"]
    assert row.tokens.shape == (1, window)
    copy = row.copyable[0]
    second = 1 + len(ids) - span  # where the phrase starts again, in the row (BOS first)
    # Each of the phrase's bigrams is copyable where the phrase repeats, and not the first time.
    assert (copy[second:second + span - 1] == 1).all(), copy
    assert (copy[1 + first:1 + first + span - 1] == 0).all(), copy


# ---------------------------------------------------------------------------------------------
# Refusals at the door, one line each.


def _refused(config, match: str) -> str:
    with pytest.raises(ValueError, match=match) as err:
        validate.check(config)
    assert "\n" not in str(err.value), str(err.value)
    return str(err.value)


def test_bad_inputs_are_one_line_errors_naming_the_path_or_key(corpus, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    blank = tmp_path / "blank.jsonl"
    blank.write_text('{"text": "   "}\n\n')
    nofield = tmp_path / "nofield.jsonl"
    nofield.write_text('{"body": "x"}\n')
    csv = tmp_path / "a.csv"
    csv.write_text("a,b")
    missing = str(tmp_path / "missing.txt")
    files = {"train": (corpus["train"],), "other": (corpus["other"],)}
    _refused(_config(corpus, **{"data.files": {**files, "other": (missing,)}}),
             rf"^data.files\['other'\]: {missing} is not a file$")
    _refused(_config(corpus, **{"data.files": {**files, "other": (str(empty),)}}),
             rf"^data.files\['other'\]: {empty} is empty$")
    _refused(_config(corpus, **{"data.files": {**files, "other": (str(csv),)}}),
             "must be a .txt or a .jsonl file")
    _refused(_config(corpus, **{"data.files": {"other": (corpus["other"],)}}),
             r"^data.files=.*: no 'train' split")
    _refused(_config(corpus, **{"data.files": {**files, "iid": (corpus["other"],)}}),
             "split name 'iid' is made from the train files")
    _refused(_config(corpus, **{"data.tokenizer": missing}),
             f"^data.tokenizer: {missing} is not a file$")
    _refused(_config(corpus, **{"data.tokenizer": corpus["train"]}),
             f"^data.tokenizer: {corpus['train']} is not a tokenizer.json")
    _refused(_config(corpus, **{"data.bos": "<nope>"}), "data.bos='<nope>': not a token")
    _refused(_config(corpus, **{"data.longer_window": 16}),
             r"^data.longer_window=16: must be 0 \(no longer split\) or > data.window$")
    # The model: its vocabulary, positions and the checkpoints' own tokenizer.
    small = _neox(tmp_path / "small_vocab", corpus["vocab"] - 10, 3)
    _refused(_config(corpus, **{"model.pretrained": (small,)}),
             rf"^data.tokenizer=.*: its vocabulary of {corpus['vocab']} ids is larger than the "
             rf"checkpoints' vocab_size {corpus['vocab'] - 10} \({small}\)")
    transformers = pytest.importorskip("transformers")
    gpt2 = tmp_path / "gpt2"
    transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=corpus["vocab"], n_layer=1, n_embd=16, n_head=2, n_positions=48,
        bos_token_id=1, eos_token_id=1)
    ).save_pretrained(str(gpt2))
    _refused(_config(corpus, **{"model.pretrained": (str(gpt2),)}),
             r"^data.longer_window=64: rows of 64 tokens, more than the 48 positions")
    mine = tmp_path / "with_tokenizer"
    shutil.copytree(corpus["seed1"], mine)
    _tokenizer([corpus["other"]], str(mine / "tokenizer.json"), vocab=280)
    _refused(_config(corpus, **{"model.pretrained": (str(mine),)}),
             "its vocabulary is not that of the checkpoint's own")
    _refused(_config(corpus, **{"model.pretrained": (missing,)}),
             f"^model.pretrained: {missing}: not a directory")
    # Was ": not a directory" (`--config.model.pretrained=` gives one empty path).
    _refused(_config(corpus, **{"model.pretrained": (str(corpus["seed1"]), "")}),
             r"^model.pretrained: an empty path \(item 2 of 2\); name each checkpoint's")
    _refused(_config(corpus, **{"model.d_model": 64}), "^model.d_model=64: the architecture "
             "comes from the checkpoints of model.pretrained")
    # Not refused: the transcoder reads what the MLP reads (resid_pre in Pythia's parallel
    # blocks; tests/test_transcoder_imported.py).
    validate.check(_config(corpus, **{"proxies.methods": ("transcoder",),
                                      "proxies.transcoder_sizes": (4,),
                                      "proxies.transcoder_targets": ("blocks.0.mlp.out",)}))
    _refused(_config(corpus, **{"proxies.eval_splits": ("iid", "python")}),
             "unknown split 'python'; available: train, iid, other, longer$")
    # A split of the task's that these data.* settings do not make: the key that makes it.
    _refused(_config(corpus, **{"data.longer_window": 0}),
             r"unknown split 'longer'; available: train, iid, other; 'longer' is made by "
             r"data.longer_window \(0 \(no longer split\) or > data.window\)$")
    # Found when the data loads, before any work: a file of no text, one too short for a row.
    latin = tmp_path / "latin.txt"
    latin.write_bytes("def f():\n    return 'café'\n".encode("latin-1"))
    for bad, match in ((blank, "has no text"), (nofield, 'line 1 has no "text" string'),
                       (latin, "is not UTF-8 text \\(byte 0xe9 at offset 24, line 2\\); save "
                               "it as UTF-8$")):
        settings, _ = validate.check(_config(corpus, **{
            "data.files": {**files, "bad": (str(bad),)}, "data.cache_dir": str(tmp_path)}))
        with pytest.raises(ValueError, match=rf"^data.files\['bad'\]: {bad} {match}"):
            text.load(settings.data, verbose=False)
    short = tmp_path / "short.txt"
    short.write_text("def f(): pass")
    settings, _ = validate.check(_config(corpus, **{
        "data.files": {**files, "short": (str(short),)}, "data.cache_dir": str(tmp_path)}))
    with pytest.raises(ValueError, match=r"^data: data.files\['short'\] give no row of 32"):
        text.load(settings.data, verbose=False)


def test_a_byte_order_mark_and_windows_line_ends_read_as_plain_utf8(tmp_path):
    # A BOM made line 1 of a .jsonl "not JSON" and was tokenized at the start of a .txt.
    paragraphs = ["def f(x):\n    return x", "Grüße → ∑", "last"]
    plain, marked = tmp_path / "plain", tmp_path / "marked"
    plain.mkdir()
    marked.mkdir()
    (plain / "a.txt").write_text("\n".join(paragraphs), encoding="utf-8")
    (marked / "a.txt").write_bytes(b"\xef\xbb\xbf" + "\r\n".join(paragraphs).encode())
    lines = [json.dumps({"text": p}, ensure_ascii=False) for p in paragraphs]
    (plain / "a.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (marked / "a.jsonl").write_bytes(b"\xef\xbb\xbf" + "\r\n".join(lines).encode())
    for name in ("a.txt", "a.jsonl"):
        assert text._documents("x", str(marked / name)) == text._documents(
            "x", str(plain / name)), name
    assert text._documents("x", str(plain / "a.jsonl")) == paragraphs


def test_a_leading_tilde_is_the_home_folder_in_checkpoint_and_tokenizer_paths(
        corpus, tmp_path, monkeypatch):
    # model.pretrained read '~' literally ("not a directory") where data.files expand it, and
    # the tokenizer's path was normalized before the file system saw it: '~/link/..' is the
    # link's parent, not the home folder.
    home = tmp_path / "home"
    home.mkdir()
    (home / "link").symlink_to(pathlib.Path(corpus["seed1"]).parent, target_is_directory=True)
    (home / "link_up").symlink_to(pathlib.Path(corpus["tokenizer"]).parent / "ckpt",
                                  target_is_directory=True)
    monkeypatch.setenv("HOME", str(home))
    settings, _ = validate.check(_config(corpus, **{
        "model.pretrained": ("~/link/seed1", "~/link/seed2"),
        "data.tokenizer": "~/link_up/../tokenizer.json", "data.cache_dir": str(tmp_path)}))
    assert text.tokenizer(settings.data).get_vocab_size() == corpus["vocab"]
    from jaxillusions.model import pretrained

    assert pretrained.member_labels(["~/link/seed1", "~/link/seed2"]) == ["seed1", "seed2"]
    assert pretrained.inspect_checkpoint("~/link/seed1").path == str(home / "link" / "seed1")


def test_a_workdir_that_stored_relative_paths_is_the_same_run_from_where_it_was_launched(
        corpus, tmp_path, monkeypatch):
    # Paths are stored absolute; a workdir claimed before, with them as typed in its
    # config.json, is still the same run when relaunched from the folder they were typed in.
    root = pathlib.Path(corpus["train"]).parent
    monkeypatch.chdir(root)
    typed = {"model.pretrained": ("ckpt/seed1", "ckpt/seed2"), "data.tokenizer": "tokenizer.json"}
    settings, _ = validate.check(_config(corpus, **typed))
    assert settings.model.pretrained == (corpus["seed1"], corpus["seed2"])
    assert settings.data.tokenizer == corpus["tokenizer"]
    workdir = tmp_path / "older"
    workdir.mkdir()
    stored = json.loads(json.dumps(settings.to_dict()))
    stored["model"]["pretrained"] = list(typed["model.pretrained"])
    stored["data"]["tokenizer"] = typed["data.tokenizer"]
    (workdir / "config.json").write_text(json.dumps(stored))
    train.claim_workdir(str(workdir), settings)
    assert json.loads((workdir / "config.json").read_text()) == stored  # the same run, as it was
    monkeypatch.chdir(tmp_path)  # elsewhere, the typed paths name other files: another run
    with pytest.raises(ValueError, match="different config"):
        train.claim_workdir(str(workdir), settings)


def test_a_checkpoint_rewritten_after_the_run_began_is_refused(corpus, tmp_path):
    # The workdir keeps no copy of the weights: a relaunch, load_run and the figures read the
    # checkpoints again, so another revision downloaded into the same directory would have
    # mixed two models' numbers in one run.
    from jaxillusions.training import imported

    paths = [str(tmp_path / name) for name in ("seed1", "seed2")]
    for name, path in zip(("seed1", "seed2"), paths, strict=True):
        shutil.copytree(corpus[name], path)
    settings, _ = validate.check(_config(corpus, **{"model.pretrained": tuple(paths)}))
    workdir = tmp_path / "run"
    workdir.mkdir()
    first, _ = imported.load_params(settings, str(workdir), record=True)
    assert (workdir / imported.RECORD).exists()
    # The same weights in another format are the same weights (transformers 5's module names
    # GPT-NeoX's head lm_head, which its save_pretrained writes as embed_out).
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = transformers.GPTNeoXForCausalLM.from_pretrained(paths[1])
    os.remove(os.path.join(paths[1], "model.safetensors"))
    torch.save(model.state_dict(), os.path.join(paths[1], "pytorch_model.bin"))
    again, _ = imported.load_params(settings, str(workdir))
    np.testing.assert_array_equal(again["unembed"]["w"], first["unembed"]["w"])
    _neox(paths[1], corpus["vocab"], 7)  # another model in the same directory
    with pytest.raises(ValueError, match=rf"^model.pretrained: the weights in {paths[1]} are not "
                                         "those this run was computed from") as err:
        imported.load_params(settings, str(workdir))
    assert "\n" not in str(err.value)
    # The training stage claims the workdir (config.json, with a changed analysis setting) only
    # once the weights have passed: a refused relaunch leaves it as it was (it had rewritten
    # config.json, which then no longer matched sweep_done.json and the figures refused).
    claimed = []
    with pytest.raises(ValueError, match="not those this run was computed from"):
        imported.load_sweep(settings, str(workdir), splits=None, model_cfg=None,
                            members=train.members(settings),
                            claim=lambda: claimed.append(True) or [], say=lambda *a, **k: None)
    assert not claimed
    imported.load_params(settings, None)  # without a workdir: nothing to compare with


def test_a_relaunch_on_changed_text_files_is_refused_with_nothing_moved(corpus, tmp_path):
    """The workdir records its splits' tokens: text files edited after the run (the splits are
    made again from them) are one line naming the split, before any report moves; the relaunch
    had refitted the changed families on the new text and kept the others from the old, in one
    results.csv; load_run refuses them too."""
    from jaxillusions.pipeline import sweep
    from jaxillusions.report import load_run

    train_txt = tmp_path / "train.txt"
    shutil.copy(corpus["train"], train_txt)
    config = _config(corpus, **{"data.files": {"train": (str(train_txt),)},
                                "proxies.methods": ("svd",),
                                "proxies.eval_splits": ("iid", "longer"), "figures": "none"})
    workdir = str(tmp_path / "run")
    sweep.run(validate.check(config)[0], workdir, verbose=False)
    results = (tmp_path / "run" / "results.csv").read_bytes()
    train_txt.write_text(train_txt.read_text().replace("def ", "def  "))
    config.proxies.svd_ranks = (1, 2)  # an analysis change: the relaunch refits
    with pytest.raises(ValueError, match=r"^data: the train split is not the one this run was "
                       r"computed from") as err:
        sweep.run(validate.check(config)[0], workdir, verbose=False)
    assert "\n" not in str(err.value)
    assert (tmp_path / "run" / "results.csv").read_bytes() == results
    assert not (tmp_path / "run" / "superseded").exists()
    with pytest.raises(ValueError, match="^data: the train split is not the one"):
        load_run(workdir)


def test_a_relaunch_on_changed_weights_is_refused_with_nothing_moved(corpus, tmp_path):
    """As for edited text: a checkpoint rewritten after the run, relaunched with a changed
    analysis setting, is one line naming it before any report moves (was: the reports moved
    to superseded/, then the training stage refused)."""
    from jaxillusions.pipeline import sweep

    paths = [str(tmp_path / name) for name in ("seed1", "seed2")]
    for name, path in zip(("seed1", "seed2"), paths, strict=True):
        shutil.copytree(corpus[name], path)
    config = _config(corpus, **{"model.pretrained": tuple(paths), "proxies.methods": ("svd",),
                                "proxies.eval_splits": ("iid", "longer"), "figures": "none"})
    workdir = str(tmp_path / "run")
    sweep.run(validate.check(config)[0], workdir, verbose=False)
    results = (tmp_path / "run" / "results.csv").read_bytes()
    _neox(paths[1], corpus["vocab"], 7)  # another model in the same directory
    config.proxies.svd_ranks = (1, 2)  # an analysis change: the relaunch refits
    with pytest.raises(ValueError, match=rf"^model.pretrained: the weights in {paths[1]} are not "
                                         "those this run was computed from") as err:
        sweep.run(validate.check(config)[0], workdir, verbose=False)
    assert "\n" not in str(err.value)
    assert (tmp_path / "run" / "results.csv").read_bytes() == results
    assert not (tmp_path / "run" / "superseded").exists()


def test_the_memory_plan_counts_a_large_vocabularys_logits(corpus):
    import dataclasses

    from jaxillusions.training import train

    settings = validate.parse(_config(corpus))
    cfg = dataclasses.replace(train.model_config(settings), vocab_size=50304)
    # Below the cap the batches are as set; above, the rows that fit, at least one.
    assert chunks.logits_bytes() == chunks.CPU_LOGITS_BYTES == 16 * 2**20  # on JAX's CPU
    assert chunks.logit_rows(64, 32, 300, 2) == 64
    assert chunks.logit_rows(256, 128, 4096, 2) == 4  # 4 MiB a row
    assert chunks.logit_rows(256, 128, 50304, 2) == 1  # 49 MiB a row
    # A call runs up to its batch's rows in such chunks, as few calls as that allows, evenly.
    assert chunks.steps(300, 1, 256) == 150  # 2 calls of 150 chunks, not 256 and 44
    assert chunks.steps(8, 1, 256) == 8
    assert chunks.steps(1000, 4, 256) == 63  # 4 calls of 63 chunks of 4 rows
    assert chunks.steps(1000, 256, 256) == chunks.steps(10, 64, 64) == 1  # no cap: 1 a call
    terms = {t.what: t for t in memory.plan(settings, cfg)}
    assert "the logits of a proxy evaluation batch" in terms
    on = {p: {t.what: t.num_bytes for t in memory.plan(settings, cfg, 1, p)}
          for p in ("cpu", "gpu")}
    assert on["gpu"]["the logits of an evaluation batch"] > 50 * on["cpu"][
        "the logits of an evaluation batch"]  # an accelerator's chunks: 83 rows, not 1
    assert "parameters, gradients and AdamW moments" not in terms  # nothing is trained
    # 64 MiB: the members' parameters alone fit (25 MiB), with the logits (73 MiB more) not
    tiny = memory.Machine("cpu", 1, 2**26, 2**26)
    with pytest.raises(ValueError, match=r"more than this machine's 64.0 MiB of RAM") as err:
        memory.check_config(settings, cfg, tiny)
    assert "\n" not in str(err.value)
    # A call holds one row's logits: the key to lower is the rows' width, not the batch size
    # (was: "lower train.eval_batch_size", which would not have changed the call).
    assert str(err.value).startswith("data.longer_window=64: needs")
    assert str(err.value).endswith("; lower data.longer_window")


def test_evaluation_in_row_chunks_gives_the_same_numbers(corpus, monkeypatch):
    from jaxillusions.model import pretrained
    from jaxillusions.training import evaluation, train

    settings = validate.parse(_config(corpus))
    splits, cfg, _ = train.build(settings)
    params, _ = pretrained.load_pretrained([corpus["seed1"], corpus["seed2"]])
    split = splits["iid"]

    def run():
        return evaluation.evaluate([params], split, cfg, num_seeds=2, batch_size=64,
                                   num_bins=2, task=text)

    whole = run()
    five_rows = 2 * 32 * cfg.vocab_size * 4 * 5
    monkeypatch.setattr(chunks, "logits_bytes", lambda _=None: five_rows)
    steps, eval_batch = [], evaluation._eval_batch  # the chunks each call runs in turn
    monkeypatch.setattr(evaluation, "_eval_batch", lambda params, tokens, *a, **k: (
        steps.append(tokens.shape[:2]) or eval_batch(params, tokens, *a, **k)))
    chunked = run()
    assert steps and {s[1] for s in steps} == {5} and min(s[0] for s in steps) > 1, steps
    for key in whole:
        np.testing.assert_allclose(chunked[key], whole[key], rtol=1e-6, atol=1e-6)


def test_proxy_evaluation_in_row_chunks_gives_the_same_rows(corpus, monkeypatch):
    import jax

    from jaxillusions.faithfulness import collect, evaluate, fit
    from jaxillusions.faithfulness.specs import ProxySpec
    from jaxillusions.model import pretrained
    from jaxillusions.training import train

    settings = validate.parse(_config(corpus))
    splits, cfg, _ = train.build(settings)
    params, _ = pretrained.load_pretrained([corpus["seed1"], corpus["seed2"]])
    spec = ProxySpec("svd", ("blocks.1.attn.k",), (1, 2))
    quiet = collect.Chunking(0, None)
    stats = collect.collect(params, splits["train"], cfg, [spec], num_samples=0, batch_size=64,
                            chunking=quiet)
    fitted = fit.fit([spec], stats, jax.random.PRNGKey(0), 2, chunking=quiet)
    eval_set = evaluate.make_eval_set(splits, ("iid", "other"), text)

    def run():
        return evaluate.evaluate(params, cfg, eval_set, fitted, batch_size=64, seeds=(1, 2),
                                 options=evaluate.EvalOptions(chunking=quiet))

    whole = run()
    five_rows = 3 * 32 * cfg.vocab_size * 4 * 5
    monkeypatch.setattr(chunks, "logits_bytes", lambda _=None: five_rows)
    steps, batches = [], evaluate._eval_batches  # the chunks each call runs in turn
    monkeypatch.setattr(evaluate, "_eval_batches", lambda *a, **k: (
        steps.append(call[1].shape[0]) or call for call in batches(*a, **k)))
    chunked = run()
    assert steps and min(steps) == max(steps) > 1, steps  # in a scan inside each call
    assert len(chunked) == len(whole) > 0
    for a, b in zip(whole, chunked, strict=True):
        assert {k: v for k, v in a.items() if isinstance(v, str | int)} == {
            k: v for k, v in b.items() if isinstance(v, str | int)}
        for key, value in a.items():
            if isinstance(value, float):
                np.testing.assert_allclose(b[key], value, rtol=1e-5, atol=1e-6, err_msg=key)


# ---------------------------------------------------------------------------------------------
# The main job on imported checkpoints, through the launcher.


@pytest.mark.slow  # a whole sweep
def test_a_sweep_on_two_imported_checkpoints_skips_training(corpus, tmp_path):
    # Launched from the corpus' folder with paths relative to it, and read back (load_run) from
    # another: the door stores them absolute (they were stored as typed, and load_run and
    # `jaxillusions figures` elsewhere failed: "data.files['train']: ... is not a file").
    root = pathlib.Path(corpus["train"]).parent
    config = tmp_path / "imported_text.py"
    lines = [f"    config.{k} = {v!r}\n" for k, v in {
        "data.files": {"train": ("train.txt",), "other": ("./other.jsonl",)},
        "data.tokenizer": "tokenizer.json", "data.window": 32, "data.longer_window": 64,
        "data.max_rows": 200, "data.cache_dir": corpus["cache"],
        "model.pretrained": ("ckpt/seed1", "ckpt/seed2"),
        "proxies.methods": ("svd", "kmeans", "transcoder"), "proxies.targets": ("blocks.1.attn.k",),
        "proxies.transcoder_targets": ("blocks.0.mlp.out",),
        "proxies.transcoder_sizes": (8,), "proxies.sae_k": (2,), "proxies.sae_steps": 50,
        "proxies.eval_splits": ("iid", "other", "longer"), "proxies.kmeans_sizes": (2, 4),
        "proxies.kmeans_samples": 500, "proxies.kmeans_iters": 5, "figures": "none",
        "stall_seconds": 120}.items()]
    config.write_text("from jaxillusions.configs import defaults\n\n\ndef get_config():\n"
                      '    config = defaults("text")\n' + "".join(lines) + "    return config\n")
    workdir = tmp_path / "run"
    # Its evaluation over the text's vocabulary runs more than it compiles: launched at users'
    # LLVM level (conftest.users_xla_flags; docs/speed.md, "The test suite").
    done = subprocess.run(
        [sys.executable, "-m", "jaxillusions.launch.sweep", f"--config={config}",
         f"--workdir={workdir}"], cwd=root, capture_output=True, text=True, timeout=600,
        env={**os.environ, "XLA_FLAGS": xla_flags(base=users_xla_flags())})
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert (f"training: skipped, 2 imported checkpoints: seed 1 = {corpus['seed1']}, seed 2 = "
            f"{corpus['seed2']}") in done.stdout
    stored = json.loads((workdir / "config.json").read_text())
    assert stored["data"]["files"]["other"] == [os.path.join(root, "./other.jsonl")]  # as typed
    assert stored["data"]["tokenizer"] == str(root / "tokenizer.json")
    assert os.getcwd() != str(root)
    assert "step " not in done.stdout  # no training step
    import pandas as pd

    rows = pd.read_csv(workdir / "results.csv")
    assert set(rows["seed"]) == {1, 2}
    assert set(rows["split"]) == {"iid", "other", "longer"}
    assert set(rows["method"]) >= {"svd", "kmeans", "transcoder"}
    # The transcoder on Pythia's parallel blocks (it reads resid_pre), scored on every split.
    tc = rows[(rows["method"] == "transcoder") & (rows["breakdown"] == "all")]
    assert set(tc["split"]) == {"iid", "other", "longer"} and set(tc["seed"]) == {1, 2}
    assert (tc["fvu"] > 0).all() and tc["kl_score"].notna().all()
    assert set(rows["breakdown"]) == {"all", "position", "copyable", "frequency"}
    assert (workdir / "gap_table.txt").exists() and (workdir / "sweep_done.json").exists()
    assert not (workdir / "checkpoints").exists()  # the weights stay where they are
    from jaxillusions.training import imported

    recorded = json.loads((workdir / imported.RECORD).read_text())  # what they were
    assert set(recorded) == {corpus["seed1"], corpus["seed2"]}
    from jaxillusions.model import pretrained
    from jaxillusions.report import results

    run = results.load_run(str(workdir))
    assert run.seeds == [1, 2] and run.step == 0 and run.healthy.all()
    params, _ = pretrained.load_pretrained([corpus["seed1"], corpus["seed2"]])
    np.testing.assert_array_equal(run.params["embed"], params["embed"])


@pytest.mark.slow  # a whole sweep
def test_lenses_erasure_probes_and_fit_shift_on_two_imported_checkpoints(corpus, tmp_path):
    """The other studies on imported Pythia-layout checkpoints, through the runner: the logit
    and tuned lenses and LEACE erasure as proxies on every split, the copyable probe, and the
    proxies also fitted on an OOD split (fit_shift)."""
    from jaxillusions.pipeline import sweep

    config = _config(corpus, **{
        "data.max_rows": 120, "proxies.methods": ("svd", "logit_lens", "tuned_lens", "erasure"),
        "proxies.targets": ("blocks.0.resid_post",), "proxies.concepts": ("copyable",),
        "proxies.svd_ranks": (4,), "proxies.eval_splits": ("iid", "other", "longer"),
        "probes.sites": ("blocks.0.resid_post",), "fit_shift.splits": ("train", "other"),
        "figures": "none"})
    workdir = str(tmp_path / "run")
    sweep.run(validate.check(config)[0], workdir, verbose=False)
    import pandas as pd

    rows = pd.read_csv(os.path.join(workdir, "results.csv"))
    for method in ("svd", "logit_lens", "tuned_lens", "erasure"):
        mine = rows[(rows["method"] == method) & (rows["breakdown"] == "all")]
        assert set(mine["split"]) == {"iid", "other", "longer"}, method
        assert set(mine["seed"]) == {1, 2} and mine["same_pred"].between(0, 1).all(), method
    probes = pd.read_csv(os.path.join(workdir, "probes.csv"))
    assert set(probes["concept"]) == {"copyable"} and set(probes["seed"]) == {1, 2}
    assert probes["probe_acc"].between(0, 1).all()
    table = pd.read_csv(os.path.join(workdir, "fit_shift_results.csv"))
    assert set(table["seed"]) == {1, 2} and "other" in set(table["fit_split"].astype(str))


@pytest.mark.slow  # a whole sweep
def test_the_prediction_study_on_a_population_of_imported_seeds(corpus, tmp_path, capsys,
                                                               users_compile_level):
    """A population of seeds alone (PolyPythias' design: one setting), imported, beside its
    untrained copies (train.null): the held-out prediction test runs its random splits, against
    hyper-parameters that score chance and the copies' features. (Was: refused at the door,
    "needs members in at least 2 settings ... e.g. train.weight_decays", and train.null too.)
    Its programs, of 4 members a group, are its own: compiled at users' level
    (users_compile_level), as they run more than they compile."""
    import pandas as pd

    from jaxillusions.pipeline import sweep
    from jaxillusions.report import results
    from jaxillusions.training import memory, step, train

    seeds = [corpus["seed1"], corpus["seed2"],
             *(_neox(tmp_path / "ckpt" / f"seed{s}", corpus["vocab"], s) for s in (3, 4))]
    keys = {"model.pretrained": tuple(seeds), "proxies.methods": ("svd",),
            "proxies.svd_ranks": (2, 4), "prediction.enabled": True,
            "prediction.features": ("proxies", "heads"), "prediction.n_splits": 2,
            "prediction.n_repeats": 2, "train.null": ("untrained",), "figures": "none"}
    few = _config(corpus, **{**keys, "model.pretrained": tuple(seeds[:3])})
    with pytest.raises(ValueError, match=r"^prediction.n_splits=2: the random splits need at "
                       r"least 4 trained members .* this run has 3 \(3 seeds x 1 setting\): "
                       r"more checkpoints in model.pretrained, or fewer prediction.n_splits$"):
        validate.check(few)
    with pytest.raises(ValueError, match=r"^train.null=\('shuffled',\): imported checkpoints "
                       "are not trained here"):
        validate.check(_config(corpus, **{**keys, "train.null": ("shuffled",)}))
    config = validate.check(_config(corpus, **keys))[0]
    term = memory.plan(config, train.model_config(config), 1)[0]
    assert term.what == "the parameters of every imported member"
    assert term.factors == (("model.pretrained", 8),)  # 4 checkpoints and their 4 copies
    workdir = tmp_path / "run"
    sweep.run(config, str(workdir))
    # Each group's stages say which group they work on: the two summaries told apart.
    out = capsys.readouterr().out
    headings = [line.split("] ", 1)[1] for line in out.splitlines() if ", group " in line]
    assert headings == [f"{stage}, group null_{code}: 4 {kind} members"
                        for stage in ("proxies", "reports", "figures")
                        for code, kind in ((0, "trained"), (1, "untrained"))]
    assert out.index("reports, group null_1") < out.rindex("SUMMARY of the untrained members, "
                                                           "4 seeds")
    sweep.run(config, str(workdir))  # finished: says where each group's results are
    assert (f"nothing to do. Results: the results.csv of 2 groups in {workdir}: null_0, "
            "null_1. ") in capsys.readouterr().out
    # Every group's results in one frame, told apart by the member kind.
    table = results.load_results(str(workdir))
    assert list(table["null"].cat.categories) == ["trained", "untrained"]
    for code, kind in enumerate(("trained", "untrained")):
        alone = results.load_results(str(workdir / f"null_{code}"))
        pd.testing.assert_frame_equal(
            table[table["null"] == kind].drop(columns="null").reset_index(drop=True), alone)
    rows = pd.read_csv(workdir / "prediction.csv")
    assert set(rows["scheme"]) == {"random"} and set(rows["members"]) == {4}
    assert set(rows["family"]) == {"all", "proxies", "heads"}
    assert set(rows["predictors"]) == {"features", "hparams", "features - hparams",
                                       "features - null"}
    assert rows[rows["predictors"] == "features"]["null"].sum() == len(rows) / 5  # one each
    hparams = rows[rows["predictors"] == "hparams"]
    chance = set(zip(hparams["metric"], hparams["mean"], strict=True))
    assert chance == {("auroc", 0.5), ("spearman", 0.0)}
    assert (rows["n_folds"] + rows["n_skipped"] == 4).all()  # 2 repeats of 2 folds
    assert {"acc:other", "acc:longer"} & set(rows["target"])
    text = (workdir / "prediction.txt").read_text()
    assert text.startswith("Held-out prediction: 4 trained members, 1 setting (seeds alone")
    members = pd.read_csv(workdir / "prediction_members.csv", index_col="member")
    assert sorted(members["kind"].value_counts().items()) == [("trained", 4), ("untrained", 4)]
    # The copies: the checkpoints' architecture as initialised here, at each member's seed.
    run = results.load_run(str(workdir))
    assert run.labels == ["1", "2", "3", "4", "1_untrained", "2_untrained", "3_untrained",
                          "4_untrained"]
    fresh = step.initial_params([1, 2, 3, 4], run.model_config)
    for got, want in zip(jax.tree.leaves(run.params), jax.tree.leaves(fresh), strict=True):
        np.testing.assert_array_equal(np.asarray(got)[4:], np.asarray(want))
