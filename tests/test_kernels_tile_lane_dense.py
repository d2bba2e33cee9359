"""``pallas_tile_lane_dense`` (keys on sublanes, one pass, per-step kinds): interpret mode against the
reference on dense, band, sliding-tile (3-D tiled order) and per-head masks at ragged lengths, in f32
and bf16; blocks refused before compiling; its step tables and schedule counts; the attribution of
a step region with copy regions beside it (the per-head SVG mix at long videos compiles in
``python -m stlib.bench.backward_compile run --long-videos``, not here).

Tolerances: conftest's kernel table (f32 2e-5; bf16 3e-2, p rounded to bf16 before p.v).
"""

from __future__ import annotations

import re

import jax.numpy as jnp
import pytest
from _kernels import assert_close

import stlib
from stlib import checks, masks
from stlib.kernels import tile_lane_dense as ld
from stlib.kernels.tile_lane_dense import StepKind

IMPL = ld.NAME


# (block_q, block_kv, options): the one-chunk form, and inner chunks with register tiles that do not
# divide the chunk (the last one shorter)
BLOCKS = [(128, 128, {}), (128, 256, {"block_kv_compute": 128, "block_kv_register": 48})]


@pytest.mark.parametrize("length", [300, 1000])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("mask_name", ["dense", "band", "per-head"])
@pytest.mark.parametrize("blocks", BLOCKS, ids=["128x128", "128x256/128/48"])
def test_matches_reference_ragged(length, dtype, mask_name, blocks):
    block_q, block_kv, options = blocks
    mask = {
        "dense": None,
        "band": masks.band(length, 70),
        "per-head": masks.per_head([masks.band(length, 40), masks.full(length)]),
    }[mask_name]
    q, k, v = stlib.random_qkv((2, length, 128), dtype, seed=length)
    ref = stlib.attention(q, k, v, mask, impl="reference")
    out = stlib.attention(
        q, k, v, mask, impl=IMPL, block_q=block_q, block_kv=block_kv, options=options, interpret=True
    )
    assert out.dtype == q.dtype and out.shape == q.shape
    assert_close(out, ref, checks.tolerance(dtype), mask=mask)


def test_step_kinds_split_full_ragged_masked():
    length = 1000  # 1000 % 256 = 232 real keys in the last kv block
    layout = stlib.block_layout(masks.band(length, 300), 128, 256)
    steps = ld.plan_steps(layout, length, 0)  # patterns off: the three fixed kinds
    kinds = steps.codes
    assert set(steps.present) == {StepKind.FULL, StepKind.RAGGED, StepKind.MASKED}
    assert (kinds[..., :-1] != StepKind.RAGGED).all()  # only the last kv block is ragged
    assert ((kinds == StepKind.MASKED) == (layout.kinds == 1)).all()  # exact: PARTIAL tiles are masked
    _, counts = steps.tables()
    assert (counts == (kinds >= 0).sum(axis=2)).all()
    assert ld.kernel_name(ld.KERNEL_PREFIX, steps.present) == "stlib_tile_ld_full_ragged_masked"
    regions = ld.IMPLEMENTATION.estimator.compute_regions
    assert regions("stlib_tile_ld_full_masked.3", 2) == ["compute_full", "compute_masked"]
    assert regions("stlib_tile_ld_full_p0_p1.2", 3) == [
        "compute_full",
        "compute_pattern0",
        "compute_pattern1",
    ]
    with pytest.raises(ValueError, match="names no step kind"):
        regions("stlib_tile_ld_full_q7.1", 2)


