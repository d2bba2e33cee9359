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
# # 10 · Training: the backward pass over the same tiles, and the dk / dv kernel written in view
#
# Sliding Tile Attention and Video Sparse Attention are fine-tuned into video models with their sparse
# masks, so a sparse kernel that cannot train is half a kernel. This notebook derives the backward
# of attention and shows the tables it walks: the forward's per-q-tile lists for dq, and their
# transpose (which q tiles touch each kv tile) for dk and dv. Then it writes the dk / dv kernel in
# view and checks it against `jax.grad` of the reference and against stlib's own backward, counts
# what the backward executes next to the forward, and writes the kernel again with the forward's
# step codes. Both kernels in view then run at the configuration's size (on a TPU the case study,
# compiled), checked and timed beside the library's training step and Splash's. Last come the
# backward's static estimates.
#
# Terms: the **forward** computes o = softmax(q k^T * scale) v under the mask. A **cotangent** dO is
# the gradient of the loss with respect to o, and the **backward** turns it into dq, dk, dv. The
# **log-sum-exp** (lse) of a query row is log of the sum of exp(scores) over its allowed keys. The
# forward already has it, and it lets the backward rebuild P without a second softmax pass.

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
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import stlib
from stlib import checks, exercises, masks, notebook, plotting
from stlib.bench import backward_compile
from stlib.kernels.backward import DKV_MATMULS, DQ_MATMULS, FORWARD_MATMULS, backward_work
from stlib.layout import row_tables
from stlib.masks.catalogue import case_study_masks
from stlib.passes import exact_passes

cfg = notebook.setup(SIZE, solutions=SOLUTIONS)
tolerance = notebook.tolerance
L, D = 1_000, 64  # one head, float32, on every backend: the sections in view are small; ragged against 128-token tiles
BQ = BKV = 128
WIDTH = 150
band = masks.band(L, WIDTH)
q, k, v = (x[0] for x in stlib.random_qkv((1, L, D), jnp.float32, seed=0))
do = jax.random.normal(jax.random.key(1), (L, D))
scale = D**-0.5
print(f"one head, L = {L:,}, D = {D}, band |q - k| <= {WIDTH}, tiles {BQ} x {BKV}")

# %% [markdown]
# ## The backward, derived
#
# Write S = scale * q k^T (masked entries -inf), P = softmax(S) row by row, o = P v. For a loss with
# dO = d loss / d o:
#
# * dV = P^T dO (o is linear in v);
# * dP = dO v^T;
# * the softmax's Jacobian, row by row: dS = P * (dP - di), with di = rowsum(dP * P) = rowsum(dO * o),
#   a number per query that the backward computes once from the output it already has;
# * dq = scale * dS k and dk = scale * dS^T q.
#
# P is never stored. The forward keeps lse per query, and P = exp(S - lse) rebuilds it tile by tile.
# A masked pair has P = 0 and contributes nothing. A row that sees no key has lse = -inf; the kernels
# turn it into +inf so that P = exp(S - inf) = 0 there. The cell below checks dk and dv by these
# lines against `jax.grad` of the reference; dq, tile by tile, is the second exercise below.
#
# Every check here compares a gradient with that of the float32 reference, whose matmuls run at
# `Precision.HIGHEST`, relative to the reference's largest entry, within the tolerance of
# `stlib.checks` for the inputs' dtype on this backend: 2e-5 in float32 on a CPU, 3e-2 for bfloat16
# or for anything on a TPU, whose MXU takes a float32 matmul at the default precision in bfloat16
# passes (the formula below runs `q @ k.T` at that precision).

# %%
dense_mask = band.to_dense()


def dk_dv_by_the_formula(q, k, v, do):
    s = jnp.where(dense_mask, (q @ k.T) * scale, -jnp.inf)
    lse = jax.nn.logsumexp(s, axis=-1, keepdims=True)
    p = jnp.exp(s - lse)
    o = p @ v
    di = jnp.sum(do * o, axis=-1, keepdims=True)
    ds = p * (do @ v.T - di)
    return scale * ds.T @ q, p.T @ do


def reference_loss(q, k, v):
    return jnp.sum(stlib.attention(q[None], k[None], v[None], band, impl="reference")[0] * do)


want = jax.grad(reference_loss, argnums=(0, 1, 2))(q, k, v)
got = dk_dv_by_the_formula(q, k, v, do)
for name, mine, ref in zip(("dk", "dv"), got, want[1:]):
    notebook.passed(f"{name} by the formula == jax.grad of the reference", checks.scaled_error(mine, ref),
                    tolerance(jnp.float32), detail="; relative to its largest entry")

# %% [markdown]
# ## Two walks over the same tiles
#
# dq of a q tile sums over its kv tiles, the forward's own walk. dk and dv of a kv tile sum over the
# q tiles that see it, which is the transposed walk. Splitting the backward into a dq kernel and a
# dk / dv kernel gives each an output tile it owns for its whole row. No partial sums go to HBM, and
# the result is deterministic. The price is recomputing S and dP in both kernels: 7 matmuls against
# the forward's 2 (tokamax's fused kernel does it in 5, by accumulating dq across kv tiles instead).
# For a band both walks look alike. For a mask whose keys are not seen alike they differ: below,
# the band plus an attention sink (the first keys, seen by every query), whose first kv tile
# is touched by every q tile. The transposed table then has its own widest row, and the dk / dv
# grid its own extent.

# %%
layout = stlib.block_layout(band, BQ, BKV)
selected = layout.kinds != stlib.TileKind.EMPTY
rows, cols = np.arange(L)[:, None], np.arange(L)[None, :]
sink = masks.from_array((np.abs(rows - cols) <= WIDTH) | (cols < BKV))  # the band, and the first keys seen by all
sink_layout = stlib.block_layout(sink, BQ, BKV)
fig = plotting.forward_and_transposed_tables(
    sink_layout.kinds != stlib.TileKind.EMPTY,
    f"band |q - k| <= {WIDTH} plus the first {BKV} keys seen by every query, L = {L:,}, {BQ} x {BKV} tiles")
plotting.save(fig, cfg.figure("10_transposed_table"))
print(f"band alone: widest forward row {int(selected.sum(axis=2).max())}, widest transposed row "
      f"{int(selected.sum(axis=1).max())} (a symmetric mask: both walks alike)")

# %% [markdown]
# ### Exercise 1: the transposed table
#
# `row_tables(selected)` gives the forward's tables: for each q tile, its kv tiles (`tiles`,
# [1, nq, W]) and how many (`counts`). Write `transposed_table(selected, row_tables)`, which returns
# the dk / dv kernel's tables `(tiles_t, counts_t)`: for each kv tile, the q tiles that see it, in
# increasing order.
#
# Run the notebook with `SOLUTIONS = "hide"` (first cell) to write it yourself: the stub raises, and
# the check prints NOT YET and what is wrong. `exercises.show("10.transposed_table")` prints a solution.
#
# *Hint 1:* the dk / dv kernel's row r is the forward's column r: which q tiles select kv tile r.
# *Hint 2:* `row_tables` compacts the rows of whatever table it is given; give it `selected` with its
# last two axes swapped (contiguous).

# %%
@exercises.fill_in("10.transposed_table")
def transposed_table(selected, row_tables):
    # --- your code here: return (tiles_t, counts_t), one row per kv tile ---
    raise NotImplementedError


