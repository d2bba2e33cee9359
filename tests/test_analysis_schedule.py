"""The schedule parser (stlib.analysis.schedule) and the attribution of its bundles to control paths
(stlib.analysis.attribution) on a synthetic final_bundles dump, and their loud failures on
formats and structures they do not know."""

from __future__ import annotations

import pytest

from stlib.analysis import attribution as A
from stlib.analysis import schedule as S

# --------------------------------------------------------------------------------------------
# a synthetic final_bundles dump: prologue, grid loop (trip 6 = 4 steps + 2) holding a step region
# with init / compute (an inner loop of 4 trips inside) / finalise regions, epilogue


def _bundle(address: int, body: str, marker: str = "", note: str = "") -> str:
    addr = f"{address:#x}" if address else "0"
    head = f"{marker}:" if marker else "  :"
    return f"  {addr:>5} {head} > {{ {body} }}" + (f" /* {note} */" if note else "")


def _program() -> list[tuple[str, str, str]]:
    nop = ("", "", "")
    p = {
        0: ("%s0 = smov 0", "", ""),
        1: ("%s1 = smov 0", "", "Start region 1"),
        2: ("%s5 = sadd.s32 1, %s4", "LB", "Start region 10 :: Start region 11"),
        3: ("%p1 = scmp.eq.s32.totalorder %s5, 0", "", ""),
        4: ("%9 = sbr.rel (%p1) target = $region20", "", ""),
        8: ("", "", "End region 11 :: Start region 12"),
        9: ("%10 = sbr.rel (%p2) target = $region30", "", ""),
        13: ("", "", "End region 12"),
        14: ("%20 = vst [vmem:[#allocation1]] %v0", "", "Start region 31"),
        15: ("%21 = vst [vmem:[#allocation1 + $0x8]] %v0", "", ""),
        16: ("%22 = vst [vmem:[#allocation1 + $0x10]] %v0", "", "End region 31"),
        17: ("%s9 = smov 1", "PF", "Start/End empty region 30 :: Start region 13"),
        18: ("%11 = sbr.rel (%p3) target = $region40", "", ""),
        22: ("", "", "End region 13"),
        23: ("%v2 = vmatmul.mubr.bf16.gmra.mxu0 %v1", "", "Start region 41"),
        24: ("%s21 = sadd.s32 1, %s20", "LB", "Start region 50"),
        25: ("%p5 = scmp.ge.s32.totalorder %s21, 4 /* loop exit test */", "", ""),
        26: ("%12 = sbr.rel (!%p5) target = $region50", "", ""),
        30: ("", "", "End region 50"),
        31: ("%v3 = vpow2.f32 %v2", "", "End region 41"),
        32: ("%s10 = smov 2", "PF", "Start/End empty region 40 :: Start region 14"),
        33: ("%13 = sbr.rel (%p4) target = $region60", "", ""),
        37: ("", "", "End region 14"),
        38: ("%v4 = vrcp.f32 %v3", "", "Start region 61"),
        39: ("%23 = vst [vmem:[#allocation2]] %v4", "", "End region 61"),
        40: ("%s11 = smov 3", "PF", "Start/End empty region 60"),
        42: ("%s12 = smov 4", "PF", "Start/End empty region 20"),
        43: ("%p9 = scmp.ge.s32.totalorder %s5, 6 /* loop exit test */", "", ""),
        44: ("%14 = sbr.rel (!%p9) target = $region10", "", ""),
        48: ("", "", "End region 10"),
        49: ("%s13 = smov 0", "", ""),
    }
    return [p.get(i, nop) for i in range(50)]


def _dump(program, key=S._KEY) -> str:
    lines = [*key, ""]
    for address, (body, marker, note) in enumerate(program):
        lines.append(_bundle(address, body, marker, note))
    return "\n".join(lines) + "\n"


def _analysis(n: int) -> str:
    return f"Schedule analysis:\n\ttotal scheduled bundles:    {n}\n\tempty scheduled bundles:    0\n"


