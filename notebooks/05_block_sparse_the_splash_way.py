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
# # 05 · Block-sparse attention, the Splash way
#
# The dense kernel of notebook 04 visits every (q tile, kv tile) pair. A block-sparse kernel reads
# the mask's tile layout (notebook 03) *before* it runs and, at every grid step, decides whether to
# compute at all. This notebook builds that kernel from scratch (`impl="pallas_block_sparse"`),
# the way JAX's Splash attention does it: skip with `pl.when`, steer with scalar-prefetched
# tables, and make skipped steps fetch nothing. It times that kernel beside the library's and
# Splash (on a TPU; in interpret mode elsewhere, which says nothing about speed), runs Splash
# itself, and makes the case study's lesson visible: a sparse mask is not automatically faster than
# dense attention.

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

import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask_info

import stlib
import stlib.kernels  # registers the Pallas kernels with stlib.attention
from stlib import bench, checks, configs, exercises, masks, notebook, plotting
from stlib.kernels.block_sparse import step_table
from stlib.kernels.splash import splash_blocks, splash_mask
from stlib.layout import smem_bytes
from stlib.masks import case_study_masks
from stlib.roofline import work_summary

cfg = notebook.setup(SIZE, solutions=SOLUTIONS)
# checks against the plain reference, within the tolerance of the dtype on this backend (stlib.checks)
max_error, tolerance, passed = notebook.max_error, notebook.tolerance, notebook.passed

TOL = tolerance(cfg.workload.dtype)

# %% [markdown]
# ## The mask, the reference, and the dense kernel with a mask
#
# The running example is the band |q - k| <= w at density 0.25, the form the Sparse VideoGen TPU
# design gives a spatial head (w from `masks.band_width_for_density`, rounded up to a multiple of
# 128: on the small shape that makes the density about 0.4). First the dense kernel with this
# mask: correct, and it still computes every tile (then masks it).

# %%
workload = cfg.workload
H, L, D = workload.qkv_shape
itemsize = jnp.dtype(workload.dtype).itemsize
q, k, v = stlib.random_qkv(workload.qkv_shape, workload.dtype, seed=0)
band = masks.band(L, masks.band_width_for_density(L, 0.25))
layout = stlib.block_layout(band, cfg.block_q, cfg.block_kv)
print(f"{band!r}: density {layout.density:.3f}; {layout.grid_shape[0]} x {layout.grid_shape[1]} tiles of "
      f"{cfg.block_q} x {cfg.block_kv}: {layout.kind_counts()}")
kernel_args = {"block_q": cfg.block_q, "block_kv": cfg.block_kv, "interpret": cfg.interpret}
out = stlib.attention(q, k, v, band, impl="pallas_dense", **kernel_args)
passed("pallas_dense with the band == reference", max_error(out, q, k, v, band), TOL,
       detail=f"; tiles computed: {work_summary('pallas_dense', layout, H, D)['computed_tiles']:,} "
              f"of {H * layout.kinds[0].size:,}");

# %% [markdown]
# ## Skipping with `pl.when`, steering with scalar prefetch
#
# The block-sparse kernel keeps the dense kernel's grid (H, q tiles, kv tiles), but before the
# grid starts, Pallas copies a small int32 table into SMEM, the TPU's scalar memory
# (`PrefetchScalarGridSpec(num_scalar_prefetch=1)`). The table has one entry per grid step:
#
# ```
# entry = fetch << 2 | kind      kind: 0 skip, 1 masked tile, 2 mask-free tile
# ```
#
# * the kernel body reads `kind` and wraps the tile update in `pl.when(kind == 2)` (no mask) and
#   `pl.when(kind == 1)` (with the mask): a skipped step runs no matrix multiply and no exponential;
# * the k and v `BlockSpec` index maps read `fetch`: the kv tile to copy for this step. For a
#   skipped step it is the *next* non-empty tile of the row (or the last one, past the row's end).
#   The pipeline only copies a block when its index changes from one step to the next, so a run
#   of skipped steps copies nothing, and the first useful tile is already in flight. That is what
#   Splash's `data_next` table does.
#
# Here is the table of the band on the small shape, drawn step by step: colour is the kind, the
# number is the kv tile fetched, bold where a copy is issued, grey where the tile is already in VMEM.

# %%
small_length = configs.SMALL_CPU.num_tokens
small_band = masks.band(small_length, masks.band_width_for_density(small_length, 0.25))
small_layout = stlib.block_layout(small_band, 128, 128)
table = step_table(small_layout)  # int32 [1, nq, nk]: one table shared by every head
print("kind of each step (q tile 4):  ", (table[0, 4] & 3).tolist())
print("kv tile fetched (q tile 4):    ", (table[0, 4] >> 2).tolist())
fig = plotting.step_table_map(table, f"pallas_block_sparse step table: band |q - k| <= {small_band.width} (density "
                              f"{small_layout.density:.2f}), L = {small_length:,}, 128 x 128 tiles\n(number: kv tile "
                              "fetched; bold: a new copy; grey: already in VMEM)")
