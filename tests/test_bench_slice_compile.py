"""The slice-compile records and their communication table (``stlib.bench.slice_compile``): the
HLO reader and the chip shares (``stlib.bench.collectives``), the traffic model and the density
where traffic meets the kernel, on hand-made records and on the committed ones."""

from __future__ import annotations

import numpy as np
import pytest

from stlib import paths
from stlib.bench import block_sweep, collectives, slice_compile, slice_traffic

HLO = """
  %all_to_all.16 = bf16[1,8,192,128]{3,2,0,1:T(8,128)(2,1)S(1)} all-to-all(%bitcast.61), channel_id=1
  %fusion.3 = bf16[8,192,128]{2,1,0} fusion(%p0), kind=kLoop
  %all_to_all.2 = f32[10,75600,128]{2,1,0} all-to-all(%x), dimensions={0}
"""


def test_all_to_all_bytes_reads_each_all_to_all_of_the_hlo():
    assert collectives.all_to_all_bytes(HLO) == [8 * 192 * 128 * 2, 10 * 75600 * 128 * 4]
    assert collectives.all_to_all_bytes("%fusion = bf16[8]{0} fusion(%p)") == []


PERMUTES = """
  %collective-permute-start.2 = (bf16[5,512,128]{2,1,0:T(8,128)(2,1)}, bf16[5,512,128]{2,1,0:T(8,128)(2,1)S(1)}, u32[]{:S(2)}, u32[]{:S(2)}) collective-permute-start(%param.56), channel_id=1, source_target_pairs={{0,2},{1,3},{2,0},{3,1}}
  %collective-permute-done.2 = bf16[5,512,128]{2,1,0:T(8,128)(2,1)S(1)} collective-permute-done(%collective-permute-start.2)
  %collective-permute.7 = f32[4,256]{1,0} collective-permute(%x), channel_id=2, source_target_pairs={{0,1},{1,0}}
"""


def test_permute_bytes_reads_each_collective_permute_once():
    assert collectives.permute_bytes(PERMUTES) == [5 * 512 * 128 * 2, 4 * 256 * 4]  # starts, not dones
    assert collectives.permute_bytes(HLO) == []


def test_a_ring_costs_the_longer_of_its_traffic_and_its_kernel():
    ring = {"chip": "v6e", "mesh": {"ring": 4}, "permute_bytes": [50e6] * 6, "all_to_all_bytes": [],
            "permute_offchip": 1.0}  # fmt: skip
    assert slice_traffic.permute_seconds(ring) == pytest.approx(2 * 6 * 50e6 / 800e9)  # all to a neighbour
    record = {
        **ring, "case": "v6e-2x2-ring", "slice": "v6e-2x2", "strategy": "ring", "devices": 4, "hops_issued": [0, 1, 2, 3],
        "argument_bytes_per_device": 1, "global_input_bytes": 4, "compile_s": 1.0, "shape": [40, 75600, 128],
        "kernels_before_first_arrival": 1,  # the local hop computes while the first shard travels
    }  # fmt: skip
    sweep = [
        {"chip": "v6e", "family": family, "impl": block_sweep.NAME, "total_ms": ms, "shape": [10, 75600, 128]}
        for family, ms in (("dense", 40.0), (slice_traffic.SVG_FAMILY, 12.0))
    ]
    (row,) = slice_traffic.table([record], sweep)
    assert row["kernel ms, band 0.25 (est.)"] == pytest.approx(12.0)  # 10 heads' work per device
    assert row["band 0.25 ms (model)"] == pytest.approx(max(row["traffic ms (model)"], 12.0))
    assert row["hops issued"] == 4 and row["permutes"] == 6
    ulysses = {**record, "case": "v6e-2x2-ulysses", "strategy": "ulysses", "permute_bytes": [],
               "all_to_all_bytes": [100e6] * 4, "hops_issued": None, "all_to_all_offchip": 0.75}  # fmt: skip
    (row,) = slice_traffic.table([ulysses], sweep)
    assert row["band 0.25 ms (model)"] == pytest.approx(row["traffic ms (model)"] + 12.0)  # no overlap
    both = {**ulysses, "case": "v6e-2x2-ulysses-ring", "strategy": "ulysses-ring", "mesh": {"ulysses": 2, "ring": 2},
            "permute_bytes": [50e6] * 2, "permute_offchip": 1.0, "all_to_all_offchip": 0.5}  # fmt: skip
    (row,) = slice_traffic.table([both], sweep)
    exchanged, moved = slice_traffic.all_to_all_seconds(both), slice_traffic.permute_seconds(both)
    assert row["band 0.25 ms (model)"] == pytest.approx((exchanged + max(moved, 12e-3)) * 1e3)
    long = {**ulysses, "shape": [40, 219_600, 128]}  # a density's pairs grow with the square of L
    (row,) = slice_traffic.table([long], sweep)
    assert row["kernel ms, band 0.25 (est.)"] == pytest.approx(12.0 * (219_600 / 75_600) ** 2)


