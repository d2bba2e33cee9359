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

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from stlib.kernels import common
from stlib.layout import block_layout
from stlib.masks import full
from stlib.registry import Backward

#: Name prefixes of the backward's Pallas kernels in a compiled program.
DQ_PREFIX, DKV_PREFIX = "stlib_bwd_dq", "stlib_bwd_dkv"


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
    q, k, v, do, lse, di, dq_in, selected, plan, *, bq, bkv, softmax: common.SoftmaxOptions, interpret
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
        name=DQ_PREFIX,
        operands=[*(jnp.asarray(t) for t in tables), *operands],
        input_output_aliases={len(tables) + 6: 0},
    )


def _dkv_pass(
    q, k, v, do, lse, di, dk_in, dv_in, selected, plan, *, bq, bkv, softmax: common.SoftmaxOptions, interpret
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
        name=DKV_PREFIX,
        operands=[*(jnp.asarray(t) for t in tables), *operands],
        input_output_aliases={len(tables) + 6: 0, len(tables) + 7: 1},
    )


def residual_rows(lse, do, o, length: int, padded: int):
    """The lane-dense f32 rows [H, 1, padded] the kernels read: the log-sum-exp (a row that saw no
    key, -inf, becomes +inf so its probabilities are exactly zero; padding too) and di =
    rowsum(dO * O)."""
    lse = jnp.where(lse == -jnp.inf, jnp.inf, lse.astype(jnp.float32))
    di = jnp.sum(do.astype(jnp.float32) * o.astype(jnp.float32), axis=-1)
    pad = ((0, 0), (0, padded - length))
    return jnp.pad(lse, pad, constant_values=jnp.inf)[:, None, :], jnp.pad(di, pad)[:, None, :]


def tile_backward(
    q, k, v, o, lse, do, passes, *, block_q: int, block_kv: int, scale: float, exp2: bool, interpret=None
):
    """(dq, dk, dv) of tile attention: q, k, v, o, do [H, L, D], lse [H, L] (natural log, -inf for
    rows that saw nothing) and the forward's ``passes`` (``stlib.kernels.tile.split_passes``). Each
    in its input's dtype."""
    length = q.shape[1]
    qp, dop = common.pad_sequence(q, block_q), common.pad_sequence(do, block_q)
    kp, vp = common.pad_sequence(k, block_kv), common.pad_sequence(v, block_kv)
    lse_row, di_row = residual_rows(lse, do, o, length, qp.shape[1])
    softmax = common.SoftmaxOptions(scale, exp2)  # the forward's scaling and exponential
    if exp2:
        lse_row = lse_row * common.LOG2_E
    args = {"bq": block_q, "bkv": block_kv, "softmax": softmax, "interpret": interpret}
    dq = jnp.zeros(qp.shape, jnp.float32)
    dk = jnp.zeros(kp.shape, jnp.float32)
    dv = jnp.zeros(vp.shape, jnp.float32)
    for p in passes:  # each pass adds into the accumulators in place (aliased buffers)
        dq = _dq_pass(qp, kp, vp, dop, lse_row, di_row, dq, p.selected, p.plan, **args)
        dk, dv = _dkv_pass(qp, kp, vp, dop, lse_row, di_row, dk, dv, p.selected, p.plan, **args)
    return (
        (dq[:, :length] * scale).astype(q.dtype),
        (dk[:, :length] * scale).astype(k.dtype),
        dv[:, :length].astype(v.dtype),
    )


#: Matmuls per computed tile: the dq kernel (S, dP, dQ) and the dk / dv kernel (S^T, dV, dP^T, dK)
#: against the forward's 2 (S, P V); each 2 * block_q * block_kv * D flops.
DQ_MATMULS, DKV_MATMULS, FORWARD_MATMULS = 3, 4, 2


