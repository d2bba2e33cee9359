# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 07 · The second-generation kernel, written in view: keys on sublanes
#
# Notebook 06 built the tile-aligned kernel (`pallas_tile`): reorder the tokens, visit only the
# non-empty tiles, run FULL tiles mask-free, merge the passes. The kernel behind the series' best
# numbers, `pallas_tile_lane_dense`, keeps all of that and changes how a tile is computed. This
# notebook writes it, for one head, as a `pallas_call` you can read: keys on sublanes, `[8, block_q]`
# statistics, the chunk loop and its register tiles, and the step codes and patterns that say which
# region each grid step runs. It checks the kernel against the reference and against the library's,
# then compiles both for TPU v6e and puts their schedules side by side, and ends by timing both beside
# Splash on the chip at hand.
#
# Terms: a **vreg** (vector register) holds 8 sublanes x 128 lanes of 32-bit values; the VPU works
# on whole vregs, the MXU multiplies matrices, and moving data *across* lanes needs the XLU (slow).
# A **step code** is the small integer in the step table that picks the compiled region of a grid
# step. A **static estimate** reads the compiled schedule as a stopwatch (notebook 08); nothing in
# this notebook runs on a TPU.

# %% tags=["parameters"]
SIZE = None  # "full", "small" or None (automatic: case-study sizes on a TPU, small elsewhere); env STLIB_SIZE wins
SOLUTIONS = "fill"  # "hide": the exercises run your code (stubs; checks print NOT YET); env STLIB_SOLUTIONS wins

# %%
# Find stlib: importable -> use it; in a clone of the repository -> put the clone on sys.path; neither
# (Colab, a lone download) -> pip install it from STLIB_SOURCE, keeping the runtime's own jax and libtpu.
import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

# pip source of stlib (a path, archive URL or git+URL); empty: the environment's STLIB_SOURCE, else the repository
STLIB_SOURCE = ""  # @param {type:"string"}


class StlibSetupError(Exception):  # IPython shows its one sentence, not a traceback
    def _render_traceback_(self):
        return [f"StlibSetupError: {self}"]


if importlib.util.find_spec("stlib") is None:
    repo = next((p for p in [Path.cwd(), *Path.cwd().parents] if (p / "stlib" / "__init__.py").is_file()), None)
    if repo is not None:
        sys.path.insert(0, str(repo))
    else:
        source = STLIB_SOURCE or os.environ.get("STLIB_SOURCE") or "git+https://github.com/stlib-video/stlib"
        pip = [sys.executable, "-m", "pip", "install", "-q"]
        print(f"installing stlib from {source} (the installed jax and libtpu stay) ...")
        if subprocess.run([*pip, "--no-deps", source], capture_output=True, check=False).returncode:
            raise StlibSetupError(f"could not pip install stlib from {source!r}: set STLIB_SOURCE to a reachable "
                                  "clone, archive or git URL of the repository, or open the notebook inside a clone")
        importlib.invalidate_caches()
        missing = [r for r in importlib.metadata.requires("stlib") if not importlib.util.find_spec(re.split(r"\W", r)[0])]
        if missing:
            subprocess.run([*pip, *missing], check=True)
import stlib

print(f"stlib from {Path(stlib.__file__).parent}; " + ", ".join(
    f"{d} {importlib.metadata.version(d)}" for d in ("jax", "jaxlib", "libtpu") if importlib.util.find_spec(d)))

# %%
import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import stlib
import stlib.kernels  # registers the Pallas kernels with stlib.attention
from stlib import configs, exercises, masks, notebook, plotting
from stlib.analysis import KernelConfig
from stlib.analysis import cache as estimate_cache
from stlib.analysis.cache import compiled_attributions
from stlib.analysis.inview import kernel_schedules, per_step
from stlib.bench import block_sweep
from stlib.checks import scaled_error
from stlib.kernels import tile_lane_dense as lane_dense
from stlib.kernels.mask_info import carried_index
from stlib.kernels.tile_lane_dense import CODE_BITS, FIRST_PATTERN, StepKind, plan_steps, region_name
from stlib.passes import MaskPlanMode, plan_mask
from stlib.reference import MASK_VALUE

cfg = notebook.setup(SIZE, solutions=SOLUTIONS)
max_error, tolerance = notebook.max_error, notebook.tolerance  # checks against the plain reference

F32 = jnp.float32
LOG2_E = math.log2(math.e)

# %% [markdown]
# ## Why turn the product around
#
# `pallas_tile` computes scores as q k^T, `[block_q, chunk]`: queries on sublanes, keys on lanes.
# Its softmax statistics are one number per query *row*, so the running max and sum live as
# `[block_q, 128]` arrays with the value repeated across the 128 lanes, every row max is a
# cross-lane reduction, and the alpha correction touches 128 copies of each value. Counted in a v6e
# schedule of `pallas_tile` when this kernel was designed (not reprinted here), the alpha correction
# alone was about a fifth of the tile's exponentials.
#
# The second-generation kernel (`stlib/kernels/tile_lane_dense/`) turns the product around, as the
# public Sparse VideoGen TPU kernels do: scores are k q^T, `[chunk, block_q]`, **keys on sublanes,
# queries on lanes**. Then
#
# * the max and the sum over keys are element-wise maxima and sums across vregs (the VPU, no lane
#   shuffles), and the statistics are lane-dense: `m`, `l` are `[8, block_q]`, one value per query;
# * the accumulator is o^T, `[D, block_q]`; alpha `[1, block_q]` scales it by a sublane broadcast,
#   and it is transposed once per q tile, when the output is written;
# * the kv tile is walked in chunks of `block_kv_compute` keys (one max and one rescale per chunk)
#   and, inside a chunk, in **register tiles** of 256 keys: `exp2(s - m)` of 256 keys, cast to bf16,
#   straight into the p.v matmul. The register tile bounds how much of p is alive between the
#   exponential and the matmul (a whole `[512, 2048]` f32 p would be 4 MiB), so the compiler can
#   overlap the exponentials of one register tile with the matmul of the previous one;
# * the k q^T of the next pieces issued before the current one is folded (`lookahead`), so the MXU
#   has work while the EUP exponentiates, and FULL steps folded in slices of 256 queries whose scores
#   nearly fit the registers (`fold_lanes`);
# * one pass, one grid: each step's region (FULL: no mask; RAGGED: the kv block where the array
#   ends, its last chunk sliced statically, so 75,600 tokens need no padded copy; MASKED: the mask
#   per score) is a code in the scalar-prefetched step table. No LSE, no merge, the output written
#   once, in q's dtype;
# * large blocks, chosen per chip by the block sweep at the end of this notebook (its table prints
#   each chip's best blocks by the static estimate; candidates within the estimator's calibration
#   spread of each other are ties, not wins), with `vmem_limit_bytes` from the chip table.
#
# The cells below write exactly this, minus what a library adds (the last section lists it).

# %% [markdown]
# ## The chunk update, written in view
#
# The heart of the kernel folds one chunk of keys into the running softmax of a slice of the q
# tile's queries (`lanes`: all of them, a fold of them, or the lanes of a pattern's run of
# sub-tiles). Read it with the shapes in mind: `s` is `[C, n]`, keys down the sublanes, queries along
# the lanes, computed by `scores` beforehand (the kernel below may issue it early). The
# max over keys is `jnp.max(axis=0)`: a VPU maximum across the chunk's vregs, no lane shuffle. `m`
# and `l` are `[8, n]` with the same value in all 8 sublanes, so reading one sublane (`[:1]`) and
# broadcasting it back are free. The exponentials are base 2: q arrives scaled by scale x log2 e,
# so `exp2(s - m)` is the softmax numerator with one multiply fewer per score. Then p goes straight
# into the p.v matmul one **register tile** (`register` keys) at a time, so at most `[register, n]`
# of p is alive between the exponential and the MXU.

