"""Attention masks for video tokens, evaluated lazily: "may query i see key j", never as L x L.

Every mask answers three questions, each without materialising L x L:

* ``allowed(q, k, head)``: a vectorised predicate on broadcastable integer index arrays (numpy, or
  jax arrays inside a kernel when ``mask.traceable``);
* ``block(q0, q1, k0, k1, head)``: one [q1-q0, k1-k0] bool block;
* ``key_intervals(rows, head)``: for each query row the allowed keys as disjoint half-open
  intervals ``[start, end)``, shape [n, K] each (every mask in its own order except permuted
  views, whose layouts use the base mask's intervals and the permutation instead). Layouts count
  allowed pairs per tile from these (see layout.py): a 75,600-token grid is classified in a second.

Masks compose with ``&`` and ``|`` and can be viewed in another token order with ``permute``.
Indices are those of the mask's own sequence (raster order for video builders).
"""

from __future__ import annotations

import math

import numpy as np

from stlib._checks import (
    check_bool_triple,
    check_fraction,
    check_positive_int,
    check_positive_triple,
)
from stlib._intmath import div, floordiv, mod
from stlib.geometry import TokenOrder, VideoGrid

#: Largest L for which ``to_dense`` / brute-force fallbacks materialise L x L.
DENSE_LIMIT = 16_384
#: A per-head mask is evaluated in-kernel only with at most this many distinct head masks.
MAX_TRACED_HEAD_MASKS = 4


def _xp(*arrays):
    """numpy for numpy inputs, jax.numpy when any input is a jax array (inside a kernel)."""
    for a in arrays:
        if type(a).__module__.startswith("jax"):
            import jax.numpy as jnp

            return jnp
    return np


