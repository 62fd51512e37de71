"""examples/stateful_vs_stateless.ipynb: committed with its outputs cleared (fast), and executed end to
end in a real Jupyter kernel (slow: it trains a small model, about a minute on one CPU core)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "examples" / "stateful_vs_stateless.ipynb"


def read_notebook():
    import nbformat

    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(notebook)
    return notebook


def test_notebook_is_committed_without_outputs():
    code = [cell for cell in read_notebook().cells if cell.cell_type == "code"]
    assert code and all(not cell.outputs and cell.execution_count is None for cell in code)


def _runs(folder: Path) -> set[Path]:
    return set(folder.glob("runs/*/*")) if folder.is_dir() else set()


@pytest.mark.slow
def test_notebook_runs_end_to_end(tmp_path, monkeypatch):
    """Every cell runs without error in the venv's own python3 kernel; training writes under
    $PROJECT_ROOT (a tmp folder here, also the kernel's working directory), never into the
    checkout; the last cell draws its figure."""
    from nbclient import NotebookClient

    before = _runs(REPO / "outputs")
    # The kernel inherits this environment.
    monkeypatch.setenv("PROJECT_ROOT", str(tmp_path))
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("MPLBACKEND", raising=False)  # the kernel's inline backend draws into the outputs
    notebook = read_notebook()
    client = NotebookClient(notebook, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError (with the cell and its traceback) if a cell fails

    outputs = [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs]
    assert not [output for output in outputs if output.output_type == "error"]
    assert any("image/png" in output.get("data", {}) for output in outputs), "no figure was drawn"
    text = "".join(output.get("text", "") for output in outputs)
    assert "same continuation: True" in text
    assert list((tmp_path / "outputs" / "runs" / "astra_alpha").glob("*/summary.json"))
    assert _runs(REPO / "outputs") == before
