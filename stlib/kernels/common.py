"""Shared kernel plumbing: the flash-style options and block rule, the online-softmax tile update,
masks evaluated in-kernel (from a ``stlib.passes.MaskPlan``), and the ``pallas_call`` wrapper with
the interpret switch. Block sizes live in ``stlib.blocks``, the passes and mask plans in
``stlib.passes``.

Every Pallas kernel here keeps, per q tile, float32 running max ``m`` and sum ``l`` ([block_q, 128],
lane-replicated) and an accumulator ``acc`` [block_q, D] in VMEM scratch, and processes one
(q tile, kv tile) per grid step in chunks of ``block_kv_compute`` keys.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from stlib._intmath import cdiv, round_up
from stlib.blocks import block_sizes_for, check_chunk
from stlib.device import CHIPS, LANES, chip_spec, resolve_interpret, smem_limit
from stlib.layout import row_tables, smem_bytes
from stlib.passes import MaskPlan, MaskPlanMode
from stlib.reference import MASK_VALUE

#: Every chip of the table: the Pallas kernels here compile for all of them.
ALL_CHIPS = CHIPS
LOG2_E = math.log2(math.e)


# --------------------------------------------------------------------------------------------
# kernel options


@dataclass(frozen=True)
class FlashOptions:
    """Options of the flash-style Pallas kernels. ``exp2``: base-2 exponentials with log2(e) folded
    into the scale (one multiply fewer per score); ``block_kv_compute``: the kv chunk of the inner
    loop (None: the chip's default chunk with default blocks, else the whole kv tile)."""

    exp2: bool = False
    block_kv_compute: int | None = None

    def __post_init__(self):
        if not isinstance(self.exp2, bool):
            raise TypeError(f"exp2={self.exp2!r} must be True or False")
        if self.block_kv_compute is not None:
            check_chunk(self.block_kv_compute)


#: The (block_q, block_kv) a tuned static estimate of stlib's own Pallas kernels sweeps
#: (block_kv_compute: their default).
TUNED_CANDIDATES = ((512, 1024), (512, 2048), (1024, 1024), (1024, 2048))


def flash_resolve(mask, length: int, block_q, block_kv, options, interpret):
    """(BlockSizes, options with the chunk resolved) of a flash-style kernel call on ``length``
    tokens: the registry's ``resolve`` of the kernels whose options carry ``block_kv_compute``."""
    sizes = block_sizes_for(
        length,
        block_q,
        block_kv,
        interpret=interpret,
        block_kv_compute=options.block_kv_compute,
    )
    return sizes, dataclasses.replace(options, block_kv_compute=sizes.block_kv_compute)


# --------------------------------------------------------------------------------------------
# masks inside a kernel


def carried_index(index: np.ndarray) -> np.ndarray:
    """Replace -1 entries by the last valid entry before them in flat order (0 before any), so an
    index map fed with it only changes block where a real entry starts."""
    flat = index.reshape(-1)
    pos = np.where(flat >= 0, np.arange(flat.size), -1)
    pos = np.maximum.accumulate(pos)
    return np.where(pos >= 0, flat[np.maximum(pos, 0)], 0).astype(np.int32).reshape(index.shape)


def row_step_tables(selected: np.ndarray, plan: MaskPlan) -> tuple[list[np.ndarray], int]:
    """Scalar-prefetch tables of a rows-form grid (H, rows, W) over the tiles ``selected`` (bool
    [Hl, rows, cols]): each row's tile list and count, then the mask table entry of each step (a
    TABLE plan, whose ``index`` is [Hl, rows, cols]) or the real keys per kv tile (a PREFIX plan);
    and W. The tile kernels' forward walks q rows; the backward's dk / dv kernel walks kv rows
    (``selected`` and the plan's index transposed)."""
    tiles, counts = row_tables(selected)
    tables = [tiles.reshape(-1), counts.reshape(-1)]
    extent = tiles.shape[2]
    if plan.mode == MaskPlanMode.TABLE:
        idx = np.take_along_axis(np.broadcast_to(plan.index, selected.shape), tiles, axis=2)
        idx = np.where(np.arange(extent) < counts[:, :, None], idx, -1)
        tables.append(carried_index(idx).reshape(-1))
    if plan.mode == MaskPlanMode.PREFIX:
        tables.append(plan.kv_valid.astype(np.int32))
    return tables, extent


def check_prefetch(tables, plan: MaskPlan, block_q: int, what: str, hint: str) -> None:
    """Refuse scalar-prefetch tables that overflow TPU SMEM, and int8 mask tables whose rows break
    the (32, 128) int8 tiling, with messages that name the fix."""
    table_bytes, limit = sum(smem_bytes(t.shape) for t in tables), smem_limit()
    if table_bytes > limit:
        raise ValueError(
            f"{what} prefetches {table_bytes:,} bytes of tables into {limit:,} bytes of SMEM; {hint}"
        )
    if plan.mode == MaskPlanMode.TABLE and block_q % 32:
        raise ValueError(f"{block_q=} must be a multiple of 32 for an int8 mask table")


def iota_mask(plan: MaskPlan, q0, k0, shape, head):
    """bool [rows, cols] of the plan's lazy mask for the tile whose first row / column are q0 / k0
    (``head``: the traced head index, used by per-head masks)."""
    rows = q0 + jax.lax.broadcasted_iota(jnp.int32, shape, 0)
    cols = k0 + jax.lax.broadcasted_iota(jnp.int32, shape, 1)
    return plan.mask.mask_function(rows, cols, head) & (cols < plan.length)


# --------------------------------------------------------------------------------------------
# the online-softmax tile update


@dataclass(frozen=True)
class SoftmaxOptions:
    """``exp2``: base-2 exponentials with log2(e) folded into the scale (one multiply fewer per score)."""

    scale: float
    exp2: bool = False

    @property
    def score_scale(self) -> float:
        return self.scale * LOG2_E if self.exp2 else self.scale

    def exp(self, x):
        return jnp.exp2(x) if self.exp2 else jnp.exp(x)


def init_row(m_ref, l_ref, acc_ref):
    m_ref[...] = jnp.full(m_ref.shape, MASK_VALUE, jnp.float32)
    l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)
    acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)