def check_transposed(transposed_table):
    """Every kv tile lists exactly the q tiles of the forward's tables that list it, in order: on the
    band with its sink, whose transposed table differs from the forward's (the band alone would
    pass the forward's own table)."""
    sink_selected = sink_layout.kinds != stlib.TileKind.EMPTY
    tiles_t, counts_t = transposed_table(sink_selected, row_tables)
    tiles, counts = row_tables(sink_selected)
    want = {(int(ki), qi) for qi in range(tiles.shape[1]) for ki in tiles[0, qi, : counts[0, qi]]}
    got = {(ki, int(qi)) for ki in range(tiles_t.shape[1]) for qi in tiles_t[0, ki, : counts_t[0, ki]]}
    if got != want:
        raise exercises.NotYet(f"{len(want - got)} (kv tile, q tile) pairs missing, {len(got - want)} extra")
    if any(np.any(np.diff(tiles_t[0, ki, : counts_t[0, ki]]) <= 0) for ki in range(tiles_t.shape[1])):
        raise exercises.NotYet("every pair is there, but some kv tile lists its q tiles out of order")
    return f"the transposed table lists each of the {len(want)} (kv tile, q tile) pairs once, in order"


exercises.verify("10.transposed_table", check_transposed, transposed_table)

# %% [markdown]
# ### Exercise 2: the dq kernel's step
#
# The dq kernel walks the forward's table: q tile i visits its kv tiles and adds each one's share of
# dq into an f32 accumulator, written once at the row's end. Write its body for one step,
# `dq_step(q_t, k_t, v_t, do_t, lse, di, allowed, scale)`: this kv tile's addition to dq, [bq, D],
# from the q, dO, lse and di of the q tile (lse and di as [bq, 1] columns here), the k and v of the
# kv tile, and the tile's mask. The check adds your steps over every tile pair and compares with
# dq of `jax.grad`.
#
# *Hint 1:* P comes back from lse alone, with no running max or sum: p = exp(s - lse) where allowed.
# *Hint 2:* dS = P * (dP - di) with dP = dO v^T; s was q k^T times the scale, so dq = dS k picks
# the scale up too. `exercises.show("10.dq_step")` prints a solution.

# %%
@exercises.fill_in("10.dq_step")
def dq_step(q_t, k_t, v_t, do_t, lse, di, allowed, scale):
    # --- your code here: return this kv tile's addition to dq [bq, D] ---
    raise NotImplementedError


def check_dq(dq_step):
    """dq = the sum of ``dq_step`` over every (q tile, kv tile) pair the mask touches."""
    scores = jnp.where(dense_mask, (q @ k.T) * scale, -jnp.inf)
    lse_col = jax.nn.logsumexp(scores, axis=-1, keepdims=True)
    di_col = jnp.sum(do * (jnp.exp(scores - lse_col) @ v), axis=-1, keepdims=True)
    dq = jnp.zeros_like(q)
    for i in range(0, L, BQ):
        for j in range(0, L, BKV):
            allowed = jnp.asarray(dense_mask[i:i + BQ, j:j + BKV])
            if bool(allowed.any()):
                rows, cols = slice(i, i + BQ), slice(j, j + BKV)
                dq = dq.at[rows].add(dq_step(q[rows], k[cols], v[cols], do[rows], lse_col[rows], di_col[rows],
                                             allowed, scale))
    err, tol = checks.scaled_error(dq, want[0]), tolerance(jnp.float32)
    if not err <= tol:
        raise exercises.NotYet(f"max error {err:.1e} of the largest entry (tolerance {tol:.0e}): is dS = P * (dP - di), "
                               "times scale?")
    return f"the sum of your steps == dq of jax.grad (max error {err:.1e} of the largest entry <= {tol:.0e})"


exercises.verify("10.dq_step", check_dq, dq_step)

# %% [markdown]
# ## The dk / dv kernel, written in view
#
# Grid (kv tile, step): each kv tile walks its q tiles from the transposed table, prefetched into
# SMEM. It keeps dk and dv of its keys in f32 VMEM scratch and writes them once, at its last step.
# The scores are computed transposed, S^T = k q^T [block_kv, block_q], with keys on sublanes and
# queries on lanes. Then lse and di, stored lane-dense as one [1, L] row each, broadcast over the
# keys for free: no [L, 1] column, which a TPU would pad 128-fold (a `T(8,128)` layout). The band's
# predicate is two iotas and a compare.

# %%
def dkv_kernel(tiles_ref, counts_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, di_ref, dk_ref, dv_ref, dk_acc, dv_acc,
               *, extent, width, length, scale):
    r, j = pl.program_id(0), pl.program_id(1)  # kv tile r, its j-th q tile
    qi = tiles_ref[r * extent + j]
    bq, bkv = q_ref.shape[0], k_ref.shape[0]

    @pl.when(j == 0)
    def _():
        dk_acc[...] = jnp.zeros(dk_acc.shape, jnp.float32)
        dv_acc[...] = jnp.zeros(dv_acc.shape, jnp.float32)

    @pl.when(j < counts_ref[r])
    def _():
        q_t, k_t, v_t, do_t = q_ref[...], k_ref[...], v_ref[...], do_ref[...]
        s_t = jax.lax.dot_general(k_t, q_t, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32) * scale
        keys = r * bkv + jax.lax.broadcasted_iota(jnp.int32, s_t.shape, 0)
        queries = qi * bq + jax.lax.broadcasted_iota(jnp.int32, s_t.shape, 1)
        allowed = (jnp.abs(queries - keys) <= width) & (keys < length) & (queries < length)
        p_t = jnp.where(allowed, jnp.exp(s_t - lse_ref[...]), 0.0)  # [bkv, bq] f32
        dv_acc[...] += jax.lax.dot(p_t.astype(do_t.dtype), do_t, preferred_element_type=jnp.float32)
        dp_t = jax.lax.dot_general(v_t, do_t, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
        ds_t = jnp.where(allowed, p_t * (dp_t - di_ref[...]), 0.0)
        dk_acc[...] += jax.lax.dot(ds_t.astype(q_t.dtype), q_t, preferred_element_type=jnp.float32) * scale

    @pl.when(j == extent - 1)
    def _():
        dk_ref[...] = dk_acc[...]
        dv_ref[...] = dv_acc[...]


def dk_dv(q, k, v, do, lse, di, *, layout, width, interpret=cfg.interpret):
    """dk, dv [L, D] f32 of one head under the band |q - k| <= width, whose tiles ``layout`` gives;
    lse, di [L] from the forward and dO."""
    (length, head_dim), (bq, bkv) = q.shape, (layout.block_q, layout.block_kv)
    selected = layout.kinds != stlib.TileKind.EMPTY
    tiles_t, counts_t = row_tables(np.ascontiguousarray(selected.transpose(0, 2, 1)))
    extent = tiles_t.shape[2]
    nk = tiles_t.shape[1]
    pad = lambda x, n: jnp.pad(x, ((0, n - x.shape[0]),) + ((0, 0),) * (x.ndim - 1))
    lq, lk = layout.grid_shape[0] * bq, nk * bkv
    qp, dop, kp, vp = pad(q, lq), pad(do, lq), pad(k, lk), pad(v, lk)
    lse_row = jnp.pad(lse, (0, lq - length), constant_values=jnp.inf)[None]  # [1, Lq]: padding rows see nothing
    di_row = jnp.pad(di, (0, lq - length))[None]
    q_spec = pl.BlockSpec((bq, head_dim), lambda r, j, tiles, counts: (tiles[r * extent + j], 0))
    kv_spec = pl.BlockSpec((bkv, head_dim), lambda r, j, tiles, counts: (r, 0))
    row_spec = pl.BlockSpec((1, bq), lambda r, j, tiles, counts: (0, tiles[r * extent + j]))
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=2,
        grid=(nk, extent),
        in_specs=[q_spec, kv_spec, kv_spec, q_spec, row_spec, row_spec],
        out_specs=[kv_spec, kv_spec],
        scratch_shapes=[pltpu.VMEM((bkv, head_dim), jnp.float32)] * 2,
    )
    dk, dv = pl.pallas_call(
        lambda *refs: dkv_kernel(*refs, extent=extent, width=width, length=length, scale=head_dim**-0.5),
        grid_spec=grid_spec,
        name="dkv_in_view",
        out_shape=[jax.ShapeDtypeStruct((lk, head_dim), jnp.float32)] * 2,
        compiler_params=None if interpret else pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
        interpret=interpret,
    )(jnp.asarray(tiles_t.reshape(-1)), jnp.asarray(counts_t.reshape(-1)), qp, kp, vp, dop, lse_row, di_row)
    return dk[:length], dv[:length]


