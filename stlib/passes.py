"""How a tile layout reaches the kernels: which tiles run in which pass of the tile kernels (FULL
mask-free, RAGGED against the padding, MASKED with the mask itself; ``split_passes`` by boundary
policy, ``exact_passes``), and the plan by which a kernel evaluates the mask on the tiles that need
one (``MaskPlan``: none, from indices, a table of tile masks, or padding only). Shared by every
Pallas kernel, forward and backward, and by the routed SVG plans (``stlib.routing``)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from stlib.layout import BlockLayout, TileKind, block_layout
from stlib.masks import Mask, PermutedMask, full


class MaskPlanMode(enum.StrEnum):
    """How a kernel evaluates the mask on the tiles that need one.

    NONE: no tile needs a mask; IOTA: evaluated from row / column indices with the mask's own
    predicate (lazy, traceable masks, also permuted by an arithmetic token order), ANDed with
    ``key < length`` (the sequence padding a kernel adds); TABLE: a [P, block_q, block_kv] int8
    table of deduplicated tile masks, one per masked tile; PREFIX: only padding to hide, and each
    kv tile's real keys come first (``kv_valid``)."""

    NONE = "none"
    IOTA = "iota"
    TABLE = "table"
    PREFIX = "prefix"


@dataclass(frozen=True)
class MaskPlan:
    """A ``MaskPlanMode`` with what it needs: the mask, its tile table and index, or kv_valid."""

    mode: MaskPlanMode
    mask: Mask | None
    length: int
    table: np.ndarray | None = None  # int8 [P, block_q, block_kv]
    index: np.ndarray | None = None  # int32 [Hl, nq, nk], -1 where no table entry
    kv_valid: np.ndarray | None = None  # int32 [nk] real keys per kv tile (mode "prefix")


def plan_mask(mask: Mask, layout: BlockLayout, masked: np.ndarray) -> MaskPlan:
    """Choose iota or table evaluation for the tiles flagged in ``masked`` (bool [Hl, nq, nk])."""
    if not masked.any():
        return MaskPlan(MaskPlanMode.NONE, None, mask.length)
    if mask.traceable:
        return MaskPlan(MaskPlanMode.IOTA, mask, mask.length)
    table, index = layout.tile_mask_table(masked)
    return MaskPlan(MaskPlanMode.TABLE, mask, mask.length, table.astype(np.int8), index)


class BoundaryPolicy(enum.StrEnum):
    """EXACT: PARTIAL tiles run in a masked pass; BALANCED: PARTIAL tiles are rounded in or out to
    keep the pair budget (the Sparse VideoGen TPU design; approximate)."""

    EXACT = "exact"
    BALANCED = "balanced"


class PassKind(enum.StrEnum):
    """The passes of a call, in merge order; each pass is one pallas_call named ``stlib_tile_<kind>``."""

    FULL = "full"  # FULL tiles, mask-free
    RAGGED = "ragged"  # FULL tiles whose kv tile ends in padding: one compare per score
    MASKED = "masked"  # PARTIAL tiles: the mask itself
    STEPS = "steps"  # the backward's step-coded tiles (``stlib.kernels.backward_steps``): a code per step


#: The kinds ``split_passes`` makes (the forward's passes; STEPS is the backward's own).
SPLIT_KINDS = (PassKind.FULL, PassKind.RAGGED, PassKind.MASKED)


def balanced_keep(layout: BlockLayout) -> np.ndarray:
    """bool [Hl, nq, nk]: FULL tiles plus the fullest PARTIAL tiles, as many as bring the pairs
    of the kept tiles closest to the allowed-pair budget of each head (balanced rounding)."""
    keep = layout.kinds == TileKind.FULL
    pairs = np.broadcast_to(layout.valid_pairs, layout.counts.shape)
    for h in range(layout.num_heads):
        h_partial = np.flatnonzero(layout.kinds[h] == TileKind.PARTIAL)
        if h_partial.size == 0:
            continue
        fill = layout.counts[h].reshape(-1)[h_partial] / pairs[h].reshape(-1)[h_partial]
        ranked = h_partial[np.argsort(-fill, kind="stable")]
        kept_pairs = pairs[h][keep[h]].sum() + np.concatenate([[0], np.cumsum(pairs[h].reshape(-1)[ranked])])
        take = int(np.argmin(np.abs(kept_pairs - layout.counts[h].sum())))
        keep[h].reshape(-1)[ranked[:take]] = True
    return keep


@dataclass(frozen=True)
class Pass:
    """The tiles one pallas_call computes and how it masks them; ``steps``: each tile's step code
    (``backward_steps.StepCodes``) for a pass of kind STEPS, else None."""

    name: PassKind
    selected: np.ndarray  # bool [Hl, nq, nk]
    plan: MaskPlan
    steps: object = None


def split_passes(layout: BlockLayout, boundary: BoundaryPolicy) -> list[Pass]:
    """The non-empty passes of a call, in merge order."""
    padded_kv = (layout.kv_valid < layout.block_kv)[None, None, :]
    length = layout.mask.length
    if boundary == BoundaryPolicy.EXACT:
        computed, partial = layout.kinds == TileKind.FULL, layout.kinds == TileKind.PARTIAL
    else:  # balanced: kept PARTIAL tiles run as FULL, the rest are dropped
        computed, partial = balanced_keep(layout), np.zeros(layout.kinds.shape, bool)
    ragged = computed & padded_kv
    if ragged.any() and not layout.kv_valid_is_prefix:
        # padding inside kv tiles, not only at their ends: hide it with the exact mask instead
        if boundary == BoundaryPolicy.EXACT:
            partial, ragged = partial | ragged, np.zeros_like(ragged)
        else:
            validity = _validity_mask(layout.mask)
            plan = plan_mask(
                validity,
                block_layout(validity, layout.block_q, layout.block_kv),
                ragged.any(axis=0, keepdims=True),
            )
            passes = [
                Pass(
                    PassKind.FULL,
                    computed & ~padded_kv,
                    MaskPlan(MaskPlanMode.NONE, None, length),
                ),
                Pass(PassKind.MASKED, ragged, plan),
            ]
            return [p for p in passes if p.selected.any()]
    passes = [
        Pass(PassKind.FULL, computed & ~padded_kv, MaskPlan(MaskPlanMode.NONE, None, length)),
        Pass(
            PassKind.RAGGED,
            ragged,
            MaskPlan(MaskPlanMode.PREFIX, None, length, kv_valid=layout.kv_valid),
        ),
        Pass(PassKind.MASKED, partial, plan_mask(layout.mask, layout, partial)),
    ]
    return [p for p in passes if p.selected.any()]


def _validity_mask(mask: Mask) -> Mask:
    """A mask that allows every pair of real tokens (hides the padding slots of permuted views)."""
    if isinstance(mask, PermutedMask):
        return full(mask.base.length).permute(mask.order)
    valid = mask.token_validity()
    if valid is None:
        return full(mask.length)
    from stlib.masks import from_array

    return from_array(np.outer(valid, valid))


def exact_passes(layout: BlockLayout, options=None) -> list[Pass]:
    """``split_passes`` with the EXACT boundary: the passes of exact masked attention on ``layout``
    (``options`` unused: the signature of a ``tile_training`` pass rule)."""
    return split_passes(layout, BoundaryPolicy.EXACT)


__all__ = [
    "SPLIT_KINDS",
    "BoundaryPolicy",
    "Pass",
    "PassKind",
    "balanced_keep",
    "exact_passes",
    "split_passes",
]
