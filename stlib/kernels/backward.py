"""The split backward of the tile kernels: a dq kernel over the forward's per-q-row tile tables and
a dk / dv kernel over the transposed, per-kv-row tables, pass by pass as the forward ran.

With P = softmax(S) (the forward's own probabilities, rebuilt from its log-sum-exp), the
gradient of o = P v under a cotangent dO is

    dV = P^T dO,   dP = dO V^T,   dS = P * (dP - di)  with di = rowsum(dO * O),
    dQ = scale * dS K,   dK = scale * dS^T Q.

The dq kernel walks each q tile's kv tiles (the forward's grid) and accumulates dQ; the dk / dv
kernel walks each kv tile's q tiles (which q tiles touch it: the transposed table) and accumulates
dK and dV, so neither writes partials to HBM and both are deterministic. That is 7 matmuls against
the forward's 2 (S twice, dP twice, dV, dQ, dK); a fused kernel would share S and dP. Each grid
walks only the rows that have tiles in its pass, adding into f32 accumulators that the passes share
(aliased buffers, zeros at the start): a kv tile that no query sees is never visited and keeps
zero dk and dv, and a pass of few tiles (the ragged last kv tile) costs few steps.

The residuals are the output and one f32 log-sum-exp per query, kept lane-dense ([H, 1, L]: queries
on lanes); di is computed once in f32 (XLA glue) in the same form. The dk / dv kernel computes the
transposed scores S^T [block_kv, block_q] (keys on sublanes), where those rows broadcast for free;
the dq kernel turns them into columns once per q tile. Each pass evaluates its tiles' mask as the
forward did (none, the in-kernel predicate, a kv-prefix compare, or the int8 tile table; the
dk / dv kernel reads that table transposed) and exponentiates as the forward did (base 2 with
log2(e) folded into the scale when ``exp2``), so the gradient is that of what the forward computed,
balanced rounding included. A masked pair contributes nothing, whatever its data; an allowed pair
with a NaN or inf input makes its gradient entries NaN or inf.
"""

from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from stlib.device import current_chip, resolve_interpret
from stlib.kernels import common
from stlib.layout import block_layout
from stlib.masks import full
from stlib.registry import Backward

#: Name prefixes of the backward's Pallas kernels in a compiled program.
DQ_PREFIX, DKV_PREFIX, FUSED_PREFIX = "stlib_bwd_dq", "stlib_bwd_dkv", "stlib_bwd_fused"
BACKWARD_PREFIXES = (DQ_PREFIX, DKV_PREFIX, FUSED_PREFIX)
#: The backward's own tiles, compiled for a TPU, where the forward's are larger (``tile_training``'s
#: ``own_blocks``): 1,024 x 1,024. Static estimate of the fused backward at 10 x 75,600 x 128, band
#: 0.25, v6e: 37.3 ms at 1,024 x 1,024 against 43.0 ms at 512 x 1,024 (a grid step's ~590 bundles of
#: fixed cost beside a 2,717-bundle tile); 1,024 x 2,048 leaves no VMEM for a dq window (split: 48.8).
BACKWARD_TILE = (1024, 1024)


def _mask_fn(plan: common.MaskPlan, tab, head, qi, ki, bq, bkv, *, transposed: bool):
    """bool mask of a step's tile, [bq, bkv] (or [bkv, bq] ``transposed``), or None (no mask)."""
    mode = plan.mode
    if mode == common.MaskPlanMode.NONE:
        return None
    shape = (bkv, bq) if transposed else (bq, bkv)
    q_axis, k_axis = (1, 0) if transposed else (0, 1)
    if mode == common.MaskPlanMode.PREFIX:
        return jax.lax.broadcasted_iota(jnp.int32, shape, k_axis) < tab[-1][ki]
    if mode == common.MaskPlanMode.IOTA and not transposed:
        return common.iota_mask(plan, qi * bq, ki * bkv, shape, head)
    if mode == common.MaskPlanMode.IOTA:  # the forward's predicate on S^T's iotas (keys on sublanes)
        rows = qi * bq + jax.lax.broadcasted_iota(jnp.int32, shape, q_axis)
        cols = ki * bkv + jax.lax.broadcasted_iota(jnp.int32, shape, k_axis)
        return plan.mask.mask_function(rows, cols, head) & (cols < plan.length)
    return None  # TABLE: read from the table operand by the kernel


def _dot(a, b, contract):
    """a . b contracting ``contract`` = (axis of a, axis of b), f32 accumulation."""
    return jax.lax.dot_general(
        a, b, ((contract[:1], contract[1:]), ((), ())), preferred_element_type=jnp.float32
    )


def _worked_rows(counts: np.ndarray, num_heads: int) -> list[np.ndarray]:
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