def test_sliding_tile_in_tiled_order():
    grid = stlib.VideoGrid(3, 5, 16)  # ragged against the 2x2x8 tile: the tiled order has padding slots
    tile = (2, 2, 8)
    mask = masks.sliding_tile(grid, tile, (1, 3, 1))
    order = stlib.tiled_order(grid, tile)
    assert order.length > grid.num_tokens
    for dtype in (jnp.float32, jnp.bfloat16):
        q, k, v = stlib.random_qkv((2, grid.num_tokens, 128), dtype, seed=5)
        ref = stlib.attention(q, k, v, mask, impl="reference")
        out = stlib.video_attention(
            q, k, v, grid, mask, impl=IMPL, orders=order, block_q=128, block_kv=128, interpret=True
        )
        assert_close(out, ref, checks.tolerance(dtype), mask=mask)


def test_sliding_tile_rows_of_tiles_run_as_patterns():
    """Blocks that hold a row of five 2x4x16 tiles (640 tokens): every block is PARTIAL, but at the
    grain of one tile (128) every sub-tile is EMPTY or FULL, so each block runs as a pattern (the
    w-window of three tiles, clamped at the edges: 15 of 25 sub-tiles), mask-free; kv blocks at the
    padded h edge (14 rows in tiles of 4) mask their padding slots by key. Same output as the
    reference, and as the same kernel with patterns off (every block MASKED)."""
    grid = stlib.VideoGrid(4, 14, 80)
    tile = (2, 4, 16)
    mask = masks.sliding_tile(grid, tile, (1, 3, 3))  # two tiles along t, each its own window
    order = stlib.tiled_order(grid, tile)
    layout = stlib.block_layout(mask.permute(order), 640, 640)
    steps = ld.plan_steps(layout, order.length)
    assert layout.kind_counts()["FULL"] == 0 and not (steps.codes == StepKind.MASKED).any()
    window = ((1, 1, 0, 0, 0), (1, 1, 1, 0, 0), (1, 1, 1, 1, 1), (0, 0, 1, 1, 1), (0, 0, 0, 1, 1))
    assert {(p.grain, p.rows, p.padded) for p in steps.patterns} == {
        (128, window, False),
        (128, window, True),
    }
    assert ld.kernel_name(ld.KERNEL_PREFIX, steps.present) == "stlib_tile_ld_p0_p1"
    work = ld.lane_dense_work(layout, 1, 128)
    assert work.executed_flops == 4.0 * 128 * int((steps.codes >= 0).sum()) * 15 * 128**2
    off = ld.lane_dense_work(layout, 1, 128, {"pattern_grain": 0})
    assert off.executed_flops == 4.0 * 128 * int((steps.codes >= 0).sum()) * 640**2
    for dtype in (jnp.float32, jnp.bfloat16):
        q, k, v = stlib.random_qkv((1, grid.num_tokens, 128), dtype, seed=7)
        ref = stlib.attention(q, k, v, mask, impl="reference")
        for opt in ({}, {"pattern_grain": 0}):
            out = stlib.video_attention(
                q,
                k,
                v,
                grid,
                mask,
                impl=IMPL,
                orders=order,
                block_q=640,
                block_kv=640,
                options=opt,
                interpret=True,
            )
            assert_close(out, ref, checks.tolerance(dtype), mask=mask)


