import collections
import itertools
import os
import random
import signal
import subprocess
import sys

import numpy as np
import pytest
import scipy.stats
from ml_collections import ConfigDict

from jaxillusions.runtime import cache
from jaxillusions.tasks import dyck_sentences as dyck

BASE = dict(num_types=3, max_depth=3, num_train=3000, num_eval=200, min_len=2, max_len=16,
            longer_max_len=28, depth_extra=2, seed=0, cache_dir="")


def make_cfg(**kw) -> ConfigDict:
    return ConfigDict({**BASE, **kw})


@pytest.fixture(scope="module")
def splits() -> dict[str, dyck.Split]:
    return dyck.make_splits(make_cfg())


def body(row: np.ndarray) -> tuple[int, ...]:
    """Bracket tokens of one row, checking the BOS ... EOS PAD* frame."""
    row = [int(x) for x in row]
    assert row[0] == dyck.BOS
    end = row.index(dyck.EOS)
    assert all(x >= 3 for x in row[1:end]) and all(x == dyck.PAD for x in row[end + 1:])
    return tuple(row[1:end])


def reference(row: np.ndarray, k: int) -> tuple[list[bool], list[int], list[int], int]:
    """Plain-Python annotations of one row; asserts it is balanced with matching types."""
    t_len = len(row)
    is_close, depth, distance = [False] * t_len, [0] * t_len, [0] * t_len
    stack: list[tuple[int, int]] = []  # (type, position)
    max_d = 0
    for t in range(t_len):
        tok = int(row[t])
        if 3 <= tok < 3 + k:
            stack.append((tok - 3, t))
        elif tok >= 3 + k:
            typ, pos = stack.pop()
            assert typ == tok - 3 - k, "close does not match the open type"
            is_close[t - 1], distance[t - 1] = True, t - pos
        depth[t] = len(stack)
        max_d = max(max_d, len(stack))
    assert not stack, "unbalanced"
    return is_close, depth, distance, max_d


def test_ids():
    assert dyck.vocab_size(20) == 43
    assert dyck.open_id(0, 20) == 3 and dyck.close_id(19, 20) == 42
    np.testing.assert_array_equal(dyck.close_id(np.arange(3), 3), [6, 7, 8])


def test_shapes_balanced_and_bounds(splits):
    c = make_cfg()
    m, k = c.max_depth, c.num_types
    assert tuple(splits) == dyck.SPLITS
    for name, s in splits.items():
        n = c.num_train if name == "train" else c.num_eval
        width = (c.longer_max_len if name == "longer" else c.max_len) + 2
        assert s.tokens.shape == s.is_close.shape == s.depth.shape == s.distance.shape
        assert s.tokens.shape == (n, width) and s.tokens.dtype == np.int32
        assert s.lengths.shape == s.max_depths.shape == (n,)
        for row, length, max_d in zip(s.tokens, s.lengths, s.max_depths, strict=True):
            assert len(body(row)) == length
            assert reference(row, k)[3] == max_d
        lo, hi = (c.max_len + 1, c.longer_max_len) if name == "longer" else (c.min_len, c.max_len)
        assert lo <= s.lengths.min() and s.lengths.max() <= hi, name
        if name == "unseen_depth":
            assert s.max_depths.min() > m and s.max_depths.max() <= m + c.depth_extra
        else:
            assert s.max_depths.max() <= m, name
    assert splits["longer"].lengths.min() > splits["train"].lengths.max()


def test_eval_splits_disjoint_and_structures(splits):
    k = make_cfg().num_types

    def skeleton(b: tuple[int, ...]) -> tuple[bool, ...]:
        return tuple(x < 3 + k for x in b)

    train = {body(r) for r in splits["train"].tokens}
    train_struct = {skeleton(b) for b in train}
    for name in dyck.SPLITS[1:]:
        if name != "iid_with_train":  # the one split that may repeat training sentences
            assert not train & {body(r) for r in splits[name].tokens}, name
    assert {skeleton(body(r)) for r in splits["seen_structure"].tokens} <= train_struct
    assert not {skeleton(body(r)) for r in splits["unseen_structure"].tokens} & train_struct
    # The hashed keys agree with the Python sets.
    keys = dyck.structures(splits["unseen_structure"].tokens, k)
    assert not np.isin(keys, dyck.structures(splits["train"].tokens, k)).any()


