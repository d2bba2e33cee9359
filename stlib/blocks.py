"""Block sizes of the Pallas attention kernels: the TPU tiling rule a block must keep ((8, 128):
rows a multiple of the sublanes, keys of the lanes, a kv chunk dividing the kv block) and the
default blocks of each chip (the chip table's, or an implementation's own per-chip overrides)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from stlib._checks import check_positive_int
from stlib._intmath import round_up
from stlib.device import LANES, SUBLANES, chip_spec, current_chip, resolve_interpret


@dataclass(frozen=True)
class BlockSizes:
    """Tile sizes of a Pallas attention kernel.

    ``block_q`` rows (multiple of 8) x ``block_kv`` keys (multiple of 128) per grid step, the kv
    tile processed in chunks of ``block_kv_compute`` keys (a multiple of 128 dividing block_kv;
    None: the whole tile at once).
    """

    block_q: int = 512
    block_kv: int = 1024
    block_kv_compute: int | None = None

    def __post_init__(self):
        block_q, block_kv, block_kv_compute = self.block_q, self.block_kv, self.block_kv_compute
        check_positive_int("block_q", block_q)
        check_positive_int("block_kv", block_kv)
        if block_q % SUBLANES:
            raise ValueError(f"{block_q=} must be a multiple of {SUBLANES} (TPU sublane tiling)")
        if block_kv % LANES:
            raise ValueError(f"{block_kv=} must be a multiple of {LANES} (TPU lane tiling)")
        if block_kv_compute is not None:
            check_chunk(block_kv_compute)
            if block_kv % block_kv_compute:
                raise ValueError(f"{block_kv_compute=} must be a multiple of {LANES} dividing {block_kv=}")

    @property
    def kv_chunk(self) -> int:
        return self.block_kv_compute or self.block_kv

    def fitted(self, length: int) -> BlockSizes:
        """Shrink the blocks to the padded sequence when it is shorter than a block."""
        bq = min(self.block_q, round_up(length, SUBLANES))
        bkv = min(self.block_kv, round_up(length, LANES))
        chunk = self.block_kv_compute
        if chunk is not None and (chunk > bkv or bkv % chunk):
            chunk = None
        return dataclasses.replace(self, block_q=bq, block_kv=bkv, block_kv_compute=chunk)


def check_chunk(block_kv_compute) -> None:
    check_positive_int("block_kv_compute", block_kv_compute)
    if block_kv_compute % LANES:
        raise ValueError(f"{block_kv_compute=} must be a multiple of {LANES} (TPU lane tiling)")


#: Blocks in interpret mode off a TPU: small tiles keep CPU tests small.
INTERPRET_BLOCK_SIZES = BlockSizes(block_q=128, block_kv=128)
#: The flash kernels' blocks on a TPU where an implementation has no tuned ones of its own (every
#: chip: big tiles keep 10-head prefetch tables in SMEM). Kernel choices, not hardware facts: the
#: chip table holds none.
TPU_BLOCK_SIZES = BlockSizes(block_q=512, block_kv=1024, block_kv_compute=512)
#: The chip whose defaults a compile for a TPU takes off a TPU (the case study's chip).
COMPILE_CHIP = "v6e"
#: ``block_sizes_for``'s default chip: the TPU at hand (a caller outside a kernel call's ``Config``).
AT_HAND = object()


def default_block_sizes(chip: str | None, overrides=None) -> BlockSizes:
    """The default blocks on ``chip`` (a chip-table name; None: interpret mode off a TPU), from an
    implementation's per-chip ``overrides`` where it has one, else ``TPU_BLOCK_SIZES``. Raises
    ValueError for a chip not in the table."""
    if chip is None:
        return INTERPRET_BLOCK_SIZES
    chip_spec(chip)  # a chip of the table, or ValueError naming them
    if overrides and chip in overrides:
        return overrides[chip]
    return TPU_BLOCK_SIZES


def block_sizes_for(
    length: int,
    block_q: int | None,
    block_kv: int | None,
    *,
    interpret: bool | None = None,
    block_kv_compute: int | None = None,
    overrides=None,
    chip: str | None = AT_HAND,
) -> BlockSizes:
    """The block sizes an implementation uses: explicit values, else the default of ``chip`` (a
    call's ``Config.chip``; default: the TPU at hand; ``COMPILE_CHIP``'s when compiling for a TPU
    from elsewhere, small tiles in interpret mode). The default chunk applies only with default kv
    blocks."""
    if chip is AT_HAND:
        chip = current_chip()
    if chip is None and not resolve_interpret(interpret):
        chip = COMPILE_CHIP
    base = default_block_sizes(chip, overrides)
    sizes = BlockSizes(
        block_q=block_q or base.block_q,
        block_kv=block_kv or base.block_kv,
        block_kv_compute=block_kv_compute
        if block_kv_compute is not None
        else (base.block_kv_compute if block_kv is None else None),
    )
    if block_q is None or block_kv is None:
        sizes = sizes.fitted(length)
    return sizes
