"""Which grid step of a step-coded kernel runs which compiled region, and what each costs: the
forward of ``pallas_tile_lane_dense`` and the backward's step-coded pass (``backward_steps``).

Every non-empty (q tile, kv tile) of the layout becomes one step with a code:

* ``FULL``: every pair allowed, every key real: no mask work;
* ``RAGGED``: a FULL tile in the kv block where the array ends (chunks past the end skipped, the
  last one sliced);
* ``MASKED``: the mask evaluated per score;
* a **pattern** (codes from ``FIRST_PATTERN`` on): a PARTIAL tile cut into square sub-tiles of
  ``grain`` tokens, each EMPTY (skipped), FULL (computed mask-free) or, for a mask the kernel can
  evaluate from indices, PARTIAL (the mask evaluated on that sub-tile only). The region runs each kv
  sub-tile against each run of q sub-tiles of one kind (a lane slice of the q tile); where the kv tile
  holds padding slots of a permuted order (``Pattern.padded``) it masks those keys by a per-key
  validity column, never by the mask itself. A tile becomes a pattern where that is cheaper than
  masking it whole (``Pattern.cost``: a masked pair counts twice, as the v6e schedule shows).

The sliding-tile mask in its 3-D tiled order: at the grain of its 3-D tile (3 x 8 x 16 = 384
tokens) every sub-tile is EMPTY or FULL, so blocks that hold a row of 3-D tiles run 15 of their 25
sub-tiles, mask-free, instead of evaluating the permuted mask per score. A band: the tiles on its
edges skip the sub-tiles outside it and mask only the sub-tiles on its diagonal.
"""

from __future__ import annotations

import enum
import functools
import math
from collections import Counter
from dataclasses import dataclass

import numpy as np

from stlib.device import LANES, chip_spec
from stlib.kernels.mask_info import LANE_DENSE_STEP
from stlib.layout import BlockLayout, TileKind, block_layout, row_tables, valid_tokens

#: Most distinct patterns one call compiles (each is a region of its own); rarer ones stay MASKED.
MAX_PATTERNS = 8


@dataclass(frozen=True)
class CodeRate:
    """How a step-coded kernel's program grows with its plan: ``pairs_per_bundle``, score pairs of
    region code (``code_pairs``) a bundle holds, and ``fixed_bundles`` beside the regions."""

    pairs_per_bundle: int
    fixed_bundles: int


#: The forward's (``pallas_tile_lane_dense``), compiled for a v5e at 10 x 75,600 x 128 bf16 and
#: 1,024 x 2,048: the band 0.25's eight regions hold 11.73M pairs of code in 60,501 bundles (194 a
#: bundle), frame causal's eleven 18.7M in 88,837 (210); 904 and 925 bundles beside them.
FORWARD_CODE = CodeRate(193, 925)
#: The backward's fused step-coded pass, the same shape at 1,024 x 1,024: the band's six regions
#: 5.11M pairs in 47,017 bundles (109), frame causal's eleven 9.12M in 81,671 (112); 16,579 and
#: 16,644 bundles beside them (the heads' dk / dv init and finalise take 15,604).
BACKWARD_CODE = CodeRate(108, 16_650)
#: A masked pair's share of a region's code over a mask-free pair's (v5e, 1,024 x 2,048: the MASKED
#: region's 12,630 bundles over the FULL region's 11,088).
MASKED_CODE_WEIGHT = 1.15
#: A step-table entry: the step's code in its low bits, the kv tile above them (``mask_info``).
STEP = LANE_DENSE_STEP
#: Bits of an entry that hold the step's code (the kv tile index sits above them).
CODE_BITS = STEP.code.width


class StepKind(enum.IntEnum):
    """The fixed step codes; a compiled step has one region per code present, in code order."""

    FULL = 0  # every pair allowed, every key real: no mask work
    RAGGED = 1  # FULL tile in the kv block where the array ends: chunks past the end skipped, the last sliced
    MASKED = 2  # PARTIAL tile that no pattern covers: the mask evaluated per score


FIRST_PATTERN = len(StepKind)


#: A sub-tile of a pattern: not computed, computed mask-free, or computed with the mask evaluated.
SKIP, RUN, MASK = 0, 1, 2


