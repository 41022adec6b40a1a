"""Code-completion data: reader, corpus builder, lexers/categories, splits, vocabulary, cache."""

import ast
import gzip
import json
import os
import textwrap
import warnings

import numpy as np
import pytest

from jaxillusions.tasks.code_completion import corpus, lexer, splits, stored
from jaxillusions.tasks.code_completion.lexer import CATEGORIES

C = {name: i for i, name in enumerate(CATEGORIES)}


# ----------------------------------------------------------------------------- reader


def _rec(**kw):
    base = {"repo": "r", "path": "a.py", "func_name": "f", "language": "python",
            "code": "def f():\n    return 1\n"}
    base.update(kw)
    return json.dumps(base)


def test_reader_plain_gz_and_malformed(tmp_path):
    plain = tmp_path / "a.jsonl"
    no_code = json.loads(_rec())
    del no_code["code"]
    no_code["original_string"] = "def g(): pass"
    plain.write_text("\n".join([_rec(), "{not json", json.dumps(no_code), ""]) + "\n")
    gz = tmp_path / "b.jsonl.gz"
    missing = json.loads(_rec())
    del missing["repo"]
    with gzip.open(gz, "wt") as f:
        f.write("\n".join([_rec(path="b.py"), json.dumps(missing), _rec(func_name=3),
                           json.dumps([1, 2])]) + "\n")
    with pytest.warns(UserWarning) as caught:
        records, stats = corpus.read_jsonl([str(plain), str(gz)])
    assert len(caught) == 1, [str(w.message) for w in caught]  # ONE summary warning
    msg = str(caught[0].message)
    assert "4 malformed records in 2 jsonl files" in msg and "\n" not in msg
    assert "bad JSON 1" in msg and "missing field repo 1" in msg
    assert stats == {"files": 2, "records": 3, "malformed": 4}
    assert [r.code for r in records][1] == "def g(): pass"  # original_string fallback
    assert [r.path for r in records] == ["a.py", "a.py", "b.py"]