def sentence_probability(b: tuple[int, ...], k: int, m: int) -> float:
    """Probability of one typed sentence under the Hewitt walk (no length bound)."""
    prob, depth = 0.5, 0  # the final stop at depth 0
    for x in b:
        prob *= 1.0 if depth == m else 0.5  # at max depth the close is forced
        if x < 3 + k:
            prob, depth = prob / k, depth + 1  # each matched pair's type is uniform
        else:
            depth -= 1
    return prob


def length_probability(lo: int, hi: int, m: int) -> float:
    """P(lo <= length <= hi) of a Hewitt walk: dynamic programming over the depth."""
    ways, total = [1.0] + [0.0] * m, 0.0  # P(at depth d after `length` steps, not stopped)
    for length in range(1, hi + 1):
        ways = [(0.5 * ways[d - 1] if d > 0 else 0.0)
                + (ways[d + 1] * (1.0 if d + 1 == m else 0.5) if d < m else 0.0)
                for d in range(m + 1)]
        if length >= lo:
            total += 0.5 * ways[0]  # then stop
    return total


def test_sentence_law_sums_to_the_length_probability():
    m, hi = 2, 10
    total = 0.0
    for n in range(2, hi + 1, 2):
        for steps in itertools.product((3, 4), repeat=n):  # k = 1: open 3, close 4
            heights = np.cumsum([1 if x == 3 else -1 for x in steps])
            if heights.min() >= 0 and heights[-1] == 0 and heights.max() <= m:
                total += sentence_probability(steps, 1, m)
    assert total == pytest.approx(length_probability(2, hi, m), rel=1e-12)


def test_iid_with_train_repeats_training_sentences_at_the_sampler_rate():
    cfg = make_cfg(num_eval=3000)
    out = dyck.make_splits(cfg)
    k, m = cfg.num_types, cfg.max_depth
    train = {body(r) for r in out["train"].tokens}
    # P(a fresh draw is a training sentence) = sum of P(s) over train, given the length bounds.
    rate = (sum(sentence_probability(b, k, m) for b in train)
            / length_probability(cfg.min_len, cfg.max_len, m))
    assert 0.2 < rate < 0.9  # the short sentences, all in train, make the rate large
    hits = sum(body(r) in train for r in out["iid_with_train"].tokens)
    lo, hi = scipy.stats.binom.interval(0.999, cfg.num_eval, rate)
    assert lo <= hits <= hi, (hits, rate * cfg.num_eval)
    for name in dyck.SPLITS[1:-1]:  # every other evaluation split holds none
        assert not any(body(r) in train for r in out[name].tokens), name


