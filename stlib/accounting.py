"""What a kernel call computes and executes, for the roofline, the benchmarks and the static
estimator: hardware-independent work (``KernelWork``) and the schedule counts of a kernel whose grid
is (head, q row, step) (``row_grid_counts``)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from stlib.contract import ScheduleCounts
from stlib.layout import BlockLayout


@dataclass(frozen=True)
class KernelWork:
    """Hardware-independent work of one kernel call (all heads)."""

    grid_steps: int  # grid points visited
    computed_tiles: int  # steps that run the tile update
    masked_tiles: int  # of those, steps that also evaluate a mask
    executed_flops: float  # 4 * block_q * block_kv * D per computed tile
    useful_flops: float  # 4 * allowed pairs * D
    exps: float  # exponentials evaluated (block_q * block_kv per computed tile)

    @property
    def flop_ratio(self) -> float:
        """executed / useful flops (1.0: no wasted work)."""
        return self.executed_flops / self.useful_flops if self.useful_flops else math.inf

    def as_dict(self) -> dict:
        return {**dataclasses.asdict(self), "flop_ratio": self.flop_ratio}


def work_from_counts(
    layout: BlockLayout,
    num_heads: int,
    head_dim: int,
    grid_steps: int,
    computed_tiles: int,
    masked_tiles: int,
) -> KernelWork:
    """KernelWork from tile counts (per-head counts of a shared layout are multiplied by H)."""
    tile_pairs = layout.block_q * layout.block_kv
    allowed = layout.allowed_pairs * (num_heads if layout.num_heads == 1 else 1)
    return KernelWork(
        grid_steps=int(grid_steps),
        computed_tiles=int(computed_tiles),
        masked_tiles=int(masked_tiles),
        executed_flops=4.0 * computed_tiles * tile_pairs * head_dim,
        useful_flops=4.0 * allowed * head_dim,
        exps=float(computed_tiles) * tile_pairs,
    )


def block_changes(indices) -> int:
    """Block fetches of a pipelined operand whose block index runs through ``indices`` in grid order:
    a fetch wherever the index differs from the previous step's."""
    seq = np.asarray(indices).reshape(-1)
    return 0 if seq.size == 0 else 1 + int(np.count_nonzero(seq[1:] != seq[:-1]))


def row_grid_counts(
    setup, tiles, paths: dict[str, int], *, out_itemsize: int | None = None, writes_lse=False
):
    """``ScheduleCounts`` of a kernel whose grid is (head, q row, step): ``tiles`` int [Hl, nq, W],
    the kv tile each step fetches (Hl = 1: one table for every head); ``paths``: executions of the
    compute paths (each row's "init" and "finalise" are added here). A kv block is fetched wherever
    the (head, tile) index changes in grid order; each row fetches its q block once."""
    h = setup.num_heads
    nq, nk = setup.layout.grid_shape
    tiles = np.broadcast_to(tiles, (h, *np.shape(tiles)[1:]))
    return ScheduleCounts(
        {"init": h * nq, "finalise": h * nq, **paths},
        h * nq * tiles.shape[2],
        h * nq,
        block_changes(np.arange(h)[:, None, None] * nk + tiles),
        setup.block_q,
        setup.block_kv,
        out_itemsize or setup.itemsize,
        writes_lse=writes_lse,
    )


__all__ = ["KernelWork", "block_changes", "row_grid_counts", "work_from_counts"]