def test_pattern_updates_cover_each_computed_sub_tile_once():
    pattern = ld.Pattern(128, ((1, 0, 1), (2, 1, 1)), False)
    updates = pattern.updates(384, 256, 128)
    assert updates == [
        (0, 128, 0, 128, False),
        (0, 128, 256, 128, False),
        (128, 128, 128, 256, False),
        (128, 128, 0, 128, True),  # the PARTIAL sub-tile: masked, alone
    ]
    assert (pattern.sub_tiles, pattern.masked_sub_tiles, pattern.cost()) == (5, 1, 6 * 128**2)
    assert ld.Pattern(256, ((1, 1), (1, 1)), True).updates(512, 512, 128) == [
        (0, 128, 0, 512, False),
        (128, 128, 0, 512, False),
        (256, 128, 0, 512, False),
        (384, 128, 0, 512, False),
    ]  # all FULL: whole-tile chunks
    with pytest.raises(ValueError, match="pattern grain=192 must be a multiple of 128"):
        ld.plan_steps(stlib.block_layout(masks.band(1024, 100), 384, 384), 1024, 192)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_band_edges_run_as_mixed_patterns(dtype):
    """A band's edge blocks cut into sub-tiles: the EMPTY ones skipped, the FULL ones mask-free, only
    the PARTIAL diagonal masked; the same output as the reference and as whole MASKED blocks, with
    fewer pairs computed."""
    length = 2048
    mask = masks.per_head([masks.band(length, 300), masks.band(length, 700)])
    layout = stlib.block_layout(mask, 512, 512)
    steps = ld.plan_steps(layout, length)
    assert steps.patterns and any(p.masked_sub_tiles for p in steps.patterns)
    assert any(p.sub_tiles < (512 // p.grain) ** 2 for p in steps.patterns)  # EMPTY sub-tiles skipped
    assert (
        ld.lane_dense_work(layout, 2, 128).executed_flops
        < ld.lane_dense_work(layout, 2, 128, {"pattern_grain": 0}).executed_flops
    )
    q, k, v = stlib.random_qkv((2, length, 128), dtype, seed=9)
    ref = stlib.attention(q, k, v, mask, impl="reference")
    for options in ({}, {"pattern_grain": 0}):
        out = stlib.attention(
            q, k, v, mask, impl=IMPL, block_q=512, block_kv=512, options=options, interpret=True
        )
        assert_close(out, ref, checks.tolerance(dtype), mask=mask)


def test_a_chips_program_budget_keeps_the_patterns_that_save_most(monkeypatch):
    """On a chip with a program budget (``steps.program_pairs``) a plan keeps the patterns that save
    the most work while their regions' code fits it, the rest stay MASKED, and the output is the
    reference's; a chip without one keeps them all."""
    from stlib.kernels import steps as steps_module

    length = 2048
    mask = masks.per_head([masks.band(length, 300), masks.band(length, 700)])
    layout = stlib.block_layout(mask, 512, 512)
    base = steps_module.base_codes(layout, length)
    free = ld.plan_steps(layout, length, chip="v6e")
    assert len(free.patterns) >= 2
    saved = {
        p: int((free.codes == ld.FIRST_PATTERN + n).sum()) * (2 * 512 * 512 - p.cost())
        for n, p in enumerate(free.patterns)
    }
    best = max(saved, key=saved.get)
    budget = steps_module.code_pairs(layout, base, [best], covered=0)
    monkeypatch.setattr(steps_module, "program_pairs", lambda chip, rate: budget if chip == "v5e" else None)
    kept = ld.plan_steps(layout, length, chip="v5e")
    assert kept.patterns == (best,)
    assert steps_module.code_pairs(layout, base, kept.patterns, covered=0) <= budget
    cut = [n for n, p in enumerate(free.patterns) if p != best]
    assert (kept.codes[free.codes == ld.FIRST_PATTERN + cut[0]] == StepKind.MASKED).all()
    q, k, v = stlib.random_qkv((2, length, 128), jnp.float32, seed=3)
    out = stlib.attention(
        q, k, v, mask, impl=IMPL, block_q=512, block_kv=512, options={"chip": "v5e"}, interpret=True
    )
    assert_close(
        out, stlib.attention(q, k, v, mask, impl="reference"), checks.tolerance(jnp.float32), mask=mask
    )


@pytest.mark.parametrize(
    "blocks, rate",
    [((1024, 2048), "FORWARD_CODE"), ((1024, 1024), "BACKWARD_CODE")],
    ids=["forward", "backward"],
)
def test_the_v5e_budget_cuts_frame_causals_patterns_and_keeps_the_bands(blocks, rate):
    """At the case study on a v5e (the forward's 1,024 x 2,048 and the backward's step-coded 1,024 x
    1,024): the band 0.25's plan is the one it had without a budget (it ran at pace), frame causal's
    (eleven regions; a forward of 886.7 ms measured) keeps fewer patterns, its code within the
    budget of its kernel's code rate."""
    from stlib.bench.same_mask import catalogue_mask
    from stlib.kernels import steps as steps_module

    rate = getattr(steps_module, rate)
    for name, cut in (("band (density 0.25)", False), ("frame causal", True)):
        mask = catalogue_mask(name, 10)
        layout = stlib.block_layout(mask, *blocks)
        free, v5e = (ld.plan_steps(layout, mask.length, chip=chip, rate=rate) for chip in (None, "v5e"))
        assert (len(v5e.patterns) < len(free.patterns)) == cut, name
        covered = int((v5e.codes >= ld.FIRST_PATTERN).sum())
        code = steps_module.code_pairs(
            layout, steps_module.base_codes(layout, mask.length), v5e.patterns, covered
        )
        assert code <= steps_module.program_pairs("v5e", rate), name


def test_scores_issued_ahead_change_the_order_not_the_result():
    """``lookahead``: the order in which a step's k q^T products are issued, nothing else: bit-identical
    outputs and lse for every lookahead, on a mask whose steps cover every region (FULL, RAGGED, MASKED,
    patterns with masked sub-tiles)."""
    length = 1000  # ragged: 1000 % 256 = 232 keys in the last kv block
    mask = masks.per_head([masks.band(length, 300), masks.causal(length)])
    steps = ld.plan_steps(stlib.block_layout(mask, 256, 256), length)
    present = set(steps.present)
    assert {StepKind.FULL, StepKind.RAGGED, StepKind.MASKED} <= present and max(present) >= ld.FIRST_PATTERN
    q, k, v = stlib.random_qkv((2, length, 128), jnp.float32, seed=4)
    runs = {
        ahead: ld.lane_dense_attention(
            q,
            k,
            v,
            steps,
            scale=128**-0.5,
            options=ld.LaneDenseOptions(block_kv_compute=128, block_kv_register=64, lookahead=ahead),
            interpret=True,
            return_lse=True,
        )
        for ahead in (0, 1, None)
    }
    for out, lse in runs.values():
        assert (out == runs[0][0]).all() and (lse == runs[0][1]).all()
    assert_close(
        runs[None][0],
        stlib.attention(q, k, v, mask, impl="reference"),
        checks.tolerance(jnp.float32),
        mask=mask,
    )


def test_queries_per_fold_change_the_grouping_not_the_result():
    """``block_q_compute``: each fold holds the scores of one slice of the q lanes; on a mask whose
    steps cover every region (FULL, RAGGED with a sliced last chunk, MASKED, patterns with masked
    sub-tiles), every slice width gives the reference's output and the whole tile's lse."""
    length = 1000
    mask = masks.per_head([masks.band(length, 300), masks.full(length)])
    steps = ld.plan_steps(stlib.block_layout(mask, 512, 256), length)
    present = set(steps.present)
    assert {StepKind.FULL, StepKind.RAGGED, StepKind.MASKED} <= present and max(present) >= ld.FIRST_PATTERN
    q, k, v = stlib.random_qkv((2, length, 128), jnp.float32, seed=6)
    ref = stlib.attention(q, k, v, mask, impl="reference")
    runs = {
        width: ld.lane_dense_attention(
            q,
            k,
            v,
            steps,
            scale=128**-0.5,
            options=ld.LaneDenseOptions(block_kv_compute=128, block_q_compute=width),
            interpret=True,
            return_lse=True,
        )
        for width in (None, 128, 384)  # 384: the last slice of a 512-query tile is narrower
    }
    for out, lse in runs.values():
        assert_close(out, ref, checks.tolerance(jnp.float32), mask=mask)
        assert jnp.allclose(lse, runs[None][1], atol=1e-5, rtol=1e-6)
    with pytest.raises(ValueError, match="block_q_compute=100 must be None or a positive multiple of 128"):
        ld.LaneDenseOptions(block_q_compute=100)


def test_bf16_probabilities_error_is_within_the_bf16_tolerance():
    """bf16 p into p.v (the default) against f32 p, both on the same bf16 inputs: the rounding of p
    costs about as much as the output's own bf16 rounding (measured here: both well under 3e-2)."""
    q, k, v = stlib.random_qkv((2, 512, 128), jnp.bfloat16, seed=11)
    ref = stlib.attention(
        q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32), None, impl="reference"
    )
    errors = {}
    for bf16 in (True, False):
        out = stlib.attention(
            q, k, v, None, impl=IMPL, block_q=128, block_kv=256, options={"bf16_probs": bf16}, interpret=True
        )
        errors[bf16] = assert_close(out, ref, checks.tolerance(jnp.bfloat16), dtype=q.dtype)
    assert errors[True] <= 4 * max(errors[False], 2**-9)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"block_q": 100}, "block_q=100 must be a positive multiple of 8"),
        ({"block_kv": 200}, "block_kv=200 must be a"),
        (
            {"options": {"block_kv_compute": 384}},
            "block_kv_compute=384 must be a multiple of 128 dividing block_kv=512",
        ),
        ({"options": {"block_kv_compute": 100}}, "block_kv_compute=100 must be a multiple of 128"),
        ({"options": {"block_kv_register": 12}}, "block_kv_register=12 must be a multiple of 8"),
        ({"options": {"chip": "v9"}}, "chip='v9' must be one of"),
        ({"options": {"lookahead": -1}}, "lookahead=-1 must be >= 0"),
        (
            {"options": {"pattern_grain": 100}},
            "pattern_grain=100 must be None, 0 or a positive multiple of 128",
        ),
    ],
)
def test_bad_blocks_and_options_are_refused_by_name(kwargs, message):
    q, k, v = stlib.random_qkv((1, 1024, 128), jnp.float32, seed=0)
    call = {"block_q": 128, "block_kv": 512, **kwargs}
    with pytest.raises(ValueError, match=re.escape(message)):
        stlib.attention(q, k, v, None, impl=IMPL, interpret=True, **call)