def scaled_q(q_ref, options: SoftmaxOptions):
    """The q tile with the softmax scale folded in, in q's dtype: [block_q, D]."""
    q = q_ref[...]
    return (q.astype(jnp.float32) * options.score_scale).astype(q.dtype)


def _lanes(x, width: int):
    """A lane-replicated [rows, 128] array widened (or cut) to [rows, width] without lane shuffles."""
    if width % LANES == 0:
        return jnp.tile(x, (1, width // LANES))
    return x[:, :width] if width < LANES else jnp.tile(x, (1, cdiv(width, LANES)))[:, :width]


def update_tile(q, k_ref, v_ref, m_ref, l_ref, acc_ref, options: SoftmaxOptions, chunk: int, mask_fn=None):
    """Fold one kv tile into the running softmax of a q tile, ``chunk`` keys at a time.

    q [block_q, D] (pre-scaled); k_ref, v_ref [block_kv, D]; ``mask_fn(c0, shape)`` -> bool
    [block_q, chunk] for the chunk starting at tile column c0, or None for a mask-free tile.
    Per chunk: 2 * block_q * chunk * D flops for q k^T, the same for p v, block_q * chunk exps.
    """
    block_kv = k_ref.shape[0]

    def body(c, carry):
        c0 = pl.multiple_of(c * chunk, chunk)
        k = k_ref[pl.ds(c0, chunk), :]  # [chunk, D]
        v = v_ref[pl.ds(c0, chunk), :]  # [chunk, D]
        s = jax.lax.dot_general(
            q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32
        )  # [bq, chunk]
        allowed = None if mask_fn is None else mask_fn(c0, s.shape)
        if allowed is not None:
            s = jnp.where(allowed, s, MASK_VALUE)
        m_prev = m_ref[...]  # [bq, 128]
        m_next = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))  # [bq, 128]
        p = options.exp(s - _lanes(m_next, chunk))  # [bq, chunk]
        if allowed is not None:
            p = jnp.where(allowed, p, 0.0)
        alpha = options.exp(m_prev - m_next)  # [bq, 128]
        l_ref[...] = alpha * l_ref[...] + jnp.sum(p, axis=1, keepdims=True)
        m_ref[...] = m_next
        pv = jax.lax.dot_general(
            p, v.astype(jnp.float32), (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32
        )  # [bq, D]
        acc_ref[...] = _lanes(alpha, acc_ref.shape[1]) * acc_ref[...] + pv
        return carry

    jax.lax.fori_loop(0, block_kv // chunk, body, 0, unroll=True)


def finish_row(o_ref, lse_ref, m_ref, l_ref, acc_ref, options: SoftmaxOptions):
    """Write o = acc / l and, if requested, the natural-log LSE. A row whose mask let it see no key
    keeps the initial running max (masked scores are MASK_VALUE, never above it) and a zero sum:
    zeros and an LSE of -inf there. The test is on the mask, not the data: a NaN score makes the
    sum NaN (the running max may skip NaN: vector max is not NaN-propagating in every lowering),
    an inf key makes the max inf, and both reach the output as the reference has them."""
    l = l_ref[...][:, :1]  # [bq, 1]
    m = m_ref[...][:, :1]  # [bq, 1]
    seen = (m != MASK_VALUE) | jnp.isnan(l)  # a key was allowed, or the data is NaN
    o_ref[...] = jnp.where(seen, acc_ref[...] / jnp.where(seen, l, 1.0), 0.0).astype(o_ref.dtype)
    if lse_ref is not None:
        log_l = jnp.log2(jnp.where(seen, l, 1.0)) if options.exp2 else jnp.log(jnp.where(seen, l, 1.0))
        lse = (m + log_l) * (math.log(2.0) if options.exp2 else 1.0)
        lse_ref[...] = jnp.where(seen, lse, -jnp.inf)


def softmax_scratch(block_q: int, head_dim: int):
    return [
        pltpu.VMEM((block_q, LANES), jnp.float32),  # m: running max (lane-replicated)
        pltpu.VMEM((block_q, LANES), jnp.float32),  # l: running sum (lane-replicated)
        pltpu.VMEM((block_q, head_dim), jnp.float32),  # acc: unnormalised output
    ]


# --------------------------------------------------------------------------------------------
# pallas_call wrapper and padding


#: Share of a chip's VMEM a call may ask for (the rest: Mosaic's internal scratch, headroom).
VMEM_SHARE = 0.75


def vmem_limit(chip: str | None) -> int:
    """Bytes of VMEM a call may ask for on ``chip`` (None: the smallest in the chip table, for a
    kernel traced off a TPU that may be compiled for any of them)."""
    chips = [chip_spec(chip)] if chip else [chip_spec(c) for c in CHIPS]
    return int(min(c.vmem_bytes for c in chips) * VMEM_SHARE)


def run_pallas(
    kernel,
    *,
    grid_spec,
    out_shape,
    interpret,
    dimension_semantics,
    name,
    operands,
    vmem_limit_bytes: int | None = None,
    input_output_aliases: dict[int, int] | None = None,
):
    """``pl.pallas_call`` with the interpret switch (None: interpret unless on a TPU) and, when given,
    the scoped-VMEM limit the compiled kernel may use (None: the compiler's default) and the
    operands whose buffers outputs reuse ({operand index: output index})."""
    use_interpret = resolve_interpret(interpret)
    call = pl.pallas_call(
        kernel,
        grid_spec=grid_spec,
        out_shape=out_shape,
        interpret=use_interpret,
        compiler_params=None
        if use_interpret
        else pltpu.CompilerParams(dimension_semantics=dimension_semantics, vmem_limit_bytes=vmem_limit_bytes),
        name=name,
        input_output_aliases=input_output_aliases or {},
    )
    return call(*operands)


def pad_sequence(x, multiple: int):
    """Pad axis 1 of [H, L, D] with zeros up to a multiple of ``multiple``."""
    length = x.shape[1]
    target = round_up(length, multiple)
    if target == length:
        return x
    return jnp.pad(x, ((0, 0), (0, target - length), (0, 0)))


def merge_partials(o1, lse1, o2, lse2):
    """Numerically stable merge of two attention results over disjoint key sets.

    o [H, L, D], lse [H, L, 1] (natural log, -inf where a pass saw no key). Rows neither pass saw
    stay zero; a NaN in either pass stays NaN."""
    lse = jnp.logaddexp(lse1, lse2)
    empty = lse == -jnp.inf
    safe = jnp.where(empty, 0.0, lse)
    w1 = jnp.where(empty, 0.0, jnp.exp(lse1 - safe))
    w2 = jnp.where(empty, 0.0, jnp.exp(lse2 - safe))
    out = w1 * o1.astype(jnp.float32) + w2 * o2.astype(jnp.float32)
    return out.astype(o1.dtype), lse
