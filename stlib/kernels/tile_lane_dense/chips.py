"""The ``pallas_tile_lane_dense`` kernel's settings per chip, in one table (``CHIP_SETTINGS``): the
tuned forward blocks and rows of 3-D tiles (its block sweep's winners, ``stlib/tuned/NAME.json``),
the backward's step-coded blocks (the backward sweep's, ``stlib/tuned/NAME_backward.json``) and the
queries per fold. A chip's row is read once, where the call's ``Config.chip`` names it
(``settings``); a chip without a row of its own takes ``COMPILE_CHIP``'s, as a compile off a TPU
does."""

from __future__ import annotations

from dataclasses import dataclass

from stlib import tuned
from stlib.blocks import COMPILE_CHIP, BlockSizes
from stlib.device import CHIPS

NAME = "pallas_tile_lane_dense"
BACKWARD_TUNED = f"{NAME}_backward"

#: Queries per fold (``LaneDenseOptions.block_q_compute``) by default, per chip; a chip not named
#: folds its whole q tile at once. From the compiled schedules of the FULL region at 10 x 75,600 x 128
#: bf16 (bundles per step, whole tile -> 256 queries): v5e 2048 x 2048 / 128 keys a chunk 17,426 ->
#: 16,330 (and 18,012 -> 17,435 at 256 keys); v6e 2560 x 2560 / 256 12,838 -> 12,647; TPU7x
#: 2048 x 2048 / 512 8,394 -> 8,779 (slower; 8,752 -> 8,693 at 256 keys).
FOLD_LANES = {"v5e": 256, "v6e": 256}
#: A chip whose sliding tile was not swept takes the rows of 3-D tiles of this chip's.
ROWS_FROM = "v6e"
#: The backward's step-coded blocks (block_q, block_kv, keys per update) of a chip without a
#: backward sweep of its own.
BACKWARD_STEP_BLOCKS = (2048, 2048, 1024)


@dataclass(frozen=True)
class ChipSettings:
    """One chip's row: ``blocks``, the forward's default blocks (None: the chip table's defaults);
    ``tiled_rows``, rows of 3-D tiles per (q block, kv block) on a padded 3-D tiled order;
    ``backward_blocks``, (block_q, block_kv, keys per update) of the backward's step-coded pass;
    ``fold_lanes``, queries per fold (None: the whole q tile)."""

    blocks: BlockSizes | None
    tiled_rows: tuple[int, int]
    backward_blocks: tuple[int, int, int]
    fold_lanes: int | None


_FORWARD = tuned.load(NAME).get("chips", {})
_BACKWARD = tuned.load(BACKWARD_TUNED).get("chips", {})
#: The block sweep's winners per chip (``python -m stlib.bench.block_sweep``, records in
#: data/tile_block_sweep.jsonl): default blocks, the candidate with the fewest static cycles on dense
#: and band 0.25 together ...
DEFAULT_BLOCKS: dict[str, BlockSizes] = {
    chip: BlockSizes(*won["blocks"]) for chip, won in _FORWARD.items() if "blocks" in won
}
#: ... and rows of 3-D tiles per (q block, kv block) for a mask in a padded 3-D tiled order (a row:
#: the tiles along x, e.g. 5 x 384 = 1,920 tokens for 3x8x16 tiles of Wan 720p): the sweep's
#: sliding-tile winner, on the chips whose sliding tile was swept.
TILED_ROWS: dict[str, tuple[int, int]] = {
    chip: tuple(won["tiled_rows"]) for chip, won in _FORWARD.items() if "tiled_rows" in won
}

#: Every chip's settings (``ChipSettings``), one row per chip of the chip table.
CHIP_SETTINGS: dict[str, ChipSettings] = {
    chip: ChipSettings(
        DEFAULT_BLOCKS.get(chip),
        TILED_ROWS.get(chip) or TILED_ROWS.get(ROWS_FROM, (1, 1)),
        tuple(_BACKWARD.get(chip, {}).get("blocks", BACKWARD_STEP_BLOCKS)),
        FOLD_LANES.get(chip),
    )
    for chip in CHIPS
}


def settings(chip: str | None) -> ChipSettings:
    """``chip``'s row (None: ``COMPILE_CHIP``'s, the chip a compile off a TPU sizes for).

    >>> settings("v5e").fold_lanes, settings("tpu7x").fold_lanes
    (256, None)
    """
    return CHIP_SETTINGS[chip or COMPILE_CHIP]


__all__ = [
    "BACKWARD_STEP_BLOCKS",
    "BACKWARD_TUNED",
    "CHIP_SETTINGS",
    "DEFAULT_BLOCKS",
    "FOLD_LANES",
    "ROWS_FROM",
    "TILED_ROWS",
    "ChipSettings",
    "settings",
]
