"""How often each control path of a kernel runs, and the HBM bytes its DMAs move, counted from the
tile layout of the call. The per-kernel rules (``_stlib_counts``, ``_splash_counts``) are kept
self-contained, to become each kernel's own entry."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stlib.analysis.attribution import Attribution
from stlib.analysis.schedule import ScheduleFormatError


@dataclass(frozen=True)
class PathCounts:
    """Executions of each path of one kernel call (all heads) and the HBM bytes its DMAs move."""

    counts: dict[str, int]
    grid_steps: int
    dma_bytes: int


def _changes(seq) -> int:
    """Block fetches of a pipelined operand whose block index runs through ``seq`` in grid order
    (a fetch wherever the index differs from the previous step's)."""
    seq = np.asarray(seq).reshape(-1)
    return 0 if seq.size == 0 else 1 + int(np.count_nonzero(seq[1:] != seq[:-1]))


@dataclass(frozen=True)
class Setup:
    """The kernel call as the compile subprocess traces it, resolved in this process."""

    impl: str
    mask: object  # stlib Mask or None
    length: int  # tokens the kernel sees (mask.length)
    num_heads: int
    head_dim: int
    itemsize: int
    block_q: int
    block_kv: int
    block_kv_compute: int | None
    options: dict

    @property
    def layout(self):
        from stlib import masks

        return _layout(self.mask if self.mask is not None else masks.full(self.length), self.block_q, self.block_kv)


_LAYOUTS: dict = {}


def _layout(mask, block_q: int, block_kv: int):
    from stlib.layout import block_layout

    key = (repr(mask), mask.length, block_q, block_kv)
    if key not in _LAYOUTS:
        _LAYOUTS[key] = block_layout(mask, block_q, block_kv)
    return _LAYOUTS[key]


def _hbm_roles(att: Attribution, head_dim: int) -> dict[str, bool]:
    """Which of q, k, v, o, lse the kernel moves through HBM: XLA may place whole operands in VMEM
    (small shapes), and then the kernel's pipeline moves nothing for them."""
    inputs = [op for op in att.operands if op[3] == "input" and len(op[2]) == 3 and op[2][-1] == head_dim]
    outputs = [op for op in att.operands if op[3] == "output" and len(op[2]) == 3]
    o = [op for op in outputs if op[2][-1] == head_dim]
    lse = [op for op in outputs if op[2][-1] == 1]
    if len(inputs) != 3 or len(o) != 1 or len(lse) > 1:
        raise ScheduleFormatError(f"{att.kernel}: cannot tell q, k, v, o apart among operands {att.operands}")
    roles = {name: op[0] == "hbm" for name, op in zip("qkv", inputs)}
    return {**roles, "o": o[0][0] == "hbm", "lse": bool(lse) and lse[0][0] == "hbm"}


def path_counts(setup: Setup, att: Attribution) -> PathCounts:
    """Executions of each path of the kernel ``att.kernel`` (one pallas_call of ``setup.impl``) and
    the HBM bytes of its q / k / v block fetches and o / lse block writes."""
    d, item = setup.head_dim, setup.itemsize
    if setup.impl == "splash":
        counts, steps, q_rows, kv_fetches, bq, bkv, out_item = _splash_counts(setup, att)
        lse = 0
    else:
        counts, steps, q_rows, kv_fetches, out_item, lse = _stlib_counts(setup, att.kernel)
        bq, bkv = setup.block_q, setup.block_kv
    hbm = _hbm_roles(att, d)
    nbytes = (q_rows * bq * d * (item * hbm["q"] + out_item * hbm["o"] + lse * 4 * hbm["lse"] / d)
              + kv_fetches * bkv * d * item * (hbm["k"] + hbm["v"]))
    return PathCounts(counts, steps, int(nbytes))


# --------------------------------------------------------------------------------------------
# per-kernel rules: path counts of stlib's kernels and of Splash (each to become its kernel's entry)


def _stlib_counts(setup: Setup, kernel: str):
    """(path counts, grid steps, q-row visits, kv-tile fetches, output itemsize, writes lse)."""
    h, item = setup.num_heads, setup.itemsize
    layout = setup.layout
    nq, nk = layout.grid_shape
    mult = h if layout.num_heads == 1 else 1
    heads = np.arange(h)[:, None, None]
    rows = {"init": h * nq, "finalise": h * nq}
    if setup.impl == "pallas_dense":
        kv = np.broadcast_to(heads * nk + np.arange(nk), (h, nq, nk))
        return rows, h * nq * nk, h * nq, _changes(kv), item, 0
    if setup.impl == "pallas_block_sparse":
        from stlib.kernels.block_sparse import MASK_FREE, MASKED, step_table

        table = step_table(layout)
        counts = {**rows, "compute_full": int(np.sum((table & 3) == MASK_FREE)) * mult,
                  "compute_masked": int(np.sum((table & 3) == MASKED)) * mult}
        kv = heads * nk + np.broadcast_to(table >> 2, (h, nq, nk))
        return counts, h * nq * nk, h * nq, _changes(kv), item, 0
    if setup.impl != "pallas_tile":
        raise ValueError(f"no path counts for impl={setup.impl!r}")
    from stlib.kernels.tile import TileOptions, split_passes
    from stlib.layout import flat_steps, row_tables

    options = TileOptions(**setup.options)
    passes = split_passes(layout, options.boundary)
    this = next(p for p in passes if kernel.startswith(f"stlib_tile_{p.name}"))
    selected = this.selected
    out_item = 4 if len(passes) > 1 else item  # f32 partial results to merge
    name = "compute_full" if this.name == "full" else "compute_masked"
    if options.form == "rows":
        tiles, row_counts = row_tables(selected)
        kv = heads * nk + np.broadcast_to(tiles, (h,) + tiles.shape[1:])
        counts = {**rows, name: int(row_counts.sum()) * mult}
        return counts, h * nq * tiles.shape[2], h * nq, _changes(kv), out_item, 1
    flat = flat_steps(selected)
    groups = np.arange(mult)[:, None]
    kv = (groups + flat["step_head"]) * nk + flat["step_kv"]
    q = (groups + flat["step_head"]) * nq + flat["step_q"]
    first = int(flat["step_first"].sum()) * mult
    counts = {"init": first, "finalise": first, name: int(flat["step_active"].sum()) * mult}
    return counts, flat["step_q"].size * mult, _changes(q), _changes(kv), out_item, 1


def _splash_counts(setup: Setup, att: Attribution):
    """Splash's grid (from the dump) is H x q tiles x (widest row of non-empty kv tiles); every
    non-empty tile of its padded mask is computed (its masking is branch-free), and a kv tile is
    fetched once per non-empty tile (data_next)."""
    from stlib import masks
    from stlib.kernels.block_sparse import step_table
    from stlib.kernels.splash import splash_blocks

    blocks = splash_blocks(setup.length, setup.block_q, setup.block_kv)
    padded = blocks.padded_length(setup.length)
    mask = setup.mask
    if mask is None or isinstance(mask, masks.FullMask):
        padded_mask = masks.full(padded)
    elif isinstance(mask, masks.BandMask):
        padded_mask = masks.band(padded, mask.width)
    else:
        raise NotImplementedError(f"the Splash estimate knows full and band masks, not {mask!r}")
    if att.grid is None:
        raise ScheduleFormatError(f"{att.kernel}: the dump does not name Splash's grid")
    layout = _layout(padded_mask, blocks.block_q, blocks.block_kv)
    nq, nk = layout.grid_shape
    h = setup.num_heads
    if att.grid[:2] != (h, nq):
        raise ScheduleFormatError(f"{att.kernel}: grid {att.grid} does not start with (heads, q tiles) = {(h, nq)}")
    kv = np.arange(h)[:, None, None] * nk + np.broadcast_to(step_table(layout) >> 2, (h, nq, nk))
    counts = {"init": h * nq, "finalise": h * nq, "compute": int(np.sum(layout.kinds != 0)) * h}
    return counts, att.grid_steps, h * nq, _changes(kv), blocks.block_q, blocks.block_kv, setup.itemsize
