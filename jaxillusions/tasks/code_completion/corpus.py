"""Function-level code corpora: CodeSearchNet jsonl files, or functions cut out of source files.

Every source gives the same record type, `Record(code, language, repo, path, func_name)`:
- `read_jsonl(paths)`: the CodeSearchNet format (plain or .gz). Malformed records (bad JSON,
  missing fields, wrong types, an unreadable file tail) are counted, skipped and summarised in
  one warning per call.
- `python_functions(source, path)`: the functions of one Python file that are not nested in another
  function (module-level functions and methods of classes at any depth), cut out with `ast` like
  `ast.get_source_segment(padded=True)` and dedented.
- `js_functions(source, path)`: the same for JavaScript: `function` declarations and expressions,
  class and object-literal methods, and arrow functions with a block body, delimited by bracket
  matching over `lexer.js_tokens` (which skips strings, template literals, regexes and comments).
- `source_files(root, language, skip_tests)` (`has_source_files`: whether there is one) and
  `read_files(...)`: a directory tree of such files;
  `stdlib_root()` is the running interpreter's standard library (site-packages excluded).
"""

from __future__ import annotations

import ast
import gzip
import io
import json
import os
import re
import sysconfig
import textwrap
import tokenize
import warnings
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import NamedTuple

from jaxillusions.tasks.code_completion import lexer

EXTENSIONS = {"python": (".py",), "javascript": (".js", ".mjs", ".cjs")}
JSONL_SUFFIXES = (".jsonl", ".jsonl.gz")
# Directories never read; with skip_tests also test suites and test files (see source_files).
_SKIP_DIRS = frozenset(("site-packages", "dist-packages", "__pycache__", ".git"))
_TEST_DIRS = frozenset(("test", "tests", "idle_test", "__tests__", "testing"))
_TEST_FILE = re.compile(r"^(test_.*\.py|.*[._](test|spec)\.[mc]?js)$")


class Record(NamedTuple):
    code: str
    language: str
    repo: str
    path: str
    func_name: str


# ----------------------------------------------------------------------------- CodeSearchNet


def _open_text(path: str):
    if path.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")  # noqa: SIM115 - closed by the caller's `with`


def _parse_record(line: str) -> Record | str:
    """A Record, or the reason the line is malformed."""
    try:
        obj = json.loads(line)
    except ValueError:
        return "bad JSON"
    if not isinstance(obj, dict):
        return "not an object"
    code = obj.get("code", obj.get("original_string"))
    if code is None:
        return "missing field code/original_string"
    fields = {"language": obj.get("language"), "repo": obj.get("repo"),
              "path": obj.get("path"), "func_name": obj.get("func_name")}
    missing = [k for k, v in fields.items() if v is None]
    if missing:
        return f"missing field {missing[0]}"
    if not all(isinstance(v, str) for v in (code, *fields.values())):
        return "field of wrong type"
    return Record(code=code.replace("\r\n", "\n").replace("\r", "\n"), **fields)


def read_jsonl(paths: Iterable[str]) -> tuple[list[Record], dict[str, int]]:
    """Records of CodeSearchNet .jsonl / .jsonl.gz files, and counts by problem. Malformed lines
    are skipped and summarised in ONE warning (per call) naming the first few."""
    records: list[Record] = []
    problems: Counter[str] = Counter()
    examples: list[str] = []
    files = 0
    for path in paths:
        files += 1
        lineno = 0
        try:
            with _open_text(path) as f:
                for lineno, line in enumerate(f, 1):  # noqa: B007 - lineno used after the loop
                    if not line.strip():
                        continue
                    rec = _parse_record(line)
                    if isinstance(rec, str):
                        problems[rec] += 1
                        if len(examples) < 3:
                            examples.append(f"{os.path.basename(path)}:{lineno} {rec}")
                    else:
                        records.append(rec)
        except (OSError, EOFError, UnicodeDecodeError) as e:  # truncated gzip, bad bytes
            problems["unreadable file tail"] += 1
            examples.append(f"{os.path.basename(path)} after line {lineno}: "
                            f"{type(e).__name__}")
    n_bad = sum(problems.values())
    if n_bad:
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(problems.items()))
        warnings.warn(f"code data: skipped {n_bad} malformed records in {files} jsonl files "
                      f"({kinds}); e.g. {'; '.join(examples)}", stacklevel=2)
    return records, {"files": files, "records": len(records), "malformed": n_bad}


