"""Sparse VideoGen routing and the public design's tile budget (stlib.routing)."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _kernels import assert_close

import stlib
from stlib import SMALL_CPU, VideoGrid, checks
from stlib.configs import CASE_STUDY
from stlib.geometry import token_major_order
from stlib.masks import band_width_for_density
from stlib.passes import BoundaryPolicy
from stlib.routing import Anchor, TokenMajorPrefixMask, route, svg_plan
from stlib.synthetic import HeadKind, video_qkv

SMALL = SMALL_CPU.grid  # 3 x 8 x 48 = 1,152 tokens
PLANTED = ("spatial", "temporal", "temporal", "spatial")
CASE_BLOCKS = {"block_q": 3328, "block_kv": 2816}  # the public design's tiles


@functools.cache
def small_inputs(seed=0):
    return video_qkv(SMALL, PLANTED, 64, seed=seed)


# --- budget ---------------------------------------------------------------------------------


def test_band_width_is_the_public_budget():
    length = CASE_STUDY.grid.num_tokens
    assert (
        band_width_for_density(length, 0.15) == math.ceil(length * (1 - math.sqrt(0.85)) / 128) * 128 == 6016
    )
    plan = svg_plan(CASE_STUDY.grid, ["spatial", "temporal"], 0.15, **CASE_BLOCKS)
    assert plan.width == 6016 and plan.width % 128 == 0


@pytest.mark.parametrize("anchor", list(Anchor))
@pytest.mark.parametrize("density", [0.15, 0.25])
def test_balanced_pairs_within_two_percent_at_case_study(density, anchor):
    plan = svg_plan(CASE_STUDY.grid, ["spatial", "temporal"], density, anchor=anchor, **CASE_BLOCKS)
    assert plan.layout.grid_shape == (23, 27)
    assert np.all(np.abs(plan.pairs / plan.exact_pairs - 1) <= 0.02)
    assert np.all(plan.main_tiles > 0) and np.all(plan.masked_tiles == 0)
    # the last kv tile holds 75,600 - 26 * 2,816 = 384 real keys: tiles there are the ragged tail
    assert np.all(plan.tail_tiles == plan.kept[:, :, -1].sum(axis=1))
    assert np.all(plan.computed_tiles == plan.kept.sum(axis=(1, 2)))


def test_rounded_mask_is_lazy_at_case_study():
    """plan.mask (the rounded tiles, in raster order) counts its tiles without an L x L array."""
    plan = svg_plan(CASE_STUDY.grid, ["spatial", "temporal"], 0.15, **CASE_BLOCKS)
    counted = stlib.block_layout(plan.mask, CASE_BLOCKS["block_q"], CASE_BLOCKS["block_kv"]).counts
    assert np.array_equal(counted.sum(axis=(1, 2)), plan.pairs)


@pytest.mark.parametrize("density", [0.15, 0.25, 0.5])
def test_balanced_pairs_within_two_percent_at_small_grid(density):
    plan = svg_plan(SMALL, PLANTED, density, block_q=128, block_kv=128)
    assert np.all(np.abs(plan.pairs / plan.exact_pairs - 1) <= 0.02)
    dense = plan.mask.to_dense()  # the rounded mask in raster order holds exactly those pairs
    assert np.array_equal(dense.sum(axis=(1, 2)), plan.pairs)


def test_exact_boundary_computes_the_exact_mask():
    plan = svg_plan(SMALL, PLANTED, 0.25, block_q=128, block_kv=128, boundary="exact")
    assert np.array_equal(plan.pairs, plan.exact_pairs)
    assert np.all(plan.masked_tiles > 0)
    dense = plan.mask.to_dense()
    for h, m in enumerate(plan.exact_masks):
        assert np.array_equal(dense[h], m.to_dense())


def test_reordered_anchor_beats_frame0_on_temporal_heads_at_case_study():
    kinds = ["temporal"]
    reordered = svg_plan(CASE_STUDY.grid, kinds, 0.15, boundary="exact", **CASE_BLOCKS)
    frame0 = svg_plan(CASE_STUDY.grid, kinds, 0.15, boundary="exact", anchor="frame0", **CASE_BLOCKS)
    assert reordered.computed_tiles[0] < 0.5 * frame0.computed_tiles[0]


# --- anchor semantics -----------------------------------------------------------------------


def _own_order_dense(plan, h):
    return plan.layout.mask.head(h).to_dense()


def test_reordered_anchor_is_the_first_hw_keys_of_the_reordered_sequence():
    plan = svg_plan(SMALL, ["spatial", "temporal"], 0.15, block_q=128, block_kv=128, boundary="exact")
    length, hw = SMALL.num_tokens, SMALL.tokens_per_frame
    pos = np.arange(length)
    expected = (np.abs(pos[:, None] - pos[None, :]) <= plan.width) | (pos[None, :] < hw)
    for h in range(2):  # in its own order every head is band | key < H*W
        assert np.array_equal(_own_order_dense(plan, h), expected)
    # in raster terms, the temporal head's anchor is the keys whose token-major position is < H*W
    anchor = TokenMajorPrefixMask(SMALL).to_dense()
    assert np.array_equal(
        anchor, np.broadcast_to(token_major_order(SMALL).inverse[None, :] < hw, anchor.shape)
    )


def test_frame0_anchor_is_frame_zero_in_every_order():
    plan = svg_plan(
        SMALL, ["spatial", "temporal"], 0.15, block_q=128, block_kv=128, boundary="exact", anchor="frame0"
    )
    length, hw, frames = SMALL.num_tokens, SMALL.tokens_per_frame, SMALL.frames
    pos = np.arange(length)
    in_band = np.abs(pos[:, None] - pos[None, :]) <= plan.width
    assert np.array_equal(_own_order_dense(plan, 0), in_band | (pos[None, :] < hw))
    assert np.array_equal(_own_order_dense(plan, 1), in_band | (pos[None, :] % frames == 0))
    raster = plan.mask.to_dense()
    assert raster[:, :, :hw].all()  # every query sees frame 0 in raster order


def test_orders_follow_kinds():
    plan = svg_plan(SMALL, ["temporal", "spatial"], 0.15, block_q=128, block_kv=128)
    assert plan.kinds == (HeadKind.TEMPORAL, HeadKind.SPATIAL)
    assert plan.orders[0] == stlib.token_major_order(SMALL) and plan.orders[1] == stlib.raster_order(SMALL)
    assert plan.anchor == Anchor.REORDERED and plan.boundary == BoundaryPolicy.BALANCED


# --- routing ----------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1])
def test_routing_recovers_planted_kinds(seed):
    q, k, _ = small_inputs(seed)
    plan = route(q, k, SMALL, 0.15, seed=seed)
    assert plan.kinds == tuple(HeadKind(kind) for kind in PLANTED)
    assert plan.routing.mse.shape == plan.routing.recall.shape == (2, len(PLANTED))
    assert plan.routing.rows.shape == (64,)


def test_routing_recovers_planted_kinds_on_more_frames():
    grid = VideoGrid(9, 8, 16)
    kinds = ("temporal", "spatial", "temporal")
    q, k, _ = video_qkv(grid, kinds, 64, seed=3)
    assert route(q, k, grid, 0.25, num_samples=32).kinds == tuple(HeadKind(x) for x in kinds)


def test_route_is_the_plan_of_its_kinds():
    q, k, _ = small_inputs()
    plan = route(q, k, SMALL, 0.25, block_q=64, block_kv=128, anchor="frame0", boundary="exact")
    again = svg_plan(SMALL, plan.kinds, 0.25, block_q=64, block_kv=128, anchor="frame0", boundary="exact")
    assert np.array_equal(plan.layout.counts, again.layout.counts)
    assert (plan.block_q, plan.block_kv) == (64, 128)


# --- end to end -----------------------------------------------------------------------------


@pytest.mark.parametrize("boundary", ["balanced", "exact"])
def test_route_plan_kernel_end_to_end(boundary, monkeypatch):
    q, k, v = small_inputs()
    plan = route(q, k, SMALL, 0.15, boundary=boundary)
    # the kernel call counts no layout anew: it runs the plan's own (the forward and the backward's
    # plan find it by value), and chooses no order
    from stlib import reorder, tile_counts

    def refuse(*args, **kwargs):
        raise AssertionError("a layout was rebuilt")

    monkeypatch.setattr(tile_counts, "tile_counts", refuse)
    monkeypatch.setattr(reorder, "block_layout", refuse)
    out = stlib.video_attention(q, k, v, SMALL, plan=plan, impl="pallas_tile")
    monkeypatch.undo()
    expected = stlib.attention(q, k, v, plan.mask, impl="reference")
    assert_close(out, expected, checks.tolerance(jnp.float32))
    dense = stlib.attention(q, k, v, None, impl="reference")
    rel = float(jnp.linalg.norm(out - dense) / jnp.linalg.norm(dense))
    assert rel < 0.15  # the routed sparse output stays close to dense on planted inputs


@pytest.mark.parametrize("boundary", ["balanced", "exact"])
def test_second_tile_kernel_runs_the_same_plan(boundary):
    if "pallas_tile_lane_dense" not in stlib.IMPLEMENTATIONS:
        pytest.skip("pallas_tile_lane_dense is not registered")
    q, k, v = small_inputs()
    plan = svg_plan(SMALL, PLANTED, 0.15, block_q=128, block_kv=128, boundary=boundary)
    if boundary == "balanced":  # the rounded tiles, as FULL tiles: nothing for the kernel to round
        assert not np.any(plan.kernel_layout.kinds == stlib.TileKind.PARTIAL)
        assert np.array_equal(plan.kernel_layout.counts.sum(axis=(1, 2)), plan.pairs)
    out = stlib.video_attention(
        q, k, v, SMALL, plan=plan, impl="pallas_tile_lane_dense", options={"bf16_probs": False}
    )
    expected = stlib.attention(q, k, v, plan.mask, impl="reference")
    assert_close(out, expected, checks.tolerance(jnp.float32))


def test_plan_with_reference_impl_runs_the_rounded_mask():
    q, k, v = small_inputs()
    plan = svg_plan(SMALL, PLANTED, 0.15, block_q=128, block_kv=128)
    out = stlib.video_attention(q, k, v, SMALL, plan=plan, impl="reference")
    np.testing.assert_allclose(
        np.asarray(out), np.asarray(stlib.attention(q, k, v, plan.mask, impl="reference")), atol=1e-6
    )


# --- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize("density", [0.0, -0.1, 1.5])
def test_bad_density(density):
    q, k, _ = small_inputs()
    with pytest.raises(ValueError, match="density"):
        route(q, k, SMALL, density)
    with pytest.raises(ValueError, match="density"):
        svg_plan(SMALL, PLANTED, density, block_q=128, block_kv=128)


@pytest.mark.parametrize("num_samples", [0, SMALL.num_tokens + 1])
def test_bad_sample_size(num_samples):
    q, k, _ = small_inputs()
    with pytest.raises(ValueError, match="num_samples"):
        route(q, k, SMALL, 0.15, num_samples=num_samples)


def test_whole_sequence_as_sample_is_fine():
    q, k, _ = small_inputs()
    assert route(q, k, SMALL, 0.15, num_samples=SMALL.num_tokens).kinds == tuple(map(HeadKind, PLANTED))


def test_grid_must_match_length():
    q, k, v = small_inputs()
    with pytest.raises(ValueError, match="video grid"):
        route(q, k, VideoGrid(3, 8, 32), 0.15)
    plan = svg_plan(SMALL, PLANTED, 0.15, block_q=128, block_kv=128)
    with pytest.raises(ValueError, match="grid|video grid"):
        stlib.video_attention(
            q[:, :768], k[:, :768], v[:, :768], VideoGrid(2, 8, 48), plan=plan, impl="pallas_tile"
        )


@pytest.mark.parametrize("where", ["q", "k"])
@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_non_finite_inputs(where, value):
    q, k, _ = small_inputs()
    rows = stlib.routing.sample_rows(SMALL.num_tokens, 64, 0)
    if where == "q":
        q = q.at[1, rows[5], 3].set(value)  # in a sampled row
    else:
        k = k.at[2, 17, 0].set(value)
    with pytest.raises(ValueError, match="NaN or inf"):
        route(q, k, SMALL, 0.15)


def test_bad_plan_use():
    q, k, v = small_inputs()
    plan = svg_plan(SMALL, PLANTED, 0.15, block_q=128, block_kv=128)
    with pytest.raises(ValueError, match="heads"):
        stlib.video_attention(q[:2], k[:2], v[:2], SMALL, plan=plan, impl="pallas_tile")
    with pytest.raises(ValueError, match="not both"):
        stlib.video_attention(q, k, v, SMALL, plan.mask, plan=plan, impl="pallas_tile")
    with pytest.raises(ValueError, match="boundary"):
        stlib.video_attention(q, k, v, SMALL, plan=plan, impl="pallas_tile", options={"boundary": "exact"})
    with pytest.raises(ValueError, match="candidates|kinds"):
        route(q, k, SMALL, 0.15, candidates=("spatial", "radial"))
    with pytest.raises(ValueError, match="anchor"):
        svg_plan(SMALL, PLANTED, 0.15, block_q=128, block_kv=128, anchor="first")
    with pytest.raises(ValueError, match="block_kv"):
        svg_plan(SMALL, PLANTED, 0.15, block_q=128, block_kv=100)


# --- compiles for TPU at the case-study shape -----------------------------------------------


@pytest.mark.tpu_compile
@pytest.mark.parametrize("boundary", ["balanced"])
def test_plan_compiles_for_v6e_at_case_study_shape(boundary):
    """The design's balanced boundary. The exact boundary's masked pass (per-head SVG masks
    evaluated in-kernel from iota) compiles at the case-study shape in
    ``tests/test_tpu_compile.py::test_per_head_svg_routing_compiles_for_v6e``; its plan form took two
    minutes of the test budget."""
    from stlib.device import compile_for_tpu

    grid = CASE_STUDY.grid
    kinds = ["spatial"] * 5 + ["temporal"] * 5
    plan = svg_plan(grid, kinds, 0.15, boundary=boundary, **CASE_BLOCKS)
    shape = jax.ShapeDtypeStruct(CASE_STUDY.qkv_shape, jnp.bfloat16)

    def fn(
        q, k, v
    ):  # 2,816 keys walked in chunks of 256 (the design's inner tile; 1,024 does not divide 2,816)
        return stlib.video_attention(
            q, k, v, grid, plan=plan, impl="pallas_tile", interpret=False, options={"block_kv_compute": 256}
        )

    compiled = compile_for_tpu(fn, shape, shape, shape, chip="v6e")
    assert "stlib_tile_full" in compiled.text()


# --- the plan's masks (stlib.masks.svg) and its quality (stlib.bench.svg_quality) ---------------


def test_plan_masks_live_in_masks_and_compare_by_value():
    import pickle

    from stlib import masks, routing
    from stlib.masks import svg

    assert routing.KeptTilesMask is masks.KeptTilesMask is svg.KeptTilesMask
    assert routing.TokenMajorPrefixMask is masks.TokenMajorPrefixMask is svg.TokenMajorPrefixMask
    keep = np.random.default_rng(0).random((9, 9)) < 0.5
    kept = masks.KeptTilesMask(keep, 128, 128, SMALL.num_tokens)
    for mask, same in [
        (kept, masks.KeptTilesMask(keep.copy(), 128, 128, SMALL.num_tokens)),
        (masks.TokenMajorPrefixMask(SMALL), masks.TokenMajorPrefixMask(SMALL)),
    ]:
        assert mask == same and hash(mask) == hash(same)
        again = pickle.loads(pickle.dumps(mask))
        assert again == mask and hash(again) == hash(mask)
    assert kept != masks.KeptTilesMask(~keep, 128, 128, SMALL.num_tokens)


def test_quality_sweep_records_every_pattern():
    from stlib.bench import svg_quality

    grid = VideoGrid(2, 8, 16)  # 256 tokens: two 128 x 128 tiles a side
    records = list(
        svg_quality.quality_sweep(
            grid,
            ("spatial", "temporal"),
            32,
            (0.25,),
            anchors=("reordered",),
            boundaries=("balanced",),
            full_grid=grid,
            full_blocks=(128, 128),
            full_heads=2,
        )
    )
    assert [r["pattern"] for r in records] == list(svg_quality.PATTERNS)
    for r in records:
        assert r["grid"] == [2, 8, 16] and r["boundary"] == "balanced" and r["anchor"] == "reordered"
        assert 0 <= r["rel_l2"] and 0 < r["recall"] <= 1 + 1e-6 and 0 <= r["routing_recovery"] <= 1
        assert 0 < r["executed_vs_dense"] <= 1 and r["full_grid"] == [2, 8, 16]
    spatial, temporal, _ = records
    assert spatial["kinds"] == ["spatial"] * 2 and temporal["kinds"] == ["temporal"] * 2


def test_record_quality_appends_the_sweep_with_its_environment(monkeypatch, tmp_path):
    from stlib.bench import svg_quality

    calls = []

    def fake_sweep(grid, kinds, head_dim, densities, **kwargs):
        calls.append((grid, kinds, head_dim, densities, kwargs))
        yield {"pattern": "routed", "density": densities[0]}

    monkeypatch.setattr(svg_quality, "quality_sweep", fake_sweep)
    path = tmp_path / "svg_quality.jsonl"
    (record,) = svg_quality.record_quality(path, densities=(0.15,))
    assert calls[0][:4] == (svg_quality.QUALITY_GRID, svg_quality.QUALITY_KINDS, 64, (0.15,))
    assert calls[0][4] == {"full_grid": CASE_STUDY.grid}
    assert record["inputs"].startswith("synthetic") and record["pattern"] == "routed" and "run" in record
    from stlib.bench.records import read_records

    assert read_records(path) == [record]
