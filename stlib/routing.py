"""Sparse VideoGen routing and the public TPU design's tile budget (REFERENCE.md section 3).

``svg_plan`` turns fixed head kinds into a plan: each head's token order (raster for spatial heads,
token-major for temporal ones), in which its mask is a 1-D band |p - p'| <= w, w = L (1 - sqrt(1 - d))
rounded up to 128, plus an anchor; the tile layout of those reordered masks; and the passes a tile
kernel runs (FULL tiles mask-free, tiles whose keys end in padding apart, PARTIAL tiles masked or,
with balanced rounding, rounded in or out). ``route`` picks each head's kind from a sample of query
rows and returns the same plan. ``run_plan`` (``stlib.video_attention(..., plan=plan)``) runs it.
The plan's own masks live in ``stlib.masks.svg``; ``stlib.bench.svg_quality`` measures what a plan
loses against dense attention.

Anchors: ``REORDERED`` (the public design) is the first H*W keys of the head's *reordered*
sequence: frame 0 for a spatial head, the first H*W / T spatial locations in every frame for a
temporal head, so in its own order every head's mask is band | key < H*W. ``FRAME0`` keeps frame 0's
keys for every head, which in token-major order is every T-th key (it touches every kv tile).
"""

from __future__ import annotations

import dataclasses
import enum
import math
from dataclasses import dataclass, field
from functools import cached_property

import jax
import jax.numpy as jnp
import numpy as np

from stlib._checks import check_fraction
from stlib.blocks import BlockSizes, block_sizes_for
from stlib.geometry import (
    TokenOrder,
    VideoGrid,
    apply_orders,
    raster_order,
    restore_orders,
    token_major_order,
)
from stlib.layout import BlockLayout, block_layout
from stlib.masks import (
    FirstFrameMask,
    KeptTilesMask,
    Mask,
    TokenMajorPrefixMask,
    band_width_for_density,
    per_head,
    spatial_band,
    temporal_band,
)
from stlib.passes import BoundaryPolicy, Pass, PassKind, split_passes
from stlib.synthetic import HeadKind, head_kinds


class Anchor(enum.StrEnum):
    """Which keys every query also sees: the first H*W keys of the reordered sequence (REORDERED,
    the public design), frame 0 (FRAME0, in raster terms) or none (NONE)."""

    REORDERED = "reordered"
    FRAME0 = "frame0"
    NONE = "none"


def _enum(name: str, value, kind: type[enum.Enum]):
    try:
        return kind(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} must be one of {[k.value for k in kind]}") from None


def order_of(grid: VideoGrid, kind: HeadKind) -> TokenOrder:
    """The token order a head of ``kind`` runs in: raster for spatial, token-major for temporal."""
    return raster_order(grid) if HeadKind(kind) == HeadKind.SPATIAL else token_major_order(grid)


def inverse_order(order: TokenOrder) -> TokenOrder:
    """The order that maps ``order``'s positions back to raster (a mask in ``order``'s positions,
    ``.permute(inverse_order(order))``, is that mask in raster order). Orders without padding only."""
    if order.length != order.num_tokens:
        raise ValueError(f"order {order.name!r} has padding slots; it has no inverse order")
    if order.is_identity:
        return order
    return TokenOrder(f"inverse of {order.name}", order.inverse, order.num_tokens)


def exact_mask(grid: VideoGrid, kind, width: int, anchor=Anchor.REORDERED) -> Mask:
    """The exact (unrounded) mask of one head in raster order: its band of half-width ``width`` in
    its own order, plus its ``anchor``."""
    kind, anchor = HeadKind(kind), _enum("anchor", anchor, Anchor)
    if kind == HeadKind.SPATIAL:  # raster order: frame 0 is also the first H*W reordered keys
        return spatial_band(grid, width=width, anchor=anchor != Anchor.NONE)
    band = temporal_band(grid, width=width)
    if anchor == Anchor.NONE:
        return band
    return band | (FirstFrameMask(grid) if anchor == Anchor.FRAME0 else TokenMajorPrefixMask(grid))


