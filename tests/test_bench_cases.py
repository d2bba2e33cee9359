"""stlib.bench.cases: the case-study cases name their masks, kernels and orders consistently."""

from __future__ import annotations

import collections

import numpy as np
import pytest

import stlib
from stlib import registry
from stlib.bench.cases import case_function, case_inputs, case_study_cases, sta_windows
from stlib.configs import DENSITIES, SMALL_CPU
from stlib.geometry import VideoGrid
from stlib.kernels.tile_lane_dense import LaneDenseOptions, resolve_blocks, tiled_rows

IMPLS = {impl.name for impl in registry.tpu_kernels()}  # the comparisons run every registered TPU kernel
PATTERNS = {"dense", "band", "sliding tile"}


def test_sta_windows_are_odd_and_end_at_the_whole_grid():
    grid, tile = VideoGrid(3, 8, 48), (1, 8, 16)  # 3 x 1 x 3 tiles
    assert sta_windows(grid, tile) == [(1, 1, 1), (3, 1, 3)]
    assert sta_windows(VideoGrid(21, 45, 80), (3, 8, 16)) == [(1, 1, 1), (3, 3, 3), (5, 5, 5), (7, 5, 5)]


@pytest.fixture(scope="module")
def small_cases():
    return case_study_cases(SMALL_CPU, tpu=False, densities=(0.25, 0.5))


def test_cases_name_kernels_patterns_and_lengths(small_cases):
    assert {c.impl for c in small_cases} <= IMPLS
    assert {c.pattern for c in small_cases} == PATTERNS
    assert all(c.mask.length == SMALL_CPU.num_tokens for c in small_cases if c.order is None)
    counts = collections.Counter(c.pattern for c in small_cases)
    windows = len(sta_windows(SMALL_CPU.grid, SMALL_CPU.sta_tile)) - 1  # the whole grid is the dense case
    runs = sum(len(impl.comparison_runs()) for impl in registry.tpu_kernels())  # every kernel, every variant
    assert runs >= 6
    assert counts == {"dense": 3, "band": runs * 2, "sliding tile": 5 * windows}
    labels = [c.label for c in small_cases if c.pattern == "band"]
    assert labels[:runs] == labels[runs:]  # the same kernels at every density
    assert [c.label for c in small_cases if c.pattern == "dense"] == [
        "Splash (dense)",
        "pallas_dense (dense)",
        "pallas_tile (dense)",
    ]


def test_block_sizes_follow_the_backend_and_the_workload_tile(small_cases):
    tile_tokens = int(np.prod(SMALL_CPU.sta_tile))
    row = tile_tokens * -(-SMALL_CPU.grid.width // SMALL_CPU.sta_tile[2])  # the tiles along x
    for case in small_cases:
        if case.order is None:
            assert (case.block_q, case.block_kv) == (128, 128)
        else:
            assert case.pattern == "sliding tile"
            if case.impl == "splash":  # its own blocks: one 3-D tile each where that is a multiple of 128
                assert (case.block_q, case.block_kv) == (None, None)
            elif case.impl == "pallas_tile_lane_dense":  # whole rows of tiles (tiled_rows), a tile per chunk
                rows_q, rows_kv = tiled_rows("v6e")
                assert (case.block_q, case.block_kv) == (rows_q * row, rows_kv * row)
                sizes, _ = resolve_blocks(
                    case.mask,
                    case.mask.length,
                    case.block_q,
                    case.block_kv,
                    LaneDenseOptions(chip="v6e"),
                    False,
                )
                assert sizes.block_kv_compute == tile_tokens  # one tile per chunk
            else:
                assert (case.block_q, case.block_kv) == (tile_tokens, tile_tokens)
    tpu_cases = case_study_cases(SMALL_CPU, tpu=True, densities=(0.25,))
    assert {(c.block_q, c.block_kv) for c in tpu_cases if c.order is None} == {(512, 1024)}


def test_densities_default_to_the_configured_sweep():
    bands = [c for c in case_study_cases(SMALL_CPU, tpu=False) if c.label == "Splash"]
    assert len(bands) == len(DENSITIES)


def test_tiled_cases_see_the_same_mask_in_tiled_order(small_cases):
    tiled = [c for c in small_cases if c.label == "pallas_tile (3-D tiled)"]
    reordering = [c for c in small_cases if c.label == "pallas_tile (3-D tiled) + reordering"]
    raster = [c for c in small_cases if c.label == "pallas_block_sparse (raster)"]
    splash = [c for c in small_cases if c.label == "Splash (3-D tiled)"]
    assert len(tiled) == len(reordering) == len(raster) == len(splash) >= 1
    for a, b, r, s in zip(tiled, reordering, raster, splash):
        assert s.mask == a.mask and s.order == a.order and not s.reorders_in_timing  # Splash on the same mask
        assert not a.reorders_in_timing and b.reorders_in_timing and b.grid == SMALL_CPU.grid
        assert a.kernel_mask is a.mask and r.kernel_mask is r.mask
        np.testing.assert_array_equal(a.mask.to_dense(), b.kernel_mask.to_dense())
        np.testing.assert_array_equal(b.mask.to_dense(), r.mask.to_dense())  # raster order


def test_case_inputs_permute_only_outside_the_timed_call(small_cases):
    q, k, v = stlib.random_qkv(SMALL_CPU.qkv_shape, SMALL_CPU.dtype, seed=0)
    by_label = {c.label: c for c in small_cases}
    assert all(x is y for x, y in zip(case_inputs(by_label["Splash (dense)"], q, k, v), (q, k, v)))
    reordering = by_label["pallas_tile (3-D tiled) + reordering"]
    assert all(x is y for x, y in zip(case_inputs(reordering, q, k, v), (q, k, v)))
    tiled = by_label["pallas_tile (3-D tiled)"]
    qq, _, _ = case_inputs(tiled, q, k, v)
    np.testing.assert_array_equal(np.asarray(qq), np.asarray(tiled.order.apply(q)))


def test_reordering_case_equals_the_tiled_case_restored(small_cases):
    """The "+ reordering" call (raster in, raster out) and the tiled call (tiled in, tiled out)
    compute the same attention."""
    tiled = next(c for c in small_cases if c.label == "pallas_tile (3-D tiled)")
    reordering = next(c for c in small_cases if c.label == "pallas_tile (3-D tiled) + reordering")
    q, k, v = stlib.random_qkv(SMALL_CPU.qkv_shape, SMALL_CPU.dtype, seed=1)
    scale = SMALL_CPU.head_dim**-0.5
    out_tiled = case_function(tiled, scale, interpret=True)(*case_inputs(tiled, q, k, v))
    out_raster = case_function(reordering, scale, interpret=True)(*case_inputs(reordering, q, k, v))
    np.testing.assert_allclose(
        np.asarray(tiled.order.restore(out_tiled)), np.asarray(out_raster), rtol=1e-5, atol=1e-5
    )
