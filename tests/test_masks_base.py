"""Value identity of masks (stlib/masks/base.py): equal when built twice with the same parameters,
unequal otherwise, hashing alike, surviving pickling; and ``children()`` of every composite."""

from __future__ import annotations

import pickle

import jax.numpy as jnp
import numpy as np
import pytest

from stlib import VideoGrid, masks, raster_order, tiled_order, token_major_order
from stlib.masks import CombineOp

G = VideoGrid(4, 6, 7)  # 168 tokens
G2 = VideoGrid(4, 6, 8)
L = G.num_tokens


def _eye(n, k=0):
    return np.eye(n, k=k, dtype=bool)


# builder -> variants; each variant builds a fresh mask, and variants differ in one parameter
BUILDERS = {
    "full": [lambda: masks.full(L), lambda: masks.full(L + 1)],
    "band": [lambda: masks.band(L, 3), lambda: masks.band(L, 4), lambda: masks.band(L + 1, 3)],
    "from_array": [
        lambda: masks.from_array(_eye(6)),
        lambda: masks.from_array(_eye(6, 1)),
        lambda: masks.from_array(_eye(7)),
        lambda: masks.from_array(np.stack([_eye(6), _eye(6)])),
        lambda: masks.from_array(np.stack([_eye(6), _eye(6, 1)])),
    ],
    "per_head": [
        lambda: masks.per_head([masks.band(L, 1), masks.full(L)]),
        lambda: masks.per_head([masks.full(L), masks.band(L, 1)]),
        lambda: masks.per_head([masks.band(L, 1), masks.band(L, 1), masks.full(L)]),
    ],
    "neighborhood": [
        lambda: masks.neighborhood(G, 3),
        lambda: masks.neighborhood(G, (3, 3, 5)),
        lambda: masks.neighborhood(G, 3, stride=2),
        lambda: masks.neighborhood(G, 3, dilation=(1, 2, 2)),
        lambda: masks.neighborhood(G, 3, causal=True),
        lambda: masks.neighborhood(G2, 3),
    ],
    "sliding_tile": [
        lambda: masks.sliding_tile(G, (2, 3, 7), (1, 1, 1)),
        lambda: masks.sliding_tile(G, (2, 3, 7), (1, 1, 1)).permute(tiled_order(G, (2, 3, 7))),
        lambda: masks.sliding_tile(G, (1, 3, 7), (1, 1, 1)),
        lambda: masks.sliding_tile(G, (1, 3, 7), (3, 1, 1)),
        lambda: masks.sliding_tile(G2, (2, 3, 7), (1, 1, 1)),
    ],
    "spatial": [
        lambda: masks.spatial(G),
        lambda: masks.spatial(G, 1),
        lambda: masks.spatial(G, anchor=True),
        lambda: masks.spatial(G2),
    ],
    "temporal": [
        lambda: masks.temporal(G),
        lambda: masks.temporal(G, 2),
        lambda: masks.temporal(G, anchor=True),
        lambda: masks.temporal(G2),
    ],
    "spatial_band": [
        lambda: masks.spatial_band(G, width=10),
        lambda: masks.spatial_band(G, width=11),
        lambda: masks.spatial_band(G, width=10, anchor=True),
        lambda: masks.spatial_band(G, 0.8),
    ],
    "temporal_band": [
        lambda: masks.temporal_band(G, width=10),
        lambda: masks.temporal_band(G, width=11),
        lambda: masks.temporal_band(G, width=10, anchor=True),
        lambda: masks.temporal_band(G, width=10).permute(token_major_order(G)),
    ],
    "radial": [
        lambda: masks.radial(G, 8),
        lambda: masks.radial(G, 9),
        lambda: masks.radial(G, 8, sink=False),
        lambda: masks.radial(G2, 8),
    ],
    "frame_causal": [lambda: masks.frame_causal(G), lambda: masks.frame_causal(G2)],
    "global_tokens": [
        lambda: masks.global_tokens(masks.band(L, 3), 2),
        lambda: masks.global_tokens(masks.band(L, 3), 3),
        lambda: masks.global_tokens(masks.band(L, 4), 2),
    ],
    "combined": [
        lambda: masks.band(L, 3) & masks.frame_causal(G),
        lambda: masks.band(L, 3) | masks.frame_causal(G),
        lambda: masks.frame_causal(G) & masks.band(L, 3),
        lambda: masks.band(L, 4) & masks.frame_causal(G),
    ],
}
ALL = [(name, i) for name, variants in BUILDERS.items() for i in range(len(variants))]


