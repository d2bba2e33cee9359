"""The online-softmax tile update every flash-style stlib kernel runs, and the merge of two partial
results by their log-sum-exp.

Per q tile a kernel keeps float32 running max ``m`` and sum ``l`` ([block_q, 128], lane-replicated)
and an accumulator ``acc`` [block_q, D] in VMEM scratch (``softmax_scratch``), starts them with
``init_row``, folds each kv tile in with ``update_tile`` (``block_kv_compute`` keys at a time) and
writes the row with ``finish_row``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from stlib._intmath import cdiv
from stlib.device import LANES
from stlib.reference import MASK_VALUE

LOG2_E = math.log2(math.e)


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


def lanes(x, width: int):
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
        p = options.exp(s - lanes(m_next, chunk))  # [bq, chunk]
        if allowed is not None:
            p = jnp.where(allowed, p, 0.0)
        alpha = options.exp(m_prev - m_next)  # [bq, 128]
        l_ref[...] = alpha * l_ref[...] + jnp.sum(p, axis=1, keepdims=True)
        m_ref[...] = m_next
        pv = jax.lax.dot_general(
            p, v.astype(jnp.float32), (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32
        )  # [bq, D]
        acc_ref[...] = lanes(alpha, acc_ref.shape[1]) * acc_ref[...] + pv
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
