"""The package's shape: no import cycle, imports run one way between layers, and the library
reads typed settings, never an ml-collections config: configs are read at two doors only. Every
import counts, also one inside a function (a lazy import hides a cycle; it does not remove
it)."""

import ast
import pathlib

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "jaxillusions"

# Lower layers never import higher ones (launch -> sweep -> train / proxies / analysis / ... ->
# model / data / tasks). A module not named here sits in the middle layer.
LAYERS = {
    "top": ("jaxillusions.sweep", "jaxillusions.validate", "jaxillusions.export"),
    "bottom": ("jaxillusions.fields", "jaxillusions.model", "jaxillusions.data",
               "jaxillusions.tasks", "jaxillusions.metrics", "jaxillusions.distributed",
               "jaxillusions.interrupt", "jaxillusions.timing"),
}


def _module(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, pathlib.Path]:
    return {_module(p): p for p in PACKAGE.rglob("*.py")}


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, child.end_lineno + 1))
    return lines


def _imports(name: str, path: pathlib.Path, modules) -> set[str]:
    """The package modules that `name` imports (a `from a import b` of module a.b counts as
    a.b; of a name in a, as a), outside `if TYPE_CHECKING:` blocks."""
    tree = ast.parse(path.read_text())
    skip = _type_checking_lines(tree)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in modules}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([node.module] if node.module else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                out.add(full if full in modules else base)
    return {m for m in out if m in modules and m != name}


def _edges() -> set[tuple[str, str]]:
    modules = _modules()
    return {(name, target) for name, path in modules.items()
            for target in _imports(name, path, modules)}


def _layer(module: str) -> int:
    for rank, layer in ((2, "top"), (0, "bottom")):
        if any(module == m or module.startswith(m + ".") for m in LAYERS[layer]):
            return rank
    return 1


def test_the_graph_sees_imports_inside_functions():
    # The check can fail: a lazy import inside a function is an edge of the graph.
    edges = _edges()
    assert ("jaxillusions.sweep", "jaxillusions.experiments.wen") in edges
    assert ("jaxillusions.tasks.code", "jaxillusions.tasks.code.splits") in edges  # lazy


def _cycles(edges: set[tuple[str, str]]) -> list[list[str]]:
    """The groups of modules that import each other in a circle (strongly connected
    components of more than one module, or a module importing itself)."""
    names = sorted({m for edge in edges for m in edge})
    index = {m: i for i, m in enumerate(names)}
    rows, cols = zip(*((index[a], index[b]) for a, b in edges), strict=True)
    graph = csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(len(names),) * 2)
    _, label = connected_components(graph, directed=True, connection="strong")
    groups = [[m for m in names if label[index[m]] == c] for c in set(label)]
    return [g for g in groups if len(g) > 1 or (g[0], g[0]) in edges]


def test_the_cycle_check_finds_a_planted_cycle():
    planted = {("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")}
    assert _cycles(planted) == [["a", "b", "c"]]


def test_no_import_cycle_in_the_package():
    cycles = _cycles(_edges())
    assert not cycles, f"modules importing each other in a circle: {cycles}"


def test_imports_run_one_way_between_layers():
    upward = sorted((a, b) for a, b in _edges() if _layer(a) < _layer(b))
    assert not upward, f"a lower layer imports a higher one: {upward}"


# The doors: the only functions of the package that read a config (settings.from_config). A
# config becomes Settings in validate.check (the launchers, and a notebook, once per run) and a
# stored run's config.json in settings.read_stored; every other function takes Settings or a
# section of them. No module of the package names ml_collections or its ConfigDict at all: the
# doors read any mapping (a ConfigDict through its to_dict).
DOORS = {("jaxillusions.validate", "check"), ("jaxillusions.settings", "read_stored")}
CONFIG_NAMES = {"from_config", "ConfigDict", "FrozenConfigDict", "ml_collections"}


def _config_uses(name: str, source: str) -> list[str]:
    """'module:line function: what' for every use of from_config (a call, a reference, an
    import), ConfigDict or ml_collections in `source`, outside the DOORS' from_config calls."""
    found = []

    def visit(node: ast.AST, function: str) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            function = node.name
        used = (node.id if isinstance(node, ast.Name) else node.attr
                if isinstance(node, ast.Attribute) else None)
        if isinstance(node, ast.Import | ast.ImportFrom):
            modules = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
            used = next((n for a in node.names for n in CONFIG_NAMES if a.name == n), None) or (
                "ml_collections" if any(m.split(".")[0] == "ml_collections" for m in modules)
                else None)
        if used in CONFIG_NAMES and not (used == "from_config" and (name, function) in DOORS):
            found.append(f"{name}:{node.lineno} {function or '<module>'}: {used}")
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(ast.parse(source), "")
    return found


def test_the_config_check_finds_planted_uses():
    # The check can fail: each way a config could flow below the doors is found, and a door
    # is allowed only its own function.
    planted = ("import ml_collections\nfrom ml_collections import config_dict\n"
               "from jaxillusions.settings import from_config\n"
               "def f(c):\n    return settings.from_config(c)\n"
               "def g(c):\n    read = settings.from_config\n    return isinstance(c, ConfigDict)\n"
               "def check(c):\n    return settings.from_config(c)\n")
    assert _config_uses("jaxillusions.train", planted) == [
        "jaxillusions.train:1 <module>: ml_collections",
        "jaxillusions.train:2 <module>: ml_collections",
        "jaxillusions.train:3 <module>: from_config",
        "jaxillusions.train:5 f: from_config",
        "jaxillusions.train:7 g: from_config",
        "jaxillusions.train:8 g: ConfigDict",
        "jaxillusions.train:10 check: from_config"]
    assert _config_uses("jaxillusions.validate", planted)[-1].endswith("g: ConfigDict")


def test_settings_are_read_only_at_the_doors():
    # Configs become Settings once, at a door (DOORS); the library below takes Settings only.
    found = [use for name, path in sorted(_modules().items())
             for use in _config_uses(name, path.read_text())]
    assert not found, f"{len(found)} uses of a config below the doors {sorted(DOORS)}: {found}"
