"""The masks of a Sparse VideoGen plan (``stlib.routing``): the reordered anchor of a temporal head
(``TokenMajorPrefixMask``) and the tiles a tile kernel with rounded boundary tiles computes
(``KeptTilesMask``). Both compare and hash by value."""

from __future__ import annotations

import hashlib
from functools import cached_property

import numpy as np

from stlib._intmath import floordiv
from stlib.masks.base import Mask
from stlib.masks.video import SpatialRangeMask


class TokenMajorPrefixMask(SpatialRangeMask):
    """Keys whose token-major position s * T + t is below H*W (the reordered anchor of a temporal
    head), in raster terms: in frame t, the spatial indices s < ceil((H*W - t) / T)."""

    def _spatial_range(self, tq, sq, tk, xp):
        frames = self.grid.frames
        hi = floordiv(self.grid.tokens_per_frame - tk + frames - 1, frames)
        return 0 * sq + 0 * tk, hi + 0 * sq

    def __repr__(self):
        return f"token_major_prefix({self.grid.shape})"


class KeptTilesMask(Mask):
    """Keys whose (q tile, kv tile) is flagged in ``keep`` (bool [nq, nk]) for ``block_q`` x
    ``block_kv`` tiles of a length-``length`` sequence: what a tile kernel with rounded boundary
    tiles computes, in the kernel's own token order."""

    def __init__(self, keep: np.ndarray, block_q: int, block_kv: int, length: int):
        keep = np.asarray(keep, bool).view()
        keep.flags.writeable = False
        self.keep, self.block_q, self.block_kv, self.length = keep, int(block_q), int(block_kv), int(length)

    @cached_property
    def _digest(self) -> bytes:
        return hashlib.blake2b(np.packbits(self.keep).tobytes(), digest_size=16).digest()

    def _key(self):
        return (self.length, self.block_q, self.block_kv, self.keep.shape, self._digest)

    def _allowed(self, q, k, head):
        return self.keep[np.asarray(q) // self.block_q, np.asarray(k) // self.block_kv]

    def _intervals(self, rows, head):
        nk = self.keep.shape[1]
        starts = np.arange(nk, dtype=np.int64)[None, :] * self.block_kv
        ends = np.minimum(starts + self.block_kv, self.length)
        kept = self.keep[rows // self.block_q]  # [n, nk]
        return np.broadcast_to(starts, kept.shape), np.where(kept, ends, starts)

    def __repr__(self):
        return f"kept_tiles(L={self.length}, {self.block_q}x{self.block_kv}, {int(self.keep.sum())} tiles)"
