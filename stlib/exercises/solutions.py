"""The library's solutions of the notebooks' fill-in exercises, one function per exercise.

Each is what ``@exercises.fill_in(name)`` hands back by default, and what ``exercises.show(name)``
prints. Its parameters are the stub's in the notebook. Names are "<notebook number>.<what is written>".
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from stlib.masks import band_width_for_density

SOLUTIONS: dict[str, Callable] = {}


def _solution(name: str):
    def register(function):
        SOLUTIONS[name] = function
        return function

    return register


# ---------------------------------------------------------------------------------------------
# 04 · flash attention


@_solution("04.combine")
def combine(m1, l1, acc1, m2, l2, acc2):
    """Two online-softmax states over disjoint key sets (m, l [bq, 1], acc [bq, D], each under its own
    running max) -> the state over both key sets: rescale each to the common max, then add."""
    m = jnp.maximum(m1, m2)
    a1, a2 = jnp.exp(m1 - m), jnp.exp(m2 - m)
    return m, a1 * l1 + a2 * l2, a1 * acc1 + a2 * acc2


@_solution("04.accumulate")
def accumulate(q_ref, k_ref, v_ref, m_ref, l_ref, acc_ref, *, scale):
    """The flash kernel's accumulate step: m, l lane-replicated [bq, 128] scratch, acc [bq, D]."""
    f32 = jnp.float32

    def lanes(x, width):  # [rows, 128] lane-replicated -> [rows, width]
        return jnp.tile(x, (1, width // 128))

    s = (
        jax.lax.dot_general(q_ref[...], k_ref[...], (((1,), (1,)), ((), ())), preferred_element_type=f32)
        * scale
    )
    m_prev = m_ref[...]
    m_next = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))
    alpha = jnp.exp(m_prev - m_next)
    p = jnp.exp(s - lanes(m_next, s.shape[1]))
    l_ref[...] = alpha * l_ref[...] + jnp.sum(p, axis=1, keepdims=True)
    m_ref[...] = m_next
    pv = jax.lax.dot_general(p, v_ref[...].astype(f32), (((1,), (0,)), ((), ())), preferred_element_type=f32)
    acc_ref[...] = lanes(alpha, acc_ref.shape[1]) * acc_ref[...] + pv


# ---------------------------------------------------------------------------------------------
# 05 · block-sparse, the Splash way


@_solution("05.kv_map")
def kv_map(i, j, steps_ref, nk):
    """The kv index map: the block (kv tile, 0) that step (i, j) names in the step table."""
    return (steps_ref[i * nk + j] >> 2, 0)


@_solution("05.frame_causal")
def frame_causal_allowed(rows, cols, tokens_per_frame):
    """A PARTIAL tile's predicate for frame-causal attention in raster (t, y, x) order: a query sees every
    key of its own frame and of earlier frames. rows, cols int32 [bq, bkv] token numbers (iota)."""
    return cols // tokens_per_frame <= rows // tokens_per_frame


# ---------------------------------------------------------------------------------------------
# 06 · tile-aligned


@_solution("06.finish")
def finish(o_ref, lse_ref, m_ref, l_ref, acc_ref):
    """A pass's finalise step: o = acc / l and lse = m + log l; o = 0, lse = -inf for a row it never saw."""
    l = l_ref[...][:, :1]
    seen = l > 0
    o_ref[...] = jnp.where(seen, acc_ref[...] / jnp.where(seen, l, 1.0), 0.0)
    lse_ref[...] = jnp.where(seen, m_ref[...][:, :1] + jnp.log(jnp.where(seen, l, 1.0)), -jnp.inf)


@_solution("06.merge")
def merge(o1, lse1, o2, lse2):
    """Two passes' outputs [L, D] and log-sum-exps [L, 1] -> attention over both passes' keys [L, D].
    A row that neither pass saw (both lse -inf) is 0."""
    lse = jnp.logaddexp(lse1, lse2)
    safe = jnp.where(jnp.isfinite(lse), lse, 0.0)
    return jnp.exp(lse1 - safe) * o1 + jnp.exp(lse2 - safe) * o2


# ---------------------------------------------------------------------------------------------
# 07 · the second-generation kernel


