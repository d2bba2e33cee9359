"""``pallas_block_sparse``: the Splash idea, built from scratch for teaching.

The full grid (H, q tiles, kv tiles) is kept; a prefetched int32 table tells each step what to do:
a ``mask_info.BLOCK_SPARSE_STEP`` word, its ``kind`` 0 skip / 1 masked / 2 mask-free and the kv tile it fetches. A skipped step runs
nothing (``pl.when``) *and* moves no data: its kv index map returns the next non-empty tile of the
row (the last one at the row's end), the same block as the neighbouring steps, so the pipeline
issues no new DMA (Splash's ``data_next``). Masked tiles evaluate the mask in-kernel, from iota for
a lazy mask or from a deduplicated int8 table of tile masks. Each computed step costs
4 * block_q * block_kv * D flops; each skipped step only the grid-loop overhead.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from stlib import accounting
from stlib.blocks import BlockSizes
from stlib.contract import Config, EstimatorHooks
from stlib.device import CHIPS
from stlib.kernels import flash_options, mask_info, online_softmax, pallas_call
from stlib.kernels.backward import tile_training
from stlib.layout import BlockLayout, TileKind
from stlib.masks import Mask
from stlib.passes import MaskPlanMode, exact_passes, plan_mask
from stlib.plan import KernelPlan, prepare
from stlib.registry import Implementation, Role, register

NAME = "pallas_block_sparse"

SKIP, MASKED, MASK_FREE = 0, 1, 2
STEP = mask_info.BLOCK_SPARSE_STEP


def step_table(layout: BlockLayout) -> np.ndarray:
    """int32 [Hl, nq, nk]: the ``BLOCK_SPARSE_STEP`` word (kind, fetch_kv) of every grid step of the full grid."""
    nonempty = layout.kinds != TileKind.EMPTY
    nk = nonempty.shape[2]
    idx = np.arange(nk)
    big = np.iinfo(np.int32).max
    nxt = np.minimum.accumulate(np.where(nonempty, idx, big)[:, :, ::-1], axis=2)[:, :, ::-1]
    prev = np.maximum.accumulate(np.where(nonempty, idx, -1), axis=2)
    fetch = np.where(nxt < big, nxt, np.maximum(prev, 0))
    kind = np.where(layout.masked_tiles, MASKED, np.where(nonempty, MASK_FREE, SKIP))
    return STEP.pack(kind=kind, fetch_kv=fetch)


def block_sparse_attention(
    q,
    k,
    v,
    layout: BlockLayout,
    *,
    scale: float,
    interpret: bool | None = None,
    block_kv_compute: int | None = None,
    exp2: bool = False,
    return_lse: bool = False,
):
    """q, k, v [H, L, D] -> [H, L, D] with the tiles of ``layout`` (built for L, block_q, block_kv);
    and lse [H, L] (natural log) with ``return_lse``."""
    num_heads, length, head_dim = q.shape
    bq, bkv = layout.block_q, layout.block_kv
    sizes = BlockSizes(bq, bkv, block_kv_compute)
    nq, nk = layout.grid_shape
    plan = plan_mask(layout.mask, layout, layout.masked_tiles)
    shared = layout.num_heads == 1
    table = step_table(layout).reshape(-1)
    prefetch = [table]
    if plan.mode == MaskPlanMode.TABLE:
        prefetch.append(mask_info.carried_index(plan.index).reshape(-1))
    mask_info.check_prefetch(
        prefetch,
        plan,
        bq,
        f"pallas_block_sparse ({layout.num_heads} heads x {nq} x {nk} tiles of {bq}x{bkv})",
        "use larger tiles",
    )

    qp, kp, vp = (
        pallas_call.pad_sequence(q, bq),
        pallas_call.pad_sequence(k, bkv),
        pallas_call.pad_sequence(v, bkv),
    )
    options = online_softmax.SoftmaxOptions(scale, exp2)

    def row_of(h, i):
        return i if shared else h * nq + i

    def kernel(table_ref, *refs):
        if plan.mode == MaskPlanMode.TABLE:
            _, q_ref, k_ref, v_ref, mask_ref, o_ref, *lse_ref, m_ref, l_ref, acc_ref = (
                refs  # refs[0]: mask index
            )
        else:
            q_ref, k_ref, v_ref, o_ref, *lse_ref, m_ref, l_ref, acc_ref = refs
        h, i, j = pl.program_id(0), pl.program_id(1), pl.program_id(2)
        kind = STEP.kind.read(table_ref[row_of(h, i) * nk + j])

        @pl.when(j == 0)
        def _():
            online_softmax.init_row(m_ref, l_ref, acc_ref)

        @pl.when(kind == MASK_FREE)
        def _():
            online_softmax.update_tile(
                online_softmax.scaled_q(q_ref, options),
                k_ref,
                v_ref,
                m_ref,
                l_ref,
                acc_ref,
                options,
                sizes.kv_chunk,
            )

        if plan.mode != MaskPlanMode.NONE:
            if plan.mode == MaskPlanMode.IOTA:
                mask_fn = lambda c0, shape: mask_info.iota_mask(plan, i * bq, j * bkv + c0, shape, h)
            else:
                mask_fn = lambda c0, shape: mask_ref[:, pl.ds(c0, shape[1])] != 0

            @pl.when(kind == MASKED)
            def _():
                online_softmax.update_tile(
                    online_softmax.scaled_q(q_ref, options),
                    k_ref,
                    v_ref,
                    m_ref,
                    l_ref,
                    acc_ref,
                    options,
                    sizes.kv_chunk,
                    mask_fn,
                )

        @pl.when(j == nk - 1)
        def _():
            online_softmax.finish_row(o_ref, lse_ref[0] if lse_ref else None, m_ref, l_ref, acc_ref, options)

    def kv_map(h, i, j, table_ref, *_):
        return (h, STEP.fetch_kv.read(table_ref[row_of(h, i) * nk + j]), 0)

    in_specs = [
        pl.BlockSpec((None, bq, head_dim), lambda h, i, j, *_: (h, i, 0)),  # q [bq, D]
        pl.BlockSpec((None, bkv, head_dim), kv_map),  # k [bkv, D]
        pl.BlockSpec((None, bkv, head_dim), kv_map),  # v [bkv, D]
    ]
    operands = [qp, kp, vp]
    if plan.mode == MaskPlanMode.TABLE:
        in_specs.append(
            pl.BlockSpec((None, bq, bkv), lambda h, i, j, t, mi: (mi[row_of(h, i) * nk + j], 0, 0))
        )
        operands.append(jnp.asarray(plan.table))
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=len(prefetch),
        grid=(num_heads, nq, nk),
        in_specs=in_specs,
        out_specs=[pl.BlockSpec((None, bq, head_dim), lambda h, i, j, *_: (h, i, 0))]
        + ([pl.BlockSpec((None, bq, 1), lambda h, i, j, *_: (h, i, 0))] if return_lse else []),
        scratch_shapes=online_softmax.softmax_scratch(bq, head_dim),
    )
    out = pallas_call.run_pallas(
        kernel,
        grid_spec=grid_spec,
        out_shape=[jax.ShapeDtypeStruct(qp.shape, q.dtype)]
        + ([jax.ShapeDtypeStruct((num_heads, qp.shape[1], 1), jnp.float32)] if return_lse else []),
        interpret=interpret,
        dimension_semantics=("parallel", "parallel", "arbitrary"),
        name="stlib_block_sparse",
        operands=[*(jnp.asarray(t) for t in prefetch), *operands],
    )
    if return_lse:
        return out[0][:, :length], out[1][:, :length, 0]
    return out[0][:, :length]


def block_sparse_work(layout: BlockLayout, num_heads: int, head_dim: int) -> accounting.KernelWork:
    """Full grid visited; non-empty tiles computed; PARTIAL (and padded FULL) tiles masked."""
    nq, nk = layout.grid_shape
    mult = num_heads if layout.num_heads == 1 else 1
    computed = int(np.sum(layout.kinds != TileKind.EMPTY)) * mult
    masked = int(np.sum(layout.masked_tiles)) * mult
    return accounting.work_from_counts(layout, num_heads, head_dim, num_heads * nq * nk, computed, masked)


def _forward(
    q, k, v, mask: Mask | None, *, scale, config: Config, interpret, plan: KernelPlan, return_lse=False
):
    """The call's plan's layout at its blocks and options."""
    return block_sparse_attention(
        q,
        k,
        v,
        plan.layout,
        scale=scale,
        interpret=interpret,
        block_kv_compute=config.options.block_kv_compute,
        exp2=config.options.exp2,
        return_lse=return_lse,
    )


def _forward_with_lse(q, k, v, plan: KernelPlan, *, scale, interpret):
    return _forward(
        q, k, v, plan.mask, scale=scale, config=plan.config, interpret=interpret, plan=plan, return_lse=True
    )


def _compute_regions(kernel: str, n: int) -> list[str]:
    """The mask-free region, then the masked one when the call has masked tiles (any other count
    is a structure the estimator does not know: a one-name list that cannot match it)."""
    return ["compute_full", "compute_masked"][:n] if n in (1, 2) else ["?"]


def block_sparse_schedule_counts(setup, attribution):
    """Executions of each compiled path: the full grid is stepped; the step table says which steps
    run the mask-free or the masked update; a kv tile is fetched where the table's index changes."""
    h, layout = setup.num_heads, setup.layout
    mult = h if layout.num_heads == 1 else 1
    table = step_table(layout)
    counts = {
        "compute_full": int(np.sum(STEP.kind.read(table) == MASK_FREE)) * mult,
        "compute_masked": int(np.sum(STEP.kind.read(table) == MASKED)) * mult,
    }
    return accounting.row_grid_counts(setup, STEP.fetch_kv.read(table), counts)


IMPLEMENTATION = register(
    Implementation(
        name=NAME,
        roles=frozenset({Role.BLOCK_SPARSE}),
        forward=_forward,
        description="the Splash idea from scratch: full grid, a prefetched step table, skipped steps fetch nothing",
        options_type=flash_options.FlashOptions,
        work=lambda layout, num_heads, head_dim, options: block_sparse_work(layout, num_heads, head_dim),
        chips=CHIPS,
        resolve=flash_options.flash_resolve,
        prepare=prepare,
        backward=tile_training(_forward_with_lse, exact_passes),
    ),
    estimator=EstimatorHooks(
        kernel_names=("stlib_block_sparse",),
        compute_regions=_compute_regions,
        schedule_counts=block_sparse_schedule_counts,
        tuned_candidates=flash_options.TUNED_CANDIDATES,
        probe_regions=True,  # two compute regions: which one is mask-free, a probe tells
    ),
)
