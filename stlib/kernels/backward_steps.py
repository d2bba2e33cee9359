"""The backward's step codes: the forward's mask-free pattern steps (``stlib.kernels.steps``) on
the fused dk / dv / dq kernel's transposed grid, so a sparse backward runs at the forward's blocks
instead of one small tile per grid step.

A kv row of the fused kernel computes S^T = k q^T [block_kv, block_q] (keys on sublanes, queries on
lanes), the orientation in which the forward's ``Pattern.updates`` are written: each update is a kv
sub-tile against a run of q lanes. So the backward takes the forward's step plan at its own blocks
and runs, per step, the updates of that step's code, each at most [grain keys, block_q] scores: FULL
(the whole tile, no mask), RAGGED (the keys of the last kv tile that lie in the array, the last
update masked past its end), MASKED (the mask evaluated from indices, for a traceable mask) or a
pattern (EMPTY sub-tiles skipped, FULL ones mask-free, a PARTIAL one with the mask evaluated on it
only, padding slots of a permuted order masked by key). MASKED steps of a mask that only a table
can evaluate stay in the exact passes they came from.

Two layouts run this way: rows of 3-D tiles (``step_layout``: the sliding tile in its 3-D tiled
order, 3 x 8 x 16 = 384-token tiles, rows of them a step instead of one tile a step), and any
other layout at the backward's own blocks (``block_steps``: band and dense at 2,048-2,560-token
blocks instead of 1,024 x 1,024 tiles whose whole [block_kv, block_q] scores had to fit VMEM).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

import numpy as np

from stlib.device import LANES
from stlib.geometry import tile_rows
from stlib.kernels.steps import (
    BACKWARD_CODE,
    FIRST_PATTERN,
    Pattern,
    StepKind,
    StepPlan,
    kernel_name,
    plan_steps,
    region_name,
    regions_of,
)
from stlib.layout import BlockLayout, block_layout
from stlib.masks import Mask
from stlib.passes import MaskPlan, MaskPlanMode, Pass, PassKind

#: The word that marks a step-coded kernel's name: ``<prefix>_steps_<codes>[_w<window>]``.
STEPS_WORD = PassKind.STEPS.value


@dataclass(frozen=True, eq=False)
class StepCodes:
    """The step code of every tile a step-coded pass computes: ``codes`` int16 [Hl, nq, nk] (-1:
    not in the pass; else a ``StepKind`` or a pattern's code), ``patterns`` (``plan.patterns``)
    and, where a padded pattern is present, the per-key validity column int32 [nk * block_kv, 1]."""

    codes: np.ndarray
    patterns: tuple[Pattern, ...]
    key_column: np.ndarray | None
    mask: Mask  # the layout's: MASKED steps and a pattern's PARTIAL sub-tiles evaluate it from indices
    grain: int  # keys per update of a FULL, RAGGED or MASKED step (scores [grain, block_q])
    length: int  # real rows of the arrays: a RAGGED step's keys end there

    def present(self, selected: np.ndarray) -> tuple[int, ...]:
        """The codes of the tiles flagged in ``selected`` (bool, broadcastable to ``codes``)."""
        return tuple(self.counts(selected))

    def counts(self, selected: np.ndarray) -> dict[int, int]:
        """Tiles of each code among those flagged in ``selected`` (per head of the layout)."""
        codes = self.codes[np.broadcast_to(selected, self.codes.shape)]
        return {int(c): int(n) for c, n in zip(*np.unique(codes, return_counts=True), strict=True)}

    def pattern(self, code: int) -> Pattern:
        return self.patterns[code - FIRST_PATTERN]

    def updates(self, code: int, block_q: int, block_kv: int) -> list[tuple[int, int, int, int, bool]]:
        """(first key, keys, first query lane, lanes, masked) of each update a step of ``code``
        runs: the whole tile in ``grain``-key pieces for FULL, MASKED (each masked) and a pattern of
        RUN sub-tiles only, the pieces that start in the array for RAGGED, a pattern's sub-tiles
        otherwise; no update's scores are larger than [``score_rows``, block_q]."""
        if code in (StepKind.FULL, StepKind.MASKED):
            masked = code == StepKind.MASKED
            return [(c0, self.grain, 0, block_q, masked) for c0 in range(0, block_kv, self.grain)]
        if code == StepKind.RAGGED:
            tail = self.length % block_kv
            return [(c0, self.grain, 0, block_q, False) for c0 in range(0, tail, self.grain)]
        return self.pattern(code).updates(block_q, block_kv, self.grain)

    @property
    def score_rows(self) -> int:
        """The most keys one update computes: ``grain``, or a pattern's grain that it does not divide
        (``Pattern.updates``: such sub-tiles run whole)."""
        return max([self.grain, *(p.grain for p in self.patterns if p.grain % self.grain)])

    def pairs(self, code: int, block_q: int, block_kv: int) -> int:
        """Score pairs one step of ``code`` computes."""
        return sum(keys * lanes for _, keys, _, lanes, _ in self.updates(code, block_q, block_kv))

    def padded(self, code: int) -> bool:
        """Whether a step of ``code`` masks the padding slots of its kv tile by key."""
        return code >= FIRST_PATTERN and self.pattern(code).padded


def kernel_word(steps: StepCodes, selected: np.ndarray) -> str:
    """``steps_<codes>`` of a kernel computing the tiles ``selected``: its regions, in code order."""
    return kernel_name(STEPS_WORD, steps.present(selected))


def step_regions(kernel: str) -> list[str] | None:
    """The compute regions of a backward kernel named ``<prefix>_steps_<codes>[_w<i>][.N]``, in
    order; None for a kernel without step codes (one "compute" region)."""
    word = "|".join([*(k.name.lower() for k in StepKind), r"p\d+"])
    match = re.search(rf"_{STEPS_WORD}_((?:{word})(?:_(?:{word}))*)", kernel.split(".")[0])
    return None if match is None else regions_of("", "_" + match.group(1))


def region_counts(steps: StepCodes, selected: np.ndarray, multiplier: int) -> dict[str, int]:
    """Executions of each compute region of a kernel computing ``selected`` (tiles per code, times
    ``multiplier``: the heads a head-uniform layout stands for)."""
    return {region_name(c): multiplier * n for c, n in steps.counts(selected).items()}


def tile_grain(layout: BlockLayout) -> tuple[int, int] | None:
    """(tokens per 3-D tile, tiles per row along x) where ``layout``'s mask is in a padded
    ``tiled_order`` whose tiles are lane-aligned, divide the layout's blocks and, at their grain,
    are each FULL or EMPTY; else None."""
    rows = None if layout.mask.order is None else tile_rows(layout.mask.order)
    if rows is None or rows[0] % LANES or layout.block_q % rows[0] or layout.block_kv % rows[0]:
        return None
    return None if block_layout(layout.mask, rows[0], rows[0]).kind_counts()["PARTIAL"] else rows


def step_layout(layout: BlockLayout, length: int, chip: str | None = None):
    """(layout, step plan) of the backward where the forward's layout is a mask in a padded
    ``tiled_order`` whose 3-D tiles are lane-aligned and, at that grain, FULL or EMPTY: blocks of
    one row of tiles along x a side (no larger than the forward's), patterns at the tile's grain.
    The case study's sliding tile at 1,920 x 1,920: two patterns (15 of 25 sub-tiles, one with
    padding slots) cover every step. None for any other layout.

    >>> import stlib
    >>> from stlib import masks
    >>> grid, tile = stlib.VideoGrid(4, 8, 64), (2, 4, 16)  # tiles of 128 tokens, rows of 4
    >>> mask = masks.sliding_tile(grid, tile, (1, 1, 3)).permute(stlib.tiled_order(grid, tile))
    >>> layout, plan = step_layout(stlib.block_layout(mask, 512, 512), mask.length)
    >>> (layout.block_q, layout.block_kv), len(plan.patterns)
    ((512, 512), 1)
    >>> from stlib.passes import exact_passes
    >>> [str(p.name) for p in coded_passes(plan, exact_passes(layout))]  # every step coded: no exact pass
    ['steps']
    """
    rows = tile_grain(layout)
    if rows is None:
        return None
    tile, per_row = rows
    block_q, block_kv = min(layout.block_q, tile * per_row), min(layout.block_kv, tile * per_row)
    if (block_q, block_kv) == (tile, tile):
        return None  # one tile a block: nothing for a pattern to skip
    blocks = block_layout(layout.mask, block_q, block_kv)
    return blocks, plan_steps(blocks, length, tile, chip, BACKWARD_CODE)


def block_steps(layout: BlockLayout, length: int, block_q: int, block_kv: int, chip: str | None = None):
    """(layout, step plan) of the backward at its own blocks (each no larger than the forward's) for
    a layout that ``step_layout`` does not take: the step codes and patterns of ``plan_steps`` at
    those blocks (on ``chip``, within its program budget). None where a MASKED step would need the mask's int8 table (a mask that is not
    traceable), whose [block_kv, block_q] tiles the step-coded pass does not read.

    >>> from stlib import block_layout, masks
    >>> layout, plan = block_steps(block_layout(masks.band(2000, 900), 1024, 1024), 2000, 512, 512)
    >>> (layout.block_q, layout.block_kv), sorted(StepKind(c).name for c in plan.present if c < FIRST_PATTERN)
    ((512, 512), ['FULL', 'MASKED', 'RAGGED'])
    >>> len(plan.patterns)  # the band's edge tiles, at a finer grain
    4
    """
    block_q, block_kv = min(layout.block_q, block_q), min(layout.block_kv, block_kv)
    if (block_q, block_kv) != (layout.block_q, layout.block_kv):
        layout = block_layout(layout.mask, block_q, block_kv)
    plan = plan_steps(layout, length, chip=chip, rate=BACKWARD_CODE)
    if not layout.mask.traceable and (plan.codes == StepKind.MASKED).any():
        return None
    return layout, plan


def coded_passes(plan: StepPlan, passes, grain: int | None = None) -> list:
    """The backward's passes over ``plan``'s layout: one STEPS pass of the FULL, RAGGED, pattern and,
    for a traceable mask, MASKED steps, in ``grain``-key updates (None: the patterns' grain, else
    whole kv tiles), then the forward's exact ``passes`` (``stlib.passes.split_passes``) less those
    tiles."""
    codes, mask = plan.codes, plan.layout.mask
    coded = (codes == StepKind.FULL) | (codes == StepKind.RAGGED) | (codes >= FIRST_PATTERN)
    if mask.traceable:
        coded |= codes == StepKind.MASKED
    column = plan.key_valid_column() if plan.key_validity else None
    if grain is None:
        grain = plan.patterns[0].grain if plan.patterns else plan.layout.block_kv
    if plan.layout.block_kv % grain or grain % LANES:
        raise ValueError(
            f"grain={grain} must be a multiple of {LANES} dividing block_kv={plan.layout.block_kv}"
        )
    steps = StepCodes(
        np.where(coded, codes, -1).astype(np.int16), plan.patterns, column, mask, grain, plan.length
    )
    none = MaskPlan(MaskPlanMode.NONE, None, plan.length)  # the codes say what each step masks
    out = [Pass(PassKind.STEPS, coded, none, steps)] if coded.any() else []
    for p in passes:
        rest = p.selected & ~coded
        if rest.any():
            out.append(dataclasses.replace(p, selected=rest))
    return out


__all__ = [
    "STEPS_WORD",
    "StepCodes",
    "block_steps",
    "coded_passes",
    "kernel_word",
    "region_counts",
    "step_layout",
    "step_regions",
    "tile_grain",
]
