"""Every registered TPU kernel compiled (not just lowered) by the real Mosaic compiler for every
chip it supports, at the case-study shape (75,600 tokens, 10 heads, head dim 128, bf16), without a
TPU (libtpu deviceless compilation). A kernel that fails to compile, or overflows VMEM / SMEM,
fails here."""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import pytest

import stlib
from stlib import masks, registry
from stlib.configs import CASE_STUDY
from stlib.device import CHIPS, compile_for_tpu
from stlib.kernels.tile import TileOptions, tile_attention

pytestmark = pytest.mark.tpu_compile

GRID = CASE_STUDY.grid
SHAPE = jax.ShapeDtypeStruct(CASE_STUDY.qkv_shape, jnp.bfloat16)
STA_BLOCK = CASE_STUDY.sta_tile[0] * CASE_STUDY.sta_tile[1] * CASE_STUDY.sta_tile[2]
KERNEL_CHIPS = [(impl.name, chip) for impl in registry.tpu_kernels() for chip in impl.chips]
AUTO_TPU_KERNEL = registry.choose("auto", masks.full(8), backend="tpu").name


@functools.cache
def case_mask(name):
    return {
        "dense": None,
        "band": masks.band(GRID.num_tokens, 10_240),
        "sliding_tile": masks.sliding_tile(GRID, CASE_STUDY.sta_tile, CASE_STUDY.sta_window),
    }[name]


def assert_pallas_kernel(compiled, impl):
    text = compiled.text()
    assert "tpu_custom_call" in text
    assert any(name in text for name in registry.get(impl).estimator.kernel_names)


def test_every_tpu_kernel_supports_every_chip():
    assert {impl.name for impl in registry.tpu_kernels()} >= {
        "pallas_dense",
        "pallas_block_sparse",
        "pallas_tile",
        "splash",
    }
    assert all(set(impl.chips) == set(CHIPS) for impl in registry.tpu_kernels())
    assert set(CHIPS) == {"v5e", "v6e", "tpu7x"}


#: One case-study compile per kernel and chip (the band: FULL, PARTIAL and EMPTY tiles), plus the
#: baseline dense (every ratio's denominator), pallas_tile's sliding tile in 3-D tiled order and the
#: baseline's on the v5e (Splash on the same mask, from stlib's block layout); the
#: rest of the forward matrix compiles in ``python -m stlib.estimate table`` (every kernel, pattern
#: and chip of the estimate table). The kernel ``impl="auto"`` picks on a TPU compiles its band
#: forward inside ``test_the_backward_compiles_at_case_study_shape`` (the same kernel at the same
#: blocks, with its log-sum-exp output), not a second time here.
FORWARD_CASES = (
    [(impl, chip, "band") for impl, chip in KERNEL_CHIPS if impl != AUTO_TPU_KERNEL]
    + [(registry.baseline().name, chip, "dense") for chip in CHIPS]
    + [("pallas_tile", chip, "sliding_tile") for chip in CHIPS]
    + [(registry.baseline().name, "v5e", "sliding_tile")]
)


@pytest.mark.parametrize(("impl", "chip", "mask_name"), FORWARD_CASES)
def test_compiles_at_case_study_shape(impl, chip, mask_name):
    mask = case_mask(mask_name)
    if mask_name == "sliding_tile":
        # tile-aligned: 3x8x16 tiles in 3-D tiled order, one tile (384 tokens) per block
        def fn(q, k, v):
            return stlib.video_attention(
                q,
                k,
                v,
                GRID,
                mask,
                impl=impl,
                block_q=STA_BLOCK,
                block_kv=STA_BLOCK,
                orders=stlib.tiled_order(GRID, CASE_STUDY.sta_tile),
                interpret=False,
            )

    else:

        def fn(q, k, v):
            return stlib.attention(q, k, v, mask, impl=impl, interpret=False)

    compiled = compile_for_tpu(fn, SHAPE, SHAPE, SHAPE, chip=chip)
    assert_pallas_kernel(compiled, impl)
    assert compiled.memory()["output_size_in_bytes"] == 10 * GRID.num_tokens * 128 * 2


def test_tile_flat_grid_and_balanced_boundary_compile(chip="v6e"):
    """pallas_tile's other grid form and its balanced boundary, on v6e (each chip compiles the rows
    form and the exact boundary in ``test_compiles_at_case_study_shape``)."""
    layout = stlib.block_layout(case_mask("band"), 512, 1024)
    for options in (
        TileOptions(form="flat", block_kv_compute=512),
        TileOptions(boundary="balanced", exp2=False),
    ):
        compiled = compile_for_tpu(
            lambda q, k, v, options=options: tile_attention(
                q, k, v, layout, scale=128**-0.5, options=options, interpret=False
            ),
            SHAPE,
            SHAPE,
            SHAPE,
            chip=chip,
        )
        assert_pallas_kernel(compiled, "pallas_tile")


def test_per_head_svg_routing_compiles_for_v6e():
    """Five spatial and five temporal heads, each in its own token order (SVG layout), one call."""
    heads = [masks.spatial_band(GRID, 0.25)] * 5 + [masks.temporal_band(GRID, 0.25)] * 5
    orders = [stlib.raster_order(GRID)] * 5 + [stlib.token_major_order(GRID)] * 5
    mask = masks.per_head(heads)
    compiled = compile_for_tpu(
        lambda q, k, v: stlib.video_attention(
            q, k, v, GRID, mask, impl="pallas_tile", orders=orders, interpret=False
        ),
        SHAPE,
        SHAPE,
        SHAPE,
        chip="v6e",
    )
    assert_pallas_kernel(compiled, "pallas_tile")


