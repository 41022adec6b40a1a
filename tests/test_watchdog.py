"""A stalled stage ends the run with one line and a stack dump, and the run resumes
(jaxillusions/runtime/watchdog.py)."""

import glob
import os
import shutil
import subprocess
import sys
import textwrap
import threading

import pytest

from jaxillusions.runtime import watchdog

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)


def test_progress_outside_watching_does_nothing_and_zero_watches_nothing(tmp_path):
    watchdog.progress("anything")  # no error, no state
    assert not watchdog._state
    before = threading.active_count()
    with watchdog.watching(0, str(tmp_path)):
        assert threading.active_count() == before and not watchdog._state
    with watchdog.watching(60, str(tmp_path), "starting"):
        watchdog.progress("fitting x")
        assert watchdog._state["what"] == "fitting x"
        watchdog.progress()  # one more chunk of the same work
        assert watchdog._state["what"] == "fitting x"
    assert not watchdog._state and threading.active_count() == before
    assert not os.listdir(tmp_path)  # no stall, no file


def test_a_main_thread_blocked_in_c_is_ended_with_one_line(tmp_path):
    # os.read on a pipe nobody writes: blocked outside Python, as in a deadlocked XLA call.
    code = textwrap.dedent(f"""
        import os
        from jaxillusions.runtime import watchdog
        with watchdog.watching(1.0, {str(tmp_path)!r}):
            watchdog.progress("fitting svd on blocks.0.attn.k")
            read, _ = os.pipe()
            os.read(read, 1)
        """)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == watchdog.EXIT_CODE
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error: no progress and no CPU use for "), done.stderr
    assert "while fitting svd on blocks.0.attn.k (stall_seconds=1)" in lines[0]
    (dump,) = glob.glob(str(tmp_path / "stall_*.txt"))
    assert dump in lines[0]
    with open(dump) as f:
        text = f.read()
    assert "while fitting svd on blocks.0.attn.k" in text and "<module>" in text


def test_a_piece_of_work_that_computes_is_not_a_stall(tmp_path):
    # Three times the limit without a progress mark, but busy: a slow chunk, not a stall.
    code = textwrap.dedent(f"""
        import time
        from jaxillusions.runtime import watchdog
        with watchdog.watching(1.0, {str(tmp_path)!r}):
            watchdog.progress("training steps 0 to 100")
            end = time.monotonic() + 3.0
            while time.monotonic() < end:
                sum(range(10000))
        print("finished")
        """)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert (done.returncode, done.stdout.strip(), done.stderr) == (0, "finished", "")
    assert not os.listdir(tmp_path)


# The stall window of the sweep made to stall: the stalled launch waits it out, idle. A run at
# work uses CPU, so no window this long passes without it before the stall.
STALL_S = 5
_SCRIPT = """
import os, sys
sys.path.insert(0, {tests!r})
from conftest import checked, tiny_sweep_config
from jaxillusions.pipeline import proxy_stage, sweep

config = tiny_sweep_config({cache!r})
config.figures = "summary"  # as the tiny_sweep fixture
config.proxies.svd_ranks = (1, 2)  # the SVD family is fitted again
config.stall_seconds = {stall}
if {stall_on_purpose}:
    def stalled_fit(*args, **kwargs):
        read, _ = os.pipe()
        os.read(read, 1)  # never returns: a stage made to stall
    proxy_stage.fit_one = stalled_fit  # where the proxy stage looks it up
sweep.run(checked(config), {workdir!r}, verbose=True)
"""


@pytest.mark.slow
def test_a_stage_made_to_stall_ends_the_sweep_which_then_resumes(tiny_sweep, tmp_path,
                                                                   cache_dir):
    workdir = str(tmp_path / "run")
    shutil.copytree(tiny_sweep, workdir)

    def launch(stall_on_purpose: bool):
        script = _SCRIPT.format(tests=TESTS, cache=cache_dir, workdir=workdir, stall=STALL_S,
                                stall_on_purpose=stall_on_purpose)
        return subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                              text=True, timeout=600)

    stalled = launch(True)
    assert stalled.returncode == watchdog.EXIT_CODE, stalled.stdout + stalled.stderr
    errors = [line for line in stalled.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in stalled.stderr, stalled.stderr
    assert f"while fitting svd on blocks.1.attn.k (stall_seconds={STALL_S})" in errors[0]
    assert "fitting [1/1] svd on blocks.1.attn.k" in stalled.stdout  # the progress line
    (dump,) = glob.glob(os.path.join(workdir, "stall_*.txt"))
    with open(dump) as f:
        assert "stalled_fit" in f.read()

    resumed = launch(False)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resumed from checkpoint at step 20" in resumed.stdout  # nothing trained again
    with open(os.path.join(workdir, "results.csv")) as f:
        header, *rows = f.read().splitlines()
    columns = header.split(",")
    sizes = {row.split(",")[columns.index("size")] for row in rows
             if row.split(",")[columns.index("method")] == "svd"}
    assert sizes == {"1", "2"}