def test_a_ring_whose_local_hop_runs_last_exposes_one_hops_transfer():
    ring = {"chip": "v6e", "mesh": {"ring": 4}, "permute_bytes": [50e6] * 6, "all_to_all_bytes": [],
            "permute_offchip": 1.0, "case": "v6e-2x2-ring", "slice": "v6e-2x2", "strategy": "ring", "devices": 4,
            "hops_issued": [0, 1, 2, 3], "argument_bytes_per_device": 1, "global_input_bytes": 4, "compile_s": 1.0,
            "shape": [40, 75600, 128]}  # fmt: skip
    moved = slice_traffic.permute_seconds(ring)
    late = {**ring, "kernels_before_first_arrival": 0}
    assert slice_traffic.exposed_seconds(late, moved) == pytest.approx(moved / 3)  # one of three remote hops
    assert slice_traffic.exposed_seconds(ring, moved) == 0.0  # not counted: taken as overlapping
    assert slice_traffic.exposed_seconds({**ring, "kernels_before_first_arrival": 1}, moved) == 0.0
    sweep = [
        {"chip": "v6e", "family": family, "impl": block_sweep.NAME, "total_ms": ms, "shape": [10, 75600, 128]}
        for family, ms in (("dense", 40.0), (slice_traffic.SVG_FAMILY, 12.0))
    ]
    (row,) = slice_traffic.table([late], sweep)
    assert row["band 0.25 ms (model)"] == pytest.approx(moved / 3 * 1e3 + 12.0)  # the rest hides
    assert slice_traffic.modelled_ms(row, 0.25) == pytest.approx(row["band 0.25 ms (model)"])
    kernel_at_zero = 12.0 - 0.25 * (40.0 - 12.0) / 0.75  # the line's fixed cost, above the hidden permutes
    assert slice_traffic.modelled_ms(row, 0.0) == pytest.approx(moved / 3 * 1e3 + kernel_at_zero)