# the residuals the forward keeps: the output and one lse per query (from stlib's tile kernel)
o, lse = stlib.kernels.tile.tile_attention(q[None], k[None], v[None], layout, scale=scale, interpret=cfg.interpret,
                                           return_lse=True)
di = jnp.sum(do * o[0], axis=-1)
dk_mine, dv_mine = dk_dv(q, k, v, do, lse[0], di, layout=layout, width=WIDTH)
library = jax.grad(lambda q, k, v: jnp.sum(stlib.attention(q[None], k[None], v[None], band, impl="pallas_tile",
                                                           block_q=BQ, block_kv=BKV)[0] * do), argnums=(1, 2))(q, k, v)
for name, mine, ref, lib in (("dk", dk_mine, want[1], library[0]), ("dv", dv_mine, want[2], library[1])):
    for other, theirs in (("jax.grad of the reference", ref), ("stlib's backward", lib)):
        notebook.passed(f"{name}: the kernel in view == {other}", checks.scaled_error(mine, theirs), tolerance(jnp.float32),
                        detail="; relative to the largest entry")

# %% [markdown]
# Compiled for v6e at a moderate shape (one head, 8,192 tokens, band 0.25, bf16, 512 x 512 tiles;
# the probabilities and dS go to the MXU in the inputs' dtype, as in the library), next to the
# library's whole gradient at the same shape (`jax.grad` through `pallas_tile`: its forward and its
# fused dk / dv / dq kernel, at the backward's own blocks). Then the kernel's schedule, read the way
# the static estimate reads the library's kernels (`stlib.analysis.inview.kernel_schedules`, as in
# notebook 07): the bundles of the grid step and of the compute region, a [512, 512] tile's four
# matmuls.

# %%
import functools
import time

from stlib.analysis.inview import kernel_schedules, per_step
from stlib.device import compile_for_tpu

ML, MB = 8192, 512
m_band = masks.band(ML, masks.band_width_for_density(ML, 0.25))
m_layout = stlib.block_layout(m_band, MB, MB)
one, row = jax.ShapeDtypeStruct((ML, 128), jnp.bfloat16), jax.ShapeDtypeStruct((ML,), jnp.float32)
teaching = functools.partial(dk_dv, layout=m_layout, width=m_band.width, interpret=False)


def library_grad(q, k, v, do):
    out = stlib.attention(q[None], k[None], v[None], m_band, impl="pallas_tile", block_q=MB, block_kv=MB,
                          interpret=False)[0]
    return jnp.sum(out.astype(jnp.float32) * do.astype(jnp.float32))


for name, fn, shapes in [("teaching dk / dv kernel", teaching, [one] * 4 + [row] * 2),
                         ("stlib jax.grad (fwd + bwd)", jax.grad(library_grad, argnums=(0, 1, 2)), [one] * 4)]:
    start = time.perf_counter()
    hbm = compile_for_tpu(fn, *shapes, chip="v6e").memory()
    print(f"v6e {name:<27} compiled in {time.perf_counter() - start:.1f} s: HBM arguments "
          f"{hbm['argument_size_in_bytes']:,} B, output {hbm['output_size_in_bytes']:,} B, temporaries "
          f"{hbm['temp_size_in_bytes']:,} B")


def schedule_of(fn, *shapes, **where):
    """The one kernel ``kernel_schedules`` reads from ``fn``'s program, or None, said in one line, where
    its compile subprocess fails (the estimates' committed records stand then)."""
    try:
        (found,) = kernel_schedules(fn, *shapes, **where)
        return found
    except RuntimeError as error:
        print(f"no schedule read here for {where['kernel_prefix']}: {str(error).strip().splitlines()[0][:200]}")
        return None


schedule = schedule_of(teaching, *[one] * 4, *[row] * 2, chip="v6e", kernel_prefix="dkv_in_view",
                       compute_names=["compute"])
m_selected = m_layout.kinds != stlib.TileKind.EMPTY
tiles, grid_steps = int(m_selected.sum()), m_selected.shape[2] * int(m_selected.sum(axis=1).max())  # kv tiles x extent
if schedule is not None:
    bundles = per_step(schedule)
    print(f"dk / dv kernel in view, v6e: grid step {bundles['step']:,} bundles, compute region {bundles['compute']:,} "
          f"({bundles['compute'] / (MB * MB / 1000):.2f} per 1,000 score pairs); {grid_steps} grid steps, {tiles} of "
          f"them computed: about {grid_steps * bundles['step'] + tiles * bundles['compute']:,} bundles in all "
          "(a static schedule, not a measurement)")

# %% [markdown]
# Read the schedule against the forward's (notebook 07 prints its FULL region per 1,000 score
# pairs). Each step of this kernel does four matmuls where the forward does two, evaluates the band
# from iota on every tile (FULL tiles included), and rebuilds P from lse; the library's fused kernel
# does dq's matmul in the same step, runs FULL tiles mask-free and, where the layout allows, the
# forward's pattern steps at blocks of its own (the sections below). Its estimate at the
# case-study shape: `python -m stlib.bench.backward_estimate table`.


# %% [markdown]
# stlib's version (`stlib/kernels/backward.py`) is this kernel and its dq twin with what a library
# needs besides: heads and per-head tables, the forward's passes (mask-free FULL tiles, the ragged
# last kv tile, PARTIAL tiles with the mask's predicate or its int8 tile table read transposed),
# base-2 exponentials when the forward used them, and grids that visit only the rows a pass has
# tiles in, adding into accumulators the passes share. Every stlib Pallas kernel trains through it
# (`jax.grad`, `jax.jit(jax.grad(...))`, `video_attention` and routed plans), and Splash through its
# own backward.
#
# ## One kernel instead of two: the fused backward
#
# The dk / dv kernel above already holds dS^T for its tile; dQ = dS K is one more matmul on it. The
# split pair recomputes S and dP in the dq kernel (7 matmuls per tile); a fused kernel does 5. Its
# problem is where dq adds up: the grid walks kv rows, so each q tile's dq receives a contribution
# from every kv row that sees it. stlib's fused kernel (`method="fused"`, the default where it fits)
# keeps a whole window of one head's dq rows, f32, in VMEM: read from HBM when the head's first kv
# row starts, written back after its last (rows of one head are consecutive in the grid). At the
# case-study shape one window holds all 75,776 padded rows of a head (38.8 MB) on v6e; a chip with
# less VMEM (TPU7x) splits it into several windows (two for the sliding tile, three for the full
# mask at its tuned blocks: the kernel names ending in `_w0`, `_w1`, ... in the table below). The split kernels stay, as the oracle the tests compare with.

# %% [markdown]
# ## What the backward executes, at the case-study shape
#
# Counted from the layouts (`stlib.kernels.backward.backward_work`), not timed: 10 heads x 75,600 x
# 128 with 512 x 1,024 tiles, split and fused (one dq window).

# %%
from stlib.kernels.backward import FUSED_MATMULS, kernel_calls

