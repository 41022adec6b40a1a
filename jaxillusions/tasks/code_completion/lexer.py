"""Per-character prediction categories of source code, from a real lexer.

`labels(code, language)` returns two arrays over the characters of one function:
- category int8: an index into CATEGORIES;
- bracket depth int32: the number of brackets enclosing the character; an opening or closing
  bracket carries the depth of the pair it belongs to (>= 1); brackets inside strings and comments
  do not count.

Python is lexed with the standard library's `tokenize`; JavaScript with the small scanner below
(`js_tokens`), which also serves `corpus.js_functions` to cut functions out of files.

Choices (the same for both languages):
- Every character of a token gets the token's category: all characters of a repeated identifier
  are `identifier_repeat`, its first character included.
- `keyword`: Python's hard keywords (`keyword.kwlist`, incl. True/False/None); soft keywords
  (`match`, `case`, `_`, `type`) are identifiers, since tokenize cannot tell their role and they are
  mostly used as names. JavaScript: JS_KEYWORDS (reserved words, literals, and let, static, async,
  await, yield; `of`, `get`, `set`, `from`, `as`, `undefined` are identifiers).
- `identifier_first` / `identifier_repeat`: the first occurrence of a name in the function vs a
  later one (attribute and property names included: the function is the context the model sees).
- A JavaScript private name `#x` (ECMAScript's PrivateIdentifier: a class's private field or
  method) is one identifier token, its `#` included, and a different name from `x`: `#x` and `x`
  are separate bindings in the language (`this.#x` and `this.x` are two properties, and a plain
  `x` is a variable), so in `this.#n = 1; return n;` the `n` of `return n` is `identifier_first`.
  A later `#n` repeats `#n`. Private names are never keywords (`#class` is a valid name).
- `string_or_comment`: every character of a string literal (prefix and quotes included), of a
  comment (its `#`, `//`, `/* */` included), of a JavaScript regex literal (slashes and flags
  included), and of a whole f-string / template literal, its `{...}` / `${...}` parts included.
- `digit`: every character of a numeric literal (`0x1F`, `1.5e-3`, `10n`, `1_000`).
- `whitespace`: spaces, tabs, newlines, indentation; `operator`: all other punctuation and
  operators, and the rare character no token covers (a Python line-continuation backslash).
"""

from __future__ import annotations

import io
import keyword
import re
import tokenize

import numpy as np

CATEGORIES = ("whitespace", "keyword", "identifier_first", "identifier_repeat", "open_bracket",
              "close_bracket", "operator", "digit", "string_or_comment")
(WHITESPACE, KEYWORD, IDENT_FIRST, IDENT_REPEAT, OPEN, CLOSE, OPERATOR, DIGIT,
 STRING) = range(len(CATEGORIES))
LANGUAGES = ("python", "javascript")
# The characters names are made of (ASCII letters, digits, underscore; JavaScript's `$` and `#`
# left out): the pool of the induction test on identifier characters (copying.py).
IDENTIFIER_CHARS = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz"

PY_KEYWORDS = frozenset(keyword.kwlist)
JS_KEYWORDS = frozenset("""
    break case catch class const continue debugger default delete do else enum export extends
    false finally for function if import in instanceof new null return super switch this throw
    true try typeof var void while with yield let static async await""".split())


class LexError(ValueError):
    """The text is not lexically valid for the language (unterminated string, bad indent...)."""


def labels(code: str, language: str) -> tuple[np.ndarray, np.ndarray]:
    """(category int8 [len(code)], bracket depth int32 [len(code)]) of one function."""
    if language == "python":
        return python_labels(code)
    if language == "javascript":
        return js_labels(code)
    raise ValueError(f"no lexer for language {language!r}; available: {', '.join(LANGUAGES)}")


def _depths(cat: np.ndarray) -> np.ndarray:
    """Bracket depth per character from the open/close marks (a close keeps its pair's depth)."""
    opens = np.cumsum(cat == OPEN, dtype=np.int32)
    closes = cat == CLOSE
    depth = opens - np.cumsum(closes, dtype=np.int32) + closes
    return np.maximum(depth, 0)


def _finish(cat: np.ndarray, code: str) -> tuple[np.ndarray, np.ndarray]:
    # Characters no token covered (marked -1): whitespace, else punctuation (a `\` continuation).
    gaps = np.flatnonzero(cat < 0)
    for i in gaps:
        cat[i] = WHITESPACE if code[i].isspace() else OPERATOR
    return cat, _depths(cat)