# ----------------------------------------------------------------------------- Python files


def _lines(source: str) -> list[str]:
    # Lines as the parser counts them (\n, \r\n, \r; not form feeds), ends kept.
    return re.split(r"(?<=\n)|(?<=\r)(?!\n)", source)


def _segment(lines: list[str], node: ast.AST) -> str:
    """ast.get_source_segment(source, node, padded=True), without re-splitting the source for
    every node (that made the stdlib take minutes instead of seconds)."""
    first, last = node.lineno - 1, node.end_lineno - 1
    head = lines[first].encode()
    if first == last:
        text = head[node.col_offset:node.end_col_offset].decode()
    else:
        tail = lines[last].encode()[:node.end_col_offset].decode()
        text = head[node.col_offset:].decode() + "".join(lines[first + 1:last]) + tail
    pad = re.sub(r"[^\s]", " ", head[:node.col_offset].decode())
    return pad + text


def python_functions(source: str, path: str, repo: str = "") -> list[Record]:
    """The functions of one Python file not nested in another function (dedented). Raises
    SyntaxError (or ValueError for NUL bytes) when the file does not parse."""
    tree = ast.parse(source)
    lines = _lines(source)
    out: list[Record] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                code = textwrap.dedent(_segment(lines, child))
                out.append(Record(code, "python", repo, path, child.name))
            elif not isinstance(child, ast.expr):  # classes, if/try blocks at module level
                visit(child)

    visit(tree)
    return out


# ----------------------------------------------------------------------------- JavaScript files

_CONTROL = frozenset("if for while switch catch with function return typeof new do else".split())
_METHOD_PREFIX = frozenset("static async get set".split())


def _dedent_at(source: str, start: int, end: int) -> str:
    """source[start:end] dedented: as Python's padded segment when it starts its line; when it
    starts mid-line (`x = function () {`), its first line as is and the others dedented."""
    line_start = source.rfind("\n", 0, start) + 1
    prefix = source[line_start:start]
    if not prefix.strip():
        return textwrap.dedent(prefix + source[start:end])
    first, nl, rest = source[start:end].partition("\n")
    return first + nl + textwrap.dedent(rest)


