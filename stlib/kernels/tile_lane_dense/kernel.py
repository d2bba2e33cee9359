"""The ``pallas_tile_lane_dense`` kernel call: its tables, VMEM budget and block checks (``vmem.py``)
around the body (``body.build_kernel``; how it computes is said there). One grid, one region per
step code of ``steps.StepPlan`` (FULL, RAGGED, MASKED, patterns), chosen per step by the code in the
scalar-prefetched step table.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from stlib.device import SUBLANES, resolve_interpret
from stlib.kernels import mask_info, online_softmax, pallas_call
from stlib.kernels.steps import (
    STEP,
    StepKind,
    StepPlan,
    kernel_name,
)
from stlib.kernels.tile_lane_dense.body import Folds, TableGrid, build_kernel
from stlib.kernels.tile_lane_dense.chips import CHIP_SETTINGS, NAME
from stlib.kernels.tile_lane_dense.options import LaneDenseOptions
from stlib.kernels.tile_lane_dense.vmem import check_blocks, fit_lookahead
from stlib.passes import MaskPlanMode, plan_mask

KERNEL_PREFIX = "stlib_tile_ld"


def lane_dense_attention(
    q,
    k,
    v,
    steps: StepPlan,
    *,
    scale: float,
    options: LaneDenseOptions = LaneDenseOptions(),  # noqa: B008 - a frozen dataclass
    chip: str | None = None,
    interpret: bool | None = None,
    return_lse: bool = False,
    block=None,
):
    """q, k, v [H, L, D] -> o [H, L, D] in q's dtype (and, with ``return_lse``, lse [H, L]: natural
    log, -inf for rows that see nothing, for the backward). ``steps`` is the step plan
    (``plan_steps``) of the mask's tile layout for these tokens, made once for the call (its
    ``stlib.plan.KernelPlan``); the layout's blocks must suit this kernel (``check_blocks``). ``chip``: the chip
    the call is sized for (its ``Config.chip``; None: ``options.chip``, else any chip: the
    smallest VMEM of the table and whole q tiles a fold). Raises ValueError
    for such blocks and for step tables that overflow SMEM. A layout of a ``StackedBlocks`` mask runs
    its block ``block`` (an int32 scalar, traced or not): its rows of the step tables (the stack's
    joint plan: one pattern set, one width) and its offsets are the kernel's data, so every block of
    the stack runs one compiled body."""
    layout = steps.layout
    stack = layout.mask if layout.mask.stacked else None
    if (stack is None) != (block is None):
        raise ValueError("block= selects a block of a StackedBlocks layout, and such a layout needs it")
    num_heads, length, head_dim = q.shape
    if steps.length != length:
        raise ValueError(f"the step plan is for {steps.length} tokens, the inputs have {length}")
    bq, bkv = layout.block_q, layout.block_kv
    chunk = options.block_kv_compute or bkv
    register = min(options.block_kv_register or chunk, chunk)
    present = steps.present
    mask_plan = plan_mask(layout.mask, layout, steps.codes == StepKind.MASKED)
    table = mask_plan.mode == MaskPlanMode.TABLE
    chip = chip or options.chip
    sizes = (bq, bkv, chunk, register, head_dim, q.dtype.itemsize)
    fold_lanes = options.block_q_compute or (CHIP_SETTINGS[chip].fold_lanes if chip else None) or bq
    held = (
        bq if max(present, default=0) >= StepKind.MASKED else fold_lanes
    )  # MASKED, patterns: whole lane runs
    lookahead = options.lookahead
    if lookahead is None:
        lookahead = fit_lookahead(
            *sizes, chip=chip, table=table, key_validity=steps.key_validity, fold_lanes=held
        )
    limit = check_blocks(
        sizes,
        chip,
        table,
        compiled=not resolve_interpret(interpret),
        key_validity=steps.key_validity,
        lookahead=lookahead,
        fold_lanes=held,
    )
    if not present:  # nothing to compute: every row sees nothing
        o = jnp.zeros(q.shape, q.dtype)
        return (o, jnp.full((num_heads, length), -jnp.inf, jnp.float32)) if return_lse else o
    entries, counts = steps.tables()
    extent = entries.shape[2]
    blocks = 1 if stack is None else stack.num_blocks
    tables = [entries.reshape(blocks, -1), counts.reshape(blocks, -1)]
    nq = entries.shape[1]
    shared = entries.shape[0] == blocks
    if stack is not None:
        tables.append(stack.offsets)
    if table:
        idx = np.take_along_axis(
            np.broadcast_to(mask_plan.index, steps.codes.shape), STEP.kv.read(entries), axis=2
        )
        idx = np.where(np.arange(extent) < counts[:, :, None], idx, -1)
        tables.append(np.stack([mask_info.carried_index(x) for x in idx.reshape(blocks, -1)]))
    mask_info.check_prefetch(
        [t[0] for t in tables],  # one block's rows: SMEM holds the block a call runs
        mask_plan,
        bq,
        f"{NAME} ({entries.shape[0]} heads x {nq} x {layout.grid_shape[1]} tiles of {bq}x{bkv})",
        "use larger tiles or fewer heads per call",
    )
    softmax = online_softmax.SoftmaxOptions(scale, options.exp2)
    p_dtype = v.dtype if (options.bf16_probs or v.dtype == jnp.float32) else jnp.float32
    kernel = build_kernel(
        steps=steps,
        mask_plan=mask_plan,
        folds=Folds(chunk, register, fold_lanes, lookahead),
        tables=TableGrid(nq, extent, shared, len(tables)),
        softmax=softmax,
        p_dtype=p_dtype,
        with_lse=return_lse,
        stack=stack,
    )
    if stack is None:
        tables = [t[0] for t in tables]
    else:  # the block's rows, selected outside the kernel: its tables are data
        tables = [jnp.asarray(t)[block] for t in tables]

    def row_of(h, i):
        return i if shared else h * nq + i

    def q_map(h, i, j, *_):
        return (h, i, 0)

    def kv_tile(h, i, j, steps_ref):
        return STEP.kv.read(steps_ref[row_of(h, i) * extent + j])

    def kv_map(h, i, j, steps_ref, *_):
        return (h, kv_tile(h, i, j, steps_ref), 0)

    in_specs = [
        pl.BlockSpec((None, bq, head_dim), q_map),  # q [bq, D]
        pl.BlockSpec((None, bkv, head_dim), kv_map),  # k [bkv, D]
        pl.BlockSpec((None, bkv, head_dim), kv_map),  # v [bkv, D]
    ]
    operands = [q, k, v]
    if table:
        in_specs.append(
            pl.BlockSpec((None, bkv, bq), lambda h, i, j, *tabs: (tabs[-1][row_of(h, i) * extent + j], 0, 0))
        )
        operands.append(jnp.asarray(np.ascontiguousarray(mask_plan.table.transpose(0, 2, 1))))  # [P, bkv, bq]
    if steps.key_validity:
        in_specs.append(
            pl.BlockSpec((bkv, 1), lambda h, i, j, steps_ref, *_: (kv_tile(h, i, j, steps_ref), 0))
        )
        operands.append(jnp.asarray(steps.key_valid_column()))  # int32 [nk * bkv, 1]
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=len(tables),
        grid=(num_heads, nq, extent),
        in_specs=in_specs,
        out_specs=[pl.BlockSpec((None, bq, head_dim), q_map)]  # o [bq, D]
        + ([pl.BlockSpec((None, 1, bq), lambda h, i, j, *_: (h, 0, i))] if return_lse else []),  # lse [1, bq]
        scratch_shapes=[
            pltpu.VMEM((SUBLANES, bq), jnp.float32),  # m: running max, one per query along lanes
            pltpu.VMEM((SUBLANES, bq), jnp.float32),  # l: running sum
            pltpu.VMEM((head_dim, bq), jnp.float32),  # o^T: unnormalised output, transposed
            pltpu.VMEM((bq, head_dim), q.dtype),  # q with the softmax scale folded in
        ],
    )
    out = pallas_call.run_pallas(
        kernel,
        grid_spec=grid_spec,
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype)]
        + ([jax.ShapeDtypeStruct((num_heads, 1, length), jnp.float32)] if return_lse else []),
        interpret=interpret,
        dimension_semantics=("parallel", "parallel", "arbitrary"),
        name=kernel_name(KERNEL_PREFIX, present),
        operands=[*(jnp.asarray(t) for t in tables), *operands],
        vmem_limit_bytes=limit,
    )
    return (out[0], out[1][:, 0]) if return_lse else out[0]