def _bracket_or_operator(cat: np.ndarray, start: int, text: str) -> None:
    for j, ch in enumerate(text):
        cat[start + j] = OPEN if ch in "([{" else CLOSE if ch in ")]}" else OPERATOR


# ----------------------------------------------------------------------------- Python

_FSTRING_START = {getattr(tokenize, n) for n in ("FSTRING_START", "TSTRING_START")
                  if hasattr(tokenize, n)}  # Python >= 3.12 splits f-strings into tokens
_FSTRING_END = {getattr(tokenize, n) for n in ("FSTRING_END", "TSTRING_END")
                if hasattr(tokenize, n)}


def python_labels(code: str) -> tuple[np.ndarray, np.ndarray]:
    """Categories and bracket depths of Python source (see the module docstring)."""
    # tokenize reads lines split at "\n" only (io.StringIO does no newline translation).
    starts = [0] + [m.end() for m in re.finditer("\n", code)]
    cat = np.full(len(code), -1, np.int8)
    seen: set[str] = set()
    fdepth, fstart = 0, 0
    try:
        for tok in tokenize.generate_tokens(io.StringIO(code).readline):
            if tok.start == tok.end and tok.type not in _FSTRING_START | _FSTRING_END:
                continue  # DEDENT, ENDMARKER, the empty NEWLINE at the end of the text
            s = starts[tok.start[0] - 1] + tok.start[1]
            e = starts[tok.end[0] - 1] + tok.end[1]
            if tok.type in _FSTRING_START:
                fstart = s if fdepth == 0 else fstart
                fdepth += 1
            elif tok.type in _FSTRING_END:
                fdepth -= 1
                if fdepth == 0:
                    cat[fstart:e] = STRING
            elif fdepth:
                continue
            elif tok.type in (tokenize.STRING, tokenize.COMMENT):
                cat[s:e] = STRING
            elif tok.type == tokenize.NUMBER:
                cat[s:e] = DIGIT
            elif tok.type == tokenize.NAME:
                if tok.string in PY_KEYWORDS:
                    cat[s:e] = KEYWORD
                else:
                    cat[s:e] = IDENT_REPEAT if tok.string in seen else IDENT_FIRST
                    seen.add(tok.string)
            elif tok.type == tokenize.OP:
                _bracket_or_operator(cat, s, tok.string)
            elif tok.type in (tokenize.NEWLINE, tokenize.NL, tokenize.INDENT):
                cat[s:e] = WHITESPACE
            else:  # ERRORTOKEN (a stray `$`, `?`, or a space tokenize could not place)
                for j in range(s, e):
                    cat[j] = WHITESPACE if code[j].isspace() else OPERATOR
    except (tokenize.TokenError, SyntaxError) as err:  # IndentationError is a SyntaxError
        raise LexError(f"python: {err}") from None
    return _finish(cat, code)


# ----------------------------------------------------------------------------- JavaScript

_WS = re.compile(r"[\s\ufeff]+")
_LINE_COMMENT = re.compile(r"//[^\n\r\u2028\u2029]*")
_BLOCK_COMMENT = re.compile(r"/\*[\s\S]*?\*/")
_STRING = re.compile(r"'(?:[^'\\\n\r]|\\(?:\r\n|[\s\S]))*'"
                     r'|"(?:[^"\\\n\r]|\\(?:\r\n|[\s\S]))*"')
_NUMBER = re.compile(r"(?:0[xX][0-9a-fA-F_]+|0[oO][0-7_]+|0[bB][01_]+"
                     r"|(?:\d[\d_]*(?:\.[\d_]*)?|\.\d[\d_]*)(?:[eE][+-]?\d[\d_]*)?)n?")
_NAME = re.compile(r"(?:[^\W\d]|\$)[\w$\u200c\u200d]*")
_PRIVATE_NAME = re.compile(r"#(?:[^\W\d]|\$)[\w$\u200c\u200d]*")  # `#x`: one token
_REGEX = re.compile(r"/(?![*/])(?:[^\\/\[\n\r]|\\.|\[(?:[^\\\]\n\r]|\\.)*\])+/[A-Za-z]*")
_PUNCT = re.compile(r">>>=|\.\.\.|===|!==|\*\*=|<<=|>>=|>>>|&&=|\|\|=|\?\?=|=>|==|!=|<=|>="
                    r"|&&|\|\||\?\?|\?\.(?!\d)|\+\+|--|\+=|-=|\*=|/=|%=|&=|\|=|\^=|\*\*|<<|>>"
                    r"|[\s\S]")
