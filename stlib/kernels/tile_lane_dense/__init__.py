"""``pallas_tile_lane_dense``: the tile-aligned sparse kernel with keys on sublanes.

The same tile skipping as ``pallas_tile`` (a grid (H, q tiles, widest row) over each row's
non-empty kv tiles, steps past a row's count skipped), laid out the way the public Sparse VideoGen
TPU design lays it out (``../shared/REFERENCE.md`` section 3): scores k q^T with lane-dense softmax
statistics, an inner key loop in chunks and register tiles, one pass that writes the output once in
q's dtype, no LSE, no merge and no padded copies of q, k, v (``kernel``). Each step's region is a
code in the step table (``steps``): FULL, RAGGED, MASKED, or a pattern of mask-free sub-tiles.

Each computed step costs 4 * pairs * D flops (``StepPlan.pairs``: the whole tile, the real keys of a
RAGGED tile, the FULL sub-tiles of a pattern) and moves one k and one v block
(2 * block_kv * D * itemsize bytes) when its kv tile changes.
"""

from __future__ import annotations

import dataclasses
import math

from stlib import accounting
from stlib._intmath import round_up
from stlib.blocks import COMPILE_CHIP, BlockSizes, default_block_sizes
from stlib.contract import Config, EstimatorHooks, Presentation, ScheduleCounts
from stlib.device import CHIPS, LANES, resolve_interpret
from stlib.geometry import tile_rows
from stlib.kernels import flash_options
from stlib.kernels.backward import tile_training
from stlib.kernels.backward_vmem import dq_windows
from stlib.kernels.pallas_call import VMEM_SHARE, vmem_limit
from stlib.kernels.steps import (
    CODE_BITS,
    FIRST_PATTERN,
    MAX_PATTERNS,
    STEP,
    Pattern,
    StepKind,
    StepPlan,
    grains,
    kernel_name,
    plan_steps,
    region_name,
    regions_of,
)
from stlib.kernels.tile_lane_dense.chips import (
    BACKWARD_STEP_BLOCKS,
    BACKWARD_TUNED,
    CHIP_SETTINGS,
    DEFAULT_BLOCKS,
    FOLD_LANES,
    NAME,
    ROWS_FROM,
    TILED_ROWS,
    ChipSettings,
    settings,
)
from stlib.kernels.tile_lane_dense.kernel import KERNEL_PREFIX, LaneDenseOptions, lane_dense_attention
from stlib.kernels.tile_lane_dense.vmem import check_blocks, fit_lookahead, vmem_bytes
from stlib.layout import BlockLayout
from stlib.masks import Mask
from stlib.passes import BoundaryPolicy, split_passes
from stlib.plan import KernelPlan, prepare
from stlib.registry import Implementation, Role, register

__all__ = [
    "BACKWARD_STEP_BLOCKS",
    "BACKWARD_TUNED",
    "CHIP_SETTINGS",
    "CODE_BITS",
    "DEFAULT_BLOCKS",
    "FIRST_PATTERN",
    "FOLD_LANES",
    "IMPLEMENTATION",
    "KERNEL_PREFIX",
    "MAX_PATTERNS",
    "NAME",
    "ROWS_FROM",
    "SLIDING_TILE_ROW",
    "SWEEP_CANDIDATES",
    "TILED_ROWS",
    "VMEM_SHARE",
    "ChipSettings",
    "LaneDenseOptions",
    "Pattern",
    "StepKind",
    "StepPlan",
    "check_blocks",
    "fit_lookahead",
    "grains",
    "kernel_name",
    "lane_dense_attention",
    "lane_dense_schedule_counts",
    "lane_dense_work",
    "plan_steps",
    "region_name",
    "resolve_blocks",
    "settings",
    "sweep_facts",
    "tiled_blocks",
    "tiled_rows",
    "vmem_bytes",
    "vmem_limit",
]


def backward_step_blocks(layout: BlockLayout, options: LaneDenseOptions, chip: str | None, interpret):
    """(block_q, block_kv, keys per update) of the backward's step-coded pass on ``layout``
    (``backward.tile_training``'s ``step_blocks``): ``options.backward_blocks``, else the forward's
    blocks and chunk in interpret mode, else the chip's tuned ones; keys per update shrunk to divide
    the kv block where the forward's is the smaller.

    >>> from stlib import block_layout, masks
    >>> forward = block_layout(masks.band(9000, 900), 2560, 1280)
    >>> backward_step_blocks(forward, LaneDenseOptions(backward_blocks=(2048, 2048, 1024)), "v6e", False)
    (2048, 1280, 256)
    """
    if resolve_interpret(interpret) and options.backward_blocks is None:
        return layout.block_q, layout.block_kv, options.block_kv_compute or layout.block_kv
    block_q, block_kv, grain = options.backward_blocks or settings(chip).backward_blocks
    block_kv = min(block_kv, layout.block_kv)
    return min(block_q, layout.block_q), block_kv, math.gcd(grain, block_kv)


