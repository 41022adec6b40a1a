"""The text task: next-token prediction on text files of your choosing, tokenized with a Hugging
Face `tokenizers` tokenizer (a tokenizer.json): what imported pretrained checkpoints are judged
on (model.pretrained, docs/pretrained.md), and a model can also be trained on it.

Data (data.*): `files` {split name: paths of .txt or .jsonl files}, `train` required: the split
the proxies are fitted on (and a trained model trains on); every other name is an evaluation
split of that name (e.g. `python`, `javascript`). `tokenizer`: the tokenizer.json. `window`:
tokens per row. `bos`: the token that starts every row and separates documents ("auto": the
`bos_token` of a tokenizer_config.json beside the tokenizer, else the first of <|endoftext|>,
<s>, <bos>, <|bos|> that the vocabulary has, else none; "": none).

Rows: a split's files are read in the order given, whole (a .txt file is one document, a .jsonl
file one document per line, its "text" field); each document is tokenized without special
tokens added, the documents are joined by the BOS token (when there is one) into one stream, and
the stream is cut into contiguous, non-overlapping windows: the BOS then the next window - 1
tokens (without a BOS: the next window tokens); the remainder is dropped and no row is padded.
The train files' stream is first cut into blocks (longer_window - 1 tokens, or window - 1; one
token more without a BOS); a seeded fraction (data.iid_fraction) of the blocks is held out as
`iid` (the same windows, from text the train split never contains) and, with longer_window > 0,
as `longer` (each held-out block one row of longer_window tokens). Each split keeps at most
data.max_rows rows, a seeded random choice, in a seeded random order (so the first rows of train
are a random sample, as the proxies' samples assume).

Every position predicts the next token and is evaluated, except the last of a row (its target is
outside the window) and a position holding token id 0, which the shared code reads as padding
(tasks.PAD: a tokenizer whose id 0 is a real token, GPT-2's "!" or Pythia's <|endoftext|>, has
those positions left out; `load` says how many). Breakdowns, of the predicted (target) token:
`position` (bin floor(log2(t + 1)) of the position t: 0, 1-2, 3-6, 7-14, ...), `copyable` (1
where the bigram (token t, token t + 1) occurred earlier in the row: an induction head can copy
the target; 0 where this is its first occurrence), `frequency` (the target's band of frequency in
the train split: four bands holding about a quarter of train's targets each, most frequent
first, and `unseen`). Concept (probes, erasure): `copyable`.

The induction study (induction.enabled): random tokens of the tokenizer's vocabulary
(`special_tokens`), its special tokens, PAD and the BOS excluded, each sequence after the BOS;
and on the text itself (`copying_analyses`, `copying_verdict`, `copying_report`: they live in
tasks/_text_copying.py, with `induction_targets`, and are imported here under their names),
every head's attention on the induction target (the token after the latest earlier occurrence
of the current one) at the copyable positions of the first induction.code_rows iid rows
(induction_text.csv, induction_seeds.csv's TEXT_SEED_COLUMNS).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import re
from collections.abc import Mapping

import numpy as np

from jaxillusions.config.fields import (
    INT,
    NUMBER,
    PATH,
    STR,
    absolutes,
    nonnegative,
    positive,
    setting,
)
from jaxillusions.runtime import cache
from jaxillusions.tasks import PAD, SpecialTokens, View

# The induction study's hooks on the text itself (and induction_targets) live in _text_copying.
from jaxillusions.tasks._text_copying import (  # noqa: F401 - the task's hooks
    copying_analyses,
    copying_report,
    copying_verdict,
    induction_targets,
)

NAME = "text"
SPLITS = ("train", "iid", "longer")  # and the evaluation splits data.files names (split_names)
IN_DISTRIBUTION = ("iid",)
DEFAULT_EVAL_SPLITS = ("iid",)
BREAKDOWNS = ("position", "copyable", "frequency")
TRAIN_BREAKDOWN = "copyable"
CONCEPTS = ("copyable",)
EVALUATED = "next-token"
WIDTH_KEYS = ("data.window", "data.longer_window")
VOCAB_KEY = "data.tokenizer"
MADE = ("iid", "longer")  # the splits the task makes from the train files
EXTENSIONS = (".txt", ".jsonl")
AUTO_BOS = ("<|endoftext|>", "<s>", "<bos>", "<|bos|>")
FREQUENCY_BANDS = 4  # quantile bands of train's targets; bin FREQUENCY_BANDS: unseen in train
COPYABLE_LABELS = ("first", "copyable")
FREQUENCY_LABELS = ("q1_frequent", "q2", "q3", "q4_rare", "unseen")
POSITION_LABELS = tuple("0" if b == 0 else f"{2**b - 1}-{2**(b + 1) - 2}" for b in range(40))
CACHE_VERSION = 2  # 2: a byte-order mark at a file's start is dropped


class Files(dict):
    """data.files: {split name: tuple of paths}, hashable and never changed after it is made."""

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(sorted(self.items())))


def _is_files(value) -> bool:
    return isinstance(value, Mapping) and all(
        isinstance(k, str) and isinstance(v, list | tuple) and all(isinstance(p, str) for p in v)
        for k, v in value.items())


FILES = ("a mapping of split names to tuples of paths", _is_files)


@dataclasses.dataclass(frozen=True)
class Data:
    """The data.* settings of the text task (check_config checks the files and the tokenizer)."""

    files: Files = setting(Files(), FILES, "{'train': (paths, ...), <split>: (paths, ...)}",
                           doc=".txt or .jsonl files per split; train: fitted on, the others "
                           "evaluated (iid and longer are made from train); checked at the door",
                           convert=lambda v: {k: absolutes(p) for k, p in v.items()})
    tokenizer: str = setting("", PATH, "a tokenizer.json", doc="read with `tokenizers`")
    bos: str = setting("auto", STR, "auto, '' (none) or a token of the tokenizer",
                       doc="starts every row and separates documents")
    window: int = setting(128, INT, ">= 2", lambda v, s: v >= 2,
                          "tokens per row (BOS included)")
    longer_window: int = setting(0, INT, "0 (no longer split) or > data.window",
                                 lambda v, s: v == 0 or v > s.data.window,
                                 "`longer`: the held-out train text in rows this long")
    iid_fraction: float = setting(0.1, NUMBER, "in (0, 1)", lambda v, s: 0 < v < 1,
                                  "the train text's blocks held out as iid (and longer)")
    max_rows: int = setting(2000, INT, ">= 1", positive, "rows per split at most")
    seed: int = setting(0, INT, ">= 0", nonnegative, "which blocks are held out; row order")
    cache_dir: str = setting("", STR, "a directory, or '' for the default",
                             doc="'': $JAXILLUSIONS_CACHE or ~/.cache/jaxillusions")

    def __post_init__(self):
        object.__setattr__(self, "files", Files(
            {str(k): tuple(v) for k, v in dict(self.files).items()}))


@dataclasses.dataclass(frozen=True)
class TextSplit:
    """One split: rows of token windows and the per-position annotations of their targets."""

    tokens: np.ndarray  # int32 [N, T]
    copyable: np.ndarray  # int8 [N, T]: 1 copyable, 0 first occurrence, -1 not evaluated
    frequency: np.ndarray  # int8 [N, T]: the target's band (FREQUENCY_LABELS), -1 not evaluated


class Splits(dict):
    """{split name: TextSplit}, with the tokenizer's path (`tokenizer`), for labels."""

    tokenizer = ""


