"""The backward's Pallas kernels (``stlib.kernels.backward`` runs them): a dq kernel over the forward's
per-q-row tile tables, a dk / dv kernel over the transposed, per-kv-row tables, and (``stlib.kernels.backward_fused``) the fused dk / dv /
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

The three kernels share one builder (``PassGrid``: a pass's tables, where each grid step is, its
block maps, its mask and its ``pallas_call``) and name their operands: a kernel body reads
``refs.q``, ``refs.dk_acc``, ``refs.mask`` (the table, where the pass reads one), never a position.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from stlib.device import LANES
from stlib.kernels import mask_info, online_softmax, pallas_call
from stlib.masks import StackedBlocks
from stlib.passes import MaskPlan, MaskPlanMode


class BackwardData(NamedTuple):
    """What every backward kernel reads: q, k, v, dO [H, Lp, D] padded to the tiles, and each row's
    log-sum-exp and di = rowsum(dO * O), lane-dense [H, 1, Lp] f32 (``residual_rows``)."""

    q: object
    k: object
    v: object
    do: object
    lse: object
    di: object


@dataclass(frozen=True)
class PassSetup:
    """How every pass of one backward runs: its tiles (``bq`` x ``bkv``), the forward's ``softmax``,
    ``interpret`` mode and, over a ``StackedBlocks`` layout, the ``stack`` and the ``block`` of it
    run (an int32 scalar, traced or not: ``PassGrid``)."""

    bq: int
    bkv: int
    softmax: online_softmax.SoftmaxOptions
    interpret: object = None
    stack: StackedBlocks | None = None
    block: object = None


#: Name prefixes of the backward's Pallas kernels in a compiled program.
DQ_PREFIX, DKV_PREFIX, FUSED_PREFIX = "stlib_bwd_dq", "stlib_bwd_dkv", "stlib_bwd_fused"
BACKWARD_PREFIXES = (DQ_PREFIX, DKV_PREFIX, FUSED_PREFIX)


#: Where a stacked pass's prefetched tables hold the block's real rows and its offsets: after the
#: worked rows (head, row, slot) and the row tables' tiles and counts, before what a plan adds.
_REAL_ROWS, _OFFSETS = 5, 6


def _mask_fn(plan: MaskPlan, tab, head, qi, ki, bq, bkv, *, transposed: bool, predicate):
    """bool mask of a step's tile, [bq, bkv] (or [bkv, bq] ``transposed``: S^T's, keys on
    sublanes), or None (no mask); ``predicate(queries, keys, head)``: the mask on indices."""
    mode = plan.mode
    if mode == MaskPlanMode.NONE:
        return None
    shape = (bkv, bq) if transposed else (bq, bkv)
    q_axis, k_axis = (1, 0) if transposed else (0, 1)
    if mode == MaskPlanMode.PREFIX:
        return jax.lax.broadcasted_iota(jnp.int32, shape, k_axis) < tab[-1][ki]
    if mode == MaskPlanMode.IOTA:  # the forward's predicate on the tile's iotas
        rows = qi * bq + jax.lax.broadcasted_iota(jnp.int32, shape, q_axis)
        cols = ki * bkv + jax.lax.broadcasted_iota(jnp.int32, shape, k_axis)
        return predicate(rows, cols, head) & (cols < plan.length)
    return None  # TABLE: read from the table operand by the kernel


def dot_f32(a, b, contract):
    """a . b contracting ``contract`` = (axis of a, axis of b), f32 accumulation."""
    return jax.lax.dot_general(
        a, b, ((contract[:1], contract[1:]), ((), ())), preferred_element_type=jnp.float32
    )


@dataclass(frozen=True)
class PassGrid:
    """The grid of one backward pass: the scalar-prefetched tables of its selected tiles
    (``mask_info.grid_tables``: q rows, or kv rows when ``transposed``), ``extent`` steps a row,
    ``n_rows`` rows, and the pass's ``plan`` (how its tiles are masked). A pass over a
    ``StackedBlocks`` layout (``stack``) runs one block, whose rows of the stack's padded tables
    (``mask_info.block_grid_tables``) are selected outside the kernel: after the row tables come its
    real rows (``own_row``: the rest idle) and its offsets in ``stack.base`` (``predicate``)."""

    tables: tuple
    extent: int
    n_rows: int
    plan: MaskPlan
    transposed: bool
    coded: bool = False  # the last table holds each step's code (``backward_steps.StepCodes``)
    stack: StackedBlocks | None = None

    @classmethod
    def of(
        cls, selected, plan: MaskPlan, num_heads: int, *, transposed: bool, block_q: int, kernel: str,
        codes=None, stack: StackedBlocks | None = None, block=None,
    ):  # fmt: skip
        """The grid of ``selected`` tiles (with ``codes``, int16 [Hl, nq, nk], each step's code in a
        last table; with ``stack``, block ``block`` of it, a traced int32); raises ValueError naming
        ``kernel`` when its tables overflow SMEM."""
        if stack is None:
            tables, extent, n_rows = mask_info.grid_tables(selected, plan, num_heads, transposed=transposed)
            if codes is not None:
                tables.append(mask_info.step_codes(selected, codes, transposed=transposed))
            blocks = tables
        else:
            tables, real, extent, n_rows = mask_info.block_grid_tables(
                selected, plan, num_heads, stack.num_blocks, transposed=transposed, codes=codes
            )
            tables[_REAL_ROWS:_REAL_ROWS] = [real, stack.offsets]  # after the row tables' counts
            blocks = [t[0] for t in tables]  # SMEM holds the block a call runs
        mask_info.check_prefetch(blocks, plan, block_q, kernel, "use larger tiles or fewer heads per call")
        if stack is not None:
            tables = [jnp.asarray(t)[block] for t in tables]
        return cls(tuple(tables), extent, n_rows, plan, transposed, codes is not None, stack)

    def own_row(self, p, tab):
        """Whether grid row ``p`` is one of the block's own (always, but for a stack's padding)."""
        return True if self.stack is None else p < tab[_REAL_ROWS][0]

    def last_row(self, tab):
        """The last grid row that is the block's own."""
        return self.n_rows - 1 if self.stack is None else tab[_REAL_ROWS][0] - 1

    def predicate(self, tab, mask, queries, keys, head):
        """``mask`` on (query, key) indices of this call's tokens: a stack's block evaluates its
        base at the block's offsets."""
        if self.stack is None:
            return mask.mask_function(queries, keys, head)
        first, q_start, k_start = (tab[_OFFSETS][i] for i in range(3))
        return self.stack.base.mask_function(queries + q_start, keys + k_start, head + first)

    @property
    def table_mask(self) -> bool:
        """Whether the pass reads its tiles' masks from the int8 table operand (``mask``)."""
        return self.plan.mode == MaskPlanMode.TABLE

    def where(self, p, j, *tab):
        """(head, row tile, tile of the row, table entry, active) of grid step (p, j): the row
        tile is a q tile (a kv tile when ``transposed``); a stack's padding rows are never active."""
        head, row, slot, tiles, counts = tab[:5]
        entry = slot[p] * self.extent + j
        active = j < counts[slot[p]]
        if self.stack is not None:
            active &= self.own_row(p, tab)
        return head[p], row[p], tiles[entry], entry, active

    def block_maps(self):
        """Index maps from a grid step: q-side blocks (q, dO, dq), kv-side blocks (k, v, dk, dv),
        lane-dense rows (lse, di)."""
        q_at, kv_at = (2, 1) if self.transposed else (1, 2)
        where = self.where

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

    def mask_operand(self, bq: int, bkv: int):
        """(the int8 tile table, its BlockSpec): each step's tile mask, [bkv, bq] when
        ``transposed``."""
        table, shape = self.plan.table, (None, bq, bkv)
        if self.transposed:
            table, shape = np.ascontiguousarray(table.transpose(0, 2, 1)), (None, bkv, bq)
        return jnp.asarray(table), pl.BlockSpec(
            shape, lambda p, j, *tab: (tab[-1][self.where(p, j, *tab)[3]], 0, 0)
        )

    def allowed(self, refs, tab, head, qi, ki, bq, bkv):
        """The step's tile mask (from the table operand or ``_mask_fn``), or None (no mask)."""
        if self.table_mask:
            return refs.mask[...] != 0
        return _mask_fn(
            self.plan, tab, head, qi, ki, bq, bkv, transposed=self.transposed,
            predicate=lambda queries, keys, h: self.predicate(tab, self.plan.mask, queries, keys, h),
        )  # fmt: skip

    def run(
        self,
        body,
        *,
        inputs: dict,
        outputs: dict,
        scratch: dict,
        aliases: dict,
        setup: PassSetup,
        name: str,
        dimension_semantics=("parallel", "arbitrary"),
        vmem_limit=None,
    ):
        """The pass as one ``pallas_call``: ``inputs`` and ``outputs`` map operand names to
        (array or ShapeDtypeStruct, BlockSpec), ``scratch`` names to scratch shapes, each in the
        kernel's order; the mask table (``mask``) follows the inputs where the plan reads one.
        ``aliases`` (input name -> output name): buffers the outputs reuse. ``body(tab, refs)``
        gets the prefetched tables and every ref by name (``refs.q``, ``refs.dq_acc``, ...).
        ``setup``: the pass's tiles and interpret mode. Returns the output, or the list of them when
        there are several."""
        bq, bkv, interpret = setup.bq, setup.bkv, setup.interpret
        inputs = dict(inputs)
        if self.table_mask:
            inputs["mask"] = self.mask_operand(bq, bkv)
        names = [*inputs, *outputs, *scratch]
        count = len(self.tables)

        def kernel(*refs):
            body(refs[:count], SimpleNamespace(**dict(zip(names, refs[count:]))))

        out_specs = [spec for _, spec in outputs.values()]
        out_shape = [shape for shape, _ in outputs.values()]
        single = len(outputs) == 1
        grid_spec = pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=count,
            grid=(self.n_rows, self.extent),
            in_specs=[spec for _, spec in inputs.values()],
            out_specs=out_specs[0] if single else out_specs,
            scratch_shapes=list(scratch.values()),
        )
        order = list(inputs)
        return pallas_call.run_pallas(
            kernel,
            grid_spec=grid_spec,
            out_shape=out_shape[0] if single else out_shape,
            interpret=interpret,
            dimension_semantics=dimension_semantics,
            name=name,
            operands=[*(jnp.asarray(t) for t in self.tables), *(value for value, _ in inputs.values())],
            input_output_aliases={count + order.index(i): list(outputs).index(o) for i, o in aliases.items()},
            vmem_limit_bytes=vmem_limit,
        )