plotting.save(fig, cfg.figure("05_step_table"))


# %%
def kv_copies(kv_index, num_heads):
    """k/v tile copies the pipeline issues over the grid (h, i, j): one per step whose kv block
    index differs from the previous step's. kv_index: int [Hl or H, nq, nk] tile per step."""
    index = np.broadcast_to(kv_index, (num_heads, *kv_index.shape[1:]))
    key = (np.arange(num_heads)[:, None, None] * 1_000_000 + index).reshape(-1)  # block (h, tile)
    return 1 + int(np.count_nonzero(key[1:] != key[:-1]))


case = configs.CASE_STUDY
case_band = masks.band(case.num_tokens, masks.band_width_for_density(case.num_tokens, 0.25))
case_layout = stlib.block_layout(case_band, 512, 1024)  # the v6e default tiles; about a second on a CPU
for name, lay, heads in [("small shape", small_layout, configs.SMALL_CPU.num_heads),
                         ("case-study shape, 512 x 1,024 tiles", case_layout, case.num_heads)]:
    nq, nk = lay.grid_shape
    dense_index = np.broadcast_to(np.arange(nk), (1, nq, nk))
    tab = step_table(lay)
    computed = heads * int(np.sum(lay.kinds != stlib.TileKind.EMPTY))
    print(f"{name}: {heads * nq * nk:,} grid steps, {computed:,} computed; kv copies: dense kernel "
          f"{kv_copies(dense_index, heads):,}, block-sparse {kv_copies(tab >> 2, heads):,}; "
          f"table {tab.shape}, prefetched flat: {tab.size:,} int32 = {smem_bytes((tab.size,)):,} B of SMEM")

# %% [markdown]
# ## The block-sparse kernel, written in view
#
# Here is that kernel for one head and a band mask |q - k| <= w, in about sixty lines. It reuses
# the flash kernel of notebook 04 and changes three things:
#
# 1. **the step table in SMEM**: `PrefetchScalarGridSpec(num_scalar_prefetch=1)` puts the flat
#    int32 table `steps[i * nk + j] = fetch << 2 | kind` in SMEM; the body and the index maps
#    receive its ref;
# 2. **the skip**: the update runs under `pl.when(kind == FULL)` (no mask code at all) or
#    `pl.when(kind == PARTIAL)` (the band evaluated from iota); an EMPTY step runs neither;
# 3. **the kv index map** reads `fetch`, which for an EMPTY step repeats the next non-empty tile
#    of the row (or the previous one past the row's end): consecutive steps ask for the same block,
#    so the pipeline issues no copy.
#
# `build_steps` writes the table from the layout's tile kinds in plain numpy; it must equal
# `stlib.kernels.block_sparse.step_table`.

# %% [markdown]
# ### Exercise 1: the kv index map
#
# The kernel below takes its kv index map as an argument: write it now, before reading the
# kernel's code (which decodes the same table). `kv_map(i, j, steps_ref, nk)` returns the block
# (kv tile, 0) of k and v that grid step (i, j) reads, from the flat step table in SMEM described
# above. The check, after the kernel, builds the small band's table, runs the kernel with your map,
# checks the result against the reference, and counts the kv copies the pipeline would issue (a
# copy wherever the block index differs from the previous step's) against the copies of the
# table's own `fetch` column.
#
# Run the notebook with `SOLUTIONS = "hide"` (first cell) to write it yourself: the stub raises, and
# the check prints NOT YET and what is wrong. `exercises.show("05.kv_map")` prints a solution.
#
# *Hint 1:* a map that returns `(j, 0)` is correct, as in the dense kernel, but copies every tile.
# *Hint 2:* the flat table is indexed `i * nk + j`; the tile number sits above the two kind bits.

# %%
@exercises.fill_in("05.kv_map")
def kv_map(i, j, steps_ref, nk):
    # --- your code here: return the (kv block, 0) that step (i, j) computes or prefetches ---
    raise NotImplementedError


# %%
import time

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from stlib.device import compile_for_tpu
from stlib.reference import MASK_VALUE

F32 = jnp.float32
EMPTY, PARTIAL, FULL = int(stlib.TileKind.EMPTY), int(stlib.TileKind.PARTIAL), int(stlib.TileKind.FULL)


