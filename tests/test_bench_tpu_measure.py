"""stlib.bench.tpu_measure: the calls it times are the backward estimate's, it refuses to time off a
TPU, and it pairs each measurement with the estimate of the same call and kernel source."""

from __future__ import annotations

import pytest

from stlib.bench import tpu_measure


def test_the_cases_are_the_backward_estimates_calls():
    cases = tpu_measure.cases("v5e")
    tile = [c for c in cases if c["impl"] != "splash"]
    assert sorted(c["mask"] for c in tile) == sorted(
        ["band (density 0.25)", "sliding tile, 3-D tiled order", "full"]
    )
    splash = [c for c in cases if c["impl"] == "splash"]
    assert [c["options"] for c in splash] == [{"fused_backward": True}, {"fused_backward": False}]


def test_timing_off_a_tpu_is_refused_in_one_sentence():
    with pytest.raises(
        RuntimeError, match="times kernels on a TPU of the chip table; this process sees 'cpu'"
    ):
        tpu_measure.run()
    with pytest.raises(RuntimeError, match="on a TPU"):
        tpu_measure.sweep()


def test_a_measurement_meets_the_estimate_of_its_own_call_and_kernel_source():
    """``sweep_rows``: the sweep's record of the same configuration, only where the kernel source
    matches; its bundles-only estimate is every path's bundles x count at the sweep's clock, glue added."""
    swept = {
        "chip": "v5e", "family": "dense", "impl": "k", "block_q": 1024, "block_kv": 2048,
        "block_kv_compute": 256, "cycles": 300, "total_ms": 3.0, "glue_ms": 0.5, "clock_hz": 1e5,
        "source": "s", "breakdown": {"kernel": {"step": {"bundles": 10, "count": 5}, "compute_full": {"bundles": 70, "count": 1}}},
    }  # fmt: skip
    measured = {
        key: swept[key] for key in ("chip", "family", "impl", "block_q", "block_kv", "block_kv_compute")
    }
    (row,) = tpu_measure.sweep_rows([{**measured, "median_ms": 2.0, "source": "s"}], [swept])
    assert row["measured_ms"] == 2.0 and row["estimated_ms"] == 3.0
    assert row["bundles_only_ms"] == pytest.approx(120 / 1e5 * 1e3 + 0.5)
    assert row["program_bundles"] == 80 and not row["slow"]
    (late,) = tpu_measure.sweep_rows(
        [{**measured, "median_ms": 2.0, "source": "s"}], [{**swept, "glue_ms": 0.0}]
    )
    assert late["slow"]  # 2.0 ms against a bundles-only 1.2 ms: over SLOW = 1.5 times
    assert tpu_measure.sweep_rows([{**measured, "median_ms": 2.0, "source": "older"}], [swept]) == []
