"""Every notebook: committed without outputs, its .py twin in sync, and it runs end to end at the
small configuration (Pallas interpret mode on CPU)."""

from __future__ import annotations

import jupytext
import nbformat
import pytest

from stlib.reproduce import NOTEBOOKS, execute, notebook_paths

PATHS = notebook_paths()


def test_there_are_notebooks():
    assert len(PATHS) >= 1


@pytest.mark.parametrize("path", PATHS, ids=[p.stem for p in PATHS])
def test_committed_without_outputs(path):
    notebook = nbformat.read(path, as_version=4)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, f"{path.name} carries outputs"


@pytest.mark.parametrize("path", PATHS, ids=[p.stem for p in PATHS])
def test_py_twin_in_sync(path):
    twin = path.with_suffix(".py")
    assert twin.exists(), f"{path.name} has no jupytext .py twin"
    a, b = jupytext.read(path), jupytext.read(twin)
    cells_a = [(c.cell_type, c.source.strip()) for c in a.cells]
    cells_b = [(c.cell_type, c.source.strip()) for c in b.cells]
    assert cells_a == cells_b, f"{path.name} and {twin.name} differ: run `jupytext --sync {twin}`"


@pytest.mark.parametrize("path", PATHS, ids=[p.stem for p in PATHS])
def test_runs_at_small_configuration(path, monkeypatch):
    monkeypatch.setenv("STLIB_SIZE", "small")
    execute(path)


def test_notebooks_folder():
    assert NOTEBOOKS.is_dir()