def lanes(x, width):
    """[rows, 128] lane-replicated -> [rows, width] (width a multiple of 128), without lane shuffles."""
    return jnp.tile(x, (1, width // 128))


def build_steps(kinds):
    """kinds int [nq, nk] (0 EMPTY, 1 PARTIAL, 2 FULL) -> flat int32 [nq * nk]: fetch << 2 | kind."""
    nq, nk = kinds.shape
    fetch = np.zeros((nq, nk), np.int32)
    for i in range(nq):
        computed = np.flatnonzero(kinds[i] != EMPTY)  # the kv tiles this row computes
        for j in range(nk):
            later = computed[computed >= j]
            fetch[i, j] = later[0] if later.size else (computed[-1] if computed.size else 0)  # next, else last
    return (fetch << 2 | kinds).astype(np.int32).reshape(-1)


def block_sparse_kernel(steps_ref, q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref, *, scale, width):
    i, j, nk = pl.program_id(0), pl.program_id(1), pl.num_programs(1)
    bq, bkv = q_ref.shape[0], k_ref.shape[0]
    entry = steps_ref[i * nk + j]  # one scalar load from SMEM
    kind, kv_tile = entry & 3, entry >> 2

    @pl.when(j == 0)  # init, as in the flash kernel
    def _init():
        m_ref[...] = jnp.full(m_ref.shape, MASK_VALUE, F32)
        l_ref[...] = jnp.zeros(l_ref.shape, F32)
        acc_ref[...] = jnp.zeros(acc_ref.shape, F32)

    def update(masked):  # masked is a Python bool: two copies of the update are traced
        s = jax.lax.dot_general(q_ref[...], k_ref[...], (((1,), (1,)), ((), ())),
                                preferred_element_type=F32) * scale  # [bq, bkv]
        if masked:  # the band from the tile's row and column numbers: VPU work on every score
            rows = i * bq + jax.lax.broadcasted_iota(jnp.int32, s.shape, 0)  # [bq, bkv]
            cols = kv_tile * bkv + jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)  # [bq, bkv]
            allowed = (rows - cols <= width) & (cols - rows <= width)
            s = jnp.where(allowed, s, MASK_VALUE)
        m_prev = m_ref[...]  # [bq, 128]
        m_next = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))
        alpha = jnp.exp(m_prev - m_next)
        p = jnp.exp(s - lanes(m_next, bkv))  # [bq, bkv]
        if masked:
            p = jnp.where(allowed, p, 0.0)  # a fully hidden row would otherwise add exp(0) = 1
        l_ref[...] = alpha * l_ref[...] + jnp.sum(p, axis=1, keepdims=True)
        m_ref[...] = m_next
        pv = jax.lax.dot_general(p, v_ref[...].astype(F32), (((1,), (0,)), ((), ())), preferred_element_type=F32)
        acc_ref[...] = lanes(alpha, acc_ref.shape[1]) * acc_ref[...] + pv  # [bq, D]

    pl.when(kind == FULL)(lambda: update(masked=False))  # mask-free tile: no iota, no compare, no select
    pl.when(kind == PARTIAL)(lambda: update(masked=True))  # EMPTY: neither runs, and nothing was copied

    @pl.when(j == nk - 1)  # finalise; a row that saw no key writes 0
    def _finish():
        l = lanes(l_ref[...], acc_ref.shape[1])
        o_ref[...] = jnp.where(l > 0, acc_ref[...] / jnp.where(l > 0, l, 1.0), 0.0).astype(o_ref.dtype)


def block_sparse_attention(steps, q, k, v, *, width, kv_map, block_q=128, block_kv=128, interpret=cfg.interpret):
    """steps: build_steps(...) of the band's layout; q, k, v [L, D] one head (L a multiple of both blocks);
    kv_map(i, j, steps_ref, nk): the kv index map (the first exercise below)."""
    (length, head_dim), scale = q.shape, q.shape[1] ** -0.5
    nk = length // block_kv
    kv_spec = pl.BlockSpec((block_kv, head_dim), lambda i, j, steps_ref: kv_map(i, j, steps_ref, nk))
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1, grid=(length // block_q, length // block_kv),
        in_specs=[pl.BlockSpec((block_q, head_dim), lambda i, j, steps_ref: (i, 0)),  # q [bq, D]
                  kv_spec,  # k [bkv, D]
                  kv_spec],  # v [bkv, D]
        out_specs=pl.BlockSpec((block_q, head_dim), lambda i, j, steps_ref: (i, 0)),
        scratch_shapes=[pltpu.VMEM((block_q, 128), F32), pltpu.VMEM((block_q, 128), F32),
                        pltpu.VMEM((block_q, head_dim), F32)])
    return pl.pallas_call(
        functools.partial(block_sparse_kernel, scale=scale, width=width), grid_spec=grid_spec,
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        compiler_params=None if interpret else pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
        interpret=interpret)(steps, q, k, v)


# %%
steps = build_steps(np.asarray(small_layout.kinds[0]))
assert np.array_equal(steps, step_table(small_layout).reshape(-1))
print(f"PASSED  build_steps == stlib step_table on the small band ({steps.size} entries, max error 0)")
qt, kt, vt = stlib.random_qkv((1, small_length, 128), jnp.float32, seed=3)