# %%
def scores(k, q):
    """k q^T: f32 [C, n], a chunk's C keys (sublanes) against n pre-scaled queries (lanes)."""
    return jax.lax.dot_general(k, q, (((1,), (1,)), ((), ())), preferred_element_type=F32)


def chunk_update(s, v, m_ref, l_ref, acc_ref, lanes, register, allowed=None):
    """Fold one chunk's scores ``s`` [C, n] into the running softmax of the queries in ``lanes`` (a
    static slice). v [C, D]; allowed bool [C, n] or None (mask-free)."""
    if allowed is not None:
        s = jnp.where(allowed, s, MASK_VALUE)
    m_prev = m_ref[:, lanes]  # [8, n]: one running max per query, the same in all 8 sublanes
    m_next = jnp.maximum(m_prev, jnp.max(s, axis=0, keepdims=True))  # the max over keys: across vregs
    m_row = m_next[:1]  # [1, n]
    alpha = jnp.exp2(m_prev[:1] - m_row)  # [1, n]: how much the old sums shrink
    l_add, pv = 0.0, 0.0
    for r0 in range(0, s.shape[0], register):  # register tiles: p of `register` keys at a time
        p = jnp.exp2(s[r0:r0 + register] - m_row)  # [R, n]
        if allowed is not None:
            p = jnp.where(allowed[r0:r0 + register], p, 0.0)  # a hidden key adds nothing, even in a row with none
        l_add = l_add + jnp.sum(p, axis=0, keepdims=True)  # [1, n]
        pv = pv + jax.lax.dot_general(v[r0:r0 + register], p.astype(v.dtype), (((0,), (0,)), ((), ())),
                                      preferred_element_type=F32)  # [D, n] = v^T p on the MXU
    l_ref[:, lanes] = jnp.broadcast_to(alpha * l_ref[:1, lanes] + l_add, m_prev.shape)
    m_ref[:, lanes] = m_next
    acc_ref[:, lanes] = alpha * acc_ref[:, lanes] + pv  # o^T [D, n]: alpha is a sublane broadcast


# %% [markdown]
# ## The kernel, written in view
#
# One head, grid (q tile i, slot j of its row in the step table). The step table is the library's
# (`plan_steps`, drawn below in `07_step_codes`): every non-empty tile of the layout is one entry
# `kv tile << CODE_BITS | code`, a row's entries first, then its last one repeated so that skipped
# slots fetch nothing. The kernel compiles one conditional region per code present and runs the one
# the entry names:
#
# * **FULL** (code 0): every chunk of the kv tile, no mask work at all;
# * **MASKED** (code 2): every chunk, the mask's own predicate evaluated on it (`mask_function` of
#   two iotas: for a band, two compares);
# * a **pattern** (codes from 3 on): the tile cut into square sub-tiles, each skipped, run
#   mask-free or run masked; `Pattern.updates` lists the (keys, query lanes) pieces to run.
#
# * **RAGGED** (code 1): a FULL tile in the kv tile where the array ends (L need not be a multiple
#   of the blocks): only the chunks that hold real keys, the last one sliced to its real rows
#   (rounded up to 16, the bf16 sublane tile) and those past the end masked by one key column, so
#   75,600 tokens need no padded copy of q, k, v. A MASKED tile there masks its rows past the end too.
#
# At the row's first slot q is scaled once by scale x log2 e into a VMEM scratch, which every update
# of the row reads. The output is written once, at the row's last slot: o^T divided by l, transposed
# back to `[block_q, D]`, and 0 for a query that saw no key. Rows of the last q tile past the end are
# computed on whatever the block holds there and never written.

# %%
def library_updates(pattern, block_q, block_kv, chunk):
    return pattern.updates(block_q, block_kv, chunk)


