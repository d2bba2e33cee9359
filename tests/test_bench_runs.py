"""stlib.bench.runs: a case checked first (compile_case) is timed with the same executable."""

from __future__ import annotations

from stlib import masks
from stlib.bench import records, runs
from stlib.bench.cases import Case
from stlib.configs import SMALL_CPU


def test_run_case_study_times_the_executable_a_check_compiled(tmp_path, monkeypatch, capsys):
    case = Case("xla", "dense", masks.full(SMALL_CPU.num_tokens), "xla (dense)", block_q=128, block_kv=128)
    monkeypatch.setattr(runs, "case_study_cases", lambda *args, **kwargs: [case])
    monkeypatch.setattr(runs, "case_work", lambda *args: {"density": 1.0})
    monkeypatch.setattr(runs, "record_full_scale_work", lambda *args, **kwargs: None)
    import stlib

    q, k, v = stlib.random_qkv(SMALL_CPU.qkv_shape, SMALL_CPU.dtype, seed=0)  # what run_case_study draws
    checked = runs.compile_case(case, SMALL_CPU.head_dim**-0.5, True, q, k, v)
    assert runs.compile_case(case, SMALL_CPU.head_dim**-0.5, True, q, k, v) is checked  # compiled once

    def no_second_compile(*args):
        raise AssertionError("compiled again")

    monkeypatch.setattr(runs, "compile_function", no_second_compile)
    monkeypatch.setattr(records, "compile_function", no_second_compile)
    path = runs.run_case_study(tmp_path, trials=1, compile_check=False, densities=(), size="small")
    (record,) = records.read_records(path)
    assert record["compile_ms"] == checked.compile_ms and record["device_kind"]
    assert "[case study 1/1] xla (dense)" in capsys.readouterr().out
    assert not runs._COMPILED  # taken out once timed