def test_compiled_blocks_need_lanes_and_fit_vmem():
    with pytest.raises(ValueError, match="block_q=64 must be a multiple of 128"):
        ld.check_blocks((64, 512, 512, 256, 128, 2), "v6e")
    ld.check_blocks((64, 512, 512, 256, 128, 2), "v6e", compiled=False)  # interpret mode: any multiple of 8
    limit = ld.vmem_limit("tpu7x")
    assert limit == int(64 * 2**20 * ld.VMEM_SHARE) and ld.vmem_limit(None) == limit  # the smallest chip
    with pytest.raises(ValueError, match=f"the limit on tpu7x is {limit:,}"):
        ld.check_blocks((8192, 8192, 2048, 256, 128, 2), "tpu7x")
    assert ld.check_blocks((1024, 2048, 512, 256, 128, 2), "v6e") == ld.vmem_limit("v6e")


def test_the_default_lookahead_issues_every_chunk_ahead_that_fits_vmem():
    sizes = (4096, 4096, 256, 256, 128, 2)  # 16 chunks: all their scores are 64 MiB of f32
    assert ld.fit_lookahead(*sizes, chip="v6e") == 15  # 96 MiB: every later chunk
    ahead = ld.fit_lookahead(*sizes, chip="tpu7x")  # 48 MiB: fewer
    limit = ld.vmem_limit("tpu7x")
    assert 0 < ahead < 15
    assert ld.vmem_bytes(*sizes, lookahead=ahead) <= limit < ld.vmem_bytes(*sizes, lookahead=ahead + 1)
    assert ld.vmem_bytes(*sizes, lookahead=None) == ld.vmem_bytes(*sizes, lookahead=15)
    assert (
        ld.fit_lookahead(*sizes, chip="tpu7x", fold_lanes=256) == 15
    )  # folds of 256 queries: 4 MiB of scores
    assert ld.check_blocks(sizes, "tpu7x", lookahead=ahead) == limit
    with pytest.raises(ValueError, match="lookahead None"):
        ld.check_blocks(sizes, "tpu7x")  # every chunk's scores at once: over TPU7x's limit


