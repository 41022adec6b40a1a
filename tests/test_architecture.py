"""The package's shape: no import cycle, imports run one way between layers, and the library
reads typed settings, never an ml-collections config: configs are read at two doors only, and
ml_collections is named only in the top two folders (configs/, launch/). Every import counts,
also one inside a function (a lazy import hides a cycle; it does not remove it)."""

import ast
import pathlib
import re

import numpy as np
import pytest
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components

import jaxillusions

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "jaxillusions"

# The folders are the layers (jaxillusions.LAYERS, lowest first): a module imports only from its
# own layer or lower ones; the shipped configs and the launchers are the top two, and
# jaxillusions/__main__.py (`python -m jaxillusions`, the command) sits above them all.
LAYERS = jaxillusions.LAYERS
# The folders of the command line: the shipped configs (ml-collections files) and the launchers.
# Only they name ml_collections; their modules' names are the command's words (subcommands,
# config names), so they may repeat a library module's name (launch/sweep.py, pipeline/sweep.py).
COMMAND_LINE = ("jaxillusions.configs", "jaxillusions.launch")


def _in_command_line(module: str) -> bool:
    return module in COMMAND_LINE or module.startswith(tuple(f"{m}." for m in COMMAND_LINE))


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
    """The rank of a module's layer: its longest matching prefix in LAYERS (the package's own
    __init__, which holds LAYERS and no code, is at the bottom)."""
    if module == "jaxillusions":
        return 0
    if module == "jaxillusions.__main__":
        return len(LAYERS)
    best, rank = -1, None
    for r, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            full = f"jaxillusions.{prefix}"
            if (module == full or module.startswith(full + ".")) and len(full) > best:
                best, rank = len(full), r
    assert rank is not None, f"{module} is in no folder of jaxillusions.LAYERS"
    return rank


def test_the_graph_sees_imports_inside_functions():
    # The check can fail: a lazy import inside a function is an edge of the graph.
    edges = _edges()
    assert ("jaxillusions.pipeline.job", "jaxillusions.studies.wen") in edges
    assert ("jaxillusions.tasks.code_completion.task",
            "jaxillusions.tasks.code_completion.splits") in edges  # lazy


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


def test_the_layer_check_sees_an_upward_import():
    # The check can fail: a study above the report, the runtime below everything.
    assert _layer("jaxillusions.runtime.stages") < _layer("jaxillusions.studies.wen")
    assert _layer("jaxillusions.config.fields") < _layer("jaxillusions.tasks.dyck")
    assert _layer("jaxillusions.config.settings") > _layer("jaxillusions.tasks.dyck")
    assert _layer("jaxillusions.report.tables") < _layer("jaxillusions.studies.fit_shift")
    assert _layer("jaxillusions.pipeline.validate") < _layer("jaxillusions.configs.dyck_small")
    assert _layer("jaxillusions.configs") < _layer("jaxillusions.launch.sweep")
    assert _layer("jaxillusions.launch.cli") < _layer("jaxillusions.__main__")


def _command_line(path: pathlib.Path) -> bool:
    """Whether `path` is in a COMMAND_LINE folder (configs/, launch/)."""
    return _in_command_line(_module(path))


def test_every_module_is_in_a_layer_folder_and_no_name_twice():
    """The package's top holds folders only, each a layer, and __main__.py (`python -m
    jaxillusions`); no module or folder name of the library is taken twice or by the standard
    library (jaxillusions/logging.py once shadowed `logging`, the code task's package `code`).
    The command line's folders (COMMAND_LINE) are named after the command's words: a launcher
    or a shipped config may share a library module's name (configs/code.py, launch/sweep.py),
    loaded by path or by its package, never with its folder on sys.path; none twice among
    them."""
    import sys

    modules = [m for m in _modules() if m != "jaxillusions"]
    assert all(_layer(m) >= 0 for m in modules)
    library = [p for p in PACKAGE.rglob("*") if not _command_line(p)
               and p.name != "__pycache__" and p.stem not in ("__init__", "__main__")]
    names = [p.stem for p in library if p.suffix == ".py"] + [p.name for p in library
                                                              if p.is_dir()]
    twice = sorted({n for n in names if names.count(n) > 1})
    assert not twice, f"module or folder names taken twice: {twice}"
    assert not set(names) & sys.stdlib_module_names, set(names) & sys.stdlib_module_names
    command = [p.stem for p in PACKAGE.rglob("*.py") if _command_line(p)
               and p.stem != "__init__"]
    assert len(command) == len(set(command)) and {"sweep", "cli", "dyck_small"} <= set(command)
    assert sorted(p.name for p in PACKAGE.glob("*.py")) == ["__init__.py", "__main__.py"]


