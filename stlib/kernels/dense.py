"""``pallas_dense``: flash attention that visits every tile and masks element by element.

Grid (H, q tiles, kv tiles), the kv axis "arbitrary" (it carries the running softmax). Each step
DMAs a k and v tile (2 * block_kv * D * itemsize bytes), computes 4 * block_q * block_kv * D flops
and block_q * block_kv exponentials whatever the mask says: sparsity saves nothing here, which
is the first lesson of the notebooks.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

from stlib import accounting
from stlib.blocks import BlockSizes
from stlib.contract import Config, EstimatorHooks
from stlib.device import CHIPS
from stlib.kernels import flash_options, mask_info, online_softmax, pallas_call
from stlib.kernels.backward import tile_training
from stlib.masks import DENSE_LIMIT, Mask, full
from stlib.passes import MaskPlan, MaskPlanMode, exact_passes
from stlib.plan import KernelPlan, prepare
from stlib.registry import Implementation, Role, register

NAME = "pallas_dense"


def dense_attention(
    q,
    k,
    v,
    mask: Mask | None,
    *,
    scale: float,
    block_sizes: BlockSizes,
    interpret: bool | None = None,
    exp2: bool = False,
    return_lse: bool = False,
):
    """q, k, v [H, L, D] -> [H, L, D] (and lse [H, L], natural log, with ``return_lse``). The mask
    (if any) is evaluated on every tile: from iota for a lazy head-uniform mask, else from a dense
    int8 [Hm, L, L] copy (L <= DENSE_LIMIT only)."""
    num_heads, length, head_dim = q.shape
    bq, bkv, chunk = block_sizes.block_q, block_sizes.block_kv, block_sizes.kv_chunk
    qp, kp, vp = (
        pallas_call.pad_sequence(q, bq),
        pallas_call.pad_sequence(k, bkv),
        pallas_call.pad_sequence(v, bkv),
    )
    nq, nk = qp.shape[1] // bq, kp.shape[1] // bkv
    options = online_softmax.SoftmaxOptions(scale, exp2)

    lazy = mask is None or mask.traceable
    ragged = kp.shape[1] != length
    dense_mask = None
    if not lazy:
        if length > DENSE_LIMIT:
            raise ValueError(
                f"pallas_dense needs a dense copy of a {type(mask).__name__}; L={length} > {DENSE_LIMIT}"
            )
        dense = mask.to_dense().reshape(-1, length, length)
        dense_mask = np.zeros((dense.shape[0], nq * bq, nk * bkv), np.int8)
        dense_mask[:, :length, :length] = dense
    shared_mask_head = dense_mask is not None and dense_mask.shape[0] == 1

    def kernel(*refs):
        refs = list(refs)
        q_ref, k_ref, v_ref = refs[:3]
        mask_ref = refs.pop(3) if dense_mask is not None else None
        o_ref, *lse_ref, m_ref, l_ref, acc_ref = refs[3:]
        h, i, j = pl.program_id(0), pl.program_id(1), pl.program_id(2)

        @pl.when(j == 0)
        def _():
            online_softmax.init_row(m_ref, l_ref, acc_ref)

        if dense_mask is not None:
            mask_fn = lambda c0, shape: mask_ref[:, pl.ds(c0, shape[1])] != 0
        elif mask is not None or ragged:
            plan = MaskPlan(MaskPlanMode.IOTA, mask if mask is not None else full(length), length)
            mask_fn = lambda c0, shape: mask_info.iota_mask(plan, i * bq, j * bkv + c0, shape, h)
        else:
            mask_fn = None
        online_softmax.update_tile(
            online_softmax.scaled_q(q_ref, options),
            k_ref,
            v_ref,
            m_ref,
            l_ref,
            acc_ref,
            options,
            chunk,
            mask_fn,
        )

        @pl.when(j == nk - 1)
        def _():
            online_softmax.finish_row(o_ref, lse_ref[0] if lse_ref else None, m_ref, l_ref, acc_ref, options)

    in_specs = [
        pl.BlockSpec((None, bq, head_dim), lambda h, i, j: (h, i, 0)),  # q [bq, D]
        pl.BlockSpec((None, bkv, head_dim), lambda h, i, j: (h, j, 0)),  # k [bkv, D]
        pl.BlockSpec((None, bkv, head_dim), lambda h, i, j: (h, j, 0)),  # v [bkv, D]
    ]
    operands = [qp, kp, vp]
    if dense_mask is not None:
        in_specs.append(pl.BlockSpec((None, bq, bkv), lambda h, i, j: (0 if shared_mask_head else h, i, j)))
        operands.append(jnp.asarray(dense_mask))
    grid_spec = pl.GridSpec(
        grid=(num_heads, nq, nk),
        in_specs=in_specs,
        out_specs=[pl.BlockSpec((None, bq, head_dim), lambda h, i, j: (h, i, 0))]
        + ([pl.BlockSpec((None, bq, 1), lambda h, i, j: (h, i, 0))] if return_lse else []),
        scratch_shapes=online_softmax.softmax_scratch(bq, head_dim),
    )
    out = pallas_call.run_pallas(
        kernel,
        grid_spec=grid_spec,
        out_shape=[jax.ShapeDtypeStruct(qp.shape, q.dtype)]
        + ([jax.ShapeDtypeStruct((num_heads, qp.shape[1], 1), jnp.float32)] if return_lse else []),
        interpret=interpret,
        dimension_semantics=("parallel", "parallel", "arbitrary"),
        name="stlib_dense_flash",
        operands=operands,
    )
    if return_lse:
        return out[0][:, :length], out[1][:, :length, 0]
    return out[0][:, :length]


def dense_work(layout, num_heads: int, head_dim: int) -> accounting.KernelWork:
    """Every tile is visited and computed; with a mask every tile is masked."""
    nq, nk = layout.grid_shape
    steps = num_heads * nq * nk
    masked = steps if layout.density < 1.0 or layout.num_tokens % layout.block_kv else 0
    return accounting.work_from_counts(layout, num_heads, head_dim, steps, steps, masked)


def _forward(q, k, v, mask, *, scale, config: Config, interpret, plan: KernelPlan, return_lse=False):
    """The call's mask element by element at its blocks (the plan's layout is its backward's)."""
    sizes = BlockSizes(config.block_q, config.block_kv, config.block_kv_compute)
    return dense_attention(
        q, k, v, mask, scale=scale, block_sizes=sizes, interpret=interpret, exp2=config.options.exp2,
        return_lse=return_lse,
    )  # fmt: skip