@dataclass(frozen=True)
class Pattern:
    """A tile cut into ``grain`` x ``grain`` sub-tiles: ``rows[c][r]`` says how kv sub-tile c meets q
    sub-tile r (``SKIP``: EMPTY; ``RUN``: FULL, no mask; ``MASK``: PARTIAL, the mask evaluated on
    that sub-tile only); ``padded``: the kv tile holds padding slots (masked by key)."""

    grain: int
    rows: tuple[tuple[int, ...], ...]
    padded: bool

    @property
    def sub_tiles(self) -> int:
        """Sub-tiles computed (RUN or MASK)."""
        return sum(v != SKIP for row in self.rows for v in row)

    @property
    def masked_sub_tiles(self) -> int:
        return sum(v == MASK for row in self.rows for v in row)

    def cost(self) -> int:
        """Score pairs computed, a masked pair counted twice (the measured ratio of the MASKED and
        FULL regions' bundles per pair in the v6e schedule, about 2)."""
        return (self.sub_tiles + self.masked_sub_tiles) * self.grain**2

    def code_pairs(self) -> float:
        """Score pairs the region's code computes, a masked pair at ``MASKED_CODE_WEIGHT``."""
        return (
            self.sub_tiles - self.masked_sub_tiles + MASKED_CODE_WEIGHT * self.masked_sub_tiles
        ) * self.grain**2

    def updates(self, block_q: int, block_kv: int, chunk: int) -> list[tuple[int, int, int, int, bool]]:
        """(first key, keys, first query lane, lanes, masked) of each update the region runs: whole
        tiles in ``chunk``-key pieces when every sub-tile is RUN, else each kv sub-tile against each
        run of consecutive q sub-tiles of the same kind."""
        if all(v == RUN for row in self.rows for v in row):
            return [(c0, chunk, 0, block_q, False) for c0 in range(0, block_kv, chunk)]
        g = self.grain
        piece = chunk if g % chunk == 0 else g
        out = []
        for c, row in enumerate(self.rows):
            for kind in (RUN, MASK):
                for start, stop in _runs([v == kind for v in row]):
                    out += [
                        (c * g + p, piece, start * g, (stop - start) * g, kind == MASK)
                        for p in range(0, g, piece)
                    ]
        return out


def _runs(flags) -> list[tuple[int, int]]:
    """[start, stop) of each run of ones in ``flags``."""
    runs, start = [], None
    for i, flag in enumerate((*flags, 0)):
        if flag and start is None:
            start = i
        elif not flag and start is not None:
            runs.append((start, i))
            start = None
    return runs


@dataclass(frozen=True, eq=False)
class StepPlan:
    """``codes`` int16 [Hl, nq, nk]: -1 for tiles not computed, else the step code; ``patterns``:
    the pattern of each code from ``FIRST_PATTERN`` on; ``length``: real rows of the arrays."""

    layout: BlockLayout
    codes: np.ndarray
    patterns: tuple[Pattern, ...]
    length: int

    def __post_init__(self):
        self.codes.flags.writeable = False  # plans are shared (``plan_steps`` caches them)

    @property
    def step_kinds(self) -> type[StepKind]:
        """The step codes below ``FIRST_PATTERN`` (a plot's legend reads their names here)."""
        return StepKind

    @property
    def present(self) -> tuple[int, ...]:
        return tuple(int(c) for c in np.unique(self.codes) if c >= 0)

    @property
    def key_validity(self) -> bool:
        """Whether a region reads the per-key validity column (a padded pattern is present)."""
        return any(self.patterns[c - FIRST_PATTERN].padded for c in self.present if c >= FIRST_PATTERN)

    def pattern(self, code: int) -> Pattern:
        return self.patterns[code - FIRST_PATTERN]

    def tables(self):
        """(steps int32 [Hl, nq, W], each a ``STEP`` word of code and kv tile, counts int32 [Hl, nq]); entries
        past a row's count repeat its last entry, so skipped steps fetch nothing."""
        tiles, counts = row_tables(self.codes >= 0)
        code = np.take_along_axis(np.maximum(self.codes, 0), tiles, axis=2).astype(np.int32)
        return STEP.pack(code=code, kv=tiles), counts

    def pairs(self, code: int) -> int:
        """Score pairs one step of ``code`` computes."""
        bq, bkv = self.layout.block_q, self.layout.block_kv
        if code == StepKind.RAGGED:
            return bq * (self.length % bkv)
        if code >= FIRST_PATTERN:
            return self.pattern(code).sub_tiles * self.pattern(code).grain ** 2
        return bq * bkv

    def key_valid_column(self) -> np.ndarray:
        """int32 [nk * block_kv, 1]: 1 at real keys, 0 at padding slots and past the array."""
        nk, bkv = self.layout.grid_shape[1], self.layout.block_kv
        column = np.zeros(nk * bkv, np.int32)
        valid = valid_tokens(self.layout.mask)
        column[: valid.size] = valid
        return column[:, None]


def region_name(code: int) -> str:
    return (
        f"compute_{StepKind(code).name.lower()}"
        if code < FIRST_PATTERN
        else f"compute_pattern{code - FIRST_PATTERN}"
    )