def backward_runs(chip: str, blocks, length: int, head_dim: int, itemsize: int) -> bool:
    """Whether the backward runs its step-coded pass at ``blocks`` = (block_q, block_kv, keys per
    update) on ``chip`` for [H, ``length``, ``head_dim``] inputs: no larger than the chip's forward
    blocks, and a dq window fits beside their updates in its VMEM (the backward sweep's candidates).

    >>> backward_runs("v6e", (2048, 2048, 1024), 75_600, 128, 2), backward_runs("tpu7x", (2048, 2048, 1024), 75_600, 128, 2)
    (True, False)
    """
    forward = DEFAULT_BLOCKS[chip]
    block_q, block_kv, keys = blocks
    if block_q > forward.block_q or block_kv > forward.block_kv:
        return False
    return bool(dq_windows(-(-length // block_q), block_q, block_kv, head_dim, itemsize, chip, keys))


#: Tokens in one row of the case study's 3x8x16 tiles (five tiles along x): the sliding tile's unit.
SLIDING_TILE_ROW = 5 * 384
#: (block_q, block_kv, block_kv_compute) for dense and banded masks, the scores of every chunk issued
#: ahead (``LaneDenseOptions.lookahead``): chunks of 256 and 512 keys at the blocks that won a chip
#: before (v5e 1024 x 2048, TPU7x 2048 x 2048, v6e 2560 x 2560; schedules of 1 x 8,192 tokens put
#: v6e's 2560 x 2560 at 1.96 bundles per 1,000 score pairs with 256 against 2.05 with 512), and of
#: 128 keys, which folds of 256 queries (``FOLD_LANES``) made pay on v5e (2048 x 2048: 16,330 bundles
#: a FULL step against 17,435 with 256 keys). 1024 x 2048 / 512 lost on every chip in the last sweep.
_SQUARE_BLOCKS = (
    (1024, 2048, 256),
    (2048, 2048, 128),
    (2048, 2048, 256),
    (2048, 2048, 512),
    (2560, 2560, 128),
    (2560, 2560, 256),
)
#: The block sweep's candidates (block_q, block_kv, block_kv_compute) per mask family
#: (``stlib.bench.block_sweep``). The sliding tile's blocks hold whole rows of 3x8x16 tiles (a row of
#: five: 1,920 tokens, run as pattern steps at the grain of one tile) or two rows; one tile a block
#: (384 x 384) lost on every chip in the first sweep (0.26 to 0.32 of dense Splash against 0.13 to 0.15).
SWEEP_CANDIDATES = {
    "dense": _SQUARE_BLOCKS,
    "band 0.25": _SQUARE_BLOCKS,
    "sliding tile": (
        (SLIDING_TILE_ROW, SLIDING_TILE_ROW, 384),
        (2 * SLIDING_TILE_ROW, SLIDING_TILE_ROW, 384),
        (SLIDING_TILE_ROW, 2 * SLIDING_TILE_ROW, 384),
    ),
}


def tiled_rows(chip: str | None) -> tuple[int, int]:
    """(rows of 3-D tiles per q block, per kv block) on ``chip`` (None: v6e): its sweep's winner, or
    ``ROWS_FROM``'s where its sliding tile was not swept (one row each where nothing was)."""
    return settings(chip).tiled_rows


def sweep_facts(
    chip: str,
    family: str,
    block_q: int,
    block_kv: int,
    block_kv_compute: int,
    *,
    head_dim: int,
    itemsize: int,
) -> dict:
    """What the block sweep records beside a candidate's estimate: the queries per fold of a FULL
    step (``FOLD_LANES``), the chunks issued ahead (``fit_lookahead``), the VMEM the candidate needs
    (``vmem_bytes``) and the limit it asks for on ``chip``. Dense work folds; MASKED and pattern steps
    (the other families) hold whole lane runs."""
    sizes = (block_q, block_kv, block_kv_compute, min(256, block_kv_compute), head_dim, itemsize)
    fold_lanes = settings(chip).fold_lanes or block_q
    held = fold_lanes if family == "dense" else block_q
    lookahead = fit_lookahead(*sizes, chip=chip, fold_lanes=held)
    return {
        "fold_lanes": fold_lanes,
        "lookahead": lookahead,
        "vmem_need": vmem_bytes(*sizes, lookahead=lookahead, fold_lanes=held),
        "vmem_limit": vmem_limit(chip),
    }


def tiled_blocks(mask: Mask | None, chip: str | None) -> BlockSizes | None:
    """Blocks of whole rows of 3-D tiles (``TILED_ROWS``) for a mask in a padded tiled order, with a
    chunk of one tile where it is a multiple of 128; None for other masks or rows off the lane tiling."""
    rows = None if mask is None or mask.order is None else tile_rows(mask.order)
    if rows is None or (rows[0] * rows[1]) % LANES:
        return None
    volume, per_row = rows
    rows_q, rows_kv = tiled_rows(chip)
    bkv = rows_kv * volume * per_row
    return BlockSizes(rows_q * volume * per_row, bkv, volume if volume % LANES == 0 else None)


def resolve_blocks(
    mask: Mask | None, length: int, block_q, block_kv, options: LaneDenseOptions, interpret, chip=None
):
    """(BlockSizes, options with the chunk resolved): explicit blocks, else this kernel's default for
    ``chip`` (the call's ``Config.chip``: ``options.chip``, else the chip at hand; None here:
    ``options.chip``; v6e when compiling elsewhere; small tiles in interpret mode), or whole rows of
    3-D tiles for a mask in a tiled order (``tiled_blocks``, whose chunk of one tile explicit blocks
    of that order take too); blocks shrunk to short sequences in multiples of 128."""
    chip = chip or options.chip
    if chip is None and not resolve_interpret(interpret):
        chip = COMPILE_CHIP
    explicit = block_q is not None and block_kv is not None
    tiled = tiled_blocks(mask, chip)
    base = (None if explicit else tiled) or default_block_sizes(chip, DEFAULT_BLOCKS)
    bq, bkv = block_q or base.block_q, block_kv or base.block_kv
    chunk = options.block_kv_compute
    if chunk is None and block_kv is None:
        chunk = base.block_kv_compute
    tile_chunk = tiled.block_kv_compute if tiled else None
    if chunk is None and tile_chunk and bkv % tile_chunk == 0:
        chunk = tile_chunk  # a tiled order's explicit blocks: one 3-D tile per chunk, as its defaults
    if not explicit:
        bq, bkv = min(bq, round_up(length, LANES)), min(bkv, round_up(length, LANES))
        if chunk is not None and (chunk > bkv or bkv % chunk):
            chunk = None
    return BlockSizes(bq, bkv, chunk), dataclasses.replace(options, block_kv_compute=chunk)


def _forward(q, k, v, mask: Mask | None, *, scale, config: Config, interpret, plan: KernelPlan):
    return lane_dense_attention(
        q, k, v, plan.steps, scale=scale, options=config.options, chip=config.chip, interpret=interpret
    )


def _forward_with_lse(q, k, v, plan: KernelPlan, *, scale, interpret):
    return lane_dense_attention(
        q, k, v, plan.steps, scale=scale, options=plan.options, chip=plan.chip, interpret=interpret,
        return_lse=True,
    )  # fmt: skip


def _forward_block(q, k, v, stack, block, *, scale, config: Config, interpret, plan: KernelPlan):
    """Block ``block`` (traced) of ``stack`` (``StackedBlocks``) -> (o, lse [H, L]): the stack's
    joint step plan (the call's plan), the block's rows of its tables and its offsets as the
    kernel's data."""
    return lane_dense_attention(
        q, k, v, plan.steps, scale=scale, options=config.options, chip=config.chip, interpret=interpret,
        return_lse=True, block=block,
    )  # fmt: skip


def _prepare(mask: Mask | None, length: int, config: Config, interpret) -> KernelPlan:
    """The call's plan with the forward's step plan (``plan_steps`` at the options' pattern grain)."""
    return prepare(
        mask, length, config, interpret, steps=lambda layout, n, options: _plan(layout, options, config.chip)
    )


def run_plan(q, k, v, plan, *, scale, options, interpret):
    """pallas_tile_lane_dense on a routed plan's kernel layout (``stlib.routing.SvgPlan``; rounded
    tiles as FULL tiles): reorder per head, run, restore."""
    opts = IMPLEMENTATION.options(options)
    layout = plan.kernel_layout
    call = IMPLEMENTATION.kernel_call(
        layout.mask, layout.mask.length, scale=scale, block_q=layout.block_q, block_kv=layout.block_kv,
        options=opts, interpret=interpret,
    )  # fmt: skip
    steps = _plan(layout, opts, call["config"].chip)
    kernel = IMPLEMENTATION.trainable(
        layout.mask,
        call,
        primal=lambda *qkv: lane_dense_attention(
            *qkv, steps, scale=scale, options=opts, chip=call["config"].chip, interpret=interpret
        ),
    )
    return plan.in_order(q, k, v, kernel)


def _plan(layout: BlockLayout, options, chip: str | None = None) -> StepPlan:
    """The step plan of ``layout`` under ``options`` (a LaneDenseOptions, a dict of its fields, None)
    for ``chip`` (the call's ``Config.chip``; None: ``options.chip``), whose program budget it keeps
    (``steps.program_pairs``)."""
    if not isinstance(options, LaneDenseOptions):
        options = LaneDenseOptions(**(options or {}))
    return plan_steps(layout, layout.length, options.pattern_grain, chip or options.chip)


def lane_dense_work(
    layout: BlockLayout, num_heads: int, head_dim: int, options=None
) -> accounting.KernelWork:
    """Grid steps, flops and exps of ``lane_dense_attention`` for this layout."""
    steps = _plan(layout, options)
    codes = steps.codes
    mult = num_heads if layout.num_heads == 1 else 1
    pairs = sum(int((codes == c).sum()) * steps.pairs(c) for c in steps.present) * mult
    computed = int((codes >= 0).sum()) * mult
    plain = int((codes == StepKind.FULL).sum()) + sum(  # steps that evaluate no mask and mask no key
        int((codes == c).sum())
        for c in steps.present
        if c >= FIRST_PATTERN and not steps.pattern(c).padded and not steps.pattern(c).masked_sub_tiles
    )
    widest = max(int((codes >= 0).sum(axis=2).max()) if codes.size else 0, 1)
    allowed = layout.allowed_pairs * mult
    return accounting.KernelWork(
        grid_steps=num_heads * codes.shape[1] * widest,
        computed_tiles=computed,
        masked_tiles=computed - plain * mult,
        executed_flops=4.0 * pairs * head_dim,
        useful_flops=4.0 * allowed * head_dim,
        exps=float(pairs),
    )


def _compute_regions(kernel: str, n: int) -> list[str]:
    """One conditional compute region per step code present, in code order (the kernel's name lists
    them)."""
    return regions_of(KERNEL_PREFIX, kernel)


def lane_dense_schedule_counts(setup, attribution) -> ScheduleCounts:
    """Executions of each compiled path, grid steps and block fetches, from the step tables."""
    options = LaneDenseOptions(**setup.options)  # validates the options the kernel was compiled with
    h, layout = setup.num_heads, setup.layout
    mult = h if layout.num_heads == 1 else 1
    steps = plan_steps(layout, setup.length, options.pattern_grain, options.chip)
    name = kernel_name(KERNEL_PREFIX, steps.present)
    if name != attribution.kernel.split(".")[0]:
        raise ValueError(f"{attribution.kernel!r}: the layout's step kinds make kernel {name!r}")
    entries, _ = steps.tables()
    paths = {region_name(code): int((steps.codes == code).sum()) * mult for code in steps.present}
    return accounting.row_grid_counts(setup, STEP.kv.read(entries), paths)


IMPLEMENTATION = register(
    Implementation(
        name=NAME,
        roles=frozenset({Role.BEST_TILE}),
        forward=_forward,
        description="tile-aligned sparse kernel, keys on sublanes: lane-dense softmax statistics, one pass, "
        "per-step FULL / RAGGED / MASKED flags, no padded inputs",
        options_type=LaneDenseOptions,
        work=lambda layout, num_heads, head_dim, options: lane_dense_work(
            layout, num_heads, head_dim, options
        ),
        chips=CHIPS,
        resolve=resolve_blocks,
        plan_runner=run_plan,
        stack_forward=_forward_block,
        prepare=_prepare,
        backward=tile_training(
            _forward_with_lse,
            lambda layout, options: split_passes(layout, BoundaryPolicy.EXACT),
            own_blocks=True,
            step_blocks=backward_step_blocks,
        ),
    ),
    estimator=EstimatorHooks(
        kernel_names=(KERNEL_PREFIX,),
        compute_regions=_compute_regions,
        schedule_counts=lane_dense_schedule_counts,
        tuned_candidates=flash_options.TUNED_CANDIDATES,
    ),
    presentation=Presentation(
        sweep_candidates=SWEEP_CANDIDATES,
        sweep_facts=sweep_facts,
        backward_runs=backward_runs,
        backward_tuned=BACKWARD_TUNED,
    ),
)