def _grid_tables(selected, plan, num_heads, *, transposed: bool):
    """(prefetch tables, W, worked rows) of a pass: the worked rows' head / row / slot, then the
    per-row tile lists and counts (the forward's, or transposed: per kv tile its q tiles) and the
    mask-table index or kv_valid a plan needs (last)."""
    if transposed:
        if plan.mode == common.MaskPlanMode.TABLE:
            plan = dataclasses.replace(
                plan, index=np.broadcast_to(plan.index, selected.shape).transpose(0, 2, 1)
            )
        selected = np.ascontiguousarray(selected.transpose(0, 2, 1))
    per_row, extent = common.row_step_tables(selected, plan)
    worked = _worked_rows(per_row[1].reshape(selected.shape[:2]), num_heads)
    return [*worked, *per_row], extent, worked[0].size


def _block_maps(where, *, q_at: int, kv_at: int):
    """Index maps from a grid step's ``where`` (head first, then the q and kv tiles at ``q_at`` and
    ``kv_at``): q-side blocks (q, dO, dq), kv-side blocks (k, v, dk, dv), lane-dense rows (lse, di)."""

    def q_map(p, j, *tab):
        w = where(p, j, *tab)
        return (w[0], w[q_at], 0)

    def kv_map(p, j, *tab):
        w = where(p, j, *tab)
        return (w[0], w[kv_at], 0)

    def row_map(p, j, *tab):
        w = where(p, j, *tab)
        return (w[0], 0, w[q_at])

    return q_map, kv_map, row_map


def _operand_specs(q_map, kv_map, row_map, bq: int, bkv: int, head_dim: int) -> list:
    """BlockSpecs of q, k, v, dO, lse, di (the operands both backward kernels read, in that order)."""
    return [
        pl.BlockSpec((None, bq, head_dim), q_map),
        pl.BlockSpec((None, bkv, head_dim), kv_map),
        pl.BlockSpec((None, bkv, head_dim), kv_map),
        pl.BlockSpec((None, bq, head_dim), q_map),
        pl.BlockSpec((None, 1, bq), row_map),  # lse, lane-dense
        pl.BlockSpec((None, 1, bq), row_map),  # di, lane-dense
    ]


def _dq_pass(
    q, k, v, do, lse, di, dq_in, selected, plan, *, name, bq, bkv, softmax: common.SoftmaxOptions, interpret
):
    """dq_in + dQ / scale of one pass, [H, Lq, D] f32 (dq_in's buffer reused)."""
    num_heads, _, head_dim = q.shape
    tables, extent, n_rows = _grid_tables(selected, plan, num_heads, transposed=False)
    common.check_prefetch(tables, plan, bq, "the dq kernel", "use larger tiles or fewer heads per call")
    table_mask = plan.mode == common.MaskPlanMode.TABLE

    def where(p, j, head, row, slot, tiles, counts, *_):
        """(head, q tile, kv tile, table entry, active) of grid step (p, j)."""
        entry = slot[p] * extent + j
        return head[p], row[p], tiles[entry], entry, j < counts[slot[p]]

    def kernel(*refs):
        tab, rest = refs[: len(tables)], list(refs[len(tables) :])
        mask_ref = rest.pop(7) if table_mask else None
        q_ref, k_ref, v_ref, do_ref, lse_ref, di_ref, dq_prev, dq_ref, lse_col, di_col, acc = rest
        p, j = pl.program_id(0), pl.program_id(1)
        h, qi, ki, _, active = where(p, j, *tab)

        @pl.when(j == 0)
        def _():  # this q tile's lane-dense rows as columns, once per q tile
            for row, col in ((lse_ref, lse_col), (di_ref, di_col)):
                col[...] = jnp.broadcast_to(
                    jnp.transpose(jnp.broadcast_to(row[...], (8, bq)))[:, :1], col.shape
                )
            acc[...] = dq_prev[...]

        @pl.when(active)
        def _():
            qs = common.scaled_q(q_ref, softmax)
            s = _dot(qs, k_ref[...], (1, 1))  # [bq, bkv]
            p_ = softmax.exp(s - common._lanes(lse_col[...], bkv))
            dp = _dot(do_ref[...], v_ref[...], (1, 1))  # [bq, bkv]
            ds = p_ * (dp - common._lanes(di_col[...], bkv))
            allowed = (
                (mask_ref[...] != 0)
                if table_mask
                else _mask_fn(plan, tab, h, qi, ki, bq, bkv, transposed=False)
            )
            if allowed is not None:
                ds = jnp.where(allowed, ds, 0.0)
            acc[...] += _dot(ds.astype(k_ref.dtype), k_ref[...], (1, 0))  # [bq, D]

        @pl.when(j == extent - 1)
        def _():
            dq_ref[...] = acc[...]

    q_map, kv_map, row_map = _block_maps(where, q_at=1, kv_at=2)
    in_specs = [
        *_operand_specs(q_map, kv_map, row_map, bq, bkv, head_dim),
        pl.BlockSpec((None, bq, head_dim), q_map),  # dq so far (aliased to the output)
    ]
    operands = [q, k, v, do, lse, di, dq_in]
    if table_mask:
        in_specs.append(
            pl.BlockSpec((None, bq, bkv), lambda p, j, *tab: (tab[-1][where(p, j, *tab)[3]], 0, 0))
        )
        operands.append(jnp.asarray(plan.table))
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=len(tables),
        grid=(n_rows, extent),
        in_specs=in_specs,
        out_specs=pl.BlockSpec((None, bq, head_dim), q_map),
        scratch_shapes=[
            pltpu.VMEM((bq, common.LANES), jnp.float32),
            pltpu.VMEM((bq, common.LANES), jnp.float32),
            pltpu.VMEM((bq, head_dim), jnp.float32),
        ],
    )
    return common.run_pallas(
        kernel,
        grid_spec=grid_spec,
        out_shape=jax.ShapeDtypeStruct(dq_in.shape, jnp.float32),
        interpret=interpret,
        dimension_semantics=("parallel", "arbitrary"),
        name=name,
        operands=[*(jnp.asarray(t) for t in tables), *operands],
        input_output_aliases={len(tables) + 6: 0},
    )


