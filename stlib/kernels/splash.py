"""``impl="splash"``: JAX's Splash attention (jax.experimental.pallas.ops.tpu.splash_attention) on
stlib masks: the baseline every sparse kernel is measured against.

What the adapter does around ``make_splash_mha``:

* masks: full -> Splash ``FullMask``, causal (``causal``: k <= q) -> ``CausalMask``, band |q - k| <= w
  -> ``LocalMask`` window (w, w), ``&`` / ``|``
  of those -> Splash ``LogicalAnd`` / ``LogicalOr``, a different mask per head -> ``MultiHeadMask``.
  Any other mask, at any length, is handed to Splash tile by tile from stlib's own block layout
  (``_TiledMask``): EMPTY and FULL tiles from the layout's counts, only PARTIAL tiles evaluated (a
  mask without key intervals: L <= DENSE_LIMIT).
* ragged lengths: Splash needs block sizes that divide L, so q, k, v are padded with zeros to Lp;
  pad keys are hidden with Splash ``SegmentIds`` (real tokens 0, pad tokens 1) and the output is
  sliced back to L.
* rows that see no key: Splash returns garbage there (the mean of v over the keys of the tiles it
  ran, or NaN when it ran none), so they are set to zero from the mask's own row visibility.
* scale: Splash does not scale scores, so q is multiplied by ``scale`` first.

* shared kv heads (k, v with H / G heads) and a v head dim other than q's go straight to Splash's
  MHA kernel, which supports both; ``stlib.attention`` itself takes equal shapes, so only callers of
  ``splash_attention`` (the static estimate's compile) use them.

Differentiable: the backward is Splash's own, fused dk / dv / dq or split (``SplashOptions``), on
the forward's tiles.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas.ops.tpu import splash_attention as sa

from stlib import masks as M
from stlib import tile_counts
from stlib._intmath import round_up
from stlib.accounting import block_changes, work_from_counts
from stlib.contract import Capabilities, Config, EstimatorHooks, Presentation, ScheduleCounts
from stlib.device import CHIPS, LANES, resolve_interpret
from stlib.geometry import TokenOrder, tile_rows
from stlib.layout import TileKind, block_layout
from stlib.registry import Implementation, Role, register

# Splash tiles are multiples of the 128-lane vector width (q, kv and the kv compute chunk).
#: Default tiles: 512 queries x 1024 keys per grid step, scores computed 512 keys at a time.
#: The same on v5e, v6e and in interpret mode: a few MiB of VMEM at head dim 128 (by count: double-
#: buffered q, k, v, out tiles ~1.5 MiB, f32 m/l/acc ~0.75 MiB, [512, 512] f32 scores), inside the
#: default scoped VMEM of both chips (compiles for both), and few grid steps for interpret mode.
DEFAULT_BLOCK_Q = 512
DEFAULT_BLOCK_KV = 1024
DEFAULT_BLOCK_KV_COMPUTE = 512
#: The (block_q, block_kv) a tuned static estimate of Splash sweeps (block_kv_compute: 512 where it
#: divides block_kv, as ``splash_blocks`` does).
TUNED_CANDIDATES = ((512, 1024), (512, 2048), (1024, 1024), (1024, 2048), (2048, 2048))


@dataclass(frozen=True)
class SplashOptions:
    """``fused_backward``: ``jax.grad`` runs Splash's fused dk / dv / dq kernel (True; dq summed
    over per-kv-tile partials in HBM) or its split dq and dk / dv kernels (False)."""

    fused_backward: bool = True

    def __post_init__(self):
        if not isinstance(self.fused_backward, bool):
            raise TypeError(f"fused_backward={self.fused_backward!r} must be True or False")


@dataclass(frozen=True)
class SplashBlocks:
    """Splash tile sizes; every one a multiple of 128, and block_kv a multiple of block_kv_compute."""

    block_q: int
    block_kv: int
    block_kv_compute: int

    def __post_init__(self):
        for name in ("block_q", "block_kv", "block_kv_compute"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0 or value % LANES:
                raise ValueError(f"{name}={value!r} must be a positive multiple of {LANES} for Splash")
        if self.block_kv % self.block_kv_compute:
            raise ValueError(
                f"block_kv={self.block_kv} must be a multiple of block_kv_compute={self.block_kv_compute}"
            )

    def padded_length(self, length: int) -> int:
        """Smallest Lp >= length that both block_q and block_kv divide."""
        return round_up(length, math.lcm(self.block_q, self.block_kv))

    def to_splash(self, fused_backward: bool = True) -> sa.BlockSizes:
        """Splash's block sizes: the forward's, and the same tiles for its backward kernels (fused
        dk / dv / dq, or split dq and dk / dv), which ``jax.grad`` through Splash runs."""
        split = {} if fused_backward else {"block_q_dq": self.block_q, "block_kv_dq": self.block_kv}
        return sa.BlockSizes(
            block_q=self.block_q,
            block_kv=self.block_kv,
            block_kv_compute=self.block_kv_compute,
            block_q_dkv=self.block_q,
            block_kv_dkv=self.block_kv,
            block_kv_dkv_compute=self.block_kv_compute,
            use_fused_bwd_kernel=fused_backward,
            **split,
        )


def splash_blocks(
    length: int, block_q: int | None = None, block_kv: int | None = None, *, tile: int | None = None
) -> SplashBlocks:
    """Tile sizes for a sequence of ``length`` tokens: the given ones; else, for a mask in a padded
    3-D tiled order whose tiles hold ``tile`` tokens (a multiple of 128), one 3-D tile a block on
    both axes, so every block is EMPTY or FULL (on the case study's sliding tile, 384 x 384 ran
    fastest of Splash's blocks on a v5e, and larger ones ran out of VMEM); else the defaults capped
    to the sequence (rounded up to 128) with block_kv a multiple of block_q, so padding stays below
    one kv tile. Raises ValueError for a block size that is not a multiple of 128."""
    for name, value in (("block_q", block_q), ("block_kv", block_kv)):
        if value is not None and value % LANES:
            raise ValueError(f"{name}={value} must be a multiple of {LANES} for Splash")
    if block_q is None and block_kv is None and tile is not None and tile % LANES == 0 and tile <= length:
        return SplashBlocks(tile, tile, tile)
    rounded = round_up(length, LANES)
    bq = block_q if block_q is not None else min(DEFAULT_BLOCK_Q, rounded)
    if block_kv is None:
        bkv = min(DEFAULT_BLOCK_KV, round_up(rounded, bq))
    else:
        bkv = block_kv
    compute = DEFAULT_BLOCK_KV_COMPUTE if bkv % DEFAULT_BLOCK_KV_COMPUTE == 0 else bkv
    return SplashBlocks(bq, bkv, compute)


# --------------------------------------------------------------------------------------------
# stlib mask -> Splash mask


def _tile_tokens(mask: M.Mask | None) -> int | None:
    """Tokens per 3-D tile of a mask in a padded 3-D tiled order (``geometry.tile_rows``), else None."""
    order = None if mask is None else tile_counts.counting_key(mask)[1]
    rows = tile_rows(order) if isinstance(order, TokenOrder) else None
    return None if rows is None else rows[0]


class _Band(sa.LocalMask):
    """Splash ``LocalMask`` with window (w, w): the same in-kernel mask function, but whole blocks
    that lie inside or outside the band are answered without evaluating it. Splash classifies every
    tile on the host in Python, and evaluating all 11k tiles of the case-study shape takes ~18 s."""

    def __init__(self, shape, width: int):
        super().__init__(shape, window_size=(width, width), offset=0)
        self.width = width

    def __getitem__(self, idx) -> np.ndarray:
        q_slice, k_slice = idx
        q0, q1, _ = q_slice.indices(self.shape[0])
        k0, k1, _ = k_slice.indices(self.shape[1])
        if q1 > q0 and k1 > k0:
            w, q_last, k_last = self.width, q1 - 1, k1 - 1
            if k_last < q0 - w or k0 > q_last + w:  # every pair farther than w
                return np.zeros((q1 - q0, k1 - k0), dtype=bool)
            if k0 >= q_last - w and k_last <= q0 + w:  # every pair within w
                return np.ones((q1 - q0, k1 - k0), dtype=bool)
        return super().__getitem__(idx)


def _lazy(mask: M.Mask, head: int, padded: int):
    """The Splash lazy mask of one head on the padded square, or None if there is none. Every mask
    built here contains the diagonal (full, bands, and & / | of them), so no real row is empty."""
    shape = (padded, padded)
    if isinstance(mask, M.FullMask):
        return sa.FullMask(shape)
    if isinstance(mask, M.CausalMask):  # pad keys lie right of every real query: masked already
        return sa.CausalMask(shape)
    if isinstance(mask, (M.BandMask, M.VideoBandMask)):
        return _Band(shape, mask.width)
    if isinstance(mask, M.MultiHeadMask):
        return _lazy(mask.head(head), 0, padded)
    if isinstance(mask, M.CombinedMask):
        a, b = (_lazy(child, head, padded) for child in mask.children())
        if a is None or b is None:
            return None
        return (a & b) if mask.op is M.CombineOp.AND else (a | b)
    return None


class _TiledMask(sa.Mask):
    """One head of an stlib mask without a lazy Splash form, as a Splash mask on the padded square
    [Lp, Lp], answered tile by tile from stlib's own block layout at the tiles Splash asks for:
    EMPTY tiles as no pair and FULL tiles as every real pair without evaluating one, only PARTIAL
    tiles by the stlib mask itself (``Mask.block``), each once. Splash classifies every tile on the
    host and keeps each distinct PARTIAL tile in its ``partial_mask_blocks``; the kernel skips EMPTY
    tiles and runs FULL ones mask-free, as stlib's tile kernels do. Padding (rows and columns past
    L, and the padding slots of a padded permutation) is never allowed."""

    def __init__(self, mask: M.Mask, head: int, padded: int):
        self.mask, self.head, self.padded = mask, head, padded
        valid = mask.token_validity()
        self._valid = np.zeros(padded, dtype=bool)
        self._valid[: mask.length] = True if valid is None else valid
        self._layouts: dict[tuple[int, int], object] = {}
        self._partial: dict[tuple[int, int, int, int], np.ndarray] = {}

    @property
    def shape(self) -> tuple[int, int]:
        return (self.padded, self.padded)

    def __eq__(self, other):
        if not isinstance(other, _TiledMask):
            return NotImplemented
        return (self.mask, self.head, self.padded) == (other.mask, other.head, other.padded)

    def __hash__(self):
        return hash((_TiledMask, self.mask, self.head, self.padded))

    def _kind(self, q0: int, k0: int, rows: int, cols: int) -> TileKind | None:
        """The layout's kind of the tile at (q0, k0) of ``rows`` x ``cols`` (a grid tile of those
        sizes), EMPTY past the mask's length; None for a slice that is not one tile."""
        if q0 % rows or k0 % cols:
            return None
        if q0 >= self.mask.length or k0 >= self.mask.length:
            return TileKind.EMPTY
        layout = self._layouts.get((rows, cols))
        if layout is None:
            layout = self._layouts[(rows, cols)] = block_layout(self.mask, rows, cols)
        kinds = layout.kinds
        return TileKind(int(kinds[self.head if kinds.shape[0] > 1 else 0, q0 // rows, k0 // cols]))

    def __getitem__(self, idx) -> np.ndarray:
        q_slice, k_slice = idx
        q0, q1, _ = q_slice.indices(self.padded)
        k0, k1, _ = k_slice.indices(self.padded)
        rows, cols = q1 - q0, k1 - k0
        kind = self._kind(q0, k0, rows, cols) if rows > 0 and cols > 0 else TileKind.EMPTY
        if kind is TileKind.EMPTY:
            return np.zeros((rows, cols), dtype=bool)
        if kind is TileKind.FULL:  # every real pair
            return self._valid[q0:q1, None] & self._valid[None, k0:k1]
        key = (q0, q1, k0, k1)
        if key not in self._partial:
            out = np.zeros((rows, cols), dtype=bool)
            real_q, real_k = min(q1, self.mask.length), min(k1, self.mask.length)
            if real_q > q0 and real_k > k0:
                out[: real_q - q0, : real_k - k0] = self.mask.block(q0, real_q, k0, real_k, self.head)
            self._partial[key] = out
        return self._partial[key]


def _rows_from_intervals(mask: M.Mask) -> tuple[M.Mask, np.ndarray | None] | None:
    """(the single-head mask in raster order whose key intervals give ``mask``'s rows, the raster
    row of each of ``mask``'s rows (-1 at padding; None: the same rows)), as stlib's tile counting
    reads a permuted view (``tile_counts.counting_key``); None where no intervals give them."""
    base, view = tile_counts.counting_key(mask)
    if not base.has_intervals or not (view is None or isinstance(view, TokenOrder)):
        return None
    return base, (None if view is None else view.perm)


def _visible_rows(mask: M.Mask, head: int, chunk: int = 4096) -> np.ndarray:
    """bool [L]: the rows of one head of ``mask`` that see at least one key: from key intervals
    (in raster order, through the permutation of a permuted view), else from dense rows a chunk at
    a time (L <= DENSE_LIMIT: ``mask_support``)."""
    one = mask if mask.num_heads is None else mask.head(head)
    length = one.length
    from_intervals = _rows_from_intervals(one)
    if from_intervals is None:
        seen = np.zeros(length, dtype=bool)
        for start in range(0, length, chunk):
            stop = min(start + chunk, length)
            seen[start:stop] = one.block(start, stop, 0, length).any(axis=1)
        return seen
    base, raster_row = from_intervals
    seen = np.zeros(base.length, dtype=bool)
    for start in range(0, base.length, chunk):
        rows = np.arange(start, min(start + chunk, base.length))
        lo, hi = base.key_intervals(rows)
        seen[rows] = (hi > lo).any(axis=1)
    if raster_row is None:
        return seen
    return (raster_row >= 0) & seen[np.maximum(raster_row, 0)]


def mask_support(mask: M.Mask) -> str | None:
    """Why Splash cannot run ``mask`` (None: it can): a mask without a lazy Splash form runs from
    stlib's block layout (``_TiledMask``), which reads key intervals above DENSE_LIMIT tokens."""
    heads = [0] if mask.num_heads is None else range(mask.num_heads)
    if mask.length <= M.DENSE_LIMIT or all(_lazy(mask, h, mask.length) is not None for h in heads):
        return None
    if all(_rows_from_intervals(mask if mask.num_heads is None else mask.head(h)) is not None for h in heads):
        return None
    return (
        f"impl='splash' has no lazy Splash form for {mask!r}, and without key intervals its tiles "
        f"would be classified from {mask.length}^2 pairs per head: that is limited to L <= "
        f"stlib.masks.DENSE_LIMIT = {M.DENSE_LIMIT}. Use another impl for this mask."
    )


def splash_mask(mask: M.Mask | None, num_heads: int, length: int, padded: int):
    """Splash ``MultiHeadMask`` ([num_heads, Lp, Lp]) for an stlib mask of length ``length``: its
    lazy Splash form where it has one, else its block layout (``_TiledMask``); and the rows that see
    at least one key (bool [num_heads or 1, length], None when every row does)."""
    if mask is None:
        mask = M.full(length)
    heads = [None] if mask.num_heads is None else list(range(mask.num_heads))
    per_head, visible, any_empty = [], [], False
    for h in heads:
        head = 0 if h is None else h
        lazy = _lazy(mask, head, padded)
        if lazy is None:
            rows = _visible_rows(mask, head)
            any_empty |= not rows.all()
            lazy = _TiledMask(mask, head, padded)
        else:
            rows = np.ones(length, dtype=bool)
        per_head.append(lazy)
        visible.append(rows)
    if mask.num_heads is None:
        per_head = per_head * num_heads  # one object: Splash processes it once, broadcasts its tables
    return sa.MultiHeadMask(tuple(per_head)), (np.stack(visible) if any_empty else None)


# --------------------------------------------------------------------------------------------
# the implementation


def splash_attention(q, k, v, mask, *, scale, config: Config, interpret):
    """Splash attention on validated [H, L, D] inputs (see ``stlib.attention``); returns [H, L, Dv] in
    q's dtype, zeros for rows that see no key. k and v may have H / G heads (G q heads per kv head)
    and v its own head dim Dv. Raises ValueError for block sizes that are not multiples of 128 and
    kv heads that do not divide the q heads."""
    num_heads, length, _ = q.shape
    if num_heads % k.shape[0] or k.shape[0] != v.shape[0]:
        raise ValueError(
            f"k and v heads ({k.shape[0]}, {v.shape[0]}) must be equal and divide the q heads {num_heads}"
        )
    blocks = SplashBlocks(config.block_q, config.block_kv, config.block_kv_compute)
    padded = blocks.padded_length(length)
    splash, visible = splash_mask(mask, num_heads, length, padded)
    if visible is not None and not visible.any():
        # Splash asserts on a mask with no allowed pair at all (its grid shrinks to width 0)
        return jnp.zeros((*q.shape[:2], v.shape[2]), q.dtype)

    dtype = jnp.result_type(q.dtype, k.dtype, v.dtype)
    q_scaled = (q.astype(jnp.float32) * scale).astype(dtype)  # Splash computes softmax(q k^T) v
    q_p, k_p, v_p = (_pad(x.astype(dtype), padded) for x in (q_scaled, k, v))  # [H, Lp, D]
    segment_ids = None
    if padded != length:
        ids = jnp.asarray((np.arange(padded) >= length).astype(np.int32))  # 0 real, 1 padding
        segment_ids = sa.SegmentIds(q=ids, kv=ids)

    kernel = sa.make_splash_mha(
        splash,
        block_sizes=blocks.to_splash(config.options.fused_backward),
        head_shards=1,
        q_seq_shards=1,
        interpret=resolve_interpret(interpret),
    )
    out = kernel(q_p, k_p, v_p, segment_ids)[:, :length]  # [H, L, Dv]
    if visible is not None:
        out = jnp.where(jnp.asarray(visible)[:, :, None], out, 0)
    return out.astype(q.dtype)


def _pad(x, padded: int):
    extra = padded - x.shape[1]
    return x if extra == 0 else jnp.pad(x, ((0, 0), (0, extra), (0, 0)))


def splash_work(layout, num_heads: int, head_dim: int):
    """Work of the Splash forward pass on ``layout`` (built for Splash's block sizes).

    Splash shrinks its grid's kv axis to the widest row of non-empty tiles when every head shares
    one mask (per-head masks keep the full kv axis here, an upper bound), computes every non-empty
    tile, and masks every computed tile when the sequence needs padding (the adapter's segment ids
    are compared on every tile) or else its PARTIAL tiles."""
    nq, nk = layout.grid_shape
    mult = num_heads if layout.num_heads == 1 else 1
    width = layout.max_row_width if layout.num_heads == 1 else nk
    computed = int(np.sum(layout.kinds != TileKind.EMPTY)) * mult
    padded = layout.num_tokens % layout.block_kv != 0 or layout.num_tokens % layout.block_q != 0
    masked = computed if padded else int(np.sum(layout.kinds == TileKind.PARTIAL)) * mult
    return work_from_counts(layout, num_heads, head_dim, num_heads * nq * width, computed, masked)


def _padded_layout(setup):
    """The tile layout of Splash's padded mask at its blocks (full, causal and band masks)."""
    blocks = splash_blocks(setup.length, setup.block_q, setup.block_kv)
    padded = blocks.padded_length(setup.length)
    mask = setup.mask
    if mask is None or isinstance(mask, M.FullMask):
        padded_mask = M.full(padded)
    elif isinstance(mask, M.CausalMask):
        padded_mask = M.causal(padded)
    elif isinstance(mask, M.BandMask):
        padded_mask = M.band(padded, mask.width)
    else:
        raise NotImplementedError(f"the Splash estimate knows full, causal and band masks, not {mask!r}")
    return blocks, block_layout(padded_mask, blocks.block_q, blocks.block_kv)


def splash_schedule_counts(setup, attribution) -> ScheduleCounts:
    """Splash's grid (named in the dump) is H x q tiles x (widest row of non-empty kv tiles); every
    non-empty tile of its padded mask is computed (its masking is branch-free), and a kv tile is
    fetched once per non-empty tile (data_next); q heads sharing a kv head (G per kv head, Splash's
    index map h // G) fetch it again at every head. Knows full, causal and band masks. Its backward
    kernels (``_dkv`` and ``_dq`` in their names): ``_backward_counts``."""
    blocks, layout = _padded_layout(setup)
    if attribution.grid is None:
        raise ValueError(f"{attribution.kernel}: the dump does not name Splash's grid")
    if "_dkv" in attribution.kernel or "_dq" in attribution.kernel:
        return _backward_counts(setup, attribution, blocks, layout)
    nq, nk = layout.grid_shape
    h = setup.num_heads
    if tuple(attribution.grid[:2]) != (h, nq):
        raise ValueError(
            f"{attribution.kernel}: grid {attribution.grid} does not start with (heads, q tiles) = {(h, nq)}"
        )
    from stlib.kernels.block_sparse import step_table
    from stlib.kernels.mask_info import BLOCK_SPARSE_STEP

    group = h // (getattr(setup, "num_kv_heads", None) or h)  # q heads per kv head
    kv = (np.arange(h) // group)[:, None, None] * nk + np.broadcast_to(
        BLOCK_SPARSE_STEP.fetch_kv.read(step_table(layout)), (h, nq, nk)
    )
    counts = {"init": h * nq, "finalise": h * nq, "compute": int(np.sum(layout.kinds != TileKind.EMPTY)) * h}
    return ScheduleCounts(
        counts,
        attribution.grid_steps,
        h * nq,
        block_changes(kv),
        blocks.block_q,
        blocks.block_kv,
        setup.itemsize,
        writes_lse=False,
    )


def _backward_counts(setup, attribution, blocks: SplashBlocks, layout) -> ScheduleCounts:
    """Splash's backward kernels on the forward's tiles (``SplashBlocks.to_splash``). The dk / dv
    kernel's grid is kv tiles x H x (widest column of non-empty q tiles); it inits and writes dk, dv
    once per (kv tile, head), fetches q, dO and the lse / di rows at every non-empty tile (and,
    fused, writes that tile's dq partial, [bq, D] in q's dtype, which XLA sums afterwards: glue).
    The split dq kernel's grid is the forward's; it fetches k, v at every non-empty tile. The lse /
    di rows are counted lane-dense ([1, bq] f32)."""
    nq, nk = layout.grid_shape
    h, d, item = setup.num_heads, setup.head_dim, setup.itemsize
    bq, bkv = blocks.block_q, blocks.block_kv
    computed = int(np.sum(layout.kinds != TileKind.EMPTY)) * h
    rows_f32 = 2 * bq * 4
    if "_dkv" in attribution.kernel:
        if tuple(attribution.grid[:2]) != (nk, h):
            raise ValueError(
                f"{attribution.kernel}: grid {attribution.grid} does not start with (kv tiles, heads) = {(nk, h)}"
            )
        rows = nk * h
        fused = (setup.options or {}).get("fused_backward", True)
        row_bytes = 4 * bkv * d * item  # k, v in; dk, dv out
        fetch_bytes = 2 * bq * d * item + rows_f32 + (bq * d * item if fused else 0)
    else:
        if tuple(attribution.grid[:2]) != (h, nq):
            raise ValueError(
                f"{attribution.kernel}: grid {attribution.grid} does not start with (heads, q tiles) = {(h, nq)}"
            )
        rows = h * nq
        row_bytes = 3 * bq * d * item + rows_f32  # q, dO in; dq out
        fetch_bytes = 2 * bkv * d * item  # k, v
    return ScheduleCounts(
        {"init": rows, "finalise": rows, "compute": computed},
        attribution.grid_steps,
        rows,
        computed,
        bq,
        bkv,
        item,
        writes_lse=False,
        row_bytes=row_bytes,
        fetch_bytes=fetch_bytes,
    )


IMPLEMENTATION = register(
    Implementation(
        name="splash",
        roles=frozenset({Role.BASELINE}),
        forward=splash_attention,
        description="JAX's Splash attention on stlib masks: the baseline",
        options_type=SplashOptions,
        work=lambda layout, num_heads, head_dim, options: splash_work(layout, num_heads, head_dim),
        chips=CHIPS,
        resolve=lambda mask, length, block_q, block_kv, options, interpret: (
            splash_blocks(length, block_q, block_kv, tile=_tile_tokens(mask)),
            options,
        ),
        capabilities=Capabilities(shared_kv_heads=True, head_dim_v=True, mask_support=mask_support),
    ),
    estimator=EstimatorHooks(
        kernel_names=("splash",),
        compute_regions=lambda kernel, n: ["compute"],
        schedule_counts=splash_schedule_counts,
        tuned_candidates=TUNED_CANDIDATES,
    ),
    presentation=Presentation(
        title="Splash",
    ),
)
