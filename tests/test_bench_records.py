"""stlib.bench.records: the environment of a run, JSON-lines records and timing."""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np

from stlib.bench import records
from stlib.bench.records import (
    RUN_ID,
    Compiled,
    Recorder,
    Timing,
    compile_function,
    environment,
    read_records,
    time_function,
)

ENVIRONMENT_FIELDS = {"backend", "device_kind", "jax", "jaxlib", "libtpu", "git_rev"}


def test_data_dir_is_the_repository_data_folder():
    assert records.DATA_DIR.name == "data"
    assert (records.DATA_DIR.parent / "stlib" / "bench" / "records.py").is_file()


def test_environment_names_backend_versions_and_revision():
    env = environment()
    assert set(env) == ENVIRONMENT_FIELDS
    assert env["backend"] and env["device_kind"] and env["jax"] and env["git_rev"]


def test_recorder_writes_one_json_line_per_record_with_the_environment(tmp_path):
    path = tmp_path / "sub" / "bench.jsonl"  # the folder is created
    recorder = Recorder(path)
    written = recorder.write(
        {"label": "a", "count": np.int64(3), "ms": np.float32(1.5), "array": np.arange(2)}
    )
    recorder.write({"label": "b", "when": object()})
    lines = path.read_text().splitlines()
    assert len(lines) == 2
    first = json.loads(lines[0])
    assert first == json.loads(json.dumps(written, default=records._jsonable))
    assert ENVIRONMENT_FIELDS | {"run", "date", "label", "count", "ms", "array"} == set(first)
    assert first["run"] == RUN_ID
    assert (first["count"], first["ms"], first["array"]) == (3, 1.5, [0, 1])
    assert isinstance(json.loads(lines[1])["when"], str)  # anything else is written as its str()
    assert [r["label"] for r in read_records(path)] == ["a", "b"]


def test_record_fields_win_over_the_environment(tmp_path):
    written = Recorder(tmp_path / "r.jsonl").write({"backend": "mine"})
    assert written["backend"] == "mine"


def test_read_records_latest_run(tmp_path):
    path = tmp_path / "r.jsonl"
    rows = [{"run": "1", "i": 0}, {"run": "2", "i": 1}, {"run": "1", "i": 2}, {"run": "2", "i": 3}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")  # blank lines are skipped
    assert [r["i"] for r in read_records(path)] == [0, 1, 2, 3]
    assert [r["i"] for r in read_records(path, latest_run=True)] == [1, 3]


def test_read_records_of_a_missing_file(tmp_path):
    assert read_records(tmp_path / "none.jsonl") == []
    assert read_records(tmp_path / "none.jsonl", latest_run=True) == []


def test_time_function_statistics():
    x = jnp.arange(8.0)
    timing = time_function(lambda a: a * 2 + 1, x, trials=4, warmup=2)
    assert isinstance(timing, Timing)
    assert timing.trials == 4
    assert 0 <= timing.min_ms <= timing.median_ms <= timing.max_ms
    assert timing.compile_ms >= 0


def test_a_compiled_function_is_timed_without_compiling_again(monkeypatch):
    x = jnp.arange(8.0)
    compiled = compile_function(lambda a: a * 2 + 1, x)
    assert isinstance(compiled, Compiled)
    np.testing.assert_allclose(compiled(x), np.arange(8.0) * 2 + 1)

    def no_second_compile(*args):
        raise AssertionError("compiled again")

    monkeypatch.setattr(records, "compile_function", no_second_compile)
    timing = time_function(compiled, x, trials=2, warmup=0)
    assert timing.compile_ms == compiled.compile_ms and timing.trials == 2


def test_read_records_latest_run_among_the_accepted(tmp_path):
    path = tmp_path / "r.jsonl"
    rows = [{"run": "a", "interpret": False}, {"run": "b", "interpret": True}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert read_records(path, latest_run=True) == rows[1:]
    assert read_records(path, latest_run=True, where=lambda r: not r["interpret"]) == rows[:1]