def check_kv_map(kv_map):
    """Run the block-sparse kernel with ``kv_map``: a line for PASSED, or NotYet with what is wrong."""
    nq, nk = small_layout.grid_shape
    out = block_sparse_attention(jnp.asarray(steps), qt[0], kt[0], vt[0], width=small_band.width, kv_map=kv_map)
    blocks = np.array([[int(kv_map(i, j, steps, nk)[0]) for j in range(nk)] for i in range(nq)])  # the map on the host
    err = checks.scaled_error(out, stlib.attention(qt, kt, vt, small_band, impl="reference")[0])
    copies, best = kv_copies(blocks[None], 1), kv_copies((steps.reshape(1, nq, nk) >> 2), 1)
    if not err <= tolerance(jnp.float32):
        raise exercises.NotYet(f"max error {err:.2e}: a computed step reads the wrong kv tile")
    if copies > best:
        raise exercises.NotYet(f"correct, but {copies} kv copies instead of {best}: skipped steps still fetch")
    return f"max error {err:.1e}, {copies} kv copies (dense kernel: {nq * nk})"


exercises.verify("05.kv_map", check_kv_map, kv_map)

# %% [markdown]
# The map the kernel runs with, and the whole kernel against the reference and against
# `pallas_block_sparse` on the same inputs:

# %%
def kv_index_map(i, j, steps_ref, nk):  # the crux: an EMPTY step names the block a neighbour needs anyway
    return (steps_ref[i * nk + j] >> 2, 0)  # block (kv tile, 0): rows kv_tile * bkv ... + bkv of k and v


def check_against_both(name, out, q, k, v, mask, impl, **kwargs):
    """out [L, D] of a one-head teaching kernel vs the float32 reference and the stlib kernel ``impl``."""
    ref = stlib.attention(q, k, v, mask, impl="reference")[0]
    production = stlib.attention(q, k, v, mask, impl=impl, interpret=cfg.interpret, **kwargs)[0]
    err_ref, err_lib = checks.scaled_error(out, ref), checks.scaled_error(out, production)
    passed(name, max(err_ref, err_lib), tolerance(q.dtype),
           detail=f": {err_ref:.1e} vs the reference, {err_lib:.1e} vs stlib {impl}")


check_against_both(f"block_sparse_kernel, band w = {small_band.width}, 1 x {small_length:,} x 128, 128 x 128 tiles",
                   block_sparse_attention(jnp.asarray(steps), qt[0], kt[0], vt[0], width=small_band.width,
                                          kv_map=kv_index_map),
                   qt, kt, vt, small_band, "pallas_block_sparse", block_q=128, block_kv=128)

# %% [markdown]
# Compiled for v6e at a moderate shape (one head, 8,192 tokens, bf16, tiles 512 x 1,024, band
# density 0.25), next to the production kernel:

# %%
mod_len = 8192
mod_band = masks.band(mod_len, masks.band_width_for_density(mod_len, 0.25))
mod_layout = stlib.block_layout(mod_band, 512, 1024)
mod_steps = build_steps(np.asarray(mod_layout.kinds[0]))
one, many = jax.ShapeDtypeStruct((mod_len, 128), jnp.bfloat16), jax.ShapeDtypeStruct((1, mod_len, 128), jnp.bfloat16)
for name, fn, shapes in [
    ("teaching block_sparse_kernel", functools.partial(block_sparse_attention, width=mod_band.width,
                                                       kv_map=kv_index_map, block_q=512,
                                                       block_kv=1024, interpret=False),
     [jax.ShapeDtypeStruct(mod_steps.shape, jnp.int32), one, one, one]),
    ("stlib pallas_block_sparse", functools.partial(stlib.attention, mask=mod_band, impl="pallas_block_sparse",
                                                    block_q=512, block_kv=1024, interpret=False), [many] * 3),
]:
    start = time.perf_counter()
    hbm = compile_for_tpu(fn, *shapes, chip="v6e").memory()
    print(f"v6e {name:<29} compiled in {time.perf_counter() - start:.1f} s: HBM arguments "
          f"{hbm['argument_size_in_bytes']:,} B, output {hbm['output_size_in_bytes']:,} B, temporaries "
          f"{hbm['temp_size_in_bytes']:,} B, code {hbm['generated_code_size_in_bytes']:,} B")
print(f"step table: {mod_steps.size} int32 entries, {smem_bytes(mod_steps.shape):,} B of SMEM "
      f"(the production kernel prefetches the same flat table)")