def lane_dense_kernel(steps_ref, counts_ref, *refs,
                      plan, table, extent, length, scale, chunk, register, updates, lookahead, fold_lanes):
    refs = list(refs[1:] if table else refs)  # a mask table's index is read by the index map alone
    q_ref, k_ref, v_ref = refs[:3]
    mask_ref = refs.pop(3) if table else None  # int8 [bkv, bq]: this step's tile mask, keys down
    valid_ref = refs.pop(3) if plan.key_validity else None  # int32 [bkv, 1]: 0 at a padding slot
    o_ref, m_ref, l_ref, acc_ref, qs_ref = refs[3:]
    i, j = pl.program_id(0), pl.program_id(1)  # q tile, slot in its row of the step table
    bq, bkv = q_ref.shape[0], k_ref.shape[0]
    tail = length % bkv  # real keys of the last kv tile (0: the array ends at a tile edge)
    entry = steps_ref[i * extent + j]  # one scalar load from SMEM
    code, ki = entry & ((1 << CODE_BITS) - 1), entry >> CODE_BITS  # the step's region, its kv tile
    active = j < counts_ref[i]  # past the row's count: a skipped slot

    @pl.when(j == 0)
    def _init():
        m_ref[...] = jnp.full(m_ref.shape, MASK_VALUE, F32)
        l_ref[...] = jnp.zeros(l_ref.shape, F32)
        acc_ref[...] = jnp.zeros(acc_ref.shape, F32)
        qs_ref[...] = (q_ref[...].astype(F32) * (scale * LOG2_E)).astype(qs_ref.dtype)  # once per q tile

    def piece_mask(k0, keys, lanes, masked, ends, padded):
        """(allowed [keys, n] or None, real-key column [keys, 1] or None) of one piece: ``masked``, the
        mask on this piece only (its predicate, or for a mask without one its tile table); ``ends``,
        in the tile where the array ends, whose rows past it are no keys; ``padded``, in a kv tile
        holding padding slots of a tiled order, read from the validity column."""
        allowed = real = None
        if masked and table:
            allowed = mask_ref[pl.ds(k0, keys), lanes] != 0  # [keys, n]
        elif masked:
            shape = (keys, lanes.stop - lanes.start)
            queries = i * bq + lanes.start + jax.lax.broadcasted_iota(jnp.int32, shape, 1)
            key_ids = ki * bkv + k0 + jax.lax.broadcasted_iota(jnp.int32, shape, 0)
            allowed = plan.layout.mask.mask_function(queries, key_ids, 0)
        if ends and tail:  # rows past the end hold stale data: masked, and v zeroed (0 x NaN is NaN)
            real = ki * bkv + k0 + jax.lax.broadcasted_iota(jnp.int32, (keys, 1), 0) < length  # [keys, 1]
        if padded:  # a padding slot is no key either
            slots = valid_ref[pl.ds(k0, keys), :] != 0  # [keys, 1]
            real = slots if real is None else real & slots
        if real is not None:
            allowed = real if allowed is None else allowed & real
        return allowed, real

    def fold_all(pieces):
        """Fold ``pieces`` (k0, keys, lanes, masked, ends, padded) in order. The scores of a mask-free piece
        are issued ``lookahead`` pieces ahead, so the MXU computes the next k q^T while this piece's
        max and exponentials run; a masked piece's scores wait for its turn (its predicate's
        temporaries beside every issued score would crowd VMEM)."""
        issued = {}

        def issue(n, ahead=False):
            if n < len(pieces) and n not in issued and not (ahead and pieces[n][3]):
                k0, keys, lanes, *_ = pieces[n]
                issued[n] = scores(k_ref[pl.ds(k0, keys), :], qs_ref[lanes, :])

        for n in range(lookahead):
            issue(n, ahead=True)
        for n, (k0, keys, lanes, masked, ends, padded) in enumerate(pieces):
            issue(n)
            issue(n + lookahead, ahead=True)
            allowed, real = piece_mask(k0, keys, lanes, masked, ends, padded)
            v = v_ref[pl.ds(k0, keys), :]
            if real is not None:
                v = jnp.where(real, v, jnp.zeros((), v.dtype))
            chunk_update(issued.pop(n), v, m_ref, l_ref, acc_ref, lanes, register, allowed)

    # FULL and RAGGED steps fold the q tile in slices of `fold_lanes` queries, each through every chunk
    folds = [slice(a, min(bq, a + fold_lanes)) for a in range(0, bq, fold_lanes)]

    if StepKind.FULL in plan.present:
        @pl.when(active & (code == StepKind.FULL))
        def _full():
            fold_all([(k0, chunk, lanes, False, False, False) for lanes in folds for k0 in range(0, bkv, chunk)])

    if StepKind.RAGGED in plan.present:
        @pl.when(active & (code == StepKind.RAGGED))
        def _ragged():  # only the chunks that hold real keys, the last sliced to 16-row groups
            fold_all([(k0, min(chunk, -(-(tail - k0) // 16) * 16), lanes, False, True, False)
                      for lanes in folds for k0 in range(0, tail, chunk)])

    if StepKind.MASKED in plan.present:
        @pl.when(active & (code == StepKind.MASKED))
        def _masked():
            fold_all([(k0, chunk, slice(0, bq), True, True, False) for k0 in range(0, bkv, chunk)])

    for c in (c for c in plan.present if c >= FIRST_PATTERN):
        pattern = plan.pattern(c)

        @pl.when(active & (code == c))
        def _pattern(pattern=pattern):
            fold_all([(k0, keys, slice(lane0, lane0 + lanes), masked, False, pattern.padded)
                      for k0, keys, lane0, lanes, masked in updates(pattern, bq, bkv, chunk)])

    @pl.when(j == extent - 1)
    def _finish():
        m, l = m_ref[...][:1], l_ref[...][:1]  # [1, bq]
        seen = m != MASK_VALUE  # a query that saw no key writes zeros
        o_ref[...] = jnp.where(seen, acc_ref[...] / jnp.where(seen, l, 1.0), 0.0).T.astype(o_ref.dtype)


def lane_dense_attention(q, k, v, mask, *, block_q, block_kv, chunk=512, register=256, grain=None,
                         interpret=True, updates=library_updates, lookahead=0, fold_lanes=None):
    """One head: q, k, v [L, D], ``mask`` a stlib mask with a predicate; ``grain``: the pattern grain
    (None: the library's choice, 0: no patterns); ``lookahead``: pieces whose scores are issued
    ahead; ``fold_lanes``: queries per fold of a FULL or RAGGED step (None: the whole q tile)."""
    (length, head_dim), scale = q.shape, q.shape[1] ** -0.5
    plan = plan_steps(stlib.block_layout(mask, block_q, block_kv), length, grain)
    entries, counts = plan.tables()  # [1, nq, W]: kv tile << CODE_BITS | code; [1, nq]
    nq, extent = entries.shape[1:]
    tables = [entries.reshape(-1), counts.reshape(-1)]
    # a mask without a predicate: its MASKED tiles' masks, deduplicated into an int8 table [P, bq, bkv],
    # and per step the table entry to fetch (carried over skipped slots, so they fetch nothing new)
    mask_plan = plan_mask(mask, plan.layout, plan.codes == StepKind.MASKED)
    table = mask_plan.mode == MaskPlanMode.TABLE
    if table:
        entry_of = np.take_along_axis(mask_plan.index[0], entries[0] >> CODE_BITS, axis=1)  # [nq, W]
        tables.append(carried_index(np.where(np.arange(extent) < counts[0][:, None], entry_of, -1)).reshape(-1))
    q_map = lambda i, j, *_: (i, 0)
    kv_map = lambda i, j, steps_ref, *_: (steps_ref[i * extent + j] >> CODE_BITS, 0)
    in_specs = [pl.BlockSpec((block_q, head_dim), q_map), pl.BlockSpec((block_kv, head_dim), kv_map),
                pl.BlockSpec((block_kv, head_dim), kv_map)]
    operands = [q, k, v]
    if table:  # the step's tile mask, transposed to keys x queries like the scores
        in_specs.append(pl.BlockSpec((None, block_kv, block_q), lambda i, j, *tabs: (tabs[2][i * extent + j], 0, 0)))
        operands.append(jnp.asarray(np.ascontiguousarray(mask_plan.table.transpose(0, 2, 1))))
    if plan.key_validity:  # a kv tile holds padding slots: one int32 per key, fetched with its kv tile
        in_specs.append(pl.BlockSpec((block_kv, 1), kv_map))
        operands.append(jnp.asarray(plan.key_valid_column()))
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=len(tables), grid=(nq, extent),
        in_specs=in_specs,
        out_specs=pl.BlockSpec((block_q, head_dim), q_map),
        scratch_shapes=[pltpu.VMEM((8, block_q), F32),  # m: one running max per query, along the lanes
                        pltpu.VMEM((8, block_q), F32),  # l: the running sum
                        pltpu.VMEM((head_dim, block_q), F32),  # o^T, unnormalised
                        pltpu.VMEM((block_q, head_dim), q.dtype)])  # q x scale x log2 e
    kernel = functools.partial(lane_dense_kernel, plan=plan, table=table, extent=extent, length=length, scale=scale, chunk=chunk,
                               register=register, updates=updates, lookahead=lookahead,
                               fold_lanes=fold_lanes or block_q)
    return pl.pallas_call(
        kernel, grid_spec=grid_spec, out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype), interpret=interpret,
        compiler_params=None if interpret else pltpu.CompilerParams(
            dimension_semantics=("parallel", "arbitrary"), vmem_limit_bytes=100 * 2**20),
        name="lane_dense_in_view",
    )(*(jnp.asarray(t) for t in tables), *operands)


# %% [markdown]
# ## Checked against the reference and against the library
#
# Six masks, chosen so that between them every region runs (each line names the regions its step
# table holds): the 0.25 band (mixed patterns on its edges); the same band with patterns off on 200
# tokens fewer (its edge tiles MASKED, the last kv tile cut by the array's end); causal attention
# (FULL tiles and two diagonal patterns); no mask on 200 tokens fewer (FULL, and RAGGED where the array
# ends); a sliding tile in its 3-D tiled order on a video whose rows of tiles hold no padding
# (mask-free patterns); and the band with its runs of 256 tokens shuffled into an order without a
# formula, a mask with no predicate to evaluate, whose MASKED tiles read a deduplicated int8 table of
# tile masks (`stlib.passes.plan_mask`), one block of it fetched per step through a third prefetched
# index, carried over skipped slots like the kv tile. Each output is compared with the plain reference and with
# `impl="pallas_tile_lane_dense"` at the same blocks, chunk and register tile; the band and no mask
# run again with each piece's scores issued one piece ahead and FULL and RAGGED steps in folds of half
# a q tile (the two orders of the schedule section below), against the reference too.
#
# The checks run at a small size on every backend: 4,096 tokens, blocks of 512 x 1,024, chunks of
# 256 keys, register tiles of 128, in the configuration's dtype (float32 on a CPU, bfloat16 on a
# TPU). Which regions a step table holds, and whether each computes the right thing, does not
# depend on the length; each mask here is one more kernel to compile. The case-study size is timed
# at the end of the notebook.

# %%
L, BQ, BKV, CHUNK, REGISTER, dtype = 4096, 512, 1024, 256, 128, cfg.workload.dtype
video, tile = stlib.VideoGrid(6, 24, 64), (2, 8, 16)
band = masks.band(L, masks.band_width_for_density(L, 0.25))
sliding = masks.sliding_tile(video, tile, (3, 3, 3)).permute(stlib.tiled_order(video, tile))
band_short = masks.band(L - 200, masks.band_width_for_density(L - 200, 0.25))
# the band with its runs of 256 tokens shuffled: an order with no formula, so the mask has no predicate a
# kernel could evaluate (not traceable): its MASKED tiles read an int8 table of tile masks instead (on at
# most 8,192 tokens: a table of every masked tile of a long sequence is more than a library tabulates)
LS = min(L, 8192)
runs = np.random.default_rng(0).permutation(LS // 256)
shuffled = stlib.geometry.TokenOrder("runs of 256 shuffled", (runs[:, None] * 256 + np.arange(256)).reshape(-1), LS)
band_shuffled = masks.band(LS, masks.band_width_for_density(LS, 0.25)).permute(shuffled)
cases = {"band 0.25": (band, None), "band 0.25, patterns off": (band_short, 0), "causal": (masks.causal(L), None),
         "no mask": (masks.full(L - 200), None), "sliding tile, 3-D tiled": (sliding, None),
         "band, runs shuffled": (band_shuffled, None)}
TOL = tolerance(dtype)
for name, (mask, grain) in cases.items():
    length = mask.length
    plan = plan_steps(stlib.block_layout(mask, BQ, BKV), length, grain)
    q, k, v = stlib.random_qkv((1, length, 128), dtype, seed=1)
    mine = lane_dense_attention(q[0], k[0], v[0], mask, block_q=BQ, block_kv=BKV, chunk=CHUNK, register=REGISTER,
                                grain=grain, interpret=cfg.interpret)[None]
    options = {"block_kv_compute": CHUNK, "block_kv_register": REGISTER, "pattern_grain": grain}
    library = stlib.attention(q, k, v, mask, impl="pallas_tile_lane_dense", block_q=BQ, block_kv=BKV,
                              options=options, interpret=cfg.interpret)
    err = max_error(mine, q, k, v, mask)
    gap = float(jnp.max(jnp.abs(mine.astype(F32) - library.astype(F32))))
    assert err < TOL and gap < TOL, (name, err, gap)
    regions = ", ".join(region_name(c).removeprefix("compute_") for c in plan.present)
    ahead_note = ""
    if name in ("band 0.25", "no mask"):  # patterns with pieces ahead; FULL and RAGGED in folds
        ahead = lane_dense_attention(q[0], k[0], v[0], mask, block_q=BQ, block_kv=BKV, chunk=CHUNK, register=REGISTER,
                                     grain=grain, interpret=cfg.interpret, lookahead=1, fold_lanes=BQ // 2)[None]
        ahead_err = max_error(ahead, q, k, v, mask)
        assert ahead_err < TOL, (name, ahead_err)
        ahead_note = f"; scores ahead in folds of {BQ // 2}: {ahead_err:.1e}"
    print(f"PASSED  {name:<24} L = {length:,}: regions {regions}; == reference (max error {err:.1e}{ahead_note}), "
          f"== pallas_tile_lane_dense (max difference {gap:.1e})")

# %% [markdown]
# ## The step planner, written in view
#
# The kernel above takes its step codes from the library's `plan_steps`. Here is the planner itself
# at a given pattern grain (the library also picks the grain: of its candidates, the one whose
# patterns cost least). Each non-empty tile of the layout gets a code:
#
# * FULL tiles code 0, except those in the kv tile where the array ends, which are RAGGED (code 1:
#   the chunks past the end are skipped, the last one sliced);
# * PARTIAL tiles MASKED (code 2), unless a **pattern** costs less: the tile cut into grain x grain
#   sub-tiles of the mask's own layout, each EMPTY (skipped), FULL (run mask-free) or PARTIAL (run
#   with the mask evaluated, only where the mask has a predicate to trace). A pattern costs its
#   computed pairs, a masked pair counted twice; the whole tile masked costs 2 x block_q x block_kv;
# * the most frequent patterns (up to `MAX_PATTERNS`: each is one compiled region) get codes 3, 4,
#   ... in order of frequency, and the rest stay MASKED.
#
# The library's version adds the grain choice and the padding slots of a padded 3-D tiled order
# (kv tiles that hold them are masked by key); the check compares codes and patterns on the six
# masks above.

# %%
from collections import Counter

from stlib.kernels.steps import MASK, MAX_PATTERNS, RUN, SKIP, Pattern


def plan_codes(layout, length, grain):
    """Step codes int16 [Hl, nq, nk] (-1: not computed) and the patterns, at ``grain`` (0: none)."""
    (bq, bkv), nk = (layout.block_q, layout.block_kv), layout.grid_shape[1]
    kinds = np.asarray(layout.kinds)
    codes = np.full(kinds.shape, -1, np.int16)
    codes[kinds == stlib.TileKind.FULL] = StepKind.FULL
    if length % bkv:  # the kv tile where the array ends
        codes[:, :, nk - 1][kinds[:, :, nk - 1] == stlib.TileKind.FULL] = StepKind.RAGGED
    codes[kinds == stlib.TileKind.PARTIAL] = StepKind.MASKED
    if not grain:
        return codes, ()
    fine = np.asarray(stlib.block_layout(layout.mask, grain, grain).kinds)  # the mask's own sub-tiles
    found = {}
    for h, i, j in zip(*np.nonzero(codes == StepKind.MASKED)):
        if (j + 1) * bkv > length:
            continue  # a tile past the array's end stays masked whole
        sub = fine[h, i * bq // grain:(i + 1) * bq // grain, j * bkv // grain:(j + 1) * bkv // grain]
        if not layout.mask.traceable and (sub == stlib.TileKind.PARTIAL).any():
            continue  # no predicate to evaluate on a PARTIAL sub-tile
        kind = np.select([sub == stlib.TileKind.FULL, sub == stlib.TileKind.PARTIAL], [RUN, MASK], SKIP)
        pattern = Pattern(grain, tuple(tuple(int(x) for x in row) for row in kind.T), padded=False)  # rows: kv
        if pattern.cost() < 2 * bq * bkv:
            found[(h, i, j)] = pattern
    frequent = [p for p, _ in Counter(found.values()).most_common(MAX_PATTERNS)]
    for (h, i, j), pattern in found.items():
        if pattern in frequent:
            codes[h, i, j] = FIRST_PATTERN + frequent.index(pattern)
    return codes, tuple(frequent)


for name, (mask, grain) in cases.items():
    layout = stlib.block_layout(mask, BQ, BKV)
    library = plan_steps(layout, mask.length, grain)
    chosen = library.patterns[0].grain if library.patterns else 0  # the library's grain, taken as given
    codes, patterns = plan_codes(layout, mask.length, chosen)
    assert np.array_equal(codes, library.codes) and patterns == library.patterns, name
    counts = Counter(region_name(int(c)).removeprefix("compute_") for c in codes[codes >= 0])
    print(f"PASSED  plan_codes == plan_steps on {name:<24} (grain {chosen}): " + ", ".join(
        f"{region} {n}" for region, n in sorted(counts.items())))

# %% [markdown]
# ## Step codes and patterns at the case-study shape
#
# **Pattern steps.** In the 3-D tiled order the sliding-tile mask is FULL or EMPTY at the grain of
# one 3-D tile (384 tokens), but one-tile blocks are small for the MXU and pay the per-step overhead
# 56,700 times. The kernel's own blocks for a tiled order hold whole **rows of tiles** (a row: the
# 5 tiles along x, 5 x 384 = 1,920 tokens; the block sweep below picked two rows of queries against
# one row of keys on v6e and TPU7x, the reverse on v5e). Such a block is PARTIAL, yet cut into 384 x 384 sub-tiles it holds only EMPTY and
# FULL ones: a *pattern*. The pattern's region runs each kv sub-tile against the run of q sub-tiles it
# meets, a static lane slice of the q tile, with no mask at all; only kv blocks with padding slots
# (the 45 rows make a last tile row of 5 real rows out of 8) mask their padding keys, by a per-key
# validity column, never by evaluating the mask. The same idea serves a band: a tile on the band's
# edge skips its sub-tiles outside the band, runs those inside mask-free and evaluates the mask only
# on the sub-tiles the edge crosses (a *mixed* pattern: the 0.25 band's edge tiles then evaluate the
# mask on a fraction of their sub-tiles instead of all of them).
#
#
# The figure draws the step codes of the case-study sliding tile in the kernel's own blocks for a
# tiled order (`lane_dense.resolve_blocks`), from the layout alone.

# %%
case = configs.CASE_STUDY
sta_order = stlib.tiled_order(case.grid, (3, 8, 16))
sta_mask = masks.sliding_tile(case.grid, (3, 8, 16), (3, 3, 3)).permute(sta_order)
rows_blocks, _ = lane_dense.resolve_blocks(sta_mask, sta_mask.length, None, None,
                                           lane_dense.LaneDenseOptions(chip="v6e"), False)
sta_plan = plan_steps(stlib.block_layout(sta_mask, rows_blocks.block_q, rows_blocks.block_kv), sta_mask.length)
print(f"blocks {rows_blocks.block_q} x {rows_blocks.block_kv}: {len(sta_plan.patterns)} patterns, "
      f"{int((sta_plan.codes >= 0).sum()):,} computed steps per head, "
      f"{int((sta_plan.codes == StepKind.MASKED).sum())} of them masked")
fig = plotting.step_codes(sta_plan, "Sliding tile 3x8x16, window 3, 3-D tiled order, in blocks of whole rows of "
                          f"tiles ({rows_blocks.block_q:,} queries x {rows_blocks.block_kv:,} keys)")
plotting.save(fig, cfg.figure("07_step_codes"))

# %% [markdown]
# Padded rows of tiles (the 45 rows of the case study leave the last row of tiles 5 of its 8 rows)
# put padding slots into some kv tiles. The kernel above masks them as the library does: a pattern
# whose kv tile holds padding slots (`Pattern.padded`) reads an int32 validity column, one entry per
# key fetched with its kv tile (`StepPlan.key_valid_column`), and masks those keys' scores and
# zeroes their v; nothing else changes. Checked against the reference and the library on a small
# video with the same trouble, on every backend (the check needs no more): 6 x 10 x 80 in 2 x 4 x 16
# tiles (128 tokens, rows of 640), whose 10 rows leave the last row of tiles 2 of its 4 rows.

# %%
demo_grid, demo_tile = stlib.VideoGrid(6, 10, 80), (2, 4, 16)
demo_mask = masks.sliding_tile(demo_grid, demo_tile, (3, 3, 3))
demo_order = stlib.tiled_order(demo_grid, demo_tile)
dq, dk, dv = stlib.random_qkv((1, demo_grid.num_tokens, 128), cfg.workload.dtype, seed=3)
out = stlib.video_attention(dq, dk, dv, demo_grid, demo_mask, impl="pallas_tile_lane_dense",
                            orders=demo_order, interpret=cfg.interpret)
err = max_error(out, dq, dk, dv, demo_mask)
assert err < tolerance(cfg.workload.dtype), err
print(f"PASSED  pallas_tile_lane_dense in rows of 3-D tiles == reference on {demo_grid} (max error {err:.2e})")
# the kernel in view on the same padded order: q, k, v gathered into it (zeros at the padding slots),
# blocks of one row of tiles each way, a chunk of one tile, the output restored to raster order
row = int(np.prod(demo_tile)) * (demo_grid.width // demo_tile[2])
padded_mask = demo_mask.permute(demo_order)
padded_plan = plan_steps(stlib.block_layout(padded_mask, row, row), padded_mask.length)
qo, ko, vo = (demo_order.apply(x)[0] for x in (dq, dk, dv))
mine = demo_order.restore(lane_dense_attention(qo, ko, vo, padded_mask, block_q=row, block_kv=row,
                                               chunk=int(np.prod(demo_tile)), register=128,
                                               interpret=cfg.interpret)[None])
err, gap = max_error(mine, dq, dk, dv, demo_mask), float(jnp.max(jnp.abs(mine.astype(F32) - out.astype(F32))))
assert err < tolerance(cfg.workload.dtype) and gap < tolerance(cfg.workload.dtype), (err, gap)
padded = sum(padded_plan.pattern(c).padded for c in padded_plan.present if c >= FIRST_PATTERN)
print(f"PASSED  the kernel in view on the padded order ({padded} of {len(padded_plan.patterns)} patterns mask "
      f"padding keys by the validity column) == reference (max error {err:.2e}), == the library ({gap:.1e})")

# %% [markdown]
# ### Exercise 1: the log-sum-exp, from base-2 statistics
#
# Training needs one more output per query: its log-sum-exp (notebook 10), in the natural log. The
# kernel holds base-2 statistics: m is the running max of the scores scaled by log2 e, and l the sum
# of `exp2(s - m)`. Write `finish_with_lse(m, l, acc, mask_value)`, the finalise step that returns
# o `[bq, D]` and lse `[1, bq]` (lane-dense: one value per query along the lanes) from m, l `[1, bq]`
# and acc `[D, bq]`. A query that saw no key (m is still `mask_value`) gets o = 0 and lse = -inf.
# The check builds m, l and acc in jnp for a small mask with an empty row, and compares your o with
# the reference and your lse with `jax.nn.logsumexp` of the allowed scores.
#
# Run the notebook with `SOLUTIONS = "hide"` (first cell) to write it yourself: the stub raises, and
# the check prints NOT YET and what is wrong. `exercises.show("07.finish_with_lse")` prints a solution.
#
# *Hint 1:* log2(l) + m is the log-sum-exp in base 2; one constant turns it into the natural log.
# *Hint 2:* log(x) = log2(x) x ln 2; and acc is o^T unnormalised: divide by l, then transpose.

# %%
@exercises.fill_in("07.finish_with_lse")
def finish_with_lse(m, l, acc, mask_value):
    # --- your code here: return (o [bq, D], lse [1, bq]) ---
    raise NotImplementedError


def check_finish(finish_with_lse):
    """Base-2 statistics of a band with one empty query row, finished with ``finish_with_lse``."""
    n, d = 256, 64
    qx, kx, vx = (x[0] for x in stlib.random_qkv((1, n, d), F32, seed=5))
    allowed = np.asarray(masks.band(n, 16).to_dense()).copy()
    allowed[7] = False  # query 7 sees no key
    s2 = jnp.where(allowed, (qx @ kx.T) * (d**-0.5 * LOG2_E), MASK_VALUE).T  # [keys, queries], base 2
    m = jnp.max(s2, axis=0, keepdims=True)
    p = jnp.where(allowed.T, jnp.exp2(s2 - m), 0.0)
    o, lse = finish_with_lse(m, jnp.sum(p, axis=0, keepdims=True), vx.T @ p, MASK_VALUE)
    if o.shape != (n, d) or lse.shape != (1, n):
        raise exercises.NotYet(f"shapes o {o.shape}, lse {lse.shape}; expected {(n, d)} and {(1, n)}")
    want_lse = jax.nn.logsumexp(jnp.where(allowed, (qx @ kx.T) * d**-0.5, -jnp.inf), axis=1)
    err_o = scaled_error(o, stlib.attention(qx[None], kx[None], vx[None], masks.from_array(allowed),
                                            impl="reference")[0])
    if not (bool(jnp.isneginf(lse[0, 7])) and float(jnp.max(jnp.abs(o[7]))) == 0.0):
        raise exercises.NotYet("the query that saw no key must get o = 0 and lse = -inf")
    err_lse = scaled_error(jnp.delete(lse[0], 7), jnp.delete(want_lse, 7))  # relative: an lse is not of order one
    if not (err_o <= tolerance(F32) and err_lse <= tolerance(F32)):  # stlib.checks: exact on a CPU, bf16 on a TPU
        raise exercises.NotYet(f"o off by {err_o:.1e}, lse off by {err_lse:.1e}: is lse in the natural log?")
    return f"o == reference (max error {err_o:.1e}), lse == logsumexp (max error {err_lse:.1e}), the empty row 0 / -inf"


exercises.verify("07.finish_with_lse", check_finish, finish_with_lse)

# %% [markdown]
# ### Exercise 2: a pattern's updates
#
# A pattern region runs pieces of its tile: each kv sub-tile against each run of consecutive q
# sub-tiles of one kind. Write `pattern_updates(rows, grain, chunk)`: `rows[c][r]` says how kv
# sub-tile c meets q sub-tile r (0: skip, 1: run mask-free, 2: run masked); return one
# `(first key, keys, first query lane, lanes, masked)` tuple per update, in pieces of `chunk` keys
# where `chunk` divides `grain` (else the whole sub-tile). The check runs the kernel above with your
# updates on the band and the sliding tile, against the reference, and tests that your pieces cover
# every run sub-tile once, with its kind, and nothing else; first, on a pattern of its own whose
# sub-tiles hold two chunks, it compares your updates with the ones it expects.
#
# *Hint 1:* walk each row of `rows`, cutting it where the kind changes (not only where it is 0).
# *Hint 2:* a run of q sub-tiles r0..r1 of kind 1 or 2 in row c is an update of keys from c x grain,
# lanes from r0 x grain, (r1 - r0) x grain of them, cut into pieces of `chunk` keys when `chunk`
# divides `grain`. `exercises.show("07.pattern_updates")` prints a solution.

# %%
@exercises.fill_in("07.pattern_updates")
def pattern_updates(rows, grain, chunk):
    # --- your code here: return a list of (first key, keys, first query lane, lanes, masked) ---
    raise NotImplementedError


def check_updates(pattern_updates):
    """Your updates cover each pattern exactly, and the kernel run with them equals the reference."""
    # first a pattern whose sub-tiles hold two chunks each: one kv sub-tile against a run of two
    # mask-free q sub-tiles, then a masked one, then a skipped one
    grain = 2 * CHUNK
    want = {(0, CHUNK, 0, 2 * grain, False), (CHUNK, CHUNK, 0, 2 * grain, False),
            (0, CHUNK, 2 * grain, grain, True), (CHUNK, CHUNK, 2 * grain, grain, True)}
    got = [tuple(update) for update in pattern_updates([[1, 1, 2, 0]], grain, CHUNK)]
    if sorted(got) != sorted(want):
        raise exercises.NotYet(f"rows [[1, 1, 2, 0]], grain {grain}, chunk {CHUNK}: expected the updates "
                               f"{sorted(want)}, got {sorted(got)}")
    for name in ("band 0.25", "sliding tile, 3-D tiled"):
        mask, grain = cases[name]
        plan = plan_steps(stlib.block_layout(mask, BQ, BKV), mask.length, grain)
        for pattern in plan.patterns:
            covered = np.zeros((BKV, BQ), np.int8)  # 0 nothing, 1 mask-free, 2 masked, 3: covered twice
            for k0, keys, lane0, lanes, masked in pattern_updates(pattern.rows, pattern.grain, CHUNK):
                if keys > max(CHUNK, pattern.grain):
                    raise exercises.NotYet(f"an update of {keys} keys: at most a chunk ({CHUNK}) or a sub-tile")
                block = covered[k0:k0 + keys, lane0:lane0 + lanes]
                covered[k0:k0 + keys, lane0:lane0 + lanes] = np.where(block > 0, 3, 2 if masked else 1)
            want = np.kron(np.array(pattern.rows, np.int8), np.ones((pattern.grain, pattern.grain), np.int8))
            if not np.array_equal(covered, want):
                raise exercises.NotYet(f"{name}: {int((covered != want).sum()):,} (key, query) places of a pattern "
                                       "covered wrongly (missed, twice, or with the wrong kind)")
        q, k, v = stlib.random_qkv((1, mask.length, 128), dtype, seed=2)
        mine = lane_dense_attention(q[0], k[0], v[0], mask, block_q=BQ, block_kv=BKV, chunk=CHUNK, register=REGISTER,
                                    interpret=cfg.interpret,
                                    updates=lambda p, bq, bkv, chunk: pattern_updates(p.rows, p.grain, chunk))[None]
        err = max_error(mine, q, k, v, mask)
        if not err < TOL:
            raise exercises.NotYet(f"{name}: the kernel with your updates is off by {err:.1e}")
    return "every pattern covered exactly; the kernel with your updates == reference on both masks"


exercises.verify("07.pattern_updates", check_updates, pattern_updates)

# %% [markdown]
# ## Compiled for v6e: the schedule beside the production kernel's
#
# Interpret mode checked the arithmetic; only the compiler says what a step costs. Both kernels are
# compiled deviceless for v6e at the same shape (one head, 8,192 tokens, band 0.25, bf16, blocks
# 1,024 x 1,024, chunk 512, register tile 256) and their schedules are read the way the static
# estimate reads them (`stlib.analysis.inview.kernel_schedules` for the kernel above: exported, then
# compiled in a subprocess with libtpu's dump on). The table gives the bundles (VLIW instructions,
# one per cycle) of the grid step and of each compute region, and, for the FULL region, the bundles
# per 1,000 score pairs and the ops per unit.

# %%
SL, SB = 8 * 1024, 1024
sched_band = masks.band(SL, masks.band_width_for_density(SL, 0.25))
sched_plan = plan_steps(stlib.block_layout(sched_band, SB, SB), SL)
shape = jax.ShapeDtypeStruct((SL, 128), jnp.bfloat16)
variants = {"in order": {}, "scores ahead": {"lookahead": 1}, "folds of 256": {"lookahead": 1, "fold_lanes": 256}}
# the library in the same three orders: lookahead 0 and whole q tiles; every later chunk's scores issued ahead
# (1 of 2 here); and as on v6e by default, scores ahead in folds of 256 queries (FOLD_LANES["v6e"])
library_config = KernelConfig(impl=lane_dense.NAME, mask="band (density 0.25)", num_heads=1, length=SL, block_q=SB,
                              block_kv=SB, options={"block_kv_compute": 512, "block_kv_register": 256, "lookahead": 0,
                                                    "block_q_compute": SB}, chip="v6e")
ahead_config = dataclasses.replace(library_config, options={**library_config.options, "lookahead": None})
folded_config = dataclasses.replace(ahead_config, options={**ahead_config.options, "block_q_compute": 256})
# on a TPU host the library's schedules come from the committed estimate cache alone (a compile there costs tens
# of seconds a kernel); the schedules of the kernel in view are cached beside them. Either may be missing: say so.
SCHEDULE_ERRORS = (RuntimeError, LookupError, OSError, subprocess.SubprocessError)


def unavailable(what, error):
    print(f"{what}: not in the estimate cache ({estimate_cache.cache_dir()}) and not compiled here "
          f"({type(error).__name__}: {str(error).strip().splitlines()[0][:240]})")


reading_only = estimate_cache.cached_only(cfg.on_tpu)
try:
    try:
        mine = {
            name: kernel_schedules(
                lambda q, k, v, kw=kw: lane_dense_attention(q, k, v, sched_band, block_q=SB, block_kv=SB,
                                                            interpret=False, **kw),
                shape, shape, shape, chip="v6e", kernel_prefix="lane_dense_in_view",
                compute_names=[region_name(c) for c in sched_plan.present])[0]
            for name, kw in variants.items()}
    except SCHEDULE_ERRORS as error:
        mine = unavailable("the v6e schedules of the kernel in view", error)
    try:
        library = {name: compiled_attributions(lane_dense.NAME, config)["kernels"][0]
                   for name, config in zip(variants, (library_config, ahead_config, folded_config))}
    except SCHEDULE_ERRORS as error:
        library = unavailable("the library's v6e schedules", error)
finally:
    estimate_cache.cached_only(reading_only)
if mine is not None:  # the table, with the library's columns where its schedules are at hand
    ours = {name: per_step(att) for name, att in mine.items()}
    theirs = library and {name: {n: b for n, b in k["paths"].items() if n in ours[name]} for name, k in library.items()}
    lib = lambda name, path: f"{theirs[name].get(path, 0):,}" if theirs else "-"
    print(f"{'path (bundles)':<18}" + "".join(f" {name + ', in view':>22} {'library':>8}" for name in variants))
    for path in ours["in order"]:
        print(f"{path:<18}" + "".join(f" {ours[n].get(path, 0):>22,} {lib(n, path):>8}" for n in variants))
    pairs = SB * SB / 1000
    for name in variants:
        print(f"FULL region per 1,000 score pairs, {name}: {ours[name]['compute_full'] / pairs:.2f} bundles in view"
              + (f", {theirs[name]['compute_full'] / pairs:.2f} in the library" if theirs else ""))
    for name in variants:
        for who, ops in (("in view", mine[name].ops["compute_full"]),
                         *((("library", library[name]["ops"]["compute_full"]),) if library else ())):
            print(f"FULL region ops, {name}, {who}: " + ", ".join(f"{unit} {n:,}" for unit, n in sorted(ops.items())))
    if theirs:
        gaps = {(name, path): ours[name][path] / theirs[name][path] - 1
                for name in variants for path in ours[name] if theirs[name].get(path)}
        widest = max(gaps, key=lambda key: abs(gaps[key]))
        print(f"largest gap: {widest[1]} {widest[0]}, {gaps[widest]:+.1%} (static schedules, not measurements)")

# %% [markdown]
# Read the table this way: the grid step is the step table and the DMAs, and each compute region is
# the chunk loop; each pair of columns puts the kernel above beside the library in one order, and the
# last line gives the largest gap between them (where a schedule is not at hand, the cell says so and
# its columns read "-": on a TPU host the notebook reads the committed estimate cache and compiles
# none). With q scaled once per q tile into a VMEM scratch,
# as the library does, the kernel above compiles to the library's schedule region for region in
# every order, and its FULL region to the same ops unit for unit. All are static schedules, not
# measurements.
#
# ## The library's default: the next scores while this chunk waits
#
# The three orders do the same MXU and EUP work (the ops lines; folds trade a few VALU ops for
# cross-lane XLU ones, and scores issued ahead add VMEM traffic); what changes is the order. A
# chunk's exponentials cannot start before the max of its last score, and its p.v cannot start
# before its exponentials: in order (`lookahead=0`), each chunk's k q^T, max, exponentials and p.v
# follow one another, so the MXU waits while the EUP exponentiates. `fold_all` above issues the
# k q^T of the next pieces before it folds the current one (`lookahead`; the library's
# `LaneDenseOptions.lookahead`, by default every chunk that fits VMEM, `fit_lookahead`), so the
# scheduler has matrix work for the MXU while each chunk's exponentials run. A masked piece's scores
# are never issued ahead: its predicate's iota and compare temporaries beside every issued score
# overflowed VMEM on the per-head SVG mix at 147,600 tokens. The cost is VMEM: the scores of all
# chunks are alive at once, `[block_kv, block_q]` f32 (26 MB at 2,560 x 2,560), which `vmem_bytes`
# counts. At the case-study blocks the block sweep below compares chunks of 128, 256 and 512 keys
# with every chunk issued ahead.
#
# ## Folds of 256 queries: scores that fit the registers
#
# A chunk's scores `[chunk, block_q]` f32 are far more than the 64 vregs hold (256 x 2,048 is 512
# vregs), so between the max and the exponential the compiler keeps them in VMEM: stores and loads
# (the `vmem` ops of the FULL region above) beside the MXU's pops. The last pair of columns folds
# each 256-query slice of the q tile through all the tile's chunks in turn (`fold_lanes` above; the
# library's `LaneDenseOptions.block_q_compute`, per chip `FOLD_LANES`): the same MXU and EUP work, a
# fold's scores `[chunk, 256]` (32 vregs at chunks of 128), and the statistics of one slice (`m`,
# `l`, a `[D, 256]` slice of o^T) used chunk after chunk. Nothing about the softmax changes: each
# query's lane sees the same keys in the same order. MASKED steps and patterns keep whole lane runs
# (folds of 256 made the MASKED region 54% longer on v6e, band 0.25 at 2,048 x 2,048: the comment at
# the library's `pieces`). Whether folds pay depends on the chip and the chunk:
# the block sweep (`python -m stlib.bench.block_sweep`, its records in `data/`) compiled each chip's
# FULL step at the case-study shape with and without folds when `FOLD_LANES` was chosen, and the
# folds won on v5e (2,048 x 2,048, chunks of 128) and v6e (2,560 x 2,560, chunks of 256), the blocks
# tuned then, but cost TPU7x a few percent (2,048 x 2,048, chunks of 512), where the whole tile stays
# the default (those compiles are recorded beside `FOLD_LANES` in
# `stlib/kernels/tile_lane_dense/chips.py`, not reprinted here; the sweep has since picked other
# blocks). The table above shows the other side on v6e: at 1,024 x 1,024 with chunks of 512 the
# folds cost more than they save (the last pair of columns against the one before it), so read the
# columns before you pick the option for other blocks.
#
# ## What the production kernel adds
#
# `stlib/kernels/tile_lane_dense/` (the body in `body.py`, the call in `kernel.py`) is this kernel with
# what a library needs besides:
#
# * heads (grid (H, q tiles, slots)) and per-head step tables, one shared table when every head has
#   the same mask;
# * how far ahead to issue scores (`fit_lookahead`: as many as fit VMEM) and the folds per chip
#   (`FOLD_LANES`);
# * the log-sum-exp output for the backward (exercise 1) and bf16 or f32 probabilities for p.v;
# * the VMEM budget per chip (`vmem_limit_bytes`), block checks with messages, and tuned blocks per
#   chip and pattern, chosen by the block sweep below.

# %% [markdown]
# Which blocks? Not guessed: `python -m stlib.bench.block_sweep` compiled the kernel for v5e, v6e and
# TPU7x at every candidate and scored each with the static estimate (notebook 08), dense Splash at
# its own candidates beside it. The table is read from the sweep's records
# (`data/tile_block_sweep.jsonl`). The "ratio" column is clock-free: the kernel's estimated cycles
# over dense Splash's at its best blocks on the same chip. The "ms" columns add the call's XLA glue
# at the chip's clock, so their quotient is not exactly the ratio. "target" is the fraction of
# dense Splash the kernel was tuned to reach on that chip and pattern (`block_sweep.TARGETS`),
# "met" where the ratio is at or below it, "missed" where it is above. A last line "stale" says that
# the estimator changed after the sweep: a later rule for how the MXU is fed charges the tile
# kernel's forward more and leaves Splash's as it was, which is why most targets read missed now
# (notebook 08's last section sets that rule against a TPU v5e's measurements). The blocks were
# ranked under the rules of their day; re-ranking them is the command it prints (hours of compiles).
# Static estimates, never measurements.

# %%
sweep_records = cfg.data / Path(block_sweep.RECORDS).name
if sweep_records.exists():
    block_sweep.print_table(block_sweep.read(sweep_records))
else:
    print(f"no sweep records at {sweep_records}: python -m stlib.bench.block_sweep writes them (about an hour of compiles)")

# %% [markdown]
# ## Timed: the kernel in view beside the library and Splash
#
# The kernel in view runs one head; `jax.vmap` runs it over all of them (one more axis of the same
# `pallas_call`'s grid). It takes any length as it is (the RAGGED region), so on a TPU it runs the
# case study itself: 10 heads x 75,600 tokens x 128, bfloat16, with the band of density 0.25 (the
# temporal head in token-major order), at the blocks and chunk the block sweep tuned for the chip
# at hand (`lane_dense.DEFAULT_BLOCKS`), register tiles of 256 keys, folds of 256 queries and as
# many scores issued ahead as the library issues by default (`lane_dense.fit_lookahead`). The
# library runs with the same settings passed explicitly, and Splash with its own blocks on the
# same band. Each output is checked against the reference on sampled rows, then the three are
# timed in turn (`bench.time_interleaved`: compile excluded, each round in a shuffled order). Off a
# TPU the cell runs one head at the small size of the checks above in interpret mode, as cheap as
# they are: those times are the interpreter's, not a TPU's.

# %%
from stlib import bench

if cfg.on_tpu:  # the case study, at the blocks the block sweep tuned for this chip
    chip = stlib.device.current_chip()
    tuned = lane_dense.DEFAULT_BLOCKS.get(chip, lane_dense.DEFAULT_BLOCKS["v6e"])
    shape_b, dtype_b = cfg.workload.qkv_shape, cfg.workload.dtype
    bq_b, bkv_b, chunk_b, register_b, fold_b = tuned.block_q, tuned.block_kv, tuned.block_kv_compute, 256, 256
    # the library's default lookahead for these blocks (a band has MASKED steps: whole q tiles held at once)
    ahead_b = lane_dense.fit_lookahead(bq_b, bkv_b, chunk_b, register_b, shape_b[2], jnp.dtype(dtype_b).itemsize,
                                       chip=chip, fold_lanes=bq_b)
else:  # interpret mode: one head at the small size of the checks
    shape_b, dtype_b = (1, L, 128), dtype
    bq_b, bkv_b, chunk_b, register_b, fold_b, ahead_b = BQ, BKV, CHUNK, REGISTER, BQ // 2, 1
band_b = masks.band(shape_b[1], masks.band_width_for_density(shape_b[1], 0.25))
qb, kb, vb = stlib.random_qkv(shape_b, dtype_b, seed=4)
blocks_b = {"block_q": bq_b, "block_kv": bkv_b}
timed = {
    "kernel in view": jax.vmap(functools.partial(  # the heads: one more grid axis
        lane_dense_attention, mask=band_b, chunk=chunk_b, register=register_b, lookahead=ahead_b, fold_lanes=fold_b,
        interpret=cfg.interpret, **blocks_b)),
    "stlib pallas_tile_lane_dense": functools.partial(
        stlib.attention, mask=band_b, impl=lane_dense.NAME, interpret=cfg.interpret, **blocks_b,
        options={"block_kv_compute": chunk_b, "block_kv_register": register_b, "lookahead": ahead_b,
                 "block_q_compute": fold_b}),
    "Splash (the band)": functools.partial(stlib.attention, mask=band_b, impl="splash", interpret=cfg.interpret),
}
print(f"{' x '.join(f'{n:,}' for n in shape_b)} {jnp.dtype(dtype_b).name}, band density "
      f"{stlib.block_layout(band_b, bq_b, bkv_b).density:.3f}; blocks {bq_b:,} x {bkv_b:,}, chunks of {chunk_b}, "
      f"register tiles of {register_b}, folds of {fold_b}, {ahead_b} chunk(s) of scores issued ahead")
compiled = {name: bench.compile_function(fn, qb, kb, vb) for name, fn in timed.items()}
for name, fn in compiled.items():  # compiled once: checked, then timed
    notebook.passed(f"{name} == reference", max_error(fn(qb, kb, vb), qb, kb, vb, band_b), tolerance(dtype_b))
rounds, trials = (3, 2) if cfg.on_tpu else (1, 1)
timings = notebook.time_side_by_side(
    cfg, compiled, qb, kb, vb, rounds=rounds, trials=trials, baseline="Splash (the band)", figure="07_timed",
    title=f"Band 0.25, {' x '.join(f'{n:,}' for n in shape_b)} {jnp.dtype(dtype_b).name}, blocks {bq_b:,} x {bkv_b:,}",
    notebook="07_lane_dense_kernel", what="the kernel in view, pallas_tile_lane_dense and Splash on one band",
    shape=list(shape_b), dtype=jnp.dtype(dtype_b).name, block_q=bq_b, block_kv=bkv_b, chunk=chunk_b,
    register=register_b, fold_lanes=fold_b, lookahead=ahead_b)

# %% [markdown]
# The kernel in view and the library compile to the same schedule region for region (the schedule
# section above), so on a TPU their times should agree within the whiskers; a gap between them would
# say the two calls differ somewhere in their settings. Splash runs the same band with its own
# blocks and natural exponentials; the last column is its median over each kernel's. On a CPU the
# times are the interpreter's and say nothing about a TPU. Notebook 08 times the library against
# dense and block-sparse Splash on all of the case study's masks.

# %% [markdown]
# ## Takeaway
#
# The second-generation kernel changes how a tile is computed, not which tiles: scores as k q^T put
# keys on sublanes, so the softmax statistics are lane-dense `[8, block_q]` rows, every reduction
# over keys is element-wise across vregs, and the correction alpha is a sublane broadcast. The kv
# tile is walked in chunks, each chunk in register tiles that feed the MXU straight from the
# exponential. Each grid step runs the region its code names: FULL with no mask work, MASKED with
# the mask's predicate, or a pattern of mask-free and masked sub-tiles. Notebook 08 puts this kernel
# next to Splash and the first generation at the case-study shape.
#
# ## Questions
#
# 1. Why are `m` and `l` `[8, block_q]` and not `[1, block_q]`, when all 8 sublanes hold the same
#    value?
# 2. The register tile bounds how much of p is alive at once. What would a `[512, 2,048]` float32 p
#    cost in VMEM, and why does that matter for the schedule?
# 3. A mixed pattern on the band's edge runs its diagonal sub-tiles masked. Why is that cheaper than
#    masking the whole tile?
#
# <details><summary>Answers</summary>
#
# 1. A vreg holds 8 sublanes: an `[8, n]` f32 array is n / 128 whole vregs, and a `[1, n]` one would
#    take as many vregs with 7 of 8 sublanes wasted, plus a broadcast at every use. Storing 8 copies
#    costs nothing extra and makes the sublane broadcast a plain load.
# 2. 512 x 2,048 x 4 B = 4 MiB: more than the vregs hold, so p would be stored to VMEM after the
#    exponential and loaded again for the matmul (`vst` and `vld` per score). With 256-key register
#    tiles the compiler keeps a piece of p in vregs between the EUP and the MXU.
# 3. A masked score costs about twice a mask-free one in the v6e schedule (the iotas, compares and
#    selects; `Pattern.cost`). A pattern pays that only on the sub-tiles the edge crosses, skips the
#    sub-tiles outside the band, and runs the rest mask-free.
#
# </details>
