"""The static TPU time estimate (stlib.analysis.kernel_estimate): the libtpu pin, then self-consistency of
estimates from real deviceless compilations for v6e at small shapes (libtpu's dump, no TPU
needed)."""

from __future__ import annotations

import pytest

from stlib.analysis import PINNED_LIBTPU, ScheduleFormatError, cache_dir, dump, estimate


def test_libtpu_version_is_pinned(monkeypatch):
    monkeypatch.setattr(dump, "libtpu_version", lambda: "0.0.99")
    with pytest.raises(ScheduleFormatError, match="0.0.99"):
        estimate("pallas_dense", "none", "v6e", length=1024, num_heads=1, clock=1e9)


# --------------------------------------------------------------------------------------------
# real compilations (deviceless, v6e) at small shapes: 2 heads x 8,192 tokens x 128, bf16

SMALL = {"length": 8192, "clock": 1e9}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    import os

    old = os.environ.get("STLIB_CACHE_DIR")
    os.environ["STLIB_CACHE_DIR"] = str(tmp_path_factory.mktemp("estimate-cache"))
    yield
    if old is None:
        del os.environ["STLIB_CACHE_DIR"]
    else:
        os.environ["STLIB_CACHE_DIR"] = old


@pytest.mark.tpu_compile
def test_estimate_scales_with_grid_steps(cache):
    small = estimate("pallas_dense", "none", "v6e", num_heads=2, **SMALL)
    large = estimate("pallas_dense", "none", "v6e", num_heads=8, **SMALL)
    assert large.kernels[0].grid_steps == 4 * small.kernels[0].grid_steps
    assert large.cycles / small.cycles == pytest.approx(4.0, rel=0.05)
    assert large.seconds / small.seconds == pytest.approx(4.0, rel=0.05)


@pytest.mark.tpu_compile
def test_a_program_of_one_grid_step_is_read(cache):
    # one head x 1,024 tokens at the lane-dense kernel's default blocks: the compiler drops the grid loop
    one = estimate(
        "pallas_tile_lane_dense", "band (density 0.25)", "v6e", num_heads=1, length=1024, clock=1e9
    )
    (kernel,) = one.kernels
    assert kernel.grid_steps == 1 and kernel.breakdown["step"]["count"] == 1
    assert kernel.breakdown["iteration"]["bundles"] == 0 and kernel.breakdown["step"]["bundles"] > 1000
    # every bundle once (or its MXU input, where longer)
    assert kernel.cycles == sum(max(v["bundles"], v["mxu"]) for v in kernel.breakdown.values())
    assert "µs" in str(one) and "0.00 ms" not in str(one)


@pytest.mark.tpu_compile
def test_skipped_masked_and_full_steps(cache):
    est = estimate("pallas_block_sparse", "band (width 1500)", "v6e", num_heads=2, **SMALL)
    paths = est.path_bundles()
    # a skipped step pays only the grid-loop overhead: measured 0.12 of a FULL tile with the
    # lane-replicated softmax statistics (0.06 when the tile itself was twice as expensive)
    assert paths["skipped step"] < 0.2 * paths["FULL tile"]
    assert paths["masked tile"] > paths["FULL tile"]
    counts = {p: v["count"] for p, v in est.kernels[0].breakdown.items()}
    assert counts["compute_full"] + counts["compute_masked"] < counts["step"]  # some steps skipped
    assert est.kernels[0].dma_bytes > 0 or est.kernels[0].memory_seconds == 0
    tile = estimate("pallas_tile", "band (width 1500)", "v6e", num_heads=2, **SMALL)
    by_pass = {k.kernel.split(".")[0].removeprefix("stlib_tile_"): k.breakdown for k in tile.kernels}
    assert by_pass["masked"]["compute_masked"]["bundles"] > by_pass["full"]["compute_full"]["bundles"]


