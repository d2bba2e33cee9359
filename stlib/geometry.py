"""Video token geometry: the (T, Y, X) latent grid, token orders and padding.

A token order is a permutation of the raster (frame-major, t-y-x) token indices, possibly with
padding slots (marked -1) so that every 3-D tile occupies a whole number of kernel blocks.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import jax
import numpy as np

from stlib._checks import check_positive_int, check_positive_triple
from stlib._intmath import array_module as _xp
from stlib._intmath import cdiv, div, mod, round_up


@jax.tree_util.register_static  # hashable: jax.jit(stlib.video_attention)(q, k, v, grid, mask) works
@dataclass(frozen=True)
class VideoGrid:
    """A video latent token grid of T frames, Y rows, X columns (raster order t, y, x)."""

    frames: int
    height: int
    width: int

    def __post_init__(self):
        for name in ("frames", "height", "width"):
            check_positive_int(name, getattr(self, name))

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.frames, self.height, self.width)

    @property
    def num_tokens(self) -> int:
        return self.frames * self.height * self.width

    @property
    def tokens_per_frame(self) -> int:
        return self.height * self.width

    def coords(self, index) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(t, y, x) of raster token indices (any integer array shape; works on numpy or jnp)."""
        t = div(index, self.tokens_per_frame)
        rem = mod(index, self.tokens_per_frame)
        return t, div(rem, self.width), mod(rem, self.width)

    def raster_index(self, t, y, x):
        return (t * self.height + y) * self.width + x

    def check_length(self, length: int) -> None:
        if length != self.num_tokens:
            raise ValueError(
                f"video grid {self.shape} has {self.num_tokens} tokens but the sequence has {length}"
            )


@jax.tree_util.register_static
@dataclass(frozen=True, eq=False)
class TokenOrder:
    """A token order: ``perm[i]`` is the raster index at position i (-1 for a padding slot).

    ``inverse[r]`` is the position of raster token r. ``length`` = len(perm) >= num_tokens.
    Orders compare and hash by value: name, sizes, a digest of the permutation (computed once; ``perm``
    is held read-only) and the arithmetic form.
    """

    name: str
    perm: np.ndarray  # int32 [length]
    num_tokens: int
    #: Optional arithmetic form of ``perm`` (position array -> raster index, -1 at padding) that
    #: also works on jax arrays, so a kernel can evaluate a permuted mask from iota.
    raster_of: Callable | None = None

    def __post_init__(self):
        perm = np.asarray(self.perm).view()
        real = perm[perm >= 0]
        if real.size != self.num_tokens or not np.array_equal(np.sort(real), np.arange(self.num_tokens)):
            raise ValueError(f"order {self.name!r} is not a permutation of {self.num_tokens} tokens")
        perm.flags.writeable = False
        object.__setattr__(self, "perm", perm)

    @cached_property
    def _perm_digest(self) -> bytes:
        """128-bit BLAKE2 digest of the permutation as int64 (independent of its integer dtype)."""
        return hashlib.blake2b(self.perm.astype(np.int64).tobytes(), digest_size=16).digest()

    def _key(self) -> tuple:
        return (self.name, self.num_tokens, self.length, self._perm_digest, self.raster_of)

    def __eq__(self, other):
        if self is other:
            return True
        if not isinstance(other, TokenOrder):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self):
        return hash(self._key())

    @property
    def length(self) -> int:
        return int(self.perm.shape[0])

    @cached_property
    def valid(self) -> np.ndarray:
        """bool [length]: False at padding slots."""
        return self.perm >= 0

    @cached_property
    def inverse(self) -> np.ndarray:
        inv = np.empty(self.num_tokens, dtype=np.int32)
        pos = np.flatnonzero(self.valid)
        inv[self.perm[pos]] = pos
        return inv

    @property
    def is_identity(self) -> bool:
        return self.length == self.num_tokens and bool(np.all(self.perm == np.arange(self.num_tokens)))

    def apply(self, x):
        """[H, L, D] raster-order array -> [H, length, D] in this order (zeros at padding slots)."""
        import jax.numpy as jnp

        _check_token_axis(x, self.num_tokens, "apply")
        gathered = jnp.take(x, jnp.asarray(np.maximum(self.perm, 0)), axis=1)
        if self.length == self.num_tokens:
            return gathered
        return jnp.where(jnp.asarray(self.valid)[None, :, None], gathered, jnp.zeros((), x.dtype))

    def restore(self, y):
        """[H, length, D] array in this order -> [H, L, D] raster order (padding slots dropped)."""
        import jax.numpy as jnp

        _check_token_axis(y, self.length, "restore")
        return jnp.take(y, jnp.asarray(self.inverse), axis=1)

    def with_prefix(self, count: int) -> TokenOrder:
        """The same order behind ``count`` leading tokens (text/global tokens) that stay in place."""
        check_positive_int("count", count, allow_zero=True)
        shifted = np.where(self.perm >= 0, self.perm + count, -1)
        perm = np.concatenate([np.arange(count), shifted]).astype(np.int32)
        formula = None if self.raster_of is None else _PrefixFormula(self.raster_of, count)
        return TokenOrder(f"{count} prefix + {self.name}", perm, self.num_tokens + count, formula)


