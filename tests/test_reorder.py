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


def test_video_attention_compares_orders_at_the_blocks_the_kernel_resolves(monkeypatch):
    """``video_attention`` measures candidate orders at the call's resolved blocks (the kernel's
    ``Config``), not at a fixed 128 x 128: explicit blocks as given, and a kernel compiled for a TPU
    at its own default blocks (stopped before it runs: no TPU here)."""
    import pytest

    import stlib
    from stlib import registry

    class Measured(Exception):
        pass

    def record(grid, mask, block_q, block_kv):
        raise Measured((block_q, block_kv))

    monkeypatch.setattr(reorder, "choose_orders", record)
    q, k, v = stlib.random_qkv((1, G.num_tokens, 16))
    sta = masks.sliding_tile(G, (2, 4, 8), (1, 1, 3))
    with pytest.raises(Measured) as explicit:
        stlib.video_attention(q, k, v, G, sta, impl="xla", block_q=64, block_kv=256)
    assert explicit.value.args[0] == (64, 256)
    impl = registry.get("pallas_tile_lane_dense")
    default = impl.config(sta, G.num_tokens, interpret=False)  # the kernel's v6e blocks, fitted to L
    assert (default.block_q, default.block_kv) != (128, 128)
    with pytest.raises(Measured) as compiled:
        stlib.video_attention(q, k, v, G, sta, impl=impl.name, interpret=False)
    assert compiled.value.args[0] == (default.block_q, default.block_kv)
