"""stlib.bench.records: the provenance and environment of a run, JSON-lines records and timing."""

from __future__ import annotations

import datetime
import json

import jax.numpy as jnp
import numpy as np
import pytest

from stlib import paths
from stlib.bench import records
from stlib.bench.records import (
    RUN_ID,
    Compiled,
    Recorder,
    Timing,
    compile_function,
    environment,
    latest_per_key,
    read_records,
    record_each,
    time_function,
)
from stlib.provenance import PROVENANCE_FIELDS, provenance

ENVIRONMENT_FIELDS = {"backend", "device_kind", "jax", "jaxlib", "libtpu", "git_rev"}


#: The record files in the repository's data/ (what the notebooks and benchmarks committed).
COMMITTED = sorted((paths.REPO / "data").glob("*.jsonl"))


def test_writers_default_to_the_home_read_at_each_call(tmp_path, monkeypatch):
    """The benchmarks write under ``stlib.paths.data_dir()`` as it is when they run (STLIB_HOME set
    after import counts), never a folder frozen at import."""
    from stlib.bench import figures, runs

    monkeypatch.setenv("STLIB_HOME", str(tmp_path / "home"))
    assert paths.data_dir() == tmp_path / "home" / "data"
    assert runs.write_published_reference() == tmp_path / "home" / "data" / "case_study_reference.json"
    assert figures.draw_figures() == []  # no records there yet: nothing drawn, nothing written elsewhere
    assert not hasattr(records, "DATA_DIR")


def test_provenance_names_date_revision_and_versions():
    fields = provenance()
    assert tuple(fields) == PROVENANCE_FIELDS
    assert fields["jax"] and fields["git_rev"] and "libtpu" in fields
    assert datetime.datetime.fromisoformat(fields["date"]).tzinfo is not None  # UTC, to the second


def test_older_provenance_names_are_read_under_the_current_ones(tmp_path):
    path = tmp_path / "sweep.jsonl"
    path.write_text(json.dumps({"git": "2dcd8da", "time": "2026-11-30T19:55:21", "chip": "v6e"}) + "\n")
    (record,) = read_records(path)
    assert (record["git_rev"], record["date"], record["git"]) == ("2dcd8da", "2026-11-30T19:55:21", "2dcd8da")


@pytest.mark.parametrize("path", COMMITTED, ids=[p.name for p in COMMITTED])
def test_committed_records_name_their_date_and_revision(path):
    """Every committed record says when and from which revision it was made (under the current names
    or the older ones ``read_records`` maps)."""
    for n, record in enumerate(read_records(path)):
        assert record.get("date") and record.get("git_rev"), f"{path.name} line {n + 1}"


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
    assert ENVIRONMENT_FIELDS | set(PROVENANCE_FIELDS) | {
        "run",
        "label",
        "count",
        "ms",
        "array",
    } == set(first)
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


def test_record_each_appends_every_record_as_it_is_made_with_the_runs_provenance(tmp_path):
    path = tmp_path / "sub" / "records.jsonl"
    seen = []

    def make(item):
        seen.append(path.read_text().count("\n") if path.exists() else 0)
        if item == "boom":
            raise RuntimeError("stopped")
        return {"case": item, "date": "the record's own"}

    with pytest.raises(RuntimeError, match="stopped"):
        record_each(["a", "b", "boom"], make, path, "test records")
    assert seen == [0, 1, 2]  # each record was on disk before the next one was made
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["case"] for r in lines] == ["a", "b"]
    assert {r["date"] for r in lines} == {lines[0]["date"]} != {"the record's own"}  # provenance wins, once
    assert all(set(PROVENANCE_FIELDS) <= set(r) for r in lines)


def test_record_each_reports_a_line_per_record(tmp_path, capsys):
    out = record_each(
        [1, 2],
        lambda i: {"case": i},
        tmp_path / "r.jsonl",
        "test records",
        report=lambda r: f"case {r['case']}",
    )
    assert [r["case"] for r in out] == [1, 2]
    printed = capsys.readouterr().out
    assert "[test records 1/2] case 1" in printed and "[test records 2/2] case 2" in printed


def test_latest_per_key_keeps_the_last_record_of_each_key(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text(
        "\n".join(json.dumps(r) for r in [{"k": 1, "v": "old"}, {"k": 2, "v": "x"}, {"k": 1, "v": "new"}])
        + "\n"
    )
    assert latest_per_key(path, lambda r: r["k"]) == {1: {"k": 1, "v": "new"}, 2: {"k": 2, "v": "x"}}
    assert latest_per_key(tmp_path / "missing.jsonl", lambda r: r["k"]) == {}


@pytest.fixture(autouse=True)
def uncapped(monkeypatch):
    """These tests time as asked: the cap the notebook runs of the tests set is lifted here."""
    monkeypatch.delenv(records.TRIALS_CAP_ENV, raising=False)


def test_a_capped_run_times_each_case_once(monkeypatch):
    """``STLIB_TIMING_TRIALS=1`` (the tests' notebook runs): one timed call per case, one round."""
    monkeypatch.setenv(records.TRIALS_CAP_ENV, "1")
    x = jnp.arange(8.0)
    assert time_function(lambda a: a + 1, x, trials=4).trials == 1
    cases = {name: records.compile_function(lambda a, s=s: a * s, x) for s, name in enumerate("ab")}
    assert all(t.trials == 1 for t in records.time_interleaved(cases, x, rounds=3, trials=3).values())
    monkeypatch.setenv(records.TRIALS_CAP_ENV, "2")
    assert time_function(lambda a: a + 1, x, trials=4).trials == 2 and records.capped(1) == 1


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


def test_time_interleaved_times_every_case_rounds_times_trials_in_shuffled_orders(monkeypatch):
    order = []
    real = records._timed_calls

    def spy(compiled, args, trials, warmup):
        order.append((compiled, warmup))
        return real(compiled, args, trials, warmup)

    monkeypatch.setattr(records, "_timed_calls", spy)
    x = jnp.ones((8, 8))
    cases = {name: records.compile_function(lambda a, s=s: a * s, x) for s, name in enumerate("abcd")}
    done = []
    timings = records.time_interleaved(cases, x, rounds=4, trials=2, seed=1, progress=done.append)
    assert sorted(timings) == list("abcd") and all(t.trials == 8 for t in timings.values())
    assert all(t.min_ms <= t.median_ms <= t.max_ms for t in timings.values())
    rounds = [[c for c, _ in order[i : i + 4]] for i in range(0, 16, 4)]
    assert all(
        sorted(map(id, r)) == sorted(map(id, cases.values())) for r in rounds
    )  # each case once a round
    assert len({tuple(map(id, r)) for r in rounds}) > 1  # the order changes between rounds
    assert [w for _, w in order[:4]] == [1] * 4 and all(
        w == 0 for _, w in order[4:]
    )  # one warm-up, first round
    assert sorted(done) == list("abcd")
