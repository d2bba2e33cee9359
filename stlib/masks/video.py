"""Masks on the tokens of a video grid (raster order t, y, x), defined through (t, y, x)
coordinates: 3-D neighbourhood attention (``neighborhood``, NATTEN / GNA semantics), Sliding Tile
Attention (``sliding_tile``), the Sparse VideoGen heads in their exact (``spatial``, ``temporal``)
and TPU band forms (``spatial_band``, ``temporal_band``), Radial Attention (``radial``),
autoregressive ``frame_causal`` and the frame-0 anchor. Every video mask is traceable (a kernel
evaluates it from iota) and has an interval form.
"""

from __future__ import annotations

import numpy as np

from stlib._checks import check_bool_triple, check_positive_int, check_positive_triple
from stlib._intmath import array_module as _xp
from stlib._intmath import cdiv, div, floordiv, mod
from stlib.geometry import VideoGrid
from stlib.masks.base import Mask
from stlib.masks.sequence import BandMask, band_width_for_density


class VideoMask(Mask):
    """A mask on the tokens of a video grid, defined through (t, y, x) coordinates."""

    traceable = True

    def __init__(self, grid: VideoGrid):
        if not isinstance(grid, VideoGrid):
            raise TypeError(f"grid must be a stlib.VideoGrid, got {type(grid).__name__}")
        self.grid = grid
        self.length = grid.num_tokens

    def _key(self):
        return (self.grid,)


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

    def _key(self):
        return (self.grid, self.kernel_size, self.stride, self.dilation, self.causal)

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
        self.tile_counts = tuple(cdiv(n, s) for n, s in zip(grid.shape, self.tile))
        for axis, w, c in zip("TYX", self.window, self.tile_counts):
            if w % 2 == 0:
                raise ValueError(f"window[{axis}]={w} must be odd (tiles centred on the query's tile)")
            if w > c:
                fits = ", ".join(str(n) for n in range(1, c + 1, 2))
                raise ValueError(
                    f"window[{axis}]={w} tiles exceeds the {c} tiles of the grid along {axis} "
                    f"(ceil({grid.shape['TYX'.index(axis)]} / tile[{axis}]={self.tile['TYX'.index(axis)]})): "
                    f"a window along {axis} of {fits} tiles fits, or a smaller tile[{axis}]"
                )

    def _key(self):
        return (self.grid, self.tile, self.window)

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

    def interval_classes(self, rows):
        """The query's tile: every token of one 3-D tile sees the same window of tiles."""
        t, y, x = self.grid.coords(rows)
        _, ny, nx = self.tile_counts
        return (div(t, self.tile[0]) * ny + div(y, self.tile[1])) * nx + div(x, self.tile[2])

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

    def _key(self):
        return (self.grid, self.frame_window)

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


class SpatialRangeMask(VideoMask):
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


class SpatialNeighbourMask(SpatialRangeMask):
    """SVG temporal head: same spatial location (|s_q - s_k| <= spatial_window), every frame."""

    def __init__(self, grid, spatial_window):
        super().__init__(grid)
        self.spatial_window = check_positive_int("spatial_window", spatial_window, allow_zero=True)

    def _key(self):
        return (self.grid, self.spatial_window)

    def _spatial_range(self, tq, sq, tk, xp):
        return sq - self.spatial_window, sq + self.spatial_window + 1 + 0 * tk

    def __repr__(self):
        return f"temporal({self.grid.shape}, spatial_window={self.spatial_window})"


class TokenMajorBandMask(SpatialRangeMask):
    """A band |p(q) - p(k)| <= width in token-major position p = s * T + t (SVG temporal band)."""

    def __init__(self, grid, width):
        super().__init__(grid)
        self.width = check_positive_int("width", width, allow_zero=True)

    def _key(self):
        return (self.grid, self.width)

    def _spatial_range(self, tq, sq, tk, xp):
        frames = self.grid.frames
        p = sq * frames + tq
        # keys s * T + tk within [p - w, p + w]  <=>  s in [ceil((p - w - tk) / T), floor((p + w - tk) / T)]
        lo = -floordiv(tk - p + self.width, frames)
        hi = floordiv(p + self.width - tk, frames) + 1
        return lo, hi

    def __repr__(self):
        return f"temporal_band({self.grid.shape}, width={self.width})"


