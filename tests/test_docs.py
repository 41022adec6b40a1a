"""Docs that cannot drift: the README and docs/*.md are checked against the code.

- Every ```python block runs, in the order of its page, with the page's blocks sharing one
  namespace, on a tiny run: `configs.dyck_small.get_config` returns the tests' tiny config and
  `runs/dyck_small` is a finished tiny sweep (conftest.tiny_sweep). A block that computes
  something must print it (no quoted outputs that go stale).
- Every relative link points at a file of the repository, and every #anchor at a heading there.
- Every `python -m <module>` names a module of the repository, with flags it defines, and every
  configs/<name>.py exists.
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

from configs import dyck_small

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
COMMAND = re.compile(r"python -m ([\w.]+)((?:\\\n|[^\n`|])*)")


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
    if module.startswith("launch."):
        source += (ROOT / "launch" / "common.py").read_text()  # the launchers' shared flags
    return source


def _unknown_overrides(module: str, args: str) -> list[str]:
    """`--config.<key>=` overrides of a command whose key the command's config does not have."""
    from jaxillusions.config import settings

    keys = re.findall(r"--config\.([\w.]+)=", args)
    if not keys:
        return []
    name = re.search(r"--config=configs/(\w+)\.py", args)
    config_module = importlib.import_module(f"configs.{name.group(1) if name else 'dyck_small'}")
    config = config_module.get_config()
    known = set(settings.flat(settings.from_config(config)))
    return [f"python -m {module}: --config.{key} is not a key of {config_module.__name__}"
            for key in keys if key not in known]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_commands_name_real_modules_flags_and_configs(page):
    text = _page(page)
    problems = []
    for module, args in COMMAND.findall(text):
        if module in ("pip", "pytest") or not module.startswith(("launch", "benchmarks")):
            continue
        source = _module_source(module)
        for flag in re.findall(r"(?<![\w-])--(\w+)", args):
            if f'"{flag}"' not in source and f'"--{flag}"' not in source:
                problems.append(f"python -m {module}: no flag --{flag}")
        problems += _unknown_overrides(module, args)
    for config in set(re.findall(r"\bconfigs/\w+\.py", text)):
        if not (ROOT / config).exists():
            problems.append(f"{config} does not exist")
    assert not problems, f"{page.name}: " + "; ".join(sorted(set(problems)))


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
    # docs/design.md's picture is `python -m jaxillusions.pipeline.sweep`: a folder, a layer or
    # a stage changed (or its docstring) without the page fails here.
    from jaxillusions.pipeline import sweep

    assert sweep.picture() in _page(ROOT / "docs" / "design.md")


def test_the_config_reference_is_the_settings_code():
    # docs/configs.md's key tables are `python -m jaxillusions.config.settings`: a key, default
    # or rule
    # changed in jaxillusions/config/settings.py (or a task's Data) without the page fails here.
    from jaxillusions import tasks
    from jaxillusions.config import settings

    page = _page(ROOT / "docs" / "configs.md")
    for table in [settings.reference()] + [settings.reference(t) for t in tasks.TASKS]:
        assert table in page, table.splitlines()[2]