def _dkv_pass(
    q,
    k,
    v,
    do,
    lse,
    di,
    dk_in,
    dv_in,
    selected,
    plan,
    *,
    name,
    bq,
    bkv,
    softmax: common.SoftmaxOptions,
    interpret,
):
    """(dk_in + dK / scale, dv_in + dV) of one pass, [H, Lkv, D] f32 each (their buffers reused)."""
    num_heads, _, head_dim = k.shape
    tables, extent, n_rows = _grid_tables(selected, plan, num_heads, transposed=True)
    common.check_prefetch(tables, plan, bq, "the dk / dv kernel", "use larger tiles or fewer heads per call")
    table_mask = plan.mode == common.MaskPlanMode.TABLE

    def where(p, j, head, row, slot, tiles, counts, *_):
        """(head, kv tile, q tile, table entry, active) of grid step (p, j)."""
        entry = slot[p] * extent + j
        return head[p], row[p], tiles[entry], entry, j < counts[slot[p]]

    def kernel(*refs):
        tab, rest = refs[: len(tables)], list(refs[len(tables) :])
        mask_ref = rest.pop(8) if table_mask else None
        q_ref, k_ref, v_ref, do_ref, lse_ref, di_ref, dk_prev, dv_prev, dk_ref, dv_ref, dk_acc, dv_acc = rest
        p, j = pl.program_id(0), pl.program_id(1)
        h, ki, qi, _, active = where(p, j, *tab)

        @pl.when(j == 0)
        def _():
            dk_acc[...] = dk_prev[...]
            dv_acc[...] = dv_prev[...]

        @pl.when(active)
        def _():
            qs = common.scaled_q(q_ref, softmax)
            s_t = _dot(k_ref[...], qs, (1, 1))  # [bkv, bq]: keys on sublanes
            p_t = softmax.exp(s_t - lse_ref[...])  # the lse row [1, bq] broadcasts over the keys
            allowed = (
                (mask_ref[...] != 0)
                if table_mask
                else _mask_fn(plan, tab, h, qi, ki, bq, bkv, transposed=True)
            )
            if allowed is not None:
                p_t = jnp.where(allowed, p_t, 0.0)
            dv_acc[...] += _dot(p_t.astype(do_ref.dtype), do_ref[...], (1, 0))  # [bkv, D]
            dp_t = _dot(v_ref[...], do_ref[...], (1, 1))  # [bkv, bq]
            ds_t = p_t * (dp_t - di_ref[...])
            if allowed is not None:
                ds_t = jnp.where(allowed, ds_t, 0.0)
            dk_acc[...] += _dot(ds_t.astype(q_ref.dtype), q_ref[...], (1, 0))  # [bkv, D]

        @pl.when(j == extent - 1)
        def _():
            dk_ref[...] = dk_acc[...]
            dv_ref[...] = dv_acc[...]

    q_map, kv_map, row_map = _block_maps(where, q_at=2, kv_at=1)
    in_specs = [
        *_operand_specs(q_map, kv_map, row_map, bq, bkv, head_dim),
        pl.BlockSpec((None, bkv, head_dim), kv_map),  # dk so far (aliased)
        pl.BlockSpec((None, bkv, head_dim), kv_map),  # dv so far (aliased)
    ]
    operands = [q, k, v, do, lse, di, dk_in, dv_in]
    if table_mask:
        in_specs.append(
            pl.BlockSpec((None, bkv, bq), lambda p, j, *tab: (tab[-1][where(p, j, *tab)[3]], 0, 0))
        )
        operands.append(jnp.asarray(np.ascontiguousarray(plan.table.transpose(0, 2, 1))))
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=len(tables),
        grid=(n_rows, extent),
        in_specs=in_specs,
        out_specs=[pl.BlockSpec((None, bkv, head_dim), kv_map)] * 2,
        scratch_shapes=[pltpu.VMEM((bkv, head_dim), jnp.float32)] * 2,
    )
    return common.run_pallas(
        kernel,
        grid_spec=grid_spec,
        out_shape=[jax.ShapeDtypeStruct(dk_in.shape, jnp.float32)] * 2,
        interpret=interpret,
        dimension_semantics=("parallel", "arbitrary"),
        name=name,
        operands=[*(jnp.asarray(t) for t in tables), *operands],
        input_output_aliases={len(tables) + 6: 0, len(tables) + 7: 1},
    )


