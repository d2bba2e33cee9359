"""stlib masks as Splash masks, for ``impl="splash"`` (``stlib.kernels.splash``).

* full -> Splash ``FullMask``, causal (k <= q) -> ``CausalMask``, a band |q - k| <= w -> ``LocalMask``
  window (w, w) answering whole blocks inside or outside the band at once, ``&`` / ``|`` of those ->
  ``LogicalAnd`` / ``LogicalOr``, a different mask per head -> ``MultiHeadMask``.
* Any other mask, at any length, reaches Splash tile by tile from stlib's own block layout
  (``_TiledMask``): EMPTY and FULL tiles from the layout's counts, only PARTIAL tiles evaluated,
  each once; padding never allowed. Rows that see no key are found from key intervals (through the
  permutation of a permuted view), never an L x L array; a mask without them runs only up to
  ``stlib.masks.DENSE_LIMIT`` tokens (``mask_support``).
"""

from __future__ import annotations

import numpy as np
from jax.experimental.pallas.ops.tpu import splash_attention as sa

from stlib import masks as M
from stlib import tile_counts
from stlib.geometry import TokenOrder, tile_rows
from stlib.layout import TileKind, block_layout


def tile_tokens(mask: M.Mask | None) -> int | None:
    """Tokens per 3-D tile of a mask in a padded 3-D tiled order (``geometry.tile_rows``), else None."""
    rows = None if mask is None or mask.order is None else tile_rows(mask.order)
    return None if rows is None else rows[0]


class _Band(sa.LocalMask):
    """Splash ``LocalMask`` with window (w, w): the same in-kernel mask function, but whole blocks
    that lie inside or outside the band are answered without evaluating it. Splash classifies every
    tile on the host in Python, and evaluating all 11k tiles of the case-study shape takes ~18 s."""

    def __init__(self, shape, width: int):
        super().__init__(shape, window_size=(width, width), offset=0)
        self.width = width

    def __getitem__(self, idx) -> np.ndarray:
        q_slice, k_slice = idx
        q0, q1, _ = q_slice.indices(self.shape[0])
        k0, k1, _ = k_slice.indices(self.shape[1])
        if q1 > q0 and k1 > k0:
            w, q_last, k_last = self.width, q1 - 1, k1 - 1
            if k_last < q0 - w or k0 > q_last + w:  # every pair farther than w
                return np.zeros((q1 - q0, k1 - k0), dtype=bool)
            if k0 >= q_last - w and k_last <= q0 + w:  # every pair within w
                return np.ones((q1 - q0, k1 - k0), dtype=bool)
        return super().__getitem__(idx)


def _lazy(mask: M.Mask, head: int, padded: int):
    """The Splash lazy mask of one head on the padded square from the mask's ``form``, or None if
    there is none. Every mask built here contains the diagonal (full, bands, and & / | of them), so
    no real row is empty."""
    shape, form = (padded, padded), mask.form()
    kind = None if form is None else form[0]
    if kind == "full":
        return sa.FullMask(shape)
    if kind == "causal":  # pad keys lie right of every real query: masked already
        return sa.CausalMask(shape)
    if kind == "band":
        return _Band(shape, form[1])
    if kind == "per_head":
        return _lazy(form[1][head], 0, padded)
    if kind in ("&", "|"):
        a, b = (_lazy(child, head, padded) for child in form[1:])
        if a is None or b is None:
            return None
        return (a & b) if kind == "&" else (a | b)
    return None


