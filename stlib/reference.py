"""Plain attention (materialised scores) and a blocked XLA flash attention that skips empty tiles.

Conventions shared by every implementation: q, k, v are [H, L, D]; scores accumulate in float32;
the output has q's dtype; a query row that sees no key returns zeros (never NaN).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from stlib._intmath import array_module
from stlib.layout import BlockLayout

HIGHEST = jax.lax.Precision.HIGHEST
#: Finite "minus infinity" for masked scores, so that exp(m_old - m_new) never sees inf - inf.
MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)


def reference_attention(q, k, v, dense_mask, scale: float):
    """softmax(q k^T * scale, masked) v with the whole [H, L, L] score matrix in float32.

    ``dense_mask``: None, bool [L, L] or [H, L, L].
    """
    return reference_attention_lse(q, k, v, dense_mask, scale)[0]


def _scores(q, k, dense_mask, scale: float):
    s = (
        jnp.einsum(
            "hqd,hkd->hqk", q.astype(jnp.float32), k.astype(jnp.float32), precision=jax.lax.Precision.HIGHEST
        )
        * scale
    )
    return s if dense_mask is None else jnp.where(jnp.asarray(dense_mask), s, -jnp.inf)


def reference_attention_lse(q, k, v, dense_mask, scale: float):
    """(o in q's dtype, lse [H, Lq, 1] f32: natural log, -inf for rows that see nothing) of
    ``reference_attention``: what a partial result over some keys carries to be merged
    (``merge_partials``). k and v may have other lengths than q (a block of keys)."""
    s = _scores(q, k, dense_mask, scale)
    m = jnp.max(s, axis=-1, keepdims=True)
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    p = jnp.exp(s - m)  # exactly 0 where masked
    l = jnp.sum(p, axis=-1, keepdims=True)
    o = jnp.einsum("hqk,hkd->hqd", p, v.astype(jnp.float32), precision=jax.lax.Precision.HIGHEST)
    o = o / jnp.where(l > 0, l, 1.0)  # NaN stays NaN
    if dense_mask is not None:  # rows the mask leaves empty are zeros, whatever v holds
        xp = array_module(dense_mask)  # on the host for a numpy mask: no [L, L] constant to fold
        o = jnp.where(jnp.asarray(xp.any(dense_mask, axis=-1, keepdims=True)), o, 0.0)
    lse = jnp.where(l > 0, m + jnp.log(jnp.where(l > 0, l, 1.0)), -jnp.inf)
    return o.astype(q.dtype), lse


def reference_gradients(q, k, v, o, lse, do, dense_mask, scale: float):
    """(dq, dk, dv), each in its input's dtype, of attention over the keys k, v given the output
    ``o`` and log-sum-exp ``lse`` [H, Lq, 1] of the whole call (which may span more keys than k, v:
    the flash backward's decomposition): P = exp(S - lse), dV = P^T dO, dS = P * (dO V^T - di) with
    di = rowsum(dO * O), dQ = scale dS K, dK = scale dS^T Q."""
    p = jnp.exp(_scores(q, k, dense_mask, scale) - jnp.where(jnp.isfinite(lse), lse, jnp.inf))
    do32, f32 = do.astype(jnp.float32), jnp.float32
    di = jnp.sum(do32 * o.astype(f32), axis=-1, keepdims=True)
    ds = p * (jnp.einsum("hqd,hkd->hqk", do32, v.astype(f32), precision=HIGHEST) - di)
    dq = jnp.einsum("hqk,hkd->hqd", ds, k.astype(f32), precision=HIGHEST) * scale
    dk = jnp.einsum("hqk,hqd->hkd", ds, q.astype(f32), precision=HIGHEST) * scale
    dv = jnp.einsum("hqk,hqd->hkd", p, do32, precision=HIGHEST)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)


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


def xla_block_sparse_attention(q, k, v, layout: BlockLayout, scale: float):
    """Flash attention in plain jnp that visits only the non-empty kv tiles of each q tile.

    Sequential over (head, q tile), scanning the row's kv-tile list (as long as the longest row)
    with a ``cond`` that skips the slots past the row's count, so the work really drops with
    occupancy on CPU / GPU and reverse-mode differentiation works (a scan, not a loop with a
    dynamic trip count). PARTIAL (and padded) tiles take their mask from a deduplicated table; FULL
    tiles run mask-free.
    """
    num_heads, length, head_dim = q.shape
    bq, bkv = layout.block_q, layout.block_kv
    nq, nk = layout.grid_shape
    blocks, index = layout.tile_mask_table(layout.masked_tiles)
    blocks = jnp.asarray(np.concatenate([blocks, np.ones((1, bq, bkv), bool)]))  # last: mask-free
    tile_block = np.take_along_axis(index, layout.row_kv_tiles, axis=2)  # [Hl, nq, W]
    tile_block = jnp.asarray(np.where(tile_block >= 0, tile_block, blocks.shape[0] - 1))
    row_tiles = jnp.asarray(layout.row_kv_tiles)
    row_counts = jnp.asarray(layout.row_counts)
    shared = layout.num_heads == 1
    mask_free = blocks.shape[0] - 1

    qp = jnp.pad(q, ((0, 0), (0, nq * bq - length), (0, 0))).reshape(num_heads, nq, bq, head_dim)
    kp = jnp.pad(k, ((0, 0), (0, nk * bkv - length), (0, 0))).reshape(num_heads, nk, bkv, head_dim)
    vp = jnp.pad(v, ((0, 0), (0, nk * bkv - length), (0, 0))).reshape(num_heads, nk, bkv, head_dim)

    def one_row(hq):
        h, qi = hq // nq, hq % nq
        hl = 0 if shared else h
        q_tile = qp[h, qi].astype(jnp.float32) * scale  # [bq, D]

        def update(carry, s, allowed, ki):
            m, l, acc = carry
            if allowed is not None:
                s = jnp.where(allowed, s, MASK_VALUE)
            m_new = jnp.maximum(m, s.max(axis=1))
            p = jnp.exp(s - m_new[:, None])
            if allowed is not None:
                p = jnp.where(allowed, p, 0.0)
            alpha = jnp.exp(m - m_new)
            pv = jnp.dot(p, vp[h, ki].astype(jnp.float32), precision=HIGHEST)  # [bq, D]
            return m_new, alpha * l + p.sum(axis=1), alpha[:, None] * acc + pv

        def visit(carry, j):
            ki = row_tiles[hl, qi, j]
            s = jnp.dot(q_tile, kp[h, ki].astype(jnp.float32).T, precision=HIGHEST)  # [bq, bkv]
            b = tile_block[hl, qi, j]
            return jax.lax.cond(
                b == mask_free,
                lambda: update(carry, s, None, ki),
                lambda: update(carry, s, blocks[b], ki),
            )

        def step(carry, j):
            carry = jax.lax.cond(j < row_counts[hl, qi], visit, lambda c, _: c, carry, j)
            return carry, None

        # ``*_like`` of the q tile: inside a shard_map the carry then varies over the mesh axes as
        # the row's values do (its type must match what a visited step returns)
        init = (
            jnp.full_like(q_tile[:, 0], MASK_VALUE),
            jnp.zeros_like(q_tile[:, 0]),
            jnp.zeros_like(q_tile),
        )
        (_, l, acc), _ = jax.lax.scan(step, init, jnp.arange(row_tiles.shape[2]))
        return acc / jnp.where(l > 0, l, 1.0)[:, None]

    out = jax.lax.map(one_row, jnp.arange(num_heads * nq))  # [H * nq, bq, D]
    return out.reshape(num_heads, nq * bq, head_dim)[:, :length].astype(q.dtype)
