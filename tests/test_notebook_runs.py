"""stlib.bench.notebook_runs: a TPU notebook run's reports become records in data/tpu_notebooks.jsonl."""

from __future__ import annotations

import json

import nbformat
import pytest

from stlib.bench import notebook_runs

SETUP = (
    "JAX 0.10.2 | backend tpu | device TPU v5 lite\n"
    "configuration: full -> case-study: grid (21, 45, 80) = 75,600 tokens, 10 heads x 128, bfloat16; tiles 512 x 1024\n"
)


def _write_run(folder, name, status="ok", seconds=12.5, text=SETUP):
    cell = nbformat.v4.new_code_cell("cfg = notebook.setup(SIZE)")
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=text)]
    nbformat.write(nbformat.v4.new_notebook(cells=[cell]), folder / f"{name}.ipynb")
    report = {
        "status": status,
        "wall_seconds": seconds,
        "peak_host_gb": 14.2,
        "cells": [{"cell": 3, "seconds": 9.0}],
    }
    if status != "ok":
        report["error"] = "Traceback ...\nAssertionError: 0.0053"
    (folder / f"{name}.json").write_text(json.dumps(report))


def test_records_read_what_the_notebook_printed(tmp_path):
    _write_run(tmp_path, "00_problem_and_hardware")
    _write_run(tmp_path, "01_naive_masked_attention", status="FAILED", seconds=40.0)
    records = notebook_runs.run_records(tmp_path, "fill", "abc1234", date="2026-12-07T12:00:00+00:00")
    assert [r["notebook"] for r in records] == ["00_problem_and_hardware", "01_naive_masked_attention"]
    first, second = records
    assert (first["device_kind"], first["size"], first["tokens"], first["backend"]) == (
        "TPU v5 lite",
        "full",
        75_600,
        "tpu",
    )
    assert first["status"] == "ok" and first["seconds"] == 12.5 and first["git_rev"] == "abc1234"
    assert second["status"] == "FAILED" and second["error"] == "AssertionError: 0.0053"


def test_latest_keeps_the_newest_record_per_notebook_and_mode(tmp_path):
    _write_run(tmp_path, "00_problem_and_hardware")
    old = notebook_runs.run_records(tmp_path, "fill", "a", date="2026-12-07T10:00:00+00:00")
    new = notebook_runs.run_records(tmp_path, "fill", "b", date="2026-12-07T11:00:00+00:00")
    hide = notebook_runs.run_records(tmp_path, "hide", "c", date="2026-12-07T09:00:00+00:00")
    latest = notebook_runs.latest(new + old + hide, "fill")
    assert latest["00_problem_and_hardware"]["git_rev"] == "b"
    assert notebook_runs.latest(new + old + hide, "hide")["00_problem_and_hardware"]["git_rev"] == "c"
    assert "00_problem_and_hardware" in notebook_runs.table(new + hide)


def test_bad_mode_and_empty_folder(tmp_path):
    with pytest.raises(ValueError, match="mode="):
        notebook_runs.run_records(tmp_path, "show", "x")
    with pytest.raises(ValueError, match="no notebook reports"):
        notebook_runs.run_records(tmp_path, "fill", "x")


def test_the_main_job_records_a_notebook_that_ran_on_a_tpu(tmp_path, monkeypatch):
    """``python -m stlib.reproduce`` appends a record where the executed copy's setup output names a TPU,
    under ``stlib.paths.data_dir()`` (the tests' STLIB_HOME), and nothing for a CPU run."""
    from stlib import paths
    from stlib.reproduce import _record_on_tpu

    monkeypatch.setenv("STLIB_HOME", str(tmp_path))
    target = paths.data_dir() / notebook_runs.RECORDS
    _write_run(tmp_path, "00_problem_and_hardware")
    record = _record_on_tpu(
        tmp_path / "00_problem_and_hardware.ipynb", tmp_path / "00_problem_and_hardware.ipynb", "ok", 3.21
    )
    assert (
        record["device_kind"] == "TPU v5 lite"
        and record["seconds"] == 3.2
        and record["runner"] == "python -m stlib.reproduce"
    )
    assert notebook_runs.read(target) == [record]
    _write_run(
        tmp_path,
        "01_naive_masked_attention",
        text=SETUP.replace("backend tpu | device TPU v5 lite", "backend cpu | device cpu"),
    )
    assert (
        _record_on_tpu(tmp_path / "x.ipynb", tmp_path / "01_naive_masked_attention.ipynb", "ok", 1.0) is None
    )
    assert len(notebook_runs.read(target)) == 1