@dataclass(frozen=True)
class RoutingReport:
    """What ``route`` measured: the sampled query rows (raster indices, int [S]), the candidate
    kinds, and per candidate and head the mean squared error of the masked attention probabilities
    against dense (``mse`` [C, H]) and the dense probability mass each mask keeps (``recall`` [C, H])."""

    rows: np.ndarray
    candidates: tuple[HeadKind, ...]
    mse: np.ndarray
    recall: np.ndarray


@dataclass(frozen=True, eq=False)
class SvgPlan:
    """A per-head Sparse VideoGen plan that feeds a tile kernel directly.

    ``kinds`` (HeadKind per head), ``orders`` (TokenOrder per head), ``layout`` (the BlockLayout
    of the heads' masks in their own orders, [H, nq, nk]: what the kernel reads) and ``passes``
    (the kernel's passes for ``boundary``, from ``stlib.passes.split_passes``). Per-head int64
    arrays [H]: ``main_tiles`` (mask-free pass), ``tail_tiles`` (tiles whose keys end in sequence
    padding: their own one-compare pass), ``masked_tiles`` (PARTIAL tiles, EXACT boundary only),
    ``pairs`` (real pairs the kernel computes), ``exact_pairs`` (pairs of the exact masks).
    ``mask``: what the kernel computes, after rounding, in raster order.
    """

    grid: VideoGrid
    kinds: tuple[HeadKind, ...]
    density: float
    width: int
    anchor: Anchor
    boundary: BoundaryPolicy
    orders: tuple[TokenOrder, ...]
    exact_masks: tuple[Mask, ...]
    layout: BlockLayout
    passes: tuple[Pass, ...]
    routing: RoutingReport | None = field(default=None)

    @property
    def num_heads(self) -> int:
        return len(self.kinds)

    @property
    def block_q(self) -> int:
        return self.layout.block_q

    @property
    def block_kv(self) -> int:
        return self.layout.block_kv

    @property
    def options(self):
        """The tile kernel's options (``Role.TILE``) for this plan's boundary policy."""
        from stlib.registry import Role, by_role

        return by_role(Role.TILE).options({"boundary": self.boundary})

    def _tiles(self, kind: PassKind) -> np.ndarray:
        out = np.zeros(self.num_heads, np.int64)
        for p in self.passes:
            if p.name == kind:
                out += p.selected.sum(axis=(1, 2))
        return out

    @property
    def main_tiles(self) -> np.ndarray:
        return self._tiles(PassKind.FULL)

    @property
    def tail_tiles(self) -> np.ndarray:
        ragged = self._tiles(PassKind.RAGGED)
        if self.boundary == BoundaryPolicy.BALANCED:  # padding hidden by the exact validity mask
            ragged = ragged + self._tiles(PassKind.MASKED)
        return ragged

    @property
    def masked_tiles(self) -> np.ndarray:
        return (
            self._tiles(PassKind.MASKED)
            if self.boundary == BoundaryPolicy.EXACT
            else np.zeros(self.num_heads, np.int64)
        )

    @property
    def computed_tiles(self) -> np.ndarray:
        return self.main_tiles + self.tail_tiles + self.masked_tiles

    @cached_property
    def kept(self) -> np.ndarray:
        """bool [H, nq, nk]: the tiles the kernel computes (every pass)."""
        keep = np.zeros(self.layout.counts.shape, bool)
        for p in self.passes:
            keep |= p.selected
        return keep

    @property
    def exact_pairs(self) -> np.ndarray:
        return self.layout.counts.sum(axis=(1, 2))

    @property
    def pairs(self) -> np.ndarray:
        if self.boundary == BoundaryPolicy.EXACT:
            return self.exact_pairs
        return np.where(self.kept, self.layout.valid_pairs[None], 0).sum(axis=(1, 2))

    @cached_property
    def mask(self) -> Mask:
        """The mask the kernel computes (after rounding), in raster order, lazily: per head, the
        kept tiles of its own order viewed back in raster order (EXACT: the exact masks)."""
        if self.boundary == BoundaryPolicy.EXACT:
            return per_head(list(self.exact_masks))
        length = self.grid.num_tokens
        heads = []
        for h, order in enumerate(self.orders):
            kept = KeptTilesMask(self.kept[h], self.block_q, self.block_kv, length)
            heads.append(kept.permute(inverse_order(order)))
        return per_head(heads)

    @cached_property
    def kernel_layout(self) -> BlockLayout:
        """The layout of what the kernel computes, in the heads' own orders: EXACT: ``layout``;
        BALANCED: the kept tiles as FULL tiles (the rest EMPTY), so a tile kernel with no rounding
        of its own runs the rounded plan unchanged. Built from the counts, nothing recounted."""
        if self.boundary == BoundaryPolicy.EXACT:
            return self.layout
        length = self.layout.mask.length
        heads = [
            KeptTilesMask(self.kept[h], self.block_q, self.block_kv, length) for h in range(self.num_heads)
        ]
        counts = np.where(self.kept, self.layout.valid_pairs[None], 0).astype(np.int64)
        return BlockLayout(
            mask=per_head(heads),
            block_q=self.block_q,
            block_kv=self.block_kv,
            counts=counts,
            valid_pairs=self.layout.valid_pairs,
            num_tokens=self.layout.num_tokens,
        )

    def head_slice(self, start: int, stop: int) -> SvgPlan:
        """The plan of heads [start, stop) alone, as ``svg_plan`` builds it (what one device of a
        head-sharded mesh runs; ``routing`` dropped). Raises ValueError for an empty or out-of-range
        slice."""
        if not 0 <= start < stop <= self.num_heads:
            raise ValueError(f"heads [{start}, {stop}) are not a slice of the plan's {self.num_heads} heads")
        return svg_plan(
            self.grid,
            self.kinds[start:stop],
            self.density,
            block_q=self.block_q,
            block_kv=self.block_kv,
            anchor=self.anchor,
            boundary=self.boundary,
        )

    def in_order(self, q, k, v, kernel):
        """``kernel(q, k, v)`` on the tokens in each head's plan order (one shared order applied
        once), the output restored to raster order: how a plan runner runs a tile kernel."""
        orders = list(self.orders)
        if len(set(orders)) == 1:
            orders = orders[:1]
        return restore_orders(kernel(*(apply_orders(x, orders) for x in (q, k, v))), orders)

    def run(self, q, k, v, *, impl: str | None = None, scale=None, options=None, interpret=None, **kwargs):
        """Attention of raster-order q, k, v [H, L, D] under this plan; returns raster order. ``impl``:
        a registered name, "auto", or None for the tile kernel the plans are cut for (the registry's
        ``Role.TILE``). An
        implementation with a ``plan_runner`` (the tile kernels) reorders per head, runs the plan's
        own layout and restores; any other runs ``self.mask`` through ``stlib.attention``. Raises
        ValueError when q's heads or length, or explicit blocks, do not match the plan."""
        from stlib.api import attention, check_qkv
        from stlib.registry import IMPLEMENTATIONS, Role, by_role, choose

        impl = impl or by_role(Role.TILE).name
        check_qkv(q, k, v)
        self.grid.check_length(q.shape[1])
        if q.shape[0] != self.num_heads:
            raise ValueError(f"the plan has {self.num_heads} heads but q has {q.shape[0]}")
        impl = choose(impl, self.mask).name  # "auto" resolved once, for this plan's mask
        runner = IMPLEMENTATIONS[impl].plan_runner
        if runner is None:
            return attention(
                q, k, v, self.mask, impl=impl, scale=scale, options=options, interpret=interpret, **kwargs
            )
        for name in ("block_q", "block_kv"):
            if kwargs.get(name) not in (None, getattr(self, name)):
                raise ValueError(f"{name}={kwargs[name]} differs from the plan's {getattr(self, name)}")
        unknown = set(kwargs) - {"block_q", "block_kv"}
        if unknown:
            raise TypeError(f"run_plan got unexpected arguments {sorted(unknown)}")
        scale = 1.0 / math.sqrt(q.shape[2]) if scale is None else float(scale)
        return runner(q, k, v, self, scale=scale, options=options, interpret=interpret)

    def summary(self) -> dict:
        """Plain numbers for records: kinds, width, per-head tile and pair counts."""
        return {
            "grid": list(self.grid.shape),
            "kinds": [str(k) for k in self.kinds],
            "density": self.density,
            "width": self.width,
            "anchor": str(self.anchor),
            "boundary": str(self.boundary),
            "block_q": self.block_q,
            "block_kv": self.block_kv,
            "tiles": list(self.layout.grid_shape),
            "main_tiles": self.main_tiles.tolist(),
            "tail_tiles": self.tail_tiles.tolist(),
            "masked_tiles": self.masked_tiles.tolist(),
            "pairs": self.pairs.tolist(),
            "exact_pairs": self.exact_pairs.tolist(),
        }


