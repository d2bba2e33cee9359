"""The split backward of the tile kernels: a dq kernel over the forward's per-q-row tile tables and
a dk / dv kernel over the transposed, per-kv-row tables, pass by pass as the forward ran.

With P = softmax(S) (the forward's own probabilities, rebuilt from its log-sum-exp), the
gradient of o = P v under a cotangent dO is

    dV = P^T dO,   dP = dO V^T,   dS = P * (dP - di)  with di = rowsum(dO * O),
    dQ = scale * dS K,   dK = scale * dS^T Q.

The dq kernel walks each q tile's kv tiles (the forward's grid) and accumulates dQ; the dk / dv
kernel walks each kv tile's q tiles (which q tiles touch it: the transposed table) and accumulates
dK and dV, so neither writes partials to HBM and both are deterministic. That is 7 matmuls against
the forward's 2 (S twice, dP twice, dV, dQ, dK); a fused kernel would share S and dP. A kv tile
that no query of a pass sees still gets one step, which writes its zeros.

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
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from stlib.kernels import common
from stlib.layout import block_layout
from stlib.masks import full
from stlib.registry import Backward

LOG2_E = 1.0 / math.log(2.0)
#: Name prefixes of the backward's Pallas kernels in a compiled program.
DQ_PREFIX, DKV_PREFIX = "stlib_bwd_dq", "stlib_bwd_dkv"


def _transposed_tables(selected: np.ndarray, plan: common.MaskPlan) -> tuple[list[np.ndarray], int]:
    """The dk / dv kernel's tables: per kv tile, its q tiles (the forward's tables transposed)."""
    if plan.mode == common.MaskPlanMode.TABLE:
        plan = dataclasses.replace(plan, index=np.broadcast_to(plan.index, selected.shape).transpose(0, 2, 1))
    return common.row_step_tables(np.ascontiguousarray(selected.transpose(0, 2, 1)), plan)


def _mask_fn(plan: common.MaskPlan, tab, head, qi, ki, bq, bkv, *, transposed: bool):
    """bool mask of a step's tile, [bq, bkv] (or [bkv, bq] ``transposed``), or None (no mask)."""
    mode = plan.mode
    if mode == common.MaskPlanMode.NONE:
        return None
    shape = (bkv, bq) if transposed else (bq, bkv)
    q_axis, k_axis = (1, 0) if transposed else (0, 1)
    if mode == common.MaskPlanMode.PREFIX:
        return jax.lax.broadcasted_iota(jnp.int32, shape, k_axis) < tab[-1][ki]
    if mode == common.MaskPlanMode.IOTA:
        rows = qi * bq + jax.lax.broadcasted_iota(jnp.int32, shape, q_axis)
        cols = ki * bkv + jax.lax.broadcasted_iota(jnp.int32, shape, k_axis)
        return plan.mask.mask_function(rows, cols, head) & (cols < plan.length)
    return None  # TABLE: read from the table operand by the kernel


def _dot(a, b, contract):
    """a . b contracting ``contract`` = (axis of a, axis of b), f32 accumulation."""
    return jax.lax.dot_general(
        a, b, ((contract[:1], contract[1:]), ((), ())), preferred_element_type=jnp.float32
    )