def test_reader_truncated_gz_is_counted_not_raised(tmp_path):
    gz = tmp_path / "t.jsonl.gz"
    with gzip.open(gz, "wt") as f:
        f.write("\n".join(_rec(func_name=f"f{i}") for i in range(200)) + "\n")
    data = gz.read_bytes()
    gz.write_bytes(data[: len(data) // 2])
    with pytest.warns(UserWarning, match="unreadable file tail"):
        records, stats = corpus.read_jsonl([str(gz)])
    assert stats["malformed"] == 1 and 0 <= len(records) < 200


def test_jsonl_source_through_make_splits(tmp_path):
    lines = []
    for i in range(40):
        d = 1 + i % 3
        pad = "    # pad\n" * (i % 7)
        code = f"def f{i}(x):\n    return " + "g(" * d + "x" + ")" * d + "\n" + pad
        lines.append(_rec(code=code, path=f"m{i}.py", func_name=f"f{i}"))
        lines.append(_rec(code="function h() { return 1 }", language="javascript",
                          path=f"j{i}.js"))
    (tmp_path / "d.jsonl").write_text("\n".join(lines) + "\n")
    data = splits.make_splits({"source": str(tmp_path / "*.jsonl"), "other_source": "",
                               "context": 80, "longer_context": 200, "min_chars": 4,
                               "iid_fraction": 0.5, "depth_quantile": 0.5}, verbose=False)
    assert data.report["corpus"]["python"]["other_languages"] == 40
    assert data.report["corpus"]["python"]["functions"] == 40
    assert set(data.splits) == set(splits.SPLITS) - {"other_language"}
    assert data.splits["train"].lengths.max() <= 78


# ----------------------------------------------------------------------------- corpus builder

PY_FILE = '''\
import os

def top(a, b=(1, 2)):
    """Doc with a } brace."""
    def inner(c):
        return c
    return inner(a) + b[0]

class K:
    x = 1

    @staticmethod
    def meth(self, é):
        return {"k": [é]}

    class Inner:
        async def deep(self):
            await thing()

if os.name:
    def cond():
        pass
'''

JS_FILE = r'''#!/usr/bin/env node
'use strict'
const re = /[}{]+/g
function decl (a, b) {
  const s = "}" + '{' + `${a + `}`}` // }
  return a / b
}
/* function notReal () { } */
const expr = async function named () { return 1 }
const arrow = async (x) => {
  const inner = function () { return x }
  return inner()
}
class A extends B {
  static async *gen (y) { yield y }
  get value () { return this.v }
}
const obj = { method (z) { return z }, k: 1 }
if (decl(1, 2)) { noop() }
const short = x => x + 1
'''


def test_python_functions_top_level_and_methods():
    recs = corpus.python_functions(PY_FILE, "m.py", "repo")
    assert [r.func_name for r in recs] == ["top", "meth", "deep", "cond"]
    top, meth, deep, _ = recs
    assert top.code.startswith("def top(a, b=(1, 2)):") and "def inner(c):" in top.code
    assert top.code.endswith("return inner(a) + b[0]")
    assert meth.code == 'def meth(self, é):\n    return {"k": [é]}'  # dedented, non-ASCII
    assert deep.code == "async def deep(self):\n    await thing()"
    assert all(r.repo == "repo" and r.path == "m.py" and r.language == "python" for r in recs)


def test_python_segment_matches_ast_get_source_segment():
    src = "x = 1\nclass A:\n    def f(self, s='ünï'):  # ç\n        return s\\\n            + 'ê'\n"
    node = ast.parse(src).body[1].body[0]
    want = textwrap.dedent(ast.get_source_segment(src, node, padded=True))
    assert corpus.python_functions(src, "p.py")[0].code == want


def test_js_functions():
    recs = corpus.js_functions(JS_FILE, "a.js", "npm")
    names = [r.func_name for r in recs]
    assert names == ["decl", "named", "arrow", "gen", "value", "method"], names
    by = {r.func_name: r.code for r in recs}
    assert by["decl"].startswith("function decl (a, b) {")
    assert by["decl"].endswith("return a / b\n}")
    assert by["named"] == "async function named () { return 1 }"
    assert by["arrow"].startswith("async (x) => {") and by["arrow"].endswith("return inner()\n}")
    assert by["gen"] == "static async *gen (y) { yield y }"  # dedented class method
    assert by["value"] == "get value () { return this.v }"
    assert by["method"] == "method (z) { return z }"


def test_js_lexer_tokens():
    code = "a = b / c / d; r = /x\\/[/]y/gi; t = `p${ {q: `r`}.q }s`; n = 0x1F + .5e3 + 10n"
    toks = [(k, code[s:e]) for k, s, e in lexer.js_tokens(code) if k != "ws"]
    assert ("regex", "/x\\/[/]y/gi") in toks
    assert ("template", "`p${ {q: `r`}.q }s`") in toks
    assert [t for k, t in toks if k == "punct"].count("/") == 2  # divisions, not regexes
    assert [t for k, t in toks if k == "number"] == ["0x1F", ".5e3", "10n"]
    with pytest.raises(lexer.LexError):
        lexer.js_tokens("s = 'unterminated\n'")
    with pytest.raises(lexer.LexError):
        corpus.js_functions("function f() { (", "x.js")


def test_read_files_counts_and_skips(tmp_path):
    (tmp_path / "ok.py").write_text(PY_FILE)
    (tmp_path / "bad.py").write_text("def broken(:\n    pass\n")
    (tmp_path / "latin.py").write_bytes(b"def f():\n    return '\xe9'\n")  # not UTF-8
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "t.py").write_text("def in_tests(): pass\n")
    (tmp_path / "test_x.py").write_text("def test_x(): pass\n")
    (tmp_path / "a.js").write_text(JS_FILE)
    (tmp_path / "b.min.js").write_text("function m(){}")
    (tmp_path / "c.spec.js").write_text("function s(){}")
    recs, stats = corpus.read_files(str(tmp_path), "python", True, "R")
    assert stats == {"files": 3, "unreadable": 1, "unparsable": 1, "functions": 4}
    recs_all, stats_all = corpus.read_files(str(tmp_path), "python", False, "R")
    assert stats_all["files"] == 5 and {"in_tests", "test_x"} < {r.func_name for r in recs_all}
    js, js_stats = corpus.read_files(str(tmp_path), "javascript", True, "R")
    assert js_stats == {"files": 1, "unreadable": 0, "unparsable": 0, "functions": 6}
    assert {r.path for r in js} == {"a.js"}


# ----------------------------------------------------------------------------- categories


def _cats(code, language):
    cat, depth = lexer.labels(code, language)
    assert cat.shape == depth.shape == (len(code),) and cat.min() >= 0
    return cat, depth


def _at(code, needle, nth=0):
    i = -1
    for _ in range(nth + 1):
        i = code.index(needle, i + 1)
    return i


def test_python_categories():
    code = ('def f(x, y=0x1F):\n    """doc (x)"""\n    if x: return g(x[y], {1: "a]"})  # c)\n'
            "    match = f'{x}'\n")
    cat, depth = _cats(code, "python")
    assert (cat[0:3] == C["keyword"]).all() and cat[3] == C["whitespace"]
    assert cat[_at(code, "f(")] == C["identifier_first"]
    assert cat[_at(code, "x", 0)] == C["identifier_first"]
    assert cat[_at(code, "x[")] == C["identifier_repeat"]
    assert cat[_at(code, "y]")] == C["identifier_repeat"]
    i = _at(code, "0x1F")
    assert (cat[i:i + 4] == C["digit"]).all()
    i = _at(code, '"""doc')
    assert (cat[i:i + 13] == C["string_or_comment"]).all()  # quotes and the ( ) inside
    i = _at(code, "# c)")
    assert (cat[i:i + 4] == C["string_or_comment"]).all() and depth[i + 3] == 0
    assert cat[_at(code, "return")] == C["keyword"] and cat[_at(code, "if")] == C["keyword"]
    assert cat[_at(code, "match")] == C["identifier_first"]  # soft keyword: a name
    i = _at(code, "f'{x}'")
    assert (cat[i:i + 6] == C["string_or_comment"]).all()  # f-string incl. its {x}
    # Brackets: g( depth 1, x[ depth 2, ] closes depth 2, { depth 2, } depth 2, ) depth 1.
    i = _at(code, "g(") + 1
    assert cat[i] == C["open_bracket"] and depth[i] == 1
    i = _at(code, "[y]")
    assert cat[i] == C["open_bracket"] and depth[i] == 2
    assert cat[i + 2] == C["close_bracket"] and depth[i + 2] == 2
    assert depth[i + 1] == 2  # the identifier inside the brackets
    i = _at(code, '"a]"})')
    assert (cat[i:i + 4] == C["string_or_comment"]).all()  # the ] inside the string
    assert cat[i + 4] == C["close_bracket"] and depth[i + 4] == 2
    assert cat[i + 5] == C["close_bracket"] and depth[i + 5] == 1
    assert cat[_at(code, ":")] == C["operator"] and cat[_at(code, "=")] == C["operator"]
    assert cat[_at(code, "\n")] == C["whitespace"] and cat[_at(code, "    ")] == C["whitespace"]
    assert depth[_at(code, "\n")] == 0


def test_python_continuation_and_lex_error():
    cat, _ = _cats("x = 1 + \\\n    2", "python")
    assert cat[8] == C["operator"] and cat[9] == C["whitespace"]
    with pytest.raises(lexer.LexError):
        lexer.labels("x = (1,\n", "python")
    with pytest.raises(ValueError, match="no lexer"):
        lexer.labels("x", "cobol")


def test_js_categories():
    code = ("function f (a) {\n  // c}\n  const s = 'x}' + `${a}` + /[)]/.source\n"
            "  return a[0x10] + f(a, 1.5)\n}")
    cat, depth = _cats(code, "javascript")
    assert (cat[0:8] == C["keyword"]).all()
    assert cat[_at(code, "f (")] == C["identifier_first"]
    assert cat[_at(code, "a)")] == C["identifier_first"]
    assert cat[_at(code, "a[")] == C["identifier_repeat"]
    assert cat[_at(code, "f(a")] == C["identifier_repeat"]
    assert cat[_at(code, "const")] == C["keyword"] and cat[_at(code, "return")] == C["keyword"]
    assert cat[_at(code, "source")] == C["identifier_first"]  # property names are names
    for lit in ("// c}", "'x}'", "`${a}`", "/[)]/"):
        i = _at(code, lit)
        assert (cat[i:i + len(lit)] == C["string_or_comment"]).all(), lit
    i = _at(code, "0x10")
    assert (cat[i:i + 4] == C["digit"]).all()
    i = _at(code, "1.5")
    assert (cat[i:i + 3] == C["digit"]).all()
    i = _at(code, "{")
    assert cat[i] == C["open_bracket"] and depth[i] == 1
    i = _at(code, "[0x")
    assert cat[i] == C["open_bracket"] and depth[i] == 2
    assert cat[i + 5] == C["close_bracket"] and depth[i + 5] == 2
    i = _at(code, "1.5)") + 3
    assert cat[i] == C["close_bracket"] and depth[i] == 2
    assert cat[len(code) - 1] == C["close_bracket"] and depth[len(code) - 1] == 1
    assert depth[_at(code, "// c}") + 4] == 1  # the } in the comment does not close
    assert cat[_at(code, "+")] == C["operator"] and cat[_at(code, "=")] == C["operator"]
    assert cat[_at(code, "\n  ")] == C["whitespace"]



def test_js_private_name_is_one_identifier_distinct_from_the_plain_name():
    """ECMAScript PrivateIdentifier: `#n` is one name token (its `#` included), and `#n` and `n`
    are different names (a private field vs a binding), so `return n` is a first occurrence."""
    code = "m() { this.#n = 1; return n; }"
    cat, _ = _cats(code, "javascript")
    i = _at(code, "#n")
    assert (cat[i:i + 2] == C["identifier_first"]).all()  # was: `#` operator
    assert cat[_at(code, "n;")] == C["identifier_first"]  # was: identifier_repeat
    code = "m() { this.#n = n; return this.#n / #class; }"
    cat, _ = _cats(code, "javascript")
    i = _at(code, "#n", 1)
    assert (cat[i:i + 2] == C["identifier_repeat"]).all()
    assert cat[_at(code, "n;")] == C["identifier_first"]
    assert (cat[_at(code, "#class"):-3] == C["identifier_first"]).all()  # never a keyword
    assert cat[_at(code, "/")] == C["operator"]  # a division after a name, not a regex
    names = [code[s:e] for k, s, e in lexer.js_tokens(code) if k == "name"]
    assert names == ["m", "this", "#n", "n", "return", "this", "#n", "#class"]


def test_js_private_methods_are_functions():
    recs = corpus.js_functions("class A {\n  #m (x) { return x }\n  n () { return this.#m(1) }\n}",
                               "p.js")
    assert [(r.func_name, r.code) for r in recs] == [("#m", "#m (x) { return x }"),
                                                      ("n", "n () { return this.#m(1) }")]


# ----------------------------------------------------------------------------- splits


def _write_corpus(root, n_files=30, seed=0, js=True):
    """Python files whose functions vary in length and bracket depth; a JS dir beside."""
    rng = np.random.default_rng(seed)
    py = root / "py"
    py.mkdir()
    for i in range(n_files):
        funcs = []
        for j in range(5):
            d = int(rng.choice([1, 1, 1, 2, 2, 3, 4]))
            pad = "".join(f"    v{k} = {k} + a\n" for k in range(int(rng.integers(0, 12))))
            call = "g(" * d + "a" + ")" * d
            funcs.append(f"def f{i}_{j}(a):\n    s = 'ü'\n{pad}    return {call}\n")
        (py / f"m{i}.py").write_text("\n".join(funcs))
    if js:
        jsd = root / "js"
        jsd.mkdir()
        for i in range(4):
            (jsd / f"s{i}.js").write_text(
                "".join(f"function h{i}{j} (a) {{ return g(a) + 'λ' }}\n" for j in range(5)))
    return py, root / "js"


def _cfg(py, js, **kw):
    cfg = {"source": str(py), "other_source": str(js), "context": 128, "longer_context": 256,
           "min_chars": 8, "num_eval": -1, "iid_fraction": 0.3, "length_quantile": 0.6,
           "depth_quantile": 0.7, "seed": 0}
    cfg.update(kw)
    return cfg


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    root = tmp_path_factory.mktemp("code_corpus")
    py, js = _write_corpus(root)
    cfg = _cfg(py, js, cache_dir=str(root / "cache"))
    return cfg, stored.load_or_make(cfg, verbose=False)


def test_split_contents_and_thresholds(small):
    cfg, (data, vocab, report) = small
    assert tuple(data) == splits.SPLITS
    L, D = report["thresholds"]["length"], report["thresholds"]["depth"]
    assert 0 < L <= cfg["context"] - 2 and D >= 1
    tr = data["train"]
    assert (tr.lengths <= L).all() and (tr.max_depth <= D).all()
    assert (data["iid"].lengths <= L).all() and (data["iid"].max_depth <= D).all()
    assert (data["longer"].lengths > L).all() and (data["longer"].max_depth <= D).all()
    assert (data["deeper"].max_depth > D).all() and (data["deeper"].lengths <= L).all()
    assert data["longer"].tokens.shape[1] == cfg["longer_context"]
    assert data["other_language"].language == "javascript" and tr.language == "python"
    # The thresholds are the train quantiles.
    assert L == int(np.quantile(tr.lengths, 1.0)) or L >= tr.lengths.max()
    for name, s in data.items():
        n, width = s.tokens.shape
        rows = np.arange(n)
        assert (s.tokens[:, 0] == splits.BOS).all()
        assert (s.tokens[rows, s.lengths + 1] == splits.EOS).all()
        chars = s.tokens[:, 1:] >= splits.UNK
        assert (chars.sum(1) == s.lengths).all(), name
        predicted = s.category >= 0
        # A category exactly where a character is the target (never for EOS or PAD).
        assert (predicted[:, :-1] == chars).all() and not predicted[:, -1].any()
        assert (s.bracket_depth[~predicted] == 0).all()
        closes = s.category == C["close_bracket"]
        assert (s.bracket_depth[closes] >= 1).all()
        assert (s.bracket_depth.max(1) == s.max_depth).all()
        assert report["sizes"][name]["functions"] == n
        counts = report["categories"][name]
        assert sum(counts[c] for c in CATEGORIES) == s.lengths.sum()
        assert sum(counts["close_bracket_by_depth"].values()) == counts["close_bracket"]


def test_train_and_eval_splits_are_file_disjoint(small):
    _, (data, _, report) = small
    train_files = set(data["train"].file_id.tolist())
    for name in ("iid", "longer", "deeper"):
        assert not train_files & set(data[name].file_id.tolist()), name
    files = report["files"]
    assert all(files[i].startswith("py/") for i in train_files)
    assert all(files[i].startswith("js/") for i in data["other_language"].file_id)


def test_jsonl_of_the_same_functions_gives_the_same_splits(small, tmp_path):
    cfg, (data, vocab, _) = small
    recs, _ = corpus.read_files(cfg["source"], "python", True, "py")
    with gzip.open(tmp_path / "same.jsonl.gz", "wt") as f:
        f.writelines(json.dumps(r._asdict()) + "\n" for r in recs)
    same = splits.make_splits({**cfg, "source": str(tmp_path / "same.jsonl.gz")}, verbose=False)
    assert same.vocab == vocab
    for name in splits.SPLITS:
        np.testing.assert_array_equal(same.splits[name].tokens, data[name].tokens)
        np.testing.assert_array_equal(same.splits[name].category, data[name].category)


def test_ood_from_train_files_grows_longer_and_deeper(small):
    cfg, (data, _, report) = small
    more = splits.make_splits({**cfg, "ood_from_train_files": True}, verbose=False)
    assert more.report["thresholds"] == report["thresholds"]
    train_rows = {r.tobytes() for r in data["train"].tokens}
    for name in ("longer", "deeper"):
        assert len(more.splits[name].lengths) >= len(data[name].lengths)
        assert not any(r.tobytes() in train_rows for r in more.splits[name].tokens[:, :128])
    np.testing.assert_array_equal(more.splits["iid"].tokens, data["iid"].tokens)
    grown = sum(len(more.splits[n].lengths) - len(data[n].lengths) for n in ("longer", "deeper"))
    assert grown > 0


def test_unk_and_rates(small):
    _, (data, vocab, report) = small
    assert "λ" not in vocab.chars and "ü" in vocab.chars
    assert report["unk_rates"]["train"] == 0.0
    s = data["other_language"]
    n_unk = int((s.tokens == splits.UNK).sum())
    text = "function h00 (a) { return g(a) + 'λ' }"  # every JS function, up to its digits
    per_row = sum(c not in vocab.chars for c in text)
    assert per_row >= 2 and n_unk == per_row * len(s.lengths)
    assert report["unk_rates"]["other_language"] == pytest.approx(n_unk / s.lengths.sum())
    assert vocab.decode(vocab.encode("a λ")) == "a \ufffd"
    assert vocab.size == splits.NUM_SPECIAL + len(vocab.chars)
    assert list(vocab.chars) == sorted(vocab.chars)


def test_min_char_count_maps_rare_train_chars_to_unk(small):
    cfg, (data, vocab, _) = small
    cfg = {**cfg, "min_char_count": 10_000, "cache_dir": ""}
    rare = splits.make_splits(cfg, verbose=False)
    assert rare.report["unk_rates"]["train"] > 0
    assert set(rare.vocab.chars) < set(vocab.chars)
    # Same functions, same categories: only the ids of the rare characters changed.
    np.testing.assert_array_equal(rare.splits["train"].category, data["train"].category)


def test_max_vocab_keeps_the_most_frequent(small):
    cfg, (data, vocab, _) = small
    capped = splits.make_splits({**cfg, "max_vocab": 10, "cache_dir": ""}, verbose=False)
    assert capped.vocab.size == 10 and set(capped.vocab.chars) < set(vocab.chars)
    train = data["train"]
    chars = train.tokens[train.tokens >= splits.NUM_SPECIAL]
    counts = np.bincount(chars, minlength=vocab.size)[splits.NUM_SPECIAL:]
    kept = sorted(vocab.chars.index(c) for c in capped.vocab.chars)
    assert counts[kept].min() >= np.delete(counts, kept).max()
    assert capped.unk_rates["train"] == pytest.approx(1 - counts[kept].sum() / counts.sum())
    assert splits.width(cfg) == cfg["context"]
    assert splits.width(cfg, "longer") == cfg["longer_context"]


def test_deterministic_and_cached(small):
    cfg, (data, vocab, report) = small
    again = splits.make_splits(cfg, verbose=False)
    assert again.vocab == vocab
    cached = stored.load_or_make(cfg, verbose=False)  # from the cache file
    assert os.path.exists(stored.cache_path(cfg))
    for other in (again, cached):
        for name in splits.SPLITS:
            for f in ("tokens", "category", "bracket_depth", "file_id", "lengths", "max_depth"):
                np.testing.assert_array_equal(getattr(other.splits[name], f),
                                              getattr(data[name], f))
    other_seed = splits.make_splits({**cfg, "seed": 1}, verbose=False)
    assert set(other_seed.splits["iid"].file_id.tolist()) != set(data["iid"].file_id.tolist())


def test_cache_key_follows_files_and_bad_cache_regenerates(tmp_path):
    py, js = _write_corpus(tmp_path, n_files=12)
    cfg = _cfg(py, js, cache_dir=str(tmp_path / "cache"))
    first = stored.load_or_make(cfg, verbose=False)
    path = stored.cache_path(cfg)
    assert os.path.exists(path)
    with open(path, "wb") as f:
        f.write(b"not an npz")
    with pytest.warns(UserWarning, match="unreadable cache"):
        again = stored.load_or_make(cfg, verbose=False)
    np.testing.assert_array_equal(again.splits["train"].tokens, first.splits["train"].tokens)
    with open(py / "m0.py", "a") as f:
        f.write("\ndef extra(a):\n    return a\n")
    assert stored.cache_path(cfg) != path  # an edited source file is a different corpus
    assert stored.cache_path({**cfg, "cache_dir": "elsewhere"}).endswith(
        os.path.basename(stored.cache_path(cfg)))  # where it is cached is not in the key


def test_a_dangling_or_looping_link_among_the_sources_is_counted_unreadable(tmp_path):
    # Was: "error: No such file or directory: .../dangling.py" (or Errno 40 for a loop) from the
    # cache key's look at every file, while the reader counts such a file and goes on.
    py, js = _write_corpus(tmp_path, n_files=12)
    cfg = _cfg(py, js, cache_dir=str(tmp_path / "cache"))
    clean = stored.load_or_make(cfg, verbose=False)
    os.symlink(tmp_path / "nowhere.py", py / "dangling.py")
    os.symlink(py / "loop_b.py", py / "loop_a.py")
    os.symlink(py / "loop_a.py", py / "loop_b.py")
    made = stored.load_or_make(cfg, verbose=False)
    np.testing.assert_array_equal(made.splits["train"].tokens, clean.splits["train"].tokens)


def test_source_paths_are_stored_absolute_and_the_names_as_they_are(tmp_path, monkeypatch):
    """A relative data.source read from another directory named other files: the door stores
    it (other_source and cache_dir too) joined to the launch's directory."""
    from jaxillusions.configs import code_small
    from jaxillusions.pipeline import validate

    py, js = _write_corpus(tmp_path, n_files=12)
    monkeypatch.chdir(tmp_path)
    config = code_small.get_config()
    config.data.update(source="py", other_source="./js", cache_dir="cache")
    data = validate.check(config)[0].data
    assert (data.source, data.other_source, data.cache_dir) == (
        str(tmp_path / "py"), os.path.join(tmp_path, "./js"), str(tmp_path / "cache"))
    config.data.update(source="stdlib", other_source="npm", cache_dir="")
    data = validate.check(config)[0].data
    assert (data.source, data.other_source, data.cache_dir) == ("stdlib", "npm", "")


def test_configs_that_split_one_corpus_read_and_label_it_once(tmp_path, monkeypatch):
    """The labelled functions of each source are cached apart from the splits: a config that
    only splits them differently loads them (the lexer does not run) and makes the splits that
    reading and labelling anew make; an edited source file is labelled again, the other
    language's functions are still loaded."""
    py, js = _write_corpus(tmp_path, n_files=12)
    cfg = _cfg(py, js, cache_dir=str(tmp_path / "cache"))
    stored.load_or_make(cfg, verbose=False)
    assert len(list((tmp_path / "cache").glob("code-functions-*.npz"))) == 2  # python, js
    labelled, label = [], splits._label
    monkeypatch.setattr(splits, "_label", lambda records, language, *a, **k: (
        labelled.append(language), label(records, language, *a, **k))[1])
    other = {**cfg, "seed": 1, "num_eval": 20}
    cached = stored.load_or_make(other, verbose=False)
    assert labelled == []
    fresh = splits.make_splits(other, verbose=False)  # no cache: reads and labels both
    assert labelled == ["python", "javascript"]
    assert cached.vocab == fresh.vocab
    assert cached.report["corpus"] == fresh.report["corpus"]
    for name in splits.SPLITS:
        for f in ("tokens", "category", "bracket_depth", "file_id", "lengths", "max_depth"):
            np.testing.assert_array_equal(getattr(cached.splits[name], f),
                                          getattr(fresh.splits[name], f))
    with open(py / "m0.py", "a") as f:
        f.write("\ndef extra(a):\n    return a\n")
    labelled.clear()
    stored.load_or_make(other, verbose=False)
    assert labelled == ["python"]


def test_default_config_checks_without_reading():
    notes = splits.check_data_config({})
    assert "standard library" in notes[0] and "other_language" in notes[1]
    assert set(splits.DATA_DOCS) == set(splits.DATA_DEFAULTS)


def test_caps_sample_without_replacement(small):
    cfg, (data, _, _) = small
    capped = splits.make_splits({**cfg, "num_train": 20, "num_eval": 3}, verbose=False)
    assert len(capped.splits["train"].lengths) == 20
    assert all(len(capped.splits[n].lengths) == min(3, len(data[n].lengths))
               for n in splits.SPLITS[1:])
    rows = {r.tobytes() for r in data["train"].tokens}
    assert all(r.tobytes() in rows for r in capped.splits["train"].tokens)


# ----------------------------------------------------------------------------- bad input


def test_the_check_for_source_files_stops_at_the_first_but_agrees_with_the_listing(tmp_path):
    # The config check asks whether a directory holds a file of the language; the listing that
    # reads them lists them all. A tree whose only files the listing skips has none.
    for rel in ["tests/test_a.py", ".hidden/b.py", "__pycache__/c.py", "site-packages/d.py",
                "lib/test_e.py", "js/f.min.js", "js/g.spec.js", "notes.txt"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("def f():\n    return 1\n")
    for language in ("python", "javascript"):
        for skip_tests in (True, False):
            listed = corpus.source_files(str(tmp_path), language, skip_tests)
            assert corpus.has_source_files(str(tmp_path), language, skip_tests) == bool(listed)
    assert corpus.source_files(str(tmp_path), "python", False) == [
        os.path.join("lib", "test_e.py"), os.path.join("tests", "test_a.py")]
    assert corpus.source_files(str(tmp_path), "javascript", False) == [
        os.path.join("js", "g.spec.js")]
    assert not corpus.has_source_files(str(tmp_path), "python", True)
    assert not corpus.has_source_files(str(tmp_path), "javascript", True)
    (tmp_path / "lib" / "h.py").write_text("def h():\n    return 2\n")
    assert corpus.has_source_files(str(tmp_path), "python", True)
    assert corpus.source_files(str(tmp_path), "python", True) == [os.path.join("lib", "h.py")]


def test_missing_or_empty_sources_are_one_line_errors(tmp_path):
    with pytest.raises(ValueError, match="no such file or directory") as e:
        splits.check_data_config({"source": str(tmp_path / "nope")})
    assert "\n" not in str(e.value)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no python files"):
        splits.check_data_config({"source": str(tmp_path / "empty")})
    with pytest.raises(ValueError, match="no such file"):
        splits.check_data_config({"other_source": str(tmp_path / "nojs")})
    with pytest.raises(ValueError, match="no .jsonl"):
        splits.check_data_config({"source": str(tmp_path / "*.jsonl")})
    # Files but no functions: caught after reading, still one line.
    (tmp_path / "nofunc").mkdir()
    (tmp_path / "nofunc" / "a.py").write_text("x = 1\n")
    with pytest.raises(ValueError, match="gave 0 usable python functions") as e:
        splits.make_splits({"source": str(tmp_path / "nofunc"), "other_source": ""},
                           verbose=False)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("key,value,match", [
    ("context", 4, "data.context must be an integer >= 18"),
    ("longer_context", 512, "data.longer_context must be an integer >= 513"),
    ("num_train", 0, "data.num_train must be a positive integer or -1"),
    ("iid_fraction", 1.0, r"data.iid_fraction must be a number in \(0, 1\)"),
    ("language", "rust", "data.language must be one of python, javascript"),
    ("other_language", "python", "data.other_language must be different"),
    ("skip_tests", 1, "data.skip_tests must be True or False"),
    ("max_vocab", 2**16 + 1, "data.max_vocab must be an integer from 5 to 65536"),
    ("nonsense", 1, "unknown code data key data.nonsense"),
])
def test_bad_values(key, value, match):
    with pytest.raises(ValueError, match=match) as e:
        splits.check_data_config({key: value})
    assert "\n" not in str(e.value)


def test_other_language_skipped_with_one_warning(tmp_path, monkeypatch):
    py, _ = _write_corpus(tmp_path, n_files=12, js=False)
    monkeypatch.setattr(splits, "find_npm", lambda: None)
    cfg = _cfg(py, "npm", cache_dir=str(tmp_path / "cache"))
    notes = splits.check_data_config(cfg)
    assert any("other_language split skipped" in n for n in notes)
    with pytest.warns(UserWarning, match="other_language split is skipped") as caught:
        data = stored.load_or_make(cfg, verbose=False)
    assert len(caught) == 1
    assert "other_language" not in data.splits and "train" in data.splits
    assert "other_language_skipped" in data.report
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # '' disables the split silently
        stored.load_or_make({**cfg, "other_source": ""}, verbose=False)


def test_impossible_split_is_one_line_error(tmp_path):
    py, js = _write_corpus(tmp_path, n_files=12)
    with pytest.raises(ValueError, match="code split 'deeper': 0 functions") as e:
        splits.make_splits(_cfg(py, js, depth_quantile=1.0), verbose=False)
    assert "\n" not in str(e.value)
