"""Config files state only what differs: each shipped config (jaxillusions/configs/)
starts from the task's defaults (configs.defaults) or from another config, and a statement
`config.<section>.<key> = <literal>` whose value is the one the key already has there (its
default, the base config's, or an earlier line's) fails, naming the file, line and key. The files
are parsed (ast) and only their base configs are built: no JAX compilation."""

import ast
import importlib
import inspect
import pathlib

import pytest

from jaxillusions import configs
from jaxillusions.pipeline import validate

FILES = sorted(p for p in pathlib.Path(configs.__file__).parent.glob("*.py")
               if p.name != "__init__.py")
UNKNOWN = object()  # a key last set to something literal_eval cannot read


def _flat(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


def _key(node: ast.expr, aliases: dict[str, str]) -> str | None:
    """'train.num_steps' for `config.train.num_steps` (and `pc.x` after `pc = config.proxies`)."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or (node.id != "config" and node.id not in aliases):
        return None
    head = [] if node.id == "config" else [aliases[node.id]]
    return ".".join(head + parts[::-1]) or None


def _same(a, b) -> bool:
    """The same value and kind: True is not 1; a tuple equals a list of the same items."""
    if isinstance(a, list | tuple) or isinstance(b, list | tuple):
        return (isinstance(a, list | tuple) and isinstance(b, list | tuple) and len(a) == len(b)
                and all(map(_same, a, b)))
    return isinstance(a, bool) == isinstance(b, bool) and a == b


def restated(source: str, namespace: dict, name: str) -> list[str]:
    """'file:line: key = value' for each literal assignment in get_config() that sets a key to
    the value it already has. `namespace`: the module's globals (its base config's module)."""
    function = next(node for node in ast.parse(source).body
                    if isinstance(node, ast.FunctionDef) and node.name == "get_config")
    signature = inspect.signature(namespace["get_config"])
    params = {p.name: p.default for p in signature.parameters.values()}
    assigns = sorted((n for n in ast.walk(function) if isinstance(n, ast.Assign)),
                     key=lambda n: n.lineno)
    first = next(n for n in assigns if [ast.unparse(t) for t in n.targets] == ["config"])
    base = eval(compile(ast.Expression(first.value), name, "eval"), namespace, dict(params))
    # Only data.* defaults depend on the task, and a base built from scratch sets no data key.
    task_defaults = _flat(validate.defaults(base.get("task", "dyck")))
    known = {**task_defaults, **_flat(base.to_dict())}  # a key the base lacks: its default
    aliases: dict[str, str] = {}
    found = []
    for node in assigns[assigns.index(first) + 1:]:
        if len(node.targets) != 1:
            continue
        target = node.targets[0]
        if isinstance(target, ast.Name):  # pc = config.proxies
            section = _key(node.value, aliases)
            if section is not None:
                aliases[target.id] = section
            continue
        key = _key(target, aliases)
        if key is None:
            continue
        inside = [k for k in known if k.startswith(key + ".")]
        if inside:  # a whole section replaced: an empty ConfigDict() leaves its keys' defaults
            empty = ast.unparse(node.value) == "ConfigDict()"
            known.update({k: task_defaults.get(k, UNKNOWN) if empty else UNKNOWN
                          for k in inside})
            continue
        try:
            value = ast.literal_eval(node.value)
        except ValueError:
            known[key] = UNKNOWN
            continue
        if known.get(key, UNKNOWN) is not UNKNOWN and _same(value, known[key]):
            found.append(f"{name}:{node.lineno}: {key} = {value!r}")
        known[key] = value
    return found


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_config_files_state_only_what_differs_from_their_base(path):
    module = importlib.import_module(f"jaxillusions.configs.{path.stem}")
    found = restated(path.read_text(), vars(module), f"jaxillusions/configs/{path.name}")
    assert not found, (f"{len(found)} keys restated (drop the line, or set a value that "
                       "differs): " + "; ".join(found))


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_config_files_start_from_the_defaults_or_another_config(path):
    tree = ast.parse(path.read_text())
    calls = {ast.unparse(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    assert "ConfigDict" not in calls, (f"jaxillusions/configs/{path.name} builds a ConfigDict "
                                       "from scratch")
    assert "defaults" in calls or any(c.endswith(".get_config") for c in calls), path.name


SOURCE = '''
from jaxillusions.configs import dyck_small


def get_config():
    config = dyck_small.get_config()
    pc = config.proxies
    config.train.num_seeds = 12  # dyck_small's own
    config.train.num_steps = 10
    config.train.num_steps = 10  # the line above's
    config.train.learning_rate = 3e-3  # the default, which dyck_small leaves as is
    config.train.grad_clip = 1  # the default 1.0
    config.model.attn_only = 0  # not the default False: an integer
    pc.kmeans_iters = 25  # the default, through the alias
    pc.methods = ("svd", "kmeans", "onehot_attention", "uniform_attention")  # the default
    pc.eval_splits = ["iid"]
    pc.targets = tuple(pc.targets)  # not a literal: unknown from here on
    pc.targets = ("blocks.-1.attn.q", "blocks.-1.attn.k")
    config.wen = ConfigDict()
    config.wen.enabled = False  # the default again after the empty section
    return config
'''


def test_restated_names_every_key_that_keeps_its_value():
    namespace: dict = {}
    exec(compile(SOURCE, "example.py", "exec"), namespace)  # the base: the dyck_small config
    found = restated(SOURCE, namespace, "example.py")
    assert [f.split(" =")[0] for f in found] == [
        "example.py:8: train.num_seeds", "example.py:10: train.num_steps",
        "example.py:11: train.learning_rate", "example.py:12: train.grad_clip",
        "example.py:14: proxies.kmeans_iters", "example.py:15: proxies.methods",
        "example.py:20: wen.enabled"]