rows, windows = [], {}
for name in ("full", "band (density 0.25)", "sliding tile, 3-D tiled order"):
    lay = stlib.block_layout(case_study_masks()[name], 512, 1024)
    passes = exact_passes(lay)
    fused = kernel_calls(passes, "fused", num_q_tiles=lay.grid_shape[0], block_q=512, block_kv=1024,
                         head_dim=128, itemsize=2, chip="v6e")
    windows[name] = fused[0].window  # the fused call's q tiles: here every q tile of a head, one window
    for method, calls in (("split", None), ("fused", fused)):
        work = backward_work(lay, passes, 10, 128, calls)
        steps = work["fused_steps"] if method == "fused" else work["dq_steps"] + work["dkv_steps"]
        rows.append((name, method, work["computed_tiles"], steps, work["forward_flops"] / 1e12,
                     work["backward_flops"] / 1e12, work["backward_flops"] / work["forward_flops"]))
print(f"matmuls per computed tile: forward {FORWARD_MATMULS}, dq kernel {DQ_MATMULS}, dk / dv kernel "
      f"{DKV_MATMULS}, fused {FUSED_MATMULS}")
for name, (first, last) in windows.items():
    print(f"one dq window on v6e, {name}: q tiles {first}-{last - 1}, {(last - first) * 512:,} padded rows x 128 "
          f"x 4 B = {(last - first) * 512 * 128 * 4 / 1e6:.1f} MB of f32 dq in VMEM")
for name, method, tiles, steps, fwd, bwd, ratio in rows:
    print(f"{name:32s} {method:5s} tiles {tiles:>7,}  grid steps {steps:>7,}  forward {fwd:5.1f} TFLOP  "
          f"backward {bwd:6.1f} TFLOP  ratio {ratio:.2f}")

# %% [markdown]
# ### Rows of 3-D tiles: the forward's pattern steps, backward
#
# In its 3-D tiled order the sliding tile's 384-token tiles are each FULL or EMPTY, and the
# forward runs blocks of whole rows of tiles as pattern steps: per step, each kv sub-tile against
# the runs of q sub-tiles it meets, mask-free. The fused backward computes S^T = k q^T (keys on
# sublanes, queries on lanes), the orientation those updates are written in, so it runs the same
# patterns on its transposed grid (`stlib.kernels.backward_steps`): `step_layout` takes one row
# of tiles along x a block, `coded_passes` puts every FULL and pattern step in one step-coded
# pass. Below, the patterns (`#`: a 384 x 384 sub-tile computed, `.` skipped; rows are kv
# sub-tiles, columns q sub-tiles) and the work beside one tile a block.

# %%
from stlib.kernels.backward import one_tile_layout
from stlib.kernels.backward_steps import coded_passes, step_layout
from stlib.kernels.steps import FIRST_PATTERN

tiled = stlib.block_layout(case_study_masks()["sliding tile, 3-D tiled order"], 3840, 1920)  # the forward's v6e blocks
steps_layout, plan = step_layout(tiled, tiled.mask.length)
for code, pattern in enumerate(plan.patterns):
    print(f"pattern {code} (padding slots masked by key: {pattern.padded}), "
          f"{int((plan.codes == FIRST_PATTERN + code).sum()):,} steps a head:")
    print("\n".join("    " + "".join("#" if x else "." for x in row) for row in pattern.rows))
one = one_tile_layout(tiled)
for label, lay, passes in (("one tile a block", one, exact_passes(one)),
                           ("pattern steps", steps_layout, coded_passes(plan, exact_passes(steps_layout)))):
    calls = kernel_calls(passes, "auto", num_q_tiles=lay.grid_shape[0], block_q=lay.block_q,
                         block_kv=lay.block_kv, head_dim=128, itemsize=2, chip="v6e")
    work = backward_work(lay, passes, 10, 128, calls)
    print(f"{label:16s} blocks {lay.block_q:>5,} x {lay.block_kv:<5,} grid steps {work['fused_steps']:>9,}  "
          f"backward {work['backward_flops'] / 1e12:5.1f} TFLOP  kernels {[c.name for c in calls]}")

# %% [markdown]
# ### Band and dense: the same step codes at the backward's own blocks
#
# A layout without 3-D tiles gets the same treatment at blocks of its own
# (`backward_steps.block_steps`): the forward's step codes (`plan_steps`) at the backward's blocks,
# one step-coded pass of FULL, RAGGED, MASKED (a traceable mask, evaluated from indices) and the
# band's edge patterns. Each update is [keys, block_q] scores, so the blocks are no longer bound by
# whole [block_kv, block_q] intermediates beside the dq window (the fallback, `BACKWARD_TILE`, stops
# at 1,024 x 1,024). The blocks and keys per update are swept per chip (`python -m
# stlib.bench.backward_sweep`, static estimates) and read from the package's tuned data
# (`backward_step_blocks`). Below, the v6e case: the forward's blocks, the backward's, its codes,
# and the grid steps beside one 1,024 x 1,024 tile a step; then the sweep's records.

# %%
from stlib.bench import backward_sweep
from stlib.kernels.backward import BACKWARD_TILE
from stlib.kernels.backward_steps import block_steps
from stlib.kernels.steps import region_name
from stlib.kernels.tile_lane_dense import DEFAULT_BLOCKS, LaneDenseOptions, backward_step_blocks

fwd_blocks = DEFAULT_BLOCKS["v6e"]
for name in ("full", "band (density 0.25)"):
    forward = stlib.block_layout(case_study_masks()[name], fwd_blocks.block_q, fwd_blocks.block_kv)
    bq, bkv, keys = backward_step_blocks(forward, LaneDenseOptions(), "v6e", False)
    lay, plan = block_steps(forward, forward.mask.length, bq, bkv)
    passes = coded_passes(plan, exact_passes(lay), keys)
    calls = kernel_calls(passes, "auto", num_q_tiles=lay.grid_shape[0], block_q=bq, block_kv=bkv,
                         head_dim=128, itemsize=2, chip="v6e")
    steps_work = backward_work(lay, passes, 10, 128, calls)
    tile = stlib.block_layout(forward.mask, *BACKWARD_TILE)
    tile_passes = exact_passes(tile)
    tile_calls = kernel_calls(tile_passes, "auto", num_q_tiles=tile.grid_shape[0], block_q=BACKWARD_TILE[0],
                              block_kv=BACKWARD_TILE[1], head_dim=128, itemsize=2, chip="v6e")
    tile_work = backward_work(tile, tile_passes, 10, 128, tile_calls)
    codes = {region_name(int(c)).removeprefix("compute_"): int((plan.codes == c).sum()) for c in plan.present}
    print(f"{name}: forward {forward.block_q:,} x {forward.block_kv:,}; backward {bq:,} x {bkv:,}, "
          f"{keys:,} keys an update; steps a head by code {codes}")
    print(f"    grid steps {steps_work['fused_steps']:,} (one {BACKWARD_TILE[0]:,}-tile a step: "
          f"{tile_work['fused_steps']:,}); kernels {[c.name for c in calls]}")

print()
print(backward_sweep.format_table(backward_sweep.read(cfg.data / "backward_block_sweep.jsonl")))

