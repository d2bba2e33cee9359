"""Allowed pairs per tile of one head's mask, counted from each query row's key intervals (what
``stlib.layout.block_layout`` is built from), one chunk of q tiles at a time: a difference array
over keys gives, per q tile, how many of its rows see each key (its coverage); coverage gathered
into the mask's token order and summed per kv tile is the tile's count. That is O(rows * intervals
+ q_tiles * L) and never touches L x L. A permuted mask, or a ring's block of one, is counted from
its base's intervals and the permutation; a mask without intervals is read densely (up to
``DENSE_LIMIT`` tokens).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from stlib._intmath import cdiv
from stlib.geometry import TokenOrder
from stlib.masks import DENSE_LIMIT, BlockView, Mask, PermutedMask


class Window(NamedTuple):
    """A ring's (q shard, kv shard) block of a permuted mask: rows [q_start, +size) and keys
    [k_start, +size) of ``order``."""

    order: TokenOrder
    q_start: int
    k_start: int
    size: int


def counting_key(mask: Mask) -> tuple[Mask, TokenOrder | Window | None]:
    """(mask in raster order, its token order, a window of one, or None): a permuted view, or a
    block of one (``Mask.block_view``), is counted from its base's intervals and the permutation."""
    if isinstance(mask, BlockView) and isinstance(mask.base, PermutedMask):
        inner = mask.base
        return inner.base, Window(inner.order, mask.q_start, mask.k_start, mask.length)
    if isinstance(mask, PermutedMask):
        return mask.base, mask.order
    return mask, None


def position_maps(view) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(raster index of each query position, of each key position; -1 at padding), None: identity."""
    if view is None:
        return None, None
    if isinstance(view, TokenOrder):
        return view.perm, view.perm
    perm = view.order.perm
    return perm[view.q_start : view.q_start + view.size], perm[view.k_start : view.k_start + view.size]


def tile_counts(base: Mask, order, length: int, block_q: int, block_kv: int) -> np.ndarray:
    """int64 [nq, nk] allowed pairs per tile of a single-head mask ``base`` seen in ``order`` (a
    TokenOrder, a ``Window`` of one, or None: ``counting_key``)."""
    nq, nk = cdiv(length, block_q), cdiv(length, block_kv)
    kv_starts = np.arange(0, length, block_kv)
    if not base.has_intervals:
        return tile_counts_dense(base, order, length, block_q, block_kv)
    row_map, perm = position_maps(order)
    n_keys = base.length
    # q tiles per chunk: keep the [chunk, n_keys] coverage array around 32 MB
    chunk = max(1, min(nq, (4 << 20) // max(n_keys, 1)))
    out = np.zeros((nq, nk), dtype=np.int64)
    for first in range(0, nq, chunk):
        last = min(first + chunk, nq)
        pos = np.arange(first * block_q, min(last * block_q, length))
        rows = pos if row_map is None else row_map[pos]
        real = rows >= 0
        rows, tile = rows[real], pos[real] // block_q - first
        rows, tile, weight = _row_classes(base, rows, tile)
        starts, ends = base.key_intervals(rows)
        tile = tile[:, None]
        width = n_keys + 1
        used = ends > starts
        size = (last - first) * width
        weight = None if weight is None else np.broadcast_to(weight[:, None], used.shape)[used]
        diff = _weighted_bincount((tile * width + starts)[used], weight, size)
        diff -= _weighted_bincount((tile * width + ends)[used], weight, size)
        coverage = np.cumsum(diff.reshape(last - first, width)[:, :n_keys], axis=1)
        if perm is not None:
            coverage = np.where(perm >= 0, coverage[:, np.maximum(perm, 0)], 0)
        out[first:last] = np.add.reduceat(coverage, kv_starts, axis=1)
    return out


def _row_classes(base: Mask, rows: np.ndarray, tile: np.ndarray):
    """(rows, tiles, weights): one representative row per (q tile, ``interval_classes`` class) and
    how many rows it stands for, or the rows themselves (weights None) where the mask has no classes."""
    classes = base.interval_classes(rows)
    if classes is None:
        return rows, tile, None
    pair = tile.astype(np.int64) * (int(classes.max()) + 1) + classes
    _, first, count = np.unique(pair, return_index=True, return_counts=True)
    return rows[first], tile[first], count


def _weighted_bincount(index: np.ndarray, weight: np.ndarray | None, size: int) -> np.ndarray:
    """int64 [size]: occurrences of each index (each counted ``weight`` times where given)."""
    if weight is None:
        return np.bincount(index, minlength=size)
    out = np.zeros(size, np.int64)
    np.add.at(out, index, weight)
    return out


def tile_counts_dense(base: Mask, order, length, block_q, block_kv) -> np.ndarray:
    if length > DENSE_LIMIT:
        raise ValueError(
            f"{type(base).__name__} has no interval form and L={length} > {DENSE_LIMIT}: "
            "its layout would need the dense L x L mask"
        )
    view = base if order is None else PermutedMask(base, getattr(order, "order", order))
    if isinstance(order, Window):
        view = BlockView(view, order.q_start, order.k_start, order.size)
    dense = view.block(0, length, 0, length)
    nq, nk = cdiv(length, block_q), cdiv(length, block_kv)
    padded = np.zeros((nq * block_q, nk * block_kv), dtype=np.int64)
    padded[:length, :length] = dense
    return padded.reshape(nq, block_q, nk, block_kv).sum(axis=(1, 3))


__all__ = ["Window", "counting_key", "position_maps", "tile_counts", "tile_counts_dense"]