def _fused_pass(
    q,
    k,
    v,
    do,
    lse,
    di,
    dq_in,
    dk_in,
    dv_in,
    selected,
    plan,
    *,
    name,
    window,
    bq,
    bkv,
    softmax,
    interpret,
    vmem_limit,
):
    """(dq_in + dQ / scale, dk_in + dK / scale, dv_in + dV) of one pass restricted to the q tiles
    ``window`` = (first, end): the dk / dv grid (kv rows, head by head) that also forms dQ = dS K
    from the dS^T it has, accumulating the window's dq of the current head in a VMEM scratch. That
    scratch is read from HBM when a head's first kv row starts and written back after its last, by
    DMAs the kernel waits for (the bytes are small beside the steps'); rows of one head are
    consecutive in the grid, so the scratch is whole when it is written. Heads without a row in
    the pass are never visited and keep their dq (aliased buffers)."""
    num_heads, _, head_dim = k.shape
    first_tile, end_tile = window
    rows = (end_tile - first_tile) * bq
    tables, extent, n_rows = _grid_tables(selected, plan, num_heads, transposed=True)
    common.check_prefetch(
        tables, plan, bq, "the fused backward kernel", "use larger tiles or fewer heads per call"
    )
    table_mask = plan.mode == common.MaskPlanMode.TABLE

    def where(p, j, head, row, slot, tiles, counts, *_):
        """(head, kv tile, q tile, table entry, active) of grid step (p, j)."""
        entry = slot[p] * extent + j
        return head[p], row[p], tiles[entry], entry, j < counts[slot[p]]

    def kernel(*refs):
        tab, rest = refs[: len(tables)], list(refs[len(tables) :])
        mask_ref = rest.pop(9) if table_mask else None
        (q_ref, k_ref, v_ref, do_ref, lse_ref, di_ref, dk_prev, dv_prev, dq_hbm_in,
         dk_ref, dv_ref, dq_hbm, dk_acc, dv_acc, dq_acc, sem) = rest  # fmt: skip
        p, j = pl.program_id(0), pl.program_id(1)
        h, ki, qi, _, active = where(p, j, *tab)
        heads = tab[0]
        head_rows = dq_hbm.at[h, pl.ds(first_tile * bq, rows)]  # this window of the head's dq in HBM

        @pl.when((j == 0) & ((p == 0) | (heads[jnp.maximum(p - 1, 0)] != h)))
        def _():  # the head's first kv row: its dq so far into VMEM
            pltpu.async_copy(dq_hbm_in.at[h, pl.ds(first_tile * bq, rows)], dq_acc, sem).wait()

        @pl.when(j == 0)
        def _():
            dk_acc[...] = dk_prev[...]
            dv_acc[...] = dv_prev[...]

        @pl.when(active)
        def _():
            qs = common.scaled_q(q_ref, softmax)
            s_t = _dot(k_ref[...], qs, (1, 1))  # [bkv, bq]: keys on sublanes
            p_t = softmax.exp(s_t - lse_ref[...])
            allowed = (
                (mask_ref[...] != 0)
                if table_mask
                else _mask_fn(plan, tab, h, qi, ki, bq, bkv, transposed=True)
            )
            if allowed is not None:
                p_t = jnp.where(allowed, p_t, 0.0)
            dv_acc[...] += _dot(p_t.astype(do_ref.dtype), do_ref[...], (1, 0))  # [bkv, D]
            dp_t = _dot(v_ref[...], do_ref[...], (1, 1))  # [bkv, bq]
            ds_t = p_t * (dp_t - di_ref[...])
            if allowed is not None:
                ds_t = jnp.where(allowed, ds_t, 0.0)
            ds_t = ds_t.astype(q_ref.dtype)
            dk_acc[...] += _dot(ds_t, q_ref[...], (1, 0))  # [bkv, D]
            at = pl.ds(pl.multiple_of((qi - first_tile) * bq, bq), bq)
            dq_acc[at, :] += _dot(ds_t, k_ref[...], (0, 0))  # [bq, D] = dS K

        @pl.when(j == extent - 1)
        def _():
            dk_ref[...] = dk_acc[...]
            dv_ref[...] = dv_acc[...]

        @pl.when((j == extent - 1) & ((p == n_rows - 1) | (heads[jnp.minimum(p + 1, n_rows - 1)] != h)))
        def _():  # the head's last kv row: its dq back to HBM
            pltpu.async_copy(dq_acc, head_rows, sem).wait()

    q_map, kv_map, row_map = _block_maps(where, q_at=2, kv_at=1)
    in_specs = [
        *_operand_specs(q_map, kv_map, row_map, bq, bkv, head_dim),
        pl.BlockSpec((None, bkv, head_dim), kv_map),  # dk so far (aliased)
        pl.BlockSpec((None, bkv, head_dim), kv_map),  # dv so far (aliased)
        pl.BlockSpec(memory_space=pl.ANY),  # dq so far, in HBM (aliased)
    ]
    operands = [q, k, v, do, lse, di, dk_in, dv_in, dq_in]
    if table_mask:
        in_specs.append(
            pl.BlockSpec((None, bkv, bq), lambda p, j, *tab: (tab[-1][where(p, j, *tab)[3]], 0, 0))
        )
        operands.append(jnp.asarray(np.ascontiguousarray(plan.table.transpose(0, 2, 1))))
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=len(tables),
        grid=(n_rows, extent),
        in_specs=in_specs,
        out_specs=[
            pl.BlockSpec((None, bkv, head_dim), kv_map),
            pl.BlockSpec((None, bkv, head_dim), kv_map),
            pl.BlockSpec(memory_space=pl.ANY),
        ],
        scratch_shapes=[
            pltpu.VMEM((bkv, head_dim), jnp.float32),
            pltpu.VMEM((bkv, head_dim), jnp.float32),
            pltpu.VMEM((rows, head_dim), jnp.float32),
            pltpu.SemaphoreType.DMA,
        ],
    )
    base = len(tables)
    return common.run_pallas(
        kernel,
        grid_spec=grid_spec,
        out_shape=[
            jax.ShapeDtypeStruct(dk_in.shape, jnp.float32),
            jax.ShapeDtypeStruct(dv_in.shape, jnp.float32),
            jax.ShapeDtypeStruct(dq_in.shape, jnp.float32),
        ],
        interpret=interpret,
        dimension_semantics=("arbitrary", "arbitrary"),  # a head's kv rows all add into one dq scratch
        name=name,
        operands=[*(jnp.asarray(t) for t in tables), *operands],
        input_output_aliases={base + 6: 0, base + 7: 1, base + 8: 2},
        vmem_limit_bytes=vmem_limit,
    )


