"""Tile occupancy of a mask: which (q-tile, kv-tile) pairs are EMPTY, PARTIAL or FULL, and the
scalar-prefetch tables a sparse kernel reads.

Allowed pairs per tile are counted from each query row's key intervals (``stlib.tile_counts``),
never from L x L.
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from stlib import tile_counts
from stlib._checks import check_positive_int
from stlib._intmath import round_up
from stlib.device import LANES, SUBLANES, smem_limit
from stlib.masks import Mask

#: Largest partial-block table (elements) ``partial_block_table`` will build.
PARTIAL_TABLE_LIMIT = 64 * 1024 * 1024


class TileKind(enum.IntEnum):
    EMPTY = 0
    PARTIAL = 1
    FULL = 2


def smem_bytes(shape, itemsize: int = 4) -> int:
    """Bytes an array of ``shape`` takes in TPU SMEM (32-bit words): a 1-D array is padded to a
    multiple of 128 words; otherwise the last dim is padded to 128 words and the second-to-last to
    8 rows (as libtpu 0.0.42.1 allocates prefetched operands)."""
    shape = tuple(int(s) for s in shape) or (1,)
    if len(shape) == 1:
        return round_up(shape[0], LANES) * max(itemsize, 4)
    *lead, rows, cols = shape
    words = int(np.prod(lead, dtype=np.int64)) * round_up(rows, SUBLANES) * round_up(cols, LANES)
    return words * max(itemsize, 4)


@dataclass(frozen=True, eq=False)
class BlockLayout:
    """Tile occupancy of ``mask`` for ``block_q`` x ``block_kv`` tiles.

    Shapes (Hl = mask.num_heads, or 1 for a head-uniform mask shared by every head;
    nq = ceil(L / block_q), nk = ceil(L / block_kv); L = mask.length including padding slots):

    - ``counts``      int64 [Hl, nq, nk]  allowed pairs per tile
    - ``valid_pairs`` int64 [nq, nk]      real (non-padding) pairs per tile; ragged tiles have fewer
    - ``kinds``       int8  [Hl, nq, nk]  TileKind: EMPTY (no allowed pair), FULL (every real pair
      allowed), PARTIAL (the rest)
    - ``row_kv_tiles`` int32 [Hl, nq, W]  kv-tile indices of the non-empty tiles of each row in
      increasing order, W = max non-empty tiles in a row (>= 1); entries past the row's count repeat
      its last entry (0 for an empty row) so a kernel that walks past the count fetches nothing new
    - ``row_counts``  int32 [Hl, nq]      non-empty tiles per row
    - ``row_kinds``   int32 [Hl, nq, W]   TileKind of each entry (EMPTY past the count)
    - ``step_head``, ``step_q``, ``step_kv``, ``step_kinds`` int32 [S]: the flattened list of
      non-empty (head, q-tile, kv-tile) steps, ordered by head, row, kv tile; a row with no
      non-empty tile gets one EMPTY step so a kernel still writes its (zero) output
    """

    mask: Mask
    block_q: int
    block_kv: int
    counts: np.ndarray
    valid_pairs: np.ndarray
    num_tokens: int

    # --- shape ------------------------------------------------------------------------------
    @property
    def length(self) -> int:
        return self.mask.length

    @property
    def num_heads(self) -> int:
        return self.counts.shape[0]

    @cached_property
    def q_valid(self) -> np.ndarray:
        """int32 [nq]: real (non-padding) query tokens per q tile."""
        return _valid_per_tile(self.mask, self.block_q)

    @cached_property
    def kv_valid(self) -> np.ndarray:
        """int32 [nk]: real key tokens per kv tile."""
        return _valid_per_tile(self.mask, self.block_kv)

    @property
    def kv_valid_is_prefix(self) -> bool:
        """True when the real keys of every kv tile come first (padding only at tile ends), so
        ``iota < kv_valid[tile]`` masks the padding."""
        valid = valid_tokens(self.mask)
        nk = self.grid_shape[1]
        padded = np.zeros(nk * self.block_kv, bool)
        padded[: valid.size] = valid
        prefix = np.arange(self.block_kv)[None, :] < self.kv_valid[:, None]
        return bool(np.array_equal(padded.reshape(nk, self.block_kv), prefix))

    @property
    def shared_across_heads(self) -> bool:
        return self.mask.num_heads is None

    @property
    def grid_shape(self) -> tuple[int, int]:
        return self.counts.shape[1], self.counts.shape[2]

    def __repr__(self) -> str:
        """A line of counts, not the arrays.

        >>> import stlib
        >>> stlib.block_layout(stlib.masks.causal(1024), 256, 256)  # doctest: +ELLIPSIS
        BlockLayout(CausalMask(L=1024), 256 x 256 tiles, grid 4 x 4, ...: EMPTY 6, PARTIAL 4, FULL 6; ...)
        """
        kinds = ", ".join(f"{name} {n}" for name, n in self.kind_counts().items())
        heads = "1 head layout" if self.num_heads == 1 else f"{self.num_heads} heads"
        nq, nk = self.grid_shape
        return (
            f"BlockLayout({self.mask!r}, {self.block_q} x {self.block_kv} tiles, grid {nq} x {nk}, "
            f"{heads}: {kinds}; density {self.density:.3f})"
        )

    # --- kinds and summary numbers ------------------------------------------------------------
    @cached_property
    def kinds(self) -> np.ndarray:
        kinds = np.full(self.counts.shape, TileKind.PARTIAL, dtype=np.int8)
        kinds[self.counts == 0] = TileKind.EMPTY
        kinds[(self.counts == self.valid_pairs[None]) & (self.valid_pairs[None] > 0)] = TileKind.FULL
        return kinds

    def kind_counts(self) -> dict[str, int]:
        return {kind.name: int(np.sum(self.kinds == kind)) for kind in TileKind}

    @property
    def allowed_pairs(self) -> int:
        """Allowed pairs summed over the layout's heads."""
        return int(self.counts.sum())

    @property
    def density(self) -> float:
        """Allowed pairs / L^2 (L = real tokens), averaged over the layout's heads."""
        return self.allowed_pairs / (self.num_heads * float(self.num_tokens) ** 2)

    @property
    def occupancy(self) -> float:
        """Non-empty tiles / all tiles."""
        return float(np.mean(self.kinds != TileKind.EMPTY))

    @property
    def partial_fraction(self) -> float:
        """PARTIAL tiles / non-empty tiles."""
        nonempty = np.sum(self.kinds != TileKind.EMPTY)
        return float(np.sum(self.kinds == TileKind.PARTIAL) / nonempty) if nonempty else 0.0

    @property
    def computed_pairs(self) -> int:
        """Pairs a tile-skipping kernel computes: block_q * block_kv per non-empty tile."""
        return int(np.sum(self.kinds != TileKind.EMPTY)) * self.block_q * self.block_kv

    @property
    def work_efficiency(self) -> float:
        """Allowed pairs / pairs in non-empty tiles (1.0 means no wasted work)."""
        return self.allowed_pairs / self.computed_pairs if self.computed_pairs else 1.0

    def summary(self) -> dict:
        return {
            "mask": repr(self.mask),
            "block_q": self.block_q,
            "block_kv": self.block_kv,
            "tiles": list(self.counts.shape),
            "density": self.density,
            "occupancy": self.occupancy,
            "partial_fraction": self.partial_fraction,
            "work_efficiency": self.work_efficiency,
            **{f"{k.lower()}_tiles": v for k, v in self.kind_counts().items()},
            "row_table_bytes": self.table_bytes("rows"),
            "flat_table_bytes": self.table_bytes("flat"),
        }

    # --- per-row tables and flattened steps ---------------------------------------------------
    @cached_property
    def row_counts(self) -> np.ndarray:
        return self._row_tables[1]

    @cached_property
    def _row_tables(self):
        nonempty = self.kinds != TileKind.EMPTY
        tiles, counts = row_tables(nonempty)
        kinds = np.take_along_axis(self.kinds, tiles, axis=2).astype(np.int32)
        kinds = np.where(np.arange(tiles.shape[2]) < counts[:, :, None], kinds, TileKind.EMPTY)
        return tiles, counts, kinds.astype(np.int32)

    @property
    def row_kv_tiles(self) -> np.ndarray:
        return self._row_tables[0]

    @property
    def row_kinds(self) -> np.ndarray:
        return self._row_tables[2]

    @property
    def max_row_width(self) -> int:
        return self.row_kv_tiles.shape[2]

    @cached_property
    def _flat_steps(self) -> dict[str, np.ndarray]:
        steps = flat_steps(self.kinds != TileKind.EMPTY)
        active = steps["step_active"].astype(bool)
        kinds = np.where(
            active, self.kinds[steps["step_head"], steps["step_q"], steps["step_kv"]], TileKind.EMPTY
        )
        return {**steps, "step_kinds": kinds.astype(np.int32)}

    @property
    def step_head(self):
        return self._flat_steps["step_head"]

    @property
    def step_q(self):
        return self._flat_steps["step_q"]

    @property
    def step_kv(self):
        return self._flat_steps["step_kv"]

    @property
    def step_kinds(self):
        return self._flat_steps["step_kinds"]

    @property
    def num_steps(self) -> int:
        return int(self.step_q.shape[0])

    def table_bytes(self, form: str = "rows") -> int:
        """SMEM bytes of the prefetched tables: ``"rows"`` (row_kv_tiles, row_kinds, row_counts)
        or ``"flat"`` (the four step arrays)."""
        if form == "rows":
            return 2 * smem_bytes(self.row_kv_tiles.shape) + smem_bytes(self.row_counts.shape)
        if form == "flat":
            return 4 * smem_bytes((self.num_steps,))
        raise ValueError(f"form={form!r} must be 'rows' or 'flat'")

    def fits_smem(self, form: str = "rows") -> bool:
        """Whether the tables fit the SMEM of the chip at hand (of every chip, off a TPU)."""
        return self.table_bytes(form) <= smem_limit()

    # --- masked tiles --------------------------------------------------------------------------
    @property
    def masked_tiles(self) -> np.ndarray:
        """bool [Hl, nq, nk]: tiles a kernel must mask: PARTIAL tiles, and FULL tiles whose kv tile
        holds padding (the ragged sequence end, or padding slots of a padded token order)."""
        padded_kv = self.kv_valid < self.block_kv
        return (self.kinds == TileKind.PARTIAL) | ((self.kinds == TileKind.FULL) & padded_kv[None, None, :])

    def partial_block_table(self) -> tuple[np.ndarray, np.ndarray]:
        """Deduplicated masks of the PARTIAL tiles, see ``tile_mask_table``."""
        return self.tile_mask_table(self.kinds == TileKind.PARTIAL)

    def table_refusal(self, which: np.ndarray) -> str | None:
        """Why ``tile_mask_table(which)`` would refuse (None: it would not): the flagged tiles hold
        more than PARTIAL_TABLE_LIMIT elements."""
        count = int(np.count_nonzero(which))
        if count * self.block_q * self.block_kv <= PARTIAL_TABLE_LIMIT:
            return None
        return (
            f"{count} tiles of {self.block_q}x{self.block_kv} are too many to tabulate "
            f"(limit {PARTIAL_TABLE_LIMIT} elements); use a lazy mask in its own token order, which a "
            "kernel evaluates from row and column indices"
        )

    def tile_mask_table(self, which: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Deduplicated masks of the tiles flagged in ``which`` (bool [Hl, nq, nk]).

        Returns (blocks bool [P, block_q, block_kv], index int32 [Hl, nq, nk]) with index -1 for
        unflagged tiles. Raises ValueError when the flagged tiles hold more than
        PARTIAL_TABLE_LIMIT elements (use a lazy mask the kernel can evaluate instead).
        """
        refusal = self.table_refusal(which)
        if refusal is not None:
            raise ValueError(refusal)
        h_idx, q_idx, k_idx = np.nonzero(which)
        index = np.full(self.counts.shape, -1, dtype=np.int32)
        unique: dict[bytes, int] = {}
        blocks = []
        for h, qi, ki in zip(h_idx, q_idx, k_idx):
            block = self.tile_mask(int(h), int(qi), int(ki))
            key = np.packbits(block).tobytes()
            if key not in unique:
                unique[key] = len(blocks)
                blocks.append(block)
            index[h, qi, ki] = unique[key]
        if not blocks:
            return np.zeros((0, self.block_q, self.block_kv), bool), index
        return np.stack(blocks), index

    def tile_mask(self, head: int, q_tile: int, kv_tile: int) -> np.ndarray:
        """bool [block_q, block_kv]: the mask on one tile, False beyond the sequence end."""
        q0, k0 = q_tile * self.block_q, kv_tile * self.block_kv
        q1, k1 = min(q0 + self.block_q, self.length), min(k0 + self.block_kv, self.length)
        out = np.zeros((self.block_q, self.block_kv), dtype=bool)
        out[: q1 - q0, : k1 - k0] = self.mask.block(q0, q1, k0, k1, head)
        return out


def row_tables(selected: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-row kv-tile lists of the tiles flagged in ``selected`` (bool [Hl, nq, nk]).

    Returns (tiles int32 [Hl, nq, W], counts int32 [Hl, nq]), W = max count (>= 1); each row lists
    its selected kv tiles in increasing order, and entries past the count repeat the last one (0 for
    a row with none) so a kernel stepping past the count fetches nothing new.
    """
    counts = selected.sum(axis=2).astype(np.int32)
    width = max(int(counts.max()) if counts.size else 0, 1)
    order = np.argsort(~selected, axis=2, kind="stable")[:, :, :width].astype(np.int32)
    slot = np.arange(width)[None, None, :]
    count = counts[:, :, None]
    last = np.take_along_axis(order, np.maximum(count - 1, 0), axis=2)
    tiles = np.where(slot < count, order, np.where(count > 0, last, 0)).astype(np.int32)
    return tiles, counts


def flat_steps(selected: np.ndarray) -> dict[str, np.ndarray]:
    """The flagged (head, q-tile, kv-tile) steps of ``selected`` (bool [Hl, nq, nk]) as a flat list
    ordered by head, row, kv tile. A row with no flagged tile keeps one inactive placeholder step
    (kv tile 0) so a kernel still writes its output. Returns int32 [S] arrays ``step_head``,
    ``step_q``, ``step_kv``, ``step_active`` and ``step_first`` / ``step_last`` (first / last step of
    its row)."""
    empty_row = ~selected.any(axis=2)
    take = selected.copy()
    take[:, :, 0] |= empty_row
    h, q, k = np.nonzero(take)
    row = h.astype(np.int64) * selected.shape[1] + q
    first = np.ones(row.shape, bool)
    first[1:] = row[1:] != row[:-1]
    last = np.ones(row.shape, bool)
    last[:-1] = row[1:] != row[:-1]
    return {
        "step_head": h.astype(np.int32),
        "step_q": q.astype(np.int32),
        "step_kv": k.astype(np.int32),
        "step_active": selected[h, q, k].astype(np.int32),
        "step_first": first.astype(np.int32),
        "step_last": last.astype(np.int32),
    }


def call_layout(mask: Mask | None, length: int, block_q: int, block_kv: int) -> BlockLayout:
    """The tile layout a kernel call runs on: ``mask``'s (None: dense attention over ``length``
    tokens) at ``block_q`` x ``block_kv`` (``block_layout``, cached by value)."""
    from stlib.masks import full

    return block_layout(mask if mask is not None else full(length), block_q, block_kv)


def block_layout(mask: Mask, block_q: int, block_kv: int) -> BlockLayout:
    """Classify every (q-tile, kv-tile) of ``mask`` as EMPTY / PARTIAL / FULL.

    Masks with an interval form (every built-in, also after ``permute``) are counted row by row
    without an L x L intermediate; others are evaluated densely, only for L <= DENSE_LIMIT.
    Raises TypeError for a non-mask, ValueError for non-positive block sizes.

    >>> import stlib
    >>> stlib.block_layout(stlib.masks.band(1024, 128), 256, 256)
    BlockLayout(BandMask(L=1024, width=128), 256 x 256 tiles, grid 4 x 4, 1 head layout: EMPTY 6, PARTIAL 10, FULL 0; density 0.235)
    """
    if not isinstance(mask, Mask):
        raise TypeError(f"block_layout needs a stlib mask, got {type(mask).__name__}")
    check_positive_int("block_q", block_q)
    check_positive_int("block_kv", block_kv)
    return _block_layout(mask, block_q, block_kv)


@functools.lru_cache(maxsize=32)
def _block_layout(mask: Mask, block_q: int, block_kv: int) -> BlockLayout:
    """``block_layout``, built once per (mask by value, blocks): a call's forward, its backward and
    the estimator share one layout (its arrays read-only)."""
    heads = [None] if mask.num_heads is None else list(range(mask.num_heads))
    cache: dict[tuple, np.ndarray] = {}  # heads equal in mask and order (by value) are counted once
    counts = []
    for h in heads:
        key = tile_counts.counting_key(mask if h is None else mask.head(h))
        if key not in cache:
            cache[key] = tile_counts.tile_counts(*key, mask.length, block_q, block_kv)
        counts.append(cache[key])
    valid = valid_tokens(mask)
    valid_per_q = _valid_per_tile(mask, block_q).astype(np.int64)
    valid_per_k = _valid_per_tile(mask, block_kv).astype(np.int64)
    counts, valid_pairs = np.stack(counts), valid_per_q[:, None] * valid_per_k[None, :]
    counts.flags.writeable = valid_pairs.flags.writeable = False
    return BlockLayout(
        mask=mask,
        block_q=block_q,
        block_kv=block_kv,
        counts=counts,
        valid_pairs=valid_pairs,
        num_tokens=int(valid.sum()),
    )


def valid_tokens(mask: Mask) -> np.ndarray:
    """bool [L]: False at padding slots of permuted views inside the mask."""
    valid = mask.token_validity()
    return np.ones(mask.length, bool) if valid is None else valid


def _valid_per_tile(mask: Mask, block: int) -> np.ndarray:
    return np.add.reduceat(valid_tokens(mask), np.arange(0, mask.length, block)).astype(np.int32)