@pytest.mark.tpu_compile
def test_estimate_is_deterministic_and_cached(tmp_path, monkeypatch):
    """The same call estimated twice compiles once (the second reads the cache), and compiled again
    with ``use_cache=False`` gives the same schedule. The call is the smallest there is (one head of
    1,024 tokens, the dense kernel): what is cached does not depend on the kernel, and a larger call
    costs the test budget its compile time twice."""
    from stlib.analysis import cache as estimate_cache

    monkeypatch.setenv("STLIB_CACHE_DIR", str(tmp_path))
    compiles = []
    real = estimate_cache.compile_with_dump
    monkeypatch.setattr(
        estimate_cache, "compile_with_dump", lambda *a, **k: compiles.append(a) or real(*a, **k)
    )
    call = {"num_heads": 1, "length": 1024, "clock": 1e9}
    first = estimate("pallas_dense", "none", "v6e", **call)
    assert len(compiles) == 1
    second = estimate("pallas_dense", "none", "v6e", **call)
    assert len(compiles) == 1 and second.kernels == first.kernels
    fresh = estimate("pallas_dense", "none", "v6e", use_cache=False, **call)
    assert len(compiles) == 2
    assert fresh.cycles == first.cycles and fresh.kernels == first.kernels
    assert any(cache_dir().rglob("*.json"))
    record = fresh.as_record()
    assert record["estimate_static"] and record["estimate_libtpu"] == PINNED_LIBTPU
    assert "static estimate" in record["estimate_method"] and "STATIC ESTIMATE" in str(fresh)


def test_chips_outside_the_table_are_refused_by_name():
    with pytest.raises(ValueError, match="chip='v4'.*covers"):
        estimate("pallas_dense", "none", "v4")


def test_estimate_covers_every_chip_of_the_table():
    from stlib.analysis.clock import BORROWED, CALIBRATION_POINTS, ESTIMATE_CHIPS
    from stlib.device import CHIPS

    assert set(ESTIMATE_CHIPS) == set(CHIPS)
    assert all(chip in CALIBRATION_POINTS or chip in BORROWED for chip in ESTIMATE_CHIPS)


def test_layouts_pad_the_minor_dimension():
    from stlib.analysis.dump import glue_bytes, laid_out_minor, padded_bytes

    # the [H, L, 1] f32 LSE laid out T(8,128) takes 128 lanes per row: 128x its logical bytes
    assert padded_bytes("f32", [10, 75776, 1], "2,1,0:T(8,128)") == 128 * 10 * 75776 * 4
    assert padded_bytes("bf16", [2, 8192, 192], "2,1,0:T(8,128)(2,1)") == 2 * 8192 * 256 * 2
    assert laid_out_minor(1, "{2,1,0:T(8,128)}") == 128 and laid_out_minor(128, "{}") == 128
    hlo = (
        "HloModule m\n\nENTRY %main (p: f32[2,64,1]) -> f32[2,64,1] {\n"
        "  %p = f32[2,64,1]{2,1,0:T(8,128)} parameter(0)\n"
        "  ROOT %n = f32[2,64,1]{2,1,0:T(8,128)} negate(%p)\n}\n"
    )
    assert glue_bytes(hlo) == 2 * (2 * 64 * 128 * 4)


def test_static_estimate_validates_its_arguments():
    import stlib

    common = {"num_heads": 4, "head_dim": 128, "length": 1024}
    with pytest.raises(ValueError, match="block_sizes"):
        stlib.static_estimate("splash", "causal", "v6e", block_sizes="fastest", **common)
    with pytest.raises(ValueError, match="unknown keys"):
        stlib.static_estimate("splash", "causal", "v6e", block_sizes={"bq": 512}, **common)
    with pytest.raises(ValueError, match="divisor"):
        stlib.static_estimate("splash", "causal", "v6e", num_kv_heads=3, **common)
    with pytest.raises(ValueError, match="impl='pallas_dense' takes as many k / v heads as q heads"):
        stlib.static_estimate("pallas_dense", "none", "v6e", num_kv_heads=2, **common)


