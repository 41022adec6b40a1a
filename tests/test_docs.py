"""Docs that cannot drift: the README and docs/*.md are checked against the code.

- Every ```python block runs, in the order of its page, with the page's blocks sharing one
  namespace, on a tiny run: `jaxillusions.configs.dyck_small.get_config` returns the tests' tiny
  config and
  `runs/dyck_small` is a finished tiny sweep (conftest.tiny_sweep). A block that computes
  something must print it (no quoted outputs that go stale).
- Every relative link points at a file of the repository, and every #anchor at a heading there.
- Every `python -m <module>` names a module of the repository, and every `jaxillusions
  <subcommand>` in code (a code span or a non-Python block) one of the command's subcommands,
  with flags the launcher defines; every `--config=<name>` names a shipped config and every
  jaxillusions/configs/<name>.py exists; every `jaxillusions sweep` or `train` of a shipped
  config passes the config check with its overrides.
"""

import ast
import contextlib
import copy
import importlib
import importlib.util
import io
import os
import re
from pathlib import Path

import pytest
from conftest import tiny_config

from jaxillusions.configs import dyck_small
from jaxillusions.pipeline import validate

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
ARGS = r"((?:\\\n|[^\n`|])*)"  # the rest of a command: to the end of its (continued) line
COMMAND = re.compile(r"python -m ([\w.]+)" + ARGS)
# The command `jaxillusions <subcommand>`, where code is (not `from jaxillusions import ...`).
SUBCOMMAND = re.compile(r"(?<![\w./-])(?<!from )(?<!import )(?<!-m )jaxillusions ([a-z][\w-]*)"
                        + ARGS)


def _page(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _blocks(text: str, language: str) -> list[tuple[int, str]]:
    """(line number, code) of every fenced block of `language`."""
    return [(text[:m.start()].count("\n") + 1, m.group(2)) for m in FENCE.finditer(text)
            if m.group(1) == language]


def _computes(code: str) -> bool:
    """True unless the block only imports and defines (a module's contents, docstring included)."""
    quiet = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef, ast.Assign,
             ast.AnnAssign)

    def is_quiet(node: ast.stmt) -> bool:
        docstring = isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        return isinstance(node, quiet) or docstring

    return not all(is_quiet(node) for node in ast.parse(code).body)


def _slug(heading: str) -> str:
    """GitHub's anchor of a markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = FENCE.sub("", _page(path))
    return {_slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, re.M)}


SNIPPET_PAGES = [p for p in PAGES if _blocks(_page(p), "python")]


def test_every_page_is_listed():
    """The pages this file checks: the README, the docs index and the pages it links."""
    names = {p.name for p in PAGES}
    assert {"README.md", "design.md", "python_api.md"} <= names
    assert SNIPPET_PAGES, "no python snippets found: the fence pattern is broken"


@pytest.mark.parametrize("page", SNIPPET_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_python_snippets_run_and_print(page, tiny_sweep, cache_dir, tmp_path, monkeypatch):
    tiny = tiny_config(cache_dir)
    monkeypatch.setattr(dyck_small, "get_config", lambda: copy.deepcopy(tiny))
    monkeypatch.setenv("JAXILLUSIONS_CACHE", cache_dir)
    (tmp_path / "runs").mkdir()
    os.symlink(tiny_sweep, tmp_path / "runs" / "dyck_small")
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__snippet__"}
    for line, code in _blocks(_page(page), "python"):
        if "transformer_lens" in code or "export" in code:
            if importlib.util.find_spec("transformer_lens") is None:
                continue  # the optional `export` extra is not installed
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code, f"{page.name}:{line}", "exec"), namespace)  # noqa: S102
        print(f"--- {page.name}:{line}\n{out.getvalue()}")  # shown with -s, or on a failure
        if _computes(code):
            assert out.getvalue().strip(), f"{page.name}:{line}: the snippet prints nothing"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    text = FENCE.sub("", _page(page))
    text = re.sub(r"`[^`\n]*`", "", text)  # code spans are not links
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: outside the repository by design
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists() or not resolved.is_relative_to(ROOT):
            broken.append(f"{target}: no such file in the repository")
        elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
            broken.append(f"{target}: no heading #{anchor} in {resolved.name}")
    assert not broken, f"{page.name}: " + "; ".join(broken)


def _module_source(module: str) -> str:
    path = ROOT / (module.replace(".", "/") + ".py")
    assert path.exists(), f"python -m {module}: no {path.relative_to(ROOT)}"
    source = path.read_text()
    if module.startswith("jaxillusions.launch."):  # the launchers' shared flags
        source += (ROOT / "jaxillusions" / "launch" / "common.py").read_text()
    return source


def _code(text: str) -> str:
    """The page's code where a command can be: its non-Python fenced blocks and code spans."""
    blocks = [m.group(2) for m in FENCE.finditer(text) if m.group(1) != "python"]
    spans = re.findall(r"`([^`\n]+)`", FENCE.sub("", text))
    return "\n".join(blocks + spans)


