"""The code data's cache: `load_or_make` (splits.make_splits, cached as one .npz keyed by the
config, a cache version, the Python version and the source files' names, sizes and
modification times) and `cache_path`, the file it uses. The labelled functions of each source
it reads are cached too (`code-functions-<key>.npz`, keyed by the files, the language and
min_chars), so that configs which split one corpus differently read and label it once."""

from __future__ import annotations

import functools
import hashlib
import json
import sys
import warnings
from typing import Any

import numpy as np

from jaxillusions.runtime import cache
from jaxillusions.tasks.code_completion.splits import (
    _CACHE_VERSION,
    BOS,
    SPLITS,
    CodeData,
    CodeSplit,
    Vocab,
    _codepoints,
    _files_identity,
    _Labelled,
    _make,
    _params,
    _resolve,
    read_labelled,
)


def _hash(ident: dict[str, Any]) -> str:
    ident = {**ident, "version": _CACHE_VERSION,
             "python": list(sys.version_info[:2])}  # tokenize and the stdlib change with it
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]


def _cache_key(p: dict[str, Any], src: tuple[str, Any], other: tuple[str, Any]) -> str:
    ident = {k: v for k, v in p.items() if k != "cache_dir"}
    ident["files"] = _files_identity(*src, p["language"], p["skip_tests"])
    ident["other_files"] = (_files_identity(*other, p["other_language"], p["skip_tests"])
                            if other[0] != "none" else other[1])
    return _hash(ident)


def cache_path(data_cfg: Any, cache_dir: str | None = None) -> str:
    """The .npz file load_or_make uses for this config and these source files."""
    p = _params(data_cfg)
    src = _resolve("source", p["source"], p["language"], p["skip_tests"])
    other = _resolve("other_source", p["other_source"], p["other_language"], p["skip_tests"])
    return _path(p, cache_dir, _cache_key(p, src, other))


def _path(p: dict[str, Any], cache_dir: str | None, key: str) -> str:
    return cache.path(f"code-{key}.npz", cache_dir, p["cache_dir"])


_FIELDS = ("tokens", "category", "bracket_depth", "file_id", "lengths", "max_depth")


def _save(path: str, data: CodeData) -> None:
    arrays = {"vocab": _codepoints(data.vocab.chars),
              "report": np.array(json.dumps(data.report, sort_keys=True))}
    for name, s in data.splits.items():
        arrays[f"{name}__language"] = np.array(s.language)
        for f in _FIELDS:
            a = getattr(s, f)
            arrays[f"{name}__{f}"] = a.astype(np.uint16) if f == "tokens" else a
    cache.save_npz(path, arrays, compressed=True)


def _load(path: str, p: dict[str, Any]) -> CodeData:
    with np.load(path) as f:
        vocab = Vocab("".join(map(chr, f["vocab"].tolist())))
        report = json.loads(str(f["report"]))
        splits = {}
        for name in SPLITS:
            if f"{name}__tokens" not in f:
                continue
            a = {k: f[f"{name}__{k}"] for k in _FIELDS}
            width = p["longer_context"] if name == "longer" else p["context"]
            n = len(a["lengths"])
            tok = a["tokens"].astype(np.int32)
            if tok.shape != (n, width) or a["category"].shape != (n, width) \
                    or (n and (tok[:, 0] != BOS).any()) or (n and tok.max() >= vocab.size):
                raise ValueError(f"split {name} has unexpected shape/content {tok.shape}")
            splits[name] = CodeSplit(
                tokens=tok, category=a["category"].astype(np.int8),
                bracket_depth=a["bracket_depth"].astype(np.int32),
                file_id=a["file_id"].astype(np.int32), lengths=a["lengths"].astype(np.int32),
                max_depth=a["max_depth"].astype(np.int32), language=str(f[f"{name}__language"]))
    if not all(s in splits for s in SPLITS[:4]):
        raise ValueError("missing splits")
    return CodeData(splits, vocab, report)


def _save_functions(path: str, lab: _Labelled) -> None:
    files = sorted(set(lab.file_keys))
    index = {f: i for i, f in enumerate(files)}
    cache.save_npz(path, {
        "codes": np.frombuffer("".join(lab.codes).encode("utf-8", "surrogatepass"), np.uint8),
        "lengths": lab.lengths,
        "category": np.concatenate([np.zeros(0, np.int8), *lab.cat]),
        "depth": np.concatenate([np.zeros(0, np.int16), *lab.depth]),
        "max_depth": lab.max_depth, "files": np.array(files, dtype=str),
        "file_index": np.array([index[f] for f in lab.file_keys], np.int64),
        "stats": np.array(json.dumps(lab.stats))})


def _load_functions(path: str) -> _Labelled:
    with np.load(path) as f:
        a = {k: f[k] for k in f.files}
    text = a["codes"].tobytes().decode("utf-8", "surrogatepass")  # JSON may escape one
    ends = np.cumsum(a["lengths"])
    if not len(text) == len(a["category"]) == len(a["depth"]) == (ends[-1] if len(ends) else 0):
        raise ValueError("functions and labels of different lengths")
    starts, files = ends - a["lengths"], a["files"].tolist()

    def per_function(values: np.ndarray) -> list[np.ndarray]:
        return np.split(values, ends[:-1]) if len(ends) else []

    return _Labelled(
        codes=[text[i:j] for i, j in zip(starts.tolist(), ends.tolist(), strict=True)],
        file_keys=[files[i] for i in a["file_index"].tolist()],
        cat=per_function(a["category"]), depth=per_function(a["depth"]),
        lengths=a["lengths"], max_depth=a["max_depth"], stats=json.loads(str(a["stats"])))


def _cached_functions(p: dict[str, Any], cache_dir: str | None, kind: str, what: Any,
                      language: str, skip_tests: bool, min_chars: int,
                      verbose: bool) -> _Labelled:
    """splits.read_labelled through its own cache file."""
    key = _hash({"files": _files_identity(kind, what, language, skip_tests),
                 "min_chars": min_chars})
    return cache.load_or_make(
        cache.path(f"code-functions-{key}.npz", cache_dir, p["cache_dir"]), _load_functions,
        lambda: read_labelled(kind, what, language, skip_tests, min_chars, verbose),
        _save_functions, f"{language} functions", verbose)


def load_or_make(data_cfg: Any, cache_dir: str | None = None, verbose: bool = True) -> CodeData:
    """make_splits(data_cfg), cached as one .npz keyed by the config, a cache version, the Python
    version and the source files' names, sizes and modification times."""
    p = _params(data_cfg)
    src = _resolve("source", p["source"], p["language"], p["skip_tests"])
    other = _resolve("other_source", p["other_source"], p["other_language"], p["skip_tests"])
    if other[0] == "none" and p["other_source"] != "":
        warnings.warn(f"code data: the other_language split is skipped: {other[1]} (set "
                      f"data.other_source to a directory or jsonl files, or '' to silence)",
                      stacklevel=2)
    return cache.load_or_make(_path(p, cache_dir, _cache_key(p, src, other)),
                              lambda path: _load(path, p),
                              lambda: _make(p, src, other, verbose, functools.partial(
                                  _cached_functions, p, cache_dir)),
                              _save, "code data", verbose)