def test_tuned_blocks_take_the_best_of_the_sweep(monkeypatch):
    from types import SimpleNamespace

    from stlib.analysis import static

    def fake(impl, mask, chip, *, block_q, block_kv, **kwargs):
        if block_q == 2048:
            raise RuntimeError("exceeds scoped vmem")
        return static.Estimate(
            impl,
            mask,
            chip,
            {"resolved_blocks": {"block_q": block_q, "block_kv": block_kv}},
            (SimpleNamespace(seconds=1e-3 * abs(block_q - 1024) / 512 + 1e-3 * block_kv / 1024),),
            1e9,
            "given",
            0,
            0.0,
            "0.0.42.1",
        )

    monkeypatch.setattr(static, "estimate", fake)
    est = static.static_estimate(
        "splash", "causal", "tpu7x", num_heads=4, head_dim=128, length=8192, block_sizes="tuned"
    )
    assert est.blocks == {"block_q": 1024, "block_kv": 1024}
    candidates = static.registry.get("splash").estimator.tuned_candidates
    assert len(est.sweep) == len(candidates) and "does not compile" in est.sweep[-1][2]


def test_a_sweep_out_of_hbm_is_refused_in_one_sentence(monkeypatch):
    from stlib.analysis import static

    def fake(impl, mask, chip, *, block_q, block_kv, **kwargs):
        need = 90 + 20 * 4096 / block_kv  # fewer kv tiles, fewer per-kv-tile partials
        raise RuntimeError(
            "compiling failed:\nRESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required "
            f"for HLO temporaries ({need:.2f}G) exceeds available HBM (94.75G)."
        )

    monkeypatch.setattr(static, "estimate", fake)
    with pytest.raises(RuntimeError) as raised:
        static.static_estimate(
            "splash", "causal", "tpu7x", num_heads=32, num_kv_heads=8, head_dim=256, length=131072,
            block_sizes="tuned", backward=True,
        )  # fmt: skip
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(
        "no block size of the sweep fits the backward of splash (32:8 heads x 131,072 x 256)"
    )
    assert (
        "at blocks 512/2048, needs 130.00 GiB of HLO temporaries against 94.75 GiB (35.25 GiB over" in message
    )
    assert "512/1024 170.00 GiB" in message


def test_a_sweep_that_fails_otherwise_lists_every_reason(monkeypatch):
    from stlib.analysis import static

    def fake(impl, mask, chip, *, block_q, block_kv, **kwargs):
        raise RuntimeError(
            "exceeds scoped vmem"
            if block_q > 512
            else "RESOURCE_EXHAUSTED ... (99.00G) exceeds available HBM (94.75G)"
        )

    monkeypatch.setattr(static, "estimate", fake)
    with pytest.raises(RuntimeError, match="no block size of the sweep compiles: .*exceeds scoped vmem"):
        static.static_estimate(
            "splash", "causal", "tpu7x", num_heads=4, head_dim=128, length=8192, block_sizes="tuned"
        )


def test_options_are_checked_against_the_implementation():
    with pytest.raises(TypeError, match="no options"):
        estimate("pallas_dense", "none", "v6e", options={"form": "flat"})


@pytest.mark.tpu_compile
def test_splash_gqa_causal_unequal_head_dims_on_tpu7x(cache):
    """One real TPU7x compile: 4 q heads sharing 2 kv heads, causal, head dims 192 (q, k) / 128 (v)."""
    import stlib

    est = stlib.static_estimate(
        "splash",
        "causal",
        "tpu7x",
        num_heads=4,
        num_kv_heads=2,
        head_dim=192,
        head_dim_v=128,
        length=4096,
        clock=1e9,
    )
    (kernel,) = est.kernels
    counts = {p: v["count"] for p, v in kernel.breakdown.items()}
    # 512 x 1024 tiles: q rows 0..7 see 1, 1, 2, 2, 3, 3, 4, 4 kv tiles under the causal mask
    assert counts["compute"] == 4 * 20 and counts["init"] == counts["finalise"] == 4 * 8
    assert kernel.grid_steps == 4 * 8 * 4
    assert est.blocks == {"block_q": 512, "block_kv": 1024, "block_kv_compute": 512}
    assert est.total_seconds == pytest.approx(est.seconds + est.glue_seconds)
    assert est.config["num_kv_heads"] == 2 and est.config["head_dim_v"] == 128


