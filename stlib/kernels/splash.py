"""``impl="splash"``: JAX's Splash attention (jax.experimental.pallas.ops.tpu.splash_attention) on
stlib masks: the baseline every sparse kernel is measured against.

What the adapter does around ``make_splash_mha``:

* masks (``stlib.kernels.splash_masks``): Splash's lazy masks where a mask has one (full, causal,
  bands, ``&`` / ``|`` of them, per head), else stlib's own block layout tile by tile, at any length.
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
from stlib._intmath import round_up
from stlib.accounting import block_changes, work_from_counts
from stlib.contract import Capabilities, Config, EstimatorHooks, Presentation, ScheduleCounts
from stlib.device import CHIP_TABLE, CHIPS, LANES, resolve_interpret
from stlib.kernels.splash_masks import mask_support, splash_mask, tile_tokens
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


#: ``SplashOptions(fused_backward=None)`` fuses the backward where its dq partials take at most this
#: share of one device's HBM (the smallest chip's off a TPU). Dense at the case study with 1,024 x
#: 2,048 tiles: 7.2 GB of partials, fused (589 ms a training step on a v5e against 735 split); the
#: 3-D tiled sliding tile with 384 x 384 tiles: 43 GB, split (fused, its compile asks for 41.92 GB of
#: the v5e's 15.75).
FUSED_PARTIALS_SHARE = 0.5


@dataclass(frozen=True)
class SplashOptions:
    """``fused_backward``: ``jax.grad`` runs Splash's fused dk / dv / dq kernel (True; dq summed
    over per-kv-tile partials in HBM, [Lp / block_kv, H, Lp, D] in q's dtype), its split dq and
    dk / dv kernels (False), or (None, the default) fused where those partials fit
    (``fuses_backward``)."""

    fused_backward: bool | None = None

    def __post_init__(self):
        if self.fused_backward is not None and not isinstance(self.fused_backward, bool):
            raise TypeError(f"fused_backward={self.fused_backward!r} must be True, False or None")


#: Most bytes of mask info (forward, dq and dk / dv: block tables and the distinct PARTIAL blocks)
#: one Splash call may carry: its program holds them as constants. On a TPU v5e, the sliding tile
#: in its 3-D tiled order at 512 x 1,024 (0.62 GB, 394 distinct partial blocks) compiled and ran;
#: at 1,024 x 2,048 (4.67 GB, 742 of 2 MB) its forward captured 3.11 GB of constants and had not
#: compiled after 5 minutes.
MASK_INFO_LIMIT = 1_000_000_000


def mask_info_bytes(kernel) -> int:
    """Bytes of a Splash kernel's mask info arrays (forward, dq, dk / dv; those it has)."""
    fields = ("data_next", "mask_next", "block_mask", "partial_mask_blocks", "q_sequence")
    infos = (kernel.fwd_mask_info, kernel.dq_mask_info, kernel.dkv_mask_info)
    return sum(
        getattr(info, name).nbytes
        for info in infos
        if info is not None
        for name in fields
        if getattr(info, name) is not None
    )


def dq_partial_bytes(num_heads: int, padded: int, block_kv: int, head_dim: int, itemsize: int) -> int:
    """Bytes of the fused backward's dq partials: one [H, Lp, D] per kv tile.

    >>> round(dq_partial_bytes(10, 75_776, 2048, 128, 2) / 1e9, 2)
    7.18
    """
    return padded // block_kv * num_heads * padded * head_dim * itemsize


def fuses_backward(options: SplashOptions, partial_bytes: int, chip: str | None) -> bool:
    """Whether Splash's backward runs fused: as ``options`` says, else (None) where ``partial_bytes``
    of dq partials take at most ``FUSED_PARTIALS_SHARE`` of ``chip``'s HBM per device (None: the
    smallest chip's, as a program compiled off a TPU must fit every chip)."""
    if options.fused_backward is not None:
        return options.fused_backward
    capacity = CHIP_TABLE[chip].hbm_capacity if chip else min(c.hbm_capacity for c in CHIP_TABLE.values())
    return partial_bytes <= FUSED_PARTIALS_SHARE * capacity


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

    partials = dq_partial_bytes(num_heads, padded, blocks.block_kv, q.shape[2], jnp.dtype(dtype).itemsize)
    kernel = sa.make_splash_mha(
        splash,
        block_sizes=blocks.to_splash(fuses_backward(config.options, partials, config.chip)),
        head_shards=1,
        q_seq_shards=1,
        interpret=resolve_interpret(interpret),
    )
    info_bytes = mask_info_bytes(kernel)
    if info_bytes > MASK_INFO_LIMIT:
        raise ValueError(
            f"Splash's mask info for {mask!r} at {blocks.block_q} x {blocks.block_kv} blocks takes "
            f"{info_bytes / 1e9:.2f} GB ({kernel.fwd_mask_info.partial_mask_blocks.shape[0]} distinct "
            f"partial blocks in the forward), past MASK_INFO_LIMIT = {MASK_INFO_LIMIT / 1e9:.1f} GB: the "
            "program would carry it as constants. Use smaller blocks (or blocks the mask's tiles align "
            "to) or a tile kernel."
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
    form = ("full",) if setup.mask is None else setup.mask.form()
    kind = None if form is None else form[0]
    if kind == "full":
        padded_mask = M.full(padded)
    elif kind == "causal":
        padded_mask = M.causal(padded)
    elif kind == "band":
        padded_mask = M.band(padded, form[1])
    else:
        raise NotImplementedError(
            f"the Splash estimate knows full, causal and band masks, not {setup.mask!r}"
        )
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
    fused, writes that tile's dq partial, [bq, D] in q's dtype, which XLA sums afterwards: glue; a
    fused dk / dv kernel is known by that output, [Lp / bkv, H, Lp, D], as it was compiled).
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
        fused = any(role == "output" and len(shape) == 4 for _, _, shape, role in attribution.operands)
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
        resolve=lambda mask, length, block_q, block_kv, options, interpret, chip: (
            splash_blocks(length, block_q, block_kv, tile=tile_tokens(mask)),
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
