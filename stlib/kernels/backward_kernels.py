"""The backward's Pallas kernels (``stlib.kernels.backward`` runs them): a dq kernel over the forward's
per-q-row tile tables, a dk / dv kernel over the transposed, per-kv-row tables, and the fused dk / dv /
dq kernel over the transposed tables, one pass at a time.

With P = softmax(S) (the forward's own probabilities, rebuilt from its log-sum-exp), the
gradient of o = P v under a cotangent dO is

    dV = P^T dO,   dP = dO V^T,   dS = P * (dP - di)  with di = rowsum(dO * O),
    dQ = scale * dS K,   dK = scale * dS^T Q.

The dq kernel walks each q tile's kv tiles (the forward's grid) and accumulates dQ; the dk / dv
kernel walks each kv tile's q tiles (which q tiles touch it: the transposed table) and accumulates
dK and dV, so neither writes partials to HBM and both are deterministic. That is 7 matmuls against
the forward's 2 (S twice, dP twice, dV, dQ, dK); the fused kernel shares S and dP (5). Each grid
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

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from stlib.device import LANES
from stlib.kernels import mask_info, online_softmax, pallas_call
from stlib.passes import MaskPlan, MaskPlanMode

#: Name prefixes of the backward's Pallas kernels in a compiled program.
DQ_PREFIX, DKV_PREFIX, FUSED_PREFIX = "stlib_bwd_dq", "stlib_bwd_dkv", "stlib_bwd_fused"
BACKWARD_PREFIXES = (DQ_PREFIX, DKV_PREFIX, FUSED_PREFIX)


def _mask_fn(plan: MaskPlan, tab, head, qi, ki, bq, bkv, *, transposed: bool):
    """bool mask of a step's tile, [bq, bkv] (or [bkv, bq] ``transposed``), or None (no mask)."""
    mode = plan.mode
    if mode == MaskPlanMode.NONE:
        return None
    shape = (bkv, bq) if transposed else (bq, bkv)
    q_axis, k_axis = (1, 0) if transposed else (0, 1)
    if mode == MaskPlanMode.PREFIX:
        return jax.lax.broadcasted_iota(jnp.int32, shape, k_axis) < tab[-1][ki]
    if mode == MaskPlanMode.IOTA and not transposed:
        return mask_info.iota_mask(plan, qi * bq, ki * bkv, shape, head)
    if mode == MaskPlanMode.IOTA:  # the forward's predicate on S^T's iotas (keys on sublanes)
        rows = qi * bq + jax.lax.broadcasted_iota(jnp.int32, shape, q_axis)
        cols = ki * bkv + jax.lax.broadcasted_iota(jnp.int32, shape, k_axis)
        return plan.mask.mask_function(rows, cols, head) & (cols < plan.length)
    return None  # TABLE: read from the table operand by the kernel


def _dot(a, b, contract):
    """a . b contracting ``contract`` = (axis of a, axis of b), f32 accumulation."""
    return jax.lax.dot_general(
        a, b, ((contract[:1], contract[1:]), ((), ())), preferred_element_type=jnp.float32
    )


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


def dq_pass(
    q,
    k,
    v,
    do,
    lse,
    di,
    dq_in,
    selected,
    plan,
    *,
    name,
    bq,
    bkv,
    softmax: online_softmax.SoftmaxOptions,
    interpret,
):
    """dq_in + dQ / scale of one pass, [H, Lq, D] f32 (dq_in's buffer reused)."""
    num_heads, _, head_dim = q.shape
    tables, extent, n_rows = mask_info.grid_tables(selected, plan, num_heads, transposed=False)
    mask_info.check_prefetch(tables, plan, bq, "the dq kernel", "use larger tiles or fewer heads per call")
    table_mask = plan.mode == MaskPlanMode.TABLE

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
            qs = online_softmax.scaled_q(q_ref, softmax)
            s = _dot(qs, k_ref[...], (1, 1))  # [bq, bkv]
            p_ = softmax.exp(s - online_softmax.lanes(lse_col[...], bkv))
            dp = _dot(do_ref[...], v_ref[...], (1, 1))  # [bq, bkv]
            ds = p_ * (dp - online_softmax.lanes(di_col[...], bkv))
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
            pltpu.VMEM((bq, LANES), jnp.float32),
            pltpu.VMEM((bq, LANES), jnp.float32),
            pltpu.VMEM((bq, head_dim), jnp.float32),
        ],
    )
    return pallas_call.run_pallas(
        kernel,
        grid_spec=grid_spec,
        out_shape=jax.ShapeDtypeStruct(dq_in.shape, jnp.float32),
        interpret=interpret,
        dimension_semantics=("parallel", "arbitrary"),
        name=name,
        operands=[*(jnp.asarray(t) for t in tables), *operands],
        input_output_aliases={len(tables) + 6: 0},
    )