# ---------------------------------------------------------------------------------------------
# Settings: the splits, the tokenizer, the checks at the door.

def split_names(data: Data) -> tuple[str, ...]:
    """train, iid, the evaluation splits of data.files (their order), longer when made."""
    named = [k for k in data.files if k != "train"]
    return ("train", "iid", *named, *(("longer",) if data.longer_window else ()))


def _tokenizer_file(data: Data) -> str:
    path = os.path.expanduser(data.tokenizer)
    if not data.tokenizer:
        raise ValueError("data.tokenizer: not set; name the tokenizer.json of the text (e.g. "
                         "the one beside the checkpoints)")
    if not os.path.isfile(path):
        raise ValueError(f"data.tokenizer: {path} is not a file")
    return path


@functools.lru_cache(maxsize=4)
def _read_tokenizer(path: str, stamp: tuple[int, int]):
    del stamp  # in the cache's key: a rewritten file is read again
    try:
        from tokenizers import Tokenizer  # noqa: PLC0415 - an optional dependency
    except ImportError:
        raise ValueError("data.tokenizer: the text task reads it with the tokenizers package "
                         "(pip install 'jaxillusions[pretrained]')") from None
    try:
        return Tokenizer.from_file(path)
    except Exception as err:  # noqa: BLE001 - the library's errors have no common type
        line = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ValueError(f"data.tokenizer: {path} is not a tokenizer.json that `tokenizers` "
                         f"reads ({line})") from None