# %% [markdown]
# ### The step-coded dk / dv kernel, written in view
#
# The library's fused kernel runs every step code in one pass. Here is its dk / dv half in view:
# the dk / dv kernel above, with a code beside each q tile in the transposed table and one
# `pl.when` region per code. A region's updates are Python constants from the plan
# (`StepCodes.updates`: first key, keys, first query lane, lanes, masked), so the compiler sees
# fixed slices and no mask where a sub-tile needs none:
#
# - a FULL step runs its whole tile in 128-key pieces, mask-free;
# - a pattern runs only the sub-tiles its pattern computes, each mask-free unless the band cuts it;
# - a MASKED step evaluates the band on every piece.
#
# The band below (4,096 tokens at 512 x 512 blocks, keys in updates of 128) has FULL tiles and its
# edges as patterns; with patterns off (`plan_steps(..., grain=0)`) every PARTIAL tile is one
# MASKED step. Both are checked against `jax.grad` of the reference, with lse and di from the
# reference's forward.

# %%
from stlib.kernels.backward_steps import StepCodes
from stlib.kernels.steps import plan_steps
from stlib.reference import reference_attention_lse


def dkv_steps_kernel(tiles_ref, codes_ref, counts_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, di_ref,
                     dk_ref, dv_ref, dk_acc, dv_acc, *, extent, updates, width, scale):
    r, j = pl.program_id(0), pl.program_id(1)  # kv tile r, its j-th step
    qi, code = tiles_ref[r * extent + j], codes_ref[r * extent + j]
    bq, bkv = q_ref.shape[0], k_ref.shape[0]

    @pl.when(j == 0)
    def _():
        dk_acc[...] = jnp.zeros(dk_acc.shape, jnp.float32)
        dv_acc[...] = jnp.zeros(dv_acc.shape, jnp.float32)

    for c, pieces in updates.items():  # one region per code present (a padding step's code is -1)
        @pl.when((j < counts_ref[r]) & (code == c))
        def _(pieces=pieces):
            for k0, keys, q0, lanes, masked in pieces:  # kv rows [k0, k0 + keys) x q lanes [q0, q0 + lanes)
                k_t, v_t = k_ref[pl.ds(k0, keys), :], v_ref[pl.ds(k0, keys), :]
                q_t, do_t = q_ref[pl.ds(q0, lanes), :], do_ref[pl.ds(q0, lanes), :]
                s_t = jax.lax.dot_general(k_t, q_t, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
                p_t = jnp.exp(s_t * scale - lse_ref[:, pl.ds(q0, lanes)])  # [keys, lanes] f32
                if masked:  # only the pieces the band cuts evaluate it
                    key_ids = r * bkv + k0 + jax.lax.broadcasted_iota(jnp.int32, s_t.shape, 0)
                    query_ids = qi * bq + q0 + jax.lax.broadcasted_iota(jnp.int32, s_t.shape, 1)
                    p_t = jnp.where(jnp.abs(query_ids - key_ids) <= width, p_t, 0.0)
                dv_acc[pl.ds(k0, keys), :] += jax.lax.dot(p_t.astype(do_t.dtype), do_t,
                                                          preferred_element_type=jnp.float32)
                dp_t = jax.lax.dot_general(v_t, do_t, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
                ds_t = p_t * (dp_t - di_ref[:, pl.ds(q0, lanes)])
                dk_acc[pl.ds(k0, keys), :] += jax.lax.dot(ds_t.astype(q_t.dtype), q_t,
                                                          preferred_element_type=jnp.float32) * scale

    @pl.when(j == extent - 1)
    def _():
        dk_ref[...] = dk_acc[...]
        dv_ref[...] = dv_acc[...]


def transposed_steps(codes):
    """The kv-major step table of one head's codes [nq, nk] (-1: not computed): per kv tile its q
    tiles in q order (``row_tables`` of the transposed grid: padding steps repeat the last q tile,
    so they fetch nothing new), their codes (-1 past the count), the counts and the widest kv tile."""
    tiles, counts = row_tables(np.ascontiguousarray((codes >= 0).T[None]))
    tiles, counts = tiles[0], counts[0]
    step_codes = np.where(np.arange(tiles.shape[1]) < counts[:, None],
                          np.take_along_axis(codes.T, tiles, axis=1), -1).astype(np.int32)
    return tiles, step_codes, counts, tiles.shape[1]


def dk_dv_steps(q, k, v, do, lse, di, *, plan, grain, width, interpret=cfg.interpret):
    """dk, dv [L, D] f32 of one head under the band |q - k| <= width, run as the step codes of
    ``plan`` (L a multiple of its blocks) in updates of ``grain`` keys; lse, di [L]."""
    (length, head_dim), lay = q.shape, plan.layout
    bq, bkv = lay.block_q, lay.block_kv
    assert length % bq == 0 and length % bkv == 0, "no RAGGED code here: L a multiple of the blocks"
    step_codes = StepCodes(plan.codes, plan.patterns, None, lay.mask, grain, length)
    updates = {int(c): step_codes.updates(int(c), bq, bkv) for c in plan.present}
    tiles, codes, counts, extent = transposed_steps(plan.codes[0])
    # the index maps get the three prefetched tables after the grid indices (only the q tiles are read)
    q_spec = pl.BlockSpec((bq, head_dim), lambda r, j, tiles_, *_: (tiles_[r * extent + j], 0))
    kv_spec = pl.BlockSpec((bkv, head_dim), lambda r, j, *_: (r, 0))
    row_spec = pl.BlockSpec((1, bq), lambda r, j, tiles_, *_: (0, tiles_[r * extent + j]))
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=3,
        grid=(lay.grid_shape[1], extent),
        in_specs=[q_spec, kv_spec, kv_spec, q_spec, row_spec, row_spec],
        out_specs=[kv_spec, kv_spec],
        scratch_shapes=[pltpu.VMEM((bkv, head_dim), jnp.float32)] * 2,
    )
    kernel = functools.partial(dkv_steps_kernel, extent=extent, updates=updates, width=width, scale=head_dim**-0.5)
    return pl.pallas_call(
        kernel,
        grid_spec=grid_spec,
        name="dkv_steps_in_view",
        out_shape=[jax.ShapeDtypeStruct((length, head_dim), jnp.float32)] * 2,
        compiler_params=None if interpret else pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
        interpret=interpret,
    )(*(jnp.asarray(a.reshape(-1)) for a in (tiles, codes, counts)), q, k, v, do, lse[None], di[None])


SL, SB, GRAIN = 4096, 512, 128
s_band = masks.band(SL, masks.band_width_for_density(SL, 0.25))
s_layout, s_plan = block_steps(stlib.block_layout(s_band, SB, SB), SL, SB, SB)
sq, sk, sv = (x[0] for x in stlib.random_qkv((1, SL, 128), jnp.float32, seed=2))
sdo = jax.random.normal(jax.random.key(3), (SL, 128))
s_out, s_lse = reference_attention_lse(sq[None], sk[None], sv[None], jnp.asarray(s_band.to_dense()), 128**-0.5)
s_di = jnp.sum(sdo * s_out[0], axis=-1)
s_want = jax.grad(lambda k, v: jnp.sum(stlib.attention(sq[None], k[None], v[None], s_band, impl="reference")[0] * sdo),
                  argnums=(0, 1))(sk, sv)
for label, plan_ in (("patterns", s_plan), ("patterns off", plan_steps(s_layout, SL, 0))):
    got = dk_dv_steps(sq, sk, sv, sdo, s_lse[0, :, 0], s_di, plan=plan_, grain=GRAIN, width=s_band.width)
    steps_by_code = {region_name(int(c)).removeprefix("compute_"): int((plan_.codes == c).sum()) for c in plan_.present}
    notebook.passed(f"step-coded dk, dv ({label}; steps by code {steps_by_code}) == jax.grad of the reference",
                    max(checks.scaled_error(g, w) for g, w in zip(got, s_want)), tolerance(jnp.float32),
                    detail="; relative to the largest entry")

# %% [markdown]
# Compiled for v6e at 8,192 tokens in bf16 (the same blocks and updates), with patterns and with
# patterns off, and read as above: the bundles of each code's region per step and per 1,000 score
# pairs it computes (`StepCodes.pairs`), and the kernel's bundles in all (grid steps times the
# step's bundles, plus each code's steps times its region's), as for the tile kernel above.

# %%
CL = 8192
c_band = masks.band(CL, masks.band_width_for_density(CL, 0.25))
c_layout, c_plan = block_steps(stlib.block_layout(c_band, SB, SB), CL, SB, SB)
c_arg, c_row = jax.ShapeDtypeStruct((CL, 128), jnp.bfloat16), jax.ShapeDtypeStruct((CL,), jnp.float32)
print("step-coded dk / dv kernel in view, v6e (static schedules, not measurements):")
for label, plan_ in (("patterns", c_plan), ("patterns off", plan_steps(c_layout, CL, 0))):
    c_fn = functools.partial(dk_dv_steps, plan=plan_, grain=GRAIN, width=c_band.width, interpret=False)
    c_names = [region_name(int(c)) for c in plan_.present]
    c_schedule = schedule_of(c_fn, *[c_arg] * 4, *[c_row] * 2, chip="v6e", kernel_prefix="dkv_steps_in_view",
                             compute_names=c_names)
    if c_schedule is None:
        continue
    c_bundles = per_step(c_schedule)
    c_codes = StepCodes(plan_.codes, plan_.patterns, None, c_band, GRAIN, CL)
    c_steps = {name: int((plan_.codes == c).sum()) for c, name in zip(plan_.present, c_names)}
    c_grid = plan_.codes.shape[2] * transposed_steps(plan_.codes[0])[3]  # kv tiles x the widest kv tile
    c_total = c_grid * c_bundles["step"] + sum(n * c_bundles[name] for name, n in c_steps.items())
    print(f"  {label}: grid step {c_bundles['step']:,} bundles, {c_grid:,} grid steps; about {c_total:,} "
          "bundles in all")
    for c, name in zip(plan_.present, c_names):
        pairs = c_codes.pairs(int(c), SB, SB)
        print(f"    {name.removeprefix('compute_'):9s} {c_steps[name]:>3} steps, {pairs:>7,} pairs a step: "
              f"{c_bundles[name]:>6,} bundles ({c_bundles[name] / (pairs / 1000):.2f} per 1,000 pairs)")

# %% [markdown]
# Read it against the dk / dv tile kernel above (6.76 bundles per 1,000 pairs, about 187,380
# bundles in all, the band evaluated on every tile). A FULL step costs 5.94 per 1,000 pairs, the
# same four matmuls with no mask, and a MASKED step 6.56. The patterns are not all a saving here:
# the two large ones (13 of 16 sub-tiles, in updates of one 128-key sub-tile against a run of q
# lanes) cost 1,905 and 2,080 bundles a step against a MASKED step's 1,720, although the planner
# (`Pattern.cost`) prices them at about half a MASKED step. The saving comes from the FULL steps and
# from the one-sub-tile patterns (235 bundles). More regions also lengthen the grid step (133
# bundles against 101 with patterns off). In all: about 148,372 bundles with patterns, 175,768
# with patterns off. The library's fused kernel (`stlib.kernels.backward_kernels`) is this kernel
# with dq's matmul in each update, the RAGGED code, padded patterns, per-head tables and the
# forward's base-2 exponentials; its updates and blocks are swept per chip.

# %% [markdown]
# ## Measured: the kernels in view beside the library's backward and Splash's
#
# Both kernels in view, at the configuration's size: on a TPU the case study (10 heads x 75,600
# tokens x 128, bfloat16), compiled; elsewhere the small CPU shape in interpret mode, whose times
# measure the interpreter, not a kernel. The mask is the band of density 0.25, which both kernels
# evaluate from indices, and one set of random inputs serves every call. `jax.vmap` runs a kernel in
# view for every head (a head axis in front of its grid), at tiles of `block_q` x `block_q` (512 x
# 512 on a TPU, as compiled for v6e above). The step-coded kernel takes whole blocks, so its inputs
# are padded to a multiple of them: padding rows get lse = +inf and see nothing, and the padding
# keys' dk and dv are dropped.
#
# Beside them, on the same inputs: stlib's tile kernel (`impl="pallas_tile"`, the configuration's
# tiles) and Splash (`impl="splash"`), each forward alone and as a training step (`jax.vjp`: the
# forward, then dq, dk and dv from the cotangent). The tile kernel's forward is timed as its
# training step runs it, keeping lse, and it gives the kernels in view their lse; di is computed
# from its output. Splash runs its split backward (`options={"fused_backward": False}`): its fused
# backward keeps dq as bfloat16 partials in HBM, one per kv tile, and at the case study that is
# 15.52 GB of temporaries (the compile table at the end of this notebook), nearly all of a v5e's 16
# GB of HBM. A backward's time is derived: training step minus forward. The kernels in view compute
# dk and dv only, from the lse and di they are given; the library's backward and Splash's also
# compute dq and di.
#
# The checks come first, at the same size. The cotangent is zero except on the rows of
# `checks.reference_rows` (at the case study 384 of them, 128 each at the start, the middle and the
# end), so dq is nonzero on those rows only and dk, dv are sums over them alone. The reference's
# gradients on those rows against the full k and v (`stlib.checks.reference_on_rows`, float32 at
# HIGHEST) are then exact, and no [H, L, L] array is formed.

# %%

from stlib import bench
from stlib.kernels.tile import tile_attention
from stlib.layout import call_layout

TH, TL, TD, t_dtype = (cfg.workload.num_heads, cfg.workload.num_tokens, cfg.workload.head_dim,
                       cfg.workload.dtype)
t_band = masks.band(TL, masks.band_width_for_density(TL, 0.25))
TB = cfg.block_q  # the kernels in view: TB x TB tiles
LP = -(-TL // TB) * TB  # the step-coded kernel's whole blocks
t_layout = stlib.block_layout(t_band, TB, TB)
_, t_plan = block_steps(stlib.block_layout(masks.band(LP, t_band.width), TB, TB), LP, TB, TB)
blocks, split = {"block_q": cfg.block_q, "block_kv": cfg.block_kv}, {"fused_backward": False}


def pad_rows(x, value=0.0):  # [H, TL, ...] -> [H, LP, ...]
    return jnp.pad(x, [(0, 0), (0, LP - TL)] + [(0, 0)] * (x.ndim - 2), constant_values=value)


def in_view(q, k, v, do, lse, di):
    """dk, dv [H, L, D] f32 by the dk / dv kernel in view, every head at once (``jax.vmap``)."""
    kernel = functools.partial(dk_dv, layout=t_layout, width=t_band.width, interpret=cfg.interpret)
    return jax.vmap(kernel)(q, k, v, do, lse, di)


def in_view_steps(q, k, v, do, lse, di):
    """dk, dv [H, L, D] f32 by the step-coded kernel in view, on inputs padded to whole blocks."""
    kernel = functools.partial(dk_dv_steps, plan=t_plan, grain=GRAIN, width=t_band.width, interpret=cfg.interpret)
    dk, dv = jax.vmap(kernel)(*map(pad_rows, (q, k, v, do)), pad_rows(lse, jnp.inf), pad_rows(di))
    return dk[:, :TL], dv[:, :TL]


def stlib_forward(q, k, v, *_):
    """o [H, L, D] and lse [H, L] of the tile kernel: the forward its training step runs."""
    return tile_attention(q, k, v, call_layout(t_band, TL, cfg.block_q, cfg.block_kv), scale=TD**-0.5,
                          return_lse=True, interpret=cfg.interpret)


def training_step(impl, **options):
    def step(q, k, v, do, *_):  # the forward, then (dq, dk, dv) from the cotangent do
        _, pullback = jax.vjp(lambda q, k, v: stlib.attention(q, k, v, t_band, impl=impl, **blocks, **options),
                              q, k, v)
        return pullback(do)

    return step


cases = {  # every case takes (q, k, v, do, lse, di) and reads what it needs
    "dk / dv kernel in view": in_view,
    "step-coded dk / dv kernel in view": in_view_steps,
    "stlib pallas_tile forward (with lse)": stlib_forward,
    "stlib pallas_tile training step": training_step("pallas_tile"),
    "Splash forward": lambda q, k, v, *_: stlib.attention(q, k, v, t_band, impl="splash", **blocks, options=split),
    "Splash training step (split backward)": training_step("splash", options=split),
}
tq, tk, tv = stlib.random_qkv((TH, TL, TD), t_dtype, seed=4)
tdo = jax.random.normal(jax.random.key(5), (TH, TL, TD), t_dtype)
rows = jax.ShapeDtypeStruct((TH, TL), jnp.float32)  # lse, di: one float32 per query
compiled = {name: bench.compile_function(fn, *[jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (tq, tk, tv, tdo)],
                                         rows, rows) for name, fn in cases.items()}
print(f"{TH} heads x {TL:,} tokens x {TD}, {jnp.dtype(t_dtype).name}, band |q - k| <= {t_band.width:,}; kernels in view "
      f"at {TB} x {TB} tiles, the library and Splash at {cfg.block_q} x {cfg.block_kv}; "
      + ("compiled" if cfg.on_tpu else "Pallas interpret mode"))
print("compiled in " + ", ".join(f"{name} {c.compile_ms / 1e3:.1f} s" for name, c in compiled.items()))

unused = jnp.zeros((TH, TL), jnp.float32)  # the forward reads q, k, v only
t_out, t_lse = compiled["stlib pallas_tile forward (with lse)"](tq, tk, tv, tdo, unused, unused)
tol = tolerance(t_dtype)
notebook.passed("stlib pallas_tile forward == the reference", checks.max_error(t_out, tq, tk, tv, t_band), tol)


def di_of(do):  # rowsum(dO * o) in float32: the backward's second residual
    return jnp.sum(do.astype(jnp.float32) * t_out.astype(jnp.float32), axis=-1)


picked = checks.reference_rows(TL)
sampled = np.zeros(TL, bool)
sampled[picked] = True
do_rows = jnp.where(jnp.asarray(sampled)[None, :, None], tdo, 0).astype(t_dtype)  # zero but on the sampled rows
# the reference's dq (on those rows), dk and dv of sum(o * do_rows), from the sampled rows alone
_, *want = checks.reference_on_rows(tq, tk, tv, t_band, picked, do_rows[:, picked])
want_rows = dict(zip(("dq", "dk", "dv"), want))
for name, fn in compiled.items():
    if "forward" in name:
        continue
    got = fn(tq, tk, tv, do_rows, t_lse, di_of(do_rows))
    grads = dict(zip(("dk", "dv"), got)) if "in view" in name else {"dq": got[0][:, picked], "dk": got[1], "dv": got[2]}
    notebook.passed(f"{name}: {', '.join(grads)} == the reference's on {picked.size} sampled rows",
                    max(checks.scaled_error(g, want_rows[g_name]) for g_name, g in grads.items()), tol,
                    detail="; relative to the largest entry")

rounds, trials = (3, 2) if cfg.on_tpu else (1, 1)  # a call at the case study takes tens to hundreds of ms on a TPU
timings = notebook.time_side_by_side(
    cfg, compiled, tq, tk, tv, tdo, t_lse, di_of(tdo), rounds=rounds, trials=trials,
    figure="10_backward_in_view_vs_library",
    title=f"dk / dv kernels in view vs stlib pallas_tile and Splash, band 0.25, {TH} x {TL:,} x {TD} "
          f"{jnp.dtype(t_dtype).name}",
    notebook="10_training_the_backward",
    what="dk / dv kernels in view vs pallas_tile and Splash (split backward), forward and training step, band 0.25",
    shape=[TH, TL, TD], dtype=jnp.dtype(t_dtype).name, blocks=blocks, in_view_blocks=[TB, TB])
for name, (step, forward) in {"stlib pallas_tile": ("stlib pallas_tile training step", "stlib pallas_tile forward (with lse)"),
                              "Splash (split)": ("Splash training step (split backward)", "Splash forward")}.items():
    print(f"{name + ' backward (training step - forward)':46} {timings[step].median_ms - timings[forward].median_ms:>10.2f}")

# %% [markdown]
# Read the table row against row, on a TPU (off one, the times are the interpreter's and say nothing
# about a chip; only the checks above carry over). The two kernels in view do the same work, dk and
# dv over the band's tiles, and differ in how they run a tile: the first evaluates the band on every
# tile, the step-coded one runs FULL tiles mask-free and only the pieces of an edge tile that the
# band touches. Against the library's backward (the derived row) they leave out dq and di and take
# lse from outside, so a kernel in view at or above that row is slower than the library at less
# work. Splash's backward is the yardstick the estimates below set targets by; its split backward,
# like the split pair of this notebook's second section, recomputes S and dP in a dq kernel of its
# own (7 matmuls a tile against the fused kernel's 5).

# %% [markdown]
# ## The backward in the static estimate
#
# `stlib.static_estimate(..., backward=True)` compiles a call's backward alone (the gradient from
# the forward's residuals) and reads its schedule as notebook 08 reads the forward's, with the same
# calibrated clock: nothing is fitted to backward timings. `python -m stlib.bench.backward_estimate
# run` estimates the tile kernel forward and backward on three masks and dense Splash (forward at
# its tuned blocks; backward the better of fused and split, each at its tuned blocks) for v6e,
# TPU7x and v5e; the committed records are printed here. These are static estimates, not
# measurements.

# %%
from stlib.bench import backward_estimate

print(backward_estimate.format_table(backward_estimate.read(cfg.data / "backward_estimates.jsonl")))

# %% [markdown]
# ### What the backward's MXUs are fed
#
# A bundle issues in one cycle, but a matmul path cannot run faster than its MXUs are fed. libtpu's
# per-bundle utilization dump holds an MXU busy for every row a `vmatmul` streams and for nothing
# of a `vmatpush`, which loads the MXU's stationary operand, the weights. The estimate charges a pushed
# weight row as a streamed one (`stlib.analysis.mxu_input`: both arrive through the unit's operand
# path; an assumption no TPU here can test) and takes the longer of a path's bundles and its
# busiest MXU's feed. Splash's forward streams a whole q block through each weight tile, so it
# pushes little (the lane-dense forward's chunks are another matter: next paragraph). Splash's dK/dV kernel streams only its kv chunk through q- and dO-weights, so it pushes
# a weight row for every few rows it multiplies, and on its busier MXU the feed outlasts the
# bundles. The rows below are the committed records' compute paths, one execution each.
#
# A TPU v5e has since tested the assumption (notebook 08, "Measured on a TPU v5e"): it ran the
# lane-dense forward, whose chunks push a weight row for every row they multiply, at the pace of
# its bundles, not of its feed, and Splash's backward and the tile kernel's within about ten percent
# of their bundles at one clock too. On v5e, then, a push does not cost a streamed row's time; the
# rule stays in the estimate until a chip it was adopted for (TPU7x) is measured, and its numbers
# here read as upper bounds.

# %%
print(backward_estimate.format_mxu_feed(backward_estimate.read(cfg.data / "backward_estimates.jsonl")))

# %% [markdown]
# The same reading at a shape small enough to compile here in a minute: Splash's forward and its
# fused backward on TPU7x (4 q heads sharing one kv head, 2,048 tokens, causal, 1,024 x 1,024
# blocks), each path's bundles per execution beside its count. The forward's compute path is
# charged its bundles; the backward's is marked `MXU-fed` where its feed is longer.

# %%
small_call = {"num_heads": 4, "num_kv_heads": 1, "head_dim": 128, "length": 2048,
              "block_sizes": {"block_q": 1024, "block_kv": 1024}}
for direction in (False, True):
    try:
        print(stlib.static_estimate("splash", "causal", "tpu7x", backward=direction, **small_call), "\n")
    except RuntimeError as error:  # its compile subprocess failed here: the committed records above stand
        print(f"no static estimate here ({'backward' if direction else 'forward'}): "
              f"{str(error).strip().splitlines()[0][:200]}")

# %% [markdown]
# Read the table against the targets on its first line: dense, the tile kernel's backward over
# Splash's best backward (both at tuned blocks); the band, a training step (forward + backward) over
# dense Splash's; the sliding tile, its backward over its own forward (the fused kernel's flops are
# exactly 2.5x the forward's, but its time can be less than 2.5x: the forward pays exponentials and
# step overheads the backward's matrix work hides, so a ratio under 2.5 is no paradox) and its
# training step. Where a row
# misses, the table at the end of this section says what stands in the way.
#
# Every row's backward is step-coded now. The sliding tile runs rows of 3-D tiles as pattern steps
# at blocks of one row of tiles each way (1,920 x 1,920 on v6e, where the forward's q blocks hold
# two rows); dense and the band run the forward's step codes at the backward's own
# tuned blocks, whose [keys, block_q] updates fit VMEM beside the dq window where whole
# [block_kv, block_q] tiles did not. Where that one call is the whole backward (one dq window:
# v5e and v6e), it also writes dq, dk and dv final, so the glue is only the inputs' padding and di.
# TPU7x has half their VMEM: its dq window splits, and its backward keeps the f32 accumulators
# and the separate scale-and-cast pass. With one 3-D tile a block every small step would pay the
# fixed cost, and at 1,024 x 1,024 every sliding-tile step would evaluate the mask (the estimates
# of both are in the docstring of `stlib.kernels.backward.one_tile_layout`, the fallback where no
# dq window fits in VMEM). Whatever the backward gains, a training step also pays its forward; the
# table at the end of this section says which of the two holds each missed target back.

# %% [markdown]
# ### What stands in the way of a missed target
#
# `stlib.bench.target_gaps.missed` (`python -m stlib.bench.target_gaps`) lists every target the
# estimates miss, each with three readings from the same records:
#
# - **every path at its bundles**: the same ratio with each path charged its bundles alone and no
#   exposed DMA, that is without the MXU-feed rule that measurements on a v5e contradicted;
# - **the mask's density times the kernel's own ratio without a mask** (and, in brackets, the same
#   at every record's bundles): where every allowed pair costs what a pair costs the kernel with no
#   mask. A target below it is out of reach of any schedule at the kernel's mask-free pace; that
#   pace has to improve first;
# - **the largest path**: the tile kernel's path with the most charged cycles in the calls the ratio
#   reads (its forward, or its forward and backward for a training step; a region split over dq
#   windows counted once, its windows together), its share of the tile kernel's cycles there, and
#   its MXU feed over its bundles (above 1: charged its feed).

# %%
from stlib.bench import target_gaps

print(f"density of the sliding tile (3-D tiled order): {target_gaps.mask_density('sliding tile, 3-D tiled order'):.3f}; "
      f"of the band: {target_gaps.mask_density('band (density 0.25)'):.3f}\n")
print(target_gaps.format_missed(backward_estimate.read(cfg.data / "backward_estimates.jsonl")))

# %% [markdown]
# Read it chip by chip (static estimates, not measurements; the second number in the density column
# reads every record at its bundles):
#
# - **The sliding tile's forward** misses by the most: 0.149 of dense Splash's forward on v6e and
#   0.145 on TPU7x, against 0.105 and 0.100. One path carries it, the forward's `pattern0` (75% of
#   the kernel's cycles on both chips), charged its MXU feed at 1.33x and 1.37x its bundles. Under
#   the feed rule the target lies below the kernel's own mask-free pace (the mask's density, 0.132,
#   times the kernel's forward over Splash's without a mask: 0.114 and 0.110), so no sliding-tile
#   schedule reaches it without a faster mask-free forward. At its bundles the mask-free pace is
#   0.091 and 0.085, below the targets, and yet the sliding tile reads 0.117 and 0.110: a pair in a
#   pattern step costs more than a pair of the kernel without a mask, as the dk / dv kernel in view
#   showed for the backward. So dropping the feed rule would not reach the target on its own;
#   cheaper pattern steps would have to.
# - **The sliding tile's training step** reads 0.160 and 0.161 against 0.130, above its mask-free
#   pace (0.114 on both chips). Its largest path is the fused backward's `pattern0` (59% and 58% of
#   the kernel's cycles, its dq windows together on TPU7x), charged 1.43x and 1.40x its bundles; at
#   its bundles the step reads 0.134 and 0.143.
# - **The band's training step** reads 0.231 and 0.237 against 0.220, above its mask-free pace
#   (0.217 and 0.218): its edge steps cost more per pair than the kernel without a mask, and its
#   largest path is the fused backward's FULL region. At its bundles v6e reads 0.220; TPU7x reads
#   0.245, because dense Splash's backward there is charged more by the feed rule than the tile
#   kernel's (the MXU-feed table above).
# - On v5e the kernel's mask-free forward is charged its MXU feed, which notebook 08 measured the
#   v5e not to pay; so its mask-free pace under the rule, 0.222 (0.126 at its bundles), reads
#   above the sliding tile's own estimate, 0.194 (0.152 at its bundles).

# %% [markdown]
# The backward also compiles for real chips without one. `python -m stlib.bench.backward_compile
# run` compiles `jax.grad` at the case-study shape for v5e, v6e and TPU7x, for each tile kernel and
# for Splash (fused and split), with four masks. The records below are committed. Compare the
# temporaries: Splash's fused backward sums dq over per-kv-tile partials in HBM (bf16, one per kv
# tile), and stlib's kernels keep only f32 accumulators.

# %%
print(backward_compile.format_table(backward_compile.read(cfg.data / "backward_compiles.jsonl")))

# %% [markdown]
# ## Takeaways
#
# * The backward needs nothing the forward does not already have: the output and one log-sum-exp
#   per query rebuild P tile by tile.
# * dq walks the forward's table. dk / dv walk its transpose. Split, each owns its output tile, so
#   no partial sums go to HBM and the result is deterministic. It costs 7 matmuls per tile against
#   the forward's 2.
# * Fused, the dk / dv walk also forms dQ from the dS^T it has (5 matmuls), adding into a window of
#   the head's dq held in VMEM: still no partials in HBM, still deterministic.
# * Lane-dense residuals: lse and di as [1, L] rows broadcast over the keys of the transposed scores.
# * Step codes carry over: the transposed grid runs the forward's FULL, RAGGED, MASKED and pattern
#   steps in [keys, block_q] updates, so the backward's blocks are as large as VMEM beside the dq
#   window allows, swept per chip like the forward's.
# * Both kernels in view run compiled on a TPU, at the case study's shape, checked on sampled query
#   rows against the float32 reference (no [H, L, L] array) and timed beside the library's training
#   step and Splash's.
# * Every stlib Pallas kernel now trains, and so does everything built on them (`video_attention`,
#   routed plans, `stlib.attention_fn`, `parallel_attention`).