def fused_vmem_bytes(block_q: int, block_kv: int, head_dim: int, itemsize: int) -> int:
    """VMEM the fused kernel needs besides its dq scratch (upper estimate): double-buffered q, dO, k,
    v blocks and lse / di rows, double-buffered f32 dk / dv blocks in and out, the dk / dv
    accumulators, and about five [block_kv, block_q] f32 intermediates (S^T, P^T, dP^T, dS^T, mask)."""
    blocks = 2 * itemsize * head_dim * (2 * block_q + 2 * block_kv) + 2 * 2 * block_q * 4
    accumulators = 2 * 2 * 2 * block_kv * head_dim * 4 + 2 * block_kv * head_dim * 4
    return blocks + accumulators + 5 * block_kv * block_q * 4


def dq_windows(num_q_tiles: int, block_q: int, block_kv: int, head_dim: int, itemsize: int, chip=None):
    """The q-tile windows (first, end) of the fused kernel: as few as let a window's f32 dq scratch
    ([tiles x block_q, D]) fit beside ``fused_vmem_bytes`` in ``common.vmem_limit(chip)``; empty
    when not even one q tile fits (then the backward runs split)."""
    room = common.vmem_limit(chip) - fused_vmem_bytes(block_q, block_kv, head_dim, itemsize)
    per_window = room // (block_q * head_dim * 4)
    if per_window < 1:
        return []
    count = -(-num_q_tiles // per_window)
    size = -(-num_q_tiles // count)  # windows of near-equal size
    return [(w, min(w + size, num_q_tiles)) for w in range(0, num_q_tiles, size)]


def residual_rows(lse, do, o, length: int, padded: int):
    """The lane-dense f32 rows [H, 1, padded] the kernels read: the log-sum-exp (a row that saw no
    key, -inf, becomes +inf so its probabilities are exactly zero; padding too) and di =
    rowsum(dO * O)."""
    lse = jnp.where(lse == -jnp.inf, jnp.inf, lse.astype(jnp.float32))
    di = jnp.sum(do.astype(jnp.float32) * o.astype(jnp.float32), axis=-1)
    pad = ((0, 0), (0, padded - length))
    return jnp.pad(lse, pad, constant_values=jnp.inf)[:, None, :], jnp.pad(di, pad)[:, None, :]


#: How the backward runs: "fused" (one dk / dv / dq kernel per pass and dq window, 5 matmuls per
#: tile), "split" (a dq kernel and a dk / dv kernel per pass, 7 matmuls: the oracle) or "auto" (fused
#: where a dq window of at least one q tile fits in VMEM, else split).
BACKWARD_METHODS = ("auto", "fused", "split")


def _window_selected(selected: np.ndarray, window) -> np.ndarray:
    """``selected`` ([Hl, nq, nk]) with the q tiles outside ``window`` dropped."""
    keep = np.zeros(selected.shape[1], bool)
    keep[window[0] : window[1]] = True
    return selected & keep[None, :, None]


@dataclasses.dataclass(frozen=True)
class KernelCall:
    """One Pallas call of the backward: its kernel ``name``, ``kind`` ("fused", "dq" or "dkv"), the
    tiles it computes (``selected``, [Hl, nq, nk]), the pass's mask plan and, fused, its q-tile
    ``window``."""

    name: str
    kind: str
    selected: np.ndarray
    plan: common.MaskPlan
    window: tuple[int, int] | None = None


def kernel_calls(passes, method: str, *, num_q_tiles, block_q, block_kv, head_dim, itemsize, chip):
    """The backward's Pallas calls over the forward's ``passes``, in order: per pass, the fused
    kernel once per dq window with tiles in it (``dq_windows``), or the dq then the dk / dv kernel
    (``method`` "split", or "auto" where no window fits). Raises ValueError for ``method``
    "fused" where no window fits, and for an unknown method."""
    if method not in BACKWARD_METHODS:
        raise ValueError(f"method={method!r} must be one of {BACKWARD_METHODS}")
    windows = []
    if method != "split":
        windows = dq_windows(num_q_tiles, block_q, block_kv, head_dim, itemsize, chip)
        if not windows and method == "fused":
            raise ValueError(
                f"the fused backward's dq scratch of one {block_q}-row q tile does not fit in VMEM "
                f"beside {block_q}x{block_kv} tiles on {chip or 'the smallest chip'}; use method='split'"
            )
    calls = []
    for p in passes:
        if not windows:
            calls += [
                KernelCall(f"{DQ_PREFIX}_{p.name}", "dq", p.selected, p.plan),
                KernelCall(f"{DKV_PREFIX}_{p.name}", "dkv", p.selected, p.plan),
            ]
            continue
        for i, window in enumerate(windows):
            selected = _window_selected(p.selected, window)
            if selected.any():
                calls.append(KernelCall(f"{FUSED_PREFIX}_{p.name}_w{i}", "fused", selected, p.plan, window))
    return calls


def tile_backward(
    q,
    k,
    v,
    o,
    lse,
    do,
    passes,
    *,
    block_q: int,
    block_kv: int,
    scale: float,
    exp2: bool,
    interpret=None,
    method: str = "auto",
    chip: str | None = None,
):
    """(dq, dk, dv) of tile attention: q, k, v, o, do [H, L, D], lse [H, L] (natural log, -inf for
    rows that saw nothing) and the forward's ``passes`` (``stlib.kernels.tile.split_passes``), or
    the backward's ``KernelCall`` list itself (``kernel_calls``). Each in its input's dtype.
    ``method``: one of ``BACKWARD_METHODS`` (for passes); ``chip``: the chip whose VMEM sizes the
    fused kernel's dq windows (None: the current TPU's, else the smallest chip's)."""
    length = q.shape[1]
    qp, dop = common.pad_sequence(q, block_q), common.pad_sequence(do, block_q)
    kp, vp = common.pad_sequence(k, block_kv), common.pad_sequence(v, block_kv)
    chip = chip or current_chip()
    calls = list(passes)
    if not all(isinstance(c, KernelCall) for c in calls):
        calls = kernel_calls(
            calls,
            method,
            num_q_tiles=qp.shape[1] // block_q,
            block_q=block_q,
            block_kv=block_kv,
            head_dim=q.shape[2],
            itemsize=q.dtype.itemsize,
            chip=chip,
        )
    lse_row, di_row = residual_rows(lse, do, o, length, qp.shape[1])
    softmax = common.SoftmaxOptions(scale, exp2)  # the forward's scaling and exponential
    if exp2:
        lse_row = lse_row * common.LOG2_E
    args = {"bq": block_q, "bkv": block_kv, "softmax": softmax, "interpret": interpret}
    dq = jnp.zeros(qp.shape, jnp.float32)
    dk = jnp.zeros(kp.shape, jnp.float32)
    dv = jnp.zeros(vp.shape, jnp.float32)
    data = (qp, kp, vp, dop, lse_row, di_row)
    for call in calls:  # each call adds into the accumulators in place (aliased buffers)
        named = {"name": call.name, **args}
        if call.kind == "fused":
            limit = common.vmem_limit(chip)
            dk, dv, dq = _fused_pass(
                *data, dq, dk, dv, call.selected, call.plan, window=call.window, vmem_limit=limit, **named
            )
        elif call.kind == "dq":
            dq = _dq_pass(*data, dq, call.selected, call.plan, **named)
        else:
            dk, dv = _dkv_pass(*data, dk, dv, call.selected, call.plan, **named)
    return (
        (dq[:, :length] * scale).astype(q.dtype),
        (dk[:, :length] * scale).astype(k.dtype),
        dv[:, :length].astype(v.dtype),
    )


#: Matmuls per computed tile: the dq kernel (S, dP, dQ), the dk / dv kernel (S^T, dV, dP^T, dK), the
#: fused kernel (S^T, dV, dP^T, dK, dQ) against the forward's 2 (S, P V); each 2 * block_q *
#: block_kv * D flops.
DQ_MATMULS, DKV_MATMULS, FUSED_MATMULS, FORWARD_MATMULS = 3, 4, 5, 2
_MATMULS = {"dq": DQ_MATMULS, "dkv": DKV_MATMULS, "fused": FUSED_MATMULS}


def _call_grid(call: KernelCall, num_heads: int) -> tuple[int, int]:
    """(worked rows, widest row) of a backward call's grid, as its kernel builds it."""
    _, extent, n_rows = _grid_tables(call.selected, call.plan, num_heads, transposed=call.kind != "dq")
    return n_rows, extent


def backward_work(layout, passes, num_heads: int, head_dim: int, calls=None) -> dict:
    """What the backward executes over ``passes`` (``layout``'s, as ``split_passes`` gives them) for
    ``num_heads`` heads: ``calls`` (``kernel_calls``; default: split) with their grid steps by
    kind, computed tiles, kv tiles that no query sees, and matmul flops beside the forward's on
    the same tiles."""
    if calls is None:
        calls = kernel_calls(
            passes, "split", num_q_tiles=layout.grid_shape[0], block_q=layout.block_q,
            block_kv=layout.block_kv, head_dim=head_dim, itemsize=2, chip=None,
        )  # fmt: skip
    out = {"dq_steps": 0, "dkv_steps": 0, "fused_steps": 0, "computed_tiles": 0, "backward_matmuls": 0}
    for call in calls:
        mult = num_heads if call.selected.shape[0] == 1 else 1
        rows, extent = _call_grid(call, num_heads)
        out[f"{call.kind}_steps"] += rows * extent
        tiles = mult * int(call.selected.sum())
        out["backward_matmuls"] += _MATMULS[call.kind] * tiles
        if call.kind != "dq":  # every tile passes one dk / dv-forming kernel
            out["computed_tiles"] += tiles
    seen = np.zeros(layout.counts.shape[::2], bool)  # [Hl, nk]
    for p in passes:
        seen |= p.selected.any(axis=1)
    out["kv_tiles_without_queries"] = (num_heads if seen.shape[0] == 1 else 1) * int((~seen).sum())
    per_matmul = 2 * layout.block_q * layout.block_kv * head_dim
    out["forward_flops"] = FORWARD_MATMULS * per_matmul * out["computed_tiles"]
    out["backward_flops"] = per_matmul * out.pop("backward_matmuls")
    return out


def call_schedule_counts(call: KernelCall, num_heads: int, head_dim: int, itemsize: int, bq: int, bkv: int):
    """``registry.ScheduleCounts`` of one backward call: its grid, each worked row's init and
    finalise, one compute per tile it computes, and the HBM bytes its blocks move (the kernel
    states them: its lse / di rows are lane-dense, its [block, D] blocks lane-exact at D = 128).
    Per row start: the row's own blocks in (and their f32 accumulators in and out); per computed
    step: the other side's blocks; fused, the dq window of each head it visits, in and out, while
    the kernel waits."""
    from stlib.registry import ScheduleCounts

    rows, extent = _call_grid(call, num_heads)
    mult = num_heads if call.selected.shape[0] == 1 else 1
    computed = mult * int(call.selected.sum())
    table = bq * bkv if call.plan.mode == common.MaskPlanMode.TABLE else 0  # int8 mask block per step
    rows_f32 = 2 * bq * 4  # lse and di rows
    if call.kind == "dq":
        row_bytes = bq * head_dim * (2 * itemsize + 2 * 4) + rows_f32  # q, dO; dq in and out (f32)
        fetch_bytes = 2 * bkv * head_dim * itemsize + table  # k, v
    else:
        row_bytes = bkv * head_dim * (2 * itemsize + 4 * 4)  # k, v; dk, dv in and out (f32)
        fetch_bytes = 2 * bq * head_dim * itemsize + rows_f32 + table  # q, dO, lse, di
    waited = 0
    if call.kind == "fused":
        heads = len(np.unique(_worked_rows(call.selected.sum(axis=1), num_heads)[0]))
        waited = heads * 2 * (call.window[1] - call.window[0]) * bq * head_dim * 4
    return ScheduleCounts(
        {"init": rows, "compute": computed, "finalise": rows},
        rows * extent,
        rows,
        computed,
        bq,
        bkv,
        4,
        writes_lse=False,
        row_bytes=row_bytes,
        fetch_bytes=fetch_bytes,
        waited_bytes=waited,
    )


def tile_training(forward_with_lse, resolve, passes_of, *, own_blocks: bool = False) -> Backward:
    """The ``registry.Backward`` of a flash kernel whose ``forward_with_lse(q, k, v, layout, mask, *,
    scale, options, interpret) -> (o, lse)`` runs the call's ``mask`` (None: dense) on a layout of
    the blocks ``resolve`` (its block rule) picks: the forward keeps (q, k, v, o, lse); the backward
    runs ``tile_backward`` over ``passes_of(layout, options)`` (``stlib.kernels.tile.split_passes``
    with the boundary policy the forward ran), so the gradient is that of what the forward computed.
    ``own_blocks``: the backward takes ``BACKWARD_TILE`` (in interpret mode the default blocks)
    where the forward's are larger (a forward tuned to big tiles, whose [block_q, block_kv] f32
    scores the backward's several intermediates would not fit beside in VMEM); only for a forward
    whose passes are exact, since
    the backward's tiles then differ. The entry also names, attributes and counts the backward's
    kernels for the static estimate."""

    def layout_of(mask, length, block_q, block_kv, options, interpret):
        sizes, options = resolve(mask, length, block_q, block_kv, options, interpret)
        return block_layout(
            mask if mask is not None else full(length), sizes.block_q, sizes.block_kv
        ), options

    def backward_plan(mask, length, head_dim, itemsize, block_q, block_kv, options, interpret):
        """(layout, options, calls, chip) of the backward: the forward's layout (or the default
        blocks, ``own_blocks``) and its kernel calls, sized for the chip the forward was."""
        layout, options = layout_of(mask, length, block_q, block_kv, options, interpret)
        if own_blocks:
            default = common.block_sizes_for(length, None, None, interpret=interpret)
            cap = (default.block_q, default.block_kv) if resolve_interpret(interpret) else BACKWARD_TILE
            sizes = (min(layout.block_q, cap[0]), min(layout.block_kv, cap[1]))
            if sizes != (layout.block_q, layout.block_kv):
                layout = block_layout(layout.mask, *sizes)
        chip = getattr(options, "chip", None) or current_chip()  # a kernel sized for a chip: its backward too
        calls = kernel_calls(
            passes_of(layout, options),
            "auto",
            num_q_tiles=-(-length // layout.block_q),
            block_q=layout.block_q,
            block_kv=layout.block_kv,
            head_dim=head_dim,
            itemsize=itemsize,
            chip=chip,
        )
        return layout, options, calls, chip

    def forward(q, k, v, mask, *, scale, block_q, block_kv, options, interpret):
        layout, options = layout_of(mask, q.shape[1], block_q, block_kv, options, interpret)
        o, lse = forward_with_lse(q, k, v, layout, mask, scale=scale, options=options, interpret=interpret)
        return o, (q, k, v, o, lse)

    def backward(residuals, do, mask, *, scale, block_q, block_kv, options, interpret):
        q, k, v, o, lse = residuals
        shape = (q.shape[1], q.shape[2], q.dtype.itemsize)
        layout, options, calls, chip = backward_plan(mask, *shape, block_q, block_kv, options, interpret)
        return tile_backward(
            q, k, v, o, lse, do, calls,
            block_q=layout.block_q, block_kv=layout.block_kv, scale=scale, exp2=options.exp2,
            interpret=interpret, chip=chip,
        )  # fmt: skip

    def schedule_counts(setup, attribution):
        """The counts of the compiled backward kernel ``attribution.kernel`` of ``setup``'s call."""
        from stlib import registry

        options = registry.get(setup.impl).options(setup.options or None)
        layout, _, calls, _ = backward_plan(
            setup.mask, setup.length, setup.head_dim, setup.itemsize,
            setup.block_q, setup.block_kv, options, False,
        )  # fmt: skip
        name = re.sub(r"\.\d+$", "", attribution.kernel)  # the compiled program's ".N" suffix
        call = next((c for c in calls if c.name == name), None)
        if call is None:
            raise ValueError(
                f"{attribution.kernel}: not one of the backward's calls {[c.name for c in calls]}"
            )
        return call_schedule_counts(
            call, setup.num_heads, setup.head_dim, setup.itemsize, layout.block_q, layout.block_kv
        )

    return Backward(
        forward,
        backward,
        kernel_names=BACKWARD_PREFIXES,
        compute_regions=lambda kernel, n: ["compute"],
        schedule_counts=schedule_counts,
    )


__all__ = [
    "BACKWARD_METHODS",
    "BACKWARD_PREFIXES",
    "BACKWARD_TILE",
    "DKV_MATMULS",
    "DKV_PREFIX",
    "DQ_MATMULS",
    "DQ_PREFIX",
    "FORWARD_MATMULS",
    "FUSED_MATMULS",
    "FUSED_PREFIX",
    "KernelCall",
    "backward_work",
    "call_schedule_counts",
    "dq_windows",
    "fused_vmem_bytes",
    "kernel_calls",
    "residual_rows",
    "tile_backward",
    "tile_training",
]