def tokenizer(data: Data):
    """The `tokenizers.Tokenizer` of data.tokenizer (a one-line ValueError naming the path)."""
    path = _tokenizer_file(data)
    info = os.stat(path)
    return _read_tokenizer(os.path.realpath(path), (info.st_mtime_ns, info.st_size))


def vocab_size(data: Data) -> int:
    """Ids the tokenizer gives (1 + its largest id, added tokens included)."""
    return 1 + max(tokenizer(data).get_vocab(with_added_tokens=True).values())


def bos_id(data: Data) -> int | None:
    """The id of the row-starting and document-separating token (see the module docstring)."""
    vocab = tokenizer(data).get_vocab(with_added_tokens=True)
    if data.bos != "auto":
        if data.bos and data.bos not in vocab:
            raise ValueError(f"data.bos={data.bos!r}: not a token of {data.tokenizer}")
        return vocab[data.bos] if data.bos else None
    beside = os.path.join(os.path.dirname(os.path.abspath(data.tokenizer)),
                          "tokenizer_config.json")
    named = None
    if os.path.isfile(beside):
        try:
            with open(beside) as f:
                named = json.load(f).get("bos_token")
        except (OSError, ValueError, AttributeError):
            named = None
        named = named.get("content") if isinstance(named, dict) else named
    for token in ([named] if isinstance(named, str) else []) + list(AUTO_BOS):
        if token in vocab:
            return vocab[token]
    return None


def special_tokens(data: Data) -> SpecialTokens:
    """The induction study's random tokens (hook special_tokens): drawn from the tokenizer's
    ids (its vocabulary, added tokens included: never the rows a checkpoint's embedding has
    beyond them, as Pythia's 50304 for 50277 ids), never PAD (id 0, the project's padding), the
    BOS (data.bos) or a special token of the tokenizer (its added tokens marked special, e.g.
    <|endoftext|>, <|padding|>; its model's unk_token); the rows start with the BOS when there
    is one."""
    tok = tokenizer(data)
    vocab = tok.get_vocab(with_added_tokens=True)
    special = {i for i, added in tok.get_added_tokens_decoder().items() if added.special}
    unk = getattr(tok.model, "unk_token", None)
    bos = bos_id(data)
    special |= {PAD, *([vocab[unk]] if unk in vocab else []), *([] if bos is None else [bos])}
    return SpecialTokens(exclude=tuple(sorted(special)), bos=bos,
                         pool=tuple(sorted(set(vocab.values()))))


def check_config(config) -> list[str]:
    """The Dyck-only options refused; every file of data.files there, .txt or .jsonl and not
    empty; the tokenizer readable, and the same vocabulary as a tokenizer.json in a checkpoint
    of model.pretrained (the vocabulary's size against the model: train.model_config)."""
    refused = {"model.first_layer": (config.model.first_layer, "standard"),
               "train.loss_on": (config.train.loss_on, "all"),
               "train.contrastive_weights": (tuple(config.train.contrastive_weights), ())}
    for key, (value, allowed) in refused.items():
        if value != allowed:
            raise ValueError(f"{key}={value!r}: the text task needs {allowed!r} (a Dyck-only "
                             "option)")
    if config.wen.enabled:
        raise ValueError("wen.enabled=True: the Wen et al. measurements need the Dyck task")
    data = config.data
    if "train" not in data.files:
        raise ValueError(f"data.files={dict(data.files)!r}: no 'train' split; set data.files = "
                         "{'train': (paths, ...), <split>: (paths, ...)}")
    for name, paths in sorted(data.files.items(), key=lambda item: item[0] != "train"):
        if name in MADE or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise ValueError(f"data.files: split name {name!r} "
                             + ("is made from the train files" if name in MADE else
                                "must be a name of letters, digits and _"))
        if not paths:
            raise ValueError(f"data.files[{name!r}]: no files")
        for path in paths:
            _check_file(name, path)
    vocab = tokenizer(data).get_vocab(with_added_tokens=True)
    bos_id(data)
    for directory in config.model.pretrained:
        theirs = os.path.join(os.path.expanduser(directory), "tokenizer.json")
        if os.path.isfile(theirs) and os.path.realpath(theirs) != os.path.realpath(
                _tokenizer_file(data)):
            other = tokenizer(dataclasses.replace(data, tokenizer=theirs))
            if other.get_vocab(with_added_tokens=True) != vocab:
                raise ValueError(f"data.tokenizer={data.tokenizer}: its vocabulary is not that "
                                 f"of the checkpoint's own {theirs}; tokenize with the "
                                 "checkpoints' tokenizer")
    return []