def read_operands(grid: PassGrid, q, k, v, do, lse, di, bq: int, bkv: int) -> dict:
    """q, k, v, dO, lse, di (what every backward kernel reads, in that order) with their BlockSpecs."""
    q_map, kv_map, row_map = grid.block_maps()
    head_dim = q.shape[-1]
    return {
        "q": (q, pl.BlockSpec((None, bq, head_dim), q_map)),
        "k": (k, pl.BlockSpec((None, bkv, head_dim), kv_map)),
        "v": (v, pl.BlockSpec((None, bkv, head_dim), kv_map)),
        "do": (do, pl.BlockSpec((None, bq, head_dim), q_map)),
        "lse": (lse, pl.BlockSpec((None, 1, bq), row_map)),  # lane-dense
        "di": (di, pl.BlockSpec((None, 1, bq), row_map)),  # lane-dense
    }


def dq_pass(data: BackwardData, dq_in, call, setup: PassSetup):
    """dq_in + dQ / scale of one pass (``call``: a ``KernelCall`` of kind "dq"), [H, Lq, D] f32
    (dq_in's buffer reused); over a stack (``setup.stack``), of its block ``setup.block``."""
    q, k, v, do, lse, di = data
    selected, plan, name = call.selected, call.plan, call.name
    bq, bkv, softmax, stack, block = setup.bq, setup.bkv, setup.softmax, setup.stack, setup.block
    num_heads, _, head_dim = q.shape
    grid = PassGrid.of(
        selected,
        plan,
        num_heads,
        transposed=False,
        block_q=bq,
        kernel="the dq kernel",
        stack=stack,
        block=block,
    )
    extent = grid.extent

    def body(tab, r):
        p, j = pl.program_id(0), pl.program_id(1)
        h, qi, ki, _, active = grid.where(p, j, *tab)
        own = grid.own_row(p, tab)

        @pl.when((j == 0) & own)
        def _():  # this q tile's lane-dense rows as columns, once per q tile
            for row, col in ((r.lse, r.lse_col), (r.di, r.di_col)):
                col[...] = jnp.broadcast_to(
                    jnp.transpose(jnp.broadcast_to(row[...], (8, bq)))[:, :1], col.shape
                )
            r.acc[...] = r.dq_in[...]

        @pl.when(active)
        def _():
            qs = online_softmax.scaled_q(r.q, softmax)
            s = dot_f32(qs, r.k[...], (1, 1))  # [bq, bkv]
            p_ = softmax.exp(s - online_softmax.lanes(r.lse_col[...], bkv))
            dp = dot_f32(r.do[...], r.v[...], (1, 1))  # [bq, bkv]
            ds = p_ * (dp - online_softmax.lanes(r.di_col[...], bkv))
            allowed = grid.allowed(r, tab, h, qi, ki, bq, bkv)
            if allowed is not None:
                ds = jnp.where(allowed, ds, 0.0)
            r.acc[...] += dot_f32(ds.astype(r.k.dtype), r.k[...], (1, 0))  # [bq, D]

        @pl.when((j == extent - 1) & own)
        def _():
            r.dq[...] = r.acc[...]

    q_map, _, _ = grid.block_maps()
    q_block = pl.BlockSpec((None, bq, head_dim), q_map)
    return grid.run(
        body,
        inputs={**read_operands(grid, q, k, v, do, lse, di, bq, bkv), "dq_in": (dq_in, q_block)},
        outputs={"dq": (jax.ShapeDtypeStruct(dq_in.shape, jnp.float32), q_block)},
        scratch={
            "lse_col": pltpu.VMEM((bq, LANES), jnp.float32),
            "di_col": pltpu.VMEM((bq, LANES), jnp.float32),
            "acc": pltpu.VMEM((bq, head_dim), jnp.float32),
        },
        aliases={"dq_in": "dq"},
        setup=setup, name=name,
    )  # fmt: skip