def backward_work(layout, passes, num_heads: int, head_dim: int) -> dict:
    """What the split backward executes over ``passes`` (``layout``'s, as ``split_passes`` gives
    them) for ``num_heads`` heads: grid steps of the dq and dk / dv kernels (the worked rows of each
    pass times its widest row), computed tiles, kv tiles that no query sees, and matmul flops
    beside the forward's on the same tiles."""
    out = {"dq_steps": 0, "dkv_steps": 0, "computed_tiles": 0}
    for p in passes:
        mult = num_heads if p.selected.shape[0] == 1 else 1
        for key, axis in (("dq_steps", 2), ("dkv_steps", 1)):
            counts = p.selected.sum(axis=axis)
            out[key] += mult * int((counts > 0).sum()) * max(int(counts.max()), 1)
        out["computed_tiles"] += mult * int(p.selected.sum())
    seen = np.zeros(layout.counts.shape[::2], bool)  # [Hl, nk]
    for p in passes:
        seen |= p.selected.any(axis=1)
    out["kv_tiles_without_queries"] = (num_heads if seen.shape[0] == 1 else 1) * int((~seen).sum())
    per_matmul = 2 * layout.block_q * layout.block_kv * head_dim * out["computed_tiles"]
    out["forward_flops"] = FORWARD_MATMULS * per_matmul
    out["backward_flops"] = (DQ_MATMULS + DKV_MATMULS) * per_matmul
    return out


def tile_training(forward_with_lse, resolve, passes_of, *, own_blocks: bool = False) -> Backward:
    """The ``registry.Backward`` of a flash kernel whose ``forward_with_lse(q, k, v, layout, mask, *,
    scale, options, interpret) -> (o, lse)`` runs the call's ``mask`` (None: dense) on a layout of
    the blocks ``resolve`` (its block rule) picks: the forward keeps (q, k, v, o, lse); the backward runs ``tile_backward`` over
    ``passes_of(layout, options)`` (``stlib.kernels.tile.split_passes`` with the boundary policy the
    forward ran), so the gradient is that of what the forward computed. ``own_blocks``: the backward
    takes the chip's default blocks where the forward's are larger (a forward tuned to big tiles,
    whose [block_q, block_kv] f32 scores the backward's several intermediates would not fit beside
    in VMEM); only for a forward whose passes are exact, since the backward's tiles then differ."""

    def layout_of(q, mask, block_q, block_kv, options, interpret):
        sizes, options = resolve(mask, q.shape[1], block_q, block_kv, options, interpret)
        return block_layout(
            mask if mask is not None else full(q.shape[1]), sizes.block_q, sizes.block_kv
        ), options

    def forward(q, k, v, mask, *, scale, block_q, block_kv, options, interpret):
        layout, options = layout_of(q, mask, block_q, block_kv, options, interpret)
        o, lse = forward_with_lse(q, k, v, layout, mask, scale=scale, options=options, interpret=interpret)
        return o, (q, k, v, o, lse)

    def backward(residuals, do, mask, *, scale, block_q, block_kv, options, interpret):
        q, k, v, o, lse = residuals
        layout, options = layout_of(q, mask, block_q, block_kv, options, interpret)
        if own_blocks:
            default = common.block_sizes_for(q.shape[1], None, None, interpret=interpret)
            sizes = (min(layout.block_q, default.block_q), min(layout.block_kv, default.block_kv))
            if sizes != (layout.block_q, layout.block_kv):
                layout = block_layout(layout.mask, *sizes)
        passes = passes_of(layout, options)
        return tile_backward(
            q,
            k,
            v,
            o,
            lse,
            do,
            passes,
            block_q=layout.block_q,
            block_kv=layout.block_kv,
            scale=scale,
            exp2=options.exp2,
            interpret=interpret,
        )

    return Backward(forward, backward)


__all__ = [
    "DKV_MATMULS",
    "DKV_PREFIX",
    "DQ_MATMULS",
    "DQ_PREFIX",
    "FORWARD_MATMULS",
    "backward_work",
    "residual_rows",
    "tile_backward",
    "tile_training",
]
