"""Character-level code-completion data: splits, vocabulary, per-character categories, cache.

Token ids: PAD=0, BOS=1, EOS=2, UNK=3, characters from 4 (the train vocabulary). Every row is
``BOS c_1 ... c_n EOS PAD ...``: one function per row, never cut (functions that do not fit a
split's width are left out and counted). Position t predicts tokens[:, t+1]; `category` and
`bracket_depth` describe that target (see CodeSplit and lexer.py).

How the splits are made (all deterministic from data.seed):
1. Functions are read (CodeSearchNet jsonl, the standard library, or a directory of files),
   labelled by the lexer (functions that fail to lex are dropped and counted), exact duplicate
   functions dropped (the first in (repo, path) order kept) and functions shorter than
   data.min_chars dropped.
2. Files (repo, path) are shuffled; a fraction data.iid_fraction of them is held out. `train`
   comes from the other files; every evaluation split from the held-out files only, so no file
   contributes to both `train` and any evaluation split. With data.ood_from_train_files, `longer`
   and `deeper` also take the functions of the training files that exceed a threshold (which
   `train` never holds): larger OOD splits, but only `iid` is then file-disjoint from `train`.
3. Thresholds are set on the training files: L = the data.length_quantile quantile of function
   lengths, capped at context - 2 (a training function must fit the context); D = the
   data.depth_quantile quantile (rounded down) of the maximum bracket depth of the functions of
   length <= L.
4. `train` and `iid`: length <= L and depth <= D. `longer`: L < length <= longer_context - 2 and
   depth <= D (rows are longer_context wide; longer functions are dropped). `deeper`: depth > D
   and length <= L. `other_language`: the other language's functions with length <= L and depth
   <= D (skipped, with one warning, when its source is absent).
5. Each split keeps at most num_train / num_eval functions, drawn without replacement by a seeded
   numpy Generator (kept in corpus order); a split with fewer keeps them all (the report says so);
   an empty split is an error.
"""

from __future__ import annotations

import dataclasses
import glob
import numbers
import os
import shutil
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np

from jaxillusions.tasks.code_completion import corpus, lexer
from jaxillusions.tasks.code_completion.lexer import CATEGORIES, LANGUAGES

__all__ = ["CATEGORIES", "SPLITS", "DATA_DEFAULTS", "DATA_DOCS", "CodeSplit", "Vocab",
           "CodeData", "check_data_config", "make_splits",
           "width"]

PAD, BOS, EOS, UNK = 0, 1, 2, 3
NUM_SPECIAL = 4
SPLITS = ("train", "iid", "longer", "deeper", "other_language")
_CACHE_VERSION = 4  # bump when the data made for the same config and files changes

DATA_DEFAULTS: dict[str, Any] = {
    "source": "stdlib",
    "language": "python",
    "other_source": "npm",
    "other_language": "javascript",
    "skip_tests": True,
    "context": 512,
    "longer_context": 1024,
    "num_train": -1,
    "num_eval": 500,
    "iid_fraction": 0.2,
    "ood_from_train_files": False,
    "length_quantile": 0.9,
    "depth_quantile": 0.9,
    "min_chars": 16,
    "min_char_count": 1,
    "max_vocab": 256,
    "seed": 0,
    "cache_dir": "",
}
DATA_DOCS: dict[str, str] = {
    "source": "'stdlib' (this interpreter's standard library), a directory of source files, or "
              "CodeSearchNet .jsonl/.jsonl.gz file(s) (a path or glob, ** allowed)",
    "language": "language of `source`: python or javascript (jsonl records of other languages "
                "are ignored)",
    "other_source": "the other_language split's source, as `source`; 'npm': the JavaScript "
                    "shipped with npm when found, else skipped with a warning; '': no split",
    "other_language": "language of `other_source` (python or javascript, not `language`)",
    "skip_tests": "leave out test directories (test, tests, idle_test, __tests__, testing) and "
                  "test files (test_*.py, *.test.js, *.spec.js) of directory sources",
    "context": "row width of train/iid/deeper/other_language: max characters + 2 (BOS, EOS)",
    "longer_context": "row width of `longer` (> context); longer functions are left out",
    "num_train": "at most this many train functions (-1: all)",
    "num_eval": "at most this many functions per evaluation split (-1: all)",
    "iid_fraction": "fraction of files held out for the evaluation splits, in (0, 1)",
    "ood_from_train_files": "longer/deeper also take the training files' functions over a "
                            "threshold (never in train); only iid is then file-disjoint",
    "length_quantile": "L = this quantile of train function lengths (capped at context - 2)",
    "depth_quantile": "D = this quantile (floored) of train max bracket depths (length <= L)",
    "min_chars": "functions shorter than this many characters are dropped",
    "min_char_count": "characters seen fewer times than this in train map to UNK",
    "max_vocab": "at most this many token ids (4 special + the most frequent train characters)",
    "seed": "file split and sampling seed",
    "cache_dir": "cache directory ('' = $JAXILLUSIONS_CACHE or ~/.cache/jaxillusions)",
}
_NPM_DIRS = ("/usr/lib/node_modules/npm", "/usr/local/lib/node_modules/npm",
             "/opt/homebrew/lib/node_modules/npm")


