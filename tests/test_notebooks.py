"""Every notebook: committed without outputs, its .py twin in sync, and it runs end to end at the
small configuration (Pallas interpret mode on CPU), run by the main job (``python -m
stlib.reproduce``) once per test run (conftest's ``notebook_run``)."""

from __future__ import annotations

import jupytext
import nbformat
import pytest

from stlib.reproduce import NOTEBOOKS, notebook_paths

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
def test_runs_at_small_configuration(path, notebook_run):
    result = notebook_run(path.name[:2])
    assert result.returncode == 0 and f"{path.name}  ok" in result.log, result.failure()
    executed = nbformat.read(result.executed, as_version=4)
    code = [c for c in executed.cells if c.cell_type == "code" and c.source.strip()]
    assert code and all(c.execution_count for c in code), f"{path.name}: not every code cell ran"


def test_notebooks_folder():
    assert NOTEBOOKS.is_dir()