def _kv_tile_step(q_ref, k_ref, v_ref, do_ref, lse_ref, di_ref, dk_acc, dv_acc, allowed, softmax):
    """One computed tile of a kv-row grid (the dk / dv and the fused kernel): S^T and P^T with keys
    on sublanes (the lse row broadcasts over them), dV += P^T dO, dP^T, dS^T = P^T * (dP^T - di),
    dK += dS^T Q; a pair ``allowed`` excludes contributes nothing. Returns dS^T in q's dtype."""
    qs = online_softmax.scaled_q(q_ref, softmax)
    s_t = _dot(k_ref[...], qs, (1, 1))  # [bkv, bq]: keys on sublanes
    p_t = softmax.exp(s_t - lse_ref[...])  # the lse row [1, bq] broadcasts over the keys
    if allowed is not None:
        p_t = jnp.where(allowed, p_t, 0.0)
    dv_acc[...] += _dot(p_t.astype(do_ref.dtype), do_ref[...], (1, 0))  # [bkv, D]
    dp_t = _dot(v_ref[...], do_ref[...], (1, 1))  # [bkv, bq]
    ds_t = p_t * (dp_t - di_ref[...])
    if allowed is not None:
        ds_t = jnp.where(allowed, ds_t, 0.0)
    ds_t = ds_t.astype(q_ref.dtype)
    dk_acc[...] += _dot(ds_t, q_ref[...], (1, 0))  # [bkv, D]
    return ds_t


def dkv_pass(
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
    softmax: online_softmax.SoftmaxOptions,
    interpret,
):
    """(dk_in + dK / scale, dv_in + dV) of one pass, [H, Lkv, D] f32 each (their buffers reused)."""
    num_heads, _, head_dim = k.shape
    tables, extent, n_rows = mask_info.grid_tables(selected, plan, num_heads, transposed=True)
    mask_info.check_prefetch(
        tables, plan, bq, "the dk / dv kernel", "use larger tiles or fewer heads per call"
    )
    table_mask = plan.mode == MaskPlanMode.TABLE

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
            allowed = (
                (mask_ref[...] != 0)
                if table_mask
                else _mask_fn(plan, tab, h, qi, ki, bq, bkv, transposed=True)
            )
            _kv_tile_step(q_ref, k_ref, v_ref, do_ref, lse_ref, di_ref, dk_acc, dv_acc, allowed, softmax)

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
    return pallas_call.run_pallas(
        kernel,
        grid_spec=grid_spec,
        out_shape=[jax.ShapeDtypeStruct(dk_in.shape, jnp.float32)] * 2,
        interpret=interpret,
        dimension_semantics=("parallel", "arbitrary"),
        name=name,
        operands=[*(jnp.asarray(t) for t in tables), *operands],
        input_output_aliases={len(tables) + 6: 0, len(tables) + 7: 1},
    )


def fused_pass(
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
    tables, extent, n_rows = mask_info.grid_tables(selected, plan, num_heads, transposed=True)
    mask_info.check_prefetch(
        tables, plan, bq, "the fused backward kernel", "use larger tiles or fewer heads per call"
    )
    table_mask = plan.mode == MaskPlanMode.TABLE

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
            allowed = (
                (mask_ref[...] != 0)
                if table_mask
                else _mask_fn(plan, tab, h, qi, ki, bq, bkv, transposed=True)
            )
            ds_t = _kv_tile_step(
                q_ref, k_ref, v_ref, do_ref, lse_ref, di_ref, dk_acc, dv_acc, allowed, softmax
            )
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
    return pallas_call.run_pallas(
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
    ([tiles x block_q, D]) fit beside ``fused_vmem_bytes`` in ``pallas_call.vmem_limit(chip)``; empty
    when not even one q tile fits (then the backward runs split)."""
    room = pallas_call.vmem_limit(chip) - fused_vmem_bytes(block_q, block_kv, head_dim, itemsize)
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