def _word(code: int) -> str:
    return StepKind(code).name.lower() if code < FIRST_PATTERN else f"p{code - FIRST_PATTERN}"


def kernel_name(prefix: str, present) -> str:
    return "_".join([prefix, *map(_word, present)]) if present else f"{prefix}_none"


def regions_of(prefix: str, kernel: str) -> list[str]:
    """Region names of a compiled kernel, in order, from its name (``kernel_name``)."""
    if not kernel.startswith(prefix):
        raise ValueError(f"{kernel!r} is not a {prefix} kernel")
    words = [w for w in kernel[len(prefix) :].split(".")[0].split("_") if w]
    names = {k.name.lower(): region_name(k) for k in StepKind}
    out = []
    for word in words:
        if word in names:
            out.append(names[word])
        elif word[:1] == "p" and word[1:].isdigit():
            out.append(region_name(FIRST_PATTERN + int(word[1:])))
        elif word != "none":
            raise ValueError(f"{kernel!r}: {word!r} names no step kind")
    return out


def base_codes(layout: BlockLayout, length: int) -> np.ndarray:
    """int16 [Hl, nq, nk]: -1 for tiles not computed, else FULL / RAGGED / MASKED (PARTIAL tiles and
    FULL tiles with padding slots are MASKED)."""
    bkv = layout.block_kv
    nk = layout.grid_shape[1]
    real_rows = np.minimum(bkv, length - np.arange(nk) * bkv)  # array rows of each kv tile
    slots = (real_rows > layout.kv_valid)[None, None, :]  # padding slots of a permuted order inside
    codes = np.full(layout.kinds.shape, -1, np.int16)
    full_ = layout.kinds == TileKind.FULL
    codes[full_] = StepKind.FULL
    if length % bkv:
        codes[:, :, nk - 1][full_[:, :, nk - 1]] = StepKind.RAGGED
    codes[(layout.kinds == TileKind.PARTIAL) | (full_ & slots)] = StepKind.MASKED
    return codes