# eq=False: field-wise == on arrays is ambiguous; compare the arrays themselves.
@dataclasses.dataclass(frozen=True, eq=False)
class CodeSplit:
    tokens: np.ndarray  # int32 [N, T]: BOS chars EOS PAD...
    category: np.ndarray  # int8 [N, T]: CATEGORIES index of tokens[:, t+1]; -1: EOS/PAD target
    bracket_depth: np.ndarray  # int32 [N, T]: bracket depth at tokens[:, t+1] (0 off target)
    file_id: np.ndarray  # int32 [N]: index into report["files"]
    lengths: np.ndarray  # int32 [N]: characters (tokens between BOS and EOS)
    language: str
    # int32 [N]: deepest bracket nesting of each function (defaults to empty for empty splits)
    max_depth: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int32))


@dataclasses.dataclass(frozen=True)
class Vocab:
    chars: str  # sorted by code point; character chars[i] has id NUM_SPECIAL + i

    @property
    def size(self) -> int:
        return NUM_SPECIAL + len(self.chars)

    def _codepoints(self) -> np.ndarray:
        return np.frombuffer(self.chars.encode("utf-32-le"), np.uint32)

    def encode_codepoints(self, cps: np.ndarray) -> np.ndarray:
        """int32 ids of uint32 code points (UNK for characters not in the vocabulary)."""
        table = self._codepoints()
        if len(table) == 0:
            return np.full(len(cps), UNK, np.int32)
        idx = np.minimum(np.searchsorted(table, cps), len(table) - 1)
        return np.where(table[idx] == cps, idx + NUM_SPECIAL, UNK).astype(np.int32)

    def encode(self, text: str) -> np.ndarray:
        return self.encode_codepoints(_codepoints(text))

    def ids_of(self, chars: str) -> tuple[int, ...]:
        """The ids of those of `chars` that are in the vocabulary, in the vocabulary's order."""
        ids = self.encode(chars)
        return tuple(int(i) for i in np.unique(ids[ids != UNK]))

    def decode(self, ids: Any) -> str:
        """Characters of ids >= 4; UNK as U+FFFD; PAD, BOS, EOS dropped."""
        out = []
        for i in np.asarray(ids).ravel().tolist():
            if i >= NUM_SPECIAL:
                out.append(self.chars[i - NUM_SPECIAL])
            elif i == UNK:
                out.append("\ufffd")
        return "".join(out)


class CodeData(NamedTuple):
    splits: dict[str, CodeSplit]  # SPLITS order; other_language absent when skipped
    vocab: Vocab
    report: dict[str, Any]  # sizes, thresholds, unk_rates, corpus counts, files, timings

    @property
    def unk_rates(self) -> dict[str, float]:
        """Fraction of the characters of each split that are UNK."""
        return self.report["unk_rates"]