def test_default_blocks_fit_their_chip():
    for chip, blocks in ld.DEFAULT_BLOCKS.items():
        ld.check_blocks((blocks.block_q, blocks.block_kv, blocks.kv_chunk, 256, 128, 2), chip)


def test_schedule_counts_match_the_tables():
    from stlib.analysis.counts import Setup

    length = 1000
    mask = masks.band(length, 300)
    setup = Setup(
        IMPL, mask, length, 2, 128, 2, 128, 256, None, {"block_kv_compute": 128, "pattern_grain": 0}
    )
    attribution = type("Att", (), {"kernel": "stlib_tile_ld_full_ragged_masked.1"})()
    counts = ld.lane_dense_schedule_counts(setup, attribution)
    kinds = ld.plan_steps(setup.layout, length, 0).codes
    assert counts.paths["compute_full"] == 2 * int((kinds == StepKind.FULL).sum())
    assert counts.paths["init"] == counts.paths["finalise"] == counts.q_rows == 2 * kinds.shape[1]
    work = ld.lane_dense_work(setup.layout, 2, 128, setup.options)
    assert counts.grid_steps == work.grid_steps and not counts.writes_lse
    wrong = type("Att", (), {"kernel": "stlib_tile_ld_full.1"})()
    with pytest.raises(ValueError, match="step kinds make kernel"):
        ld.lane_dense_schedule_counts(setup, wrong)


