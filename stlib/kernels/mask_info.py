"""What a stlib kernel is told about its mask, in one place (Splash's ``MaskInfo`` the model): the
scalar-prefetch tables every stlib kernel reads, forward and backward, the named bit fields of
their packed int32 words, and the mask a kernel evaluates on a tile.

The tables (built here from a pass's ``selected`` tiles, bool [Hl, rows, cols], and its
``stlib.passes.MaskPlan``; Hl is 1 for a head-uniform layout):

* **row tables** (``row_step_tables``, the rows form of a grid (H, rows, W)): ``tiles``
  [Hl * rows * W], the column of each row's j-th tile (past the row's count: its last tile again,
  so a step past the end fetches nothing new); ``counts`` [Hl * rows]; then ``mask_index`` (a TABLE
  plan: the int8 tile-mask table entry of each step, carried over empty slots) or ``kv_valid`` (a
  PREFIX plan: real keys per kv tile). The tile kernels' forward walks q rows.
* **transposed row tables** (``grid_tables(..., transposed=True)``): the same with q and kv
  exchanged, per kv tile its q tiles (the backward's dk / dv kernels), led by the **worked rows**
  ``head``, ``row``, ``slot`` of every (head, row) with at least one tile (``worked_rows``).
* **flat steps** (``flat_step_tables``, the flat form of a grid (G, S)): one step per tile, two
  words per step, ``FLAT_HEAD_Q`` and ``FLAT_KV_FLAGS``.
* **step words** of the kernels that pack a step's kind with its kv tile: ``BLOCK_SPARSE_STEP``
  (the block-sparse kernel's full grid) and ``LANE_DENSE_STEP`` (the lane-dense kernel's step code).

A ``Word``'s fields are read on the host (numpy) and in a kernel (traced int32 scalars) by the same
``Field.read`` / ``Field.is_set``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from stlib.device import smem_limit
from stlib.layout import flat_steps, row_tables, smem_bytes
from stlib.passes import MaskPlan, MaskPlanMode

# --------------------------------------------------------------------------------------------
# packed words


@dataclass(frozen=True)
class Field:
    """Bits ``shift`` .. ``shift + width - 1`` of an int32 word (``width`` None: every bit from
    ``shift`` up, the word's top field)."""

    name: str
    shift: int
    width: int | None

    @property
    def limit(self) -> int:
        """One past the largest value the field holds."""
        return 1 << (31 - self.shift if self.width is None else self.width)

    def read(self, word):
        """The field of ``word`` (a numpy array or a traced int32): a shift, a mask, or both."""
        if self.width is None:
            return word >> self.shift if self.shift else word
        mask = (1 << self.width) - 1
        return word & mask if self.shift == 0 else (word >> self.shift) & mask

    def is_set(self, word):
        """Whether a one-bit field of ``word`` is set."""
        if self.width != 1:
            raise ValueError(f"field {self.name!r} is {self.width} bits wide, not a flag")
        bit = 1 << self.shift
        return (word & bit) == bit


class Word:
    """An int32 of named fields, low bits first: ``Word(kind=2, kv=None)`` packs a 2-bit ``kind``
    under a ``kv`` that takes the rest. ``word.kv`` is the ``Field``; ``pack`` builds the words.

    >>> step = Word(kind=2, kv=None)
    >>> words = step.pack(kind=np.array([1, 2]), kv=np.array([0, 5]))
    >>> words.tolist(), step.kv.read(words).tolist(), step.kind.read(words).tolist()
    ([1, 22], [0, 5], [1, 2])
    """

    def __init__(self, **widths: int | None):
        fields, shift = [], 0
        for position, (name, width) in enumerate(widths.items()):
            if width is None and position != len(widths) - 1:
                raise ValueError(f"field {name!r} takes the rest of the word, so it must come last")
            fields.append(Field(name, shift, width))
            shift += width or 0
        if shift > 31:
            raise ValueError(f"fields of {shift} bits do not fit an int32")
        self.fields = tuple(fields)

    def __getattr__(self, name: str) -> Field:
        for f in self.__dict__.get("fields", ()):
            if f.name == name:
                return f
        raise AttributeError(name)

    def __repr__(self) -> str:
        return "Word(" + ", ".join(f"{f.name}={f.width}" for f in self.fields) + ")"

    def pack(self, **values) -> np.ndarray:
        """int32 words of ``values`` (one array per field, broadcast together). Raises ValueError
        for a missing or unknown field, or a value outside its field."""
        names = [f.name for f in self.fields]
        if sorted(values) != sorted(names):
            raise ValueError(f"{self!r} packs {names}, got {sorted(values)}")
        word = np.zeros((), np.int64)
        for f in self.fields:
            value = np.asarray(values[f.name], np.int64)
            if value.size and (value.min() < 0 or value.max() >= f.limit):
                raise ValueError(
                    f"{f.name} ranges over {value.min()}..{value.max()}, outside the {f.limit:,} values "
                    f"its field of {self!r} holds"
                )
            word = word | (value << f.shift)
        return word.astype(np.int32)


#: The block-sparse kernel's full grid: what a step does and which kv tile it fetches (a skipped
#: step fetches its row's next non-empty tile, so it moves no data).
BLOCK_SPARSE_STEP = Word(kind=2, fetch_kv=None)
#: The lane-dense kernel's steps: the step code (``StepKind`` or a pattern) and the kv tile.
LANE_DENSE_STEP = Word(code=8, kv=None)
#: The flat grid form, two words a step: the q tile and head, then the flags and kv tile.
FLAT_HEAD_Q = Word(q=16, head=None)
FLAT_KV_FLAGS = Word(first=1, last=1, active=1, kv=None)


# --------------------------------------------------------------------------------------------
# the tables


def carried_index(index: np.ndarray) -> np.ndarray:
    """Replace -1 entries by the last valid entry before them in flat order (0 before any), so an
    index map fed with it only changes block where a real entry starts."""
    flat = index.reshape(-1)
    pos = np.where(flat >= 0, np.arange(flat.size), -1)
    pos = np.maximum.accumulate(pos)
    return np.where(pos >= 0, flat[np.maximum(pos, 0)], 0).astype(np.int32).reshape(index.shape)


def row_step_tables(selected: np.ndarray, plan: MaskPlan) -> tuple[list[np.ndarray], int]:
    """Scalar-prefetch tables of a rows-form grid (H, rows, W) over the tiles ``selected`` (bool
    [Hl, rows, cols]): each row's tile list and count, then the mask table entry of each step (a
    TABLE plan, whose ``index`` is [Hl, rows, cols]) or the real keys per kv tile (a PREFIX plan);
    and W. The tile kernels' forward walks q rows; the backward's dk / dv kernel walks kv rows
    (``selected`` and the plan's index transposed)."""
    tiles, counts = row_tables(selected)
    tables = [tiles.reshape(-1), counts.reshape(-1)]
    extent = tiles.shape[2]
    if plan.mode == MaskPlanMode.TABLE:
        idx = np.take_along_axis(np.broadcast_to(plan.index, selected.shape), tiles, axis=2)
        idx = np.where(np.arange(extent) < counts[:, :, None], idx, -1)
        tables.append(carried_index(idx).reshape(-1))
    if plan.mode == MaskPlanMode.PREFIX:
        tables.append(plan.kv_valid.astype(np.int32))
    return tables, extent


def worked_rows(counts: np.ndarray, num_heads: int) -> list[np.ndarray]:
    """[head, row, slot] int32 tables of every (head, row) of a pass with at least one tile (slot:
    the row's index in the per-row tables, shared by every head of a head-uniform layout). Rows
    without a tile are never visited: their accumulator keeps what earlier passes (or the zeros it
    started from) left there, so a kv tile no query sees ends with zero dk and dv."""
    hl, rows = counts.shape
    if hl == 1:
        active = np.flatnonzero(counts[0] > 0)
        head, row = np.repeat(np.arange(num_heads), active.size), np.tile(active, num_heads)
        slot = row
    else:
        head, row = np.nonzero(counts > 0)
        slot = head * rows + row
    return [x.astype(np.int32) for x in (head, row, slot)]


def _row_form(selected, plan: MaskPlan, transposed: bool):
    """``selected`` and ``plan`` as the rows a grid walks: q rows, or kv rows when ``transposed``
    (``selected`` and the plan's mask index transposed)."""
    if not transposed:
        return selected, plan
    if plan.mode == MaskPlanMode.TABLE:
        plan = dataclasses.replace(plan, index=np.broadcast_to(plan.index, selected.shape).transpose(0, 2, 1))
    return np.ascontiguousarray(selected.transpose(0, 2, 1)), plan


def grid_tables(selected, plan: MaskPlan, num_heads: int, *, transposed: bool):
    """(prefetch tables, W, number of worked rows) of a pass that walks only its worked rows: the
    worked rows' head / row / slot, then the row tables (the forward's, or ``transposed``: per kv
    tile its q tiles, the plan's mask index transposed with them) with the mask-table index or
    kv_valid a plan needs last."""
    selected, plan = _row_form(selected, plan, transposed)
    per_row, extent = row_step_tables(selected, plan)
    worked = worked_rows(per_row[1].reshape(selected.shape[:2]), num_heads)
    return [*worked, *per_row], extent, worked[0].size


def block_grid_tables(selected, plan: MaskPlan, num_heads: int, blocks: int, *, transposed: bool, codes=None):
    """(prefetch tables [blocks, n] each, real rows int32 [blocks, 1], W, R) of a pass over a
    ``StackedBlocks`` layout whose ``selected`` [blocks * Hb, rows, cols] holds ``blocks`` blocks of
    Hb heads, in ``grid_tables``' order (and, with ``codes``, the ``step_codes`` last): the row
    tables of the whole stack (one width W, its widest row), cut block by block, and each block's
    worked rows padded to the most of any block, R, so one grid (R, W) runs any block with its row of
    each table as data. A block without a worked row gets one (head 0, row 0; no tile: its
    accumulators are read and written back unchanged); padding rows repeat its last row, and its
    real rows say how many rows are its own (a kernel leaves the rest idle).

    >>> sel = np.zeros((2, 2, 2), bool); sel[0] = [[1, 0], [1, 1]]; sel[1, 1, 1] = True
    >>> none = MaskPlan(MaskPlanMode.NONE, None, 256)
    >>> tables, real, width, rows = block_grid_tables(sel, none, 1, 2, transposed=True)
    >>> width, rows, real.tolist(), tables[1].tolist()  # the kv rows each block walks
    (2, 2, [[2], [1]], [[0, 1], [1, 1]])
    """
    rows_of, row_plan = _row_form(selected, plan, transposed)
    per_row, extent = row_step_tables(rows_of, row_plan)
    if codes is not None:
        per_row.append(step_codes(selected, codes, transposed=transposed))
    if row_plan.mode == MaskPlanMode.PREFIX:  # kv_valid: alike for every block
        per_row[2] = np.broadcast_to(per_row[2], (blocks, per_row[2].size)).reshape(-1)
    counts = per_row[1].reshape(blocks, -1, rows_of.shape[1])
    worked = []
    for block_counts in counts:
        head, row, slot = worked_rows(block_counts, num_heads)
        if head.size == 0:  # one idle row of its own: (head 0, row 0), whose count is 0
            head, row, slot = (np.zeros(1, np.int32),) * 3
        worked.append((head, row, slot))
    most = max(head.size for head, _, _ in worked)
    padded = [np.stack([np.pad(w[i], (0, most - w[i].size), mode="edge") for w in worked]) for i in range(3)]
    real = np.array([[head.size] for head, _, _ in worked], np.int32)
    return [*padded, *(t.reshape(blocks, -1) for t in per_row)], real, extent, most


def step_codes(selected: np.ndarray, codes: np.ndarray, *, transposed: bool) -> np.ndarray:
    """int32 table of each step's code (``codes`` int16 [Hl, nq, nk]) in the order of the row
    tables ``grid_tables`` builds for ``selected`` (per kv row when ``transposed``)."""
    codes = np.broadcast_to(codes, selected.shape)
    if transposed:
        selected, codes = selected.transpose(0, 2, 1), codes.transpose(0, 2, 1)
    tiles, _ = row_tables(np.ascontiguousarray(selected))
    return np.take_along_axis(np.maximum(codes, 0), tiles, axis=2).astype(np.int32).reshape(-1)


def flat_step_tables(selected: np.ndarray, plan: MaskPlan) -> tuple[list[np.ndarray], int]:
    """Scalar-prefetch tables of a flat grid over the tiles ``selected``: per step its
    ``FLAT_HEAD_Q`` and ``FLAT_KV_FLAGS`` words, then the mask table entry of each step (TABLE) or
    the real keys per kv tile (PREFIX); and the number of steps S."""
    steps = flat_steps(selected)
    head_q = FLAT_HEAD_Q.pack(q=steps["step_q"], head=steps["step_head"])
    kv_flags = FLAT_KV_FLAGS.pack(
        first=steps["step_first"], last=steps["step_last"], active=steps["step_active"], kv=steps["step_kv"]
    )
    tables = [head_q, kv_flags]
    if plan.mode == MaskPlanMode.TABLE:
        idx = np.broadcast_to(plan.index, selected.shape)[
            steps["step_head"], steps["step_q"], steps["step_kv"]
        ]
        tables.append(carried_index(np.where(steps["step_active"] > 0, idx, -1)))
    if plan.mode == MaskPlanMode.PREFIX:
        tables.append(plan.kv_valid.astype(np.int32))
    return tables, int(head_q.shape[0])


def check_prefetch(tables, plan: MaskPlan, block_q: int, what: str, hint: str) -> None:
    """Refuse scalar-prefetch tables that overflow TPU SMEM, and int8 mask tables whose rows break
    the (32, 128) int8 tiling, with messages that name the fix."""
    table_bytes, limit = sum(smem_bytes(t.shape) for t in tables), smem_limit()
    if table_bytes > limit:
        raise ValueError(
            f"{what} prefetches {table_bytes:,} bytes of tables into {limit:,} bytes of SMEM; {hint}"
        )
    if plan.mode == MaskPlanMode.TABLE and block_q % 32:
        raise ValueError(f"{block_q=} must be a multiple of 32 for an int8 mask table")


# --------------------------------------------------------------------------------------------
# the mask on a tile


def iota_mask(plan: MaskPlan, q0, k0, shape, head):
    """bool [rows, cols] of the plan's lazy mask for the tile whose first row / column are q0 / k0
    (``head``: the traced head index, used by per-head masks)."""
    rows = q0 + jax.lax.broadcasted_iota(jnp.int32, shape, 0)
    cols = k0 + jax.lax.broadcasted_iota(jnp.int32, shape, 1)
    return plan.mask.mask_function(rows, cols, head) & (cols < plan.length)
