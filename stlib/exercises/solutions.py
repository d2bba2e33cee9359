"""The library's solutions of the notebooks' fill-in exercises, one function per exercise, and a
known wrong answer for each.

Each solution is what ``@exercises.fill_in(name)`` hands back by default, and what
``exercises.show(name)`` prints. Its parameters are the stub's in the notebook. Names are
"<notebook number>.<what is written>". ``WRONG[name]`` lists (the mistake, in a few words, a function
that makes it): plausible first attempts that the exercise's check must answer NOT YET.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from stlib.reference import MASK_VALUE

SOLUTIONS: dict[str, Callable] = {}
WRONG: dict[str, list[tuple[str, Callable]]] = {}


def _solution(name: str):
    def register(function):
        SOLUTIONS[name] = function
        return function

    return register


def _wrong(name: str, mistake: str):
    def register(function):
        WRONG.setdefault(name, []).append((mistake, function))
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


@_wrong("04.combine", "adds the two states without rescaling them to the common max")
def combine_unscaled(m1, l1, acc1, m2, l2, acc2):
    return jnp.maximum(m1, m2), l1 + l2, acc1 + acc2


@_wrong("04.combine", "keeps the first state's max as the common one")
def combine_first_max(m1, l1, acc1, m2, l2, acc2):
    a2 = jnp.exp(m2 - m1)  # acc / l comes out right; m (and the next exponentials) do not
    return m1, l1 + a2 * l2, acc1 + a2 * acc2


def _lanes(x, width):
    """[rows, 128] lane-replicated -> [rows, width]."""
    return jnp.tile(x, (1, width // 128))


def _scores(q_ref, k_ref, scale):
    f32 = jnp.float32
    return (
        jax.lax.dot_general(q_ref[...], k_ref[...], (((1,), (1,)), ((), ())), preferred_element_type=f32)
        * scale
    )


def _update(s, v_ref, m_ref, l_ref, acc_ref, allowed):
    """The online-softmax update with scores s [bq, bkv]; ``allowed`` None: every score counts."""
    f32 = jnp.float32
    m_prev = m_ref[...]
    m_next = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))
    alpha = jnp.exp(m_prev - m_next)
    p = jnp.exp(s - _lanes(m_next, s.shape[1]))
    if allowed is not None:
        p = jnp.where(allowed, p, 0.0)  # a row with no allowed key yet would add exp(0) = 1 per key
    l_ref[...] = alpha * l_ref[...] + jnp.sum(p, axis=1, keepdims=True)
    m_ref[...] = m_next
    pv = jax.lax.dot_general(p, v_ref[...].astype(f32), (((1,), (0,)), ((), ())), preferred_element_type=f32)
    acc_ref[...] = _lanes(alpha, acc_ref.shape[1]) * acc_ref[...] + pv


@_solution("04.accumulate")
def accumulate(q_ref, k_ref, v_ref, m_ref, l_ref, acc_ref, allowed, *, scale):
    """The flash kernel's accumulate step under a mask: m, l lane-replicated [bq, 128] scratch, acc
    [bq, D], allowed bool [bq, bkv]. A refused score becomes a large negative number before the max,
    and its probability 0 after the exponential."""
    s = jnp.where(allowed, _scores(q_ref, k_ref, scale), MASK_VALUE)
    _update(s, v_ref, m_ref, l_ref, acc_ref, allowed)


@_wrong("04.accumulate", "ignores the mask (the unmasked update of flash_kernel)")
def accumulate_unmasked(q_ref, k_ref, v_ref, m_ref, l_ref, acc_ref, allowed, *, scale):
    _update(_scores(q_ref, k_ref, scale), v_ref, m_ref, l_ref, acc_ref, None)


@_wrong("04.accumulate", "keeps refused scores out of the max but not out of l and acc")
def accumulate_max_only(q_ref, k_ref, v_ref, m_ref, l_ref, acc_ref, allowed, *, scale):
    _update(jnp.where(allowed, _scores(q_ref, k_ref, scale), MASK_VALUE), v_ref, m_ref, l_ref, acc_ref, None)


@_wrong("04.accumulate", "zeroes refused probabilities but lets refused scores set the max")
def accumulate_sums_only(q_ref, k_ref, v_ref, m_ref, l_ref, acc_ref, allowed, *, scale):
    _update(_scores(q_ref, k_ref, scale), v_ref, m_ref, l_ref, acc_ref, allowed)


# ---------------------------------------------------------------------------------------------
# 05 · block-sparse, the Splash way


@_solution("05.kv_map")
def kv_map(i, j, steps_ref, nk):
    """The kv index map: the block (kv tile, 0) that step (i, j) names in the step table."""
    return (steps_ref[i * nk + j] >> 2, 0)


@_wrong("05.kv_map", "returns (j, 0), the dense kernel's map")
def kv_map_dense(i, j, steps_ref, nk):
    return (j, 0)


@_solution("05.frame_causal")
def frame_causal_allowed(rows, cols, tokens_per_frame):
    """A PARTIAL tile's predicate for frame-causal attention in raster (t, y, x) order: a query sees every
    key of its own frame and of earlier frames. rows, cols int32 [bq, bkv] token numbers (iota)."""
    return cols // tokens_per_frame <= rows // tokens_per_frame


@_wrong("05.frame_causal", "is causal per token (cols <= rows), not per frame")
def token_causal_allowed(rows, cols, tokens_per_frame):
    return cols <= rows


# ---------------------------------------------------------------------------------------------
# 06 · tile-aligned


@_solution("06.finish")
def finish(o_ref, lse_ref, m_ref, l_ref, acc_ref):
    """A pass's finalise step: o = acc / l and lse = m + log l; o = 0, lse = -inf for a row it never saw."""
    l = l_ref[...][:, :1]
    seen = l > 0
    o_ref[...] = jnp.where(seen, acc_ref[...] / jnp.where(seen, l, 1.0), 0.0)
    lse_ref[...] = jnp.where(seen, m_ref[...][:, :1] + jnp.log(jnp.where(seen, l, 1.0)), -jnp.inf)


