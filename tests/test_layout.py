"""Tile layouts (stlib/layout.py) against a brute-force computation from the dense mask."""

from __future__ import annotations

import sys

import _brute as bf
import numpy as np
import pytest
from conftest import run

import stlib
from stlib import TileKind, VideoGrid, block_layout, masks, tiled_order, token_major_order
from stlib.device import smem_limit
from stlib.layout import smem_bytes


def smem_rule(shape):
    """Bytes in SMEM (docstring rule): 4-byte words; a 1-D array is padded to a multiple of 128
    words; otherwise the last dim is padded to 128 and the second-to-last to 8."""
    shape = tuple(shape)
    if len(shape) == 1:
        return -(-shape[0] // 128) * 128 * 4
    lead = int(np.prod(shape[:-2])) if len(shape) > 2 else 1
    rows = -(-shape[-2] // 8) * 8
    cols = -(-shape[-1] // 128) * 128
    return lead * rows * cols * 4


def check_layout(layout, dense, valid, block_q, block_kv):
    """Compare every documented array and number of ``layout`` with the brute force."""
    want = bf.brute_layout(dense, valid, block_q, block_kv)
    heads = want["counts"].shape[0]
    nq, nk = want["counts"].shape[1:]
    assert layout.block_q == block_q and layout.block_kv == block_kv
    assert layout.grid_shape == (nq, nk)
    assert layout.num_heads == heads

    assert layout.counts.shape == (heads, nq, nk)
    np.testing.assert_array_equal(layout.counts, want["counts"])
    np.testing.assert_array_equal(layout.valid_pairs, want["valid_pairs"])
    assert layout.kinds.dtype == np.int8 and layout.kinds.shape == (heads, nq, nk)
    np.testing.assert_array_equal(layout.kinds, want["kinds"])
    assert layout.num_tokens == want["num_tokens"]

    valid = np.asarray(valid, bool)
    q_valid = [int(valid[i * block_q : (i + 1) * block_q].sum()) for i in range(nq)]
    kv_valid = [int(valid[i * block_kv : (i + 1) * block_kv].sum()) for i in range(nk)]
    np.testing.assert_array_equal(layout.q_valid, q_valid)
    np.testing.assert_array_equal(layout.kv_valid, kv_valid)

    # summary numbers
    kinds = want["kinds"]
    nonempty = int(np.sum(kinds != bf.EMPTY))
    allowed = int(want["counts"].sum())
    n_real = want["num_tokens"]
    assert layout.allowed_pairs == allowed
    assert layout.density == pytest.approx(allowed / (heads * n_real**2))
    assert layout.occupancy == pytest.approx(nonempty / kinds.size)
    partial = int(np.sum(kinds == bf.PARTIAL))
    assert layout.partial_fraction == pytest.approx(partial / nonempty if nonempty else 0.0)
    assert layout.computed_pairs == nonempty * block_q * block_kv
    assert layout.work_efficiency == pytest.approx(
        allowed / (nonempty * block_q * block_kv) if nonempty else 1.0
    )
    assert layout.kind_counts() == {
        "EMPTY": int(np.sum(kinds == 0)),
        "PARTIAL": partial,
        "FULL": int(np.sum(kinds == 2)),
    }

    # per-row tables
    rows = want["row_lists"]
    width = max(max(len(r) for h in rows for r in h), 1)
    assert layout.row_counts.dtype == np.int32 and layout.row_counts.shape == (heads, nq)
    assert layout.row_kv_tiles.dtype == np.int32 and layout.row_kv_tiles.shape == (heads, nq, width)
    assert layout.row_kinds.dtype == np.int32 and layout.row_kinds.shape == (heads, nq, width)
    assert layout.max_row_width == width
    for h in range(heads):
        for qi in range(nq):
            lst = rows[h][qi]
            assert layout.row_counts[h, qi] == len(lst)
            tiles = layout.row_kv_tiles[h, qi].tolist()
            fill = lst[-1] if lst else 0
            assert tiles == lst + [fill] * (width - len(lst)), (h, qi)
            assert layout.row_kinds[h, qi].tolist() == [int(kinds[h, qi, k]) for k in lst] + [0] * (
                width - len(lst)
            )

    # flattened steps
    steps = want["steps"]
    for name in ("step_head", "step_q", "step_kv", "step_kinds"):
        arr = getattr(layout, name)
        assert arr.dtype == np.int32 and arr.shape == (len(steps),), name
    got = list(
        zip(
            layout.step_head.tolist(),
            layout.step_q.tolist(),
            layout.step_kv.tolist(),
            layout.step_kinds.tolist(),
        )
    )
    assert got == steps
    assert layout.num_steps == len(steps)
    # every non-empty tile exactly once; a row without one gets exactly one EMPTY placeholder
    real_steps = [(h, q, k) for h, q, k, kind in steps if kind != bf.EMPTY]
    assert sorted(real_steps) == sorted(map(tuple, np.argwhere(kinds != bf.EMPTY).tolist()))
    assert len(set(real_steps)) == len(real_steps)
    for h in range(heads):
        for qi in range(nq):
            if not rows[h][qi]:
                assert [(k, kind) for hh, q, k, kind in steps if (hh, q) == (h, qi)] == [(0, bf.EMPTY)]

    # SMEM sizes of the prefetched tables
    assert layout.table_bytes("rows") == 2 * smem_rule((heads, nq, width)) + smem_rule((heads, nq))
    assert layout.table_bytes("flat") == 4 * smem_rule((len(steps),))
    assert layout.fits_smem("rows") == (layout.table_bytes("rows") <= smem_limit())

    # tiles a kernel must mask: PARTIAL, and FULL tiles whose kv tile holds padding
    kv_padded = np.array([kv < block_kv for kv in kv_valid])
    np.testing.assert_array_equal(
        layout.masked_tiles, (kinds == bf.PARTIAL) | ((kinds == bf.FULL) & kv_padded)
    )

    # partial tiles reproduce their masks
    blocks, index = layout.partial_block_table()
    assert index.shape == (heads, nq, nk) and index.dtype == np.int32
    assert blocks.dtype == bool and blocks.shape[1:] == (block_q, block_kv)
    np.testing.assert_array_equal(index >= 0, kinds == bf.PARTIAL)
    length = valid.size
    d3 = np.asarray(dense)[None] if np.asarray(dense).ndim == 2 else np.asarray(dense)
    padded = np.zeros((heads, nq * block_q, nk * block_kv), bool)
    padded[:, :length, :length] = d3
    for h, qi, ki in np.argwhere(kinds == bf.PARTIAL):
        tile = padded[h, qi * block_q : (qi + 1) * block_q, ki * block_kv : (ki + 1) * block_kv]
        np.testing.assert_array_equal(blocks[index[h, qi, ki]], tile)
        np.testing.assert_array_equal(layout.tile_mask(int(h), int(qi), int(ki)), tile)
    assert len({b.tobytes() for b in blocks}) == blocks.shape[0], "partial blocks are deduplicated"
    if blocks.shape[0]:
        assert set(np.unique(index[index >= 0]).tolist()) == set(range(blocks.shape[0]))
    return want


def test_tile_kind_enum():
    assert (TileKind.EMPTY, TileKind.PARTIAL, TileKind.FULL) == (0, 1, 2)


# ------------------------------------------------------------------------------------------------
# random explicit masks


@pytest.mark.parametrize("length", [1, 7, 13, 24, 37])
@pytest.mark.parametrize("density", [0.0, 0.05, 0.3, 0.97, 1.0])
@pytest.mark.parametrize("blocks", [(8, 8), (4, 6), (16, 8)], ids=str)
def test_random_masks(length, density, blocks):
    rng = np.random.default_rng(length * 100 + int(density * 100))
    arr = rng.random((length, length)) < density
    arr[rng.random(length) < 0.2] = False  # rows with nothing visible
    check_layout(block_layout(masks.from_array(arr), *blocks), arr, np.ones(length, bool), *blocks)


def test_structured_full_and_empty_tiles():
    arr = np.zeros((20, 20), bool)
    arr[:8, :8] = True  # one FULL tile
    arr[8:16, 0] = True  # PARTIAL
    arr[16:, 16:] = True  # the ragged corner tile [16:20, 16:20] is FULL: its 16 real pairs are allowed
    lay = block_layout(masks.from_array(arr), 8, 8)
    check_layout(lay, arr, np.ones(20, bool), 8, 8)
    assert lay.kinds[0].tolist() == [[2, 0, 0], [1, 0, 0], [0, 0, 2]]
    assert lay.valid_pairs[2, 2] == 16


def test_two_head_array_mask():
    rng = np.random.default_rng(3)
    arr = rng.random((2, 29, 29)) < 0.2
    arr[1] = False  # an all-empty head
    lay = block_layout(masks.from_array(arr), 8, 8)
    assert not lay.shared_across_heads
    want = check_layout(lay, arr, np.ones(29, bool), 8, 8)
    assert np.all(want["kinds"][1] == 0)
    assert lay.row_counts[1].tolist() == [0] * 4 and lay.row_kv_tiles[1].max() == 0


HEAD_CACHE_SCRIPT = """
import numpy as np, stlib
from stlib import masks
rng = np.random.default_rng(4)
bad = []
for trial in range(4):
    arr = rng.random((5, 24, 24)) < 0.3
    arr[2] = False
    arr[3, :8, :8] = True
    lay = stlib.block_layout(masks.from_array(arr), 8, 8)
    want = arr.reshape(5, 3, 8, 3, 8).sum(axis=(2, 4))
    bad += [h for h in range(5) if not np.array_equal(lay.counts[h], want[h])]
print("WRONG_HEADS", bad)
"""


def test_multi_head_array_mask_three_or_more_heads():
    """Regression: block_layout once cached per-head counts by id() of the transient head views of
    mask.head(h); a freed view's id was reused, so heads >= 2 got an earlier head's counts. Whether
    an id is reused depends on the allocator's state, so the check runs in a fresh interpreter,
    where the old code failed reproducibly (in-process it passed or failed with earlier tests)."""
    out = run([sys.executable, "-c", HEAD_CACHE_SCRIPT])
    assert out.stdout.strip().splitlines()[-1] == "WRONG_HEADS []"


def test_per_head_masks():
    g = VideoGrid(3, 4, 5)
    parts = [masks.spatial(g), masks.temporal(g, 2), masks.frame_causal(g), masks.spatial(g)]
    parts.append(parts[1])  # the same object twice: shared computation must not mix heads
    m = masks.per_head(parts)
    for blocks in ((8, 8), (16, 24), (20, 20)):
        lay = block_layout(m, *blocks)
        assert lay.num_heads == 5
        check_layout(lay, m.to_dense(), np.ones(60, bool), *blocks)


def test_heads_equal_by_value_are_counted_once(monkeypatch):
    """Heads whose masks (and orders) are equal by value share one count, objects or not; heads that
    differ, also only by head index of one array, do not."""
    from stlib import tile_counts

    calls = []
    real = tile_counts.tile_counts
    monkeypatch.setattr(tile_counts, "tile_counts", lambda *a: calls.append(a) or real(*a))
    g = VideoGrid(3, 4, 5)
    order = tiled_order(g, (1, 2, 5))
    heads = [
        masks.spatial(g).permute(order),
        masks.temporal(g, 2).permute(tiled_order(g, (1, 2, 5))),
        masks.spatial(g).permute(tiled_order(g, (1, 2, 5))),
        masks.temporal(g, 2).permute(order),
    ]
    m = masks.per_head(heads)
    lay = block_layout(m, 8, 8)
    assert len(calls) == 2
    check_layout(lay, m.to_dense(), np.asarray(order.valid), 8, 8)
    calls.clear()
    arr = np.stack([np.eye(24, dtype=bool)] * 3)
    block_layout(masks.from_array(arr), 8, 8)
    assert len(calls) == 3  # head views of one array: one per head


def test_head_uniform_layout_has_one_head():
    lay = block_layout(masks.band(40, 3), 8, 8)
    assert lay.shared_across_heads and lay.counts.shape[0] == 1
    check_layout(lay, masks.band(40, 3).to_dense(), np.ones(40, bool), 8, 8)


# ------------------------------------------------------------------------------------------------
# built-in masks, raster and permuted orders (padding slots are not real)

G = VideoGrid(4, 6, 7)


def raster_cases():
    yield "nbhd", masks.neighborhood(G, (3, 3, 5), causal=(True, False, False))
    yield "sta", masks.sliding_tile(G, (2, 4, 3), (1, 1, 3))
    yield "spatial_band+anchor", masks.spatial_band(G, 0.2, anchor=True)
    yield "temporal_band", masks.temporal_band(G, 0.2)
    yield "radial", masks.radial(G, 12)
    yield "global", masks.global_tokens(masks.temporal(G, 1), 5)
    yield "or", masks.spatial(G) | masks.temporal(G, 0)


@pytest.mark.parametrize("name,mask", list(raster_cases()), ids=[n for n, _ in raster_cases()])
@pytest.mark.parametrize("blocks", [(8, 8), (16, 32), (24, 40)], ids=str)
def test_builtin_masks_raster(name, mask, blocks):
    check_layout(block_layout(mask, *blocks), mask.to_dense(), np.ones(mask.length, bool), *blocks)


def permuted_cases():
    yield "sta-tiled", masks.sliding_tile(G, (2, 4, 3), (1, 1, 3)), tiled_order(G, (2, 4, 3))
    yield "nbhd-tiled", masks.neighborhood(G, 3), tiled_order(G, (3, 4, 4))
    yield "temporal_band-token-major", masks.temporal_band(G, 0.2), token_major_order(G)
    yield "radial-tiled-unpadded", masks.radial(G, 10), tiled_order(G, (3, 4, 4), pad=False)
    yield (
        "per-head-tiled",
        masks.per_head([masks.spatial(G), masks.temporal(G, 3)]),
        tiled_order(G, (2, 2, 2)),
    )
    rng = np.random.default_rng(5)
    arr = rng.random((2, G.num_tokens, G.num_tokens)) < 0.1
    yield "array2-tiled", masks.from_array(arr), tiled_order(G, (3, 5, 5))


@pytest.mark.parametrize("name,base,order", list(permuted_cases()), ids=[n for n, _, _ in permuted_cases()])
@pytest.mark.parametrize("blocks", [(8, 8), (24, 16)], ids=str)
def test_permuted_masks(name, base, order, blocks):
    m = base.permute(order)
    lay = block_layout(m, *blocks)
    check_layout(lay, m.to_dense(), np.asarray(order.valid), *blocks)


def test_dense_fallback_masks_without_intervals():
    """A composition that contains a permuted mask has no interval form: counted densely."""
    order = token_major_order(G)
    m = masks.temporal_band(G, 0.2).permute(order) & masks.band(G.num_tokens, 30)
    assert not m.has_intervals
    check_layout(block_layout(m, 16, 16), m.to_dense(), np.ones(G.num_tokens, bool), 16, 16)
    big = VideoGrid(1, 1, masks.DENSE_LIMIT + 8)
    huge = masks.full(big.num_tokens).permute(stlib.raster_order(big)) & masks.full(big.num_tokens)
    with pytest.raises(ValueError):
        block_layout(huge, 128, 128)


def test_padding_is_not_real_inside_compositions():
    order = tiled_order(G, (3, 4, 4))
    m = masks.sliding_tile(G, (3, 4, 4), 1).permute(order) & masks.full(order.length)
    check_layout(block_layout(m, 48, 48), m.to_dense(), np.asarray(order.valid), 48, 48)


# ------------------------------------------------------------------------------------------------
# the tile-alignment equality: sliding tile in 3-D tiled order has no PARTIAL tiles


@pytest.mark.parametrize("shape", [(6, 12, 24), (5, 10, 21)], ids=["divisible", "ragged"])
def test_sliding_tile_in_tiled_order_has_no_partial_tiles(shape):
    grid = VideoGrid(*shape)
    tile, window = (2, 4, 8), (3, 1, 3)
    volume = tile[0] * tile[1] * tile[2]
    order = tiled_order(grid, tile)
    lay = block_layout(masks.sliding_tile(grid, tile, window).permute(order), volume, volume)
    counts = [-(-n // s) for n, s in zip(shape, tile)]
    assert lay.kind_counts()["PARTIAL"] == 0
    assert lay.partial_fraction == 0.0
    # the non-empty tiles are exactly the tile window of each tile
    tiles = [(a, b, c) for a in range(counts[0]) for b in range(counts[1]) for c in range(counts[2])]

    def in_window(a, b):
        ok = True
        for axis in range(3):
            first = min(max(a[axis] - window[axis] // 2, 0), counts[axis] - window[axis])
            ok &= first <= b[axis] < first + window[axis]
        return ok

    expected = np.array([[2 if in_window(a, b) else 0 for b in tiles] for a in tiles])
    np.testing.assert_array_equal(lay.kinds[0], expected)
    # and the raster-order layout of the same mask does have partial tiles
    assert block_layout(masks.sliding_tile(grid, tile, window), volume, volume).kind_counts()["PARTIAL"] > 0


# ------------------------------------------------------------------------------------------------
# large L: spot-check tiles against block() (no L x L anywhere)


def test_case_study_neighborhood_spot_check():
    grid = VideoGrid(21, 45, 80)
    mask = masks.neighborhood(grid, (3, 7, 7))
    lay = block_layout(mask, 128, 128)
    nq, nk = lay.grid_shape
    assert (nq, nk) == (-(-75600 // 128),) * 2
    rng = np.random.default_rng(0)
    nonempty = np.argwhere(lay.kinds[0] != 0)
    picks = list(nonempty[rng.integers(0, len(nonempty), 12)]) + [(nq - 1, nk - 1), (0, nk - 1)]
    picks += [(qi, int(rng.integers(0, nk))) for qi in rng.integers(0, nq, 6)]
    for qi, ki in picks:
        blk = mask.block(qi * 128, min(qi * 128 + 128, 75600), ki * 128, min(ki * 128 + 128, 75600))
        assert lay.counts[0, qi, ki] == blk.sum(), (qi, ki)
    # every query sees exactly 3 * 7 * 7 keys
    assert lay.allowed_pairs == 75600 * 147


# ------------------------------------------------------------------------------------------------
# the table builders on arbitrary selections


@pytest.mark.parametrize("seed", range(4))
def test_row_tables_and_flat_steps(seed):
    rng = np.random.default_rng(seed)
    selected = rng.random((2, 5, 7)) < [0.0, 0.1, 0.5, 0.9][seed]
    selected[0, 1] = False
    tiles, counts = stlib.layout.row_tables(selected)
    width = max(int(selected.sum(axis=2).max()), 1)
    assert tiles.dtype == np.int32 and counts.dtype == np.int32 and tiles.shape == (2, 5, width)
    steps = stlib.layout.flat_steps(selected)
    want = []
    for h in range(2):
        for q in range(5):
            lst = np.flatnonzero(selected[h, q]).tolist()
            assert counts[h, q] == len(lst)
            assert tiles[h, q].tolist() == lst + [lst[-1] if lst else 0] * (width - len(lst))
            row = [(h, q, k, 1) for k in lst] or [(h, q, 0, 0)]
            want += [r + (int(i == 0), int(i == len(row) - 1)) for i, r in enumerate(row)]
    got = list(
        zip(
            *(
                steps[n].tolist()
                for n in ("step_head", "step_q", "step_kv", "step_active", "step_first", "step_last")
            )
        )
    )
    assert got == want
    assert all(steps[n].dtype == np.int32 for n in steps)


# ------------------------------------------------------------------------------------------------
# SMEM rule, bad input


@pytest.mark.parametrize(
    "shape,nbytes",
    [
        ((1,), 128 * 4),
        ((128,), 128 * 4),
        ((129,), 256 * 4),
        ((1, 1), 8 * 128 * 4),
        ((8, 128), 8 * 128 * 4),
        ((9, 1), 16 * 128 * 4),
        ((3, 5, 130), 3 * 8 * 256 * 4),
        ((2, 2, 8, 128), 4 * 8 * 128 * 4),
    ],
    ids=str,
)
def test_smem_bytes(shape, nbytes):
    assert smem_bytes(shape) == nbytes == smem_rule(shape)
    assert smem_bytes(shape, itemsize=2) == nbytes  # sub-word items still take a word each


def test_block_layout_bad_input():
    m = masks.band(16, 2)
    with pytest.raises(TypeError):
        block_layout(np.ones((16, 16), bool), 8, 8)
    for bq, bk in ((0, 8), (8, -8)):
        with pytest.raises(ValueError):
            block_layout(m, bq, bk)
    for bq, bk in ((8.0, 8), (8, "8")):
        with pytest.raises(TypeError):
            block_layout(m, bq, bk)
    with pytest.raises(ValueError):
        block_layout(m, 8, 8).table_bytes("columns")


def test_one_gradient_of_attention_builds_its_layout_once():
    """The forward, the backward and their custom_vjp share one ``block_layout`` per (mask, blocks):
    the call's plan (``stlib.plan.KernelPlan``) holds it. ``pallas_tile``'s backward runs the
    forward's layout and looks nothing up; the lane-dense backward asks for a layout at its own
    blocks (``backward_steps.block_steps``), here the forward's in interpret mode, and gets it from
    the value-keyed cache, never built twice."""
    import jax

    import stlib
    from stlib import layout as layout_module
    from stlib.registry import Role, by_role

    q, k, v = stlib.random_qkv((2, 512, 64))
    mask = stlib.masks.band(512, 64)
    for role in (Role.TILE, Role.BEST_TILE):
        impl = by_role(role).name
        layout_module._block_layout.cache_clear()

        def loss(q, k, v, impl=impl):
            return stlib.attention(q, k, v, mask, impl=impl, block_q=128, block_kv=128).sum()

        jax.eval_shape(jax.grad(loss, argnums=(0, 1, 2)), q, k, v)
        info = layout_module._block_layout.cache_info()
        assert info.misses == 1 and (info.hits == 0 or role == Role.BEST_TILE), (impl, info)
    built = block_layout(mask, 128, 128)
    with pytest.raises(ValueError, match="read-only"):
        built.counts[0, 0, 0] = 0


def test_a_ring_block_of_a_permuted_mask_is_counted_from_intervals():
    """``block_view`` of a permuted mask (a ring's (q shard, kv shard) pair) is counted from its
    base's intervals and the permutation's window, equal to its dense form, padding slots included."""
    g = VideoGrid(3, 12, 32)  # tiled order pads Y=12 to 3 tiles of 4: no padding; (1, 5, 8): padding
    for tile in ((1, 4, 8), (1, 5, 8)):
        permuted = masks.sliding_tile(g, tile, (1, 3, 3)).permute(tiled_order(g, tile))
        size = permuted.length // 4
        for d, j in ((0, 0), (1, 0), (2, 3), (3, 2)):
            block = permuted.block_view(d * size, j * size, size)
            lay = block_layout(block, 32, 32)
            check_layout(lay, block.to_dense(), np.ones(size, bool), 32, 32)