def _commands(text: str) -> tuple[list[tuple[str, str, str]], list[str]]:
    """(how it is written, module, arguments) of every command of the repository's code on the
    page: `python -m <module>` and `jaxillusions <subcommand>` (also `python -m jaxillusions
    <subcommand>`), and the problems of those that name nothing."""
    from jaxillusions.launch import cli

    commands, problems = [], []
    found = [(f"python -m {m}", m, a) for m, a in COMMAND.findall(text)]
    found += [(f"jaxillusions {sub}", "jaxillusions", f"{sub}{a}")
              for sub, a in SUBCOMMAND.findall(_code(text))]
    for written, module, args in found:
        top = module.split(".")[0]
        if top in ("launch", "configs"):
            problems.append(f"{written}: moved into the package (jaxillusions {top} ...)")
        elif module == "jaxillusions":
            sub, _, rest = args.strip().partition(" ")
            if sub not in cli.SUBCOMMANDS:
                if sub not in ("-h", "--help", "--version"):
                    problems.append(f"{written}: no subcommand {sub!r} of the command")
                continue
            commands.append((f"jaxillusions {sub}", cli.SUBCOMMANDS[sub][0], rest))
        elif top in ("jaxillusions", "benchmarks"):
            commands.append((written, module, args))
    return commands, problems


def _unknown_overrides(written: str, args: str) -> list[str]:
    """`--config.<key>=` overrides of a command whose key the command's config does not have."""
    from jaxillusions.config import settings

    keys = re.findall(r"--config\.([\w.]+)=", args)
    if not keys:
        return []
    name = re.search(r"--config=(\w+)(?::(\w+))?(?!\w|/|\.)", args)
    config_module = importlib.import_module(
        f"jaxillusions.configs.{name.group(1) if name else 'dyck_small'}")
    config = (config_module.get_config(name.group(2)) if name and name.group(2)
              else config_module.get_config())
    known = set(settings.flat(validate.parse(config)))
    return [f"{written}: --config.{key} is not a key of {config_module.__name__}"
            for key in keys if key not in known]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_commands_name_real_modules_flags_and_configs(page):
    from jaxillusions import configs

    text = _page(page)
    commands, problems = _commands(text)
    for written, module, args in commands:
        source = _module_source(module)
        for flag in re.findall(r"(?<![\w-])--(\w+)", args):
            if f'"{flag}"' not in source and f'"--{flag}"' not in source:
                problems.append(f"{written}: no flag --{flag}")
        for value in re.findall(r"--config=([^\s\\]+)", args):
            name = value.partition(":")[0]
            if re.fullmatch(r"[a-z0-9_]+", name) and name not in configs.names():
                problems.append(f"{written}: no shipped config {name}")
        problems += _unknown_overrides(written, args)
    for config in set(re.findall(r"(?<![\w.-])((?:jaxillusions/)?configs/\w+\.py)", text)):
        if not (ROOT / config).exists():
            problems.append(f"{config} does not exist")
    assert not problems, f"{page.name}: " + "; ".join(sorted(set(problems)))