def _check_density(density) -> float:
    return check_fraction("density", density)


def svg_plan(
    grid: VideoGrid,
    kinds,
    density: float,
    *,
    block_q: int,
    block_kv: int,
    anchor=Anchor.REORDERED,
    boundary=BoundaryPolicy.BALANCED,
) -> SvgPlan:
    """The plan for fixed head ``kinds`` ("spatial" / "temporal" per head) at band ``density`` for
    ``block_q`` x ``block_kv`` tiles: no q / k needed, and never L x L (interval counting; about a
    second per distinct head kind at the case-study grid). Raises TypeError / ValueError for a bad
    grid, kind, density (outside (0, 1]), block size, anchor or boundary."""
    if not isinstance(grid, VideoGrid):
        raise TypeError(f"grid must be a stlib.VideoGrid, got {type(grid).__name__}")
    kinds = head_kinds(kinds)
    density = _check_density(density)
    BlockSizes(block_q, block_kv)  # validates the TPU tiling rule, naming the value
    anchor = _enum("anchor", anchor, Anchor)
    boundary = _enum("boundary", boundary, BoundaryPolicy)
    width = band_width_for_density(grid.num_tokens, density)
    orders = tuple(order_of(grid, kind) for kind in kinds)
    exact = tuple(exact_mask(grid, kind, width, anchor) for kind in kinds)
    layout = block_layout(per_head([m.permute(o) for m, o in zip(exact, orders)]), block_q, block_kv)
    passes = tuple(split_passes(layout, boundary))
    return SvgPlan(grid, kinds, density, width, anchor, boundary, orders, exact, layout, passes)