def test_parser_attributes_synthetic_schedule():
    schedule = S.parse_schedule(_dump(_program()), _analysis(50))
    (grid,) = schedule.roots
    assert (grid.kind, grid.first, grid.last, grid.trip) == ("loop", 2, 48, 6)
    att = A.attribute(schedule, "splash", "splash_synthetic")
    assert att.trip == 6 and att.grid_steps == 4 and att.grid is None
    # step region: bundles 9..41 (33); init 14..16; compute 23..31 with 7 bundles x 4 trips inside
    assert att.paths == {
        "call": 3,
        "iteration": 47 - 33,
        "step": 33 - 3 - 9 - 2,
        "init": 3,
        "compute": 9 + 3 * 7,
        "finalise": 2,
    }
    assert att.ops["compute"]["mxu"] == 1 and att.ops["finalise"]["eup"] == 1


@pytest.mark.parametrize(
    "change, message",
    [
        ({0: ("%s0 = sjmp 7", "", "")}, "unknown control op"),
        ({43: ("%p9 = scmp.ge.s32.totalorder %s5, 6", "", "")}, "loop exit test"),
        ({8: ("", "", "")}, "delay slots"),
        ({9: ("%10 = sbr.rel (%p2) target = $region99", "", "")}, "never starts"),
        ({17: ("%s9 = smov 1", "", "Start/End empty region 30 :: Start region 13")}, "not a PF bundle"),
        ({3: ("%p1 = scmp.eq.s32.totalorder %s5, 0", "LH", "")}, "marker LH"),
    ],
)
def test_parser_fails_loudly_on_unknown_structure(change, message):
    with pytest.raises(S.ScheduleFormatError, match=message):
        S.parse_schedule(_dump(_program_with(change)), _analysis(50))


def _program_with(change):
    program = _program()
    for k, v in change.items():
        program[k] = v
    return program


def test_parser_fails_loudly_on_unknown_format():
    with pytest.raises(S.ScheduleFormatError, match="control-target key"):
        S.parse_schedule(_dump(_program(), key=S._KEY[:-2] + S._KEY[-1:]))
    with pytest.raises(S.ScheduleFormatError, match="schedule analysis counts 49"):
        S.parse_schedule(_dump(_program()), _analysis(49))
    with pytest.raises(S.ScheduleFormatError, match="total scheduled bundles"):
        S.parse_schedule(_dump(_program()), "Schedule analysis:\n\tbundles: 50\n")
    # a branch inside the compute region cannot be attributed to a path
    nop = ("", "", "")
    nested = _program_with(
        {
            24: ("%15 = sbr.rel (%p7) target = $region70", "", ""),
            25: nop,
            26: nop,
            28: ("", "", "End region 72"),
            29: ("%v9 = vadd.f32 %v2, %v2", "", ""),
            30: nop,
            31: ("%v3 = vpow2.f32 %v2", "PF", "Start/End empty region 70"),
        }
    )
    with pytest.raises(S.ScheduleFormatError, match="unattributed branch"):
        A.attribute(S.parse_schedule(_dump(nested), _analysis(50)), "splash", "x")


# --------------------------------------------------------------------------------------------
# the TPU7x form of the same program: a branch's region ends within six bundles behind it, or one
# empty delay bundle is followed by the conditional region's "Start region" (REFERENCE.md section 6)