# %% [markdown]
# **What the production kernel adds** (`stlib/kernels/block_sparse.py`, `block_sparse_attention`
# and `step_table`, vectorised with numpy accumulations instead of `build_steps`' loops):
#
# * heads, and per-head masks: the table is [Hl, nq, nk] flattened, indexed by `row_of(h, i)`;
#   one shared table when every head has the same mask;
# * any mask: PARTIAL tiles evaluate a lazy mask's own predicate from iota (`mask_info.iota_mask`),
#   or read a deduplicated int8 table of tile masks through a second prefetched index
#   (`stlib.passes.plan_mask`, `mask_info.carried_index`), and the SMEM budget is checked with a message
#   (`mask_info.check_prefetch`);
# * padding to the blocks (`pallas_call.pad_sequence`): a ragged last tile is marked masked;
# * the shared update (`online_softmax.update_tile`): q pre-scaled, kv chunks, optional exp2;
# * its work model and schedule counts for the estimator (`block_sparse_work`,
#   `block_sparse_schedule_counts`).

# %% [markdown]
# ### Exercise 2: a PARTIAL tile's predicate for another mask
#
# The kernel's masked update evaluates the band from two iotas: `rows` and `cols` hold each score's
# query and key token numbers. Other masks need other predicates, and they cost the same few VPU
# operations. Write `frame_causal_allowed(rows, cols, tokens_per_frame)` for frame-causal attention
# (`masks.frame_causal`, tokens in frame-major raster order): a query sees every key of its own
# frame and of every earlier frame. The check evaluates it on every 128 x 128 tile of a small video
# and compares it with the mask's own block.
#
# *Hint 1:* a token's frame is its number divided by the tokens per frame.
# *Hint 2:* compare frames, not tokens: a key of a later frame is refused, any key of the query's
# own frame is allowed. `exercises.show("05.frame_causal")` prints a solution.

# %%
@exercises.fill_in("05.frame_causal")
def frame_causal_allowed(rows, cols, tokens_per_frame):
    # --- your code here: a bool array of rows' shape, True where the query may see the key ---
    raise NotImplementedError


def check_predicate(predicate):
    """Evaluate ``predicate`` from iota on every tile of a frame-causal mask and compare its blocks."""
    video = stlib.VideoGrid(4, 8, 12)  # 96 tokens per frame: frame borders cut through the 128-token tiles
    mask, per_frame = masks.frame_causal(video), video.height * video.width
    tiles, wrong = 0, 0
    for q0 in range(0, video.num_tokens, 128):
        for k0 in range(0, video.num_tokens, 128):
            rows = q0 + jax.lax.broadcasted_iota(jnp.int32, (128, 128), 0)
            cols = k0 + jax.lax.broadcasted_iota(jnp.int32, (128, 128), 1)
            got = np.asarray(predicate(rows, cols, per_frame))
            if got.shape != (128, 128):
                raise exercises.NotYet(f"the predicate has shape {got.shape}, expected (128, 128)")
            tiles, wrong = tiles + 1, wrong + int(not np.array_equal(got, mask.block(q0, q0 + 128, k0, k0 + 128)))
    if wrong:
        raise exercises.NotYet(f"{wrong} of {tiles} tiles differ from the mask (a key of the query's own frame is allowed)")
    return f"equals masks.frame_causal on all {tiles} tiles of {video.num_tokens} tokens"


exercises.verify("05.frame_causal", check_predicate, frame_causal_allowed)

# %%
out = stlib.attention(q, k, v, band, impl="pallas_block_sparse", **kernel_args)
passed("pallas_block_sparse with the band == reference", max_error(out, q, k, v, band), TOL);

# %% [markdown]
# ## Splash itself
#
# JAX ships this design as Splash attention (`jax.experimental.pallas.ops.tpu.splash_attention`);
# `impl="splash"` adapts stlib masks to it (`stlib/kernels/splash.py`: bands become Splash's
# `LocalMask`, a ragged length is padded and the padding hidden with segment ids, which Splash
# compares on every tile it computes: at 75,600 tokens even dense Splash, called this way, masks
# every tile). Splash builds its tables in a `MaskInfo`: `block_mask` (0 empty / 1 partial /
# 2 full, the same convention), `data_next` (the tile to fetch) and, for partial tiles,
# deduplicated mask blocks. One difference shows when we ask Splash for its tables: when every
# head shares one mask, Splash *shrinks the grid*: its kv axis is as long as the widest row, not
# the whole sequence, and each row lists its non-empty tiles. That is stlib's "rows" grid of
# notebook 06, built into Splash.

# %%
out = stlib.attention(q, k, v, band, impl="splash", **kernel_args)
passed("splash with the band == reference", max_error(out, q, k, v, band), TOL)

info, _ = splash_attention_mask_info.process_mask(splash_mask(small_band, 1, small_length, small_length)[0], (128, 128))
count = small_layout.row_counts[0]
inside = np.arange(small_layout.max_row_width)[None, :] < count[:, None]  # table slots a row really uses
same_kind = np.array_equal(np.where(inside, info.block_mask[0], 0), small_layout.row_kinds[0])
same_fetch = np.array_equal(np.where(inside, info.data_next[0], 0), np.where(inside, small_layout.row_kv_tiles[0], 0))
assert info.block_mask.shape[1:] == small_layout.row_kinds.shape[1:] and same_kind and same_fetch
print(f"PASSED  Splash's MaskInfo (block_mask, data_next {info.block_mask.shape}) == stlib's row tables "
      f"(row_kinds, row_kv_tiles {small_layout.row_kinds.shape}) on every used slot (max error 0)")

