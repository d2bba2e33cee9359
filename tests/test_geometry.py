"""Video grid, token orders and padding (stlib/geometry.py) against definitions written from the spec."""

from __future__ import annotations

import itertools
import pickle

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import stlib
from stlib import VideoGrid, pad_tokens, padded_length, raster_order, tiled_order, token_major_order

SHAPES = [(1, 1, 1), (2, 3, 4), (3, 5, 7), (4, 6, 7), (5, 1, 3)]
small_sizes = st.integers(1, 6)
grids = st.builds(VideoGrid, small_sizes, small_sizes, small_sizes)
tiles = st.tuples(st.integers(1, 4), st.integers(1, 4), st.integers(1, 4))
FEW = settings(max_examples=20, deadline=None)


def raster(shape, t, y, x):
    return (t * shape[1] + y) * shape[2] + x


def assert_valid_order(order, num_tokens):
    perm = np.asarray(order.perm)
    assert perm.ndim == 1 and np.issubdtype(perm.dtype, np.integer)
    real = perm[perm >= 0]
    assert sorted(real.tolist()) == list(range(num_tokens)), "each raster token exactly once"
    assert np.all(perm[perm < 0] == -1), "padding slots are -1"
    assert order.length == perm.size
    assert order.num_tokens == num_tokens
    np.testing.assert_array_equal(order.valid, perm >= 0)
    inv = np.asarray(order.inverse)
    assert inv.shape == (num_tokens,)
    np.testing.assert_array_equal(perm[inv], np.arange(num_tokens))  # perm o inverse = id
    for pos in np.flatnonzero(perm >= 0):
        assert inv[perm[pos]] == pos  # inverse o perm = id on real slots


# ------------------------------------------------------------------------------------------------
# VideoGrid


@pytest.mark.parametrize("shape", SHAPES)
def test_grid_sizes(shape):
    g = VideoGrid(*shape)
    assert g.shape == shape
    assert (g.frames, g.height, g.width) == shape
    assert g.num_tokens == shape[0] * shape[1] * shape[2]
    assert g.tokens_per_frame == shape[1] * shape[2]


@pytest.mark.parametrize(
    "args", [(0, 2, 2), (2, 0, 2), (2, 2, 0), (-1, 2, 2), (2, -3, 2), (2, 2, -1)], ids=str
)
def test_grid_rejects_non_positive(args):
    with pytest.raises(ValueError):
        VideoGrid(*args)


@pytest.mark.parametrize("args", [(2.0, 2, 2), (2, "3", 2), (2, 2, None), (True, 2, 2), (2, 2, 2.5)], ids=str)
def test_grid_rejects_non_int(args):
    with pytest.raises(TypeError):
        VideoGrid(*args)


@pytest.mark.parametrize("shape", SHAPES)
def test_coords_round_trip(shape):
    g = VideoGrid(*shape)
    idx = np.arange(g.num_tokens)
    t, y, x = g.coords(idx)
    expected = np.array(list(itertools.product(*(range(n) for n in shape))))  # raster = t, y, x nesting
    np.testing.assert_array_equal(np.stack([t, y, x], axis=1), expected)
    np.testing.assert_array_equal(g.raster_index(t, y, x), idx)
    # also works elementwise on arbitrary shapes and on jnp arrays
    idx2 = idx[::-1].reshape(-1, 1)
    np.testing.assert_array_equal(g.raster_index(*g.coords(idx2)), idx2)
    tj, _, xj = g.coords(jnp.asarray(idx))
    np.testing.assert_array_equal(np.asarray(tj), t)
    np.testing.assert_array_equal(np.asarray(xj), x)


def test_check_length():
    g = VideoGrid(2, 3, 4)
    g.check_length(24)
    with pytest.raises(ValueError, match="24"):
        g.check_length(25)


# ------------------------------------------------------------------------------------------------
# orders: definitions


