"""The ``pallas_tile_lane_dense`` kernel's options (``LaneDenseOptions``); the chips' defaults are
in ``chips.CHIP_SETTINGS``."""

from __future__ import annotations

from dataclasses import dataclass

from stlib._checks import check_positive_int
from stlib.blocks import check_chunk
from stlib.device import LANES, SUBLANES, chip_spec


@dataclass(frozen=True)
class LaneDenseOptions:
    """``exp2``: base-2 exponentials with log2(e) folded into q's scale; ``block_kv_compute``: keys per
    chunk of the inner loop (None: the chip default with default blocks, else the whole kv tile);
    ``block_kv_register``: keys per register tile inside a chunk (None: the whole chunk);
    ``bf16_probs``: probabilities enter p.v in v's dtype when v is bf16 (f32 inputs stay f32);
    ``pattern_grain``: sub-tile size of pattern steps (None: chosen per layout, 0: no patterns);
    ``lookahead``: chunks of a step whose scores (k q^T) are issued ahead of the chunk being folded;
    a chunk whose pair mask is evaluated (MASKED steps, a pattern's masked sub-tiles) is issued only
    when it is folded (None: every later chunk of the kv block, as many as fit VMEM,
    ``fit_lookahead``; 0: none, each chunk's scores just before its max);
    ``block_q_compute``: queries per fold in the mask-free regions over whole q tiles (FULL, RAGGED),
    the lane width of the scores one fold holds: a step folds each slice of its q lanes through all
    its chunks in turn, so a fold holds [chunk, 256] scores, not [chunk, block_q] (None: the chip's
    ``chips.FOLD_LANES``, else the whole q tile); MASKED steps and patterns fold whole lane runs;
    ``chip``: the chip whose VMEM the blocks must fit and whose limit the call asks for (None: the
    chip at hand, else the smallest VMEM in the chip table); ``backward_blocks``: (block_q, block_kv,
    keys per update) of the backward's step-coded pass on a layout without rows of 3-D tiles, each
    block no larger than the forward's (None: the chip's tuned backward blocks)."""

    exp2: bool = True
    block_kv_compute: int | None = None
    block_kv_register: int | None = 256
    bf16_probs: bool = True
    pattern_grain: int | None = None
    lookahead: int | None = None
    block_q_compute: int | None = None
    chip: str | None = None
    backward_blocks: tuple[int, int, int] | None = None

    def __post_init__(self):
        for name in ("exp2", "bf16_probs"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name}={getattr(self, name)!r} must be True or False")
        if self.block_kv_compute is not None:
            check_chunk(self.block_kv_compute)
        if self.block_kv_register is not None:
            check_positive_int("block_kv_register", self.block_kv_register)
            if self.block_kv_register % SUBLANES:
                raise ValueError(
                    f"block_kv_register={self.block_kv_register} must be a multiple of {SUBLANES} "
                    "(TPU sublane tiling)"
                )
        if self.pattern_grain is not None and (
            not isinstance(self.pattern_grain, int) or self.pattern_grain < 0 or self.pattern_grain % LANES
        ):
            raise ValueError(
                f"pattern_grain={self.pattern_grain!r} must be None, 0 or a positive multiple of {LANES}"
            )
        if self.lookahead is not None:
            check_positive_int("lookahead", self.lookahead, allow_zero=True)
        if self.block_q_compute is not None and (
            not isinstance(self.block_q_compute, int)
            or self.block_q_compute <= 0
            or self.block_q_compute % LANES
        ):
            raise ValueError(
                f"block_q_compute={self.block_q_compute!r} must be None or a positive multiple of {LANES}"
            )
        if self.chip is not None:
            chip_spec(self.chip)  # raises, naming the chips of the table
        if self.backward_blocks is not None:
            blocks = tuple(self.backward_blocks)  # a record's JSON list too: options hash by value
            if len(blocks) != 3 or any(not isinstance(b, int) or b <= 0 or b % LANES for b in blocks):
                raise ValueError(
                    f"backward_blocks={self.backward_blocks!r} must be (block_q, block_kv, keys per update), "
                    f"positive multiples of {LANES}"
                )
            if blocks[1] % blocks[2]:
                raise ValueError(f"backward_blocks={blocks}: keys per update must divide block_kv")
            object.__setattr__(self, "backward_blocks", blocks)