@_solution("07.finish_with_lse")
def finish_with_lse(m, l, acc, mask_value):
    """The lane-dense finalise step with the log-sum-exp the backward needs: m, l [1, bq] the base-2
    running max and sum (scores scaled by log2 e), acc [D, bq] the unnormalised o^T -> (o [bq, D],
    lse [1, bq] in the natural log); a row that saw no key (m still ``mask_value``): o 0, lse -inf."""
    seen = m != mask_value
    safe_l = jnp.where(seen, l, 1.0)
    o = jnp.where(seen, acc / safe_l, 0.0).T
    lse = jnp.where(seen, (m + jnp.log2(safe_l)) * math.log(2.0), -jnp.inf)  # log2 -> natural log
    return o, lse


@_solution("07.pattern_updates")
def pattern_updates(rows, grain, chunk):
    """A pattern region's updates: ``rows[c][r]`` says how kv sub-tile c meets q sub-tile r (0 skip,
    1 run mask-free, 2 run masked) -> (first key, keys, first query lane, lanes, masked) per update:
    each kv sub-tile against each run of consecutive q sub-tiles of one kind, in pieces of ``chunk``
    keys where ``chunk`` divides ``grain`` (else the whole sub-tile)."""
    piece = chunk if grain % chunk == 0 else grain
    out = []
    for c, row in enumerate(rows):
        r = 0
        while r < len(row):
            start, kind = r, row[r]
            while r < len(row) and row[r] == kind:
                r += 1
            if kind:
                out += [
                    (c * grain + p, piece, start * grain, (r - start) * grain, kind == 2)
                    for p in range(0, grain, piece)
                ]
    return out


# ---------------------------------------------------------------------------------------------
# 09 · Sparse VideoGen routing


# the library's own rule is the answer: w = L * (1 - sqrt(1 - density)), rounded up to whole kv tiles
SOLUTIONS["09.band_width"] = band_width_for_density


@_solution("09.routing_error")
def routing_error(q_rows, k, allowed, scale):
    """One candidate mask's error against dense attention on sampled query rows: q_rows [H, S, D],
    k [H, L, D], allowed bool [S, L] -> [H]: the mean over rows and keys of the squared difference
    between the masked softmax (the dense probabilities the mask keeps, renormalised) and the dense one."""
    p = jax.nn.softmax(
        jnp.einsum("hsd,hld->hsl", q_rows, k, precision=jax.lax.Precision.HIGHEST) * scale, axis=-1
    )
    kept = jnp.where(allowed[None], p, 0.0)
    mass = jnp.sum(kept, axis=-1, keepdims=True)
    return jnp.mean((kept / jnp.where(mass > 0, mass, 1.0) - p) ** 2, axis=(1, 2))


# ---------------------------------------------------------------------------------------------
# 10 · the backward


@_solution("10.transposed_table")
def transposed_table(selected, row_tables):
    """The dk / dv kernel's tables from the forward's selected tiles [H, nq, nk]: for each kv tile,
    the q tiles that see it, in increasing order (``row_tables`` compacts the rows of a table)."""
    return row_tables(np.ascontiguousarray(selected.transpose(0, 2, 1)))


@_solution("10.dq_step")
def dq_step(q_t, k_t, v_t, do_t, lse, di, allowed, scale):
    """One (q tile, kv tile) step of the dq kernel: q_t, do_t [bq, D], k_t, v_t [bkv, D], lse, di
    [bq, 1], allowed bool [bq, bkv] -> what this kv tile adds to dq [bq, D]."""
    p = jnp.where(allowed, jnp.exp((q_t @ k_t.T) * scale - lse), 0.0)  # P rebuilt from lse
    ds = p * (do_t @ v_t.T - di)  # dS = P * (dP - di)
    return (ds @ k_t) * scale


# ---------------------------------------------------------------------------------------------
# 11 · one chip to a slice


@_solution("11.head_order")
def head_order(kinds, num_devices):
    """A permutation of the heads that gives every device the same list of kinds (here: one spatial,
    one temporal head each), so every device runs one branch. kinds: one name per head."""
    groups = {}
    for head, kind in enumerate(kinds):
        groups.setdefault(kind, []).append(head)
    share = {kind: len(heads) // num_devices for kind, heads in groups.items()}  # per device, per kind
    return [
        groups[kind][d * share[kind] + n]
        for d in range(num_devices)
        for kind in groups
        for n in range(share[kind])
    ]


@_solution("11.all_to_all_bytes")
def all_to_all_bytes(num_heads, length, head_dim, num_devices, itemsize):
    """Bytes per device of one Ulysses all-to-all of q (or k, v, o): each device holds [H, L / N, D]
    before and [H / N, L, D] after; the operand is the device's share either way."""
    return num_heads * (length // num_devices) * head_dim * itemsize