def test_a_training_steps_case_reads_the_forward_and_backward_estimates():
    from stlib.bench.backward_estimate import TILE_KERNEL

    steps = {
        ("v6e", TILE_KERNEL, mask, backward, "{}"): {"total_ms": ms, "estimated": True}
        for mask, backward, ms in (("full", False, 40.0), ("full", True, 100.0),
                                   ("band (density 0.25)", False, 12.0), ("band (density 0.25)", True, 30.0))
    }  # fmt: skip
    record = {"chip": "v6e", "mesh": {"heads": 4}, "permute_bytes": [], "all_to_all_bytes": [100e6] * 7,
              "all_to_all_offchip": 0.75, "case": "v6e-2x2-ulysses-train", "slice": "v6e-2x2",
              "strategy": "ulysses", "direction": "training", "devices": 4, "hops_issued": None,
              "argument_bytes_per_device": 1, "global_input_bytes": 4, "compile_s": 1.0,
              "shape": [40, 75600, 128]}  # fmt: skip
    (row,) = slice_traffic.table([record], [], steps)
    assert row["call"] == "training step"
    assert row["kernel ms, dense (est.)"] == pytest.approx(140.0)  # 10 heads' work, forward + backward
    assert row["kernel ms, band 0.25 (est.)"] == pytest.approx(42.0)
    (blind,) = slice_traffic.table([record], [])  # no step records: no kernel estimate
    assert blind["kernel ms, band 0.25 (est.)"] is None
    forward = {**record, "case": "v6e-2x2-ulysses", "direction": "forward", "all_to_all_bytes": [100e6] * 4}
    sweep = [{"chip": "v6e", "family": f, "impl": block_sweep.NAME, "total_ms": ms, "shape": [10, 75600, 128]}
             for f, ms in (("dense", 40.0), (slice_traffic.SVG_FAMILY, 12.0))]  # fmt: skip
    rows = slice_traffic.table([record, forward], sweep, steps)
    picks = slice_traffic.fastest(rows, (0.25,))
    assert [(p["call"], p["fastest"]) for p in picks] == [
        ("training step", ["ulysses"]),
        ("forward", ["ulysses"]),
    ]
    assert "| v6e-2x2 | 75,600 | training step |" in slice_traffic.format_fastest(picks)


def test_the_traffic_model_counts_bytes_leaving_each_chip_both_ways():
    record = {
        "chip": "v6e",
        "mesh": {"heads": 4},
        "all_to_all_bytes": [100e6] * 4,
        "all_to_all_offchip": 0.75,
    }
    # a chip sends 3/4 of each of 4 x 100 MB and receives as much, at 800 GB/s both ways together
    assert slice_traffic.all_to_all_seconds(record) == pytest.approx(2 * 4 * 100e6 * 0.75 / 800e9)
    tpu7x = {
        "chip": "tpu7x",
        "mesh": {"heads": 8},
        "all_to_all_bytes": [100e6] * 4,
        "all_to_all_offchip": 0.75,
    }
    assert slice_traffic.all_to_all_seconds(tpu7x) == pytest.approx(2 * 2 * 4 * 100e6 * 0.75 / 1200e9)
    on_chip = {"chip": "tpu7x", "mesh": {"ring": 2}, "permute_bytes": [100e6] * 2, "permute_offchip": 0.0}
    assert slice_traffic.permute_seconds(on_chip) == 0.0  # a ring of a chip's two devices crosses no ICI
    with pytest.raises(ValueError, match="no ICI bandwidth"):
        slice_traffic.all_to_all_seconds({**record, "chip": "v5e"})


def test_the_chip_shares_come_from_the_devices_chip_coordinates():
    """TPU7x 2x2x1: 8 devices on 4 chips, two a chip, in device order."""
    from jax.experimental import topologies
    from jax.sharding import Mesh

    devices = np.array(topologies.get_topology_desc(platform="tpu", topology_name="tpu7x:2x2x1").devices)
    flat = Mesh(devices, ("x",))
    assert collectives.all_to_all_offchip(collectives.chip_groups(flat, "x")) == pytest.approx(0.75)
    two = Mesh(devices.reshape(4, 2), ("ulysses", "ring"))  # the ring: a chip's two devices
    assert collectives.chip_groups(two, "ring").tolist() == [[0, 0], [1, 1], [2, 2], [3, 3]]
    assert collectives.permute_offchip(collectives.chip_groups(two, "ring"), [0, 1]) == 0.0
    assert collectives.all_to_all_offchip(collectives.chip_groups(two, "ulysses")) == pytest.approx(0.75)


def test_the_crossing_density_lies_on_the_kernel_line():
    band, dense = 12e-3, 40e-3  # the line meets density 0 at 2.67 ms
    assert slice_traffic.crossing_density(band, band, dense) == pytest.approx(0.25)
    assert slice_traffic.crossing_density(dense, band, dense) == pytest.approx(1.0)
    assert slice_traffic.crossing_density(1e-3, band, dense) < 0  # below the line's fixed cost


