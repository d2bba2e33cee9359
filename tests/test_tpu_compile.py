"""Every kernel compiled (not just lowered) by the real Mosaic compiler for TPU v6e and v5e at the
case-study shape (75,600 tokens, 10 heads, head dim 128, bf16), without a TPU (libtpu deviceless
compilation). A kernel that fails to compile, or overflows VMEM / SMEM, fails here."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import pytest

import stlib
import stlib.kernels
from stlib import masks
from stlib.configs import CASE_STUDY
from stlib.device import compile_for_tpu
from stlib.kernels.tile import TileOptions, tile_attention
from stlib.layout_catalog import STA_TILE, STA_WINDOW

pytestmark = pytest.mark.tpu_compile

GRID = CASE_STUDY.grid
SHAPE = jax.ShapeDtypeStruct(CASE_STUDY.qkv_shape, jnp.bfloat16)
KERNEL_NAMES = {"pallas_dense": "stlib_dense_flash", "pallas_block_sparse": "stlib_block_sparse",
                "pallas_tile": "stlib_tile_", "splash": "splash"}


@functools.cache
def case_mask(name):
    return {
        "dense": None,
        "band": masks.band(GRID.num_tokens, 10_240),
        "sliding_tile": masks.sliding_tile(GRID, STA_TILE, STA_WINDOW),
    }[name]


def assert_pallas_kernel(compiled, impl):
    text = compiled.text()
    assert "tpu_custom_call" in text and KERNEL_NAMES[impl] in text


@pytest.mark.parametrize("chip", ["v6e", "v5e"])
@pytest.mark.parametrize("impl", ["pallas_dense", "pallas_block_sparse", "pallas_tile"])
@pytest.mark.parametrize("mask_name", ["dense", "band", "sliding_tile"])
def test_compiles_at_case_study_shape(impl, mask_name, chip):
    mask = case_mask(mask_name)
    if mask_name == "sliding_tile":
        # tile-aligned: 3x8x16 tiles in 3-D tiled order, one tile (384 tokens) per block
        def fn(q, k, v):
            return stlib.video_attention(q, k, v, GRID, mask, impl=impl, orders=stlib.tiled_order(GRID, STA_TILE),
                                         block_q=384, block_kv=384, interpret=False)
    else:
        def fn(q, k, v):
            return stlib.attention(q, k, v, mask, impl=impl, interpret=False)
    compiled = compile_for_tpu(fn, SHAPE, SHAPE, SHAPE, chip=chip)
    assert_pallas_kernel(compiled, impl)
    assert compiled.memory()["output_size_in_bytes"] == 10 * GRID.num_tokens * 128 * 2


@pytest.mark.parametrize("chip", ["v6e", "v5e"])
def test_tile_flat_grid_and_balanced_boundary_compile(chip):
    layout = stlib.block_layout(case_mask("band"), 512, 1024)
    for options in (TileOptions(form="flat", block_kv_compute=512), TileOptions(boundary="balanced", exp2=False)):
        compiled = compile_for_tpu(
            lambda q, k, v, options=options: tile_attention(q, k, v, layout, scale=128**-0.5, options=options,
                                                          interpret=False),
            SHAPE, SHAPE, SHAPE, chip=chip)
        assert_pallas_kernel(compiled, "pallas_tile")


def test_per_head_svg_routing_compiles_for_v6e():
    """Five spatial and five temporal heads, each in its own token order (SVG layout), one call."""
    heads = [masks.spatial_band(GRID, 0.25)] * 5 + [masks.temporal_band(GRID, 0.25)] * 5
    orders = [stlib.raster_order(GRID)] * 5 + [stlib.token_major_order(GRID)] * 5
    mask = masks.per_head(heads)
    compiled = compile_for_tpu(
        lambda q, k, v: stlib.video_attention(q, k, v, GRID, mask, impl="pallas_tile", orders=orders,
                                              interpret=False),
        SHAPE, SHAPE, SHAPE, chip="v6e")
    assert_pallas_kernel(compiled, "pallas_tile")