def _program_tpu7x() -> list[tuple[str, str, str]]:
    op = ("%s30 = smov 0", "", "")
    p = {
        0: ("%s0 = smov 0", "", ""),
        1: ("%s1 = smov 0", "", "Start region 1"),
        2: ("%s5 = sadd.s32 1, %s4", "LB", "Start region 10 :: Start region 11"),
        3: ("%p1 = scmp.eq.s32.totalorder %s5, 0", "", ""),
        4: ("%9 = sbr.rel (%p1) target = $region20", "", ""),
        5: op,
        6: op,
        7: op,
        8: op,
        9: op,
        10: ("", "", "End region 11"),  # six bundles behind the branch
        11: ("%s6 = smov 1", "", "Start region 12"),
        12: ("%10 = sbr.rel (%p2) target = $region30", "", ""),  # one empty bundle, then the region
        14: ("%20 = vst [vmem:[#allocation1]] %v0", "", "Start region 31"),
        15: ("%21 = vst [vmem:[#allocation1 + $0x8]] %v0", "", ""),
        16: ("%22 = vst [vmem:[#allocation1 + $0x10]] %v0", "", "End region 31"),
        17: ("%s9 = smov 1", "PF", "Start/End empty region 30 :: Start region 13"),
        18: ("%11 = sbr.rel (%p3) target = $region40", "", ""),
        24: ("", "", "End region 13"),
        25: ("%v2 = vmatmul.mubr.bf16.gmra.mxu0 %v1", "", "Start region 41"),
        26: ("%s21 = sadd.s32 1, %s20", "LB", "Start region 50"),
        27: ("%p5 = scmp.ge.s32.totalorder %s21, 4 /* loop exit test */", "", ""),
        28: ("%12 = sbr.rel (!%p5) target = $region50", "", ""),
        34: ("", "", "End region 50"),
        35: ("%v3 = vpow2.f32 %v2", "", "End region 41"),
        36: ("%s10 = smov 2", "PF", "Start/End empty region 40 :: Start region 14"),
        37: ("%13 = sbr.rel (%p4) target = $region60", "", ""),
        39: ("%v4 = vrcp.f32 %v3", "", "Start region 61"),
        40: ("%23 = vst [vmem:[#allocation2]] %v4", "", "End region 61"),
        41: ("%s11 = smov 3", "PF", "Start/End empty region 60"),
        43: ("%s12 = smov 4", "PF", "Start/End empty region 20"),
        44: ("%p9 = scmp.ge.s32.totalorder %s5, 6 /* loop exit test */", "", ""),
        45: ("%14 = sbr.rel (!%p9) target = $region10", "", ""),
        51: ("", "", "End region 10"),
        52: ("%s13 = smov 0", "", ""),
    }
    return [p.get(i, ("", "", "")) for i in range(53)]


def test_parser_reads_the_tpu7x_form():
    schedule = S.parse_schedule(_dump(_program_tpu7x()), _analysis(53), form="tpu7x")
    (grid,) = schedule.roots
    assert (grid.kind, grid.first, grid.last, grid.trip) == (
        "loop",
        2,
        51,
        6,
    )  # six bundles behind the back-branch
    (stage,) = grid.children
    assert (stage.first, stage.last) == (11, 42)
    assert [(c.first, c.last) for c in stage.children] == [(14, 16), (25, 35), (39, 40)]
    att = A.attribute(schedule, "splash", "splash_synthetic_tpu7x")
    # compute 25..35 holds the inner loop 26..34 (9 bundles x 4 trips)
    assert att.paths == {
        "call": 3,
        "iteration": 50 - 32,
        "step": 32 - 3 - 11 - 2,
        "init": 3,
        "compute": 11 + 3 * 9,
        "finalise": 2,
    }
    assert att.ops["compute"]["mxu"] == 1 and att.ops["finalise"]["eup"] == 1


def test_chip_table_names_each_chips_branch_form():
    from stlib.device import CHIP_TABLE

    assert {c.name: c.schedule_form for c in CHIP_TABLE.values()} == {
        "v5e": "delay4",
        "v6e": "delay4",
        "tpu7x": "tpu7x",
    }
    assert all(c.schedule_form in S.BRANCH_FORMS for c in CHIP_TABLE.values())


def test_parser_refuses_unknown_forms():
    with pytest.raises(S.ScheduleFormatError, match="branch forms"):
        S.parse_schedule(_dump(_program_tpu7x()), _analysis(53), form="v9z")
    program = _program_tpu7x()
    program[10] = ("", "", "")  # no region end behind the branch, and no empty bundle + region start either
    with pytest.raises(S.ScheduleFormatError, match="TPU7x forms"):
        S.parse_schedule(_dump(program), _analysis(53), form="tpu7x")
    # the TPU7x program read as a v6e dump: its branches do not end a region four bundles later
    with pytest.raises(S.ScheduleFormatError, match="delay slots"):
        S.parse_schedule(_dump(_program_tpu7x()), _analysis(53))
