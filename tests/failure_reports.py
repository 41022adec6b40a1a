"""A failing test's report, whatever CPython's AST race does (a pytest plugin; tests/conftest.py
uses it).

CPython 3.11.0-3.11.7 and 3.12.0-3.12.1 keep the AST constructor's recursion count in state
shared by all threads, so an `ast.parse` in one thread while another builds an AST can raise
`SystemError: AST constructor recursion depth mismatch` (fixed in 3.11.8 and 3.12.2). pytest
parses a failing test's source with `ast.parse` to show its statements; there the SystemError
escaped the report, killed the xdist worker and ended the whole run with an INTERNALERROR (a
failure in the suite's 65th percent lost the other 35). Such a report is made again with
Python's own traceback (`--tb=native`: it parses no whole statement, only a line's segment
for its carets, far less exposed to the race), so the failure is reported as one and the run
goes on."""

import pytest

AST_RACE = "AST constructor recursion depth mismatch"


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_makereport(item, call):
    """pytest's own report (runner.pytest_runtest_makereport), or where CPython's AST race
    broke its traceback, the report with Python's traceback."""
    try:
        return pytest.TestReport.from_item_and_call(item, call)
    except SystemError as err:
        if AST_RACE not in str(err):
            raise
    option = item.config.option
    style, option.tbstyle = option.tbstyle, "native"
    try:
        return pytest.TestReport.from_item_and_call(item, call)
    finally:
        option.tbstyle = style
