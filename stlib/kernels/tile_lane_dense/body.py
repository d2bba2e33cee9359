"""The body of the ``pallas_tile_lane_dense`` kernel (``build_kernel``): one grid step's update,
one region per step code. ``kernel.py`` sizes and calls it.

Scores are k q^T, [chunk, block_q]: keys on sublanes, queries on lanes, so the running max and sum
are [8, block_q] (one value per query along lanes) and their reductions over keys are element-wise
maxima / sums across vregs, not cross-lane reductions. The kv tile is walked in ``block_kv_compute``
chunks (one max, one rescale per chunk) and, inside a chunk, in register tiles of
``block_kv_register`` keys (exp2, then bf16 probabilities into p.v). The scores of a step's later
chunks are issued before its earlier chunks are folded (``lookahead``): the MXU computes chunk c+1's
k q^T while the EUP exponentiates chunk c, instead of waiting at every chunk's max. The accumulator is o^T
[D, block_q]; it is transposed once per row, when the output is written in q's dtype.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from stlib._intmath import round_up
from stlib.device import SUBLANES
from stlib.kernels import online_softmax
from stlib.kernels.steps import (
    FIRST_PATTERN,
    STEP,
    StepKind,
    StepPlan,
)
from stlib.masks import StackedBlocks
from stlib.passes import MaskPlan, MaskPlanMode
from stlib.reference import MASK_VALUE

# --------------------------------------------------------------------------------------------
# the kernel


def _scores(k, q):
    """k q^T: f32 [C, n] scores of a chunk's C keys (sublanes) against n queries (lanes)."""
    return jax.lax.dot_general(k, q, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)


def _fold(
    s,
    v,
    state,
    *,
    lanes: slice,
    score_scale_exp,
    register: int,
    p_dtype,
    allowed=None,
    keys_valid=None,
):
    """Fold one chunk's scores ``s`` [C, n] (k q^T of pre-scaled q) into the running softmax of the q
    lanes ``lanes`` (a static slice of the q tile), held in ``state`` = (m, l, acc) refs. v [C, D];
    ``allowed`` bool [C, n] or None: the mask on these pairs, applied to the scores and to the
    probabilities; ``keys_valid`` bool [C, 1] or None: which keys are real (padding slots of a permuted order, rows past the array end hold stale
    data), applied to the scores and to v only. Flops: 2 * C * n * D (v^T p); exps: C * n + n.

    Why v and not the probabilities, for a key mask: an invalid key's score is ``MASK_VALUE``, so its
    probability exp(MASK_VALUE - m) is exactly 0 once the lane has a real maximum m. Only while no
    allowed key has reached the lane (m == MASK_VALUE) is it exp(0) = 1, and then it adds 1 to l and
    a zero row of v to o; the first real maximum rescales both by exp(MASK_VALUE - m) = 0, and a lane
    that never sees one is written as zeros. So a key mask costs one select per score, not two; a
    pair mask keeps both, since a masked key's v may hold inf or NaN that o must never see."""
    exp = score_scale_exp
    if keys_valid is not None:
        s = jnp.where(keys_valid, s, MASK_VALUE)
        v = jnp.where(keys_valid, v, jnp.zeros((), v.dtype))
    if allowed is not None:
        s = jnp.where(allowed, s, MASK_VALUE)
    m_ref, l_ref, acc_ref = state  # the running max, sum and accumulator (VMEM refs)
    m_prev = m_ref[:, lanes]  # [8, n]
    m_next = jnp.maximum(m_prev, jnp.max(s, axis=0, keepdims=True))  # [8, n]
    m_row = m_next[:1]  # [1, n]
    alpha = exp(m_prev[:1] - m_row)  # [1, n]
    rows = s.shape[0]
    l_add = None
    pv = None
    for r0 in range(0, rows, register):  # register tiles: bounds the live range of p
        r1 = min(rows, r0 + register)
        p = exp(s[r0:r1] - m_row)  # [R, n]
        if allowed is not None:
            p = jnp.where(allowed[r0:r1], p, 0.0)
        part = jnp.sum(p, axis=0, keepdims=True)  # [1, n]
        prod = jax.lax.dot_general(
            v[r0:r1].astype(p_dtype),
            p.astype(p_dtype),
            (((0,), (0,)), ((), ())),
            preferred_element_type=jnp.float32,
        )  # [D, n]
        l_add = part if l_add is None else l_add + part
        pv = prod if pv is None else pv + prod
    l_ref[:, lanes] = jnp.broadcast_to(alpha * l_ref[:1, lanes] + l_add, m_prev.shape)
    m_ref[:, lanes] = m_next
    acc_ref[:, lanes] = alpha * acc_ref[:, lanes] + pv  # [D, n]


def _bind(function, args):
    """``function(*args)``, called later."""
    return lambda: function(*args)


