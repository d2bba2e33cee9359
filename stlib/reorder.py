"""Choosing the token order that makes a video mask tile-aligned.

Candidates: raster (t, y, x), token-major (y, x, t) for temporal patterns, and 3-D tiled orders
whose tile is the mask's own (sliding tile) or its stride (strided neighbourhood) or a small
128-token spatial tile. The choice is measured, not guessed: the order whose layout has the fewest
non-empty tiles wins (raster on ties). Per-head masks choose per head among orders of length L.
"""

from __future__ import annotations

import numpy as np

from stlib.geometry import TokenOrder, VideoGrid, raster_order, tiled_order, token_major_order
from stlib.layout import TileKind, block_layout
from stlib.masks import Mask, MultiHeadMask, NeighborhoodMask, SlidingTileMask


def candidate_orders(grid: VideoGrid, mask: Mask, *, same_length: bool = False) -> list[TokenOrder]:
    """Orders worth trying for ``mask`` (raster first). ``same_length`` drops padded orders."""
    orders = [raster_order(grid), token_major_order(grid)]
    tiles = set()
    for sub in _leaves(mask):
        if isinstance(sub, SlidingTileMask):
            tiles.add(sub.tile)
        elif isinstance(sub, NeighborhoodMask):
            tiles.add(
                sub.stride if np.prod(sub.stride) > 1 else (1, min(8, grid.height), min(16, grid.width))
            )
    for tile in sorted(tiles):
        order = tiled_order(grid, tile)
        if not (same_length and order.length != grid.num_tokens):
            orders.append(order)
    return orders


def _leaves(mask: Mask):
    """The leaf masks ``mask`` is built from (itself for a leaf)."""
    children = mask.children()
    if not children:
        yield mask
    for child in children:
        yield from _leaves(child)


def nonempty_tiles(mask: Mask, block_q: int, block_kv: int) -> int:
    return int(np.sum(block_layout(mask, block_q, block_kv).kinds != TileKind.EMPTY))


def choose_orders(grid: VideoGrid, mask: Mask, block_q: int = 128, block_kv: int = 128) -> list[TokenOrder]:
    """One order for a head-uniform mask, else one order (of length L) per head."""
    if isinstance(mask, MultiHeadMask) or mask.num_heads is not None:
        heads = [mask.head(h) for h in range(mask.num_heads)]
        best_of: dict[Mask, TokenOrder] = {}  # heads equal by value are measured once
        for head in heads:
            if head not in best_of:
                options = candidate_orders(grid, head, same_length=True)
                best_of[head] = min(options, key=lambda o: nonempty_tiles(head.permute(o), block_q, block_kv))
        return [best_of[head] for head in heads]
    options = candidate_orders(grid, mask)
    return [min(options, key=lambda o: nonempty_tiles(mask.permute(o), block_q, block_kv))]
