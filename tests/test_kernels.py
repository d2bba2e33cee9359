"""Pallas kernels in interpret mode on CPU against the plain reference (and against Splash): what
is particular to stlib's own kernels (lazy masks evaluated in-kernel, the tile kernel's grid forms,
LSE and boundary policy, step tables, work accounting); what every implementation keeps (random
per-head masks at ragged lengths, empty rows, config blocks, ...) is in test_kernel_contract.py.

Tolerances: float32 inputs, atol 2e-5 against the float32 reference (both accumulate in float32;
differences come from summation order); bfloat16 inputs, atol 3e-2 (p is rounded to bf16 before
the p @ v matmul, as on the MXU).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _kernels import assert_close, random_dense

import stlib
from stlib import checks, masks, registry
from stlib.blocks import BlockSizes
from stlib.kernels.block_sparse import block_sparse_work, step_table
from stlib.kernels.dense import dense_work
from stlib.kernels.tile import TileOptions, tile_attention, tile_work
from stlib.layout import TileKind
from stlib.passes import balanced_keep

#: Every stlib Pallas kernel of the registry (the Splash baseline has tests of its own).
PALLAS = [impl.name for impl in registry.tpu_kernels() if not impl.baseline]
BQ, BKV = 32, 128


@pytest.mark.parametrize("impl", PALLAS)
@pytest.mark.parametrize(
    "make_mask",
    [
        lambda g: None,
        lambda g: masks.band(g.num_tokens, 37),
        lambda g: masks.neighborhood(g, (3, 3, 5)),
        lambda g: masks.spatial_band(g, 0.3, anchor=True),
        lambda g: masks.per_head([masks.frame_causal(g), masks.temporal_band(g, 0.3)]),
    ],
    ids=["dense", "band", "neighborhood", "spatial-band+anchor", "per-head"],
)
def test_lazy_masks(impl, make_mask):
    grid = stlib.VideoGrid(3, 5, 20)
    mask = make_mask(grid)
    q, k, v = stlib.random_qkv((2, grid.num_tokens, 128), jnp.float32, seed=2)
    ref = stlib.attention(q, k, v, mask, impl="reference")
    out = stlib.attention(q, k, v, mask, impl=impl, block_q=BQ, block_kv=BKV)
    assert_close(out, ref, checks.tolerance(jnp.float32), mask=mask)


@pytest.mark.parametrize("impl", PALLAS)
def test_video_attention_reorders_and_restores(impl):
    grid = stlib.VideoGrid(4, 6, 16)
    q, k, v = stlib.random_qkv((2, grid.num_tokens, 128), jnp.float32, seed=3)
    for mask in (masks.temporal_band(grid, 0.3), masks.sliding_tile(grid, (2, 3, 8), (1, 1, 1))):
        ref = stlib.attention(q, k, v, mask, impl="reference")
        out = stlib.video_attention(q, k, v, grid, mask, impl=impl, block_q=BQ, block_kv=BKV)
        assert_close(out, ref, checks.tolerance(jnp.float32), mask=mask)


def test_video_attention_padded_tiled_order():
    grid = stlib.VideoGrid(3, 5, 7)  # ragged against the 2x2x4 tile: the tiled order has padding slots
    mask = masks.sliding_tile(grid, (2, 2, 4), (1, 3, 1))
    order = stlib.tiled_order(grid, (2, 2, 4))
    assert order.length > grid.num_tokens
    q, k, v = stlib.random_qkv((2, grid.num_tokens, 128), jnp.float32, seed=4)
    ref = stlib.attention(q, k, v, mask, impl="reference")
    for impl in PALLAS:
        out = stlib.video_attention(q, k, v, grid, mask, impl=impl, orders=order, block_q=BQ, block_kv=BKV)
        assert_close(out, ref, checks.tolerance(jnp.float32), mask=mask)


@pytest.mark.parametrize("form", ["rows", "flat"])
@pytest.mark.parametrize("exp2", [False, True])
def test_tile_forms_lse_and_chunks(form, exp2):
    length = 520
    rng = np.random.default_rng(11)
    mask = masks.per_head(
        [masks.band(length, 40), masks.from_array(np.tril(random_dense(rng, None, length, 0.5)))]
    )
    layout = stlib.block_layout(mask, 64, 256)
    q, k, v = stlib.random_qkv((2, length, 128), jnp.float32, seed=5)
    out, lse = tile_attention(
        q,
        k,
        v,
        layout,
        scale=0.1,
        options=TileOptions(form=form, exp2=exp2, block_kv_compute=128),
        return_lse=True,
    )
    dense = mask.to_dense()
    s = np.einsum("hqd,hkd->hqk", np.asarray(q, np.float64), np.asarray(k, np.float64)) * 0.1
    s = np.where(dense, s, -np.inf)
    seen = dense.any(-1)
    m = np.where(seen, s.max(-1), 0.0)
    with np.errstate(divide="ignore"):
        expected_lse = m + np.log(np.exp(s - m[..., None]).sum(-1))
    assert np.allclose(np.asarray(lse)[seen], expected_lse[seen], atol=1e-4)
    assert np.all(np.isneginf(np.asarray(lse)[~seen]))
    assert_close(
        out,
        stlib.attention(q, k, v, mask, scale=0.1, impl="reference"),
        checks.tolerance(jnp.float32),
        mask=mask,
    )


def test_tile_balanced_boundary_is_the_rounded_mask():
    length = 640
    mask = masks.band(length, 100)
    layout = stlib.block_layout(mask, 64, 128)
    keep = balanced_keep(layout)[0]
    assert np.any(keep & (layout.kinds[0] == TileKind.PARTIAL))  # some partial tiles rounded in
    assert np.any(~keep & (layout.kinds[0] == TileKind.PARTIAL))  # and some rounded out
    kept_pairs = keep.sum() * 64 * 128
    assert abs(kept_pairs - layout.allowed_pairs) <= 64 * 128  # within one tile of the budget
    rounded = np.kron(keep, np.ones((64, 128), bool))[:length, :length]
    q, k, v = stlib.random_qkv((1, length, 128), jnp.float32, seed=6)
    out = tile_attention(q, k, v, layout, scale=128**-0.5, options=TileOptions(boundary="balanced"))
    assert_close(
        out,
        stlib.attention(q, k, v, masks.from_array(rounded), impl="reference"),
        checks.tolerance(jnp.float32),
        mask=rounded,
    )


@pytest.mark.parametrize("impl", PALLAS)
def test_kernels_agree_with_splash(impl):
    length = 512
    mask = masks.per_head([masks.band(length, 100), masks.full(length)])
    q, k, v = stlib.random_qkv((2, length, 128), jnp.float32, seed=8)
    splash = stlib.attention(q, k, v, mask, impl="splash", block_q=128, block_kv=128)
    out = stlib.attention(q, k, v, mask, impl=impl, block_q=BQ, block_kv=BKV)
    assert_close(out, splash, checks.tolerance(jnp.float32))


def test_block_sparse_skipped_steps_fetch_no_new_tile():
    mask = masks.band(1024, 100)
    layout = stlib.block_layout(mask, 128, 128)
    table = step_table(layout)
    fetch, kind = table >> 2, table & 3
    nonempty = layout.kinds != TileKind.EMPTY
    assert np.array_equal(kind != 0, nonempty)
    assert np.array_equal(fetch[nonempty], np.nonzero(nonempty)[2])
    # a skipped step fetches the tile of a neighbouring step: no DMA of a tile nobody computes
    for row_fetch, row_nonempty in zip(fetch[0], nonempty[0]):
        assert set(row_fetch.tolist()) <= set(np.flatnonzero(row_nonempty).tolist())


def test_work_accounting():
    grid = stlib.VideoGrid(3, 8, 32)
    mask = masks.frame_causal(grid)
    layout = stlib.block_layout(mask, 128, 256)
    nq, nk = layout.grid_shape
    heads, dim = 4, 64
    nonempty = int(np.sum(layout.kinds != TileKind.EMPTY))
    useful = 4.0 * layout.allowed_pairs * heads * dim
    dense = dense_work(layout, heads, dim)
    assert dense.grid_steps == dense.computed_tiles == heads * nq * nk
    assert dense.useful_flops == useful and dense.flop_ratio > 1.0
    sparse = block_sparse_work(layout, heads, dim)
    assert sparse.grid_steps == heads * nq * nk and sparse.computed_tiles == heads * nonempty
    rows = tile_work(layout, heads, dim, TileOptions(form="rows"))
    flat = tile_work(layout, heads, dim, TileOptions(form="flat"))
    assert rows.computed_tiles == flat.computed_tiles == heads * nonempty
    assert flat.grid_steps == heads * nonempty  # no row is empty here, so no placeholder steps
    assert rows.grid_steps >= flat.grid_steps  # causal rows are unequal: the rows grid wastes steps
    assert sparse.executed_flops == rows.executed_flops == 4.0 * heads * nonempty * 128 * 256 * dim


def test_block_size_validation():
    with pytest.raises(ValueError, match="block_q=12"):
        BlockSizes(block_q=12, block_kv=128)
    with pytest.raises(ValueError, match="block_kv=200"):
        BlockSizes(block_q=16, block_kv=200)
    with pytest.raises(ValueError, match="block_kv_compute=384"):
        BlockSizes(block_q=16, block_kv=512, block_kv_compute=384)
    with pytest.raises(ValueError, match="form="):
        TileOptions(form="diagonal")
    q, k, v = stlib.random_qkv((1, 256, 128), jnp.float32)
    with pytest.raises(ValueError, match="block_kv=136"):
        stlib.attention(q, k, v, impl="pallas_dense", block_q=32, block_kv=136)


def test_smem_overflow_names_the_fix():
    """A 10-head per-head table at 128 x 128 tiles does not fit 1 MiB of SMEM."""
    grid = stlib.CASE_STUDY.grid
    mask = masks.per_head([masks.spatial_band(grid, 0.25), masks.temporal_band(grid, 0.25)] * 5)
    layout = stlib.block_layout(mask, 128, 128)
    shape = jax.ShapeDtypeStruct((10, grid.num_tokens, 128), jnp.bfloat16)
    with pytest.raises(ValueError, match="larger tiles"):
        jax.eval_shape(
            lambda q, k, v: tile_attention(q, k, v, layout, scale=0.1, interpret=False), shape, shape, shape
        )