@pytest.mark.tpu_compile
def test_the_backward_estimate_reads_the_fused_and_splash_backward_kernels(cache):
    """backward=True compiles the call's backward alone: for a band on 8,000 tokens (a ragged last
    tile), one step-coded fused kernel at the backward's own blocks (one dq window at this size, no
    split dq or dk / dv kernel), its edges as patterns, each step code a region executed once per
    step of that code and head; Splash's dk / dv kernel one step per non-empty tile and head. The
    forward's blocks are 512 x 1,024, not v6e's tuned ones: the same step codes, a third of the
    compile."""
    import re

    import numpy as np

    from stlib import block_layout, masks
    from stlib.kernels.backward import FUSED_PREFIX
    from stlib.kernels.backward_steps import block_steps
    from stlib.kernels.steps import region_name
    from stlib.kernels.tile_lane_dense import LaneDenseOptions, backward_step_blocks

    band, length = "band (density 0.25)", 8000
    bwd = estimate(
        "pallas_tile_lane_dense", band, "v6e", num_heads=2, backward=True, length=length, clock=1e9,
        block_q=512, block_kv=1024,
    )  # fmt: skip
    assert bwd.direction == "backward" and bwd.as_record()["estimate_direction"] == "backward"
    (name,) = [k.kernel.split(".")[0] for k in bwd.kernels]
    assert re.fullmatch(rf"{FUSED_PREFIX}_steps(_(full|ragged|masked|p\d))+_w\d+", name), name
    assert "_p" in name, "the band's edges run as patterns"
    mask = masks.band(length, masks.band_width_for_density(length, 0.25))
    forward = block_layout(mask, 512, 1024)
    block_q, block_kv, _ = backward_step_blocks(forward, LaneDenseOptions(), "v6e", False)
    _, plan = block_steps(forward, length, block_q, block_kv)
    codes, counts = np.unique(plan.codes[plan.codes >= 0], return_counts=True)
    want = {region_name(int(c)): 2 * int(n) for c, n in zip(codes, counts, strict=True)}
    got = {path: v["count"] for path, v in bwd.kernels[0].breakdown.items() if path.startswith("compute_")}
    assert got == want and len(want) > 2  # FULL, MASKED and the band's edge patterns
    assert bwd.glue_seconds > 0  # di, padding, the final scaling
    splash = estimate(
        "splash", band, "v6e", num_heads=2, backward=True, options={"fused_backward": False}, **SMALL
    )
    names = sorted(k.kernel.split(".")[0] for k in splash.kernels)
    assert names == ["splash_mha_dkv_no_residuals", "splash_mha_dq_no_residuals"]
    splash_layout = block_layout(masks.band(8192, masks.band_width_for_density(8192, 0.25)), 512, 1024)
    nonempty = 2 * int((splash_layout.kinds != 0).sum())
    assert all(k.breakdown["compute"]["count"] == nonempty for k in splash.kernels)


def test_integer_operands_are_never_taken_for_data():
    """Splash's int8 [1, 256, 128] mask blocks beside q, k, v (GQA on TPU7x at long sequences)."""
    from stlib.analysis.attribution import Attribution
    from stlib.analysis.counts import _hbm_roles

    data = [["hbm", "bf16", [32, 131072, 128], "input"], ["hbm", "bf16", [8, 131072, 128], "input"]]
    operands = [
        ["vmem", "s8", [1, 256, 128], "input"],
        data[0],
        data[1],
        ["hbm", "bf16", [8, 131072, 128], "input"],
        ["hbm", "bf16", [32, 131072, 128], "output"],
    ]
    att = Attribution("splash_mha_fwd_no_residuals.1", 3, None, {}, {}, 0, operands)
    roles = _hbm_roles(att, 128)
    assert set(roles) == {"q", "k", "v", "o", "lse"} and roles["q"] == (True, 128)