def test_cases_are_named_and_unknown_names_refused():
    names = [case.name for case in slice_compile.cases()]
    default = len(slice_compile.SLICES) * len(slice_compile.DEFAULT_STRATEGIES)
    assert len(names) == 2 * default  # the model shape and the longer clip
    assert "v6e-4x4-ulysses" in names and "v6e-4x4-ulysses-1min" in names
    assert "v6e-2x2-ring" not in names  # the ring's cases run by name
    assert not any(name.endswith("-train") for name in names)  # so do the training steps
    (step,) = slice_compile.cases(["v6e-4x4-ulysses-ring-train"])
    assert step.training and step.strategy == "ulysses-ring" and step.grid == slice_compile.MODEL_GRID
    assert [c.slice_.name for c in slice_compile.cases(["v6e-2x2-heads"])] == ["v6e-2x2"]
    (ring,) = slice_compile.cases(["tpu7x-2x2x1-ring"])
    assert (ring.slice_, ring.strategy, ring.grid) == (
        slice_compile.SLICES[1],
        "ring",
        slice_compile.MODEL_GRID,
    )
    (both,) = slice_compile.cases(["v6e-4x4-ulysses-ring"])
    assert both.mesh_axes() == ((2, 4, 2), ("batch", "ulysses", "ring"))
    with pytest.raises(ValueError, match="unknown cases"):
        slice_compile.cases(["v6e-8-heads"])


def test_the_committed_records_give_each_device_its_share_and_a_table_row():
    records = slice_compile.read(paths.REPO / slice_compile.RECORDS)
    assert {r["case"] for r in records} >= {case.name for case in slice_compile.cases()}
    for r in records:
        assert r["argument_bytes_per_device"] * r["devices"] == r["global_input_bytes"], r["case"]
        remote = len(r["hops_issued"]) - 1 if "ring" in r["strategy"] else 0
        if r.get("kernel_bodies") is not None:  # records since the count: one body per distinct kernel
            assert 1 <= r["kernel_bodies"] <= r["kernels_in_program"], r["case"]
        if r.get("direction", "forward") == "forward":
            # a ring's forward through one kernel (stlib.ring.shared_kernel): a call a hop issued, one
            # body; before it, and for heads and Ulysses: a call and a body a branch
            shared = "ring" in r["strategy"] and r.get("kernel_bodies") == 1 < r["branches"]
            calls = len(r["hops_issued"]) if shared else r["branches"]
            assert r["kernels_in_program"] == calls >= 1, r["case"]
            assert r.get("kernel_bodies") in (None, 1 if shared else r["branches"]), r["case"]
            assert len(r["all_to_all_bytes"]) == (4 if "ulysses" in r["strategy"] else 0), r["case"]
            assert len(r["permute_bytes"]) == 2 * remote, r[
                "case"
            ]  # k and v on each issued hop past the first
        else:  # q, k, v and do in; dq, dk, dv out (o is not an output of the step)
            if "ring" in r["strategy"] and r.get("kernel_bodies") is not None:
                # through the shared kernel: a forward and at least one backward call a hop issued,
                # one forward body and a backward body a kind of call for all the blocks
                assert r["kernels_in_program"] >= 2 * len(r["hops_issued"]), r["case"]
                assert 2 <= r["kernel_bodies"] < r["branches"], r["case"]
            else:
                assert r["kernels_in_program"] > r["branches"] >= 1, r["case"]  # the backward's kernels too
            assert len(r["all_to_all_bytes"]) == (7 if "ulysses" in r["strategy"] else 0), r["case"]
            assert len(r["permute_bytes"]) == 4 * remote, r["case"]  # k, v there once; dk, dv home
    rows = slice_traffic.table(records, block_sweep.read(paths.REPO / block_sweep.RECORDS))
    ulysses = [row for row in rows if row["case"].endswith("ulysses")]
    assert all(0 < row["traffic ms (model)"] < row["kernel ms, band 0.25 (est.)"] for row in ulysses)
    assert "| case |" in slice_traffic.format_table(rows)
