"""Choosing a token order (stlib/reorder.py): candidates found through ``children()``, the measured
best order, and heads equal by value measured once."""

from __future__ import annotations

from stlib import VideoGrid, masks, raster_order, reorder, tiled_order, token_major_order

G = VideoGrid(4, 8, 32)


def test_candidate_orders_look_through_composites():
    sta = masks.sliding_tile(G, (2, 4, 8), (1, 1, 3))
    nbhd = masks.neighborhood(G, (3, 4, 8), stride=(1, 4, 8))
    for mask in (
        sta,
        masks.global_tokens(sta, 2),
        sta & masks.frame_causal(G),
        masks.per_head([nbhd, sta]),
        (masks.per_head([nbhd, sta]) & masks.frame_causal(G)).head(1),
    ):
        orders = reorder.candidate_orders(G, mask)
        assert orders[:2] == [raster_order(G), token_major_order(G)]
        assert tiled_order(G, (2, 4, 8)) in orders
    assert tiled_order(G, (1, 4, 8)) in reorder.candidate_orders(G, nbhd)
    assert len(reorder.candidate_orders(G, masks.frame_causal(G))) == 2


def test_choose_orders_picks_the_tiled_order_for_sliding_tile():
    sta = masks.sliding_tile(G, (2, 4, 8), (1, 1, 3))
    assert reorder.choose_orders(G, sta, 64, 64) == [tiled_order(G, (2, 4, 8))]
    assert reorder.choose_orders(G, masks.temporal_band(G, width=64), 64, 64) == [token_major_order(G)]


def test_heads_equal_by_value_are_measured_once(monkeypatch):
    measured = []
    real = reorder.candidate_orders
    monkeypatch.setattr(
        reorder, "candidate_orders", lambda g, m, **kw: measured.append(m) or real(g, m, **kw)
    )
    heads = [masks.sliding_tile(G, (2, 4, 8), (1, 1, 3)) for _ in range(3)]
    heads.append(masks.temporal_band(G, width=64))
    orders = reorder.choose_orders(G, masks.per_head(heads), 64, 64)
    assert len(measured) == 2
    assert orders == [tiled_order(G, (2, 4, 8))] * 3 + [token_major_order(G)]
    assert orders[0] is orders[1] is orders[2]
