"""``pallas_tile_lane_dense``: the tile-aligned sparse kernel with keys on sublanes.

The same tile skipping as ``pallas_tile`` (a grid (H, q tiles, widest row) over each row's
non-empty kv tiles, steps past a row's count skipped), laid out the way the public Sparse VideoGen
TPU design lays it out (``../shared/REFERENCE.md`` section 3):

* scores are k q^T, [chunk, block_q]: keys on sublanes, queries on lanes, so the running max and
  sum are [8, block_q] (one value per query along lanes) and their reductions over keys are
  element-wise maxima / sums across vregs, not cross-lane reductions;
* the kv tile is walked in ``block_kv_compute`` chunks (one max, one rescale per chunk) and, inside a
  chunk, in register tiles of ``block_kv_register`` keys (exp2, then bf16 probabilities into p.v);
* the accumulator is o^T [D, block_q]; it is transposed once per row, when the output is written;
* one pallas_call, one grid: each step's kind (FULL: mask-free; RAGGED: a FULL tile in the kv block
  where the array ends, whose last chunk is sliced statically; MASKED: PARTIAL tiles and tiles with
  padding slots, mask evaluated per score) is a flag in the step table, so the output is written
  once, in q's dtype, with no LSE, no merge and no padded copies of q, k, v;
* ``vmem_limit_bytes`` from the chip table; blocks that break the tiling or overflow it are refused
  before compiling.

Each computed step costs 4 * block_q * block_kv * D flops (the RAGGED step only its real keys) and
moves one k and one v block (2 * block_kv * D * itemsize bytes) when its kv tile changes.
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

from stlib._checks import check_positive_int
from stlib._intmath import round_up
from stlib.device import CHIP_TABLE, LANES, SUBLANES, chip_spec, current_chip, resolve_interpret
from stlib.kernels import common
from stlib.layout import BlockLayout, TileKind, block_layout, row_tables
from stlib.masks import Mask, full
from stlib.reference import MASK_VALUE
from stlib.registry import Implementation, ScheduleCounts, register

NAME = "pallas_tile_lane_dense"
KERNEL_PREFIX = "stlib_tile_ld"
#: Share of a chip's VMEM a call may ask for (the rest: Mosaic's internal scratch, headroom).
VMEM_SHARE = 0.75


class StepKind(enum.IntEnum):
    """How a grid step computes its tile; the compiled step has one region per kind present, in
    this order."""

    FULL = 0  # every pair allowed, every key real: no mask work
    RAGGED = 1  # FULL tile in the kv block where the array ends: chunks past the end skipped, the last sliced
    MASKED = 2  # PARTIAL tile, or a tile with padding slots: the mask evaluated per score


REGION_NAMES = {
    StepKind.FULL: "compute_full",
    StepKind.RAGGED: "compute_ragged",
    StepKind.MASKED: "compute_masked",
}


@dataclass(frozen=True)
class LaneDenseOptions:
    """``exp2``: base-2 exponentials with log2(e) folded into q's scale; ``block_kv_compute``: keys per
    chunk of the inner loop (None: the chip default with default blocks, else the whole kv tile);
    ``block_kv_register``: keys per register tile inside a chunk (None: the whole chunk);
    ``bf16_probs``: probabilities enter p.v in v's dtype when v is bf16 (f32 inputs stay f32);
    ``chip``: the chip whose VMEM the blocks must fit and whose limit the call asks for (None: the
    chip at hand, else the smallest VMEM in the chip table)."""

    exp2: bool = True
    block_kv_compute: int | None = None
    block_kv_register: int | None = 256
    bf16_probs: bool = True
    chip: str | None = None

    def __post_init__(self):
        for name in ("exp2", "bf16_probs"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name}={getattr(self, name)!r} must be True or False")
        if self.block_kv_compute is not None:
            common.check_chunk(self.block_kv_compute)
        if self.block_kv_register is not None:
            check_positive_int("block_kv_register", self.block_kv_register)
            if self.block_kv_register % SUBLANES:
                raise ValueError(
                    f"block_kv_register={self.block_kv_register} must be a multiple of {SUBLANES} "
                    "(TPU sublane tiling)"
                )
        if self.chip is not None:
            chip_spec(self.chip)  # raises, naming the chips of the table


# --------------------------------------------------------------------------------------------
# blocks and VMEM


def vmem_limit(chip: str | None) -> int:
    """Bytes of VMEM a call may ask for on ``chip`` (None: the smallest in the chip table)."""
    chips = [chip_spec(chip)] if chip else list(CHIP_TABLE.values())
    return int(min(c.vmem_bytes for c in chips) * VMEM_SHARE)


def vmem_bytes(
    block_q: int, block_kv: int, chunk: int, register: int, head_dim: int, itemsize: int, table: bool = False
) -> int:
    """VMEM one call needs (upper estimate): double-buffered q, k, v, o (and mask) blocks, the
    scratch (m, l [8, block_q] f32, o^T [D, block_q] f32, scaled q), and the temporaries of one chunk
    (scores [chunk, block_q] f32, probabilities of one register tile, one p.v product)."""
    blocks = 2 * itemsize * head_dim * (2 * block_q + 2 * block_kv) + (2 * block_q * block_kv if table else 0)
    scratch = 2 * SUBLANES * block_q * 4 + head_dim * block_q * 4 + block_q * head_dim * itemsize
    temps = (
        chunk * block_q * (4 + (1 if table else 0)) + 3 * register * block_q * 4 + 2 * head_dim * block_q * 4
    )
    return blocks + scratch + temps


def check_blocks(
    block_q: int,
    block_kv: int,
    chunk: int,
    register: int | None,
    head_dim: int,
    itemsize: int,
    chip: str | None,
    table: bool = False,
    compiled: bool = True,
) -> int:
    """Refuse blocks this kernel cannot tile or that overflow the VMEM limit, naming value and limit;
    returns the limit. block_q is the lane dimension of the scores here: a multiple of 128 when
    ``compiled`` for a TPU (interpret mode takes any multiple of 8)."""
    common.BlockSizes(block_q, block_kv, chunk)  # (8, 128) rule, chunk divides block_kv
    if compiled and block_q % LANES:
        raise ValueError(f"{block_q=} must be a multiple of {LANES}: queries lie along lanes in this kernel")
    if table and block_kv % 32:
        raise ValueError(f"{block_kv=} must be a multiple of 32 for an int8 mask table")
    need, limit = (
        vmem_bytes(block_q, block_kv, chunk, register or chunk, head_dim, itemsize, table),
        vmem_limit(chip),
    )
    if need > limit:
        raise ValueError(
            f"blocks {block_q}x{block_kv} (chunk {chunk}, register {register}) need about {need:,} "
            f"bytes of VMEM; the limit on {chip or 'the smallest chip'} is {limit:,}"
        )
    return limit


# --------------------------------------------------------------------------------------------
# which step runs which region


def step_kinds(layout: BlockLayout, length: int) -> np.ndarray:
    """int8 [Hl, nq, nk]: -1 for tiles not computed, else the ``StepKind`` of the tile (exact policy:
    PARTIAL tiles are MASKED)."""
    bkv = layout.block_kv
    nk = layout.grid_shape[1]
    real_rows = np.minimum(bkv, length - np.arange(nk) * bkv)  # array rows of each kv tile
    slots = (real_rows > layout.kv_valid)[None, None, :]  # padding slots of a permuted order inside
    kinds = np.full(layout.kinds.shape, -1, np.int8)
    full_ = layout.kinds == TileKind.FULL
    kinds[full_] = StepKind.FULL
    if length % bkv:
        kinds[:, :, nk - 1][full_[:, :, nk - 1]] = StepKind.RAGGED
    kinds[(layout.kinds == TileKind.PARTIAL) | (full_ & slots)] = StepKind.MASKED
    return kinds


def kinds_present(kinds: np.ndarray) -> tuple[StepKind, ...]:
    return tuple(k for k in StepKind if (kinds == k).any())


def kernel_name(present) -> str:
    return (
        "_".join([KERNEL_PREFIX, *(k.name.lower() for k in present)]) if present else f"{KERNEL_PREFIX}_none"
    )


def step_tables(kinds: np.ndarray):
    """(steps int32 [Hl, nq, W] = kv tile << 2 | kind, counts int32 [Hl, nq]); entries past a row's
    count repeat its last entry, so skipped steps fetch nothing."""
    tiles, counts = row_tables(kinds >= 0)
    kind = np.take_along_axis(np.maximum(kinds, 0), tiles, axis=2).astype(np.int32)
    return (tiles << 2) | kind, counts


# --------------------------------------------------------------------------------------------
# the kernel


def _chunk_update(
    q,
    k,
    v,
    m_ref,
    l_ref,
    acc_ref,
    *,
    score_scale_exp,
    register: int,
    p_dtype,
    allowed=None,
    v_rows_valid=None,
):
    """Fold one chunk of keys into the running softmax of a q tile. q [bq, D] (pre-scaled); k, v
    [C, D]; ``allowed`` bool [C, bq] or None; ``v_rows_valid`` bool [C, 1] (rows past the array end
    hold stale data: zeroed before p.v) or None.
    Flops: 2 * C * bq * D (k q^T) + 2 * C * bq * D (v^T p); exps: C * bq + bq."""
    exp = score_scale_exp
    s = jax.lax.dot_general(k, q, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)  # [C, bq]
    if allowed is not None:
        s = jnp.where(allowed, s, MASK_VALUE)
    if v_rows_valid is not None:
        v = jnp.where(v_rows_valid, v, jnp.zeros((), v.dtype))
    m_prev = m_ref[...]  # [8, bq]
    m_next = jnp.maximum(m_prev, jnp.max(s, axis=0, keepdims=True))  # [8, bq]
    m_row = m_next[:1]  # [1, bq]
    alpha = exp(m_prev[:1] - m_row)  # [1, bq]
    rows = s.shape[0]
    l_add = None
    pv = None
    for r0 in range(0, rows, register):  # register tiles: bounds the live range of p
        r1 = min(rows, r0 + register)
        p = exp(s[r0:r1] - m_row)  # [R, bq]
        if allowed is not None:
            p = jnp.where(allowed[r0:r1], p, 0.0)
        part = jnp.sum(p, axis=0, keepdims=True)  # [1, bq]
        v_r = v[r0:r1]  # [R, D]
        prod = jax.lax.dot_general(
            v_r.astype(p_dtype),
            p.astype(p_dtype),
            (((0,), (0,)), ((), ())),
            preferred_element_type=jnp.float32,
        )  # [D, bq]
        l_add = part if l_add is None else l_add + part
        pv = prod if pv is None else pv + prod
    l_ref[...] = jnp.broadcast_to(alpha * l_ref[:1] + l_add, l_ref.shape)
    m_ref[...] = m_next
    acc_ref[...] = alpha * acc_ref[...] + pv  # [D, bq]


def _build_kernel(
    *,
    plan: common.MaskPlan,
    present,
    bq: int,
    bkv: int,
    chunk: int,
    register: int,
    length: int,
    nq: int,
    extent: int,
    shared: bool,
    softmax: common.SoftmaxOptions,
    p_dtype,
    n_tables: int,
):
    tail = length % bkv  # real rows of the last kv block (0: the array ends at a block edge)
    exp = softmax.exp

    def kernel(*refs):
        steps_ref, counts_ref = refs[0], refs[1]
        rest = refs[n_tables:]
        if plan.mode == common.MaskPlanMode.TABLE:
            q_ref, k_ref, v_ref, mask_ref, o_ref, m_ref, l_ref, acc_ref, qs_ref = rest
        else:
            q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref, qs_ref = rest
            mask_ref = None
        h, i, j = pl.program_id(0), pl.program_id(1), pl.program_id(2)
        row = i if shared else h * nq + i
        entry = steps_ref[row * extent + j]
        kind, ki = entry & 3, entry >> 2
        active = j < counts_ref[row]

        @pl.when(j == 0)
        def _():
            m_ref[...] = jnp.full(m_ref.shape, MASK_VALUE, jnp.float32)
            l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)
            acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)
            qs_ref[...] = (q_ref[...].astype(jnp.float32) * softmax.score_scale).astype(
                qs_ref.dtype
            )  # [bq, D]

        def update(c0, size, allowed=None, v_rows_valid=None):
            _chunk_update(
                qs_ref[...],
                k_ref[pl.ds(c0, size), :],
                v_ref[pl.ds(c0, size), :],
                m_ref,
                l_ref,
                acc_ref,
                score_scale_exp=exp,
                register=register,
                p_dtype=p_dtype,
                allowed=allowed,
                v_rows_valid=v_rows_valid,
            )

        if StepKind.FULL in present:

            @pl.when(active & (kind == StepKind.FULL))
            def _():
                for c in range(bkv // chunk):
                    update(c * chunk, chunk)

        if StepKind.RAGGED in present:

            @pl.when(active & (kind == StepKind.RAGGED))
            def _():
                for c in range(tail // chunk):
                    update(c * chunk, chunk)
                rem = tail % chunk
                if (
                    rem
                ):  # the last chunk sliced to the real rows (rounded up to the sublane tile, then masked)
                    size = min(chunk, round_up(rem, 2 * SUBLANES))
                    c0 = tail - rem
                    if size == rem:
                        update(c0, size)
                    else:
                        key = jax.lax.broadcasted_iota(jnp.int32, (size, bq), 0)
                        update(
                            c0,
                            size,
                            allowed=key < rem,
                            v_rows_valid=jax.lax.broadcasted_iota(jnp.int32, (size, 1), 0) < rem,
                        )

        if StepKind.MASKED in present:

            @pl.when(active & (kind == StepKind.MASKED))
            def _():
                for c in range(bkv // chunk):
                    c0 = c * chunk
                    keys = ki * bkv + c0 + jax.lax.broadcasted_iota(jnp.int32, (chunk, bq), 0)  # [C, bq]
                    if plan.mode == common.MaskPlanMode.TABLE:
                        allowed = (mask_ref[pl.ds(c0, chunk), :] != 0) & (keys < length)
                    else:
                        queries = i * bq + jax.lax.broadcasted_iota(jnp.int32, (chunk, bq), 1)
                        allowed = plan.mask._allowed(queries, keys, h) & (keys < length)
                    rows_ok = None
                    if tail:  # the last kv block runs past the array: its stale rows must not reach p.v
                        rows_ok = (
                            ki * bkv + c0 + jax.lax.broadcasted_iota(jnp.int32, (chunk, 1), 0)
                        ) < length
                    update(c0, chunk, allowed=allowed, v_rows_valid=rows_ok)

        @pl.when(j == extent - 1)
        def _():
            m = m_ref[...][:1]  # [1, bq]
            l = l_ref[...][:1]  # [1, bq]
            seen = (m != MASK_VALUE) | jnp.isnan(l)  # a key was allowed, or the data is NaN
            inv = 1.0 / jnp.where(seen, l, 1.0)  # [1, bq]
            out_t = jnp.where(seen, acc_ref[...] * inv, 0.0)  # [D, bq]
            o_ref[...] = out_t.T.astype(o_ref.dtype)  # [bq, D]

    return kernel


def lane_dense_attention(
    q,
    k,
    v,
    layout: BlockLayout,
    *,
    scale: float,
    options: LaneDenseOptions = LaneDenseOptions(),
    interpret: bool | None = None,
):
    """q, k, v [H, L, D] -> o [H, L, D] in q's dtype. ``layout`` is the tile layout of the mask for
    these tokens; its blocks must suit this kernel (``check_blocks``). Raises ValueError for such
    blocks and for step tables that overflow SMEM."""
    num_heads, length, head_dim = q.shape
    bq, bkv = layout.block_q, layout.block_kv
    chunk = options.block_kv_compute or bkv
    register = min(options.block_kv_register or chunk, chunk)
    kinds = step_kinds(layout, length)
    present = kinds_present(kinds)
    mask = layout.mask
    plan = common.plan_mask(mask, layout, kinds == StepKind.MASKED)
    table = plan.mode == common.MaskPlanMode.TABLE
    chip = options.chip or current_chip()
    limit = check_blocks(
        bq,
        bkv,
        chunk,
        register,
        head_dim,
        q.dtype.itemsize,
        chip,
        table,
        compiled=not resolve_interpret(interpret),
    )
    if not present:  # nothing to compute: every row sees nothing
        return jnp.zeros(q.shape, q.dtype)
    steps, counts = step_tables(kinds)
    extent = steps.shape[2]
    tables = [steps.reshape(-1), counts.reshape(-1)]
    nq = steps.shape[1]
    shared = steps.shape[0] == 1
    if table:
        idx = np.take_along_axis(np.broadcast_to(plan.index, kinds.shape), steps >> 2, axis=2)
        idx = np.where(np.arange(extent) < counts[:, :, None], idx, -1)
        tables.append(common.carried_index(idx).reshape(-1))
    common.check_prefetch(
        tables,
        plan,
        bq,
        f"{NAME} ({steps.shape[0]} heads x {nq} x {layout.grid_shape[1]} tiles of {bq}x{bkv})",
        "use larger tiles or fewer heads per call",
    )
    softmax = common.SoftmaxOptions(scale, options.exp2)
    p_dtype = v.dtype if (options.bf16_probs or v.dtype == jnp.float32) else jnp.float32
    kernel = _build_kernel(
        plan=plan,
        present=present,
        bq=bq,
        bkv=bkv,
        chunk=chunk,
        register=register,
        length=length,
        nq=nq,
        extent=extent,
        shared=shared,
        softmax=softmax,
        p_dtype=p_dtype,
        n_tables=len(tables),
    )

    def row_of(h, i):
        return i if shared else h * nq + i

    def q_map(h, i, j, *_):
        return (h, i, 0)

    def kv_map(h, i, j, steps_ref, *_):
        return (h, steps_ref[row_of(h, i) * extent + j] >> 2, 0)

    in_specs = [
        pl.BlockSpec((None, bq, head_dim), q_map),  # q [bq, D]
        pl.BlockSpec((None, bkv, head_dim), kv_map),  # k [bkv, D]
        pl.BlockSpec((None, bkv, head_dim), kv_map),  # v [bkv, D]
    ]
    operands = [q, k, v]
    if table:
        in_specs.append(
            pl.BlockSpec((None, bkv, bq), lambda h, i, j, *tabs: (tabs[-1][row_of(h, i) * extent + j], 0, 0))
        )
        operands.append(jnp.asarray(np.ascontiguousarray(plan.table.transpose(0, 2, 1))))  # [P, bkv, bq]
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=len(tables),
        grid=(num_heads, nq, extent),
        in_specs=in_specs,
        out_specs=pl.BlockSpec((None, bq, head_dim), q_map),  # o [bq, D]
        scratch_shapes=[
            pltpu.VMEM((SUBLANES, bq), jnp.float32),  # m: running max, one per query along lanes
            pltpu.VMEM((SUBLANES, bq), jnp.float32),  # l: running sum
            pltpu.VMEM((head_dim, bq), jnp.float32),  # o^T: unnormalised output, transposed
            pltpu.VMEM((bq, head_dim), q.dtype),  # q with the softmax scale folded in
        ],
    )
    return common.run_pallas(
        kernel,
        grid_spec=grid_spec,
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        interpret=interpret,
        dimension_semantics=("parallel", "parallel", "arbitrary"),
        name=kernel_name(present),
        operands=[*(jnp.asarray(t) for t in tables), *operands],
        vmem_limit_bytes=limit,
    )


# --------------------------------------------------------------------------------------------
# registry entry


#: Default blocks per chip: v6e's won the static-estimate sweep (``python -m stlib.bench.block_sweep``,
#: data/tile_block_sweep.jsonl) on dense and band 0.25; v5e and TPU7x take v6e's until their own
#: sweep records are read (they fit both chips' VMEM limits).
DEFAULT_BLOCKS: dict[str, common.BlockSizes] = {
    "v5e": common.BlockSizes(2048, 2048, 512),
    "v6e": common.BlockSizes(2048, 2048, 512),
    "tpu7x": common.BlockSizes(2048, 2048, 512),
}


def resolve_blocks(length: int, block_q, block_kv, options: LaneDenseOptions, interpret):
    """(BlockSizes, options with the chunk resolved): explicit blocks, else this kernel's default for
    its chip (``options.chip``, the chip at hand, v6e when compiling elsewhere; small tiles in
    interpret mode); blocks shrunk to short sequences in multiples of 128."""
    chip = options.chip or current_chip()
    if chip is None and not resolve_interpret(interpret):
        chip = "v6e"
    base = common.default_block_sizes(chip, DEFAULT_BLOCKS)
    explicit = block_q is not None and block_kv is not None
    bq, bkv = block_q or base.block_q, block_kv or base.block_kv
    chunk = options.block_kv_compute
    if chunk is None and block_kv is None:
        chunk = base.block_kv_compute
    if not explicit:
        bq, bkv = min(bq, round_up(length, LANES)), min(bkv, round_up(length, LANES))
        if chunk is not None and (chunk > bkv or bkv % chunk):
            chunk = None
    return common.BlockSizes(bq, bkv, chunk), dataclasses.replace(options, block_kv_compute=chunk)


def _forward(q, k, v, mask: Mask | None, *, scale, block_q, block_kv, options: LaneDenseOptions, interpret):
    sizes, options = resolve_blocks(q.shape[1], block_q, block_kv, options, interpret)
    layout = block_layout(mask if mask is not None else full(q.shape[1]), sizes.block_q, sizes.block_kv)
    return lane_dense_attention(q, k, v, layout, scale=scale, options=options, interpret=interpret)


def lane_dense_work(layout: BlockLayout, num_heads: int, head_dim: int, options=None):
    """Grid steps and flops of ``lane_dense_attention`` for this layout."""
    kinds = step_kinds(layout, layout.length)
    mult = num_heads if layout.num_heads == 1 else 1
    computed = int((kinds >= 0).sum()) * mult
    masked = int((kinds >= StepKind.RAGGED).sum()) * mult
    steps = num_heads * kinds.shape[1] * max(int((kinds >= 0).sum(axis=2).max()) if kinds.size else 0, 1)
    return common.work_from_counts(layout, num_heads, head_dim, steps, computed, masked)


def _regions_of(kernel: str) -> list[str]:
    if not kernel.startswith(KERNEL_PREFIX):
        raise ValueError(f"{kernel!r} is not a {NAME} kernel")
    words = kernel[len(KERNEL_PREFIX) :].split(".")[0].split("_")
    return [REGION_NAMES[k] for k in StepKind if k.name.lower() in words]


def _compute_regions(kernel: str, n: int) -> list[str]:
    """One conditional compute region per step kind present, in ``StepKind`` order (the kernel's
    name lists them)."""
    return _regions_of(kernel)


def lane_dense_schedule_counts(setup, attribution) -> ScheduleCounts:
    """Executions of each compiled path, grid steps and block fetches, from the step tables."""
    LaneDenseOptions(**setup.options)  # validates the options the kernel was compiled with
    h, layout = setup.num_heads, setup.layout
    nq, nk = layout.grid_shape
    mult = h if layout.num_heads == 1 else 1
    kinds = step_kinds(layout, setup.length)
    present = kinds_present(kinds)
    if kernel_name(present) != attribution.kernel.split(".")[0]:
        raise ValueError(
            f"{attribution.kernel!r}: the layout's step kinds make kernel {kernel_name(present)!r}"
        )
    steps, _ = step_tables(kinds)
    tiles = steps >> 2
    paths = {"init": h * nq, "finalise": h * nq}
    for kind in present:
        paths[REGION_NAMES[kind]] = int((kinds == kind).sum()) * mult
    heads = np.arange(h)[:, None, None]
    kv = heads * nk + np.broadcast_to(tiles, (h,) + tiles.shape[1:])
    return ScheduleCounts(
        paths,
        h * nq * steps.shape[2],
        h * nq,
        common.block_changes(kv),
        setup.block_q,
        setup.block_kv,
        setup.itemsize,
        writes_lse=False,
    )


IMPLEMENTATION = register(
    Implementation(
        name=NAME,
        forward=_forward,
        description="tile-aligned sparse kernel, keys on sublanes: lane-dense softmax statistics, one pass, "
        "per-step FULL / RAGGED / MASKED flags, no padded inputs",
        options_type=LaneDenseOptions,
        work=lambda layout, num_heads, head_dim, options: lane_dense_work(
            layout, num_heads, head_dim, options
        ),
        kernel_names=(KERNEL_PREFIX,),
        compute_regions=_compute_regions,
        schedule_counts=lane_dense_schedule_counts,
        chips=common.ALL_CHIPS,
        blocks=DEFAULT_BLOCKS,
        resolve_blocks=resolve_blocks,
    )
)