# Splash's own grid at the full case-study shape (its MaskInfo is cheap to build for a band)
blocks = splash_blocks(case.num_tokens)
case_info, _ = splash_attention_mask_info.process_mask(
    splash_mask(case_band, case.num_heads, case.num_tokens, blocks.padded_length(case.num_tokens))[0],
    (blocks.block_q, blocks.block_kv))
splash_steps = case.num_heads * case_info.block_mask.shape[1] * case_info.block_mask.shape[2]
print(f"Splash at {case.num_heads} x {case.num_tokens:,}, tiles {blocks.block_q} x {blocks.block_kv}: block_mask "
      f"{case_info.block_mask.shape} ({case_info.block_mask.dtype}) -> {splash_steps:,} grid steps instead of "
      f"{case.num_heads * case_layout.kinds[0].size:,}")

# %% [markdown]
# ## The teaching kernel beside `pallas_block_sparse` and Splash
#
# How fast is the kernel written in view? The three kernels on the same inputs and the same band
# (density 0.25), with the same tiles: `block_sparse_kernel` with its step table,
# `impl="pallas_block_sparse"` and Splash (`impl="splash"`, the band as its `LocalMask`), all with
# the natural exponential. The teaching kernel handles one head: `jax.vmap` runs it for every head by
# adding the head axis to its grid (the step table, shared by every head, is not mapped). It does
# not pad, so the length is the largest multiple of both tiles that the workload's length holds:
# the first tokens of the same random q, k, v, and the band built for that length (the cell prints
# both). At such a length Splash needs no padding either, so it compares no segment ids. Each
# kernel is compiled once and checked, then `bench.time_interleaved` times the three in a shuffled
# order, round after round. On a TPU these are the chip's times at the case-study shape; off a TPU
# all three run in Pallas interpret mode at the small shape, and the times measure the
# interpreter, not a kernel.

# %%
whole_tiles = math.lcm(cfg.block_q, cfg.block_kv)
L_teach = L // whole_tiles * whole_tiles  # the teaching kernel does not pad: whole tiles only
band_teach = masks.band(L_teach, masks.band_width_for_density(L_teach, 0.25))
layout_teach = stlib.block_layout(band_teach, cfg.block_q, cfg.block_kv)
steps_teach = jnp.asarray(build_steps(np.asarray(layout_teach.kinds[0])))  # one table for every head
qh, kh, vh = (x[:, :L_teach] for x in (q, k, v))
teaching = jax.vmap(functools.partial(block_sparse_attention, width=band_teach.width, kv_map=kv_index_map,
                                      block_q=cfg.block_q, block_kv=cfg.block_kv, interpret=cfg.interpret),
                    in_axes=(None, 0, 0, 0))  # the table unmapped, q, k, v mapped over heads
contenders = {
    "teaching block_sparse_kernel (vmap over heads)": lambda q, k, v: teaching(steps_teach, q, k, v),
    "stlib pallas_block_sparse": functools.partial(stlib.attention, mask=band_teach, impl="pallas_block_sparse",
                                                   options={"exp2": False}, **kernel_args),
    "Splash, the band": functools.partial(stlib.attention, mask=band_teach, impl="splash", **kernel_args),
}
print(f"{H} heads x {L_teach:,} tokens (of {L:,}: {L_teach // cfg.block_kv} kv tiles of {cfg.block_kv:,}) x {D}, "
      f"{jnp.dtype(workload.dtype).name}, tiles {cfg.block_q} x {cfg.block_kv}; {band_teach!r}: density "
      f"{layout_teach.density:.3f}, {layout_teach.kind_counts()}; "
      + ("compiled" if cfg.on_tpu else "Pallas interpret mode"))
compiled = {}
for name, fn in contenders.items():
    compiled[name] = bench.compile_function(fn, qh, kh, vh)  # compiled once: checked here, then timed
    passed(name, max_error(compiled[name](qh, kh, vh), qh, kh, vh, band_teach), TOL,
           detail=f"; compiled in {compiled[name].compile_ms / 1e3:.1f} s")