# --------------------------------------------------------------------------------------------
# routing


@jax.jit
def route_scores(q_rows, k, allowed, scale):
    """q_rows [H, S, D], k [H, L, D], allowed bool [C, S, L] -> (mse [C, H], recall [C, H], finite).

    Dense probabilities of the sampled rows, and per candidate the masked softmax (the dense
    probabilities kept by the mask, renormalised); mse over rows and keys, recall = kept mass."""
    finite = jnp.all(jnp.isfinite(q_rows)) & jnp.all(jnp.isfinite(k))
    s = (
        jnp.einsum(
            "hsd,hld->hsl",
            q_rows.astype(jnp.float32),
            k.astype(jnp.float32),
            precision=jax.lax.Precision.HIGHEST,
        )
        * scale
    )
    p = jax.nn.softmax(s, axis=-1)  # [H, S, L]

    def one(a):  # a [S, L]
        kept = jnp.where(a[None], p, 0.0)
        mass = jnp.sum(kept, axis=-1, keepdims=True)  # [H, S, 1]
        masked = kept / jnp.where(mass > 0, mass, 1.0)
        return jnp.mean((masked - p) ** 2, axis=(1, 2)), jnp.mean(mass[..., 0], axis=1)

    mse, recall = jax.lax.map(one, allowed)
    return mse, recall, finite