@_wrong("06.finish", "divides by l without a guard for a row the pass never saw")
def finish_unguarded(o_ref, lse_ref, m_ref, l_ref, acc_ref):
    l = l_ref[...][:, :1]
    o_ref[...] = acc_ref[...] / l
    lse_ref[...] = m_ref[...][:, :1] + jnp.log(l)


@_solution("06.merge")
def merge(outputs, lses):
    """Any number of passes' outputs [L, D] and log-sum-exps [L, 1] (lists) -> attention over every
    pass's keys [L, D]; a row that no pass saw (every lse -inf) is 0."""
    lse = jax.nn.logsumexp(jnp.stack(lses), axis=0)  # [L, 1], -inf where no pass saw the row
    safe = jnp.where(jnp.isfinite(lse), lse, 0.0)
    return sum(jnp.exp(lse_i - safe) * o_i for o_i, lse_i in zip(outputs, lses, strict=True))


@_wrong("06.merge", "weighs each pass by exp(lse) over the sum of them, with no common max")
def merge_unshifted(outputs, lses):
    weights = [jnp.exp(lse_i) for lse_i in lses]
    return sum(w * o_i for w, o_i in zip(weights, outputs, strict=True)) / sum(weights)


@_wrong("06.merge", "guards the empty rows but weighs by exp(lse) with no common max")
def merge_unshifted_guarded(outputs, lses):
    weights = [jnp.exp(lse_i) for lse_i in lses]
    total = sum(weights)
    merged = sum(w * o_i for w, o_i in zip(weights, outputs, strict=True))
    return jnp.where(total > 0, merged / jnp.where(total > 0, total, 1.0), 0.0)


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


@_wrong("07.finish_with_lse", "returns the log-sum-exp in base 2")
def finish_with_lse_base2(m, l, acc, mask_value):
    seen = m != mask_value
    safe_l = jnp.where(seen, l, 1.0)
    return jnp.where(seen, acc / safe_l, 0.0).T, jnp.where(seen, m + jnp.log2(safe_l), -jnp.inf)


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


@_wrong("07.pattern_updates", "runs a whole sub-tile where chunks divide it")
def pattern_updates_whole(rows, grain, chunk):
    return pattern_updates(rows, grain, grain)


@_wrong("07.pattern_updates", "cuts a row only at skipped sub-tiles, not where the kind changes")
def pattern_updates_uncut(rows, grain, chunk):
    out = []
    for c, row in enumerate(rows):
        r = 0
        while r < len(row):
            start = r
            while r < len(row) and bool(row[r]) == bool(row[start]):
                r += 1
            if row[start]:  # one update for the run, masked if any of its sub-tiles is
                out.append((c * grain, grain, start * grain, (r - start) * grain, 2 in row[start:r]))
    return out