def _refusal(args: str) -> str | None:
    """validate.check's one line for a `jaxillusions sweep` or `train` command of a shipped
    config, its `--config.<key>=VALUE` overrides read as the launchers read them (a Python
    literal, else the text), on the test process's devices; None when it passes. Not checked
    (None): an elided command (`...`), and a refusal of `data.*` or `model.pretrained`, which
    name the reader's own files."""
    import shlex

    from jaxillusions import configs

    tokens = shlex.split(args.replace("\\\n", " "))
    name = next((t.partition("=")[2] for t in tokens if t.startswith("--config=")), "")
    module, _, arg = name.partition(":")
    if "..." in tokens or module not in configs.names():
        return None
    config_module = importlib.import_module(f"jaxillusions.configs.{module}")
    config = config_module.get_config(arg) if arg else config_module.get_config()
    for token in tokens:
        if token.startswith("--config.") and "=" in token:
            key, _, value = token[len("--config."):].partition("=")
            with contextlib.suppress(ValueError, SyntaxError):
                value = ast.literal_eval(value)
            *sections, last = key.split(".")
            node = config
            for section in sections:
                node = node[section]
            node[last] = value
    config.cpu_devices = 0  # the test process's (conftest.jax_started)
    try:
        validate.check(config)
    except ValueError as err:
        return None if str(err).startswith(("data.", "model.pretrained")) else str(err)
    return None


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_commands_of_shipped_configs_pass_the_door(page):
    # Was: docs/prediction.md's command, written before dyck_small packed its rows, was
    # refused (packed rows with contrastive weights).
    commands, _ = _commands(_page(page))
    problems = [f"{written}{args}: {why}" for written, _, args in commands
                if written in ("jaxillusions sweep", "jaxillusions train")
                for why in [_refusal(args)] if why]
    assert not problems, f"{page.name}: " + "; ".join(problems)
    assert _refusal(" --config=dyck_small --workdir=w --config.train.num_steps=0") == (
        "train.num_steps=0: must be >= 1")  # the check can fail


def test_the_command_check_finds_planted_problems():
    # The check can fail: a subcommand or a config key that does not exist, the old launchers'
    # paths; `from jaxillusions import` and `jaxillusions --help` are no subcommands.
    planted = ("Run `jaxillusions sweep --config=dyck_small --workdir=W --nope=1` or\n"
               "```bash\njaxillusions swep --config=dyck_small\n"
               "jaxillusions train --config=dyck_tiny --workdir=W\n"
               "python -m jaxillusions figures W --config.train.nope=2\n"
               "python -m launch.sweep --config=configs/dyck_small.py\n```\n"
               "from jaxillusions import configs; `jaxillusions --help`\n")
    commands, problems = _commands(planted)
    assert sorted(c[0] for c in commands) == ["jaxillusions figures", "jaxillusions sweep",
                                        "jaxillusions train"]
    assert problems == ["python -m launch.sweep: moved into the package (jaxillusions launch ...)",
                        "jaxillusions swep: no subcommand 'swep' of the command"]
    assert _unknown_overrides("x", "--config.train.nope=2") == [
        "x: --config.train.nope is not a key of jaxillusions.configs.dyck_small"]


def test_the_project_cites_nothing_outside_itself():
    """No .py or .md file of the repository points into a `shared` folder beside the clone (which
    a user's clone does not have): the test greps as `grep -rn "<OUTSIDE>" --include=*.py
    --include=*.md .` would, with OUTSIDE below (spelled in two parts so that this file passes)."""
    outside = "shared" + "/"
    files = [p for ext in ("*.py", "*.md") for p in ROOT.rglob(ext)
             if not any(part.startswith(".") for part in p.relative_to(ROOT).parts)]
    hits = [f"{p.relative_to(ROOT)}:{n}" for p in files
            for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
            if outside in line]
    assert len(files) > 50 and not hits, hits


def test_the_design_picture_is_the_code():
    # docs/design.md's picture is `python -m jaxillusions.pipeline.job`: a folder, a layer or
    # a stage changed (or its docstring) without the page fails here.
    from jaxillusions.pipeline import job

    assert job.picture() in _page(ROOT / "docs" / "design.md")


def test_the_config_reference_is_the_settings_code():
    # docs/configs.md's key tables are `python -m jaxillusions.config.settings`: a key, default
    # or rule
    # changed in jaxillusions/config/settings.py (or a task's Data) without the page fails here.
    from jaxillusions import tasks

    page = _page(ROOT / "docs" / "configs.md")
    for table in [validate.reference()] + [validate.reference(t) for t in tasks.TASKS]:
        assert table in page, table.splitlines()[2]