def _forward_with_lse(q, k, v, plan: KernelPlan, *, scale, interpret):
    return _forward(
        q, k, v, plan.mask, scale=scale, config=plan.config, interpret=interpret, plan=plan, return_lse=True
    )


def dense_schedule_counts(setup, attribution):
    """Executions of each compiled path: every row initialises and finalises once; the compute
    sits unconditionally in the step; a kv tile is fetched at every step."""
    nq, nk = setup.layout.grid_shape
    return accounting.row_grid_counts(setup, np.broadcast_to(np.arange(nk), (1, nq, nk)), {})


IMPLEMENTATION = register(
    Implementation(
        name=NAME,
        roles=frozenset({Role.DENSE}),
        forward=_forward,
        description="flash attention in Pallas over every tile, masking element by element",
        options_type=flash_options.FlashOptions,
        work=lambda layout, num_heads, head_dim, options: dense_work(layout, num_heads, head_dim),
        chips=CHIPS,
        resolve=flash_options.flash_resolve,
        prepare=prepare,
        backward=tile_training(_forward_with_lse, exact_passes),
    ),
    estimator=EstimatorHooks(
        kernel_names=("stlib_dense_flash",),
        compute_regions=lambda kernel, n: [],
        schedule_counts=dense_schedule_counts,
        tuned_candidates=flash_options.TUNED_CANDIDATES,
    ),
)


__all__ = ["dense_attention", "dense_work"]
