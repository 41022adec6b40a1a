"""docs/tutorial.ipynb runs top to bottom (nbclient, a kernel of this interpreter) and is stored
without outputs. The notebook trains a dozen seeds of a tiny model, fits and evaluates the
proxies, plots the gaps, reads results.csv and exports a seed (that cell skips without the
`export` extra)."""

import importlib.util
import json
import time
from pathlib import Path

import pytest
from conftest import users_xla_flags

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "docs" / "tutorial.ipynb"


def test_the_notebook_is_stored_without_outputs():
    cells = json.loads(NOTEBOOK.read_text(encoding="utf-8"))["cells"]
    code = [c for c in cells if c["cell_type"] == "code"]
    assert len(code) >= 7
    assert all(not c["outputs"] and c["execution_count"] is None for c in code), (
        "clear the outputs before committing (jupyter nbconvert --clear-output --inplace "
        "docs/tutorial.ipynb)")


@pytest.mark.slow  # a whole sweep
@pytest.mark.skipif(importlib.util.find_spec("nbclient") is None
                    or importlib.util.find_spec("ipykernel") is None,
                    reason="nbclient and ipykernel run the notebook: pip install -e '.[test]'")
def test_the_tutorial_runs_top_to_bottom(tmp_path, cache_dir, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    # The kernel inherits the environment: the session's data cache, the suite's XLA flags but
    # its LLVM level (the kernel's sweep runs more than it compiles: conftest.users_xla_flags).
    monkeypatch.setenv("JAXILLUSIONS_CACHE", cache_dir)
    monkeypatch.setenv("XLA_FLAGS", users_xla_flags())
    monkeypatch.setenv("MPLBACKEND", "Agg")
    # The notebook writes under tempfile's folder; the kernel's is the test's, which pytest removes.
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(notebook, timeout=900, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}})
    start = time.perf_counter()
    client.execute()  # a cell's error raises CellExecutionError with its traceback
    print(f"docs/tutorial.ipynb ran in {time.perf_counter() - start:.0f} s")
    text = "\n".join(out.get("text", "") for cell in notebook.cells
                     for out in cell.get("outputs", []) if out.get("output_type") == "stream")
    assert "trained 12 seeds" in text and "gap" in text, text[-3000:]
    images = [out for cell in notebook.cells for out in cell.get("outputs", [])
              if "image/png" in out.get("data", {})]
    assert len(images) == 2  # the gap figures of the SVD and of k-means
    written = list(tmp_path.glob("jaxillusions_tutorial_*/figures/*.png"))
    assert len(written) == 2, written  # and nothing of it outside the test's folder
    table = [out for cell in notebook.cells for out in cell.get("outputs", [])
             if out.get("output_type") == "execute_result"]
    assert table and "unseen_depth" in table[-1]["data"]["text/plain"]
    if importlib.util.find_spec("transformer_lens") is None:
        assert "skipped: TransformerLens is not installed" in text
    else:
        assert "in TransformerLens: blocks.1.attn.hook_k" in text, text[-1000:]