def _codepoints(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-32-le"), np.uint32)


# ----------------------------------------------------------------------------- config


def _as_dict(cfg: Any) -> dict[str, Any]:
    if cfg is None:
        return {}
    if hasattr(cfg, "to_dict"):  # ml_collections.ConfigDict
        return dict(cfg.to_dict())
    if isinstance(cfg, Mapping):
        return dict(cfg)
    return dict(vars(cfg))


def find_npm() -> str | None:
    """The directory of npm's own JavaScript (next to `node`, or a usual global prefix)."""
    cands = []
    node = shutil.which("node")
    if node:
        prefix = os.path.dirname(os.path.dirname(os.path.realpath(node)))
        cands.append(os.path.join(prefix, "lib", "node_modules", "npm"))
    for d in [*cands, *_NPM_DIRS]:
        if os.path.isdir(os.path.join(d, "lib")):
            return d
    return None


def _resolve(key: str, spec: str, language: str, skip_tests: bool) -> tuple[str, Any]:
    """('stdlib', root) | ('dir', root) | ('jsonl', [files]) | ('none', why); ValueError if the
    source is missing or empty."""
    allowed = ("expected 'stdlib', a directory of source files, or CodeSearchNet "
               ".jsonl/.jsonl.gz file(s) (a path or glob)")
    if key == "other_source" and spec == "":
        return "none", "data.other_source is ''"
    if key == "other_source" and spec == "npm":
        root = find_npm()
        if root is None:
            return "none", ("no npm JavaScript found (looked next to `node` and in "
                            f"{', '.join(_NPM_DIRS)})")
        spec = root
    if spec == "stdlib":
        if language != "python":
            raise ValueError(f"data.{key}='stdlib' holds Python, but its language is "
                             f"{language!r}")
        return "stdlib", corpus.stdlib_root()
    path = os.path.expanduser(spec)
    if os.path.isdir(path):
        if not corpus.has_source_files(path, language, skip_tests):
            raise ValueError(f"data.{key}={spec!r}: no {language} files "
                             f"({'/'.join(corpus.EXTENSIONS[language])}) in this directory")
        return "dir", os.path.abspath(path)
    files = sorted(f for f in glob.glob(path, recursive=True)
                   if os.path.isfile(f) and f.endswith(corpus.JSONL_SUFFIXES))
    if files:
        return "jsonl", [os.path.abspath(f) for f in files]
    if glob.has_magic(path) or os.path.exists(path):
        raise ValueError(f"data.{key}={spec!r}: no .jsonl/.jsonl.gz files match; {allowed}")
    raise ValueError(f"data.{key}={spec!r}: no such file or directory; {allowed}")


def _params(data_cfg: Any) -> dict[str, Any]:
    """Defaults filled in and every value checked (one-line ValueError naming the key)."""
    given = _as_dict(data_cfg)
    unknown = sorted(set(given) - set(DATA_DEFAULTS))
    if unknown:
        raise ValueError(f"unknown code data key data.{unknown[0]}; available: "
                         f"{', '.join(DATA_DEFAULTS)}")
    p = {**DATA_DEFAULTS, **given}

    def fail(key: str, what: str) -> None:
        raise ValueError(f"data.{key} must be {what}, got {p[key]!r}")

    def integer(key: str, lo: int) -> None:
        v = p[key]
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < lo:
            fail(key, f"an integer >= {lo}")
        p[key] = int(v)

    def fraction(key: str, lo_open: bool, hi_open: bool) -> None:
        v = p[key]
        if isinstance(v, bool) or not isinstance(v, numbers.Real) \
                or not ((0 < v) if lo_open else (0 <= v)) or not ((v < 1) if hi_open else v <= 1):
            fail(key, f"a number in {'(' if lo_open else '['}0, 1{')' if hi_open else ']'}")
        p[key] = float(v)

    for key in ("source", "other_source", "cache_dir"):
        if not isinstance(p[key], str):
            fail(key, "a string")
    for key in ("language", "other_language"):
        if p[key] not in LANGUAGES:
            fail(key, f"one of {', '.join(LANGUAGES)}")
    if p["other_language"] == p["language"]:
        fail("other_language", f"different from data.language={p['language']!r}")
    for key in ("skip_tests", "ood_from_train_files"):
        if not isinstance(p[key], bool):
            fail(key, "True or False")
    integer("min_chars", 1)
    integer("context", p["min_chars"] + 2)
    integer("longer_context", p["context"] + 1)
    for key in ("num_train", "num_eval"):
        integer(key, -1)
        if p[key] == 0:
            fail(key, "a positive integer or -1 (all)")
    fraction("iid_fraction", True, True)
    fraction("length_quantile", True, False)
    fraction("depth_quantile", False, False)
    integer("min_char_count", 1)
    integer("max_vocab", NUM_SPECIAL + 1)
    if p["max_vocab"] > 2**16:  # the cache stores token ids as uint16
        fail("max_vocab", f"an integer from {NUM_SPECIAL + 1} to {2**16}")
    integer("seed", 0)
    return p


def check_data_config(data_cfg: Any) -> list[str]:
    """Checks the code data config (values, and that the sources exist: no reading or parsing).
    Raises a one-line ValueError; returns notes (e.g. where other_language comes from)."""
    p = _params(data_cfg)
    notes = []
    kind, what = _resolve("source", p["source"], p["language"], p["skip_tests"])
    notes.append(f"code data: {p['language']} from {_describe(kind, what)}")
    kind, what = _resolve("other_source", p["other_source"], p["other_language"],
                          p["skip_tests"])
    if kind == "none":
        notes.append(f"code data: other_language split skipped: {what}")
    else:
        notes.append(f"code data: other_language ({p['other_language']}) from "
                     f"{_describe(kind, what)}")
    return notes


def width(data_cfg: Any, split: str = "train") -> int:
    """Row width (tokens) of a split: data.longer_context for `longer`, else data.context."""
    p = _params(data_cfg)
    if split not in SPLITS:
        raise ValueError(f"unknown code split {split!r}; available: {', '.join(SPLITS)}")
    return p["longer_context"] if split == "longer" else p["context"]


def _describe(kind: str, what: Any) -> str:
    if kind == "jsonl":
        return f"{len(what)} jsonl file(s) ({what[0]}{', ...' if len(what) > 1 else ''})"
    return f"{'the standard library at ' if kind == 'stdlib' else ''}{what}"


# ----------------------------------------------------------------------------- corpus


def _files_identity(kind: str, what: Any, language: str, skip_tests: bool) -> list[Any]:
    """What the cache key knows of the source files: names, sizes, modification times."""
    if kind == "jsonl":
        paths = list(what)
    else:
        paths = [os.path.join(what, f) for f in corpus.source_files(what, language, skip_tests)]
    out: list[Any] = [kind, language, skip_tests, what if kind != "jsonl" else ""]
    for f in paths:
        try:
            st = os.stat(f)
        except OSError:  # a dangling link or a loop: corpus.read_files counts it unreadable
            out.append([f, None, None])
            continue
        out.append([f, st.st_size, st.st_mtime_ns])
    return out


def _read(kind: str, what: Any, language: str, skip_tests: bool
          ) -> tuple[list[corpus.Record], dict[str, int]]:
    if kind == "jsonl":
        records, stats = corpus.read_jsonl(what)
        kept = [r for r in records if r.language.lower() == language]
        stats["other_languages"] = len(records) - len(kept)
        return kept, stats
    repo = "stdlib" if kind == "stdlib" else os.path.basename(os.path.normpath(what))
    return corpus.read_files(what, language, skip_tests, repo)


@dataclasses.dataclass
class _Labelled:
    """The labelled functions of one language (concatenated characters, categories, depths)."""
    codes: list[str]
    file_keys: list[str]
    cat: list[np.ndarray]
    depth: list[np.ndarray]
    lengths: np.ndarray
    max_depth: np.ndarray
    stats: dict[str, int]


def read_labelled(kind: str, what: Any, language: str, skip_tests: bool, min_chars: int,
                  verbose: bool = False) -> _Labelled:
    """The usable functions of one source in one language, labelled (stats: the reader's and
    the labeller's counts). stored.py caches it, keyed by the files and min_chars."""
    records, stats = _read(kind, what, language, skip_tests)
    lab = _label(records, language, min_chars, verbose)
    lab.stats = {**stats, **lab.stats}
    return lab


def _label(records: list[corpus.Record], language: str, min_chars: int,
           verbose: bool = False) -> _Labelled:
    records = sorted(records, key=lambda r: (r.repo, r.path))  # stable: file order kept
    seen: set[str] = set()
    out = _Labelled([], [], [], [], np.zeros(0), np.zeros(0), {})
    n_dup = n_short = n_lex = 0
    t0 = time.perf_counter()
    for k, r in enumerate(records):
        if verbose and k and k % 50_000 == 0:
            _log(True, f"labelled {k}/{len(records)} {language} functions "
                       f"({time.perf_counter() - t0:.0f}s)")
        if r.code in seen:
            n_dup += 1
            continue
        seen.add(r.code)
        if len(r.code) < min_chars:
            n_short += 1
            continue
        try:
            cat, depth = lexer.labels(r.code, language)
        except lexer.LexError:
            n_lex += 1
            continue
        out.codes.append(r.code)
        out.file_keys.append(f"{r.repo}/{r.path}")
        out.cat.append(cat)
        out.depth.append(np.minimum(depth, np.iinfo(np.int16).max).astype(np.int16))
    out.lengths = np.array([len(c) for c in out.codes], np.int64)
    out.max_depth = np.array([int(d.max()) if len(d) else 0 for d in out.depth], np.int64)
    out.stats = {"duplicates": n_dup, "too_short": n_short, "lex_errors": n_lex,
                 "functions": len(out.codes)}
    return out


# ----------------------------------------------------------------------------- splits


def _sample(rng: np.random.Generator, idx: np.ndarray, cap: int) -> np.ndarray:
    if cap == -1 or len(idx) <= cap:
        return idx
    return np.sort(rng.choice(idx, size=cap, replace=False))


def _arrays(lab: _Labelled, idx: np.ndarray, width: int, vocab: Vocab, file_ids: np.ndarray,
            language: str) -> tuple[CodeSplit, int, int]:
    """The split's arrays, and (UNK count, character count)."""
    n = len(idx)
    lengths = lab.lengths[idx].astype(np.int32)
    tokens = np.zeros((n, width), np.int32)
    category = np.full((n, width), -1, np.int8)
    depth = np.zeros((n, width), np.int32)
    tokens[:, 0] = BOS
    tokens[np.arange(n), lengths + 1] = EOS
    if n:
        rows = np.repeat(np.arange(n), lengths)
        cols = np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        ids = vocab.encode_codepoints(_codepoints("".join(lab.codes[i] for i in idx)))
        tokens[rows, cols + 1] = ids
        category[rows, cols] = np.concatenate([lab.cat[i] for i in idx])
        depth[rows, cols] = np.concatenate([lab.depth[i] for i in idx])
        unk = int((ids == UNK).sum())
    else:
        unk = 0
    split = CodeSplit(tokens=tokens, category=category, bracket_depth=depth,
                      file_id=file_ids[idx].astype(np.int32), lengths=lengths,
                      max_depth=lab.max_depth[idx].astype(np.int32), language=language)
    return split, unk, int(lengths.sum())


def _category_counts(s: CodeSplit) -> dict[str, Any]:
    """Predicted characters per category, and closing brackets per depth."""
    n = np.bincount(s.category[s.category >= 0], minlength=len(CATEGORIES))
    closes = s.bracket_depth[s.category == lexer.CLOSE]
    by_depth = np.bincount(closes) if len(closes) else np.zeros(0, np.int64)
    return {**{c: int(k) for c, k in zip(CATEGORIES, n, strict=True)},
            "close_bracket_by_depth": {str(d): int(k) for d, k in enumerate(by_depth) if k}}


def _vocab(lab: _Labelled, idx: np.ndarray, min_count: int, max_vocab: int) -> Vocab:
    cps = _codepoints("".join(lab.codes[i] for i in idx))
    uniq, counts = np.unique(cps, return_counts=True)
    keep = counts >= min_count
    room = max_vocab - NUM_SPECIAL
    if keep.sum() > room:  # the most frequent characters; ties to the lower code point
        order = np.lexsort((uniq, -counts))
        keep = np.zeros_like(keep)
        keep[order[:room]] = True
        keep &= counts >= min_count
    return Vocab("".join(map(chr, np.sort(uniq[keep]).tolist())))


def make_splits(data_cfg: Any, verbose: bool = True) -> CodeData:
    """Reads, labels and splits the corpus (see the module docstring); no caching."""
    p = _params(data_cfg)
    src = _resolve("source", p["source"], p["language"], p["skip_tests"])
    other = _resolve("other_source", p["other_source"], p["other_language"], p["skip_tests"])
    return _make(p, src, other, verbose)


def _log(verbose: bool, msg: str) -> None:
    if verbose:
        print(f"code data: {msg}", flush=True)


def _make(p: dict[str, Any], src: tuple[str, Any], other: tuple[str, Any],
          verbose: bool, labelled_of: Callable[..., _Labelled] = read_labelled) -> CodeData:
    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    report: dict[str, Any] = {"corpus": {}}
    labelled: dict[str, _Labelled] = {}
    for role, (kind, what), language in (("main", src, p["language"]),
                                         ("other", other, p["other_language"])):
        if kind == "none":
            continue
        _log(verbose, f"reading {language} from {_describe(kind, what)} ...")
        t = time.perf_counter()
        lab = labelled_of(kind, what, language, p["skip_tests"], p["min_chars"], verbose)
        timings[f"{role}_functions_s"] = time.perf_counter() - t
        stats = lab.stats
        report["corpus"][language] = stats
        _log(verbose, f"{language}: {stats} ({timings[f'{role}_functions_s']:.1f}s)")
        if lab.stats["functions"] == 0:
            key = "source" if role == "main" else "other_source"
            raise ValueError(f"code data: data.{key}={p[key]!r} gave 0 usable {language} "
                             f"functions ({stats})")
        labelled[role] = lab

    # Files: one id per (repo, path), main language first; held-out files by seeded shuffle.
    main = labelled["main"]
    files = sorted(set(main.file_keys))
    other_files = sorted(set(labelled["other"].file_keys)) if "other" in labelled else []
    all_files = files + other_files
    fid = {f: i for i, f in enumerate(all_files)}
    main_fid = np.array([fid[f] for f in main.file_keys], np.int64)
    rng = np.random.default_rng([p["seed"], 0])
    n_held = int(round(p["iid_fraction"] * len(files)))
    if not 1 <= n_held < len(files):
        raise ValueError(f"code data: data.iid_fraction={p['iid_fraction']} holds out {n_held} "
                         f"of {len(files)} files; need at least 1 file on each side")
    held = np.zeros(len(all_files), bool)
    held[rng.permutation(len(files))[:n_held]] = True
    in_train = ~held[main_fid]

    # Thresholds on the training files.
    lens_tr = main.lengths[in_train]
    q_len = float(np.quantile(lens_tr, p["length_quantile"]))
    L = int(min(np.floor(q_len), p["context"] - 2))
    fits = in_train & (main.lengths <= L)
    if not fits.any():
        raise ValueError(f"code data: no training function fits data.context={p['context']} "
                         f"(shortest: {lens_tr.min()} characters)")
    D = int(np.floor(np.quantile(main.max_depth[fits], p["depth_quantile"])))
    report["thresholds"] = {"length": L, "length_quantile_value": q_len,
                            "length_capped_by_context": q_len > p["context"] - 2, "depth": D}
    ok_len, ok_depth = main.lengths <= L, main.max_depth <= D
    longest = p["longer_context"] - 2
    ood = np.ones_like(in_train) if p["ood_from_train_files"] else ~in_train
    pools = {
        "train": np.flatnonzero(in_train & ok_len & ok_depth),
        "iid": np.flatnonzero(~in_train & ok_len & ok_depth),
        "longer": np.flatnonzero(ood & (main.lengths > L) & (main.lengths <= longest) & ok_depth),
        "deeper": np.flatnonzero(ood & ok_len & ~ok_depth),
    }
    report["too_long_for_longer"] = int((ood & (main.lengths > longest) & ok_depth).sum())
    if "other" in labelled:
        o = labelled["other"]
        pools["other_language"] = np.flatnonzero((o.lengths <= L) & (o.max_depth <= D))
    for name, pool in pools.items():
        if len(pool) == 0:
            raise ValueError(f"code split '{name}': 0 functions (thresholds: length <= {L}, "
                             f"depth <= {D}, longer up to {longest}); use a larger corpus or "
                             f"change data.length_quantile / depth_quantile / context")

    chosen = {}
    for i, name in enumerate(SPLITS):
        if name in pools:
            cap = p["num_train"] if name == "train" else p["num_eval"]
            chosen[name] = _sample(np.random.default_rng([p["seed"], 1 + i]), pools[name], cap)
    vocab = _vocab(main, chosen["train"], p["min_char_count"], p["max_vocab"])

    t = time.perf_counter()
    splits, unk_rates, sizes, counts = {}, {}, {}, {}
    for name, idx in chosen.items():
        lab = labelled["other" if name == "other_language" else "main"]
        fids = (np.array([fid[f] for f in lab.file_keys], np.int64) if name == "other_language"
                else main_fid)
        width = p["longer_context"] if name == "longer" else p["context"]
        language = p["other_language" if name == "other_language" else "language"]
        splits[name], unk, chars = _arrays(lab, idx, width, vocab, fids, language)
        unk_rates[name] = unk / max(chars, 1)
        counts[name] = _category_counts(splits[name])
        sizes[name] = {"functions": len(idx), "available": len(pools[name]), "chars": chars,
                       "files": len(np.unique(splits[name].file_id))}
    timings["arrays_s"] = time.perf_counter() - t
    timings["total_s"] = time.perf_counter() - t0
    if "other" not in labelled:
        report["other_language_skipped"] = other[1]
    report.update(sizes=sizes, unk_rates=unk_rates, categories=counts, vocab_size=vocab.size,
                  held_out_files=n_held, files=all_files, timings=timings)
    for name, s in sizes.items():
        _log(verbose, f"{name}: {s['functions']} functions ({s['available']} available, "
                      f"{s['files']} files), UNK rate {unk_rates[name]:.2e}")
    return CodeData(splits, vocab, report)
