"""How a setting is declared: its kind (the Python type it must have), its default, its rule and
what is allowed, for the one-line error (config/settings.py holds the run's sections; a task's
Data and a study's section declare theirs with it too).

    num_seeds: int = setting(4, INT, ">= 1", positive, "seeds trained together")

A rule is `test(value, settings) -> bool`; it may read the rest of the settings (e.g. data.min_len
against data.max_len). A leaf module: the tasks declare their data.* settings with it too.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
from collections.abc import Callable
from typing import Any

import numpy as np


def _is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)


def _is_seq(v: Any) -> bool:
    return isinstance(v, tuple | list)


# Value kinds: (name, test of the Python type).
INT = ("an integer", _is_int)
NUMBER = ("a finite number", _is_number)
BOOL = ("true or false", lambda v: isinstance(v, bool))
STR = ("a string", lambda v: isinstance(v, str))
INTS = ("a tuple of integers", lambda v: _is_seq(v) and all(map(_is_int, v)))
NUMBERS = ("a tuple of finite numbers", lambda v: _is_seq(v) and all(map(_is_number, v)))
STRS = ("a tuple of strings", lambda v: _is_seq(v) and all(isinstance(x, str) for x in v))
PATH = ("a path", STR[1])  # stored absolute (absolute, below)
PATHS = ("a tuple of paths", STRS[1])
KINDS = (BOOL, INT, NUMBER, STR, INTS, NUMBERS, STRS)
TUPLES = (INTS, NUMBERS, STRS, PATHS)  # whose values are each given once (`given_once`)


def kind_of(value: Any) -> tuple[str, Callable]:
    """The kind a default value has (the first that accepts it: bool before int)."""
    return next(kind for kind in KINDS if kind[1](value))


def positive(v, s) -> bool:
    return v >= 1


def nonnegative(v, s) -> bool:
    return v >= 0


def anything(v, s) -> bool:
    return True


def distinct(values) -> bool:
    """No value twice, also once rounded to float32 (what a member's hyper-parameter becomes:
    train.members; a value past float32's range is refused before, by `within_float32`)."""
    return len({float(np.float32(v)) for v in values}) == len(set(values)) == len(values)


FLOAT32_MAX = float(np.finfo(np.float32).max)


def within_float32(key: str, value: Any, kind: tuple[str, Callable]) -> None:
    """ValueError (one line) for a number past float32's range: a learning rate, a weight or a
    ridge becomes float32 in the run, where it would be inf (e.g. train.learning_rate=1e300)."""
    if kind not in (NUMBER, NUMBERS):
        return
    past = [v for v in (value if kind == NUMBERS else (value,)) if abs(v) > FLOAT32_MAX]
    if past:
        raise ValueError(f"{key}={value!r}: {past[0]!r} is past float32's range "
                         f"(|x| <= {FLOAT32_MAX:.1e}), in which the run computes")


def given_once(key: str, value: Any, kind: tuple[str, Callable]) -> None:
    """ValueError (one line) for a tuple setting that gives a value twice: its rows would come
    twice and collide in the reports (e.g. proxies.circuit_ablation=('mean', 'mean'))."""
    twice = [v for i, v in enumerate(value) if v in value[:i]] if kind in TUPLES else []
    if twice:
        raise ValueError(f"{key}={value!r}: {twice[0]!r} is given twice; give each value once")


def one_of(options) -> tuple[str, Callable]:
    """(allowed, test) for a value that must be one of `options`: setting(d, STR, *one_of(o))."""
    return f"one of {', '.join(options)}", (lambda v, s: v in options)


@dataclasses.dataclass(frozen=True)
class Rule:
    """A setting's declaration, kept in its dataclass field's metadata."""

    kind: tuple[str, Callable]
    allowed: str
    test: Callable[[Any, Any], bool] = anything
    doc: str = ""
    convert: Callable[[Any], Any] | None = None  # applied at the door, once the kind is checked


def setting(default: Any, kind: tuple[str, Callable], allowed: str,
            test: Callable[[Any, Any], bool] = anything, doc: str = "",
            convert: Callable[[Any], Any] | None = None) -> Any:
    """A dataclass field with its rule (see the module docstring); `convert` (a path kind's
    own by default) turns a checked value into the stored one."""
    convert = convert or {PATH: absolute, PATHS: absolutes}.get(kind)
    return dataclasses.field(default=default,
                             metadata={"rule": Rule(kind, allowed, test, doc, convert)})


def absolute(path: str) -> str:
    """A path setting as the door stores it: a leading ~ expanded and, when relative, joined to
    the directory of the launch (not normalized: '..' after a symbolic link is the file
    system's to resolve), so that a run's config.json names the same files from any directory
    (load_run, `jaxillusions figures`); '' stays ''."""
    path = os.path.expanduser(path)
    return os.path.join(os.getcwd(), path) if path and not os.path.isabs(path) else path


def absolutes(paths: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(map(absolute, paths))


def rule(field: dataclasses.Field) -> Rule:
    return field.metadata["rule"]