rounds, trials = (2, 3) if cfg.on_tpu else (3, 3)  # a call at the case study takes tens of ms on a TPU
timings = notebook.time_side_by_side(
    cfg, compiled, qh, kh, vh, rounds=rounds, trials=trials, figure="05_teaching_vs_library",
    title=f"Teaching block-sparse kernel vs stlib pallas_block_sparse vs Splash, band density "
          f"{layout_teach.density:.2f}, {H} x {L_teach:,} x {D} {jnp.dtype(workload.dtype).name}",
    notebook="05_block_sparse_the_splash_way", what="teaching block-sparse kernel vs pallas_block_sparse vs splash, band",
    shape=[H, L_teach, D], dtype=jnp.dtype(workload.dtype).name, blocks=[cfg.block_q, cfg.block_kv],
    band_width=band_teach.width, density=layout_teach.density)
del compiled, qh, kh, vh  # free the executables and the cut inputs before the next section

# %% [markdown]
# ## The lesson: a sparse mask that is not faster than dense
#
# Splash, the dense kernel and the block-sparse kernel, without a mask, with the band, and with a
# second mask that shows the real trap: sliding-tile
# attention (each query sees the tokens of nearby 3-D tiles) in raster token order. At the
# case-study shape its density is low, but in raster order its allowed pairs are scattered over
# about three times the tiles that density needs, and every one of them is PARTIAL. First the times measured here, then the hardware-independent work of the same
# kernels at the full case-study shape.

# %%
sta_small = masks.sliding_tile(configs.SMALL_CPU.grid, (1, 8, 16), (3, 1, 1))
sta_case = case_study_masks()["sliding tile 3x8x16, window 3"]
sta = sta_small if cfg.size == "small" else sta_case
runs = [  # (label, impl, mask here, mask at the case-study shape)
    ("Splash, dense", "splash", None, None),
    ("pallas_dense, dense", "pallas_dense", None, None),
    ("pallas_dense, band", "pallas_dense", band, case_band),
    ("pallas_block_sparse, band", "pallas_block_sparse", band, case_band),
    ("Splash, band", "splash", band, case_band),
    ("pallas_dense, sliding tile (raster)", "pallas_dense", sta, sta_case),
    ("pallas_block_sparse, sliding tile (raster)", "pallas_block_sparse", sta, sta_case),
]
environment = bench.environment()
# interpret-mode times on a shared CPU scatter by tens of percent: 3 rounds of 3 calls, the median of the 9 and
# min-max whiskers; a call at the case study takes 0.05 to 0.5 s on a v5e: 2 rounds of 3
rounds, trials = (2, 3) if cfg.on_tpu else (3, 3)
compiled, densities, work_records = {}, {}, []
tracker = bench.Progress(len(runs), "run")  # a progress bar (tqdm) with its estimate of the time left
for label, impl, mask, case_mask in runs:
    options = None if impl == "splash" else {"exp2": False}  # like for like: natural exp everywhere, as in Splash
    compiled[label] = bench.compile_function(functools.partial(stlib.attention, mask=mask, impl=impl, options=options,
                                                               **kernel_args), q, k, v)  # compiled once: checked, then timed
    err = max_error(compiled[label](q, k, v), q, k, v, mask)
    if not err <= TOL:
        raise checks.CheckFailed(f"{label}: max error {err:.2e} > tolerance {TOL:.0e}")
    densities[label] = stlib.block_layout(mask or masks.full(L), cfg.block_q, cfg.block_kv).density
    lay = stlib.block_layout(case_mask or masks.full(case.num_tokens), 512, 1024)
    work = work_summary(impl, lay, case.num_heads, case.head_dim, 2)
    if impl == "splash" and case_mask is not None:
        work["grid_steps"] = splash_steps  # Splash shrinks its grid (above); the generic model does not
    work_records.append({"label": label, **work})
    tracker.step(f"PASSED {label:<44} density {densities[label]:.3f}  max error {err:.1e}"
                 f" | case-study shape: {work['grid_steps']:>7,} steps, executed/useful flops "
                 f"{work['flop_ratio']:.2f}, v6e roofline {work['roofline_v6e_ms']:.1f} ms")
# every kernel timed rounds x trials times, in an order shuffled anew per round
timings = bench.time_interleaved(compiled, q, k, v, rounds=rounds, trials=trials)
calls = min(t.trials for t in timings.values())
for label, t in timings.items():
    print(f"{label:<44} median {t.median_ms:8.2f} ms (min {t.min_ms:.2f}, max {t.max_ms:.2f})"
          + ("" if cfg.on_tpu else "  (interpret mode, NOT a TPU time)"))
records = [{**environment, "interpret": cfg.interpret, "label": label, "density": densities[label],
            **dataclasses.asdict(t)} for label, t in timings.items()]
fig = plotting.latency_bars(records, f"Measured on {cfg.where} at {H} x {L:,} x {D} ({jnp.dtype(workload.dtype).name}), "
                            f"tiles {cfg.block_q} x {cfg.block_kv}: median of {calls} calls, whiskers min-max")