def build(name, i):
    return BUILDERS[name][i]()


@pytest.mark.parametrize("name", BUILDERS)
def test_built_twice_equal_and_hash_equal(name):
    for make in BUILDERS[name]:
        a, b = make(), make()
        assert a is not b
        assert a == b
        assert (a != b) is False
        assert hash(a) == hash(b)
        assert len({a, b}) == 1


@pytest.mark.parametrize("name", BUILDERS)
def test_different_parameters_unequal(name):
    built = [make() for make in BUILDERS[name]]
    for i, a in enumerate(built):
        for j, b in enumerate(built):
            assert (a == b) == (i == j), (i, j)
    assert len(set(built)) == len(built)


def test_every_builder_differs_from_every_other():
    firsts = [build(name, 0) for name in BUILDERS]
    assert len(set(firsts)) == len(firsts)
    assert masks.full(L) != "full" and masks.full(L).__eq__(L) is NotImplemented


def test_normalised_parameters_compare_equal():
    assert masks.neighborhood(G, 3) == masks.neighborhood(G, (3, 3, 3), stride=(1, 1, 1), causal=False)
    assert masks.sliding_tile(G, (2, 3, 7), 1) == masks.sliding_tile(G, (2, 3, 7), (1, 1, 1))
    width = masks.band_width_for_density(L, 0.8)
    assert masks.spatial_band(G, 0.8) == masks.spatial_band(G, width=width)
    assert masks.from_array(_eye(6)) == masks.from_array(_eye(6).copy())


def test_combined_by_value():
    a = masks.band(L, 3) & masks.frame_causal(G)
    assert a.op is CombineOp.AND and (masks.band(L, 3) | masks.frame_causal(G)).op is CombineOp.OR
    assert a == masks.band(L, 3) & masks.frame_causal(G)
    assert a & masks.full(L) == (masks.band(L, 3) & masks.frame_causal(G)) & masks.full(L)
    assert a & masks.full(L) != masks.band(L, 3) & (masks.frame_causal(G) & masks.full(L))


def test_permuted_by_value():
    base = masks.neighborhood(G, 3)
    tiled = tiled_order(G, (2, 3, 4))
    assert base.permute(tiled) == masks.neighborhood(G, 3).permute(tiled_order(G, (2, 3, 4)))
    assert hash(base.permute(tiled)) == hash(masks.neighborhood(G, 3).permute(tiled_order(G, (2, 3, 4))))
    assert base.permute(tiled) != base.permute(tiled_order(G, (2, 3, 4), pad=False))
    assert base.permute(tiled) != base.permute(token_major_order(G))
    assert base.permute(raster_order(G)) != base  # a view, even in raster order


def test_head_views_by_value():
    arr = np.stack([_eye(6), _eye(6, 1), _eye(6)])
    m = masks.from_array(arr)
    assert m.head(0) == masks.from_array(arr.copy()).head(0)
    assert m.head(0) != m.head(1) and m.head(0) != m.head(2)  # same values, another head: unequal
    per = masks.per_head([masks.band(L, 1), masks.full(L)]) & masks.frame_causal(G)
    again = masks.per_head([masks.band(L, 1), masks.full(L)]) & masks.frame_causal(G)
    assert per.head(1) == again.head(1) and per.head(0) != again.head(1)
    order = tiled_order(G, (2, 3, 7))
    assert per.permute(order).head(1) == again.permute(order).head(1)