@pytest.mark.parametrize("chip", CHIPS)
def test_lane_dense_sliding_tile_runs_in_rows_of_tiles(chip):
    """pallas_tile_lane_dense's own blocks for the 3-D tiled order: rows of five 3x8x16 tiles (1,920
    tokens), ``tiled_rows(chip)`` of them each way, keys in chunks of one tile. The forward these
    blocks compile to (pattern regions only, no masked one; VMEM and SMEM fit) is compiled at the
    case-study shape, with its backward, in ``test_the_backward_compiles_at_case_study_shape``."""
    from stlib.kernels import tile_lane_dense as ld

    mask = case_mask("sliding_tile")
    order = stlib.tiled_order(GRID, CASE_STUDY.sta_tile)
    sizes, _ = ld.resolve_blocks(
        mask.permute(order), order.length, None, None, ld.LaneDenseOptions(chip=chip), False
    )
    rows_q, rows_kv = ld.tiled_rows(chip)
    assert (sizes.block_q, sizes.block_kv, sizes.block_kv_compute) == (1920 * rows_q, 1920 * rows_kv, 384)


# the backward: one case-study compile per chip of the backward kernels every stlib Pallas kernel
# shares (here through pallas_tile_lane_dense, impl="auto" on a TPU), sized for the chip as on that
# TPU: the sliding tile's pattern steps (one finishing call on v5e and v6e, the dq window split on
# TPU7x); Splash's own on v6e; the band's step-coded pass at a smaller shape below (at the case-study
# shape it takes 60-100 s to compile); the rest of the matrix: python -m stlib.bench.backward_compile
# (its records in data/)

BACKWARD_CASES = [(AUTO_TPU_KERNEL, chip, "sliding_tile") for chip in CHIPS] + [("splash", "v6e", "band")]


def step_coded_kernels(text: str, codes: str) -> set[str]:
    """The fused backward kernels of a compiled grad program, each a step-coded pass whose codes match
    ``codes`` (a regex over the ``_full``, ``_ragged``, ``_masked``, ``_p<n>`` words); no split dq or
    dk / dv kernel beside them."""
    from stlib.kernels.backward import DKV_PREFIX, DQ_PREFIX, FUSED_PREFIX

    assert FUSED_PREFIX in text, "the fused dk / dv / dq kernel (its dq window fits VMEM here)"
    assert DQ_PREFIX not in text and DKV_PREFIX not in text
    names = set(re.findall(rf"{FUSED_PREFIX}_[a-z0-9_]+", text))
    assert names and all(re.fullmatch(rf"{FUSED_PREFIX}_steps{codes}_w\d+", n) for n in names), names
    return names


@pytest.mark.parametrize(("impl", "chip", "mask_name"), BACKWARD_CASES)
def test_the_backward_compiles_at_case_study_shape(impl, chip, mask_name):
    mask = case_mask(mask_name)
    order = stlib.tiled_order(GRID, CASE_STUDY.sta_tile) if mask_name == "sliding_tile" else None
    # sized for the chip, as on that TPU (its own blocks and VMEM); Splash takes no chip
    options = None if registry.get(impl).baseline else {"chip": chip}

    def grads(q, k, v):
        def loss(q, k, v):
            if order is None:
                out = stlib.attention(q, k, v, mask, impl=impl, options=options, interpret=False)
            else:
                out = stlib.video_attention(
                    q, k, v, GRID, mask, impl=impl, orders=order, options=options, interpret=False
                )
            return jnp.sum(out.astype(jnp.float32))

        return jax.grad(loss, argnums=(0, 1, 2))(q, k, v)

    compiled = compile_for_tpu(grads, SHAPE, SHAPE, SHAPE, chip=chip)
    text = compiled.text()
    assert compiled.memory()["output_size_in_bytes"] >= 3 * SHAPE.size * 2  # dq, dk, dv in bf16
    assert_pallas_kernel(compiled, impl)  # the forward, at the blocks an inference call gets
    if registry.get(impl).baseline:
        assert "splash" in text
        return
    # rows of 3-D tiles: the forward's pattern steps and the backward's, nothing masked in either
    (forward,) = set(re.findall(r"stlib_tile_ld_[a-z0-9_]+", text))
    assert re.fullmatch(r"stlib_tile_ld(_p\d)+", forward), forward
    step_coded_kernels(text, r"(_p\d)+")


@pytest.mark.parametrize("head_dim", [64, 256])
@pytest.mark.parametrize("impl", [impl.name for impl in registry.tpu_kernels()])
def test_head_dims_64_and_256_compile(impl, head_dim, chip="v6e"):
    """Head dims beside the case study's 128: each TPU kernel compiles them, a band over 512 x 512
    blocks (EMPTY and PARTIAL tiles)."""
    shape = jax.ShapeDtypeStruct((2, 2048, head_dim), jnp.bfloat16)
    mask = masks.band(2048, 256)

    def fn(q, k, v):
        return stlib.attention(q, k, v, mask, impl=impl, block_q=512, block_kv=512, interpret=False)

    compiled = compile_for_tpu(fn, shape, shape, shape, chip=chip)
    assert_pallas_kernel(compiled, impl)
    assert compiled.memory()["output_size_in_bytes"] == 2 * 2048 * head_dim * 2