def _rows(ref, rows):
    """``ref``'s rows ``rows`` = (first, count), static; all of it for None."""
    return ref[...] if rows is None else ref[pl.ds(*rows), :]


def _lanes(ref, lanes):
    """The lane-dense row ``ref`` [1, bq] at the lanes ``lanes`` = (first, count); all for None."""
    return ref[...] if lanes is None else ref[:, pl.ds(*lanes)]


def _add_rows(ref, rows, value):
    if rows is None:
        ref[...] += value
    else:
        ref[pl.ds(*rows), :] += value


def kv_tile_step(r, allowed, softmax, qs=None, keys=None, lanes=None):
    """One computed tile of a kv-row grid (the dk / dv and the fused kernel), or its update of the
    keys ``keys`` against the q lanes ``lanes`` (first, count; None: the whole tile): S^T and P^T
    with keys on sublanes (the lse row broadcasts over them), dV += P^T dO, dP^T, dS^T = P^T *
    (dP^T - di), dK += dS^T Q; a pair ``allowed`` excludes contributes nothing. ``qs``: the scaled q
    tile (None: scaled here). Returns dS^T in q's dtype and the keys' k."""
    qs = online_softmax.scaled_q(r.q, softmax) if qs is None else qs
    if lanes is not None:
        qs = qs[lanes[0] : lanes[0] + lanes[1]]
    k, do = _rows(r.k, keys), _rows(r.do, lanes)
    s_t = dot_f32(k, qs, (1, 1))  # [bkv, bq]: keys on sublanes
    p_t = softmax.exp(s_t - _lanes(r.lse, lanes))  # the lse row [1, bq] broadcasts over the keys
    if allowed is not None:
        p_t = jnp.where(allowed, p_t, 0.0)
    _add_rows(r.dv_acc, keys, dot_f32(p_t.astype(r.do.dtype), do, (1, 0)))  # [bkv, D]
    dp_t = dot_f32(_rows(r.v, keys), do, (1, 1))  # [bkv, bq]
    ds_t = p_t * (dp_t - _lanes(r.di, lanes))
    if allowed is not None:
        ds_t = jnp.where(allowed, ds_t, 0.0)
    ds_t = ds_t.astype(r.q.dtype)
    _add_rows(r.dk_acc, keys, dot_f32(ds_t, _rows(r.q, lanes), (1, 0)))  # [bkv, D]
    return ds_t, k