# --------------------------------------------------------------------------------------------
# the attribution of a step region with conditional copy regions beside it (blocks ending past the
# array): a synthetic final_bundles dump


def _lane_dense_program():
    nop = ("", "", "")
    p = {
        0: ("%s0 = smov 0", "", ""),
        1: ("%s1 = smov 0", "", "Start region 1"),
        2: ("%s5 = sadd.s32 1, %s4", "LB", "Start region 10 :: Start region 11"),
        4: ("%9 = sbr.rel (%p1) target = $region20", "", ""),
        8: ("", "", "End region 11"),
        9: ("%20 = vst [vmem:[#allocation1]] %v0", "", "Start region 21"),  # copy region beside the step
        10: ("%21 = vst [vmem:[#allocation1 + $0x8]] %v0", "", "End region 21"),
        11: ("%s9 = smov 1", "PF", "Start/End empty region 20 :: Start region 13"),
        12: ("%10 = sbr.rel (%p2) target = $region30", "", ""),
        16: ("", "", "End region 13 :: Start region 14"),
        17: ("%11 = sbr.rel (%p3) target = $region40", "", ""),
        21: ("", "", "End region 14"),
        22: ("%22 = vst [vmem:[#allocation2]] %v0", "", "Start region 41"),  # init
        23: ("%23 = vst [vmem:[#allocation2 + $0x8]] %v0", "", ""),
        24: ("%24 = vst [vmem:[#allocation2 + $0x10]] %v0", "", "End region 41"),
        25: ("%s10 = smov 2", "PF", "Start/End empty region 40 :: Start region 15"),
        26: ("%12 = sbr.rel (%p4) target = $region50", "", ""),
        30: ("", "", "End region 15"),
        31: ("%v2 = vmatmul.mubr.bf16.gmra.mxu0 %v1", "", "Start region 51"),  # compute
        32: ("%v3 = vpow2.f32 %v2", "", ""),
        33: ("%v4 = vadd.f32 %v3, %v3", "", "End region 51"),
        34: ("%s11 = smov 3", "PF", "Start/End empty region 50 :: Start region 16"),
        35: ("%13 = sbr.rel (%p5) target = $region60", "", ""),
        39: ("", "", "End region 16"),
        40: ("%v5 = vrcp.f32 %v4", "", "Start region 61"),  # finalise
        41: ("%25 = vst [vmem:[#allocation3]] %v5", "", "End region 61"),
        42: ("%s12 = smov 4", "PF", "Start/End empty region 60 :: Start region 17"),
        43: ("%14 = sbr.rel (%p6) target = $region70", "", ""),
        47: ("", "", "End region 17"),
        48: ("%26 = vst [vmem:[#allocation4]] %v5", "", "Start region 71"),  # the output copy
        49: ("%27 = vst [vmem:[#allocation4 + $0x8]] %v5", "", "End region 71"),
        50: ("%s13 = smov 5", "PF", "Start/End empty region 70"),
        52: ("%s14 = smov 6", "PF", "Start/End empty region 30"),
        53: ("%p9 = scmp.ge.s32.totalorder %s5, 6 /* loop exit test */", "", ""),
        54: ("%15 = sbr.rel (!%p9) target = $region10", "", ""),
        58: ("", "", "End region 10"),
        59: ("%s15 = smov 0", "", ""),
    }
    return [p.get(i, nop) for i in range(60)]