# The doors: the only functions of the package that read a config (settings.from_config). A
# config becomes Settings in validate.parse (validate.check calls it: the launchers, and a
# notebook, once per run) and a stored run's config.json in settings.read_stored (with the
# study sections from validate.read_stored); every other function takes Settings or a
# section of them. No module of the library names ml_collections or its ConfigDict at all: the
# doors read any mapping (a ConfigDict through its to_dict). Only the command line's folders
# above it (COMMAND_LINE: the shipped configs and the launchers) build and edit ConfigDicts;
# they too turn a config into Settings through validate.check, never from_config.
DOORS = {("jaxillusions.pipeline.validate", "parse"),
         ("jaxillusions.config.settings", "read_stored")}
CONFIG_NAMES = {"from_config", "ConfigDict", "FrozenConfigDict", "ml_collections"}


def _config_uses(name: str, source: str) -> list[str]:
    """'module:line function: what' for every use of from_config (a call, a reference, an
    import), ConfigDict or ml_collections in `source`, outside the DOORS' from_config calls; in
    the COMMAND_LINE folders, of from_config only."""
    found = []
    allowed = CONFIG_NAMES - {"from_config"} if _in_command_line(name) else set()

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
        if used in CONFIG_NAMES - allowed and not (used == "from_config"
                                                   and (name, function) in DOORS):
            found.append(f"{name}:{node.lineno} {function or '<module>'}: {used}")
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(ast.parse(source), "")
    return found


def test_the_config_check_finds_planted_uses():
    # The check can fail: each way a config could flow below the doors is found, and a door
    # is allowed only its own function.
    planted = ("import ml_collections\nfrom ml_collections import config_dict\n"
               "from jaxillusions.config.settings import from_config\n"
               "def f(c):\n    return settings.from_config(c)\n"
               "def g(c):\n    read = settings.from_config\n    return isinstance(c, ConfigDict)\n"
               "def parse(c):\n    return settings.from_config(c)\n")
    assert _config_uses("jaxillusions.training.train", planted) == [
        "jaxillusions.training.train:1 <module>: ml_collections",
        "jaxillusions.training.train:2 <module>: ml_collections",
        "jaxillusions.training.train:3 <module>: from_config",
        "jaxillusions.training.train:5 f: from_config",
        "jaxillusions.training.train:7 g: from_config",
        "jaxillusions.training.train:8 g: ConfigDict",
        "jaxillusions.training.train:10 parse: from_config"]
    assert _config_uses("jaxillusions.pipeline.validate", planted)[-1].endswith("g: ConfigDict")
    # The command line's folders may name ml_collections and ConfigDict, never from_config.
    for module in ("jaxillusions.launch.common", "jaxillusions.configs",
                   "jaxillusions.configs.dyck_small"):
        assert [use.split(": ")[-1] for use in _config_uses(module, planted)] == [
            "from_config"] * 4, module
    assert _config_uses("jaxillusions.configsx", planted)[0].endswith("ml_collections")


def test_only_the_command_line_names_ml_collections():
    # The check sees the folders that do name it (the configs build ConfigDicts; common.py
    # parses --config with ml_collections' flag).
    named = {name for name, path in _modules().items()
             if re.search(r"^\s*(from|import) ml_collections\b", path.read_text(), re.M)}
    assert {"jaxillusions.launch.common", "jaxillusions.configs"} <= named
    assert all(_in_command_line(name) for name in named), named


def test_settings_are_read_only_at_the_doors():
    # Configs become Settings once, at a door (DOORS); the library below takes Settings only.
    found = [use for name, path in sorted(_modules().items())
             for use in _config_uses(name, path.read_text())]
    assert not found, f"{len(found)} uses of a config below the doors {sorted(DOORS)}: {found}"


def test_no_function_of_the_package_takes_more_than_8_parameters():
    """ruff's PLR0913 at max-args = 8 (pyproject.toml), on the package (the launchers with
    it): the run travels as one stages.Context, options as small frozen dataclasses."""
    import importlib.util
    import subprocess
    import sys

    if importlib.util.find_spec("ruff") is None:
        pytest.skip("ruff is not installed (the test extra has it)")
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "--select", "PLR0913",
                          "--output-format", "concise", "jaxillusions"], cwd=ROOT,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout


# One results-row schema (runtime/schema.py): no other module restates one of its groups of
# columns as a tuple or list of names; it derives them from the schema instead.
def _restated_row_columns(source: str) -> list[str]:
    """The module-level names whose value lists, in tuples or lists, every column of the row's
    keys, of its per-position metrics or of its dictionary metrics."""
    from jaxillusions.runtime import schema

    groups = (set(schema.KEYS), set(schema.POSITION_METRICS), set(schema.DICTIONARY_METRICS))
    out = []
    for node in ast.parse(source).body:
        if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
            continue
        names = {c.value for seq in ast.walk(node.value) if isinstance(seq, (ast.Tuple, ast.List))
                 for c in seq.elts if isinstance(c, ast.Constant) and isinstance(c.value, str)}
        if any(group <= names for group in groups):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            out += [ast.unparse(t) for t in targets]
    return out