def _check_token_axis(x, expected: int, what: str) -> None:
    if getattr(x, "ndim", None) != 3:
        raise ValueError(f"{what} expects an [H, L, D] array, got shape {getattr(x, 'shape', None)}")
    if x.shape[1] != expected:
        raise ValueError(f"{what} expects L={expected} tokens on axis 1, got {x.shape[1]}")


def _check_grid(grid) -> None:
    if not isinstance(grid, VideoGrid):
        raise TypeError(f"grid must be a stlib.VideoGrid, got {type(grid).__name__}")


def raster_order(grid: VideoGrid) -> TokenOrder:
    """Frame-major (t, y, x): the model's native order (the identity permutation)."""
    _check_grid(grid)
    return TokenOrder(
        "raster (t, y, x)", np.arange(grid.num_tokens, dtype=np.int32), grid.num_tokens, _RasterFormula()
    )


def token_major_order(grid: VideoGrid) -> TokenOrder:
    """Token-major (y, x, t): the frames of one spatial location are contiguous."""
    _check_grid(grid)
    t, y, x = np.meshgrid(*(np.arange(n) for n in grid.shape), indexing="ij")
    perm = grid.raster_index(t, y, x).transpose(1, 2, 0).reshape(-1)
    return TokenOrder(
        "token-major (y, x, t)", perm.astype(np.int32), grid.num_tokens, _TokenMajorFormula(grid)
    )


def tiled_order(grid: VideoGrid, tile, *, pad: bool = True) -> TokenOrder:
    """3-D tiled order: the tokens of each (tt, ty, tx) tile contiguous (raster order inside the
    tile, padding slots last), tiles in raster order.

    With ``pad=True`` every tile occupies tt*ty*tx slots (ragged border tiles are padded with
    -1 slots), so tile boundaries fall on multiples of the tile volume; with ``pad=False`` ragged
    tiles are simply shorter and no padding is added.
    """
    _check_grid(grid)
    tile = check_positive_triple("tile", tile)
    counts = [cdiv(n, s) for n, s in zip(grid.shape, tile)]
    padded = [c * s for c, s in zip(counts, tile)]
    t, y, x = np.meshgrid(*(np.arange(n) for n in padded), indexing="ij")
    inside = (t < grid.frames) & (y < grid.height) & (x < grid.width)
    index = np.where(inside, grid.raster_index(t, y, x), -1)
    # [nT, tt, nY, ty, nX, tx] -> [nT, nY, nX, tt, ty, tx]
    index = index.reshape(counts[0], tile[0], counts[1], tile[1], counts[2], tile[2])
    tiles = index.transpose(0, 2, 4, 1, 3, 5).reshape(-1, tile[0] * tile[1] * tile[2])
    # inside each tile the real tokens come first and the padding slots last, so the valid keys of
    # a tile-sized block are a prefix of it (kernels mask a ragged tile with one comparison)
    tiles = np.take_along_axis(tiles, np.argsort(tiles < 0, axis=1, kind="stable"), axis=1)
    perm = tiles.reshape(-1)
    if not pad:
        perm = perm[perm >= 0]
    name = f"tiled {tile[0]}x{tile[1]}x{tile[2]}" + (
        " (padded)" if pad and perm.size > grid.num_tokens else ""
    )
    formula = _TiledFormula(grid, tile, tuple(counts)) if pad else None
    return TokenOrder(name, perm.astype(np.int32), grid.num_tokens, formula)