class _TiledMask(sa.Mask):
    """One head of an stlib mask without a lazy Splash form, as a Splash mask on the padded square
    [Lp, Lp], answered tile by tile from stlib's own block layout at the tiles Splash asks for:
    EMPTY tiles as no pair and FULL tiles as every real pair without evaluating one, only PARTIAL
    tiles by the stlib mask itself (``Mask.block``), each once. Splash classifies every tile on the
    host and keeps each distinct PARTIAL tile in its ``partial_mask_blocks``; the kernel skips EMPTY
    tiles and runs FULL ones mask-free, as stlib's tile kernels do. Padding (rows and columns past
    L, and the padding slots of a padded permutation) is never allowed."""

    def __init__(self, mask: M.Mask, head: int, padded: int):
        self.mask, self.head, self.padded = mask, head, padded
        valid = mask.token_validity()
        self._valid = np.zeros(padded, dtype=bool)
        self._valid[: mask.length] = True if valid is None else valid
        self._layouts: dict[tuple[int, int], object] = {}
        self._partial: dict[tuple[int, int, int, int], np.ndarray] = {}

    @property
    def shape(self) -> tuple[int, int]:
        return (self.padded, self.padded)

    def __eq__(self, other):
        if not isinstance(other, _TiledMask):
            return NotImplemented
        return (self.mask, self.head, self.padded) == (other.mask, other.head, other.padded)

    def __hash__(self):
        return hash((_TiledMask, self.mask, self.head, self.padded))

    def _kind(self, q0: int, k0: int, rows: int, cols: int) -> TileKind | None:
        """The layout's kind of the tile at (q0, k0) of ``rows`` x ``cols`` (a grid tile of those
        sizes), EMPTY past the mask's length; None for a slice that is not one tile."""
        if q0 % rows or k0 % cols:
            return None
        if q0 >= self.mask.length or k0 >= self.mask.length:
            return TileKind.EMPTY
        layout = self._layouts.get((rows, cols))
        if layout is None:
            layout = self._layouts[(rows, cols)] = block_layout(self.mask, rows, cols)
        kinds = layout.kinds
        return TileKind(int(kinds[self.head if kinds.shape[0] > 1 else 0, q0 // rows, k0 // cols]))

    def __getitem__(self, idx) -> np.ndarray:
        q_slice, k_slice = idx
        q0, q1, _ = q_slice.indices(self.padded)
        k0, k1, _ = k_slice.indices(self.padded)
        rows, cols = q1 - q0, k1 - k0
        kind = self._kind(q0, k0, rows, cols) if rows > 0 and cols > 0 else TileKind.EMPTY
        if kind is TileKind.EMPTY:
            return np.zeros((rows, cols), dtype=bool)
        if kind is TileKind.FULL:  # every real pair
            return self._valid[q0:q1, None] & self._valid[None, k0:k1]
        key = (q0, q1, k0, k1)
        if key not in self._partial:
            out = np.zeros((rows, cols), dtype=bool)
            real_q, real_k = min(q1, self.mask.length), min(k1, self.mask.length)
            if real_q > q0 and real_k > k0:
                out[: real_q - q0, : real_k - k0] = self.mask.block(q0, real_q, k0, real_k, self.head)
            self._partial[key] = out
        return self._partial[key]


def _rows_from_intervals(mask: M.Mask) -> tuple[M.Mask, np.ndarray | None] | None:
    """(the single-head mask in raster order whose key intervals give ``mask``'s rows, the raster
    row of each of ``mask``'s rows (-1 at padding; None: the same rows)), as stlib's tile counting
    reads a permuted view (``tile_counts.counting_key``); None where no intervals give them."""
    base, view = tile_counts.counting_key(mask)
    if not base.has_intervals or not (view is None or isinstance(view, TokenOrder)):
        return None
    return base, (None if view is None else view.perm)


def _visible_rows(mask: M.Mask, head: int, chunk: int = 4096) -> np.ndarray:
    """bool [L]: the rows of one head of ``mask`` that see at least one key: from key intervals
    (in raster order, through the permutation of a permuted view), else from dense rows a chunk at
    a time (L <= DENSE_LIMIT: ``mask_support``)."""
    one = mask if mask.num_heads is None else mask.head(head)
    length = one.length
    from_intervals = _rows_from_intervals(one)
    if from_intervals is None:
        seen = np.zeros(length, dtype=bool)
        for start in range(0, length, chunk):
            stop = min(start + chunk, length)
            seen[start:stop] = one.block(start, stop, 0, length).any(axis=1)
        return seen
    base, raster_row = from_intervals
    seen = np.zeros(base.length, dtype=bool)
    for start in range(0, base.length, chunk):
        rows = np.arange(start, min(start + chunk, base.length))
        lo, hi = base.key_intervals(rows)
        seen[rows] = (hi > lo).any(axis=1)
    if raster_row is None:
        return seen
    return (raster_row >= 0) & seen[np.maximum(raster_row, 0)]


def mask_support(mask: M.Mask) -> str | None:
    """Why Splash cannot run ``mask`` (None: it can): a mask without a lazy Splash form runs from
    stlib's block layout (``_TiledMask``), which reads key intervals above DENSE_LIMIT tokens."""
    heads = [0] if mask.num_heads is None else range(mask.num_heads)
    if mask.length <= M.DENSE_LIMIT or all(_lazy(mask, h, mask.length) is not None for h in heads):
        return None
    if all(_rows_from_intervals(mask if mask.num_heads is None else mask.head(h)) is not None for h in heads):
        return None
    return (
        f"impl='splash' has no lazy Splash form for {mask!r}, and without key intervals its tiles "
        f"would be classified from {mask.length}^2 pairs per head: that is limited to L <= "
        f"stlib.masks.DENSE_LIMIT = {M.DENSE_LIMIT}. Use another impl for this mask."
    )


def splash_mask(mask: M.Mask | None, num_heads: int, length: int, padded: int):
    """Splash ``MultiHeadMask`` ([num_heads, Lp, Lp]) for an stlib mask of length ``length``: its
    lazy Splash form where it has one, else its block layout (``_TiledMask``); and the rows that see
    at least one key (bool [num_heads or 1, length], None when every row does)."""
    if mask is None:
        mask = M.full(length)
    heads = [None] if mask.num_heads is None else list(range(mask.num_heads))
    per_head, visible, any_empty = [], [], False
    for h in heads:
        head = 0 if h is None else h
        lazy = _lazy(mask, head, padded)
        if lazy is None:
            rows = _visible_rows(mask, head)
            any_empty |= not rows.all()
            lazy = _TiledMask(mask, head, padded)
        else:
            rows = np.ones(length, dtype=bool)
        per_head.append(lazy)
        visible.append(rows)
    if mask.num_heads is None:
        per_head = per_head * num_heads  # one object: Splash processes it once, broadcasts its tables
    return sa.MultiHeadMask(tuple(per_head)), (np.stack(visible) if any_empty else None)
