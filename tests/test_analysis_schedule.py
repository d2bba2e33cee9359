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


def test_an_unmarked_counter_compare_ends_a_loop():
    """A loop the compiler makes of a large VMEM copy tests its counter without the "loop exit
    test" comment: the unique compare of the branch's predicate gives the trip count."""
    program = _program()
    program[43] = ("%p9 = scmp.ge.s32.totalorder %s5, 6", "", "")
    (grid,) = S.parse_schedule(_dump(program), _analysis(50)).roots
    assert (grid.kind, grid.trip) == ("loop", 6)


@pytest.mark.parametrize(
    "change, message",
    [
        ({0: ("%s0 = sjmp 7", "", "")}, "unknown control op"),
        ({43: ("%p9 = scmp.eq.s32.totalorder %s5, 6", "", "")}, "loop exit test"),
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


def test_a_branch_inside_a_compute_region_counts_as_taken():
    """A branch the data decides (a conditional rescale) is charged on every execution of its
    region: the compute path is its 9 bundles once, the branch's body included."""
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
    schedule = S.parse_schedule(_dump(nested), _analysis(50))
    att = A.attribute(schedule, "splash", "x")
    plain = A.attribute(S.parse_schedule(_dump(_program()), _analysis(50)), "splash", "x")
    assert att.paths["compute"] == 31 - 23 + 1
    assert {k: v for k, v in att.paths.items() if k != "compute"} == {
        k: v for k, v in plain.paths.items() if k != "compute"
    }
    assert att.ops["compute"]["valu"] == 1  # the branch body's vadd


# --------------------------------------------------------------------------------------------
# the TPU7x form of the same program: six delay bundles behind a branch, the sixth closing its region,
# or a shorter shadow whose trailing empty delay slots are written as one empty bundle


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
    # two empty bundles behind a branch, either of which could end its shortened shadow: no guess
    program = _program_tpu7x()
    program[15] = ("", "", "")
    with pytest.raises(S.ScheduleFormatError, match=r"branch at 0xc: .*one reading"):
        S.parse_schedule(_dump(program), _analysis(53), form="tpu7x")


# --------------------------------------------------------------------------------------------
# real TPU7x schedules (libtpu 0.0.42.1, final_bundles of Splash's forward kernel) with shortened
# shadows: the delay converter writes a trailing run of empty delay slots as one empty bundle (its
# pre-delay utilization dump has six slots behind every branch). Lines verbatim except where marked;
# "..." elides bundles, and the excerpt is renumbered from 0 (``_excerpt``) to parse on its own.

# Splash MHA, 32 x 32 heads, head dim 256, causal, 8,192 tokens, blocks 512 / 1024, on tpu7x: a
# forward branch with two bundles of its region's ops moved up behind it (predicated on !%p18022_p0),
# then the empty bundle that ends the shadow; the grid loop's back-branch with one empty bundle.
_TPU7X_MHA_8K = """\
  0x26 LB: > { %31935 = sst [smem:[#allocation28_spill]] %s17706_s1 } /* Start region 145 */
  0xc9   : > { %506 = sbr.rel (%p18022_p0) target = $region36  ;;  %s18236_s27 = sand.u32 (!%p18022_p0), 1, %s17734_s24 /* smod.u32 w/div 2 */ }
  0xca   : > { %s13786_s13 = sshll.u32 (!%p18022_p0), %s18236_s27, 9  ;;  %s509_s28 = scalar_lea.sflag (!%p18022_p0), [#allocation6], %s18236_s27 }
  0xcb   : > { %s18240_s8 = scalar_lea.vmem (!%p18022_p0), [#allocation5], %s13786_s13  ;;  %p31998_p11 = scmp.ne.s32.totalorder (!%p18022_p0), %s31970_s5, 0 }
  0xcc   :  {}
  0xcd   : > { %17681 = dma.done.wait (%p31998_p11), %s509_s28, 8192 /* pipeline-emitter-dma-wait */ }
  0xce   : > { %17683 = vsyncadd (%p31998_p11), %s509_s28, 4294959104  ;;  %s31999_s3 = sld [smem:[#allocation47_spill]]  ;;  %s517_s16 = sand.u32 1, %s17923_s12 /* smod.u32 w/div 2 */ }
  0xcf   : > { %s519_s15 = sand.u32 1, %s17722_s21 /* smod.u32 w/div 2 */  ;;  %s518_s1 = scalar_lea.sflag [#allocation9], %s517_s16 }
...
 0xab3   : > { %17699 = vsyncadd (%p35669_p8), [#allocation13], 4294942720 } /* End region 35 */
 0xab4 PF: > { %s35670_s19 = sld [smem:[#allocation42_spill]]  ;;  %s35671_s9 = sld [smem:[#allocation33_spill]] } /* Start/End empty region 36 */
 0xab5   : > { %s35672_s25 = sld [smem:[#allocation50_spill]] }
...
 0xabb   : > { %p30367_p6 = scmp.ge.s32.totalorder %s41_s11, 4098 /* loop exit test */  ;;  %s35676_s18 = sld [smem:[#allocation30_spill]] }
 0xac2   : > { %s35689_s10 = sld [smem:[#allocation45_spill]]  ;;  %40 = sbr.rel (!%p30367_p6) target = $region145 } /* End region 3 */
 0xac3   :  {}
 0xac4   :  { %13590 = vsyncpa [#allocation6], 1 }
 0xac5   :  { %13592 = vsyncpa [#allocation6 + $0x1], 1 }
 0xac6   :  { %13593 = vsyncpa [#allocation9], 1 }
 0xac7   :  { %13595 = vsyncpa [#allocation9 + $0x1], 1 }
 0xac8   :  { %13596 = vsyncpa [#allocation7], 1 }
"""

# Splash GQA, 4 q heads sharing 2 kv heads, head dims 192 / 128, causal, 4,096 tokens, blocks 512 / 1024,
# on tpu7x (the configuration of test_analysis_estimate's TPU7x compile): the forward branch's delay
# slots are an empty one, a predicate-check op, an empty one, the check's last op (its region 33 was
# opened at 0x1c) and two empty ones, written as the one empty bundle 0x36.
_TPU7X_GQA_4K = """\
  0x1c LB: > { %29588 = sst [smem:[#allocation16_spill]] %s16374_s1 } /* Start region 117 :: Start region 33 :: Start region 34 */
  0x31   : > { %p354_p8 = scmp.eq.s32.totalorder %s353_s16, 0  ;;  %565 = sbr.rel (%p562_p7) target = $region36 }
  0x32   :  {}
  0x33   : > { %s16571_s0 = scalar_select /*predicate=*/%p354_p8, /*on_true=*/%s16382_s19, /*on_false=*/%s356_s17 /* copy for cssa */ }
  0x34   :  {}
  0x35   : > { %29603 = sst [smem:[#allocation28_spill]] %s16571_s0 } /* End region 33 */
  0x36   :  {}
  0x37   : > { %s28350_s27 = sand.u32 1, %s16378_s18 /* smod.u32 w/div 2 */  ;;  %s16575_s28 = sshll.u32 %s16390_s21, 6 } /* Start region 35 :: Start region 37 :: Start region 38 :: Start region 39 */
...
 0x850   : > { %16367 = vsyncadd (%p16542_p12), [#allocation8], 4294950912 } /* End region 35 */
 0x851 PF: > { %s32494_s8 = sld [smem:[#allocation22_spill]]  ;;  %s32495_s20 = sld [smem:[#allocation16_spill]] } /* Start/End empty region 36 */
...
 0x857   : > { %p32_p2 = scmp.ge.s32.totalorder %s35_s26, 130 /* loop exit test */  ;;  %s32498_s18 = sld [smem:[#allocation18_spill]] }
 0x85b   : > { %s32505_s25 = sld [smem:[#allocation27_spill]]  ;;  %34 = sbr.rel (!%p32_p2) target = $region117 } /* End region 3 */
 0x85c   :  {}
 0x85d   :  {}
 0x85e   :  {}
 0x85f   :  {}
 0x860   :  {}
 0x861   :  {} /* End region 4 :: End region 116 */
 0x862   :  { %12775 = vsyncpa [#allocation6], 1 }
"""
# (the loops' first bundles, 0x26 and 0x1c, are cut to their first op and their region marks: the rest
# is 2,000 characters of phi copies.)


def _excerpt(text: str) -> tuple[str, dict[int, int]]:
    """The excerpt as a dump the parser reads on its own: the key, then its bundles renumbered from 0
    (elisions dropped); and each original address's new one."""
    lines, new = [*S._KEY, ""], {}
    for line in text.splitlines():
        if line == "...":
            continue
        address, rest = line.split(maxsplit=1)
        new[int(address, 16)] = len(new)
        lines.append(f"{len(new) - 1:#x} {rest}")
    return "\n".join(lines) + "\n", new


def test_tpu7x_reader_reads_shortened_shadows_of_real_schedules():
    text, new = _excerpt(_TPU7X_MHA_8K)
    (loop,) = S.parse_schedule(text, form="tpu7x").roots
    # the back-branch's shadow is the one empty bundle 0xac3: the kernel's epilogue follows
    assert (loop.kind, loop.first, loop.last, loop.trip) == ("loop", new[0x26], new[0xAC3], 4098)
    (cond,) = loop.children
    # the branch at 0xc9 skips 0xcd..0xab3: 0xca and 0xcb (its region's ops, predicated) and the
    # empty 0xcc run on both paths
    assert (cond.kind, cond.branch, cond.first, cond.last, cond.predicate) == (
        "cond",
        new[0xC9],
        new[0xCD],
        new[0xAB3],
        "%p18022_p0",
    )
    text, new = _excerpt(_TPU7X_GQA_4K)
    (loop,) = S.parse_schedule(text, form="tpu7x").roots
    # the back-branch's six delay slots written out, the sixth closing its region 4
    assert (loop.first, loop.last, loop.trip) == (new[0x1C], new[0x861], 130)
    (cond,) = loop.children
    # the branch at 0x31 runs 0x32..0x36 on both paths (the check ends in 0x35) and skips 0x37..0x850
    assert (cond.branch, cond.first, cond.last, cond.predicate) == (
        new[0x31],
        new[0x37],
        new[0x850],
        "%p562_p7",
    )


def test_tpu7x_reader_refuses_a_shadow_it_cannot_end():
    for old, replacement in (
        # the forward branch's empty bundle filled: no empty bundle ends a shortened shadow
        ("  0xcc   :  {}", "  0xcc   : > { %s519_s15 = sand.u32 1, %s17722_s21 }"),
        # the back-branch's empty bundle filled
        (" 0xac3   :  {}", " 0xac3   :  { %13589 = vsyncpa [#allocation5], 1 }"),
    ):
        text, new = _excerpt(_TPU7X_MHA_8K.replace(old, replacement))
        branch = new[0xC9] if "0xcc" in old else new[0xAC2]
        with pytest.raises(S.ScheduleFormatError, match=f"branch at {branch:#x}: .*TPU7x forms"):
            S.parse_schedule(text, form="tpu7x")


def test_attribution_reads_operands_without_a_memory_space():
    # real entry-bundle ops of Splash (32 x 32 heads, head dim 256, causal, 1,024 tokens, blocks 1024 / 1024,
    # tpu7x): its one-element scalar-prefetch tables are passed in registers, "<no memory space>"
    entry = (
        "%s57831_s0 = inlined_call_operand.<no memory space> [shape: s8[1,1,1], index: 0, kind: input, "
        "shape index: {}] /* operand 0 */  ;;  %s57834_s3 = inlined_call_operand.hbm [shape: bf16[32,1024,256], "
        "index: 3, kind: input, shape index: {}]"
    )
    assert A._OPERAND.findall(entry) == [
        ("<no memory space>", "s8", "1,1,1", "0", "input"),
        ("hbm", "bf16", "32,1024,256", "3", "input"),
    ]