def grains(block_q: int, block_kv: int) -> list[int]:
    """Candidate grains, largest first: multiples of 128 (q sub-tiles are lane slices) dividing both
    blocks, no finer than an eighth of the smaller block."""
    g = math.gcd(block_q, block_kv)
    floor = max(LANES, min(block_q, block_kv) // 8)
    return [d for d in range(g, floor - 1, -LANES) if d % LANES == 0 and g % d == 0]


def _fine_kinds(layout: BlockLayout, grain: int) -> np.ndarray:
    """TileKind [Hl, nq * bq/grain, nk * bkv/grain] of the layout's mask at ``grain`` (EMPTY past L)."""
    fine = block_layout(layout.mask, grain, grain).kinds
    nq, nk = layout.grid_shape
    out = np.full(
        (fine.shape[0], nq * layout.block_q // grain, nk * layout.block_kv // grain), TileKind.EMPTY
    )
    out[:, : fine.shape[1], : fine.shape[2]] = fine
    return out


def _patterns_at(layout: BlockLayout, codes: np.ndarray, length: int, grain: int) -> dict:
    """{(h, i, j): Pattern} of the MASKED steps whose kv tile lies inside the array and that are
    cheaper as a pattern at ``grain`` (``Pattern.cost``) than masked whole: sub-tiles EMPTY or FULL,
    and, where the kernel can evaluate the mask from indices (a traceable mask), PARTIAL."""
    bq, bkv = layout.block_q, layout.block_kv
    rq, rk = bq // grain, bkv // grain
    fine = _fine_kinds(layout, grain)
    slots = layout.kv_valid < np.minimum(bkv, length - np.arange(layout.grid_shape[1]) * bkv)
    traceable = layout.mask.traceable
    masked_cost = 2 * bq * bkv
    found = {}
    for h, i, j in zip(*np.nonzero(codes == StepKind.MASKED), strict=True):
        if (j + 1) * bkv > length:
            continue
        sub = fine[h, i * rq : (i + 1) * rq, j * rk : (j + 1) * rk]
        if not traceable and (sub == TileKind.PARTIAL).any():
            continue
        kind = np.select([sub == TileKind.FULL, sub == TileKind.PARTIAL], [RUN, MASK], SKIP)
        pattern = Pattern(grain, tuple(tuple(int(x) for x in col) for col in kind.T), bool(slots[j]))
        if pattern.cost() < masked_cost:
            found[(h, i, j)] = pattern
    return found


@functools.lru_cache(maxsize=8)  # a layout (compared by identity) is planned once for its call,
# its work model and its schedule counts: the fine layouts behind the grain choice take seconds
def plan_steps(
    layout: BlockLayout,
    length: int,
    grain: int | None = None,
    chip: str | None = None,
    rate: CodeRate = FORWARD_CODE,
) -> StepPlan:
    """The step plan of ``layout`` for arrays of ``length`` rows. ``grain``: the pattern grain
    (None: the candidate of ``grains`` whose patterns cost least, ``Pattern.cost``, the larger on a
    tie; 0: no patterns). Patterns beyond the ``MAX_PATTERNS`` most frequent, and on ``chip`` those
    whose regions would take the program of a kernel growing at ``rate`` past the chip's limit
    (``program_pairs``, ``_within_program``), stay MASKED."""
    codes = base_codes(layout, length)
    masked = codes == StepKind.MASKED
    if not masked.any() or grain == 0:
        return StepPlan(layout, codes, (), length)
    if grain is not None and (layout.block_q % grain or layout.block_kv % grain or grain % LANES):
        raise ValueError(
            f"pattern grain={grain} must be a multiple of {LANES} dividing block_q={layout.block_q} "
            f"and block_kv={layout.block_kv}"
        )
    masked_cost = 2 * layout.block_q * layout.block_kv
    best, best_cost = {}, int(masked.sum()) * masked_cost
    for g in [grain] if grain else grains(layout.block_q, layout.block_kv):
        found = _patterns_at(layout, codes, length, g)
        frequent = {p for p, _ in Counter(found.values()).most_common(MAX_PATTERNS)}
        cost = sum(p.cost() if p in frequent else masked_cost for p in found.values())
        cost += (int(masked.sum()) - len(found)) * masked_cost
        if cost < best_cost:
            best, best_cost = found, cost
    counts = Counter(best.values())
    kept = _within_program(layout, codes, counts.most_common(MAX_PATTERNS), program_pairs(chip, rate))
    frequent = [p for p, _ in counts.most_common(MAX_PATTERNS) if p in kept]
    index = {p: FIRST_PATTERN + n for n, p in enumerate(frequent)}
    for (h, i, j), pattern in best.items():
        if pattern in index:
            codes[h, i, j] = index[pattern]
    return StepPlan(layout, codes, tuple(frequent), length)


def program_pairs(chip: str | None, rate: CodeRate = FORWARD_CODE) -> int | None:
    """Most pairs of region code a step plan for ``chip`` holds: the bundles its measured program
    limit (``Chip.program_bundles_limit``: on a v5e frame causal's forward of 89,762 bundles took
    886.7 ms, where its plan without patterns compiles to 33,471 and the same schedule within 2%)
    leaves beside ``rate``'s fixed ones, at ``rate``'s pairs a bundle; None (no budget) for a chip
    without a limit, or none named.

    >>> program_pairs("v5e"), program_pairs("v5e", BACKWARD_CODE), program_pairs("v6e")
    (12469923, 5279688, None)
    """
    limit = None if chip is None else chip_spec(chip).program_bundles_limit
    return None if limit is None else (limit - rate.fixed_bundles) * rate.pairs_per_bundle


def code_pairs(layout: BlockLayout, codes: np.ndarray, patterns, covered: int) -> float:
    """Score pairs the regions' code computes (against a chip's ``program_pairs``), a masked pair at
    ``MASKED_CODE_WEIGHT``: the FULL and RAGGED regions present in the base ``codes`` a tile each, the
    MASKED region where ``patterns`` (their regions' own pairs added) leave MASKED steps beyond the
    ``covered`` ones."""
    tile = layout.block_q * layout.block_kv
    total = tile * sum(bool((codes == kind).any()) for kind in (StepKind.FULL, StepKind.RAGGED))
    if int((codes == StepKind.MASKED).sum()) > covered:
        total += tile * MASKED_CODE_WEIGHT
    return total + sum(p.code_pairs() for p in patterns)


def _within_program(layout: BlockLayout, codes: np.ndarray, candidates, budget: int | None) -> set[Pattern]:
    """The patterns of ``candidates`` ((pattern, steps) pairs, ``codes`` the base codes) whose
    regions fit ``budget`` pairs of code (None: all of them): the most of them, taken in the order of
    the work they save (steps x the pairs a masked step costs over the pattern's, ``Pattern.cost``),
    whose program fits."""
    if budget is None:
        return {p for p, _ in candidates}
    masked_cost = 2 * layout.block_q * layout.block_kv
    ranked = sorted(candidates, key=lambda c: -c[1] * (masked_cost - c[0].cost()))
    for n in range(len(ranked), 0, -1):
        kept = ranked[:n]
        if code_pairs(layout, codes, [p for p, _ in kept], sum(s for _, s in kept)) <= budget:
            return {p for p, _ in kept}
    return set()