def _check_file(split: str, path: str) -> None:
    where = f"data.files[{split!r}]: {path}"
    if not os.path.isfile(os.path.expanduser(path)):
        raise ValueError(f"{where} is not a file")
    if not path.endswith(EXTENSIONS):
        raise ValueError(f"{where}: must be a .txt or a .jsonl file (a \"text\" field per line)")
    if os.path.getsize(os.path.expanduser(path)) == 0:
        raise ValueError(f"{where} is empty")


# ---------------------------------------------------------------------------------------------
# Reading, tokenizing and cutting the text.

def _documents(split: str, path: str) -> list[str]:
    """The documents of one file (a .txt: itself; a .jsonl: each line's "text"), read as UTF-8
    (a byte-order mark at the start dropped); bytes that are not UTF-8 are a one-line error."""
    with open(os.path.expanduser(path), "rb") as f:
        raw = f.read()
    try:
        content = raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        raise ValueError(f"data.files[{split!r}]: {path} is not UTF-8 text (byte "
                         f"{raw[err.start]:#04x} at offset {err.start}, line {line}); save it "
                         "as UTF-8") from None
    content = content.replace("\r\n", "\n").replace("\r", "\n")  # as Python's text mode reads
    if path.endswith(".txt"):
        docs = [content]
    else:
        docs = []
        for number, line in enumerate(content.split("\n"), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                raise ValueError(f"data.files[{split!r}]: {path} line {number} is not "
                                 "JSON") from None
            if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                raise ValueError(f"data.files[{split!r}]: {path} line {number} has no "
                                 "\"text\" string")
            docs.append(record["text"])
    docs = [d for d in docs if d.strip()]
    if not docs:
        raise ValueError(f"data.files[{split!r}]: {path} has no text")
    return docs


def _stream(data: Data, split: str, bos: int | None) -> np.ndarray:
    """The split's files as one token stream (documents joined by the BOS token, if any)."""
    tok = tokenizer(data)
    pieces = []
    for path in data.files[split]:
        for enc in tok.encode_batch(_documents(split, path), add_special_tokens=False):
            if bos is not None and pieces:
                pieces.append(np.asarray([bos], np.int64))
            pieces.append(np.asarray(enc.ids, np.int64))
    return np.concatenate(pieces) if pieces else np.zeros(0, np.int64)


def _rows(stream: np.ndarray, width: int, bos: int | None) -> np.ndarray:
    """Contiguous windows of `width` tokens (the BOS and width - 1 of the stream's)."""
    content = width - (bos is not None)
    n = len(stream) // content
    rows = stream[:n * content].reshape(n, content)
    if bos is not None:
        rows = np.concatenate([np.full((n, 1), bos, rows.dtype), rows], axis=1)
    return rows.astype(np.int32)


def _tokens(data: Data) -> dict[str, np.ndarray]:
    """{split name: int32 [N, T]} (see the module docstring), each at most max_rows rows."""
    bos = bos_id(data)
    rng = np.random.default_rng(data.seed)
    out = {}
    train = _stream(data, "train", bos)
    has_bos = bos is not None
    block = max(data.window, data.longer_window) - has_bos
    blocks = _rows(train, block, None)  # [B, block], cut into rows below
    count = min(len(blocks) - 1, max(1, round(data.iid_fraction * len(blocks))))
    held = rng.permutation(len(blocks))[:max(count, 0)]
    kept = np.setdiff1d(np.arange(len(blocks)), held)
    usable = (block // (data.window - has_bos)) * (data.window - has_bos)
    for name, index in (("train", kept), ("iid", np.sort(held))):
        out[name] = _rows(blocks[index, :usable].reshape(-1), data.window, bos)
    if data.longer_window:
        out["longer"] = _rows(blocks[np.sort(held)].reshape(-1), data.longer_window, bos)
    for name in data.files:
        if name != "train":
            out[name] = _rows(_stream(data, name, bos), data.window, bos)
    for name, rows in out.items():
        if not len(rows):
            source = (f"the held-out {data.iid_fraction:g} of the train files" if name in MADE
                      else f"data.files[{name!r}]")
            width = data.longer_window if name == "longer" else data.window
            raise ValueError(f"data: {source} give no row of {width} tokens (data.window, "
                             "data.longer_window); add text or shorten the rows")
        out[name] = rows[rng.permutation(len(rows))[:data.max_rows]]
    return out


def _cache_key(data: Data) -> str:
    for name, paths in data.files.items():  # (load_run reads them without the door's check)
        for path in paths:
            _check_file(name, path)
    files = [(name, os.path.abspath(p), os.path.getsize(p), os.stat(p).st_mtime_ns)
             for name, paths in data.files.items() for p in map(os.path.expanduser, paths)]
    with open(_tokenizer_file(data), "rb") as f:
        tok = hashlib.sha256(f.read()).hexdigest()
    settings = {f.name: getattr(data, f.name) for f in dataclasses.fields(Data)  # or a
                if f.name not in ("files", "tokenizer", "cache_dir")}  # ConfigDict's data
    text = json.dumps([CACHE_VERSION, files, tok, bos_id(data), settings], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def load(data: Data, verbose: bool = True) -> Splits:
    """Every split of split_names(data), tokenized once and cached (cache_dir)."""
    path = cache.path(f"text-{_cache_key(data)}.npz", data.cache_dir)

    def read(file: str) -> dict[str, np.ndarray]:
        with np.load(file) as z:
            return {name: z[name].astype(np.int32) for name in split_names(data)}

    def save(file: str, tokens: dict[str, np.ndarray]) -> None:
        small = vocab_size(data) <= 2**16
        cache.save_npz(file, {k: v.astype(np.uint16 if small else np.int32)
                              for k, v in tokens.items()})

    tokens = cache.load_or_make(path, read, lambda: _tokens(data), save, "text data", verbose)
    return annotate(tokens, vocab_size(data), tokenizer_path=data.tokenizer, verbose=verbose,
                    token_zero=tokenizer(data).id_to_token(0))


def annotate(tokens: Mapping[str, np.ndarray], vocab: int, *, tokenizer_path: str = "",
             verbose: bool = False, token_zero: str | None = None) -> Splits:
    """Splits of token rows {name: int [N, T]} with their annotations: `copyable` and the
    `frequency` band of the targets, from train's target counts over `vocab` ids."""
    train = np.asarray(tokens["train"])
    targets = train[:, 1:][train[:, :-1] != PAD]
    counts = np.bincount(targets.ravel(), minlength=vocab)[:vocab]
    band = frequency_bands(counts)
    out = Splits()
    zeros = 0
    for name, rows in tokens.items():
        rows = np.asarray(rows, np.int32)
        copy = copyable(rows)
        freq = np.full(rows.shape, -1, np.int8)
        freq[:, :-1] = band[np.clip(rows[:, 1:], 0, vocab - 1)]
        out[name] = TextSplit(rows, copy, np.where(copy >= 0, freq, -1).astype(np.int8))
        zeros += int((rows == PAD).sum())
    out.tokenizer = tokenizer_path
    if verbose and zeros:
        print(f"text data: note: token id 0 ({token_zero!r}) is the project's padding id; its "
              f"{zeros} positions are not evaluated, sampled or labelled", flush=True)
    return out


def copyable(tokens: np.ndarray) -> np.ndarray:
    """int8 [N, T]: 1 where the bigram (tokens[t], tokens[t + 1]) occurred earlier in its row
    (at s < t), 0 where not; -1 at the last position and where tokens[t] is PAD."""
    n, width = tokens.shape
    out = np.full((n, width), -1, np.int8)
    if n == 0 or width < 2:
        return out
    v = int(tokens.max()) + 1
    first, second = tokens[:, :-1].astype(np.int64), tokens[:, 1:].astype(np.int64)
    key = ((np.arange(n, dtype=np.int64)[:, None] * v + first) * v + second).ravel()
    _, start, inverse = np.unique(key, return_index=True, return_inverse=True)
    out[:, :-1] = (start[inverse.ravel()] < np.arange(key.size)).reshape(n, width - 1)
    out[tokens == PAD] = -1
    return out


def attention_targets(split: TextSplit) -> dict[str, np.ndarray]:
    """{"induction": induction_targets of the split's tokens}."""
    return {"induction": induction_targets(split.tokens)}


def frequency_bands(counts: np.ndarray) -> np.ndarray:
    """int8 [V]: each id's band, 0 (most frequent) .. FREQUENCY_BANDS - 1, by the share of the
    counts held by more frequent ids (ties: lower id first); FREQUENCY_BANDS: count 0."""
    order = np.argsort(-counts, kind="stable")
    before = np.cumsum(counts[order]) - counts[order]
    band = np.empty(len(counts), np.int8)
    band[order] = np.minimum(FREQUENCY_BANDS - 1,
                             FREQUENCY_BANDS * before // max(int(counts.sum()), 1))
    band[counts == 0] = FREQUENCY_BANDS
    return band


def position_bins(width: int) -> np.ndarray:
    """int32 [width]: floor(log2(t + 1)) of each position t."""
    return np.asarray([(t + 1).bit_length() - 1 for t in range(width)], np.int32)


# ---------------------------------------------------------------------------------------------
# What the shared code calls (tasks.Task).

def view(split: TextSplit) -> View:
    evaluated = split.copyable >= 0
    width = split.tokens.shape[1]
    position = np.broadcast_to(position_bins(width), split.tokens.shape)
    return View(tokens=split.tokens, evaluated=evaluated,
                bins={"position": np.where(evaluated, position, -1).astype(np.int32),
                      "copyable": split.copyable.astype(np.int32),
                      "frequency": split.frequency.astype(np.int32)},
                num_bins={"position": int(position_bins(width - 1)[-1]) + 1, "copyable": 2,
                          "frequency": FREQUENCY_BANDS + 1})


def concepts(split: TextSplit) -> dict[str, np.ndarray]:
    """{"copyable": 1 / 0 at evaluated positions, -1 elsewhere}, int32 [N, T]."""
    return {"copyable": split.copyable.astype(np.int32)}


def model_fields(data: Data, splits=None) -> dict:
    return {"vocab_size": vocab_size(data)}


def train_width(data: Data) -> int:
    return data.window


def widest_width(data: Data) -> int:
    return max(data.window, data.longer_window)


def train_num_bins(data: Data) -> int:
    return 2  # copyable: first, copyable


def bounds(data: Data) -> dict:
    return {"position": int(position_bins(data.window - 1)[-1]), "copyable": None,
            "frequency": None}


def bin_labels(breakdown: str) -> tuple[str, ...] | None:
    return {"position": POSITION_LABELS, "copyable": COPYABLE_LABELS,
            "frequency": FREQUENCY_LABELS}.get(breakdown)


def baselines(splits, names) -> dict[str, dict[str, float]]:
    """The unigram predictor of train's targets (add-one smoothed): accuracy of the most
    frequent target and cross-entropy (nats), at each split's evaluated positions."""
    def targets(s: TextSplit) -> np.ndarray:
        return s.tokens[:, 1:][s.copyable[:, :-1] >= 0]

    train = splits["train"]
    size = 1 + max(int(s.tokens.max(initial=0)) for s in splits.values())
    counts = np.bincount(targets(train), minlength=size).astype(np.float64) + 1.0
    logp = np.log(counts / counts.sum())
    out = {}
    for name in names:
        y = targets(splits[name]) if name in splits else np.zeros(0, int)
        if len(y):
            out[name] = {"unigram_acc": float((y == counts.argmax()).mean()),
                         "unigram_xent": float(-logp[y].mean())}
    return out


def activation_plots(run, splits, data: Data, shown, pattern_site: str, key_site: str,
                     max_tokens: int = 48) -> dict:
    """Last-layer attention patterns (the members `shown`) on the first `max_tokens` tokens of
    the first iid row, the tokens as labels."""
    iid = splits["iid"]
    if not len(iid.tokens):
        return {}
    row = iid.tokens[:1, :max_tokens]
    patterns = run(row, pattern_site)[:, 0, 0]  # head 0
    tok = tokenizer(data)

    def label(t: int) -> str:  # the token's text, its blanks made visible
        text = tok.decode([t]) or tok.id_to_token(t) or str(t)  # (special tokens: their name)
        return text.replace(" ", "␣").replace("\n", "\\n").replace("\t", "\\t")

    labels = [label(int(t)) for t in row[0]]
    return {"attention_patterns": ("attention_patterns", (
        patterns, labels, shown, pattern_site,
        f"the first {row.shape[1]} tokens of an iid row"))}
