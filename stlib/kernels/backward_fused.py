"""The backward's fused dk / dv / dq kernel (``fused_pass``): the dk / dv kernel's walk over kv rows
(``stlib.kernels.backward_kernels``: its grid, tables and tile step) that also forms dQ = dS K from
the dS^T it has, adding into a VMEM window of the head's dq; and, where one such call is the whole
backward, writes dq, dk and dv final (``Finish``)."""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from stlib.device import LANES
from stlib.kernels import online_softmax
from stlib.kernels.backward_kernels import (
    BackwardData,
    PassGrid,
    PassSetup,
    dot_f32,
    kv_blocks,
    kv_tile_step,
    read_operands,
)
from stlib.kernels.steps import StepKind


@dataclass(frozen=True)
class Finish:
    """How the backward's only call (``backward.KernelCall.finishes``) writes its outputs final:
    dq and dk times ``scale``, dv as it is, cast to ``dtypes`` (q's, k's, v's), ``length`` rows each
    (the arrays' own, no padding)."""

    scale: float
    length: int
    dtypes: tuple


def _final_kv_blocks(grid: PassGrid, finish: Finish, shape, bkv: int) -> tuple[dict, dict, dict]:
    """The outputs of a finishing call (``Finish``): dk and dv of ``finish.length`` rows in k's and v's
    dtypes (the last kv block partly past the array: its rows there are dropped), and their f32
    accumulators; no inputs."""
    _, kv_map, _ = grid.block_maps()
    head_dim = shape[-1]
    block = pl.BlockSpec((None, bkv, head_dim), kv_map)
    outputs = {
        "dk": (jax.ShapeDtypeStruct((shape[0], finish.length, head_dim), finish.dtypes[1]), block),
        "dv": (jax.ShapeDtypeStruct((shape[0], finish.length, head_dim), finish.dtypes[2]), block),
    }
    scratch = {
        "dk_acc": pltpu.VMEM((bkv, head_dim), jnp.float32),
        "dv_acc": pltpu.VMEM((bkv, head_dim), jnp.float32),
    }
    return {}, outputs, scratch


