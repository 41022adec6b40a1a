"""The code data's cache: `load_or_make` (splits.make_splits, cached as one .npz keyed by the
config, a cache version, the Python version and the source files' names, sizes and
modification times) and `cache_path`, the file it uses."""

from __future__ import annotations

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
    _make,
    _params,
    _resolve,
)


def _cache_key(p: dict[str, Any], src: tuple[str, Any], other: tuple[str, Any]) -> str:
    ident = {k: v for k, v in p.items() if k != "cache_dir"}
    ident["version"] = _CACHE_VERSION
    ident["python"] = list(sys.version_info[:2])  # tokenize and the stdlib change with it
    ident["files"] = _files_identity(*src, p["language"], p["skip_tests"])
    ident["other_files"] = (_files_identity(*other, p["other_language"], p["skip_tests"])
                            if other[0] != "none" else other[1])
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]


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
                              lambda path: _load(path, p), lambda: _make(p, src, other, verbose),
                              _save, "code data", verbose)
