"""The backward of the tile kernels: which Pallas calls run (``kernel_calls``, from
``stlib.kernels.backward_calls``: the fused dk / dv / dq kernel per pass and dq window, or the split
dq and dk / dv kernels), running them (``tile_backward``),
what they execute (``backward_work``, ``call_schedule_counts`` for the static estimate) and the
``contract.Backward`` a flash kernel trains with (``tile_training``). The kernels themselves, and
the gradient they compute: ``stlib.kernels.backward_kernels`` and ``stlib.kernels.backward_fused``.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass

import jax.numpy as jnp
import numpy as np

from stlib.blocks import block_sizes_for
from stlib.contract import Backward, Config, EstimatorHooks
from stlib.device import resolve_interpret
from stlib.kernels import mask_info, online_softmax, pallas_call
from stlib.kernels.backward_calls import BACKWARD_METHODS, KernelCall, kernel_calls
from stlib.kernels.backward_fused import Finish, fused_pass
from stlib.kernels.backward_kernels import (
    BACKWARD_PREFIXES,
    DKV_PREFIX,
    DQ_PREFIX,
    FUSED_PREFIX,
    BackwardData,
    PassSetup,
    dkv_pass,
    dq_pass,
    residual_rows,
)
from stlib.kernels.backward_steps import (
    block_steps,
    coded_passes,
    region_counts,
    step_layout,
    step_regions,
    tile_grain,
)
from stlib.kernels.backward_vmem import dq_windows, fused_vmem_bytes
from stlib.layout import block_layout
from stlib.passes import MaskPlanMode

#: The backward's own tiles, compiled for a TPU, where the forward's are larger (``tile_training``'s
#: ``own_blocks``) and no step-coded layout is taken (a mask that only its int8 table evaluates, with
#: MASKED steps; or no dq window beside the step-coded blocks): 1,024 x 1,024, whole [block_kv,
#: block_q] scores a step. Elsewhere the backward runs step-coded (``backward_steps.block_steps``):
#: dense, v6e, 126.5 ms at 2,048 x 2,048 with 1,024-key updates against 136.3 ms here. Static estimate of the fused backward at 10 x 75,600 x 128, band
#: 0.25, v6e: 37.3 ms at 1,024 x 1,024 against 43.0 ms at 512 x 1,024 (a grid step's ~590 bundles of
#: fixed cost beside a 2,717-bundle tile); 1,024 x 2,048 leaves no VMEM for a dq window (split: 48.8).
BACKWARD_TILE = (1024, 1024)


def tile_backward(
    residuals,
    do,
    passes,
    *,
    block_q: int,
    block_kv: int,
    softmax: online_softmax.SoftmaxOptions,
    interpret=None,
    method: str = "auto",
    chip: str | None = None,
    stacked: tuple | None = None,
):
    """(dq, dk, dv) of tile attention: ``residuals`` = (q, k, v, o, lse): q, k, v, o [H, L, D], lse
    [H, L] (natural log, -inf for rows that saw nothing), do [H, L, D], and the forward's ``passes``
    (``stlib.passes.split_passes``) or the backward's ``KernelCall`` list itself (``kernel_calls``).
    Each in its input's dtype. ``softmax``: the forward's scale and exponential. ``method``: one of
    ``BACKWARD_METHODS`` (for passes); ``chip``: the chip whose VMEM sizes the fused kernel's dq
    windows (the call's ``Config.chip``; None: the smallest chip's). ``stacked`` = (stack, block):
    the passes are over a ``StackedBlocks`` layout and run its block ``block`` (an int32 scalar,
    traced or not): every block through the same compiled kernels, its rows of their tables as data
    (``backward_kernels.PassGrid``); no call finishes (``KernelCall.finishes``)."""
    q, k, v, o, lse = residuals
    stack, block = stacked if stacked is not None else (None, None)
    length, scale = q.shape[1], softmax.scale
    qp, dop = pallas_call.pad_sequence(q, block_q), pallas_call.pad_sequence(do, block_q)
    kp, vp = pallas_call.pad_sequence(k, block_kv), pallas_call.pad_sequence(v, block_kv)
    calls = list(passes)
    if stacked is not None and (stack is None or block is None):
        raise ValueError("stacked= is a StackedBlocks layout and the block of it to run")
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
            length=None if stack is not None else length,
        )
    if stack is not None and any(c.finishes for c in calls):
        raise ValueError("a call over a StackedBlocks layout does not finish: the blocks share its kernels")
    lse_row, di_row = residual_rows(lse, do, o, length, qp.shape[1])
    if softmax.exp2:  # the forward's scaling and exponential
        lse_row = lse_row * online_softmax.LOG2_E
    data = BackwardData(qp, kp, vp, dop, lse_row, di_row)
    setup = PassSetup(block_q, block_kv, softmax, interpret, stack, block)
    if calls[0].finishes:  # the whole backward in one call: dq, dk, dv written final by the kernel
        (call,) = calls
        finish = Finish(scale, length, (q.dtype, k.dtype, v.dtype))
        dk, dv, dq = fused_pass(
            data, None, call, setup, vmem_limit=pallas_call.vmem_limit(chip), finish=finish
        )
        return dq, dk, dv
    dq = jnp.zeros(qp.shape, jnp.float32)
    dk = jnp.zeros(kp.shape, jnp.float32)
    dv = jnp.zeros(vp.shape, jnp.float32)
    for call in calls:  # each call adds into the accumulators in place (aliased buffers)
        if call.kind == "fused":
            dk, dv, dq = fused_pass(data, (dq, dk, dv), call, setup, vmem_limit=pallas_call.vmem_limit(chip))
        elif call.kind == "dq":
            dq = dq_pass(data, dq, call, setup)
        else:
            dk, dv = dkv_pass(data, dk, dv, call, setup)
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
    _, extent, n_rows = mask_info.grid_tables(
        call.selected, call.plan, num_heads, transposed=call.kind != "dq"
    )
    return n_rows, extent


def _call_pairs(call: KernelCall, block_q: int, block_kv: int) -> int:
    """Score pairs one call computes per head of its layout (a step-coded call: its codes' pairs)."""
    if call.steps is None:
        return int(call.selected.sum()) * block_q * block_kv
    return sum(
        n * call.steps.pairs(c, block_q, block_kv) for c, n in call.steps.counts(call.selected).items()
    )


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
    out = {"dq_steps": 0, "dkv_steps": 0, "fused_steps": 0, "computed_tiles": 0}
    pairs = {"computed": 0, "matmul": 0}  # score pairs computed; the same times each kernel's matmuls
    for call in calls:
        mult = num_heads if call.selected.shape[0] == 1 else 1
        rows, extent = _call_grid(call, num_heads)
        out[f"{call.kind}_steps"] += rows * extent
        tiles = mult * int(call.selected.sum())
        computed = mult * _call_pairs(call, layout.block_q, layout.block_kv)
        pairs["matmul"] += _MATMULS[call.kind] * computed
        if call.kind != "dq":  # every tile passes one dk / dv-forming kernel
            out["computed_tiles"] += tiles
            pairs["computed"] += computed
    seen = np.zeros(layout.counts.shape[::2], bool)  # [Hl, nk]
    for p in passes:
        seen |= p.selected.any(axis=1)
    out["kv_tiles_without_queries"] = (num_heads if seen.shape[0] == 1 else 1) * int((~seen).sum())
    out["forward_flops"] = FORWARD_MATMULS * 2 * head_dim * pairs["computed"]
    out["backward_flops"] = 2 * head_dim * pairs["matmul"]
    return out


def call_schedule_counts(call: KernelCall, num_heads: int, head_dim: int, itemsize: int, bq: int, bkv: int):
    """``contract.ScheduleCounts`` of one backward call: its grid, each worked row's init and
    finalise, one compute per tile it computes, and the HBM bytes its blocks move (the kernel
    states them: its lse / di rows are lane-dense, its [block, D] blocks lane-exact at D = 128).
    Per row start: the row's own blocks in (and their f32 accumulators in and out; a call that
    ``finishes`` writes dk, dv once, final); per computed step: the other side's blocks; fused, the
    dq window of each head it visits, in and out while the kernel waits (finishing: out only)."""
    from stlib.contract import ScheduleCounts

    rows, extent = _call_grid(call, num_heads)
    mult = num_heads if call.selected.shape[0] == 1 else 1
    computed = mult * int(call.selected.sum())
    table = bq * bkv if call.plan.mode == MaskPlanMode.TABLE else 0  # int8 mask block per step
    rows_f32 = 2 * bq * 4  # lse and di rows
    if call.kind == "dq":
        row_bytes = bq * head_dim * (2 * itemsize + 2 * 4) + rows_f32  # q, dO; dq in and out (f32)
        fetch_bytes = 2 * bkv * head_dim * itemsize + table  # k, v
    elif call.finishes:
        row_bytes = bkv * head_dim * 4 * itemsize  # k, v in; dk, dv out, final
        fetch_bytes = 2 * bq * head_dim * itemsize + rows_f32 + table  # q, dO, lse, di
    else:
        row_bytes = bkv * head_dim * (2 * itemsize + 4 * 4)  # k, v; dk, dv in and out (f32)
        fetch_bytes = 2 * bq * head_dim * itemsize + rows_f32 + table  # q, dO, lse, di
    waited = heads = 0
    if call.kind == "fused":
        heads = len(np.unique(mask_info.worked_rows(call.selected.sum(axis=1), num_heads)[0]))
        window_rows = (call.window[1] - call.window[0]) * bq
        # the head's dq window in and out, f32; final: out only, in the inputs' dtype
        waited = heads * window_rows * head_dim * (itemsize if call.finishes else 2 * 4)
    compute = {"compute": computed} if call.steps is None else region_counts(call.steps, call.selected, mult)
    edges = {"head_init": heads, "head_finalise": heads} if call.kind == "fused" else {}  # dq window in, out
    return ScheduleCounts(
        {"init": rows, **compute, "finalise": rows, **edges},
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


def one_tile_layout(layout):
    """The layout at one 3-D tile per block where the forward's blocks are rows of 3-D tiles that
    are each FULL or EMPTY (``backward_steps.tile_grain``); else None. The backward's fallback where
    its step-coded pass finds no dq window in VMEM: at ``BACKWARD_TILE`` every tile would evaluate
    the mask. Static estimate of the fused backward, sliding tile 3x8x16 window 3, 10 x 75,600 x
    128, v6e: 271.7 ms at 1,024 x 1,024 (every tile masked), 57.3 ms at 384 x 384 (one tile a
    step), 26.3 ms in rows of tiles as pattern steps (1,920 x 1,920)."""
    rows = tile_grain(layout)
    if rows is None or (layout.block_q, layout.block_kv) == (rows[0], rows[0]):
        return None  # no 3-D tiles, or already one tile per block
    return block_layout(layout.mask, rows[0], rows[0])


#: Fewest keys an update of a step-coded pass is cut to where the tuned ones leave no dq window.
MIN_UPDATE_KEYS = 256


def update_keys(grain: int) -> list[int]:
    """Keys per update to try, in turn, from ``grain`` down: halved while at least
    ``MIN_UPDATE_KEYS`` and a multiple of 128 (a chip with less VMEM than the tuned one's: TPU7x's
    48 MiB limit leaves no dq window beside 1,024-key updates of 2,048-lane scores; v6e's 96 MiB does).

    >>> update_keys(1024), update_keys(1280), update_keys(128)
    ([1024, 512, 256], [1280, 640], [128])
    """
    out = [grain]
    while out[-1] // 2 >= MIN_UPDATE_KEYS and (out[-1] // 2) % 128 == 0:
        out.append(out[-1] // 2)
    return out


def _edge_regions(kernel: str):
    """The fused kernel's regions around its compute: the head's dq window in (its first kv row),
    the row's init, then the row's finalise and the head's dq window out (its last kv row); the
    split kernels': None (init and finalise, once per row)."""
    if kernel.startswith(FUSED_PREFIX):
        return ("head_init", "init"), ("finalise", "head_finalise")
    return None


def _compute_regions(kernel: str, n: int) -> list[str]:
    """One "compute" region, or one per step code of a step-coded kernel (its name lists them)."""
    return step_regions(kernel) or ["compute"]


@dataclass(frozen=True)
class BackwardPlan:
    """The backward of one call: the ``layout`` its kernels run (the forward's, or the backward's
    own blocks) and their ``calls`` (``KernelCall``), sized for the call's chip."""

    layout: object  # BlockLayout
    calls: tuple


def backward_plan(
    plan, head_dim: int, itemsize: int, passes_of, own_blocks: bool, step_blocks
) -> BackwardPlan:
    """The ``BackwardPlan`` of the call ``plan`` (``stlib.plan.KernelPlan``) for q of ``head_dim``
    and ``itemsize``: the forward's layout (or, ``own_blocks``, the backward's own, see
    ``tile_training``) and the kernel calls of ``passes_of(layout, options)``, sized for the chip the
    forward was."""
    mask, length, options, chip, interpret = plan.mask, plan.length, plan.options, plan.chip, plan.interpret
    layout = plan.layout

    def calls_of(layout, passes):
        return tuple(
            kernel_calls(
                passes,
                "auto",
                num_q_tiles=-(-length // layout.block_q),
                block_q=layout.block_q,
                block_kv=layout.block_kv,
                head_dim=head_dim,
                itemsize=itemsize,
                chip=chip,
                length=None if mask is not None and mask.stacked else length,  # a stack's call never finishes
            )
        )

    if own_blocks:
        budget_chip = chip or getattr(options, "chip", None)  # whose program budget the step plans keep
        coded, grains = (
            step_layout(layout, length, budget_chip),
            [None],
        )  # rows of 3-D tiles: the forward's patterns
        if coded is None and step_blocks is not None:  # any other layout, at the backward's blocks
            block_q, block_kv, grain = step_blocks(layout, options, chip, interpret)
            coded, grains = block_steps(layout, length, block_q, block_kv, budget_chip), update_keys(grain)
        if coded is not None:
            steps_layout, steps = coded
            exact = passes_of(steps_layout, options)  # the layout's exact passes, once
            for grain in grains:  # fewer keys an update where VMEM is short
                passes = coded_passes(steps, exact, grain)
                with contextlib.suppress(ValueError):  # no dq window fits: smaller tiles, below
                    return BackwardPlan(steps_layout, calls_of(steps_layout, passes))
        default = block_sizes_for(length, None, None, interpret=interpret, chip=chip)
        cap = (default.block_q, default.block_kv) if resolve_interpret(interpret) else BACKWARD_TILE
        sizes = (min(layout.block_q, cap[0]), min(layout.block_kv, cap[1]))
        layout = one_tile_layout(layout) or (
            layout if sizes == (layout.block_q, layout.block_kv) else block_layout(layout.mask, *sizes)
        )
    return BackwardPlan(layout, calls_of(layout, passes_of(layout, options)))


def tile_training(forward_with_lse, passes_of, *, own_blocks: bool = False, step_blocks=None) -> Backward:
    """The ``contract.Backward`` of a flash kernel whose ``forward_with_lse(q, k, v, plan, *, scale,
    interpret) -> (o, lse)`` runs the call's prepared plan (``stlib.plan.KernelPlan``: its layout,
    config and mask): the forward keeps (q, k, v, o, lse); the backward runs ``tile_backward`` over
    ``passes_of(layout, options)`` (``stlib.passes.split_passes`` with the boundary policy the
    forward ran), so the gradient is that of what the forward computed. The backward's plan
    (``backward_plan``: its layout and kernel calls) is built once per call plan and q's head dim
    and dtype, and kept in the call's plan (``KernelPlan.once``).
    ``own_blocks``: the backward takes ``BACKWARD_TILE`` (in interpret mode the default blocks)
    where the forward's are larger (a forward tuned to big tiles, whose [block_q, block_kv] f32
    scores the backward's several intermediates would not fit beside in VMEM); only for a forward
    whose passes are exact, since
    the backward's tiles then differ. With ``own_blocks``, the backward runs step-coded where it can:
    rows of 3-D tiles (``step_layout``), else ``step_blocks(layout, options, chip, interpret) ->
    (block_q, block_kv, grain)`` (``block_steps``: its own blocks, ``grain``-key updates); where no
    dq window fits beside them, ``BACKWARD_TILE``. The entry also names, attributes and counts the
    backward's kernels for the static estimate."""

    def planned(plan, head_dim: int, itemsize: int) -> BackwardPlan:
        return plan.once(
            ("backward", head_dim, itemsize),
            lambda: backward_plan(plan, head_dim, itemsize, passes_of, own_blocks, step_blocks),
        )

    def forward(q, k, v, mask, *, scale, config: Config, interpret, plan):
        o, lse = forward_with_lse(q, k, v, plan, scale=scale, interpret=interpret)
        return o, (q, k, v, o, lse)

    def backward(residuals, do, mask, *, scale, config: Config, interpret, plan, block=None):
        q = residuals[0]
        own = planned(plan, q.shape[2], q.dtype.itemsize)
        return tile_backward(
            residuals, do, own.calls, block_q=own.layout.block_q, block_kv=own.layout.block_kv,
            softmax=online_softmax.SoftmaxOptions(scale, config.options.exp2), interpret=interpret,
            chip=config.chip, stacked=None if block is None else (mask, block),
        )  # fmt: skip

    def stack_backward(residuals, do, stack, block, **call):
        """Block ``block`` (traced) of ``stack`` (``StackedBlocks``): the stack's backward plan, the
        block's rows of its kernels' tables and its offsets as data (one body a kernel call)."""
        return backward(residuals, do, stack, block=block, **call)

    def schedule_counts(setup, attribution):
        """The counts of the compiled backward kernel ``attribution.kernel`` of ``setup``'s call."""
        from stlib import registry

        call = registry.get(setup.impl).kernel_call(
            setup.mask, setup.length, scale=1.0, block_q=setup.block_q, block_kv=setup.block_kv,
            options=setup.options or None, interpret=False,
        )  # fmt: skip
        own = planned(call["plan"], setup.head_dim, setup.itemsize)
        name = re.sub(r"\.\d+$", "", attribution.kernel)  # the compiled program's ".N" suffix
        kernel = next((c for c in own.calls if c.name == name), None)
        if kernel is None:
            raise ValueError(
                f"{attribution.kernel}: not one of the backward's calls {[c.name for c in own.calls]}"
            )
        return call_schedule_counts(
            kernel, setup.num_heads, setup.head_dim, setup.itemsize, own.layout.block_q, own.layout.block_kv
        )

    estimator = EstimatorHooks(
        kernel_names=BACKWARD_PREFIXES,
        compute_regions=_compute_regions,
        schedule_counts=schedule_counts,
        edge_regions=_edge_regions,
    )
    return Backward(forward, backward, estimator, lse_residuals=True, stack_backward=stack_backward)


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
    "BackwardPlan",
    "KernelCall",
    "backward_plan",
    "backward_work",
    "call_schedule_counts",
    "dq_windows",
    "fused_vmem_bytes",
    "kernel_calls",
    "one_tile_layout",
    "residual_rows",
    "tile_backward",
    "tile_training",
    "update_keys",
]