class Mask:
    """Base class. Subclasses set ``length`` and ``num_heads`` and implement ``_allowed``."""

    length: int
    num_heads: int | None = None  # None: the same mask for every head
    traceable: bool = False  # _allowed works on jax arrays (so a kernel can evaluate it from iota)
    has_intervals: bool = True

    @property
    def shape(self) -> tuple[int, int]:
        return (self.length, self.length)

    # --- evaluation -------------------------------------------------------------------------
    def allowed(self, q, k, head: int = 0):
        """bool array broadcast from integer index arrays ``q`` and ``k`` (each in [0, L)).
        Raises ValueError for an index out of range or a bad head."""
        self._check_head(head)
        if _xp(q, k) is np:
            q, k = np.asarray(q), np.asarray(k)
            for name, idx in (("q", q), ("k", k)):
                if not np.issubdtype(idx.dtype, np.integer):
                    raise TypeError(f"{name} indices must be integers, got {idx.dtype}")
                if idx.size and (idx.min() < 0 or idx.max() >= self.length):
                    raise ValueError(f"{name} indices must lie in [0, {self.length}), got [{idx.min()}, {idx.max()}]")
        return self._allowed(q, k, head)

    def _allowed(self, q, k, head):
        raise NotImplementedError

    def block(self, q0: int, q1: int, k0: int, k1: int, head: int = 0) -> np.ndarray:
        """bool [q1-q0, k1-k0]: the mask on rows q0:q1 and columns k0:k1."""
        for name, lo, hi in (("q", q0, q1), ("k", k0, k1)):
            if not (0 <= lo <= hi <= self.length):
                raise ValueError(f"block {name} range [{lo}, {hi}) is outside [0, {self.length})")
        q = np.arange(q0, q1)[:, None]
        k = np.arange(k0, k1)[None, :]
        return np.broadcast_to(self.allowed(q, k, head), (q1 - q0, k1 - k0)).copy()

    def key_intervals(self, rows: np.ndarray, head: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Allowed keys of each query row as disjoint intervals: (start, end), int64 [n, K] each."""
        self._check_head(head)
        if not self.has_intervals:
            raise NotImplementedError(f"{type(self).__name__} has no interval form; build its layout densely")
        starts, ends = self._intervals(np.asarray(rows, dtype=np.int64), head)
        return starts, np.maximum(ends, starts)

    def _intervals(self, rows, head):
        raise NotImplementedError

    def to_dense(self) -> np.ndarray:
        """bool [L, L], or [H, L, L] for per-head masks. Only for L <= DENSE_LIMIT."""
        if self.length > DENSE_LIMIT:
            raise ValueError(
                f"to_dense() would materialise {self.length}^2 = {self.length**2:.3g} pairs per head; "
                f"it is limited to L <= {DENSE_LIMIT}. Use block() or stlib.block_layout instead."
            )
        if self.num_heads is None:
            return self.block(0, self.length, 0, self.length)
        return np.stack([self.block(0, self.length, 0, self.length, h) for h in range(self.num_heads)])

    def token_validity(self) -> np.ndarray | None:
        """bool [L]: False at padding slots (of a permuted view inside this mask); None if every
        token is real."""
        return None

    def _check_head(self, head):
        if self.num_heads is not None and not (0 <= head < self.num_heads):
            raise ValueError(f"head={head} is out of range for a mask with {self.num_heads} heads")

    # --- combinators ------------------------------------------------------------------------
    def __and__(self, other: Mask) -> Mask:
        return _Combined(self, other, "and")

    def __or__(self, other: Mask) -> Mask:
        return _Combined(self, other, "or")

    def permute(self, order: TokenOrder) -> Mask:
        """This mask seen in another token order (padding slots see and are seen by nothing)."""
        return PermutedMask(self, order)

    def head(self, index: int) -> Mask:
        """The single-head mask of head ``index`` (the mask itself when it is head-uniform)."""
        self._check_head(index)
        return self if self.num_heads is None else _HeadView(self, index)

    def __repr__(self):
        heads = "" if self.num_heads is None else f", heads={self.num_heads}"
        return f"{type(self).__name__}(L={self.length}{heads})"


# --------------------------------------------------------------------------------------------
# interval helpers (all vectorised over rows)


def _union_intervals(starts, ends):
    """Make [n, K] intervals disjoint: sort by start, keep only what earlier intervals left."""
    order = np.argsort(starts, axis=1, kind="stable")
    s = np.take_along_axis(starts, order, axis=1)
    e = np.take_along_axis(ends, order, axis=1)
    e = np.where(e > s, e, s)
    reach = np.maximum.accumulate(e, axis=1)
    prev = np.concatenate([np.full((s.shape[0], 1), np.iinfo(np.int64).min), reach[:, :-1]], axis=1)
    new_s = np.maximum(s, prev)
    return new_s, np.maximum(e, new_s)


def _intersect_intervals(s1, e1, s2, e2):
    s = np.maximum(s1[:, :, None], s2[:, None, :]).reshape(s1.shape[0], -1)
    e = np.minimum(e1[:, :, None], e2[:, None, :]).reshape(s1.shape[0], -1)
    return s, np.maximum(e, s)


def _and_validity(a, b):
    if a is None or b is None:
        return b if a is None else a
    return a & b


def _merge_heads(a: Mask, b: Mask) -> int | None:
    if a.num_heads is not None and b.num_heads is not None and a.num_heads != b.num_heads:
        raise ValueError(f"cannot combine masks with {a.num_heads} and {b.num_heads} heads")
    return a.num_heads if a.num_heads is not None else b.num_heads


class _Combined(Mask):
    def __init__(self, a: Mask, b: Mask, op: str):
        if not isinstance(a, Mask) or not isinstance(b, Mask):
            raise TypeError(f"can only combine Mask objects, got {type(a).__name__} and {type(b).__name__}")
        if a.length != b.length:
            raise ValueError(f"cannot combine masks of lengths {a.length} and {b.length}")
        self.a, self.b, self.op = a, b, op
        self.length = a.length
        self.num_heads = _merge_heads(a, b)
        self.traceable = a.traceable and b.traceable
        self.has_intervals = a.has_intervals and b.has_intervals

    def token_validity(self):
        return _and_validity(self.a.token_validity(), self.b.token_validity())

    def _allowed(self, q, k, head):
        x, y = self.a._allowed(q, k, head), self.b._allowed(q, k, head)
        return (x & y) if self.op == "and" else (x | y)

    def _intervals(self, rows, head):
        s1, e1 = self.a.key_intervals(rows, head)
        s2, e2 = self.b.key_intervals(rows, head)
        if self.op == "and":
            return _intersect_intervals(s1, e1, s2, e2)
        return _union_intervals(np.concatenate([s1, s2], axis=1), np.concatenate([e1, e2], axis=1))

    def __repr__(self):
        return f"({self.a!r} {'&' if self.op == 'and' else '|'} {self.b!r})"


class _HeadView(Mask):
    def __init__(self, mask: Mask, index: int):
        self.mask, self.index = mask, index
        self.length, self.traceable, self.has_intervals = mask.length, mask.traceable, mask.has_intervals

    def token_validity(self):
        return self.mask.token_validity()

    def _allowed(self, q, k, head):
        return self.mask._allowed(q, k, self.index)

    def _intervals(self, rows, head):
        return self.mask.key_intervals(rows, self.index)


class PermutedMask(Mask):
    """``base`` viewed in ``order``: position i holds raster token ``order.perm[i]``."""

    has_intervals = False  # layouts use base intervals + the permutation (layout.py)

    def __init__(self, base: Mask, order: TokenOrder):
        if not isinstance(order, TokenOrder):
            raise TypeError(f"order must be a TokenOrder, got {type(order).__name__}")
        if order.num_tokens != base.length:
            raise ValueError(f"order {order.name!r} permutes {order.num_tokens} tokens, the mask has {base.length}")
        self.base, self.order = base, order
        self.length = order.length
        self.num_heads = base.num_heads
        # traceable when the order has an arithmetic form (raster, token-major, padded tiled)
        self.traceable = base.traceable and order.raster_of is not None

    def head(self, index):
        self._check_head(index)
        return self if self.num_heads is None else PermutedMask(self.base.head(index), self.order)

    def token_validity(self):
        return self.order.valid

    def _allowed(self, q, k, head):
        xp = _xp(q, k)
        if xp is np:
            pq, pk = self.order.perm[q], self.order.perm[k]
        else:
            pq, pk = self.order.raster_of(q), self.order.raster_of(k)
        ok = self.base._allowed(xp.maximum(pq, 0), xp.maximum(pk, 0), head)
        return ok & (pq >= 0) & (pk >= 0)

    def __repr__(self):
        return f"{self.base!r}.permute({self.order.name!r})"


# --------------------------------------------------------------------------------------------
# plain sequence masks


class FullMask(Mask):
    traceable = True

    def __init__(self, length: int):
        self.length = check_positive_int("length", length)

    def _allowed(self, q, k, head):
        xp = _xp(q, k)
        return xp.ones(xp.broadcast_shapes(xp.shape(q), xp.shape(k)), dtype=bool)

    def _intervals(self, rows, head):
        n = rows.shape[0]
        return np.zeros((n, 1), np.int64), np.full((n, 1), self.length, np.int64)


class BandMask(Mask):
    """|q - k| <= width."""

    traceable = True

    def __init__(self, length: int, width: int):
        self.length = check_positive_int("length", length)
        self.width = check_positive_int("width", width, allow_zero=True)

    def _allowed(self, q, k, head):
        return abs(q - k) <= self.width

    def _intervals(self, rows, head):
        s = np.maximum(rows - self.width, 0)
        e = np.minimum(rows + self.width + 1, self.length)
        return s[:, None], e[:, None]

    def __repr__(self):
        return f"BandMask(L={self.length}, width={self.width})"


class ArrayMask(Mask):
    """An explicit bool [L, L] or [H, L, L] array."""

    def __init__(self, array):
        array = np.asarray(array)
        if array.dtype != bool:
            raise TypeError(f"from_array expects a bool array, got dtype {array.dtype}")
        if array.ndim not in (2, 3) or array.shape[-1] != array.shape[-2]:
            raise ValueError(f"from_array expects [L, L] or [H, L, L], got shape {array.shape}")
        self.array = array
        self.length = array.shape[-1]
        self.num_heads = array.shape[0] if array.ndim == 3 else None

    def _dense(self, head):
        return self.array if self.array.ndim == 2 else self.array[head]

    def _allowed(self, q, k, head):
        return self._dense(head)[q, k]

    def _intervals(self, rows, head):
        return _runs(self._dense(head)[rows])


def _runs(rows_bool: np.ndarray):
    """Run-length intervals of each row of a bool [n, L] array, padded with empty intervals."""
    n, length = rows_bool.shape
    padded = np.zeros((n, length + 2), dtype=np.int8)
    padded[:, 1:-1] = rows_bool
    edges = np.diff(padded, axis=1)
    r_s, c_s = np.nonzero(edges == 1)
    r_e, c_e = np.nonzero(edges == -1)
    counts = np.bincount(r_s, minlength=n)
    width = max(int(counts.max()) if n else 0, 1)
    slot = np.arange(r_s.size) - np.repeat(np.cumsum(counts) - counts, counts)
    starts = np.zeros((n, width), np.int64)
    ends = np.zeros((n, width), np.int64)
    starts[r_s, slot] = c_s
    ends[r_e, slot] = c_e
    return starts, ends


class MultiHeadMask(Mask):
    """A different mask per head."""

    def __init__(self, masks):
        masks = list(masks)
        if not masks:
            raise ValueError("per_head needs at least one mask")
        for i, m in enumerate(masks):
            if not isinstance(m, Mask):
                raise TypeError(f"per_head: entry {i} is a {type(m).__name__}, not a Mask")
            if m.num_heads is not None:
                raise ValueError(f"per_head: entry {i} is already a {m.num_heads}-head mask")
            if m.length != masks[0].length:
                raise ValueError(f"per_head: entry {i} has length {m.length}, entry 0 has {masks[0].length}")
        self.masks = masks
        self.length = masks[0].length
        self.num_heads = len(masks)
        self.has_intervals = all(m.has_intervals for m in masks)
        # a kernel evaluates every distinct head mask and selects by head, so keep that list short
        self.distinct = list({id(m): m for m in masks}.values())
        self.traceable = all(m.traceable for m in masks) and len(self.distinct) <= MAX_TRACED_HEAD_MASKS

    def head(self, index):
        self._check_head(index)
        return self.masks[index]

    def token_validity(self):
        valid = [m.token_validity() for m in self.distinct]
        if all(v is None for v in valid):
            return None
        valid = [np.ones(self.length, bool) if v is None else v for v in valid]
        if any(not np.array_equal(v, valid[0]) for v in valid):
            raise ValueError("per-head masks must put padding slots at the same positions")
        return valid[0]

    def _allowed(self, q, k, head):
        if isinstance(head, (int, np.integer)):
            return self.masks[head]._allowed(q, k, 0)
        # head is a traced scalar (inside a kernel): select among the distinct masks
        import jax.numpy as jnp

        out = None
        for candidate in self.distinct:
            heads = [h for h, m in enumerate(self.masks) if m is candidate]
            mine = head == heads[0]
            for h in heads[1:]:
                mine = mine | (head == h)
            value = candidate._allowed(q, k, 0).astype(jnp.int32)  # Mosaic selects int, not bool, vectors
            out = value if out is None else jnp.where(mine, value, out)
        return out != 0

    def _intervals(self, rows, head):
        return self.masks[head].key_intervals(rows)

    def __repr__(self):
        return f"per_head([{', '.join(repr(m) for m in self.masks)}])"


def full(length: int) -> Mask:
    """Every query sees every key."""
    return FullMask(length)


def band(length: int, width: int) -> Mask:
    """|q - k| <= width (a 1-D sliding window)."""
    return BandMask(length, width)


def from_array(array) -> Mask:
    """A mask from an explicit bool [L, L] or [H, L, L] array."""
    return ArrayMask(array)


def per_head(masks) -> Mask:
    """Head h uses ``masks[h]`` (all the same length, each head-uniform)."""
    return MultiHeadMask(masks)


# --------------------------------------------------------------------------------------------
# video masks on a VideoGrid (raster order)


class VideoMask(Mask):
    """A mask on the tokens of a video grid, defined through (t, y, x) coordinates."""

    traceable = True

    def __init__(self, grid: VideoGrid):
        if not isinstance(grid, VideoGrid):
            raise TypeError(f"grid must be a stlib.VideoGrid, got {type(grid).__name__}")
        self.grid = grid
        self.length = grid.num_tokens


def _axis_window(j, n_group, kernel, stride, causal, xp):
    """Window [start, end) in group coordinates of an axis query at group position j."""
    leader = xp.minimum(div(j, stride) * stride + stride // 2, n_group - 1)
    if causal:
        return xp.maximum(leader - kernel + 1, 0), leader + 1
    start = xp.clip(leader - kernel // 2, 0, n_group - kernel)
    return start, start + kernel


class NeighborhoodMask(VideoMask):
    """3-D neighbourhood attention (NATTEN / GNA semantics), see ``neighborhood``."""

    def __init__(self, grid, kernel_size, stride, dilation, causal):
        super().__init__(grid)
        self.kernel_size = check_positive_triple("kernel_size", kernel_size)
        self.stride = check_positive_triple("stride", stride)
        self.dilation = check_positive_triple("dilation", dilation)
        self.causal = check_bool_triple("causal", causal)
        for axis, n, k, d, s in zip("TYX", grid.shape, self.kernel_size, self.dilation, self.stride):
            if k * d > n:
                raise ValueError(
                    f"kernel_size[{axis}]={k} with dilation[{axis}]={d} spans {k * d} positions "
                    f"but the grid axis has only {n}"
                )
            if s > k:
                raise ValueError(f"stride[{axis}]={s} must not exceed kernel_size[{axis}]={k}")

    def _axis_allowed(self, axis, qa, ka, xp):
        n, k, d = self.grid.shape[axis], self.kernel_size[axis], self.dilation[axis]
        r = mod(qa, d)
        n_group = div(n - r + d - 1, d)
        start, end = _axis_window(div(qa, d), n_group, k, self.stride[axis], self.causal[axis], xp)
        m = div(ka, d)
        return (mod(ka, d) == r) & (m >= start) & (m < end)

    def _allowed(self, q, k, head):
        xp = _xp(q, k)
        qc, kc = self.grid.coords(q), self.grid.coords(k)
        out = self._axis_allowed(0, qc[0], kc[0], xp)
        for axis in (1, 2):
            out = out & self._axis_allowed(axis, qc[axis], kc[axis], xp)
        return out

    def _axis_keys(self, axis, qa):
        """[n, K_axis] key positions on one axis (each row: its window, possibly dilated)."""
        n, k, d = self.grid.shape[axis], self.kernel_size[axis], self.dilation[axis]
        r = qa % d
        n_group = (n - r + d - 1) // d
        start, end = _axis_window(qa // d, n_group, k, self.stride[axis], self.causal[axis], np)
        m = start[:, None] + np.arange(k)[None, :]
        pos = r[:, None] + d * m
        return np.where(m < end[:, None], pos, -1)  # -1: unused slot (causal windows are shorter)

    def _intervals(self, rows, head):
        t, y, x = self.grid.coords(rows)
        kt, ky = self._axis_keys(0, t), self._axis_keys(1, y)
        n = rows.shape[0]
        # rows (t, y) of the window, each contributing one interval along x (or kx if x is dilated)
        base = (kt[:, :, None] * self.grid.height + ky[:, None, :]) * self.grid.width  # [n, Kt, Ky]
        used = (kt[:, :, None] >= 0) & (ky[:, None, :] >= 0)
        if self.dilation[2] == 1:
            xs, xe = _axis_window(x, self.grid.width, self.kernel_size[2], self.stride[2], self.causal[2], np)
            s = base + xs[:, None, None]
            e = base + xe[:, None, None]
        else:
            kx = self._axis_keys(2, x)  # [n, Kx]
            s = base[:, :, :, None] + kx[:, None, None, :]
            e = s + 1
            used = used[:, :, :, None] & (kx[:, None, None, :] >= 0)
        s = np.where(used, s, 0).reshape(n, -1)
        e = np.where(used, e, 0).reshape(n, -1)
        return s, e

    def __repr__(self):
        return (
            f"neighborhood({self.grid.shape}, kernel_size={self.kernel_size}, stride={self.stride}, "
            f"dilation={self.dilation}, causal={self.causal})"
        )


class SlidingTileMask(VideoMask):
    """Sliding Tile Attention, see ``sliding_tile``."""

    def __init__(self, grid, tile, window):
        super().__init__(grid)
        self.tile = check_positive_triple("tile", tile)
        self.window = check_positive_triple("window", window)
        self.tile_counts = tuple(-(-n // s) for n, s in zip(grid.shape, self.tile))
        for axis, w, c in zip("TYX", self.window, self.tile_counts):
            if w % 2 == 0:
                raise ValueError(f"window[{axis}]={w} must be odd (tiles centred on the query's tile)")
            if w > c:
                raise ValueError(f"window[{axis}]={w} tiles exceeds the {c} tiles of the grid along {axis}")

    def _axis_range(self, axis, qa, xp):
        """Key range [lo, hi) on one axis for query coordinate qa."""
        tile, w, count, n = self.tile[axis], self.window[axis], self.tile_counts[axis], self.grid.shape[axis]
        first = xp.clip(div(qa, tile) - w // 2, 0, count - w)
        return first * tile, xp.minimum((first + w) * tile, n)

    def _allowed(self, q, k, head):
        xp = _xp(q, k)
        qc, kc = self.grid.coords(q), self.grid.coords(k)
        out = None
        for axis in range(3):
            lo, hi = self._axis_range(axis, qc[axis], xp)
            ok = (kc[axis] >= lo) & (kc[axis] < hi)
            out = ok if out is None else out & ok
        return out

    def _intervals(self, rows, head):
        t, y, x = self.grid.coords(rows)
        (t0, t1), (y0, y1), (x0, x1) = (self._axis_range(a, c, np) for a, c in enumerate((t, y, x)))
        span_t = self.window[0] * self.tile[0]
        span_y = self.window[1] * self.tile[1]
        tt = t0[:, None] + np.arange(span_t)[None, :]
        yy = y0[:, None] + np.arange(span_y)[None, :]
        used = (tt < t1[:, None])[:, :, None] & (yy < y1[:, None])[:, None, :]
        base = (tt[:, :, None] * self.grid.height + yy[:, None, :]) * self.grid.width
        s = np.where(used, base + x0[:, None, None], 0).reshape(rows.shape[0], -1)
        e = np.where(used, base + x1[:, None, None], 0).reshape(rows.shape[0], -1)
        return s, e

    def __repr__(self):
        return f"sliding_tile({self.grid.shape}, tile={self.tile}, window={self.window})"


class FrameWindowMask(VideoMask):
    """SVG spatial head: keys in frames |t_q - t_k| <= frame_window (whole frames)."""

    def __init__(self, grid, frame_window):
        super().__init__(grid)
        self.frame_window = check_positive_int("frame_window", frame_window, allow_zero=True)

    def _allowed(self, q, k, head):
        s = self.grid.tokens_per_frame
        return abs(div(q, s) - div(k, s)) <= self.frame_window

    def _intervals(self, rows, head):
        s, t = self.grid.tokens_per_frame, rows // self.grid.tokens_per_frame
        lo = np.maximum(t - self.frame_window, 0) * s
        hi = np.minimum(t + self.frame_window + 1, self.grid.frames) * s
        return lo[:, None], hi[:, None]

    def __repr__(self):
        return f"spatial({self.grid.shape}, frame_window={self.frame_window})"


class _SpatialRangeMask(VideoMask):
    """Keys whose spatial index lies in a per-(query, key frame) range [lo, hi): T intervals per row."""

    def _spatial_range(self, tq, sq, tk, xp):
        raise NotImplementedError

    def _allowed(self, q, k, head):
        xp = _xp(q, k)
        s = self.grid.tokens_per_frame
        lo, hi = self._spatial_range(div(q, s), mod(q, s), div(k, s), xp)
        return (mod(k, s) >= lo) & (mod(k, s) < hi)

    def _intervals(self, rows, head):
        s = self.grid.tokens_per_frame
        tk = np.arange(self.grid.frames)[None, :]
        lo, hi = self._spatial_range((rows // s)[:, None], (rows % s)[:, None], tk, np)
        lo, hi = np.clip(lo, 0, s), np.clip(hi, 0, s)
        return tk * s + lo, tk * s + np.maximum(hi, lo)


class SpatialNeighbourMask(_SpatialRangeMask):
    """SVG temporal head: same spatial location (|s_q - s_k| <= spatial_window), every frame."""

    def __init__(self, grid, spatial_window):
        super().__init__(grid)
        self.spatial_window = check_positive_int("spatial_window", spatial_window, allow_zero=True)

    def _spatial_range(self, tq, sq, tk, xp):
        return sq - self.spatial_window, sq + self.spatial_window + 1 + 0 * tk

    def __repr__(self):
        return f"temporal({self.grid.shape}, spatial_window={self.spatial_window})"


class TokenMajorBandMask(_SpatialRangeMask):
    """A band |p(q) - p(k)| <= width in token-major position p = s * T + t (SVG temporal band)."""

    def __init__(self, grid, width):
        super().__init__(grid)
        self.width = check_positive_int("width", width, allow_zero=True)

    def _spatial_range(self, tq, sq, tk, xp):
        frames = self.grid.frames
        p = sq * frames + tq
        # keys s * T + tk within [p - w, p + w]  <=>  s in [ceil((p - w - tk) / T), floor((p + w - tk) / T)]
        lo = -floordiv(tk - p + self.width, frames)
        hi = floordiv(p + self.width - tk, frames) + 1
        return lo, hi

    def __repr__(self):
        return f"temporal_band({self.grid.shape}, width={self.width})"


class RadialMask(_SpatialRangeMask):
    """Radial Attention, see ``radial``."""

    def __init__(self, grid, spatial_window, sink):
        super().__init__(grid)
        self.spatial_window = check_positive_int("spatial_window", spatial_window, allow_zero=True)
        self.sink = bool(sink)

    def _spatial_range(self, tq, sq, tk, xp):
        distance = abs(tq - tk)
        # halve the window each time the temporal distance doubles: floor(log2(d + 1)) halvings
        halvings = xp.zeros_like(distance)
        for bit in range(1, max(self.grid.frames, 2).bit_length() + 1):
            halvings = halvings + (distance + 1 >= (1 << bit))
        window = self.spatial_window >> halvings
        lo, hi = sq - window, sq + window + 1
        if self.sink:
            frame0 = tk == 0
            lo = xp.where(frame0, 0, lo)
            hi = xp.where(frame0, self.grid.tokens_per_frame, hi)
        return lo, hi

    def __repr__(self):
        return f"radial({self.grid.shape}, spatial_window={self.spatial_window}, sink={self.sink})"


class FrameCausalMask(VideoMask):
    """Keys of the same and earlier frames."""

    def _allowed(self, q, k, head):
        s = self.grid.tokens_per_frame
        return div(k, s) <= div(q, s)

    def _intervals(self, rows, head):
        s = self.grid.tokens_per_frame
        return np.zeros((rows.shape[0], 1), np.int64), ((rows // s + 1) * s)[:, None]

    def __repr__(self):
        return f"frame_causal({self.grid.shape})"


class FirstFrameMask(VideoMask):
    """Every query sees the keys of frame 0 (the SVG anchor / attention sink)."""

    def _allowed(self, q, k, head):
        return (k < self.grid.tokens_per_frame) & (q >= 0)  # q only sets the broadcast shape

    def _intervals(self, rows, head):
        n = rows.shape[0]
        return np.zeros((n, 1), np.int64), np.full((n, 1), self.grid.tokens_per_frame, np.int64)

    def __repr__(self):
        return "first_frame"


class GlobalTokensMask(Mask):
    """``count`` global (text) tokens in front of ``inner``: they see and are seen by everything."""

    def __init__(self, inner: Mask, count: int):
        if not isinstance(inner, Mask):
            raise TypeError(f"global_tokens needs a Mask, got {type(inner).__name__}")
        self.inner = inner
        self.count = check_positive_int("count", count)
        self.length = inner.length + self.count
        self.num_heads = inner.num_heads
        self.traceable = inner.traceable
        self.has_intervals = inner.has_intervals

    def token_validity(self):
        inner = self.inner.token_validity()
        return None if inner is None else np.concatenate([np.ones(self.count, bool), inner])

    def _allowed(self, q, k, head):
        xp = _xp(q, k)
        n = self.count
        inner = self.inner._allowed(xp.maximum(q - n, 0), xp.maximum(k - n, 0), head)
        return (q < n) | (k < n) | inner

    def _intervals(self, rows, head):
        n = self.count
        s, e = self.inner.key_intervals(np.maximum(rows - n, 0), head)
        s, e = s + n, e + n
        is_global = (rows < n)[:, None]
        s = np.concatenate([np.zeros_like(s[:, :1]), np.where(is_global, n, s)], axis=1)
        e = np.concatenate([np.where(is_global, self.length, n), np.where(is_global, n, e)], axis=1)
        return s, e

    def __repr__(self):
        return f"global_tokens({self.inner!r}, count={self.count})"


def _with_anchor(mask: VideoMask, anchor: bool) -> Mask:
    return mask | FirstFrameMask(mask.grid) if anchor else mask


def neighborhood(grid: VideoGrid, kernel_size, stride=1, dilation=1, causal=False) -> Mask:
    """3-D neighbourhood attention with NATTEN / Generalized Neighborhood Attention semantics.

    Per axis (an int applies to T, Y and X alike): the window holds exactly ``kernel_size``
    positions centred on the query (start = query - kernel_size // 2), shifted, not clipped, to
    stay inside the axis. ``dilation`` d splits the axis into d interleaved groups (positions with
    the same remainder mod d) and the window is taken inside the query's group. ``causal`` keeps the
    ``kernel_size`` most recent positions up to and including the query (fewer at the start).
    ``stride`` s groups queries in blocks of s (in group coordinates) that all use the window of
    the block's position ``start + s // 2`` (clamped to the last position).
    Raises ValueError if kernel_size * dilation exceeds an axis or stride exceeds kernel_size.
    """
    return NeighborhoodMask(grid, kernel_size, stride, dilation, causal)


def sliding_tile(grid: VideoGrid, tile, window) -> Mask:
    """Sliding Tile Attention: a query in tile a sees the keys of the ``window`` tiles (odd, per
    axis) centred on a, the window shifted to stay inside the grid. Ragged border tiles hold fewer
    tokens. For grids divisible by the tile this equals
    ``neighborhood(grid, kernel_size=window * tile, stride=tile)``."""
    return SlidingTileMask(grid, tile, window)


def spatial(grid: VideoGrid, frame_window: int = 0, *, anchor: bool = False) -> Mask:
    """Sparse VideoGen spatial head: keys in the same frame and the ``frame_window`` nearest frames
    on each side; ``anchor`` adds every key of frame 0."""
    return _with_anchor(FrameWindowMask(grid, frame_window), anchor)


def temporal(grid: VideoGrid, spatial_window: int = 0, *, anchor: bool = False) -> Mask:
    """Sparse VideoGen temporal head: keys at the same spatial location (flattened spatial index
    within ``spatial_window``) in every frame; ``anchor`` adds every key of frame 0."""
    return _with_anchor(SpatialNeighbourMask(grid, spatial_window), anchor)


def band_width_for_density(length: int, density: float) -> int:
    """SVG band budget: w = L * (1 - sqrt(1 - density)) rounded up to a multiple of 128."""
    check_positive_int("length", length)
    check_fraction("density", density)
    width = length * (1.0 - math.sqrt(1.0 - density))
    return int(min(math.ceil(width / 128.0) * 128, length))


def _band_width(grid: VideoGrid, density, width) -> int:
    if (density is None) == (width is None):
        raise ValueError(f"give exactly one of density={density!r} and width={width!r}")
    return band_width_for_density(grid.num_tokens, density) if width is None else width


def spatial_band(grid: VideoGrid, density: float | None = None, *, width: int | None = None,
                 anchor: bool = False) -> Mask:
    """SVG spatial head in its TPU band form: |q - k| <= w in frame-major (raster) order, with
    w from ``density`` (``band_width_for_density``) or given as ``width``."""
    return _with_anchor(_VideoBand(grid, _band_width(grid, density, width)), anchor)


def temporal_band(grid: VideoGrid, density: float | None = None, *, width: int | None = None,
                  anchor: bool = False) -> Mask:
    """SVG temporal head in its TPU band form: a band of width w (from ``density`` or ``width``)
    in token-major (y, x, t) order, expressed on raster indices.
    ``.permute(token_major_order(grid))`` turns it into a plain band."""
    return _with_anchor(TokenMajorBandMask(grid, _band_width(grid, density, width)), anchor)


class _VideoBand(VideoMask):
    """A raster band that remembers its grid (so an anchor can be added)."""

    def __init__(self, grid, width):
        super().__init__(grid)
        self.band = BandMask(grid.num_tokens, width)
        self.width = self.band.width

    def _allowed(self, q, k, head):
        return self.band._allowed(q, k, head)

    def _intervals(self, rows, head):
        return self.band._intervals(rows, head)

    def __repr__(self):
        return f"spatial_band({self.grid.shape}, width={self.width})"


def radial(grid: VideoGrid, spatial_window: int, *, sink: bool = True) -> Mask:
    """Radial Attention: a query sees keys of frame distance d whose flattened spatial index is
    within ``spatial_window >> floor(log2(d + 1))`` of its own (the window halves each time the
    distance doubles, down to the same location); ``sink`` adds every key of frame 0."""
    return RadialMask(grid, spatial_window, sink)


def frame_causal(grid: VideoGrid) -> Mask:
    """Autoregressive video: keys of the same and earlier frames."""
    return FrameCausalMask(grid)


def global_tokens(mask: Mask, count: int) -> Mask:
    """Prepend ``count`` global (e.g. text) tokens that every token sees and that see every token.
    The result has length count + mask.length; the video tokens keep ``mask`` among themselves."""
    return GlobalTokensMask(mask, count)