def test_annotations_match_reference(splits):
    k = make_cfg().num_types
    for s in splits.values():
        for i in range(0, len(s.tokens), max(1, len(s.tokens) // 10)):
            is_close, depth, distance, _ = reference(s.tokens[i], k)
            np.testing.assert_array_equal(s.is_close[i], is_close)
            np.testing.assert_array_equal(s.depth[i], depth)
            np.testing.assert_array_equal(s.distance[i], distance)
        assert (s.depth[s.is_close] >= 1).all() and (s.distance[s.is_close] >= 1).all()
        assert (s.distance[~s.is_close] == 0).all()


def test_annotate_example():
    k = 2  # ( [ ] ) ( ) with ( = type 0, [ = type 1
    o0, o1, c0, c1 = 3, 4, 5, 6
    s = dyck.annotate(np.array([[1, o0, o1, c1, c0, o0, c0, 2, 0]]), k)
    np.testing.assert_array_equal(s.depth[0], [0, 1, 2, 1, 0, 1, 0, 0, 0])
    np.testing.assert_array_equal(s.is_close[0], [0, 0, 1, 1, 0, 1, 0, 0, 0])
    np.testing.assert_array_equal(s.distance[0], [0, 0, 1, 3, 0, 1, 0, 0, 0])
    assert s.lengths[0] == 6 and s.max_depths[0] == 2


def test_structures_ignore_types_and_padding():
    k = 3
    a = np.array([[1, 3, 4, 7, 6, 2, 0]])
    b = np.array([[1, 5, 5, 8, 8, 2, 0, 0, 0]])  # same skeleton, other types, wider
    c = np.array([[1, 3, 6, 3, 6, 2, 0]])
    assert dyck.structures(a, k)[0] == dyck.structures(b, k)[0] != dyck.structures(c, k)[0]
    assert dyck.sentences(a)[0] != dyck.sentences(b[:, :7])[0]


def test_deterministic(splits):
    again = dyck.make_splits(make_cfg())
    for name in dyck.SPLITS:
        np.testing.assert_array_equal(splits[name].tokens, again[name].tokens)
    other = dyck.make_splits(make_cfg(seed=1))
    for name in dyck.SPLITS:
        assert not np.array_equal(splits[name].tokens, other[name].tokens), name


def test_count_matches_enumeration():
    for m, max_len in [(1, 8), (2, 8), (3, 10)]:
        want = 0
        for n in range(2, max_len + 1, 2):
            for steps in itertools.product((1, -1), repeat=n):
                heights = np.cumsum(steps)
                want += heights.min() >= 0 and heights[-1] == 0 and heights.max() <= m
        assert dyck._count(2, max_len, m, 1) == want
    assert dyck._count(2, 4, 2, 5) == 5 + 25 + 25  # () ; ()() and (()) with 5 types each


def test_hewitt_statistics():
    # Raw walkers (before length rejection): every decision is a fair coin except at max depth.
    m = 3
    skel, _ = dyck._walk(np.random.default_rng(0), 100_000, m, 200)
    skel = skel.astype(np.int64)
    assert abs((skel[:, 1] == dyck.EOS).mean() - 0.5) < 0.01
    depth_before = np.cumsum((skel == 3).astype(int) - (skel == 4), axis=1)[:, :-1]
    nxt = skel[:, 1:]
    written = nxt != dyck.PAD
    for d in range(m + 1):
        at = written & (depth_before == d)
        if d == 0:
            frac = (nxt[at] == dyck.EOS).mean()  # stop vs open
        else:
            frac = (nxt[at] == 4).mean()  # close vs open
        assert abs(frac - (1.0 if d == m else 0.5)) < 0.01, (d, frac)
    # Types are uniform.
    k = 5
    tok = dyck.sample_sentences(np.random.default_rng(1), 20_000, k, 4, 2, 20)
    opens = tok[(tok >= 3) & (tok < 3 + k)] - 3
    freq = np.bincount(opens, minlength=k) / len(opens)
    assert np.abs(freq - 1 / k).max() < 0.01


def test_cache_roundtrip_and_corrupt(tmp_path, capsys, monkeypatch):
    cfg = make_cfg(num_train=500, num_eval=50)
    first = dyck.load_or_make(cfg, cache_dir=str(tmp_path))
    assert "generated" in capsys.readouterr().out
    path = dyck.cache_path(cfg, str(tmp_path))
    assert [p.name for p in tmp_path.iterdir()] == [path.split("/")[-1]]

    def boom(cfg):
        raise AssertionError("regenerated instead of loading")

    with monkeypatch.context() as mp:
        mp.setattr(dyck, "make_splits", boom)
        second = dyck.load_or_make(cfg, cache_dir=str(tmp_path))
    assert "loaded" in capsys.readouterr().out
    for name in dyck.SPLITS:
        for field in ("tokens", "is_close", "depth", "distance", "lengths", "max_depths"):
            np.testing.assert_array_equal(getattr(first[name], field),
                                          getattr(second[name], field))
    # cfg.cache_dir is used when no argument is given; other data values give another file.
    assert dyck.cache_path(make_cfg(cache_dir=str(tmp_path), num_train=500, num_eval=50)) == path
    assert dyck.cache_path(cfg, str(tmp_path)) != dyck.cache_path(make_cfg(seed=3), str(tmp_path))

    with open(path, "wb") as f:
        f.write(b"not an npz")
    with pytest.warns(UserWarning, match="unreadable cache"):
        third = dyck.load_or_make(cfg, cache_dir=str(tmp_path), verbose=False)
    np.testing.assert_array_equal(third["train"].tokens, first["train"].tokens)
    dyck.load_or_make(cfg, cache_dir=str(tmp_path))
    assert "loaded" in capsys.readouterr().out


def test_cache_directory_chain_and_unwritable_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXILLUSIONS_CACHE", str(tmp_path / "env"))
    assert cache.path("x.npz") == cache.path("x.npz", "", None) == str(tmp_path / "env" / "x.npz")
    assert cache.path("x.npz", "", str(tmp_path / "cfg")) == str(tmp_path / "cfg" / "x.npz")
    assert cache.path("x.npz", "a", "b") == "a/x.npz"  # the argument before the config
    monkeypatch.delenv("JAXILLUSIONS_CACHE")
    assert cache.path("x.npz") == os.path.expanduser("~/.cache/jaxillusions/x.npz")
    # A cache directory that cannot be made (a file is in the way) only warns; no temp files.
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.warns(UserWarning, match="could not write cache"):
        splits = dyck.load_or_make(make_cfg(num_train=500, num_eval=50),
                                   cache_dir=str(blocker / "sub"), verbose=False)
    assert splits["train"].tokens.shape[0] == 500
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


# A process asking the data cache for a file: its maker, when it makes it, prints "making", then
# waits for `go` to exist before it returns; the process prints what it got.
_CACHE_CLIENT = """
import os, sys, time
import numpy as np
from jaxillusions.runtime import cache, interrupt

file, go = sys.argv[1:]

def make():
    print("making", flush=True)
    while not os.path.exists(go):
        time.sleep(0.01)
    return np.arange(5)

with interrupt.catch_signals():
    try:
        data = cache.load_or_make(file, lambda p: np.load(p)["x"], make,
                                  lambda p, d: cache.save_npz(p, {"x": d}), "test data")
    except interrupt.Stopped as err:
        print(err, flush=True)
        sys.exit(err.exit_code)
print("got", data.tolist(), flush=True)
"""


def test_processes_sharing_the_cache_make_a_file_once_and_a_signal_stops_a_waiter(tmp_path):
    file, go = str(tmp_path / "cache" / "x.npz"), str(tmp_path / "go")
    client = tmp_path / "client.py"
    client.write_text(_CACHE_CLIENT)

    def start():
        return subprocess.Popen([sys.executable, str(client), file, go], stdout=subprocess.PIPE,
                                text=True)

    maker = start()
    assert maker.stdout.readline() == "making\n"
    waiter = start()  # asks while the maker makes it: waits, then loads the maker's file
    assert "another process is making" in waiter.stdout.readline()
    stopped = start()  # a second waiter, stopped by a signal while it waits
    assert "waiting for it" in stopped.stdout.readline()
    stopped.send_signal(signal.SIGTERM)
    assert stopped.wait(timeout=60) == 143
    # Its line, and the signal watcher's "received SIGTERM" line from another thread, in
    # either order.
    assert f"stopped by SIGTERM while waiting for {file}" in stopped.stdout.read().splitlines()
    assert os.path.exists(f"{file}.lock")  # the maker's lock, left alone by the stopped waiter
    open(go, "w").close()
    assert maker.wait(timeout=60) == 0 and waiter.wait(timeout=60) == 0
    made, loaded = maker.stdout.read().splitlines(), waiter.stdout.read().splitlines()
    assert made[0].startswith("test data: generated in")
    assert loaded[0] == f"test data: loaded {file}"
    assert made[1] == loaded[1] == "got [0, 1, 2, 3, 4]"
    assert os.listdir(tmp_path / "cache") == ["x.npz"]  # the lock file removed by its holder


@pytest.mark.parametrize("kw, match", [
    (dict(num_types=0), "num_types"),
    (dict(max_depth=0), "max_depth"),
    (dict(min_len=1), "min_len"),
    (dict(min_len=18), "min_len"),
    (dict(min_len=15, max_len=15), "no even length"),
    (dict(longer_max_len=16), "longer_max_len"),
    (dict(longer_max_len=17), "longer_max_len"),
    (dict(depth_extra=0), "depth_extra"),
    (dict(num_train=0), "num_train"),
    (dict(num_eval=0), "num_eval"),
    (dict(seed=-1), "seed"),
    (dict(max_depth=8), r"max_len must be >= 2\*\(max_depth\+1\) = 18.*unseen_depth"),
])
def test_bad_config(kw, match):
    with pytest.raises(ValueError, match=match):
        dyck.make_splits(make_cfg(**kw))


def test_impossible_splits(monkeypatch):
    # All 7 skeletons of length <= 6 and depth <= 2 occur in 2000 train sentences.
    small = dict(max_depth=2, max_len=6, longer_max_len=10, num_train=2000, num_eval=50)
    with pytest.raises(ValueError, match="'unseen_structure': found 0 of 50.*cover all"):
        dyck.make_splits(make_cfg(num_types=8, **small))
    # With 2 types the 42 sentences themselves are all in train.
    with pytest.raises(ValueError, match="'iid': found 0 of 50.*cover all"):
        dyck.make_splits(make_cfg(num_types=2, **small))
    # One type: retyping a train structure always gives a train sentence.
    with pytest.raises(ValueError, match="'seen_structure': found 0 of 200"):
        dyck.make_splits(make_cfg(num_types=1, num_train=200))
    # Depth 7 in 14 tokens has one skeleton (acceptance ~2**-15): gives up with the counts.
    monkeypatch.setattr(dyck, "MAX_ROUNDS", 3)
    with pytest.raises(ValueError, match=r"'unseen_depth': found \d+ of 5000 .*raise max_len"):
        dyck.make_splits(make_cfg(max_depth=6, max_len=14, num_train=500, num_eval=5000))


def naive_hewitt(rng: random.Random, max_depth: int) -> tuple[int, int]:
    """(length, max depth) of one unbounded Hewitt skeleton walk, one step at a time."""
    length = depth = top = 0
    while True:
        if depth == 0 and rng.random() < 0.5:
            return length, top
        depth += -1 if depth == max_depth or (depth > 0 and rng.random() < 0.5) else 1
        length, top = length + 1, max(top, depth)


@pytest.mark.parametrize("need_depth", [0, 4])
def test_vectorized_law_matches_naive_rejection(need_depth):
    # The batched, pruned walker + rejection must give the same (length, max depth) law as
    # plain rejection sampling of the Hewitt walk. Sampler depth 5, lengths 2..16.
    n, rng = 4000, random.Random(0)
    naive: list[tuple[int, int]] = []
    while len(naive) < n:
        length, top = naive_hewitt(rng, 5)
        if 2 <= length <= 16 and top >= need_depth:
            naive.append((length, top))
    tok = dyck._hewitt(np.random.default_rng(0), 200_000, 2, 5, 2, 16, need_depth=need_depth)
    s = dyck.annotate(tok[:n], 2)
    assert len(s.tokens) == n
    fast = collections.Counter(zip(s.lengths.tolist(), s.max_depths.tolist(), strict=True))
    naive_counts = collections.Counter(naive)
    tv = 0.5 * sum(abs(naive_counts[c] - fast[c]) for c in naive_counts | fast) / n
    assert tv < 0.06, tv
