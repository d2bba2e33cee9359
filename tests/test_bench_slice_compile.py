"""The slice-compile records and their communication table (``stlib.bench.slice_compile``): the
HLO reader, the traffic model and the density where traffic meets the kernel, on hand-made records
and on the committed ones."""

from __future__ import annotations

import pytest

from stlib import paths
from stlib.bench import block_sweep, slice_compile

HLO = """
  %all_to_all.16 = bf16[1,8,192,128]{3,2,0,1:T(8,128)(2,1)S(1)} all-to-all(%bitcast.61), channel_id=1
  %fusion.3 = bf16[8,192,128]{2,1,0} fusion(%p0), kind=kLoop
  %all_to_all.2 = f32[10,75600,128]{2,1,0} all-to-all(%x), dimensions={0}
"""


def test_all_to_all_bytes_reads_each_all_to_all_of_the_hlo():
    assert slice_compile.all_to_all_bytes(HLO) == [8 * 192 * 128 * 2, 10 * 75600 * 128 * 4]
    assert slice_compile.all_to_all_bytes("%fusion = bf16[8]{0} fusion(%p)") == []


def test_the_traffic_model_counts_bytes_leaving_each_chip_both_ways():
    record = {"chip": "v6e", "mesh": {"heads": 4}, "all_to_all_bytes": [100e6] * 4}
    # a chip sends 3/4 of each of 4 x 100 MB and receives as much, at 800 GB/s both ways together
    assert slice_compile.all_to_all_seconds(record) == pytest.approx(2 * 4 * 100e6 * 0.75 / 800e9)
    tpu7x = {"chip": "tpu7x", "mesh": {"heads": 8}, "all_to_all_bytes": [100e6] * 4}  # 2 devices a chip
    assert slice_compile.all_to_all_seconds(tpu7x) == pytest.approx(2 * 2 * 4 * 100e6 * 0.75 / 1200e9)
    with pytest.raises(ValueError, match="no ICI bandwidth"):
        slice_compile.all_to_all_seconds({**record, "chip": "v5e"})


def test_the_crossing_density_lies_on_the_kernel_line():
    band, dense = 12e-3, 40e-3  # the line meets density 0 at 2.67 ms
    assert slice_compile.crossing_density(band, band, dense) == pytest.approx(0.25)
    assert slice_compile.crossing_density(dense, band, dense) == pytest.approx(1.0)
    assert slice_compile.crossing_density(1e-3, band, dense) < 0  # below the line's fixed cost


def test_cases_are_named_and_unknown_names_refused():
    names = [f"{s.name}-{strategy}" for s, strategy in slice_compile.cases()]
    assert len(names) == len(slice_compile.SLICES) * 2 and "v6e-4x4-ulysses" in names
    assert [s.name for s, _ in slice_compile.cases(["v6e-2x2-heads"])] == ["v6e-2x2"]
    with pytest.raises(ValueError, match="unknown cases"):
        slice_compile.cases(["v6e-8-heads"])


def test_the_committed_records_give_each_device_its_share_and_a_table_row():
    records = slice_compile.read(paths.REPO / slice_compile.RECORDS)
    assert {r["case"] for r in records} == {f"{s.name}-{st}" for s, st in slice_compile.cases()}
    for r in records:
        assert r["argument_bytes_per_device"] * r["devices"] == r["global_input_bytes"], r["case"]
        assert r["kernels_in_program"] == r["branches"] >= 1, r["case"]
        assert len(r["all_to_all_bytes"]) == (4 if r["strategy"] == "ulysses" else 0), r["case"]
    rows = slice_compile.table(records, block_sweep.read(paths.REPO / block_sweep.RECORDS))
    ulysses = [row for row in rows if row["case"].endswith("ulysses")]
    assert all(0 < row["all-to-all ms (model)"] < row["kernel ms, band 0.25 (est.)"] for row in ulysses)
    assert "| case |" in slice_compile.format_table(rows)
