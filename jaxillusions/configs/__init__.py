"""The shipped experiment configs: ml-collections files, named on the command line as
`--config=dyck_small`.

Each has a get_config(); a config file of your own can start from one (`from
jaxillusions.configs import dyck_small`). Each starts from `defaults(task)` or from another
config's `get_config()` and sets only the keys whose values differ (tests/test_config_files.py
fails on a key set to the value it already has).

`locate` turns a --config value (a shipped name or a file's path, either with an optional
`:argument` for a config whose get_config takes one) into the file to load, or a one-line
ValueError; it reads the files only, so a bad value is refused before JAX starts. `load` runs
that file and returns its get_config()."""

from __future__ import annotations

import ast
import os
import runpy

from ml_collections import ConfigDict

FOLDER = os.path.dirname(os.path.abspath(__file__))


def defaults(task: str) -> ConfigDict:
    """Every settings key of `task` at its default (validate.defaults), in its section."""
    from jaxillusions.pipeline import validate  # noqa: PLC0415 - JAX only once a config loads

    return ConfigDict(validate.defaults(task))


def names() -> list[str]:
    """The shipped configs' names, sorted: the .py files of this folder."""
    return sorted(f[:-3] for f in os.listdir(FOLDER)
                  if f.endswith(".py") and not f.startswith("_"))


def _defines_get_config(path: str) -> bool | str:
    """Whether the file binds `get_config` at its top level (a def, an assignment or an
    import): "no argument" for a def without positional parameters; a one-line ValueError for
    a file that is not Python."""
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
    except (SyntaxError, ValueError) as err:  # (UnicodeDecodeError is a ValueError)
        where = f" (line {err.lineno})" if getattr(err, "lineno", None) else ""
        raise ValueError(f"config file {path} does not parse as Python: "
                         f"{getattr(err, 'msg', None) or err}{where}") from None
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and \
                node.name == "get_config":
            return "no argument" if not (node.args.args or node.args.posonlyargs
                                         or node.args.vararg) else True
        if isinstance(node, ast.Import | ast.ImportFrom) and any(
                (a.asname or a.name) == "get_config" for a in node.names):
            return True
        targets = (node.targets if isinstance(node, ast.Assign) else
                   [node.target] if isinstance(node, ast.AnnAssign) else [])
        if any(isinstance(t, ast.Name) and t.id == "get_config" for t in targets):
            return True
    return False


def locate(value: str) -> str:
    """The file (and `:argument`) that --config=`value` loads: a shipped config's name
    (`dyck_small`, `wen_attention_variation:minimal`) or the path of a Python file with a
    get_config() (`my_study.py`, `path/to/my_study.py:arg`). A one-line ValueError for an
    unknown name, a path that is no file, a file without get_config, or an argument to a
    get_config that takes none."""
    spec, colon, arg = value.partition(":")
    spec = os.path.expanduser(spec)  # '--config=~/my.py': no shell expands a '~' after '='
    shipped = ", ".join(names())
    if not spec:
        raise ValueError(f"--config={value}: give a shipped config's name ({shipped}) or the "
                         "path of a .py file with a get_config()")
    is_path = os.sep in spec or "/" in spec or spec.endswith(".py") or os.path.isfile(spec)
    if not is_path:
        if spec not in names():
            raise ValueError(f"no shipped config named {spec!r}; the shipped configs: "
                             f"{shipped} (or give the path of your own .py file)")
        spec = os.path.join(FOLDER, f"{spec}.py")
    elif not os.path.isfile(spec):
        stem = os.path.splitext(os.path.basename(spec))[0]
        hint = (f"; the shipped one is named without a path: --config={stem}{colon}{arg}"
                if stem in names() else f"; the shipped configs: {shipped}")
        raise ValueError(f"config file {spec} not found{hint}")
    defined = _defines_get_config(spec)
    if not defined:
        raise ValueError(f"config file {spec} defines no get_config() (it should return a "
                         "ConfigDict, e.g. starting from `from jaxillusions.configs import "
                         "dyck_small` and dyck_small.get_config())")
    if colon and defined == "no argument":
        raise ValueError(f"--config={value}: {value.partition(':')[0]} takes no argument (its "
                         f"get_config() has no parameter); drop ':{arg}'")
    return spec + colon + arg


def load(located: str):
    """The config that the file `located` (what `locate` returned: `file` or `file:argument`)
    makes: its get_config(), given the argument when there is one. The file runs as a script
    (runpy): ml-collections' own loader calls importlib's load_module(), which Python 3.15
    removed."""
    file, colon, arg = located.partition(":")
    get_config = runpy.run_path(file)["get_config"]
    return get_config(arg) if colon else get_config()