def fused_pass(data: BackwardData, acc, call, setup: PassSetup, *, vmem_limit, finish: Finish | None = None):
    """(dq_in + dQ / scale, dk_in + dK / scale, dv_in + dV) of one pass (``call``: a ``KernelCall``
    of kind "fused"; ``acc``: (dq_in, dk_in, dv_in), None with ``finish``) restricted to the q tiles
    of its ``window`` = (first, end): the dk / dv grid (kv rows, head by head) that also forms dQ = dS K
    from the dS^T it has, accumulating the window's dq of the current head in a VMEM scratch. That
    scratch is read from HBM when a head's first kv row starts and written back after its last, by
    DMAs the kernel waits for (the bytes are small beside the steps'); rows of one head are
    consecutive in the grid, so the scratch is whole when it is written. Heads without a row in
    the pass are never visited and keep their dq (aliased buffers). ``steps``
    (``backward_steps.StepCodes``): each step runs the updates of its code, one region per code.
    ``finish``: the call is the whole backward (one window over every q tile, every kv tile
    visited), so it reads no dq_in, dk_in, dv_in: its accumulators start at zero, dk and dv leave
    VMEM final when their kv row is done and each head's dq when its last kv row is, tile by tile
    through a staging block, all scaled and cast (returns dk, dv, dq of ``finish.length`` rows).
    ``stack``: the pass runs block ``block`` of a ``StackedBlocks`` layout (``PassGrid``: its rows
    of the tables, its padding rows idle, its MASKED steps on the stack's base at its offsets)."""
    q, k, v, do, lse, di = data
    dq_in, dk_in, dv_in = acc if acc is not None else (None, None, None)
    selected, plan, name, window, steps = call.selected, call.plan, call.name, call.window, call.steps
    bq, bkv, softmax, stack, block = setup.bq, setup.bkv, setup.softmax, setup.stack, setup.block
    head_dim = k.shape[-1]
    first_tile, end_tile = window
    rows = (end_tile - first_tile) * bq
    grid = PassGrid.of(
        selected, plan, k.shape[0], transposed=True, block_q=bq, kernel="the fused backward kernel",
        codes=None if steps is None else steps.codes, stack=stack, block=block,
    )  # fmt: skip
    extent, n_rows = grid.extent, grid.n_rows
    present = () if steps is None else steps.present(selected)

    def coded_step(tab, r, code, h, qi, ki):
        """The updates of a step of ``code``: each a kv sub-tile against a run of q lanes."""
        qs = online_softmax.scaled_q(r.q, softmax)
        tail = steps.length % bkv  # keys of the last kv tile that lie in the array (0: all)
        for k0, keys, q0, lanes, masked in steps.updates(code, bq, bkv):
            allowed = None
            if masked:  # a MASKED piece or PARTIAL sub-tile: the mask on it only, keys on sublanes
                shape = (keys, lanes)
                queries = qi * bq + q0 + jax.lax.broadcasted_iota(jnp.int32, shape, 1)
                key_ids = ki * bkv + k0 + jax.lax.broadcasted_iota(jnp.int32, shape, 0)
                allowed = grid.predicate(tab, steps.mask, queries, key_ids, h)
                if code == StepKind.MASKED and tail:  # its kv tile may be the last: rows past the array
                    allowed &= key_ids < steps.length
            if code == StepKind.RAGGED and k0 + keys > tail:  # the piece the array ends in
                allowed = jax.lax.broadcasted_iota(jnp.int32, (keys, 1), 0) < tail - k0
            if steps.padded(code):  # the kv tile's padding slots are no keys
                valid = r.valid[pl.ds(k0, keys), :] != 0  # [keys, 1]
                allowed = valid if allowed is None else allowed & valid
            ds_t, k_rows = kv_tile_step(r, allowed, softmax, qs, (k0, keys), (q0, lanes))
            at = pl.ds(pl.multiple_of((qi - first_tile) * bq + q0, LANES), lanes)
            r.dq_acc[at, :] += dot_f32(ds_t, k_rows, (0, 0))  # [lanes, D] = dS K

    def write_dq(r, h):
        """The head's dq, final: each q tile of the scratch scaled, cast and copied out in turn,
        unrolled (a loop as the region's only content is compiled as a loop around a predicated
        body at the top of the step, which the static estimate would charge every grid step)."""
        tiles, last = divmod(finish.length, bq)
        for t in range(tiles + (last > 0)):
            stage, size = (r.dq_stage, bq) if t < tiles else (r.dq_last, last)
            stage[...] = (r.dq_acc[pl.ds(t * bq, size), :] * finish.scale).astype(stage.dtype)
            pltpu.async_copy(stage, r.dq.at[h, pl.ds(t * bq, size)], r.sem).wait()

    def body(tab, r):
        p, j = pl.program_id(0), pl.program_id(1)
        h, ki, qi, _, active = grid.where(p, j, *tab)
        heads, own = tab[0], grid.own_row(p, tab)
        first_row = (p == 0) | (heads[jnp.maximum(p - 1, 0)] != h)
        last_row = (p == grid.last_row(tab)) | (heads[jnp.minimum(p + 1, n_rows - 1)] != h)

        @pl.when((j == 0) & first_row & own)
        def _():  # the head's first kv row: its dq so far into VMEM (final: zeros)
            if finish is not None:
                r.dq_acc[...] = jnp.zeros(r.dq_acc.shape, jnp.float32)
            else:
                pltpu.async_copy(r.dq_in.at[h, pl.ds(first_tile * bq, rows)], r.dq_acc, r.sem).wait()

        @pl.when((j == 0) & own)
        def _():
            if finish is not None:
                r.dk_acc[...] = jnp.zeros(r.dk_acc.shape, jnp.float32)
                r.dv_acc[...] = jnp.zeros(r.dv_acc.shape, jnp.float32)
            else:
                r.dk_acc[...] = r.dk_in[...]
                r.dv_acc[...] = r.dv_in[...]

        if steps is None:

            @pl.when(active)
            def _():
                ds_t, _ = kv_tile_step(r, grid.allowed(r, tab, h, qi, ki, bq, bkv), softmax)
                at = pl.ds(pl.multiple_of((qi - first_tile) * bq, bq), bq)
                r.dq_acc[at, :] += dot_f32(ds_t, r.k[...], (0, 0))  # [bq, D] = dS K

        for code in present:  # one region per step code

            @pl.when(active & (tab[-1][grid.where(p, j, *tab)[3]] == code))
            def _(code=code):
                coded_step(tab, r, code, h, qi, ki)

        @pl.when((j == extent - 1) & own)
        def _():
            if finish is not None:
                r.dk[...] = (r.dk_acc[...] * finish.scale).astype(r.dk.dtype)
                r.dv[...] = r.dv_acc[...].astype(r.dv.dtype)
            else:
                r.dk[...] = r.dk_acc[...]
                r.dv[...] = r.dv_acc[...]

        @pl.when((j == extent - 1) & last_row & own)
        def _():  # the head's last kv row: its dq back to HBM
            if finish is not None:
                write_dq(r, h)
            else:
                pltpu.async_copy(r.dq_acc, r.dq.at[h, pl.ds(first_tile * bq, rows)], r.sem).wait()

    in_hbm = pl.BlockSpec(memory_space=pl.ANY)
    dq_scratch = {"dq_acc": pltpu.VMEM((rows, head_dim), jnp.float32), "sem": pltpu.SemaphoreType.DMA}
    if finish is None:
        inputs, outputs, scratch = kv_blocks(grid, dk_in, dv_in, bkv)
        inputs["dq_in"] = (dq_in, in_hbm)
        outputs["dq"] = (jax.ShapeDtypeStruct(dq_in.shape, jnp.float32), in_hbm)
        aliases = {"dk_in": "dk", "dv_in": "dv", "dq_in": "dq"}
    else:
        inputs, outputs, scratch = _final_kv_blocks(grid, finish, k.shape, bkv)
        outputs["dq"] = (
            jax.ShapeDtypeStruct((k.shape[0], finish.length, head_dim), finish.dtypes[0]),
            in_hbm,
        )
        dq_scratch["dq_stage"] = pltpu.VMEM((bq, head_dim), finish.dtypes[0])
        if finish.length % bq:
            dq_scratch["dq_last"] = pltpu.VMEM((finish.length % bq, head_dim), finish.dtypes[0])
        aliases = {}
    if any(steps.padded(code) for code in present):  # the per-key validity column, by kv tile
        column = pl.BlockSpec((bkv, 1), lambda p, j, *tab: (grid.where(p, j, *tab)[1], 0))
        inputs["valid"] = (jnp.asarray(steps.key_column), column)
    return grid.run(
        body,
        inputs={**read_operands(grid, q, k, v, do, lse, di, bq, bkv), **inputs},
        outputs=outputs,
        scratch={**scratch, **dq_scratch},
        aliases=aliases,
        setup=setup, name=name,
        dimension_semantics=("arbitrary", "arbitrary"),  # a head's kv rows all add into one dq scratch
        vmem_limit=vmem_limit,
    )  # fmt: skip


__all__ = ["Finish", "fused_pass"]