#: How ``shard_order`` deals chunks of tokens to the devices of a ring: in runs ("contiguous": device
#: d holds tokens [d L/N, (d + 1) L/N)), round-robin ("striped") or back and forth ("zigzag": 0, 1,
#: ..., N-1, N-1, ..., 0, 0, ...), which evens out a frame-causal mask's work over the devices.
SHARD_KINDS = ("contiguous", "striped", "zigzag")


def shard_order(length: int, num_devices: int, kind: str = "zigzag", unit: int = 1) -> TokenOrder:
    """The token order in which a ring of ``num_devices`` splits ``length`` tokens: chunks of ``unit``
    tokens (a frame, say) dealt to the devices as ``kind`` says (``SHARD_KINDS``); position p of
    the order is on device p // (L / N). Raises ValueError unless ``unit`` divides L and the chunks
    divide over the devices.

    >>> shard_order(8, 2, "zigzag", unit=2).perm.tolist()  # chunks 0..3 -> devices 0, 1, 1, 0
    [0, 1, 6, 7, 2, 3, 4, 5]
    """
    check_positive_int("length", length)
    check_positive_int("num_devices", num_devices)
    check_positive_int("unit", unit)
    if kind not in SHARD_KINDS:
        raise ValueError(f"kind={kind!r} must be one of {SHARD_KINDS}")
    if length % unit or (length // unit) % num_devices:
        raise ValueError(
            f"length={length} must split into chunks of unit={unit} tokens that divide over the "
            f"{num_devices} devices (a multiple of {unit * num_devices} tokens)"
        )
    formula = _ShardFormula(length, num_devices, kind, unit)
    perm = formula(np.arange(length, dtype=np.int64)).astype(np.int32)
    return TokenOrder(f"{kind} over {num_devices} devices (unit {unit})", perm, length, formula)


# Arithmetic forms of the orders (position -> raster index, -1 at padding): small picklable
# callables that work on numpy arrays and, inside a kernel, on jax arrays.


@dataclass(frozen=True)
class _ShardFormula:
    length: int
    num_devices: int
    kind: str
    unit: int

    def __call__(self, pos):  # pos = device * (L / N) + chunk of the device * unit + offset
        if self.kind == "contiguous":
            return pos
        xp = _xp(pos)
        shard = self.length // self.num_devices
        device, within = div(pos, shard), mod(pos, shard)
        step, offset = div(within, self.unit), mod(within, self.unit)
        dealt = (
            device
            if self.kind == "striped"
            else xp.where(mod(step, 2) == 0, device, self.num_devices - 1 - device)
        )
        return (step * self.num_devices + dealt) * self.unit + offset


@dataclass(frozen=True)
class _RasterFormula:
    def __call__(self, pos):
        return pos


@dataclass(frozen=True)
class _TokenMajorFormula:
    grid: VideoGrid

    def __call__(self, pos):  # pos = (y * X + x) * T + t
        return mod(pos, self.grid.frames) * self.grid.tokens_per_frame + div(pos, self.grid.frames)


@dataclass(frozen=True)
class _PrefixFormula:
    inner: Callable
    count: int

    def __call__(self, pos):
        xp = _xp(pos)
        raster = self.inner(xp.maximum(pos - self.count, 0))
        return xp.where(pos < self.count, pos, xp.where(raster >= 0, raster + self.count, -1))


def tile_rows(order: TokenOrder) -> tuple[int, int] | None:
    """(tokens per 3-D tile, tiles per row along x) of a padded ``tiled_order``; None for any other
    order. A row of tiles (their product) is the natural block of a kernel in that order."""
    formula = order.raster_of
    if not isinstance(formula, _TiledFormula):
        return None
    return int(np.prod(formula.tile)), int(formula.counts[2])


@dataclass(frozen=True)
class _TiledFormula:
    """The padded tiled order: tile id and offset, the tile's (possibly ragged) extents, and the
    offset's coordinates inside the tile's real tokens (which come first, in raster order)."""

    grid: VideoGrid
    tile: tuple
    counts: tuple

    def __call__(self, pos):
        xp = _xp(pos)
        (tt, ty, tx), (_, n_y, n_x), grid = self.tile, self.counts, self.grid
        tile_id, within = div(pos, tt * ty * tx), mod(pos, tt * ty * tx)
        a, b, c = div(tile_id, n_y * n_x), mod(div(tile_id, n_x), n_y), mod(tile_id, n_x)
        et = xp.minimum(tt, grid.frames - a * tt)
        ey = xp.minimum(ty, grid.height - b * ty)
        ex = xp.minimum(tx, grid.width - c * tx)
        plane = ey * ex
        t = a * tt + div(within, plane)
        y = b * ty + div(mod(within, plane), ex)
        x = c * tx + mod(within, ex)
        return xp.where(within < et * plane, grid.raster_index(t, y, x), -1)


def padded_length(length: int, block: int) -> int:
    """L rounded up to a multiple of ``block``."""
    check_positive_int("length", length)
    check_positive_int("block", block)
    return round_up(length, block)


def pad_tokens(x, block: int):
    """Pad axis 1 of an [H, L, D] array to a multiple of ``block``.

    Returns (padded [H, Lp, D], valid bool [Lp]) where pad tokens are zeros and marked invalid.
    """
    import jax.numpy as jnp

    if getattr(x, "ndim", None) != 3:
        raise ValueError(f"pad_tokens expects an [H, L, D] array, got shape {getattr(x, 'shape', None)}")
    length = x.shape[1]
    target = padded_length(length, block)
    valid = np.arange(target) < length
    if target == length:
        return x, valid
    return jnp.pad(x, ((0, 0), (0, target - length), (0, 0))), valid


def apply_orders(x, orders):
    """[H, L, D] raster-order array -> [H, length, D], head h in ``orders[h]`` (all the same
    length; zeros at padding slots). One order for all heads may be passed as a 1-list."""
    import jax.numpy as jnp

    if len(orders) == 1:
        return orders[0].apply(x)
    _check_token_axis(x, orders[0].num_tokens, "apply_orders")
    if len(orders) != x.shape[0] or len({o.length for o in orders}) != 1:
        raise ValueError(f"apply_orders needs one order per head ({x.shape[0]}), all of one length")
    perm = jnp.asarray(np.stack([np.maximum(o.perm, 0) for o in orders]))  # [H, length]
    valid = jnp.asarray(np.stack([o.valid for o in orders]))
    gathered = jnp.take_along_axis(x, perm[:, :, None], axis=1)
    return jnp.where(valid[:, :, None], gathered, jnp.zeros((), x.dtype))


def restore_orders(y, orders):
    """Inverse of ``apply_orders``: [H, length, D] -> [H, L, D] raster order."""
    import jax.numpy as jnp

    if len(orders) == 1:
        return orders[0].restore(y)
    inverse = jnp.asarray(np.stack([o.inverse for o in orders]))  # [H, L]
    return jnp.take_along_axis(y, inverse[:, :, None], axis=1)