def kv_blocks(grid: PassGrid, dk_in, dv_in, bkv: int) -> tuple[dict, dict, dict]:
    """The dk / dv operands so far (aliased to the outputs), the outputs and their f32
    accumulators, of a kv-row grid."""
    _, kv_map, _ = grid.block_maps()
    block = pl.BlockSpec((None, bkv, dk_in.shape[-1]), kv_map)
    inputs = {"dk_in": (dk_in, block), "dv_in": (dv_in, block)}
    outputs = {
        "dk": (jax.ShapeDtypeStruct(dk_in.shape, jnp.float32), block),
        "dv": (jax.ShapeDtypeStruct(dv_in.shape, jnp.float32), block),
    }
    scratch = {
        "dk_acc": pltpu.VMEM((bkv, dk_in.shape[-1]), jnp.float32),
        "dv_acc": pltpu.VMEM((bkv, dk_in.shape[-1]), jnp.float32),
    }
    return inputs, outputs, scratch


def dkv_pass(data: BackwardData, dk_in, dv_in, call, setup: PassSetup):
    """(dk_in + dK / scale, dv_in + dV) of one pass (``call``: a ``KernelCall`` of kind "dkv"),
    [H, Lkv, D] f32 each (their buffers reused); over a stack, of its block ``setup.block``."""
    q, k, v, do, lse, di = data
    selected, plan, name = call.selected, call.plan, call.name
    bq, bkv, softmax, stack, block = setup.bq, setup.bkv, setup.softmax, setup.stack, setup.block
    grid = PassGrid.of(
        selected, plan, k.shape[0], transposed=True, block_q=bq, kernel="the dk / dv kernel", stack=stack,
        block=block,
    )  # fmt: skip
    extent = grid.extent

    def body(tab, r):
        p, j = pl.program_id(0), pl.program_id(1)
        h, ki, qi, _, active = grid.where(p, j, *tab)
        own = grid.own_row(p, tab)

        @pl.when((j == 0) & own)
        def _():
            r.dk_acc[...] = r.dk_in[...]
            r.dv_acc[...] = r.dv_in[...]

        @pl.when(active)
        def _():
            kv_tile_step(r, grid.allowed(r, tab, h, qi, ki, bq, bkv), softmax)

        @pl.when((j == extent - 1) & own)
        def _():
            r.dk[...] = r.dk_acc[...]
            r.dv[...] = r.dv_acc[...]

    inputs, outputs, scratch = kv_blocks(grid, dk_in, dv_in, bkv)
    return grid.run(
        body,
        inputs={**read_operands(grid, q, k, v, do, lse, di, bq, bkv), **inputs},
        outputs=outputs, scratch=scratch, aliases={"dk_in": "dk", "dv_in": "dv"},
        setup=setup, name=name,
    )  # fmt: skip


def residual_rows(lse, do, o, length: int, padded: int):
    """The lane-dense f32 rows [H, 1, padded] the kernels read: the log-sum-exp (a row that saw no
    key, -inf, becomes +inf so its probabilities are exactly zero; padding too) and di =
    rowsum(dO * O)."""
    lse = jnp.where(lse == -jnp.inf, jnp.inf, lse.astype(jnp.float32))
    di = jnp.sum(do.astype(jnp.float32) * o.astype(jnp.float32), axis=-1)
    pad = ((0, 0), (0, padded - length))
    return jnp.pad(lse, pad, constant_values=jnp.inf)[:, None, :], jnp.pad(di, pad)[:, None, :]
