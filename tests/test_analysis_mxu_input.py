"""What an MXU is fed (stlib.analysis.mxu_input): rows per op by element type, the compiler's MXU
occupancy read from its per-bundle utilization dump, the busiest MXU's input per path, and a path
that takes longer to feed than to issue."""

from __future__ import annotations

import pytest

from stlib.analysis import attribution as A
from stlib.analysis import mxu_input as M
from stlib.analysis import schedule as S
from stlib.analysis.kernel_estimate import path_cycles
from tests.test_analysis_schedule import _analysis, _dump, _program

_HEADER = "== CAPACTIY:\nMXU, XLU, VALU, VPOP, EUP, VLOAD, VLOAD:FILL, VSTORE, VSTORE:SPILL, SALU\n    2     2     4     2     1     3     3     2     2     2\n"


def _utilization(mxu_busy: list[int]) -> str:
    rows = "\n".join(f"{m} 0 0 0 0 0 0 0 0 1" for m in mxu_busy)
    return f"{_HEADER}== UTILIZATION:\n{rows}\n"


def _fed_program():
    """The synthetic program with a matmul on mxu0 before the compute region's inner loop (4 trips)
    and, in the loop body, a matmul and two weight pushes on mxu0 and one f32 matmul on mxu1."""
    program = _program()
    ops = (
        "%v7 = vmatmul.mubr.bf16.gmra.mrb[4].mxu0 %v1  ;;  %8 = vmatpush1.bf16.msra.mxu0 %v2  ;;  "
        "%9 = vmatpush3.bf16.xpose.msra.mxu0 %v3  ;;  %v10 = vmatmul.mubr.f32.gmra.mxu1 %v4"
    )
    program[27] = (ops, "", "")
    return program


def test_rows_follow_the_register_element_type():
    assert M.register_rows(_fed_program()[27][0]) == {"mxu0": (16, 32), "mxu1": (8, 0)}
    assert M.register_rows("%v1 = vadd.f32 %v2, %v3") == {}
    with pytest.raises(S.ScheduleFormatError, match="element type"):
        M.register_rows("%v1 = vmatmul.mubr.s4.gmra.mxu0 %v2")


def test_a_path_takes_as_long_as_its_busiest_mxu_is_fed():
    text = _dump(_fed_program())
    schedule = S.parse_schedule(text, _analysis(50))
    # the compiler holds the MXUs busy for 20 bundle-units over 40 multiplied rows: 0.5 cycles a row
    busy = [0] * 50
    for i in range(23, 33):
        busy[i] = 2
    occupancy = M.parse_utilization(_utilization(busy), 50)
    att = A.attribute(schedule, "splash", "splash_synthetic", occupancy=occupancy)
    assert M.KernelMxu.of(schedule, occupancy).rate == pytest.approx(20 / 40)
    # compute: mxu0 16 rows before the loop + 4 trips x (16 multiplied + 32 pushed) = 208 rows x 0.5;
    # mxu1: 4 x 8 rows x 0.5 = 16 cycles
    assert att.mxu_cycles == {"compute": 104}
    assert att.paths["compute"] == 30
    cycles = path_cycles(att)
    assert cycles["compute"] == 104 and cycles["init"] == att.paths["init"]
    # without the dump's utilization the paths are their bundles alone
    plain = A.attribute(schedule, "splash", "splash_synthetic")
    assert plain.mxu_cycles == {} and path_cycles(plain) == plain.paths


def test_the_utilization_dump_must_match_the_schedule():
    with pytest.raises(S.ScheduleFormatError, match="49 rows for 50 bundles"):
        M.parse_utilization(_utilization([0] * 49), 50)
    with pytest.raises(S.ScheduleFormatError, match="capacity header"):
        M.parse_utilization("== UTILIZATION:\n0 0\n", 1)


@pytest.mark.tpu_compile
def test_splash_backward_is_charged_its_mxu_feed_and_its_forward_its_bundles():
    # the call notebook 10 prints (its estimates are in the seed the main job keeps)
    import stlib

    call = {"num_heads": 4, "num_kv_heads": 1, "head_dim": 128, "length": 2048}
    call["block_sizes"] = {"block_q": 1024, "block_kv": 1024}
    forward = stlib.static_estimate("splash", "causal", "tpu7x", **call)
    backward = stlib.static_estimate("splash", "causal", "tpu7x", backward=True, **call)
    (fwd,) = forward.kernels
    (bwd,) = backward.kernels
    f, b = fwd.breakdown["compute"], bwd.breakdown["compute"]
    # the forward streams its 1,024-row q block through each weight tile: fed for less than it issues
    assert 0 < f["mxu"] < f["bundles"] and f["cycles"] == f["bundles"] * f["count"]
    # the dK/dV kernel streams 512-row kv chunks through q and dO weights: fed for longer
    assert b["mxu"] > b["bundles"] and b["cycles"] == b["mxu"] * b["count"]
    assert "MXU-fed" in str(backward) and "MXU-fed" not in str(forward)