@dataclass(frozen=True)
class Chunk:
    """One update of a step: keys ``c0 : c0 + size`` of the kv tile against the q lanes ``lanes``;
    ``allowed``: a function giving the chunk's bool pair mask (called when it is folded) or None;
    ``keys_valid``: a function giving its bool [size, 1] key mask or None (see ``_fold``)."""

    c0: int
    size: int
    lanes: slice
    allowed: object = None
    keys_valid: object = None


class Folds(NamedTuple):
    """How a step folds its work: ``chunk`` keys at a time, ``register`` keys a register tile,
    ``fold_lanes`` queries a fold over whole q tiles, ``lookahead`` chunks' scores issued ahead."""

    chunk: int
    register: int
    fold_lanes: int
    lookahead: int


class TableGrid(NamedTuple):
    """The step tables' grid: ``nq`` q tiles, ``extent`` steps a row, ``shared`` (one head's tables
    for every head) and ``n_tables`` scalar-prefetch tables."""

    nq: int
    extent: int
    shared: bool
    n_tables: int


def build_kernel(
    *,
    steps: StepPlan,
    mask_plan: MaskPlan,
    folds: Folds,
    tables: TableGrid,
    softmax: online_softmax.SoftmaxOptions,
    p_dtype,
    with_lse: bool = False,
    stack: StackedBlocks | None = None,
):
    """The kernel body of ``lane_dense_attention``; with ``stack``, the third scalar-prefetch table
    holds the block's (first head, q_start, k_start) in ``stack.base``, whose predicate the MASKED
    steps and the patterns' PARTIAL sub-tiles evaluate at those offsets (one body for every block)."""
    chunk, register, fold_lanes, lookahead = folds
    nq, extent, shared, n_tables = tables
    layout, length, present = steps.layout, steps.length, steps.present
    bq, bkv = layout.block_q, layout.block_kv
    tail = length % bkv  # real rows of the last kv block (0: the array ends at a block edge)
    table = mask_plan.mode == MaskPlanMode.TABLE
    key_column = steps.key_validity

    def pieces(lane0: int, lanes: int) -> list[slice]:
        """The q lanes lane0 : lane0 + lanes in folds of at most ``fold_lanes`` queries each (FULL and
        RAGGED steps; a pattern's updates are lane runs of their own, and cutting them finer cost
        more than it saved: the sliding tile on v6e, 3840 x 1920, +31k cycles at 384 queries; the
        MASKED region 18,123 -> 27,901 bundles a step at 256, band 0.25 on v6e, 2048 x 2048)."""
        return [slice(a, min(lane0 + lanes, a + fold_lanes)) for a in range(lane0, lane0 + lanes, fold_lanes)]

    def kernel(*refs):
        steps_ref, counts_ref = refs[0], refs[1]
        rest = list(refs[n_tables:])
        q_ref, k_ref, v_ref = rest[:3]
        mask_ref = rest.pop(3) if table else None
        valid_ref = rest.pop(3) if key_column else None
        o_ref, *lse_ref, m_ref, l_ref, acc_ref, qs_ref = rest[3:]
        h, i, j = pl.program_id(0), pl.program_id(1), pl.program_id(2)
        row = i if shared else h * nq + i

        def predicate(queries, keys):  # the mask on (query, key) indices of this call's tokens
            if stack is None:
                return layout.mask.mask_function(queries, keys, h)
            first, q_start, k_start = refs[2][0], refs[2][1], refs[2][2]
            return stack.base.mask_function(queries + q_start, keys + k_start, h + first)

        entry = steps_ref[row * extent + j]
        step_code, ki = STEP.code.read(entry), STEP.kv.read(entry)
        active = j < counts_ref[row]

        @pl.when(j == 0)
        def _():
            m_ref[...] = jnp.full(m_ref.shape, MASK_VALUE, jnp.float32)
            l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)
            acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)
            qs_ref[...] = (q_ref[...].astype(jnp.float32) * softmax.score_scale).astype(
                qs_ref.dtype
            )  # [bq, D]

        def fold_all(chunks):
            """Fold ``chunks`` in order, each chunk's scores issued ``lookahead`` chunks ahead, so the
            MXU has the next scores to compute while a chunk's max and exponentials wait on the last
            of its own. A chunk whose pair mask is evaluated (``Chunk.allowed``) is issued when it is
            folded, never ahead: the mask's iota and index temporaries beside every chunk's scores
            overflowed VMEM (the per-head SVG mix at 147,600 tokens on v6e). The mask-free updates
            around it are still issued ahead: a band's edge patterns on v6e (band 0.25, 2,048 x
            2,048, chunks of 256) take 6,523 and 6,254 bundles a step, against 8,060 and 8,255 with
            every update of the region in order."""
            scores = {}

            def issue(n, ahead=False):
                if n < len(chunks) and n not in scores and not (ahead and chunks[n].allowed is not None):
                    c = chunks[n]
                    scores[n] = _scores(k_ref[pl.ds(c.c0, c.size), :], qs_ref[c.lanes, :])

            for n in range(lookahead):
                issue(n, ahead=True)
            for n, c in enumerate(chunks):
                issue(n)
                issue(n + lookahead, ahead=True)
                _fold(
                    scores.pop(n),
                    v_ref[pl.ds(c.c0, c.size), :],
                    (m_ref, l_ref, acc_ref),
                    lanes=c.lanes,
                    score_scale_exp=softmax.exp,
                    register=register,
                    p_dtype=p_dtype,
                    allowed=None if c.allowed is None else c.allowed(),
                    keys_valid=None if c.keys_valid is None else c.keys_valid(),
                )

        def region(code):  # the steps of one code: a conditional region of the compiled step
            return pl.when(active & (step_code == code))

        if StepKind.FULL in present:

            @region(StepKind.FULL)
            def _():
                fold_all([Chunk(c0, chunk, lanes) for lanes in pieces(0, bq) for c0 in range(0, bkv, chunk)])

        if StepKind.RAGGED in present:

            @region(StepKind.RAGGED)
            def _():
                keys = [(c * chunk, chunk, None) for c in range(tail // chunk)]  # (c0, size, keys_valid)
                rem = tail % chunk
                if (
                    rem
                ):  # the last chunk sliced to the real rows (rounded up to the sublane tile, then masked)
                    size = min(chunk, round_up(rem, 2 * SUBLANES))
                    valid = None
                    if size != rem:
                        valid = lambda size=size: jax.lax.broadcasted_iota(jnp.int32, (size, 1), 0) < rem
                    keys.append((tail - rem, size, valid))
                fold_all(
                    [
                        Chunk(c0, size, lanes, keys_valid=valid)
                        for lanes in pieces(0, bq)
                        for c0, size, valid in keys
                    ]
                )

        if StepKind.MASKED in present:

            @region(StepKind.MASKED)
            def _():
                def allowed(c0, lanes):
                    if table:
                        return mask_ref[pl.ds(c0, chunk), lanes] != 0  # [C, n]
                    shape = (chunk, lanes.stop - lanes.start)
                    keys = ki * bkv + c0 + jax.lax.broadcasted_iota(jnp.int32, shape, 0)
                    queries = i * bq + lanes.start + jax.lax.broadcasted_iota(jnp.int32, shape, 1)
                    return predicate(queries, keys)

                def rows_ok(c0):  # the last kv block runs past the array: its stale rows are no keys
                    return ki * bkv + c0 + jax.lax.broadcasted_iota(jnp.int32, (chunk, 1), 0) < length

                fold_all(
                    [
                        Chunk(
                            c0,
                            chunk,
                            lanes,
                            allowed=_bind(allowed, (c0, lanes)),
                            keys_valid=_bind(rows_ok, (c0,)) if tail else None,
                        )
                        for lanes in [slice(0, bq)]  # whole tiles: folds of 256 queries cost it 54% on v6e
                        for c0 in range(0, bkv, chunk)
                    ],
                )

        for code in (c for c in present if c >= FIRST_PATTERN):
            pattern = steps.pattern(code)

            @region(code)
            def _(pattern=pattern):
                def keys_valid(k0, keys):  # the kv tile's padding slots are no keys
                    return valid_ref[pl.ds(k0, keys), :] != 0  # [C, 1]

                def allowed(k0, keys, lane0, lanes):  # a PARTIAL sub-tile: the mask on it only
                    queries = i * bq + lane0 + jax.lax.broadcasted_iota(jnp.int32, (keys, lanes), 1)
                    key_ids = ki * bkv + k0 + jax.lax.broadcasted_iota(jnp.int32, (keys, lanes), 0)
                    return predicate(queries, key_ids)

                fold_all(
                    [
                        Chunk(
                            k0,
                            keys,
                            slice(lane0, lane0 + lanes),
                            allowed=_bind(allowed, (k0, keys, lane0, lanes)) if masked else None,
                            keys_valid=_bind(keys_valid, (k0, keys)) if pattern.padded else None,
                        )
                        for k0, keys, lane0, lanes, masked in pattern.updates(bq, bkv, chunk)
                    ],
                )

        @pl.when(j == extent - 1)
        def _():
            m = m_ref[...][:1]  # [1, bq]
            l = l_ref[...][:1]  # [1, bq]
            seen = (m != MASK_VALUE) | jnp.isnan(l)  # a key was allowed, or the data is NaN
            inv = 1.0 / jnp.where(seen, l, 1.0)  # [1, bq]
            out_t = jnp.where(seen, acc_ref[...] * inv, 0.0)  # [D, bq]
            o_ref[...] = out_t.T.astype(o_ref.dtype)  # [bq, D]
            if with_lse:  # natural log, -inf where no key was seen: lane-dense [1, bq] (the backward's)
                log_l = (
                    jnp.log2(jnp.where(seen, l, 1.0)) if softmax.exp2 else jnp.log(jnp.where(seen, l, 1.0))
                )
                lse = (m + log_l) * (math.log(2.0) if softmax.exp2 else 1.0)
                lse_ref[0][...] = jnp.where(seen, lse, -jnp.inf)

    return kernel