# ---------------------------------------------------------------------------------------------
# 09 · Sparse VideoGen routing


@_solution("09.band_pairs")
def band_pairs(length, width):
    """The (query, key) pairs that the band |q - k| <= width keeps in an L x L grid, ends counted:
    every row's 2w + 1 keys, less the two triangles that hang past the grid's ends (w(w + 1) / 2
    each)."""
    w = min(width, length - 1)
    return length * (2 * w + 1) - w * (w + 1)


@_wrong("09.band_pairs", "counts 2w + 1 keys in every row, the band's ends included")
def band_pairs_endless(length, width):
    return length * (2 * width + 1)


@_wrong("09.band_pairs", "counts the keys row by row (a loop over rows, not a closed form)")
def band_pairs_by_rows(length, width):
    rows = np.arange(length, dtype=np.int64)
    return int(np.sum(np.minimum(rows + width, length - 1) - np.maximum(rows - width, 0) + 1))


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


@_wrong("09.routing_error", "renormalises without a guard for a row the mask leaves empty")
def routing_error_unguarded(q_rows, k, allowed, scale):
    p = jax.nn.softmax(
        jnp.einsum("hsd,hld->hsl", q_rows, k, precision=jax.lax.Precision.HIGHEST) * scale, axis=-1
    )
    kept = jnp.where(allowed[None], p, 0.0)
    return jnp.mean((kept / jnp.sum(kept, axis=-1, keepdims=True) - p) ** 2, axis=(1, 2))


@_wrong("09.routing_error", "compares the kept probabilities without renormalising them")
def routing_error_unnormalised(q_rows, k, allowed, scale):
    p = jax.nn.softmax(
        jnp.einsum("hsd,hld->hsl", q_rows, k, precision=jax.lax.Precision.HIGHEST) * scale, axis=-1
    )
    return jnp.mean((jnp.where(allowed[None], p, 0.0) - p) ** 2, axis=(1, 2))


# ---------------------------------------------------------------------------------------------
# 10 · the backward


@_solution("10.transposed_table")
def transposed_table(selected, row_tables):
    """The dk / dv kernel's tables from the forward's selected tiles [H, nq, nk]: for each kv tile,
    the q tiles that see it, in increasing order (``row_tables`` compacts the rows of a table)."""
    return row_tables(np.ascontiguousarray(selected.transpose(0, 2, 1)))


@_wrong("10.transposed_table", "returns the forward's own table, untransposed")
def untransposed_table(selected, row_tables):
    return row_tables(selected)


@_solution("10.dq_step")
def dq_step(q_t, k_t, v_t, do_t, lse, di, allowed, scale):
    """One (q tile, kv tile) step of the dq kernel: q_t, do_t [bq, D], k_t, v_t [bkv, D], lse, di
    [bq, 1], allowed bool [bq, bkv] -> what this kv tile adds to dq [bq, D]."""
    p = jnp.where(allowed, jnp.exp((q_t @ k_t.T) * scale - lse), 0.0)  # P rebuilt from lse
    ds = p * (do_t @ v_t.T - di)  # dS = P * (dP - di)
    return (ds @ k_t) * scale


@_wrong("10.dq_step", "leaves out the scale that the scores were multiplied by")
def dq_step_unscaled(q_t, k_t, v_t, do_t, lse, di, allowed, scale):
    p = jnp.where(allowed, jnp.exp((q_t @ k_t.T) * scale - lse), 0.0)
    return (p * (do_t @ v_t.T - di)) @ k_t


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


@_wrong("11.head_order", "keeps the heads in their own order")
def head_order_unchanged(kinds, num_devices):
    return list(range(len(kinds)))


@_solution("11.all_to_all_bytes")
def all_to_all_bytes(num_heads, length, head_dim, num_devices, itemsize):
    """Bytes per device of one Ulysses all-to-all of q (or k, v, o): each device holds [H, L / N, D]
    before and [H / N, L, D] after; the operand is the device's share either way."""
    return num_heads * (length // num_devices) * head_dim * itemsize


@_wrong("11.all_to_all_bytes", "counts the whole array, not one device's share")
def all_to_all_bytes_whole(num_heads, length, head_dim, num_devices, itemsize):
    return num_heads * length * head_dim * itemsize
