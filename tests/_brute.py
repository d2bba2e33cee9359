"""Independent brute-force definitions the tests pin the library against.

Everything here is written from the spec text (issue 2 and the public docstrings) with plain Python
ints and small numpy arrays; nothing calls stlib helpers except to read plain attributes, so a bug
in stlib cannot cancel itself out.
"""

from __future__ import annotations

import math

import numpy as np

# ------------------------------------------------------------------------------------------------
# grid coordinates


def coords(shape, i):
    """(t, y, x) of raster (frame-major) token i on a (T, Y, X) grid."""
    _, height, width = shape
    return i // (height * width), (i // width) % height, i % width


def spatial_index(shape, i):
    """Flattened spatial index y * X + x of raster token i."""
    _, height, width = shape
    return i % (height * width)


def dense_from_pred(length, pred):
    """bool [L, L] with out[q, k] = pred(q, k), one Python call per pair."""
    return np.array([[bool(pred(q, k)) for k in range(length)] for q in range(length)], dtype=bool).reshape(
        length, length
    )


# ------------------------------------------------------------------------------------------------
# neighbourhood attention (NATTEN / GNA), per axis


def natten_axis_keys(i, n, kernel, stride=1, dilation=1, causal=False):
    """Set of key positions on one axis of length n for query position i.

    Dilation d: the axis splits into the d groups of positions with equal remainder mod d; inside
    the query's group (group coordinate j = i // d, group size n_g) the window is
    [clamp(leader - kernel // 2, 0, n_g - kernel), + kernel), or causal [max(leader - kernel + 1, 0),
    leader]; the leader of a stride-s block is min((j // s) * s + s // 2, n_g - 1).
    """
    r = i % dilation
    group = list(range(r, n, dilation))  # positions of the query's group, in order
    n_g = len(group)
    j = group.index(i)
    leader = min((j // stride) * stride + stride // 2, n_g - 1)
    if causal:
        members = range(max(leader - kernel + 1, 0), leader + 1)
    else:
        start = min(max(leader - kernel // 2, 0), n_g - kernel)
        members = range(start, start + kernel)
    return {group[m] for m in members}


def natten_legacy_window_start(index, length, kernel_size, dilation):
    """NATTEN's original (v0.14) CPU reference ``get_window_start`` for odd kernels, stride 1,
    non-causal; a second, formula-independent oracle for the group formulation above."""
    nh = kernel_size // 2
    if dilation <= 1:
        return max(index - nh, 0) + (index + nh >= length) * (length - index - nh - 1)
    ni = index - nh * dilation
    if ni < 0:
        return index % dilation
    if index + nh * dilation >= length:
        imodd = index % dilation
        a = (length // dilation) * dilation
        b = length - a
        if imodd < b:
            return length - b + imodd - 2 * nh * dilation
        return a + imodd - kernel_size * dilation
    return ni


def _triple(v):
    return tuple(v) if isinstance(v, (tuple, list)) else (v, v, v)


def neighborhood_dense(shape, kernel_size, stride=1, dilation=1, causal=False):
    ks, st, dl, ca = _triple(kernel_size), _triple(stride), _triple(dilation), _triple(causal)
    axis_sets = [
        [natten_axis_keys(i, shape[a], ks[a], st[a], dl[a], ca[a]) for i in range(shape[a])] for a in range(3)
    ]
    length = shape[0] * shape[1] * shape[2]
    cs = [coords(shape, i) for i in range(length)]

    def pred(q, k):
        return all(cs[k][a] in axis_sets[a][cs[q][a]] for a in range(3))

    return dense_from_pred(length, pred)


# ------------------------------------------------------------------------------------------------
# sliding tile attention


def sliding_tile_dense(shape, tile, window):
    tile, window = _triple(tile), _triple(window)
    counts = [-(-n // s) for n, s in zip(shape, tile)]
    length = shape[0] * shape[1] * shape[2]
    cs = [coords(shape, i) for i in range(length)]

    def axis_ok(a, cq, ck):
        tq, tk = cq // tile[a], ck // tile[a]
        w = window[a]
        first = min(max(tq - w // 2, 0), counts[a] - w)  # centred on the query's tile, shifted inside
        return first <= tk < first + w

    return dense_from_pred(length, lambda q, k: all(axis_ok(a, cs[q][a], cs[k][a]) for a in range(3)))


# ------------------------------------------------------------------------------------------------
# Sparse VideoGen, radial, causal, global tokens


def band_width(length, density):
    """w = L * (1 - sqrt(1 - density)) rounded up to a multiple of 128 (at most L)."""
    w = length * (1.0 - math.sqrt(1.0 - density))
    return min(math.ceil(w / 128) * 128, length)


def spatial_dense(shape, frame_window, anchor=False):
    length = shape[0] * shape[1] * shape[2]

    def pred(q, k):
        tq, tk = coords(shape, q)[0], coords(shape, k)[0]
        return abs(tq - tk) <= frame_window or (anchor and tk == 0)

    return dense_from_pred(length, pred)


def temporal_dense(shape, spatial_window, anchor=False):
    length = shape[0] * shape[1] * shape[2]

    def pred(q, k):
        near = abs(spatial_index(shape, q) - spatial_index(shape, k)) <= spatial_window
        return near or (anchor and coords(shape, k)[0] == 0)

    return dense_from_pred(length, pred)


def spatial_band_dense(shape, density, anchor=False):
    length = shape[0] * shape[1] * shape[2]
    w = band_width(length, density)
    return dense_from_pred(length, lambda q, k: abs(q - k) <= w or (anchor and coords(shape, k)[0] == 0))


def token_major_position(shape, i):
    """Position of raster token i in token-major (y, x, t) order: spatial_index * T + t."""
    return spatial_index(shape, i) * shape[0] + coords(shape, i)[0]


def temporal_band_dense(shape, density, anchor=False):
    length = shape[0] * shape[1] * shape[2]
    w = band_width(length, density)

    def pred(q, k):
        near = abs(token_major_position(shape, q) - token_major_position(shape, k)) <= w
        return near or (anchor and coords(shape, k)[0] == 0)

    return dense_from_pred(length, pred)


def radial_dense(shape, spatial_window, sink=True):
    length = shape[0] * shape[1] * shape[2]

    def pred(q, k):
        d = abs(coords(shape, q)[0] - coords(shape, k)[0])
        halvings = math.floor(math.log2(d + 1))
        window = spatial_window // (2**halvings)
        near = abs(spatial_index(shape, q) - spatial_index(shape, k)) <= window
        return near or (sink and coords(shape, k)[0] == 0)

    return dense_from_pred(length, pred)


def frame_causal_dense(shape):
    length = shape[0] * shape[1] * shape[2]
    return dense_from_pred(length, lambda q, k: coords(shape, k)[0] <= coords(shape, q)[0])


def global_tokens_dense(inner_dense, count):
    """``count`` global tokens in front of an inner [L, L] or [H, L, L] mask."""
    inner = np.asarray(inner_dense)
    lead = inner.shape[:-2]
    length = inner.shape[-1] + count
    out = np.zeros(lead + (length, length), bool)
    for q in range(length):
        for k in range(length):
            if q < count or k < count:
                out[..., q, k] = True
            else:
                out[..., q, k] = inner[..., q - count, k - count]
    return out


def permuted_dense(base_dense, perm):
    """Mask seen in a token order: position i holds raster token perm[i]; -1 slots see nothing."""
    base = np.asarray(base_dense)
    n = len(perm)
    out = np.zeros(base.shape[:-2] + (n, n), bool)
    for i in range(n):
        for j in range(n):
            if perm[i] >= 0 and perm[j] >= 0:
                out[..., i, j] = base[..., perm[i], perm[j]]
    return out


# ------------------------------------------------------------------------------------------------
# tile layouts

EMPTY, PARTIAL, FULL = 0, 1, 2


def brute_layout(dense, valid, block_q, block_kv):
    """Everything block_layout promises, from a dense [Hl, L, L] mask and a validity vector [L]."""
    dense = np.asarray(dense)
    if dense.ndim == 2:
        dense = dense[None]
    heads, length, _ = dense.shape
    nq, nk = -(-length // block_q), -(-length // block_kv)
    counts = np.zeros((heads, nq, nk), np.int64)
    valid_pairs = np.zeros((nq, nk), np.int64)
    kinds = np.zeros((heads, nq, nk), np.int64)
    valid = np.asarray(valid, bool)
    for qi in range(nq):
        r0, r1 = qi * block_q, min((qi + 1) * block_q, length)
        for ki in range(nk):
            c0, c1 = ki * block_kv, min((ki + 1) * block_kv, length)
            # real pairs: padding slots (valid False) are not real
            valid_pairs[qi, ki] = int(valid[r0:r1].sum()) * int(valid[c0:c1].sum())
            for h in range(heads):
                c = int(dense[h, r0:r1, c0:c1].sum())
                counts[h, qi, ki] = c
                if c == 0:
                    kinds[h, qi, ki] = EMPTY
                elif c == valid_pairs[qi, ki]:
                    kinds[h, qi, ki] = FULL
                else:
                    kinds[h, qi, ki] = PARTIAL
    row_lists = [
        [[ki for ki in range(nk) if kinds[h, qi, ki] != EMPTY] for qi in range(nq)] for h in range(heads)
    ]
    steps = []
    for h in range(heads):
        for qi in range(nq):
            if row_lists[h][qi]:
                steps += [(h, qi, ki, int(kinds[h, qi, ki])) for ki in row_lists[h][qi]]
            else:
                steps.append((h, qi, 0, EMPTY))
    return {
        "counts": counts,
        "valid_pairs": valid_pairs,
        "kinds": kinds,
        "row_lists": row_lists,
        "steps": steps,
        "num_tokens": int(np.sum(valid)),
    }


# ------------------------------------------------------------------------------------------------
# attention


def attention_f64(q, k, v, dense=None, scale=None):
    """softmax(q k^T * scale) v in float64 with masking; rows that see no key give zeros."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    heads, length, dim = q.shape
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    if dense is None:
        dense = np.ones((length, length), bool)
    dense = np.broadcast_to(np.asarray(dense, bool), (heads, length, length))
    out = np.zeros((heads, length, v.shape[2]), np.float64)
    for h in range(heads):
        s = q[h] @ k[h].T * scale
        for i in range(length):
            allowed = dense[h, i]
            if not allowed.any():
                continue
            row = s[i, allowed]
            p = np.exp(row - row.max())
            out[h, i] = (p / p.sum()) @ v[h][allowed]
    return out