@pytest.mark.parametrize("shape", SHAPES)
def test_raster_order_is_identity(shape):
    g = VideoGrid(*shape)
    order = raster_order(g)
    assert_valid_order(order, g.num_tokens)
    np.testing.assert_array_equal(order.perm, np.arange(g.num_tokens))
    assert order.is_identity


@pytest.mark.parametrize("shape", SHAPES)
def test_token_major_definition(shape):
    g = VideoGrid(*shape)
    order = token_major_order(g)
    assert_valid_order(order, g.num_tokens)
    assert order.length == g.num_tokens
    expected = [
        raster(shape, t, y, x) for y in range(shape[1]) for x in range(shape[2]) for t in range(shape[0])
    ]
    np.testing.assert_array_equal(order.perm, expected)


@pytest.mark.parametrize("shape", SHAPES)
def test_token_major_frames_of_a_location_are_contiguous(shape):
    g = VideoGrid(*shape)
    perm = np.asarray(token_major_order(g).perm)
    T = shape[0]
    for block_start in range(0, g.num_tokens, T):
        block = perm[block_start : block_start + T]
        ys = {(b // shape[2]) % shape[1] for b in block}
        xs = {b % shape[2] for b in block}
        ts = [b // (shape[1] * shape[2]) for b in block]
        assert len(ys) == 1 and len(xs) == 1, "one spatial location per run of T"
        assert ts == list(range(T)), "frames in increasing order"


def brute_tiled_perm(shape, tile, pad):
    """Tiles in raster order of tile index; inside a tile real tokens in raster order, padding last."""
    counts = [-(-n // s) for n, s in zip(shape, tile)]
    volume = tile[0] * tile[1] * tile[2]
    perm = []
    for a, b, c in itertools.product(*(range(n) for n in counts)):
        real = [
            raster(shape, t, y, x)
            for t in range(a * tile[0], min((a + 1) * tile[0], shape[0]))
            for y in range(b * tile[1], min((b + 1) * tile[1], shape[1]))
            for x in range(c * tile[2], min((c + 1) * tile[2], shape[2]))
        ]
        perm += real + ([-1] * (volume - len(real)) if pad else [])
    return perm


@pytest.mark.parametrize("pad", [True, False])
@pytest.mark.parametrize(
    "shape,tile",
    [
        ((4, 6, 8), (2, 3, 4)),
        ((3, 5, 7), (2, 2, 3)),
        ((4, 6, 7), (3, 4, 4)),
        ((2, 3, 4), (5, 5, 5)),
        ((3, 4, 5), 1),
    ],
    ids=str,
)
def test_tiled_order_definition(shape, tile, pad):
    g = VideoGrid(*shape)
    tile3 = tile if isinstance(tile, tuple) else (tile,) * 3
    order = tiled_order(g, tile, pad=pad)
    assert_valid_order(order, g.num_tokens)
    np.testing.assert_array_equal(order.perm, brute_tiled_perm(shape, tile3, pad))


@FEW
@given(grid=grids, tile=tiles)
def test_tiled_order_tiles_contiguous(grid, tile):
    """Each tile occupies one contiguous run of tile-volume slots, real tokens first, padding last."""
    shape = grid.shape
    order = tiled_order(grid, tile)
    assert_valid_order(order, grid.num_tokens)
    volume = tile[0] * tile[1] * tile[2]
    counts = [-(-n // s) for n, s in zip(shape, tile)]
    assert order.length == counts[0] * counts[1] * counts[2] * volume
    perm = np.asarray(order.perm)
    seen_tiles = []
    for start in range(0, order.length, volume):
        chunk = perm[start : start + volume]
        real = chunk[chunk >= 0]
        n_real = real.size
        assert n_real > 0
        assert np.all(chunk[:n_real] >= 0) and np.all(chunk[n_real:] == -1), "real first, padding last"
        tile_ids = {
            tuple(
                c // s
                for c, s in zip((r // (shape[1] * shape[2]), (r // shape[2]) % shape[1], r % shape[2]), tile)
            )
            for r in real
        }
        assert len(tile_ids) == 1, "one tile per run"
        seen_tiles.append(tile_ids.pop())
        assert list(real) == sorted(real), "raster order inside the tile"
    assert seen_tiles == sorted(seen_tiles) and len(set(seen_tiles)) == len(seen_tiles), (
        "tiles in raster order"
    )
    # a divisible grid needs no padding
    if all(n % s == 0 for n, s in zip(shape, tile)):
        assert order.length == grid.num_tokens and bool(np.all(order.valid))


def _orders_with_formula(grid, tile):
    orders = [
        raster_order(grid),
        token_major_order(grid),
        tiled_order(grid, tile),
        tiled_order(grid, tile).with_prefix(2),
    ]
    return [o for o in orders if getattr(o, "raster_of", None) is not None]


@FEW
@given(grid=grids, tile=tiles)
def test_arithmetic_order_forms(grid, tile):
    """Where an order has an arithmetic form (raster_of), it equals perm."""
    for order in _orders_with_formula(grid, tile):
        np.testing.assert_array_equal(
            order.raster_of(np.arange(order.length)), order.perm, err_msg=order.name
        )


@pytest.mark.parametrize("shape,tile", [((3, 5, 7), (2, 2, 3)), ((4, 6, 8), (2, 3, 4))], ids=str)
def test_arithmetic_order_forms_on_jax_arrays(shape, tile):
    for order in _orders_with_formula(VideoGrid(*shape), tile):
        pos = jnp.arange(order.length, dtype=jnp.int32)
        np.testing.assert_array_equal(np.asarray(order.raster_of(pos)), order.perm, err_msg=order.name)


@FEW
@given(grid=grids, tile=tiles)
def test_unpadded_tiled_order_drops_padding(grid, tile):
    padded, unpadded = tiled_order(grid, tile), tiled_order(grid, tile, pad=False)
    assert_valid_order(unpadded, grid.num_tokens)
    assert unpadded.length == grid.num_tokens
    np.testing.assert_array_equal(unpadded.perm, padded.perm[padded.perm >= 0])


def test_tiled_order_rejects_bad_tile():
    g = VideoGrid(2, 3, 4)
    for bad in (0, (1, 0, 1), (-1, 1, 1)):
        with pytest.raises(ValueError):
            tiled_order(g, bad)
    for bad in ((1, 1), (1, 1, 1, 1)):
        with pytest.raises(ValueError):
            tiled_order(g, bad)
    for bad in (1.5, (1, 1.0, 1), "abc", None):
        with pytest.raises(TypeError):
            tiled_order(g, bad)


@pytest.mark.parametrize("builder", [raster_order, token_major_order, lambda g: tiled_order(g, 2)])
def test_order_builders_reject_non_grid(builder):
    with pytest.raises(TypeError):
        builder((2, 3, 4))


def test_token_order_rejects_non_permutation():
    with pytest.raises(ValueError):
        stlib.TokenOrder("dup", np.array([0, 0, 1], np.int32), 3)
    with pytest.raises(ValueError):
        stlib.TokenOrder("missing", np.array([0, 2, -1], np.int32), 3)


ORDER_BUILDERS = {
    "raster": lambda g: raster_order(g),
    "token-major": lambda g: token_major_order(g),
    "tiled": lambda g: tiled_order(g, (2, 2, 3)),
    "tiled unpadded": lambda g: tiled_order(g, (2, 2, 3), pad=False),
    "tiled + prefix": lambda g: tiled_order(g, (2, 2, 3)).with_prefix(2),
}


@pytest.mark.parametrize("name", ORDER_BUILDERS)
def test_token_order_equal_by_value(name):
    make = ORDER_BUILDERS[name]
    a, b = make(VideoGrid(3, 4, 5)), make(VideoGrid(3, 4, 5))
    assert a is not b and a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a != make(VideoGrid(3, 4, 6)) and a != make(VideoGrid(4, 4, 5))


def test_token_orders_of_one_grid_all_differ():
    g = VideoGrid(3, 4, 5)
    orders = [make(g) for make in ORDER_BUILDERS.values()] + [tiled_order(g, (1, 2, 5))]
    assert len(set(orders)) == len(orders)
    assert all((a == b) == (i == j) for i, a in enumerate(orders) for j, b in enumerate(orders))


def test_token_order_value_is_name_sizes_perm_and_formula():
    perm = np.array([2, 0, 1], np.int32)
    order = stlib.TokenOrder("p", perm, 3)
    assert order == stlib.TokenOrder("p", perm.astype(np.int64), 3)  # the dtype is not the value
    assert order == stlib.TokenOrder("p", [2, 0, 1], 3)
    assert order != stlib.TokenOrder("q", perm, 3)
    assert order != stlib.TokenOrder("p", np.array([1, 0, 2], np.int32), 3)
    assert order != stlib.TokenOrder("p", np.array([2, 0, -1, 1], np.int32), 3)
    # an order with an arithmetic form differs from the same permutation without one
    g = VideoGrid(2, 2, 4)  # divisible by the tile: padded and unpadded orders share name and perm
    padded, unpadded = tiled_order(g, (1, 2, 2)), tiled_order(g, (1, 2, 2), pad=False)
    assert padded.name == unpadded.name and np.array_equal(padded.perm, unpadded.perm)
    assert padded.raster_of is not None and unpadded.raster_of is None
    assert padded != unpadded
    assert order != "p" and order.__eq__(perm) is NotImplemented


def test_token_order_perm_is_read_only():
    perm = np.array([2, 0, 1], np.int32)
    order = stlib.TokenOrder("p", perm, 3)
    assert not order.perm.flags.writeable and perm.flags.writeable
    with pytest.raises(ValueError):
        order.perm[0] = 1


@pytest.mark.parametrize("name", ORDER_BUILDERS)
def test_token_order_pickle_round_trip(name):
    order = ORDER_BUILDERS[name](VideoGrid(3, 4, 5))
    _ = hash(order), order.inverse  # cached values travel with the order
    back = pickle.loads(pickle.dumps(order))
    assert back == order and hash(back) == hash(order)
    np.testing.assert_array_equal(back.perm, order.perm)
    if order.raster_of is not None:
        pos = np.arange(order.length)
        np.testing.assert_array_equal(back.raster_of(pos), order.perm)


# ------------------------------------------------------------------------------------------------
# apply / restore


def random_hld(rng, heads, length, dim, dtype=np.float32):
    return jnp.asarray(rng.standard_normal((heads, length, dim)).astype(dtype))


def order_cases():
    yield "raster", lambda g: raster_order(g)
    yield "token-major", lambda g: token_major_order(g)
    yield "tiled-2x2x3", lambda g: tiled_order(g, (2, 2, 3))
    yield "tiled-3x4x4", lambda g: tiled_order(g, (3, 4, 4))
    yield "tiled-unpadded", lambda g: tiled_order(g, (3, 4, 4), pad=False)


@pytest.mark.parametrize("name,make", list(order_cases()), ids=[n for n, _ in order_cases()])
@pytest.mark.parametrize("shape", [(3, 5, 7), (4, 6, 8), (1, 1, 5)], ids=str)
def test_apply_restore_round_trip(name, make, shape):
    rng = np.random.default_rng(sum(shape))
    g = VideoGrid(*shape)
    order = make(g)
    x = random_hld(rng, 2, g.num_tokens, 3)
    y = order.apply(x)
    assert y.shape == (2, order.length, 3)
    assert y.dtype == x.dtype
    xn, yn = np.asarray(x), np.asarray(y)
    perm = np.asarray(order.perm)
    for pos in range(order.length):
        if perm[pos] >= 0:
            np.testing.assert_array_equal(yn[:, pos], xn[:, perm[pos]])
        else:
            np.testing.assert_array_equal(yn[:, pos], 0.0)  # padding slots are zeros
    np.testing.assert_array_equal(np.asarray(order.restore(y)), xn)
    # restore ignores whatever sits in the padding slots
    junk = np.where(np.asarray(order.valid)[None, :, None], yn, 123.0)
    np.testing.assert_array_equal(np.asarray(order.restore(jnp.asarray(junk))), xn)


@FEW
@given(grid=grids, tile=tiles)
def test_apply_restore_random_ragged(grid, tile):
    rng = np.random.default_rng(grid.num_tokens)
    order = tiled_order(grid, tile)
    x = random_hld(rng, 1, grid.num_tokens, 2)
    y = np.asarray(order.apply(x))
    assert np.all(y[:, ~np.asarray(order.valid)] == 0)
    np.testing.assert_array_equal(np.asarray(order.restore(jnp.asarray(y))), np.asarray(x))


def test_apply_keeps_bf16():
    g = VideoGrid(2, 3, 5)
    order = tiled_order(g, (2, 2, 2))
    x = jnp.ones((1, g.num_tokens, 4), jnp.bfloat16)
    y = order.apply(x)
    assert y.dtype == jnp.bfloat16
    assert float(y.astype(jnp.float32).sum()) == g.num_tokens * 4


def test_apply_restore_reject_bad_shapes():
    g = VideoGrid(2, 3, 5)
    order = tiled_order(g, (2, 2, 2))
    with pytest.raises(ValueError):
        order.apply(jnp.zeros((g.num_tokens, 4)))
    with pytest.raises(ValueError):
        order.apply(jnp.zeros((1, g.num_tokens + 1, 4)))
    with pytest.raises(ValueError):
        order.restore(jnp.zeros((1, g.num_tokens, 4)))  # needs the padded length
    with pytest.raises(ValueError):
        order.restore(jnp.zeros((1, 1, order.length, 4)))


def test_with_prefix():
    g = VideoGrid(2, 2, 3)
    order = tiled_order(g, (1, 2, 2))
    pre = order.with_prefix(3)
    assert_valid_order(pre, g.num_tokens + 3)
    np.testing.assert_array_equal(pre.perm[:3], [0, 1, 2])
    base = np.asarray(order.perm)
    np.testing.assert_array_equal(pre.perm[3:], np.where(base >= 0, base + 3, -1))


# ------------------------------------------------------------------------------------------------
# padding


@pytest.mark.parametrize("length,block", [(1, 8), (8, 8), (9, 8), (100, 128), (128, 128), (129, 128), (7, 1)])
def test_padded_length(length, block):
    expected = ((length + block - 1) // block) * block
    assert padded_length(length, block) == expected
    assert expected % block == 0 and expected >= length > expected - block


@pytest.mark.parametrize(
    "length,block,exc",
    [
        (0, 8, ValueError),
        (8, 0, ValueError),
        (-1, 8, ValueError),
        (8, -8, ValueError),
        (8.0, 8, TypeError),
        (8, 8.0, TypeError),
    ],
)
def test_padded_length_rejects(length, block, exc):
    with pytest.raises(exc):
        padded_length(length, block)


@pytest.mark.parametrize("length,block", [(5, 8), (8, 8), (13, 4), (1, 1)])
def test_pad_tokens(length, block):
    rng = np.random.default_rng(length)
    x = random_hld(rng, 2, length, 3)
    padded, valid = pad_tokens(x, block)
    target = -(-length // block) * block
    assert padded.shape == (2, target, 3)
    assert padded.dtype == x.dtype
    np.testing.assert_array_equal(np.asarray(valid), np.arange(target) < length)
    np.testing.assert_array_equal(np.asarray(padded)[:, :length], np.asarray(x))
    assert np.all(np.asarray(padded)[:, length:] == 0)


def test_pad_tokens_rejects():
    with pytest.raises(ValueError):
        pad_tokens(jnp.zeros((4, 3)), 8)
    with pytest.raises(ValueError):
        pad_tokens(jnp.zeros((1, 4, 3)), 0)
    with pytest.raises(TypeError):
        pad_tokens(jnp.zeros((1, 4, 3)), 2.5)