def test_attribution_with_copy_regions_beside_the_step():
    from test_analysis_schedule import _analysis, _dump

    from stlib.analysis import attribution as A
    from stlib.analysis import schedule as S

    schedule = S.parse_schedule(_dump(_lane_dense_program()), _analysis(60))
    att = A.attribute(schedule, IMPL, "stlib_tile_ld_full.1")
    # grid loop 2..58 (57 bundles), step region 17..51 (35): the copy region 9..10 counts in "iteration";
    # the output copy after the finalise region adds to "finalise"
    assert att.trip == 6 and att.grid_steps == 4
    assert att.paths == {
        "call": 3,
        "iteration": 57 - 35,
        "step": 35 - 3 - 3 - 2 - 2,
        "init": 3,
        "compute_full": 3,
        "finalise": 4,
    }
    assert att.ops["finalise"] == {"eup": 1, "vmem": 3}


def test_every_chip_setting_is_one_row_of_one_table():
    """``chips.CHIP_SETTINGS``: a row per chip of the chip table, from the tuned JSONs and the fold
    widths; what the kernel, its block rule and its backward read (``settings``; None: v6e's)."""
    from stlib import tuned
    from stlib.device import CHIPS
    from stlib.kernels.tile_lane_dense import chips

    assert set(chips.CHIP_SETTINGS) == set(CHIPS)
    forward = tuned.load(ld.NAME)["chips"]
    backward = tuned.load(ld.BACKWARD_TUNED)["chips"]
    for chip, row in chips.CHIP_SETTINGS.items():
        assert list(row.blocks.__dict__.values()) == forward[chip]["blocks"]
        assert row.tiled_rows == tuple(
            forward.get(chip, {}).get("tiled_rows", forward[ld.ROWS_FROM]["tiled_rows"])
        )
        assert row.backward_blocks == tuple(backward.get(chip, {}).get("blocks", chips.BACKWARD_STEP_BLOCKS))
        assert ld.tiled_rows(chip) == row.tiled_rows
    assert chips.settings(None) is chips.CHIP_SETTINGS["v6e"]
    band = stlib.block_layout(masks.band(9000, 900), 4096, 4096)
    for chip in CHIPS:  # the backward's blocks come from the chip's row, capped by the forward's
        bq, bkv, grain = ld.backward_step_blocks(band, ld.LaneDenseOptions(), chip, False)
        want = chips.settings(chip).backward_blocks
        assert (bq, bkv) == (min(want[0], 4096), min(want[1], 4096)) and want[2] % grain == 0