def _dq_pass(q, k, v, do, lse, di, selected, plan, *, bq, bkv, score_scale, exp, interpret):
    """dQ / scale of one pass: [H, Lq, D] f32."""
    num_heads, lq, head_dim = q.shape
    nq = lq // bq
    shared = selected.shape[0] == 1
    tables, extent = common.row_step_tables(selected, plan)
    common.check_prefetch(tables, plan, bq, "the dq kernel", "use larger tiles or fewer heads per call")
    table_mask = plan.mode == common.MaskPlanMode.TABLE

    def locate(h, i, j, tiles, counts, *_):
        row = i if shared else h * nq + i
        return tiles[row * extent + j], row * extent + j, j < counts[row]

    def kernel(*refs):
        tab = refs[: len(tables)]
        rest = refs[len(tables) :]
        if table_mask:
            q_ref, k_ref, v_ref, do_ref, lse_ref, di_ref, mask_ref, dq_ref, lse_col, di_col, acc = rest
        else:
            q_ref, k_ref, v_ref, do_ref, lse_ref, di_ref, dq_ref, lse_col, di_col, acc = rest
        h, i, j = (pl.program_id(a) for a in range(3))
        ki, _, active = locate(h, i, j, *tab)

        @pl.when(j == 0)
        def _():
            # the lane-dense rows of this q tile as columns, once per q tile
            lse_col[...] = jnp.broadcast_to(
                jnp.transpose(jnp.broadcast_to(lse_ref[...], (8, bq)))[:, :1], lse_col.shape
            )
            di_col[...] = jnp.broadcast_to(
                jnp.transpose(jnp.broadcast_to(di_ref[...], (8, bq)))[:, :1], di_col.shape
            )
            acc[...] = jnp.zeros(acc.shape, jnp.float32)

        @pl.when(active)
        def _():
            qs = (q_ref[...].astype(jnp.float32) * score_scale).astype(q_ref.dtype)
            s = _dot(qs, k_ref[...], (1, 1))  # [bq, bkv]
            p = exp(s - common._lanes(lse_col[...], bkv))
            dp = _dot(do_ref[...], v_ref[...], (1, 1))  # [bq, bkv]
            ds = p * (dp - common._lanes(di_col[...], bkv))
            allowed = (
                (mask_ref[...] != 0)
                if table_mask
                else _mask_fn(plan, tab, h, i, ki, bq, bkv, transposed=False)
            )
            if allowed is not None:
                ds = jnp.where(allowed, ds, 0.0)
            acc[...] += _dot(ds.astype(k_ref.dtype), k_ref[...], (1, 0))  # [bq, D]

        @pl.when(j == extent - 1)
        def _():
            dq_ref[...] = acc[...]

    q_map = lambda h, i, j, *tab: (h, i, 0)
    row_map = lambda h, i, j, *tab: (h, 0, i)
    kv_map = lambda h, i, j, *tab: (h, locate(h, i, j, *tab)[0], 0)
    in_specs = [
        pl.BlockSpec((None, bq, head_dim), q_map),
        pl.BlockSpec((None, bkv, head_dim), kv_map),
        pl.BlockSpec((None, bkv, head_dim), kv_map),
        pl.BlockSpec((None, bq, head_dim), q_map),
        pl.BlockSpec((None, 1, bq), row_map),  # lse, lane-dense
        pl.BlockSpec((None, 1, bq), row_map),  # di, lane-dense
    ]
    operands = [q, k, v, do, lse, di]
    if table_mask:
        in_specs.append(
            pl.BlockSpec((None, bq, bkv), lambda h, i, j, *tab: (tab[-1][locate(h, i, j, *tab)[1]], 0, 0))
        )
        operands.append(jnp.asarray(plan.table))
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=len(tables),
        grid=(num_heads, nq, extent),
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
        out_shape=jax.ShapeDtypeStruct((num_heads, lq, head_dim), jnp.float32),
        interpret=interpret,
        dimension_semantics=("parallel", "parallel", "arbitrary"),
        name=f"{DQ_PREFIX}",
        operands=[*(jnp.asarray(t) for t in tables), *operands],
    )


