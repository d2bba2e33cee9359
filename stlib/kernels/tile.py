"""``pallas_tile``: the tile-aligned sparse kernel. Its grid visits only non-empty tiles.

Two grid forms, driven by scalar-prefetched tables built from the layout:

* ``"rows"``: grid (H, q tiles, W) with W the widest row; each q tile walks its own kv-tile list
  and the steps past its count are skipped (and fetch nothing: the list repeats its last entry).
* ``"flat"``: grid (H, S) over the active (q tile, kv tile) steps in row order, so rows of unequal
  width (causal, radial) waste no steps; first / last flags open and close each row.

The mask mode of a pass is fixed at trace time: the main pass runs FULL tiles with no mask work
at all; FULL tiles whose keys end in padding (the ragged sequence end, or the padded 3-D tiles of
a tiled order) run in a "ragged" pass that only compares each key's position with the tile's
count of real keys; PARTIAL tiles run in a masked pass that evaluates the mask. The passes'
results are merged with a numerically stable log-sum-exp merge. ``boundary="balanced"`` instead rounds PARTIAL tiles in or out, keeping the
computed pairs close to the allowed-pair budget (the Sparse VideoGen TPU design): faster, and
approximate. Each computed step costs 4 * block_q * block_kv * D flops.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from stlib import accounting
from stlib.blocks import BlockSizes
from stlib.contract import Config, EstimatorHooks, Presentation, ScheduleCounts
from stlib.device import CHIPS
from stlib.kernels import flash_options, mask_info, online_softmax, pallas_call
from stlib.kernels.backward import tile_training
from stlib.layout import BlockLayout, flat_steps, row_tables
from stlib.masks import Mask
from stlib.passes import SPLIT_KINDS, BoundaryPolicy, MaskPlan, MaskPlanMode, PassKind, split_passes
from stlib.plan import KernelPlan, prepare
from stlib.reference import merge_partials
from stlib.registry import Implementation, Role, register

NAME = "pallas_tile"


class GridForm(enum.StrEnum):
    """ROWS: grid (H, q tiles, widest row), steps past a row's count skipped; FLAT: grid (H, active
    steps) in row order, first / last flags open and close each row."""

    ROWS = "rows"
    FLAT = "flat"


def _enum_field(options, name: str, kind: type[enum.Enum]) -> None:
    value = getattr(options, name)
    try:
        object.__setattr__(options, name, kind(value))
    except ValueError:
        raise ValueError(f"{name}={value!r} must be one of {[k.value for k in kind]}") from None


@dataclass(frozen=True)
class TileOptions(flash_options.FlashOptions):
    """``form``: the grid form (``GridForm`` or its name); ``boundary``: the boundary policy
    (``BoundaryPolicy`` or its name); ``exp2`` (on by default here) and ``block_kv_compute`` as in
    ``FlashOptions``."""

    exp2: bool = True
    form: GridForm = GridForm.ROWS
    boundary: BoundaryPolicy = BoundaryPolicy.EXACT

    def __post_init__(self):
        super().__post_init__()
        _enum_field(self, "form", GridForm)
        _enum_field(self, "boundary", BoundaryPolicy)


# --------------------------------------------------------------------------------------------
# one pass


def _pass_tables(selected: np.ndarray, plan: MaskPlan, form: GridForm) -> tuple[list[np.ndarray], int]:
    """Scalar-prefetch tables of one pass and its innermost grid extent (W or S)."""
    if form == GridForm.ROWS:
        return mask_info.row_step_tables(selected, plan)
    return mask_info.flat_step_tables(selected, plan)


def _run_pass(
    qkv,
    selected,
    plan,
    *,
    bq,
    bkv,
    options: TileOptions,
    softmax: online_softmax.SoftmaxOptions,
    interpret,
    out_dtype,
    name,
):
    """One pallas_call over the tiles in ``selected`` of ``qkv`` = (q, k, v), padded to the tiles.
    Returns o [H, Lq, D] and lse [H, Lq, 1]."""
    qp, kp, vp = qkv
    num_heads, lq, head_dim = qp.shape
    nq = lq // bq
    shared = selected.shape[0] == 1
    tables, extent = _pass_tables(selected, plan, options.form)
    mask_info.check_prefetch(
        tables,
        plan,
        bq,
        f"pallas_tile {options.form} ({selected.shape[0]} heads x "
        f"{selected.shape[1]} x {selected.shape[2]} tiles of {bq}x{bkv})",
        "use larger tiles, the other grid form, or fewer heads per call",
    )
    chunk = options.block_kv_compute or bkv
    masked = plan.mode != MaskPlanMode.NONE

    if options.form == GridForm.ROWS:
        grid = (num_heads, nq, extent)

        def locate(h, i, j, tiles, counts, *_):
            """(head, q tile, kv tile, table slot) of grid step (h, i, j)."""
            row = i if shared else h * nq + i
            return h, i, tiles[row * extent + j], row * extent + j

        def step_flags(h, i, j, tiles, counts, *_):
            row = i if shared else h * nq + i
            return j == 0, j == extent - 1, j < counts[row]

        semantics = ("parallel", "parallel", "arbitrary")
    else:
        grid = (num_heads if shared else 1, extent)

        head_q_word, flags_word = mask_info.FLAT_HEAD_Q, mask_info.FLAT_KV_FLAGS

        def locate(g, s, head_q, kv_flags, *_):
            return (
                g + head_q_word.head.read(head_q[s]),
                head_q_word.q.read(head_q[s]),
                flags_word.kv.read(kv_flags[s]),
                s,
            )

        def step_flags(g, s, head_q, kv_flags, *_):
            flags = kv_flags[s]
            return (
                flags_word.first.is_set(flags),
                flags_word.last.is_set(flags),
                flags_word.active.is_set(flags),
            )

        semantics = ("parallel", "arbitrary")

    def kernel(*refs):
        n_tab = len(tables)
        tab = refs[:n_tab]
        if plan.mode == MaskPlanMode.TABLE:
            q_ref, k_ref, v_ref, mask_ref, o_ref, lse_ref, m_ref, l_ref, acc_ref = refs[n_tab:]
        else:
            q_ref, k_ref, v_ref, o_ref, lse_ref, m_ref, l_ref, acc_ref = refs[n_tab:]
        ids = tuple(pl.program_id(a) for a in range(len(grid)))
        head, qi, ki, _ = locate(*ids, *tab)
        first, last, active = step_flags(*ids, *tab)

        @pl.when(first)
        def _():
            online_softmax.init_row(m_ref, l_ref, acc_ref)

        if not masked:
            mask_fn = None
        elif plan.mode == MaskPlanMode.IOTA:
            mask_fn = lambda c0, shape: mask_info.iota_mask(plan, qi * bq, ki * bkv + c0, shape, head)
        elif plan.mode == MaskPlanMode.PREFIX:  # the tile's real keys come first: one compare per score
            real_keys = tab[-1][ki]
            mask_fn = lambda c0, shape: c0 + jax.lax.broadcasted_iota(jnp.int32, shape, 1) < real_keys
        else:
            mask_fn = lambda c0, shape: mask_ref[:, pl.ds(c0, shape[1])] != 0

        @pl.when(active)
        def _():
            online_softmax.update_tile(
                online_softmax.scaled_q(q_ref, softmax),
                k_ref,
                v_ref,
                m_ref,
                l_ref,
                acc_ref,
                softmax,
                chunk,
                mask_fn,
            )

        @pl.when(last)
        def _():
            online_softmax.finish_row(o_ref, lse_ref, m_ref, l_ref, acc_ref, softmax)

    def q_map(*args):
        h, qi, _, _ = locate(*args)
        return (h, qi, 0)

    def kv_map(*args):
        h, _, ki, _ = locate(*args)
        return (h, ki, 0)

    in_specs = [
        pl.BlockSpec((None, bq, head_dim), q_map),  # q [bq, D]
        pl.BlockSpec((None, bkv, head_dim), kv_map),  # k [bkv, D]
        pl.BlockSpec((None, bkv, head_dim), kv_map),  # v [bkv, D]
    ]
    operands = [qp, kp, vp]
    if plan.mode == MaskPlanMode.TABLE:
        in_specs.append(
            pl.BlockSpec(
                (None, bq, bkv), lambda *args: (args[len(grid) + len(tables) - 1][locate(*args)[3]], 0, 0)
            )
        )
        operands.append(jnp.asarray(plan.table))
    out_specs = [
        pl.BlockSpec((None, bq, head_dim), q_map),  # o [bq, D]
        pl.BlockSpec((None, bq, 1), q_map),  # lse [bq, 1]
    ]
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=len(tables),
        grid=grid,
        in_specs=in_specs,
        out_specs=out_specs,
        scratch_shapes=online_softmax.softmax_scratch(bq, head_dim),
    )
    out_shape = [
        jax.ShapeDtypeStruct(qp.shape, out_dtype),
        jax.ShapeDtypeStruct((num_heads, lq, 1), jnp.float32),
    ]
    return pallas_call.run_pallas(
        kernel,
        grid_spec=grid_spec,
        out_shape=out_shape,
        interpret=interpret,
        dimension_semantics=semantics,
        name=name,
        operands=[*(jnp.asarray(t) for t in tables), *operands],
    )


# --------------------------------------------------------------------------------------------
# the whole call


def tile_attention(
    q,
    k,
    v,
    layout: BlockLayout,
    *,
    scale: float,
    options: TileOptions = TileOptions(),
    interpret: bool | None = None,
    return_lse: bool = False,
):
    """q, k, v [H, L, D] -> o [H, L, D] (and lse [H, L] natural log, -inf for rows that see
    nothing, when ``return_lse``). ``layout`` is the tile layout of the mask for these tokens."""
    num_heads, length, _ = q.shape
    bq, bkv = layout.block_q, layout.block_kv
    BlockSizes(bq, bkv, options.block_kv_compute)  # validates the tiling rule
    passes = split_passes(layout, options.boundary)
    qp, kp, vp = (
        pallas_call.pad_sequence(q, bq),
        pallas_call.pad_sequence(k, bkv),
        pallas_call.pad_sequence(v, bkv),
    )
    softmax = online_softmax.SoftmaxOptions(scale, options.exp2)
    out_dtype = jnp.float32 if len(passes) > 1 else q.dtype
    o = lse = None
    for p in passes:
        o_p, lse_p = _run_pass(
            (qp, kp, vp),
            p.selected,
            p.plan,
            bq=bq,
            bkv=bkv,
            options=options,
            softmax=softmax,
            interpret=interpret,
            out_dtype=out_dtype,
            name=f"stlib_tile_{p.name}",
        )
        o, lse = (o_p, lse_p) if o is None else merge_partials(o, lse, o_p, lse_p)
    if o is None:  # nothing to compute: every row sees nothing
        o, lse = jnp.zeros(qp.shape, q.dtype), jnp.full((num_heads, qp.shape[1], 1), -jnp.inf, jnp.float32)
    o = o[:, :length].astype(q.dtype)
    if return_lse:
        return o, lse[:, :length, 0]
    return o


def tile_work(layout: BlockLayout, num_heads: int, head_dim: int, options: TileOptions | None = None):
    """Grid steps and flops of ``tile_attention`` (all passes) for this layout."""
    options = options or TileOptions()
    passes = split_passes(layout, options.boundary)
    mult = num_heads if layout.num_heads == 1 else 1
    steps = computed = masked = 0
    for p in passes:
        computed += int(p.selected.sum()) * mult
        masked += int(p.selected.sum()) * mult if p.name != PassKind.FULL else 0
        if options.form == GridForm.ROWS:
            steps += num_heads * p.selected.shape[1] * row_tables(p.selected)[0].shape[2]
        else:
            steps += mult * int(flat_steps(p.selected)["step_q"].shape[0])
    return accounting.work_from_counts(layout, num_heads, head_dim, steps, computed, masked)


def _forward(q, k, v, mask: Mask | None, *, scale, config: Config, interpret, plan: KernelPlan):
    return tile_attention(q, k, v, plan.layout, scale=scale, interpret=interpret, options=config.options)


def _forward_with_lse(q, k, v, plan: KernelPlan, *, scale, interpret):
    return tile_attention(
        q, k, v, plan.layout, scale=scale, interpret=interpret, options=plan.options, return_lse=True
    )


def run_plan(q, k, v, plan, *, scale, options, interpret):
    """pallas_tile on a routed plan's layout (``stlib.routing.SvgPlan``), with the plan's boundary
    policy: reorder per head, run, restore. Raises ValueError for an explicit, different boundary."""
    opts = IMPLEMENTATION.options(options)
    explicit = (
        options.get("boundary")
        if isinstance(options, dict)
        else (None if options is None or opts.boundary == TileOptions().boundary else opts.boundary)
    )
    if explicit is not None and BoundaryPolicy(explicit) != plan.boundary:
        raise ValueError(f"options boundary={explicit!r} differs from the plan's {plan.boundary.value!r}")
    opts = dataclasses.replace(opts, boundary=plan.boundary)
    mask = plan.layout.mask
    call = IMPLEMENTATION.kernel_call(
        mask, mask.length, scale=scale, block_q=plan.block_q, block_kv=plan.block_kv, options=opts,
        interpret=interpret,
    )  # fmt: skip
    kernel = IMPLEMENTATION.trainable(
        mask,
        call,
        primal=lambda *qkv: tile_attention(*qkv, plan.layout, scale=scale, options=opts, interpret=interpret),
    )
    return plan.in_order(q, k, v, kernel)


def _pass_of(kernel: str) -> PassKind:
    for kind in SPLIT_KINDS:
        if kernel.startswith(f"stlib_tile_{kind}"):
            return kind
    raise ValueError(f"{kernel!r} is not a pallas_tile kernel")


def _compute_regions(kernel: str, n: int) -> list[str]:
    """One conditional compute region per pass: mask-free in the full pass, masked otherwise."""
    return ["compute_full" if _pass_of(kernel) == PassKind.FULL else "compute_masked"]


def tile_schedule_counts(setup, attribution) -> ScheduleCounts:
    """Executions of each compiled path of the pass ``attribution.kernel``, its grid steps and
    block fetches, from the same tables the kernel prefetches."""
    options = TileOptions(**setup.options)
    h, layout = setup.num_heads, setup.layout
    nq, nk = layout.grid_shape
    mult = h if layout.num_heads == 1 else 1
    passes = split_passes(layout, options.boundary)
    kind = _pass_of(attribution.kernel)
    selected = next(p for p in passes if p.name == kind).selected
    out_item = 4 if len(passes) > 1 else setup.itemsize  # f32 partial results to merge
    name = "compute_full" if kind == PassKind.FULL else "compute_masked"
    if options.form == GridForm.ROWS:
        tiles, row_counts = row_tables(selected)
        paths = {name: int(row_counts.sum()) * mult}
        return accounting.row_grid_counts(setup, tiles, paths, out_itemsize=out_item, writes_lse=True)
    flat = flat_steps(selected)
    groups = np.arange(mult)[:, None]
    kv = (groups + flat["step_head"]) * nk + flat["step_kv"]
    q = (groups + flat["step_head"]) * nq + flat["step_q"]
    first = int(flat["step_first"].sum()) * mult
    counts = {"init": first, "finalise": first, name: int(flat["step_active"].sum()) * mult}
    return ScheduleCounts(
        counts,
        flat["step_q"].size * mult,
        accounting.block_changes(q),
        accounting.block_changes(kv),
        setup.block_q,
        setup.block_kv,
        out_item,
        writes_lse=True,
    )


IMPLEMENTATION = register(
    Implementation(
        name=NAME,
        roles=frozenset({Role.TILE}),
        forward=_forward,
        description="tile-aligned sparse kernel: a grid over non-empty tiles only, mask-free main pass",
        options_type=TileOptions,
        work=lambda layout, num_heads, head_dim, options: tile_work(layout, num_heads, head_dim, options),
        chips=CHIPS,
        resolve=flash_options.flash_resolve,
        plan_runner=run_plan,
        prepare=prepare,
        backward=tile_training(
            _forward_with_lse, lambda layout, options: split_passes(layout, options.boundary)
        ),
    ),
    estimator=EstimatorHooks(
        kernel_names=tuple(f"stlib_tile_{kind}" for kind in SPLIT_KINDS),
        compute_regions=_compute_regions,
        schedule_counts=tile_schedule_counts,
        tuned_candidates=flash_options.TUNED_CANDIDATES,
    ),
    presentation=Presentation(
        variants={"rows": {"form": "rows"}, "flat": {"form": "flat"}, "balanced": {"boundary": "balanced"}},
    ),
)


__all__ = [
    "IMPLEMENTATION",
    "NAME",
    "GridForm",
    "TileOptions",
    "run_plan",
    "tile_attention",
    "tile_schedule_counts",
    "tile_work",
]