class RadialMask(SpatialRangeMask):
    """Radial Attention, see ``radial``."""

    def __init__(self, grid, spatial_window, sink):
        super().__init__(grid)
        self.spatial_window = check_positive_int("spatial_window", spatial_window, allow_zero=True)
        self.sink = bool(sink)

    def _key(self):
        return (self.grid, self.spatial_window, self.sink)

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

    >>> import stlib
    >>> mask = stlib.masks.neighborhood(stlib.VideoGrid(4, 8, 16), kernel_size=3)
    >>> round(stlib.block_layout(mask, 128, 128).density, 3)
    0.053
    """
    return NeighborhoodMask(grid, kernel_size, stride, dilation, causal)


def sliding_tile(grid: VideoGrid, tile, window) -> Mask:
    """Sliding Tile Attention: a query in tile a sees the keys of the ``window`` tiles (odd, per
    axis) centred on a, the window shifted to stay inside the grid. Ragged border tiles hold fewer
    tokens. For grids divisible by the tile this equals
    ``neighborhood(grid, kernel_size=window * tile, stride=tile)``.

    ``tile`` (T, Y, X tokens) and ``window`` (T, Y, X tiles) are positive int triples; each window
    entry must be odd and at most the grid's tiles along that axis, ceil(grid / tile) (the case
    study: a (21, 45, 80) grid in (3, 8, 16) tiles is 7 x 6 x 5 tiles, so window (3, 3, 3) fits).
    Raises ValueError otherwise, naming the windows that fit.

    >>> import stlib
    >>> grid = stlib.VideoGrid(4, 8, 80)
    >>> mask = stlib.masks.sliding_tile(grid, tile=(1, 8, 16), window=(3, 1, 3))
    >>> mask.length, round(stlib.block_layout(mask, 128, 128).density, 3)
    (2560, 0.45)
    >>> stlib.masks.sliding_tile(grid, tile=(2, 8, 16), window=(3, 1, 3))
    Traceback (most recent call last):
    ValueError: window[T]=3 tiles exceeds the 2 tiles of the grid along T (ceil(4 / tile[T]=2)): a window along T of 1 tiles fits, or a smaller tile[T]
    """
    return SlidingTileMask(grid, tile, window)


def spatial(grid: VideoGrid, frame_window: int = 0, *, anchor: bool = False) -> Mask:
    """Sparse VideoGen spatial head: keys in the same frame and the ``frame_window`` nearest frames
    on each side; ``anchor`` adds every key of frame 0.

    >>> import stlib
    >>> mask = stlib.masks.spatial(stlib.VideoGrid(4, 8, 16))
    >>> mask, mask.to_dense().sum(axis=1)[:3]  # each query sees its frame's 8 x 16 keys
    (spatial((4, 8, 16), frame_window=0), array([128, 128, 128]))
    """
    return _with_anchor(FrameWindowMask(grid, frame_window), anchor)


def temporal(grid: VideoGrid, spatial_window: int = 0, *, anchor: bool = False) -> Mask:
    """Sparse VideoGen temporal head: keys at the same spatial location (flattened spatial index
    within ``spatial_window``) in every frame; ``anchor`` adds every key of frame 0.

    >>> import stlib
    >>> mask = stlib.masks.temporal(stlib.VideoGrid(4, 8, 16))
    >>> mask, mask.to_dense().sum(axis=1)[:3]  # each query sees its location in the 4 frames
    (temporal((4, 8, 16), spatial_window=0), array([4, 4, 4]))
    """
    return _with_anchor(SpatialNeighbourMask(grid, spatial_window), anchor)


def _band_width(grid: VideoGrid, density, width) -> int:
    if (density is None) == (width is None):
        raise ValueError(f"give exactly one of density={density!r} and width={width!r}")
    return band_width_for_density(grid.num_tokens, density) if width is None else width


def spatial_band(
    grid: VideoGrid, density: float | None = None, *, width: int | None = None, anchor: bool = False
) -> Mask:
    """SVG spatial head in its TPU band form: |q - k| <= w in frame-major (raster) order, with
    w from ``density`` (``band_width_for_density``) or given as ``width``.

    >>> import stlib
    >>> stlib.masks.spatial_band(stlib.VideoGrid(4, 8, 16), density=0.25)
    spatial_band((4, 8, 16), width=128)
    """
    return _with_anchor(VideoBandMask(grid, _band_width(grid, density, width)), anchor)


def temporal_band(
    grid: VideoGrid, density: float | None = None, *, width: int | None = None, anchor: bool = False
) -> Mask:
    """SVG temporal head in its TPU band form: a band of width w (from ``density`` or ``width``)
    in token-major (y, x, t) order, expressed on raster indices.
    ``.permute(token_major_order(grid))`` turns it into a plain band.

    >>> import stlib
    >>> stlib.masks.temporal_band(stlib.VideoGrid(4, 8, 16), width=128)
    temporal_band((4, 8, 16), width=128)
    """
    return _with_anchor(TokenMajorBandMask(grid, _band_width(grid, density, width)), anchor)


class VideoBandMask(VideoMask):
    """A raster band that remembers its grid (so an anchor can be added)."""

    def __init__(self, grid, width):
        super().__init__(grid)
        self.band = BandMask(grid.num_tokens, width)
        self.width = self.band.width

    def _key(self):  # a leaf: ``band`` is how it computes, not a mask it combines
        return (self.grid, self.width)

    def form(self):
        return ("band", self.width)

    def _allowed(self, q, k, head):
        return self.band._allowed(q, k, head)

    def _intervals(self, rows, head):
        return self.band._intervals(rows, head)

    def __repr__(self):
        return f"spatial_band({self.grid.shape}, width={self.width})"


def radial(grid: VideoGrid, spatial_window: int, *, sink: bool = True) -> Mask:
    """Radial Attention: a query sees keys of frame distance d whose flattened spatial index is
    within ``spatial_window >> floor(log2(d + 1))`` of its own (the window halves each time the
    distance doubles, down to the same location); ``sink`` adds every key of frame 0.

    >>> import stlib
    >>> stlib.masks.radial(stlib.VideoGrid(4, 8, 16), spatial_window=8)
    radial((4, 8, 16), spatial_window=8, sink=True)
    """
    return RadialMask(grid, spatial_window, sink)


def frame_causal(grid: VideoGrid) -> Mask:
    """Autoregressive video: keys of the same and earlier frames.

    >>> import stlib
    >>> stlib.masks.frame_causal(stlib.VideoGrid(4, 8, 16)).to_dense().sum(axis=1)[::128]  # frames 0..3
    array([128, 256, 384, 512])
    """
    return FrameCausalMask(grid)