@pytest.mark.parametrize("name,i", ALL, ids=[f"{n}-{i}" for n, i in ALL])
def test_pickle_round_trip_keeps_equality(name, i):
    mask = build(name, i)
    _ = hash(mask)  # cached digests travel with the mask
    back = pickle.loads(pickle.dumps(mask))
    assert back == mask and hash(back) == hash(mask)
    assert back.children() == mask.children()
    if mask.length <= 200:
        np.testing.assert_array_equal(back.to_dense(), mask.to_dense())


def test_from_array_holds_its_array_read_only():
    arr = _eye(6)
    m = masks.from_array(arr)
    assert not m.array.flags.writeable and arr.flags.writeable
    with pytest.raises(ValueError):
        m.array[0, 1] = True


# ------------------------------------------------------------------------------------------------
# children()


def test_children_of_leaves_are_empty():
    for mask in (
        masks.full(L),
        masks.band(L, 3),
        masks.from_array(_eye(6)),
        masks.neighborhood(G, 3),
        masks.sliding_tile(G, (2, 3, 7), 1),
        masks.spatial(G),
        masks.temporal(G),
        masks.spatial_band(G, width=4),
        masks.temporal_band(G, width=4),
        masks.radial(G, 8),
        masks.frame_causal(G),
    ):
        assert mask.children() == ()


def test_children_of_composites():
    a, b = masks.band(L, 3), masks.frame_causal(G)
    assert (a & b).children() == (a, b) and (a | b).children() == (a, b)
    assert (a & b).children()[0] is a
    order = token_major_order(G)
    assert a.permute(order).children() == (a,)
    heads = [masks.band(L, 1), masks.full(L), masks.band(L, 1)]
    per = masks.per_head(heads)
    assert per.children() == tuple(heads)
    assert masks.global_tokens(per, 2).children() == (per,)
    view = (per & b).head(1)
    assert view.children() == (per & b,)
    arr = masks.from_array(np.stack([_eye(6), _eye(6, 1)]))
    assert arr.head(0).children() == (arr,)
    anchored = masks.spatial(G, anchor=True)
    assert [type(c).__name__ for c in anchored.children()] == ["FrameWindowMask", "FirstFrameMask"]


# ------------------------------------------------------------------------------------------------
# per-head masks dedup their head masks by value


def test_per_head_distinct_by_value():
    heads = [masks.spatial(G, anchor=True) for _ in range(5)] + [masks.temporal(G, 1) for _ in range(5)]
    m = masks.per_head(heads)
    assert len(m.distinct) == 2 and m.distinct[0] is heads[0] and m.distinct[1] is heads[5]
    assert m.traceable  # 10 mask objects, 2 distinct values: evaluated in-kernel
    want = m.to_dense()
    pos = jnp.arange(L, dtype=jnp.int32)
    for h in (0, 4, 5, 9):  # a jax head index takes the in-kernel path that selects among distinct
        got = m._allowed(pos[:, None], pos[None, :], jnp.int32(h))
        np.testing.assert_array_equal(np.asarray(got), want[h])


def test_mask_without_key_refuses_to_hash():
    class Opaque(masks.Mask):
        length = 4

        def _allowed(self, q, k, head):
            return q == k

    with pytest.raises(NotImplementedError, match="_key"):
        hash(Opaque())
    m = Opaque()
    assert m.__eq__(m) is True  # identity still holds


def test_causal_mask_is_the_lower_triangle_by_every_route():
    from stlib.layout import block_layout

    m = masks.causal(37)
    dense = np.tril(np.ones((37, 37), bool))
    np.testing.assert_array_equal(m.to_dense(), dense)
    starts, ends = m.key_intervals(np.arange(37))
    for row in range(37):
        allowed = np.zeros(37, bool)
        for s, e in zip(starts[row], ends[row]):
            allowed[s:e] = True
        np.testing.assert_array_equal(allowed, dense[row])
    assert block_layout(m, 8, 8).allowed_pairs == dense.sum()
    assert m == masks.causal(37) and hash(m) == hash(masks.causal(37)) and m != masks.causal(36)
