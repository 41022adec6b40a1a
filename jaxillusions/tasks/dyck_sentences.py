"""Dyck-(k, m) data with systematic-generalization splits (pure numpy, vectorized).

Token ids: PAD=0, BOS=1, EOS=2, open of type i = 3+i, close of type i = 3+k+i.
Every row is ``BOS s_1 ... s_n EOS PAD ...``. Sentences are drawn from the Hewitt et al.
(2020) sampler and length-bounded by rejection; the eval splits are filtered against train by
uint64 row hashes (of the sentence, or of its type-erased skeleton).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import numbers
from collections.abc import Callable
from typing import Any

import numpy as np

from jaxillusions.runtime import cache

PAD, BOS, EOS = 0, 1, 2
# New splits go at the end: each split's random stream is derived from its index here.
SPLITS = ("train", "iid", "seen_structure", "unseen_structure", "unseen_depth", "longer",
          "iid_with_train")
DATA_KEYS = ("num_types", "max_depth", "num_train", "num_eval", "min_len", "max_len",
             "longer_max_len", "depth_extra", "seed")
MAX_ROUNDS = 200  # rejection rounds per split before giving up
_CACHE_VERSION = 2  # bump when the generated data changes for the same config
_MAX_CELLS = 1 << 23  # tokens per rejection batch: bounds memory (~32 MB of int32)


def vocab_size(num_types: int) -> int:
    return 3 + 2 * num_types


def open_id(t: Any, num_types: int) -> Any:
    return 3 + t


def close_id(t: Any, num_types: int) -> Any:
    return 3 + num_types + t


# eq=False: field-wise == on arrays is ambiguous; compare the arrays themselves.
@dataclasses.dataclass(frozen=True, eq=False)
class Split:
    tokens: np.ndarray  # int32 [N, T]
    is_close: np.ndarray  # bool [N, T]: tokens[:, t+1] is a closing bracket
    depth: np.ndarray  # int32 [N, T]: stack depth after tokens[:, :t+1]
    distance: np.ndarray  # int32 [N, T]: (t+1) - position of the matching open, 0 elsewhere
    lengths: np.ndarray  # int32 [N]: number of bracket tokens
    max_depths: np.ndarray  # int32 [N]


# ----------------------------------------------------------------------------- sampling


def _walk(rng: np.random.Generator, batch: int, max_depth: int, max_len: int,
          need_depth: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Runs `batch` Hewitt walkers on the type-erased skeleton (open=3, close=4, i.e. the k=1
    language; types are drawn afterwards per matched pair by _retype, which is the same law).
    Returns uint8 [batch, max_len+2] and ok: ended within max_len and reached need_depth."""
    # Time-major so each step writes one contiguous row (rows are transposed at the end).
    tokens = np.zeros((max_len + 2, batch), np.uint8)
    tokens[0] = BOS
    ok = np.zeros(batch, bool)
    # Only running walkers are simulated (compacted every step): half stop at step 0.
    idx = np.arange(batch)
    depth = np.zeros(batch, np.int16)
    reached = np.full(batch, need_depth <= 0)
    for s in range(max_len + 1):
        n = len(idx)
        if n == 0:
            break
        # One random bit per walker (unpacked from bytes: ~8x cheaper than rng.random).
        coin = np.unpackbits(np.frombuffer(rng.bytes((n + 7) // 8), np.uint8), count=n)
        coin = coin.view(bool)
        stop = (depth == 0) & coin
        close = (depth > 0) & ((depth == max_depth) | coin)
        tokens[s + 1, idx] = 3 + close.view(np.uint8) - stop.view(np.uint8)  # open 3, close 4
        depth += 1 - stop.view(np.int8) - 2 * close.view(np.int8)  # stop 0, open +1, close -1
        reached |= depth >= need_depth
        ok[idx[stop & reached]] = True
        # Walkers that can no longer close all brackets (and first reach need_depth) within
        # max_len are sure rejects: drop them now instead of simulating them to the end.
        budget = max_len - (s + 1)
        keep = ~stop & (depth <= budget) & (reached | (2 * need_depth - depth <= budget))
        idx, depth, reached = idx[keep], depth[keep], reached[keep]
    return tokens.T, ok


def _hewitt(rng: np.random.Generator, batch: int, num_types: int, max_depth: int, min_len: int,
            max_len: int, need_depth: int = 0) -> np.ndarray:
    """The accepted (length in [min_len, max_len], depth >= need_depth) typed sentences among
    `batch` Hewitt walkers: int32 [<= batch, max_len+2]."""
    skel, ok = _walk(rng, batch, max_depth, max_len, need_depth)
    skel = skel[ok]
    skel = skel[_lengths(skel) >= min_len]
    return _retype(rng, skel, num_types)


def _fill(rng: np.random.Generator, n: int, width: int,
          propose: Callable[[np.random.Generator, int], np.ndarray],
          what: str, hint: str) -> np.ndarray:
    """Rejection loop: calls propose(rng, batch) -> accepted rows until n rows are found."""
    cap = max(1024, _MAX_CELLS // width)
    batch = min(cap, 2 * n + 256)
    out, got, tried = [], 0, 0
    for r in range(MAX_ROUNDS):
        rows = propose(rng, batch)
        out.append(rows)
        got += len(rows)
        tried += batch
        if got >= n:
            return np.concatenate(out)[:n]
        rate = got / tried
        # Give up early when even the remaining rounds at full batch size would not do.
        if r >= 4 and (n - got) > 2 * rate * cap * (MAX_ROUNDS - r - 1):
            break
        # Size the next batch from the observed acceptance rate (10% slack).
        batch = int(min(cap, max(256, 1.1 * (n - got) / max(rate, 1.0 / tried))))
    raise ValueError(f"dyck split '{what}': found {got} of {n} requested sentences "
                     f"({tried} samples tried, acceptance {got / tried:.2e}); {hint}")


def _lengths(tokens: np.ndarray) -> np.ndarray:
    return (tokens >= 3).sum(1).astype(np.int32)


def sample_sentences(rng: np.random.Generator, n: int, num_types: int, max_depth: int,
                     min_len: int, max_len: int) -> np.ndarray:
    """n Hewitt sentences with min_len <= length <= max_len: int32 [n, max_len+2]."""
    def propose(g: np.random.Generator, batch: int) -> np.ndarray:
        return _hewitt(g, batch, num_types, max_depth, min_len, max_len)

    return _fill(rng, n, max_len + 2, propose, "sample",
                 "widen [min_len, max_len] or lower the number requested")


# ----------------------------------------------------------------------------- structure


def _mix(z: np.ndarray) -> np.ndarray:
    # splitmix64 finalizer: a bijective avalanche on uint64 (wrapping arithmetic is intended).
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _hash_rows(x: np.ndarray) -> np.ndarray:
    # Pack 4 uint16 tokens per uint64 word (ids < 2**16, see _params) and hash word by word.
    packed = np.zeros((len(x), -(-x.shape[1] // 4) * 4), np.uint16)
    packed[:, :x.shape[1]] = x
    h = np.zeros(len(x), np.uint64)
    for w in packed.view(np.uint64).T:
        # All-PAD words are skipped so keys do not depend on the padded width (train vs longer).
        h = np.where(w != 0, _mix(h ^ (w + np.uint64(0x9E3779B97F4A7C15))), h)
    return h


def sentences(tokens: np.ndarray) -> np.ndarray:
    """One uint64 key per row of the sentence itself (for set membership)."""
    return _hash_rows(tokens)


def _skeleton(tokens: np.ndarray, num_types: int) -> np.ndarray:
    # Type erasure: every open -> 3, every close -> 4 (the k=1 language).
    return np.where(tokens >= 3 + num_types, 4, np.where(tokens >= 3, 3, tokens))


def structures(tokens: np.ndarray, num_types: int) -> np.ndarray:
    """One uint64 key per row of the type-erased open/close skeleton."""
    return _hash_rows(_skeleton(tokens, num_types))


def _pairs(tokens: np.ndarray, num_types: int) -> tuple[np.ndarray, ...]:
    """Matched brackets of balanced rows: (row, open_pos, close_pos) arrays and depth [N, T]."""
    opens = (tokens >= 3) & (tokens < 3 + num_types)
    closes = tokens >= 3 + num_types
    depth = np.cumsum(opens.astype(np.int32) - closes, axis=1, dtype=np.int32)
    r, p = np.nonzero(opens | closes)  # row-major: sorted by (row, position)
    # An open at depth-after d and its close (depth-before d) share level d. Within a
    # (row, level) group brackets alternate open, close, open, ... and every group has even
    # size, so after a stable sort by level alone (keeps row-major order; radix sort on int16)
    # consecutive elements 2i, 2i+1 are matched pairs.
    level = (depth[r, p] + closes[r, p]).astype(np.int16)
    order = np.argsort(level, kind="stable")
    o, c = order[0::2], order[1::2]
    return r[o], p[o], p[c], depth


def annotate(tokens: np.ndarray, num_types: int) -> Split:
    """Per-position annotations of balanced rows (see Split)."""
    tokens = np.asarray(tokens, np.int32)
    rows, po, pc, depth = _pairs(tokens, num_types)
    is_close = np.zeros(tokens.shape, bool)
    is_close[:, :-1] = tokens[:, 1:] >= 3 + num_types
    distance = np.zeros(tokens.shape, np.int32)
    distance[rows, pc - 1] = pc - po
    return Split(tokens=tokens, is_close=is_close, depth=depth, distance=distance,
                 lengths=_lengths(tokens), max_depths=depth.max(1).astype(np.int32))


def _retype(rng: np.random.Generator, skel: np.ndarray, num_types: int) -> np.ndarray:
    """Types skeleton rows (see _skeleton): a fresh uniform type for every matched pair."""
    rows, po, pc, _ = _pairs(skel, 1)
    ty = rng.integers(num_types, size=len(po), dtype=np.int32)
    out = skel.astype(np.int32)
    out[rows, po] = open_id(ty, num_types)
    out[rows, pc] = close_id(ty, num_types)
    return out


def _count(min_len: int, max_len: int, max_depth: int, weight: int) -> int:
    """Bounded Dyck paths with length in [min_len, max_len], height <= max_depth, each
    up-step weighted by `weight` (1: skeletons, k: typed sentences). Exact (Python ints)."""
    ways, total = [1] + [0] * max_depth, 0
    for length in range(1, max_len + 1):
        ways = [(ways[d - 1] * weight if d > 0 else 0) + (ways[d + 1] if d < max_depth else 0)
                for d in range(max_depth + 1)]
        if length >= min_len:
            total += ways[0]
    return total


# ----------------------------------------------------------------------------- splits


def _params(cfg: Any) -> dict[str, int]:
    p = {}
    for key in DATA_KEYS:
        v = getattr(cfg, key)
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            raise ValueError(f"data.{key} must be an integer, got {v!r}")
        p[key] = int(v)

    def need(ok: bool, msg: str) -> None:
        if not ok:
            raise ValueError(msg)

    k, m, lo, hi = p["num_types"], p["max_depth"], p["min_len"], p["max_len"]
    # Upper bound: token ids must fit the uint16 packing of _hash_rows.
    need(1 <= k <= 30000, f"data.num_types must be in [1, 30000], got {k}")
    need(m >= 1, f"data.max_depth must be >= 1, got {m}")
    need(hi >= 2, f"data.max_len must be >= 2, got {hi}")
    need(2 <= lo <= hi, f"data.min_len must be in [2, max_len={hi}], got {lo}")
    need(lo < hi or lo % 2 == 0,
         f"data.min_len..max_len = [{lo}, {hi}] contains no even length (sentences are even)")
    first_longer = hi + 2 - hi % 2  # smallest even length above max_len
    need(p["longer_max_len"] >= first_longer,
         f"data.longer_max_len must be > max_len={hi} with room for an even length, i.e. >= "
         f"{first_longer}, got {p['longer_max_len']}")
    need(p["depth_extra"] >= 1, f"data.depth_extra must be >= 1, got {p['depth_extra']}")
    need(p["num_train"] >= 1, f"data.num_train must be >= 1, got {p['num_train']}")
    need(p["num_eval"] >= 1, f"data.num_eval must be >= 1, got {p['num_eval']}")
    need(p["seed"] >= 0, f"data.seed must be >= 0, got {p['seed']}")
    need(hi >= 2 * (m + 1), f"data.max_len must be >= 2*(max_depth+1) = {2 * (m + 1)} for the "
         f"unseen_depth split (no sentence deeper than {m} fits in {hi} tokens), got {hi}")
    return p


def make_splits(cfg: Any) -> dict[str, Split]:
    """All SPLITS, deterministic from cfg.seed (one derived random stream per split)."""
    p = _params(cfg)
    k, m, lo, hi = p["num_types"], p["max_depth"], p["min_len"], p["max_len"]
    n_eval = p["num_eval"]
    rngs = {name: np.random.default_rng([p["seed"], i]) for i, name in enumerate(SPLITS)}
    fix = "raise max_len or lower data.num_eval / data.num_train"
    out = {}

    train = _fill(rngs["train"], p["num_train"], hi + 2,
                  lambda g, b: _hewitt(g, b, k, m, lo, hi), "train",
                  "widen [min_len, max_len] or raise max_depth")
    out["train"] = annotate(train, k)
    lens = out["train"].lengths
    sent_keys = np.unique(sentences(train))
    struct_keys, first = np.unique(structures(train, k), return_index=True)

    def fail_if(covered: bool, split: str, what: str) -> None:
        if covered:
            raise ValueError(f"dyck split '{split}': found 0 of {n_eval} requested sentences: "
                             f"the {p['num_train']} train sentences already cover all {what}; "
                             f"{fix}")

    def iid(g: np.random.Generator, batch: int) -> np.ndarray:
        t = _hewitt(g, batch, k, m, lo, hi)
        return t[~np.isin(sentences(t), sent_keys)]

    fail_if(len(sent_keys) == _count(lo, hi, m, k), "iid", "sentences of the training language")
    out["iid"] = _fill(rngs["iid"], n_eval, hi + 2, iid, "iid", fix)

    # Every type assignment of every train skeleton already in train: retyping cannot escape.
    struct_lens, n_structs = np.unique(lens[first], return_counts=True)
    n_typed = sum(int(c) * k ** (int(n) // 2) for n, c in zip(struct_lens, n_structs, strict=True))
    fail_if(len(sent_keys) == n_typed, "seen_structure", "type assignments of their structures")
    train_skel = _skeleton(train, k)

    def seen(g: np.random.Generator, batch: int) -> np.ndarray:
        t = _retype(g, train_skel[g.integers(len(train), size=batch)], k)
        return t[~np.isin(sentences(t), sent_keys)]

    out["seen_structure"] = _fill(rngs["seen_structure"], n_eval, hi + 2, seen,
                                  "seen_structure", fix + " (or raise num_types)")

    def unseen(g: np.random.Generator, batch: int) -> np.ndarray:
        t = _hewitt(g, batch, k, m, lo, hi)
        return t[~np.isin(structures(t, k), struct_keys)]

    fail_if(len(struct_keys) == _count(lo, hi, m, 1), "unseen_structure",
            f"structures of length {lo}..{hi} and depth <= {m}")
    out["unseen_structure"] = _fill(rngs["unseen_structure"], n_eval, hi + 2, unseen,
                                    "unseen_structure", fix)

    # Sampler depth m + depth_extra; the walker must exceed m (pruned early when it cannot).
    out["unseen_depth"] = _fill(
        rngs["unseen_depth"], n_eval, hi + 2,
        lambda g, b: _hewitt(g, b, k, m + p["depth_extra"], lo, hi, need_depth=m + 1),
        "unseen_depth", "raise max_len or lower max_depth / data.num_eval")
    longest = p["longer_max_len"]
    out["longer"] = _fill(rngs["longer"], n_eval, longest + 2,
                          lambda g, b: _hewitt(g, b, k, m, hi + 1, longest), "longer",
                          "raise longer_max_len or max_depth, or lower data.num_eval")
    # Fresh draws from the training law with training sentences allowed: the baseline that
    # keeps the short sentences `iid` must drop (train holds every one of them).
    out["iid_with_train"] = _fill(rngs["iid_with_train"], n_eval, hi + 2,
                                  lambda g, b: _hewitt(g, b, k, m, lo, hi), "iid_with_train",
                                  "widen [min_len, max_len] or raise max_depth")
    return {name: out[name] if name == "train" else annotate(out[name], k) for name in SPLITS}


# ----------------------------------------------------------------------------- cache


def cache_path(cfg: Any, cache_dir: str | None = None) -> str:
    """The .npz file load_or_make uses for cfg (name hashes the data config values)."""
    key = json.dumps({**_params(cfg), "version": _CACHE_VERSION}, sort_keys=True)
    name = f"dyck-{hashlib.sha256(key.encode()).hexdigest()[:16]}.npz"
    return cache.path(name, cache_dir, getattr(cfg, "cache_dir", ""))


def _load(path: str, p: dict[str, int]) -> dict[str, Split]:
    k = p["num_types"]
    with np.load(path) as f:
        splits = {}
        for name in SPLITS:
            tok = np.asarray(f[name], np.int32)
            rows = p["num_train"] if name == "train" else p["num_eval"]
            width = p["longer_max_len" if name == "longer" else "max_len"] + 2
            if tok.shape != (rows, width) or not (tok[:, 0] == BOS).all() \
                    or tok.max() >= vocab_size(k) or tok.min() < 0:
                raise ValueError(f"split {name} has unexpected shape/content {tok.shape}")
            splits[name] = annotate(tok, k)
    return splits


def load_or_make(cfg: Any, cache_dir: str | None = None,
                 verbose: bool = True) -> dict[str, Split]:
    """make_splits(cfg), cached as one .npz of token arrays (annotations are recomputed)."""
    p = _params(cfg)
    dtype = np.uint8 if vocab_size(p["num_types"]) <= 256 else np.int32

    def save(path: str, splits: dict[str, Split]) -> None:
        cache.save_npz(path, {n: s.tokens.astype(dtype) for n, s in splits.items()})

    return cache.load_or_make(cache_path(cfg, cache_dir), lambda path: _load(path, p),
                              lambda: make_splits(cfg), save, "dyck data", verbose)