# After these a `/` starts a regex literal (an expression is expected), after anything else it
# divides: names, literals, `)`, `]`, `}` and postfix `++`/`--` end an expression.
_REGEX_AFTER_NAME = frozenset("return typeof case do else in instanceof new delete void throw "
                              "yield await of".split())
_NO_REGEX_AFTER_PUNCT = frozenset((")", "]", "}", "++", "--"))


def _regex_allowed(prev: tuple[str, str] | None) -> bool:
    if prev is None:
        return True
    kind, text = prev
    if kind == "punct":
        return text not in _NO_REGEX_AFTER_PUNCT
    if kind == "name":
        return text in _REGEX_AFTER_NAME
    return False  # number, string, template, regex


def _template_end(code: str, i: int) -> int:
    """Index just past the template literal starting with the backtick at i."""
    j = i + 1
    while j < len(code):
        c = code[j]
        if c == "\\":
            j += 2
        elif c == "`":
            return j + 1
        elif c == "$" and code.startswith("${", j):
            _, j = _scan(code, j + 2, in_template=True)
        else:
            j += 1
    raise LexError(f"javascript: unterminated template literal at offset {i}")


def _scan(code: str, i: int, in_template: bool) -> tuple[list[tuple[str, int, int]], int]:
    """Tokens from offset i; in_template: stop after the `}` that closes a `${`."""
    toks: list[tuple[str, int, int]] = []
    prev: tuple[str, str] | None = None
    braces = 0
    n = len(code)
    if i == 0 and code.startswith("#!"):  # shebang line
        m = re.compile(r"#![^\n\r]*").match(code)
        toks.append(("comment", 0, m.end()))
        i = m.end()
    while i < n:
        c = code[i]
        if m := _WS.match(code, i):
            toks.append(("ws", i, m.end()))
            i = m.end()
            continue
        if c == "/" and code.startswith("//", i):
            m = _LINE_COMMENT.match(code, i)
            kind = "comment"
        elif c == "/" and code.startswith("/*", i):
            m = _BLOCK_COMMENT.match(code, i)
            if m is None:
                raise LexError(f"javascript: unterminated comment at offset {i}")
            kind = "comment"
        elif c in "'\"":
            m = _STRING.match(code, i)
            if m is None:
                raise LexError(f"javascript: unterminated string at offset {i}")
            kind = "string"
        elif c == "`":
            end = _template_end(code, i)
            toks.append(("template", i, end))
            prev, i = ("template", ""), end
            continue
        elif c == "/" and _regex_allowed(prev) and (m := _REGEX.match(code, i)):
            kind = "regex"
        elif m := _NUMBER.match(code, i):
            kind = "number"
        elif (m := _NAME.match(code, i)) or (c == "#" and (m := _PRIVATE_NAME.match(code, i))):
            kind = "name"
        else:
            m = _PUNCT.match(code, i)
            kind = "punct"
            if in_template and m.group() == "{":
                braces += 1
            elif in_template and m.group() == "}":
                if braces == 0:
                    return toks, m.end()
                braces -= 1
        toks.append((kind, i, m.end()))
        prev = (kind, m.group())
        i = m.end()
    if in_template:
        raise LexError("javascript: unterminated template substitution ${...}")
    return toks, n


def js_tokens(code: str) -> list[tuple[str, int, int]]:
    """(kind, start, end) tokens covering `code`; kind in ws, comment, string, template, regex,
    number, name, punct. A template literal is one token (its `${...}` parts included)."""
    return _scan(code, 0, in_template=False)[0]


def js_labels(code: str) -> tuple[np.ndarray, np.ndarray]:
    """Categories and bracket depths of JavaScript source (see the module docstring)."""
    cat = np.full(len(code), -1, np.int8)
    seen: set[str] = set()
    for kind, s, e in js_tokens(code):
        if kind == "ws":
            cat[s:e] = WHITESPACE
        elif kind in ("comment", "string", "template", "regex"):
            cat[s:e] = STRING
        elif kind == "number":
            cat[s:e] = DIGIT
        elif kind == "name":
            name = code[s:e]
            if name in JS_KEYWORDS:
                cat[s:e] = KEYWORD
            else:
                cat[s:e] = IDENT_REPEAT if name in seen else IDENT_FIRST
                seen.add(name)
        else:
            _bracket_or_operator(cat, s, code[s:e])
    return _finish(cat, code)