def _dkv_pass(q, k, v, do, lse, di, selected, plan, *, bq, bkv, score_scale, exp, interpret):
    """(dK / scale, dV) of one pass: [H, Lkv, D] f32 each."""
    num_heads, lkv, head_dim = k.shape
    nk = lkv // bkv
    shared = selected.shape[0] == 1
    tables, extent = _transposed_tables(selected, plan)
    common.check_prefetch(tables, plan, bq, "the dk / dv kernel", "use larger tiles or fewer heads per call")
    table_mask = plan.mode == common.MaskPlanMode.TABLE

    def locate(h, r, j, tiles, counts, *_):
        row = r if shared else h * nk + r
        return tiles[row * extent + j], row * extent + j, j < counts[row]

    def kernel(*refs):
        tab = refs[: len(tables)]
        rest = refs[len(tables) :]
        if table_mask:
            q_ref, k_ref, v_ref, do_ref, lse_ref, di_ref, mask_ref, dk_ref, dv_ref, dk_acc, dv_acc = rest
        else:
            q_ref, k_ref, v_ref, do_ref, lse_ref, di_ref, dk_ref, dv_ref, dk_acc, dv_acc = rest
        h, r, j = (pl.program_id(a) for a in range(3))
        qi, _, active = locate(h, r, j, *tab)

        @pl.when(j == 0)
        def _():
            dk_acc[...] = jnp.zeros(dk_acc.shape, jnp.float32)
            dv_acc[...] = jnp.zeros(dv_acc.shape, jnp.float32)

        @pl.when(active)
        def _():
            qs = (q_ref[...].astype(jnp.float32) * score_scale).astype(q_ref.dtype)
            s_t = _dot(k_ref[...], qs, (1, 1))  # [bkv, bq]: keys on sublanes
            p_t = exp(s_t - lse_ref[...])  # lse row [1, bq] broadcast over the keys
            allowed = (
                (mask_ref[...] != 0)
                if table_mask
                else _mask_fn(plan, tab, h, qi, r, bq, bkv, transposed=True)
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

    kv_map = lambda h, r, j, *tab: (h, r, 0)
    q_map = lambda h, r, j, *tab: (h, locate(h, r, j, *tab)[0], 0)
    row_map = lambda h, r, j, *tab: (h, 0, locate(h, r, j, *tab)[0])
    in_specs = [
        pl.BlockSpec((None, bq, head_dim), q_map),
        pl.BlockSpec((None, bkv, head_dim), kv_map),
        pl.BlockSpec((None, bkv, head_dim), kv_map),
        pl.BlockSpec((None, bq, head_dim), q_map),
        pl.BlockSpec((None, 1, bq), row_map),
        pl.BlockSpec((None, 1, bq), row_map),
    ]
    operands = [q, k, v, do, lse, di]
    if table_mask:
        in_specs.append(
            pl.BlockSpec((None, bkv, bq), lambda h, r, j, *tab: (tab[-1][locate(h, r, j, *tab)[1]], 0, 0))
        )
        operands.append(jnp.asarray(np.ascontiguousarray(plan.table.transpose(0, 2, 1))))
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=len(tables),
        grid=(num_heads, nk, extent),
        in_specs=in_specs,
        out_specs=[pl.BlockSpec((None, bkv, head_dim), kv_map)] * 2,
        scratch_shapes=[pltpu.VMEM((bkv, head_dim), jnp.float32)] * 2,
    )
    return common.run_pallas(
        kernel,
        grid_spec=grid_spec,
        out_shape=[jax.ShapeDtypeStruct((num_heads, lkv, head_dim), jnp.float32)] * 2,
        interpret=interpret,
        dimension_semantics=("parallel", "parallel", "arbitrary"),
        name=f"{DKV_PREFIX}",
        operands=[*(jnp.asarray(t) for t in tables), *operands],
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
    score_scale = scale * LOG2_E if exp2 else scale
    if exp2:
        lse_row = lse_row * LOG2_E
    exp = jnp.exp2 if exp2 else jnp.exp
    args = {"bq": block_q, "bkv": block_kv, "score_scale": score_scale, "exp": exp, "interpret": interpret}
    dq = jnp.zeros(qp.shape, jnp.float32)
    dk = jnp.zeros(kp.shape, jnp.float32)
    dv = jnp.zeros(vp.shape, jnp.float32)
    for p in passes:
        dq = dq + _dq_pass(qp, kp, vp, dop, lse_row, di_row, p.selected, p.plan, **args)
        dk_p, dv_p = _dkv_pass(qp, kp, vp, dop, lse_row, di_row, p.selected, p.plan, **args)
        dk, dv = dk + dk_p, dv + dv_p
    return (
        (dq[:, :length] * scale).astype(q.dtype),
        (dk[:, :length] * scale).astype(k.dtype),
        dv[:, :length].astype(v.dtype),
    )


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


__all__ = ["DKV_PREFIX", "DQ_PREFIX", "residual_rows", "tile_backward", "tile_training"]