def sample_rows(length: int, num_samples: int, seed: int = 0) -> np.ndarray:
    """``num_samples`` distinct query rows of [0, length), sorted (seeded). ValueError unless
    1 <= num_samples <= length."""
    if isinstance(num_samples, bool) or not isinstance(num_samples, (int, np.integer)):
        raise TypeError(f"num_samples={num_samples!r} must be an int")
    if not 1 <= num_samples <= length:
        raise ValueError(f"num_samples={num_samples} must be between 1 and the sequence length {length}")
    return np.sort(np.random.default_rng(seed).choice(length, int(num_samples), replace=False))


def route(
    q,
    k,
    grid: VideoGrid,
    density: float,
    *,
    num_samples: int = 64,
    candidates=("spatial", "temporal"),
    seed: int = 0,
    block_q: int | None = None,
    block_kv: int | None = None,
    anchor=Anchor.REORDERED,
    boundary=BoundaryPolicy.BALANCED,
    scale: float | None = None,
) -> SvgPlan:
    """Choose each head's kind among ``candidates`` and return its ``svg_plan``.

    q, k: [H, L, D] in raster order. ``num_samples`` query rows (seeded) are scored against all keys
    on the device (one jitted call): per head and candidate, the mean squared error between the
    candidate's masked attention probabilities and dense ones (the design compares attention
    outputs; probabilities need no v and bound the output error); the smallest error wins (the
    first candidate on ties). Blocks default to the kernel's (small tiles in interpret mode, the
    chip's otherwise). ``plan.routing`` holds the scores. Raises ValueError for density outside
    (0, 1], num_samples outside [1, L], a grid that does not match L, NaN / inf in q or k, or an
    unknown candidate."""
    from stlib.api import check_qkv

    if not isinstance(grid, VideoGrid):
        raise TypeError(f"grid must be a stlib.VideoGrid, got {type(grid).__name__}")
    check_qkv(q, k, k)
    _, length, head_dim = q.shape
    grid.check_length(length)
    density = _check_density(density)
    cands = head_kinds(candidates)
    rows = sample_rows(length, num_samples, seed)
    anchor = _enum("anchor", anchor, Anchor)
    width = band_width_for_density(length, density)
    keys = np.arange(length)[None, :]
    allowed = np.stack([exact_mask(grid, kind, width, anchor).allowed(rows[:, None], keys) for kind in cands])
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    mse, recall, finite = route_scores(jnp.take(q, jnp.asarray(rows), axis=1), k, jnp.asarray(allowed), scale)
    mse, recall = np.asarray(mse), np.asarray(recall)
    if not bool(finite) or not np.all(np.isfinite(mse)):
        raise ValueError(
            "q or k holds NaN or inf (found in the sampled query rows or the keys); routing "
            "needs finite inputs"
        )
    kinds = tuple(cands[i] for i in np.argmin(mse, axis=0))
    sizes = block_sizes_for(length, block_q, block_kv)
    plan = svg_plan(
        grid, kinds, density, block_q=sizes.block_q, block_kv=sizes.block_kv, anchor=anchor, boundary=boundary
    )
    return dataclasses.replace(plan, routing=RoutingReport(rows, cands, mse, recall))


# --------------------------------------------------------------------------------------------
# running a plan


def run_plan(
    q,
    k,
    v,
    plan: SvgPlan,
    *,
    impl: str | None = None,
    scale: float | None = None,
    options=None,
    interpret: bool | None = None,
    **kwargs,
):
    """Attention of raster-order q, k, v [H, L, D] under ``plan``; returns raster order: the same as
    ``plan.run(q, k, v, impl=impl, ...)``. Raises TypeError for anything but an SvgPlan."""
    if not isinstance(plan, SvgPlan):
        raise TypeError(f"plan must be a stlib.routing.SvgPlan, got {type(plan).__name__}")
    return plan.run(q, k, v, impl=impl, scale=scale, options=options, interpret=interpret, **kwargs)


__all__ = [
    "Anchor",
    "KeptTilesMask",
    "RoutingReport",
    "SvgPlan",
    "TokenMajorPrefixMask",
    "exact_mask",
    "inverse_order",
    "order_of",
    "route",
    "route_scores",
    "run_plan",
    "sample_rows",
    "svg_plan",
]