plotting.save(fig, cfg.timed_figure("05_measured_times"))
kept = cfg.record("05_block_sparse_the_splash_way", "splash, pallas_dense, pallas_block_sparse: no mask, band, "
                  "sliding tile (raster)", shape=[H, L, D], dtype=jnp.dtype(workload.dtype).name,
                  blocks=[cfg.block_q, cfg.block_kv], rounds=rounds, trials=trials,
                  cases=[{"label": label, "density": densities[label], **dataclasses.asdict(t)}
                         for label, t in timings.items()])
if kept:
    print(f"recorded in data/notebook_measurements.jsonl ({kept['device_kind']}, revision {kept.get('git_rev')})")
del compiled
fig = plotting.work_bars(work_records, "Hardware-independent work at the case-study shape (10 x 75,600 x 128, "
                         "512 x 1,024 tiles): computed, not measured")
plotting.save(fig, cfg.figure("05_work"))

# %% [markdown]
# Read the two figures side by side; the measured figure's title says where it was measured. On a
# TPU the times are the chip's, at the case-study shape. On a CPU they are interpreter times: the
# operations of each kernel body are dispatched one by one, so the times reflect how a body is
# written as much as how much work it does (Splash's body interprets faster than stlib's, with or
# without a mask: about twice as fast in a quiet run, and stlib's times scatter more from call to
# call, as the whiskers show), and they say nothing about a TPU. Every Pallas kernel here runs
# with `options={"exp2": False}`, the natural exponential Splash uses, so no bar mixes in an exp2
# difference.
#
# On a CPU one pair of bars can look wrong: `pallas_dense` with a mask can come out *faster* than
# without one (in some runs, not in others). It is not a property of the kernel. In interpret mode
# a grid step costs mostly the interpreter's dispatch of the body's few dozen operations on
# 128 x 128 arrays; the mask adds a handful of vectorised operations per step (iotas, compares,
# selects), while the same call run twice on a shared 2-core machine varies by tens of percent (the
# whiskers: min to max of 9 calls). A difference inside the whiskers is noise, and the order of two
# such bars says nothing. On a TPU the masked dense kernel does strictly more work than the unmasked
# one: the same matrix products plus the mask on every score. The work does not depend on the
# machine:
#
# * `pallas_dense` executes the same flops with the band as without it: 4x the useful work at
#   density 0.25, plus a mask evaluated on every tile. A mask inside a dense kernel saves nothing.
# * Skipping EMPTY tiles brings the band to within 5% of the useful flops, but the block-sparse
#   kernel still walks all 109,520 grid steps (Splash shrinks its grid to 31,080).
# * The sliding-tile mask in raster order defeats most of the skipping: every occupied tile is
#   PARTIAL, so the block-sparse kernel still executes about 3x the useful flops *and* masks every
#   tile it computes (dense attention executes 7.60x them). On the small shape every tile is
#   occupied: block-sparse is dense attention plus masking, no faster than the dense kernel.
#   This is the case study's lesson: sparsity pays only once the mask is aligned to the tiles.
#
# ## Takeaway
#
# A block-sparse kernel needs three things: a per-step table in SMEM, `pl.when` to skip the
# compute of empty steps, and index maps that make skipped steps re-use the block already in VMEM.
# Splash has all three, plus a grid shrunk to the widest row. None of it helps a mask whose
# pairs are spread thinly over many tiles: then every tile is PARTIAL and costs a full tile plus
# masking. Notebook 06 reorders the tokens so the tiles become FULL or EMPTY.
#
# ## Questions
#
# 1. How many bytes of SMEM would the step table of the density-0.25 band take at the case-study
#    shape with 128 x 128 tiles? Does it fit the SMEM of a v5e / v6e (the hardware table of
#    notebook 00)? (`stlib.layout.smem_bytes`)
# 2. A skipped step *before* a row's first non-empty tile fetches that first tile rather than,
#    say, tile 0. Why is this free?
# 3. Splash shrank its grid for the band. Would it for a per-head mask with spatial and temporal
#    heads? What would the shrunk width be if it did?
#
# <details><summary>Answers</summary>
#
# 1. 75,600 / 128 rounds up to 591 tiles per side: a [1, 591, 591] int32 table, padded in SMEM to
#    592 x 640 words = 1,515,520 bytes as a 3-D array; the kernel prefetches it flattened, 349,281
#    int32 words = 1,397,248 bytes. It does not fit either way. With 512 x 1,024 tiles the table is
#    [1, 148, 74]: 77,824 bytes as a 3-D array, 44,032 bytes flattened (148 x 74 = 10,952 words,
#    what the kernel really prefetches). Per-head masks multiply it by the number of distinct heads.
# 2. The row's first computed step needs that tile anyway; fetching it at the first skipped step
#    starts the copy earlier, and the following skipped steps keep the same block index, so the
#    pipeline issues no further copy until the tile changes.
# 3. No: `process_mask` shrinks only when every head shares one mask (one unique mask per head
#    shard). Shrinking all heads to one width would have to use the widest row over every head.
#
# </details>