def test_the_row_check_finds_a_restated_row():
    planted = ('COLUMNS = ("fit_split", "seed", "site", "method", "size", "split", "breakdown",\n'
               '           "bin", "n", "jsd")\nMETRICS = ["jsd", "same_pred", "acc_original", '
               '"acc_proxy"]\nOK = ("seed", "site") + ("jsd",)\n')
    assert _restated_row_columns(planted) == ["COLUMNS", "METRICS"]


def test_the_results_row_is_defined_once():
    restated = {name: found for name, path in _modules().items()
                if name != "jaxillusions.runtime.schema"
                and (found := _restated_row_columns(path.read_text()))}
    assert not restated, f"results-row columns defined outside runtime/schema.py: {restated}"


# One TensorBoard writer (runtime/tensorboard.py): it opens the board and owns its runs and
# tags; elsewhere (the package, the launchers with it) nothing makes a SweepWriter or calls its
# writing methods, and stages hand the writer's functions what to show.
_WRITES = {"scalars", "curve", "image", "hparams", "text"}


def _board_writes(source: str) -> list[str]:
    """The calls that open a SweepWriter or write through one (a name holding a writer)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        opens = (func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                 ) == "SweepWriter"
        writes = (isinstance(func, ast.Attribute) and func.attr in _WRITES
                  and isinstance(func.value, ast.Name) and "writer" in func.value.id.lower())
        if opens or writes:
            out.append(ast.unparse(func))
    return out


def test_the_writer_check_finds_planted_writes():
    planted = ("with log_lib.SweepWriter(d, s) as writer:\n    writer.scalars(0, {})\n"
               "w = SweepWriter(d, s)\nresult.scalars()\nlog_lib.write_figure(writer, t, x)\n")
    assert sorted(_board_writes(planted)) == ["SweepWriter", "log_lib.SweepWriter",
                                              "writer.scalars"]


def test_tensorboard_is_written_by_one_module():
    found = {name: calls for name, path in _modules().items()
             if name != "jaxillusions.runtime.tensorboard"
             and (calls := _board_writes(path.read_text()))}
    assert not found, f"TensorBoard written outside runtime/tensorboard.py: {found}"


# The joints: a study plugs in through its Stage alone. The door and the runner name no study
# (they take sections, checks and report lines from the pipeline), and the context the stages
# hand each other is typed field by field.
def test_the_door_and_the_runner_name_no_study():
    edges = _edges()
    studies = {m for m in _modules() if m.startswith("jaxillusions.studies.")
               and m != "jaxillusions.studies.stage"}
    for door in ("jaxillusions.pipeline.validate", "jaxillusions.pipeline.sweep"):
        named = sorted(t for s, t in edges if s == door and t in studies)
        assert not named, f"{door} imports the studies {named}"
        source = _modules()[door].read_text()
        for study in studies:
            short = study.rsplit(".", 1)[1]
            assert not re.search(rf"\b{short}\.(STAGE|check|run|report_lines)\b", source), (
                door, short)


def test_the_shared_context_is_typed():
    import dataclasses

    from jaxillusions.studies import stage

    for cls in (stage.Context, stage.ProxyResults):
        for field in dataclasses.fields(cls):
            annotation = str(field.type)
            assert annotation and "Any" not in annotation.split("[")[0].split("|"), (
                cls.__name__, field.name, annotation)
            assert not re.search(r"\bAny\b", annotation), (cls.__name__, field.name)


def test_modules_are_short_and_init_files_thin():
    lines = {name: len(path.read_text().splitlines()) for name, path in _modules().items()}
    long = {n: k for n, k in lines.items() if k > 600}
    assert not long, f"package modules over 600 lines: {long}"
    fat = {n: lines[n] for n, p in _modules().items() if p.name == "__init__.py"
           and lines[n] > 150}
    assert not fat, f"__init__.py files over 150 lines: {fat}"


def _aliases(source: str, names: set[str]) -> list[str]:
    """`import a.b as c` / `from a import b as c` where c is the name of another module."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import | ast.ImportFrom):
            out += [f"{a.name} as {a.asname}" for a in node.names
                    if a.asname and a.asname != a.name.rsplit(".", 1)[-1] and a.asname in names]
    return out


def test_no_import_alias_takes_another_modules_name():
    names = {m.rsplit(".", 1)[-1] for m in _modules()}
    assert _aliases("from x import dictionary_metrics as dictionaries\n", names) == [
        "dictionary_metrics as dictionaries"]
    found = {name: a for name, path in _modules().items()
             if (a := _aliases(path.read_text(), names))}
    assert not found, f"aliases that read as another module: {found}"
