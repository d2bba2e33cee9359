"""Plain sequence masks, defined on token indices alone: every key (``full``), a 1-D band
(``band``, with the SVG band budget ``band_width_for_density``), an explicit bool array
(``from_array``, identified by its shape and a digest of its bytes) and a different mask per head
(``per_head``, whose distinct head masks, by value, a kernel evaluates and selects between), and
``global_tokens``, which puts text tokens in front of any mask (keeping its traceable and interval
forms).
"""

from __future__ import annotations

import hashlib
import math
from functools import cached_property

import numpy as np

from stlib._checks import check_fraction, check_positive_int
from stlib._intmath import array_module as _xp
from stlib.masks.base import MAX_TRACED_HEAD_MASKS, Mask


class FullMask(Mask):
    traceable = True

    def __init__(self, length: int):
        self.length = check_positive_int("length", length)

    def _key(self):
        return (self.length,)

    def form(self):
        return ("full",)

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

    def _key(self):
        return (self.length, self.width)

    def form(self):
        return ("band", self.width)

    def _allowed(self, q, k, head):
        return abs(q - k) <= self.width

    def _intervals(self, rows, head):
        s = np.maximum(rows - self.width, 0)
        e = np.minimum(rows + self.width + 1, self.length)
        return s[:, None], e[:, None]

    def __repr__(self):
        return f"BandMask(L={self.length}, width={self.width})"


class CausalMask(Mask):
    """k <= q (language-model attention; the tokamax Splash benchmarks' mask)."""

    traceable = True

    def __init__(self, length: int):
        self.length = check_positive_int("length", length)

    def _key(self):
        return (self.length,)

    def form(self):
        return ("causal",)

    def _allowed(self, q, k, head):
        return k <= q

    def _intervals(self, rows, head):
        return np.zeros((rows.shape[0], 1), np.int64), np.minimum(rows + 1, self.length)[:, None]


class ArrayMask(Mask):
    """An explicit bool [L, L] or [H, L, L] array (held read-only: the mask hashes its bytes)."""

    def __init__(self, array):
        array = np.asarray(array)
        if array.dtype != bool:
            raise TypeError(f"from_array expects a bool array, got dtype {array.dtype}")
        if array.ndim not in (2, 3) or array.shape[-1] != array.shape[-2]:
            raise ValueError(f"from_array expects [L, L] or [H, L, L], got shape {array.shape}")
        array = array.view()
        array.flags.writeable = False
        self.array = array
        self.length = array.shape[-1]
        self.num_heads = array.shape[0] if array.ndim == 3 else None

    @cached_property
    def _digest(self) -> bytes:
        """128-bit BLAKE2 digest of the array's bytes, computed once."""
        return hashlib.blake2b(np.ascontiguousarray(self.array).tobytes(), digest_size=16).digest()

    def _key(self):
        return (self.array.shape, self._digest)

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
        # a kernel evaluates every distinct head mask (by value) and selects by head, so keep that
        # list short
        self.distinct = list(dict.fromkeys(masks))
        self.traceable = all(m.traceable for m in masks) and len(self.distinct) <= MAX_TRACED_HEAD_MASKS

    def _key(self):
        return tuple(self.masks)

    def form(self):
        return ("per_head", tuple(self.masks))

    def children(self):
        return tuple(self.masks)

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
            heads = [h for h, m in enumerate(self.masks) if m == candidate]
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

    def _key(self):
        return (self.inner, self.count)

    def children(self):
        return (self.inner,)

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


def full(length: int) -> Mask:
    """Every query sees every key.

    >>> import stlib
    >>> int(stlib.masks.full(4).to_dense().sum())
    16
    """
    return FullMask(length)


def band(length: int, width: int) -> Mask:
    """|q - k| <= width (a 1-D sliding window).

    >>> import stlib
    >>> stlib.masks.band(6, 1).to_dense().astype(int)
    array([[1, 1, 0, 0, 0, 0],
           [1, 1, 1, 0, 0, 0],
           [0, 1, 1, 1, 0, 0],
           [0, 0, 1, 1, 1, 0],
           [0, 0, 0, 1, 1, 1],
           [0, 0, 0, 0, 1, 1]])
    """
    return BandMask(length, width)


def causal(length: int) -> Mask:
    """k <= q on ``length`` tokens.

    >>> import stlib
    >>> stlib.masks.causal(4).to_dense().astype(int)
    array([[1, 0, 0, 0],
           [1, 1, 0, 0],
           [1, 1, 1, 0],
           [1, 1, 1, 1]])
    """
    return CausalMask(length)


def from_array(array) -> Mask:
    """A mask from an explicit bool [L, L] or [H, L, L] array (kept as a read-only view: do not
    change the array afterwards, the mask is identified by its bytes).

    >>> import numpy as np, stlib
    >>> stlib.masks.from_array(np.eye(3, dtype=bool))
    ArrayMask(L=3)
    """
    return ArrayMask(array)


def per_head(masks) -> Mask:
    """Head h uses ``masks[h]`` (all the same length, each head-uniform).

    >>> import stlib
    >>> mask = stlib.masks.per_head([stlib.masks.causal(256), stlib.masks.band(256, 16)])
    >>> mask, mask.num_heads
    (per_head([CausalMask(L=256), BandMask(L=256, width=16)]), 2)
    """
    return MultiHeadMask(masks)


def band_width_for_density(length: int, density: float) -> int:
    """SVG band budget: w = L * (1 - sqrt(1 - density)) rounded up to a multiple of 128.

    >>> import stlib
    >>> stlib.masks.band_width_for_density(75_600, 0.25)  # the case study's band 0.25
    10240
    """
    check_positive_int("length", length)
    check_fraction("density", density)
    width = length * (1.0 - math.sqrt(1.0 - density))
    return int(min(math.ceil(width / 128.0) * 128, length))


def global_tokens(mask: Mask, count: int) -> Mask:
    """Prepend ``count`` global (e.g. text) tokens that every token sees and that see every token.
    The result has length count + mask.length; the video tokens keep ``mask`` among themselves.

    >>> import stlib
    >>> mask = stlib.masks.global_tokens(stlib.masks.band(256, 16), 8)
    >>> mask, mask.length
    (global_tokens(BandMask(L=256, width=16), count=8), 264)
    """
    return GlobalTokensMask(mask, count)
