"""The options and block rule of stlib's flash-style Pallas kernels (dense, block-sparse, tile):
``exp2`` and the kv chunk of the inner loop, resolved with the blocks by ``flash_resolve`` (the
registry's ``resolve`` of those kernels), and the blocks a tuned static estimate sweeps."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from stlib.blocks import block_sizes_for, check_chunk


@dataclass(frozen=True)
class FlashOptions:
    """Options of the flash-style Pallas kernels. ``exp2``: base-2 exponentials with log2(e) folded
    into the scale (one multiply fewer per score); ``block_kv_compute``: the kv chunk of the inner
    loop (None: the chip's default chunk with default blocks, else the whole kv tile)."""

    exp2: bool = False
    block_kv_compute: int | None = None

    def __post_init__(self):
        if not isinstance(self.exp2, bool):
            raise TypeError(f"exp2={self.exp2!r} must be True or False")
        if self.block_kv_compute is not None:
            check_chunk(self.block_kv_compute)


#: The (block_q, block_kv) a tuned static estimate of stlib's own Pallas kernels sweeps
#: (block_kv_compute: their default).
TUNED_CANDIDATES = ((512, 1024), (512, 2048), (1024, 1024), (1024, 2048))


def flash_resolve(mask, length: int, block_q, block_kv, options, interpret, chip):
    """(BlockSizes, options with the chunk resolved) of a flash-style kernel call on ``length``
    tokens for ``chip``: the registry's ``resolve`` of the kernels whose options carry
    ``block_kv_compute``."""
    sizes = block_sizes_for(
        length,
        block_q,
        block_kv,
        interpret=interpret,
        block_kv_compute=options.block_kv_compute,
        chip=chip,
    )
    return sizes, dataclasses.replace(options, block_kv_compute=sizes.block_kv_compute)