def js_functions(source: str, path: str, repo: str = "") -> list[Record]:
    """The functions of one JavaScript file not nested in another function (dedented). Raises
    lexer.LexError when the file does not lex or its brackets do not balance."""
    toks = [t for t in lexer.js_tokens(source) if t[0] not in ("ws", "comment")]
    text = [source[s:e] if k in ("name", "punct") else "" for k, s, e in toks]
    match: dict[int, int] = {}  # open token -> close token, and close -> open
    stack: list[int] = []
    for i, t in enumerate(text):
        if t in ("(", "[", "{"):
            stack.append(i)
        elif t in (")", "]", "}"):
            if not stack or text[stack[-1]] + t not in ("()", "[]", "{}"):
                raise lexer.LexError(f"javascript: unbalanced {t!r} at offset {toks[i][1]}")
            o = stack.pop()
            match[o], match[i] = i, o
    if stack:
        raise lexer.LexError(f"javascript: unclosed {text[stack[-1]]!r}")

    def at(i: int) -> str:
        return text[i] if 0 <= i < len(text) else ""

    def name_before(i: int) -> str:  # `foo = function`, `foo: function`, `foo = () =>`
        if i >= 2 and at(i - 1) in ("=", ":") and toks[i - 2][0] == "name":
            return at(i - 2)
        return "<anonymous>"

    found: list[tuple[int, int, str]] = []  # (start token, close-brace token, name)
    for i, t in enumerate(text):
        if t == "function" and toks[i][0] == "name":
            j = i + 1 + (at(i + 1) == "*")
            name = at(j) if toks[j][0] == "name" and at(j + 1) == "(" else ""
            j += bool(name)
            if at(j) == "(" and at(match[j] + 1) == "{":
                start = i - (at(i - 1) == "async")
                found.append((start, match[match[j] + 1], name or name_before(start)))
        elif t == "=>" and at(i + 1) == "{":
            start = match[i - 1] if at(i - 1) == ")" else i - 1
            if start >= 0 and (at(start) == "(" or toks[start][0] == "name"):
                start -= at(start - 1) == "async"
                found.append((start, match[i + 1], name_before(start)))
        elif (toks[i][0] == "name" and t not in _CONTROL and at(i + 1) == "("
              and i + 1 in match and at(match[i + 1] + 1) == "{"):
            start = i - (at(i - 1) == "*")
            while at(start - 1) in _METHOD_PREFIX:
                start -= 1
            if at(start - 1) in ("{", "}", ";", ",", ""):
                found.append((start, match[match[i + 1] + 1], t))
    out: list[Record] = []
    last_end = -1
    for start, close, name in sorted(found, key=lambda f: (f[0], -f[1])):
        if start > last_end:  # outermost functions only
            s, e = toks[start][1], toks[close][2]
            out.append(Record(_dedent_at(source, s, e), "javascript", repo, path, name))
            last_end = close
    return out


# ----------------------------------------------------------------------------- directories


def stdlib_root() -> str:
    return sysconfig.get_paths()["stdlib"]


def source_files(root: str, language: str, skip_tests: bool) -> list[str]:
    """Sorted relative paths of the language's files under root (symlinks not followed; hidden,
    __pycache__, site-packages, minified files skipped; with skip_tests, test dirs and files)."""
    return sorted(os.path.relpath(f, root) for f in _walk_sources(root, language, skip_tests))


def has_source_files(root: str, language: str, skip_tests: bool) -> bool:
    """Whether source_files would list any: the walk stops at the first file."""
    return next(_walk_sources(root, language, skip_tests), None) is not None


def _walk_sources(root: str, language: str, skip_tests: bool) -> Iterator[str]:
    """source_files' files, as paths joined to root, in the order os.walk finds them."""
    exts = EXTENSIONS[language]
    for d, dirs, files in os.walk(root):
        dirs[:] = [x for x in dirs if not (x.startswith(".") or x in _SKIP_DIRS
                                           or (skip_tests and x in _TEST_DIRS))]
        for f in files:
            if f.endswith(exts) and not f.endswith(".min.js") \
                    and not (skip_tests and _TEST_FILE.match(f)):
                yield os.path.join(d, f)


def read_files(root: str, language: str, skip_tests: bool, repo: str
               ) -> tuple[list[Record], dict[str, int]]:
    """The functions of every source file under root; counts files that fail to decode (UTF-8,
    or a PEP 263 declaration for Python), parse or lex."""
    extract = python_functions if language == "python" else js_functions
    records: list[Record] = []
    bad = Counter()
    paths = source_files(root, language, skip_tests)
    for rel in paths:
        full = os.path.join(root, rel)
        try:
            with open(full, "rb") as f:
                raw = f.read()
            if language == "python":
                enc, _ = tokenize.detect_encoding(io.BytesIO(raw).readline)
                text = raw.decode(enc)
            else:
                text = raw.decode("utf-8-sig")
            text = text.replace("\r\n", "\n").replace("\r", "\n")
        except (OSError, SyntaxError, UnicodeDecodeError, LookupError):
            bad["unreadable"] += 1
            continue
        try:
            records += extract(text, rel.replace(os.sep, "/"), repo)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            bad["unparsable"] += 1  # lexer.LexError is a ValueError
    return records, {"files": len(paths), "unreadable": bad["unreadable"],
                     "unparsable": bad["unparsable"], "functions": len(records)}
