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
# # 04 · A Pallas warm-up, then flash attention
#
# Plain attention materialises the [L, L] score matrix: at the case-study shape that is
# 10 x 75,600² float32 scores, 229 GB, far beyond any chip. Flash attention never builds it: it
# walks over the keys one tile at a time and keeps a running softmax per query (the *online
# softmax*). Part 1 is a warm-up: four small Pallas kernels that introduce everything the
# attention kernels use (blocks and index maps, a grid, scratch carried across steps, `pl.when`,
# scalar prefetch). Part 2 writes the online softmax in a few lines of jnp, then as a Pallas
# kernel you can read line by line, checks it against the reference and against the library's
# dense kernel (`impl="pallas_dense"`), leaves its core for you to rebuild, times it beside the
# library's kernel and Splash (on a TPU; in interpret mode elsewhere, which says nothing about
# speed), explains what Pallas interpret mode does and does not tell you, and compiles the kernels
# for TPU v6e and v5e without needing a TPU, reading back how much VMEM the compiler allocated.

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
import re
import time

import jax
import jax.numpy as jnp

import stlib
import stlib.kernels  # registers the Pallas kernels with stlib.attention
from stlib import bench, checks, configs, exercises, masks, notebook, plotting
from stlib.analysis import KernelConfig, compile_report
from stlib.device import compile_for_tpu
from stlib.roofline import work_summary

cfg = notebook.setup(SIZE, solutions=SOLUTIONS)
# checks against the plain reference, within the tolerance of the dtype on this backend (stlib.checks)
max_error, tolerance, check_close, passed = notebook.max_error, notebook.tolerance, notebook.check_close, notebook.passed

TOL = tolerance(cfg.workload.dtype)

# %% [markdown]
# ## Part 1 · A Pallas warm-up
#
# Four small kernels, each introducing one piece of the Pallas TPU vocabulary the attention
# kernels are made of. Each runs here against a jnp check (compiled on a TPU, in Pallas interpret
# mode elsewhere: `interpret=cfg.interpret`), and is then compiled for TPU v6e with
# `stlib.device.compile_for_tpu` (the real Mosaic compiler, no TPU needed; more on it at the end of
# this notebook). `check_close` (`stlib.checks`) prints PASSED with the max error, or raises.
#
# 1. **A kernel is a function of refs.** `pl.pallas_call(kernel, out_shape=...)` calls `kernel`
#    with one *ref* per input and per output. Without a grid, each whole array is copied into
#    VMEM (the TPU core's fast on-chip memory) before the body runs and the output is copied back
#    to HBM afterwards. `x_ref[...]` loads the block as an array; `o_ref[...] = ...` stores it.

# %%
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def show_memory(name, fn, *args, chip="v6e"):
    """Compile fn(*args, interpret=False) for a TPU chip from abstract inputs; print what it holds in HBM."""
    shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args]
    start = time.perf_counter()
    hbm = compile_for_tpu(functools.partial(fn, interpret=False), *shapes, chip=chip).memory()
    print(f"        {chip} compile of {name}: {time.perf_counter() - start:.1f} s; HBM: arguments "
          f"{hbm['argument_size_in_bytes']:,} B, output {hbm['output_size_in_bytes']:,} B, "
          f"temporaries {hbm['temp_size_in_bytes']:,} B")
    return hbm


def add_kernel(x_ref, y_ref, o_ref):  # refs to whole arrays in VMEM
    o_ref[...] = x_ref[...] + y_ref[...]  # load, add on the vector unit, store


def add(x, y, interpret=cfg.interpret):
    return pl.pallas_call(add_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), interpret=interpret)(x, y)


rng = np.random.default_rng(0)
x = jnp.asarray(rng.standard_normal((256, 512), np.float32))  # 512 KiB each
y = jnp.asarray(rng.standard_normal((256, 512), np.float32))
check_close("add(x, y) == x + y", add(x, y), x + y)
show_memory("add", add, x, y);

# %% [markdown]
# 2. **A grid of steps, `BlockSpec` index maps, `pl.program_id`.** With `grid=(4, 4)` the body
#    runs 16 times. A `BlockSpec(block_shape, index_map)` says which block each step sees: the
#    index map takes the step's grid indices and returns *block* indices (block (i, j) of a
#    (64, 128) block shape starts at row 64 i, column 128 j). Pallas copies each step's blocks to
#    VMEM, double-buffered: the next step's copy runs while this step computes. Inside the body
#    `pl.program_id(axis)` is the step's index along an axis. On a TPU the last two dimensions of
#    a block must be multiples of (8, 128) (sublanes, lanes) or span the whole array. The kernel
#    below stamps its step number into its tile, so the check also shows which step wrote where.

# %%
BM, BN = 64, 128


def tiled_add_kernel(x_ref, y_ref, o_ref):  # refs to one [BM, BN] block each
    i, j = pl.program_id(0), pl.program_id(1)  # this step's grid indices (int32 scalars)
    step = i * pl.num_programs(1) + j  # steps run in row-major grid order
    o_ref[...] = x_ref[...] + y_ref[...] + 1000.0 * step.astype(jnp.float32)


def tiled_add(x, y, interpret=cfg.interpret):
    rows, cols = x.shape
    spec = pl.BlockSpec((BM, BN), lambda i, j: (i, j))  # step (i, j) sees block (i, j) of each array
    return pl.pallas_call(tiled_add_kernel, grid=(rows // BM, cols // BN), in_specs=[spec, spec], out_specs=spec,
                          out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), interpret=interpret)(x, y)


stamp = np.kron(np.arange(16.0).reshape(4, 4), np.ones((BM, BN)))  # step number of each element's tile
check_close("tiled_add (grid (4, 4), blocks 64 x 128) == x + y + 1000 * step", tiled_add(x, y), x + y + 1000.0 * stamp)
show_memory("tiled_add", tiled_add, x, y);

# %% [markdown]
# 3. **Scratch carried across an "arbitrary" axis, `pl.when`.** A row sum over column blocks:
#    grid (row blocks i, column blocks j), j innermost. A VMEM *scratch* buffer
#    (`scratch_shapes=[pltpu.VMEM(shape, dtype)]`) lives for the whole grid, so step (i, j + 1)
#    sees what step (i, j) left there. `pl.when(cond)` runs a block of code only when the traced
#    condition holds: initialise at j == 0, accumulate at every step, finalise (write the output)
#    at the last j. The output block index (i, 0) does not change with j, so the output stays in
#    VMEM across the row and is written back to HBM once, when i changes. Because j carries state,
#    it is declared `"arbitrary"` (run in order on one core); i may be `"parallel"` (where one
#    device has two TensorCores, as a megacore chip does, the compiler may split it between them;
#    TPU7x instead shows its two TensorCores as two devices, each running its own grid). The accumulator is [BM, 128], one vector register width: each
#    step adds 128-lane slices element-wise, and only the finalise step reduces across lanes. The
#    attention kernels keep their running max and sum exactly like this.

# %%
def row_sum_kernel(x_ref, o_ref, acc_ref):  # x [bm, bn] block, o [bm, 1] block, acc [bm, 128] f32 scratch
    j = pl.program_id(1)

    @pl.when(j == 0)  # first column block of this row block
    def _init():
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    x = x_ref[...]  # [bm, bn]
    for c in range(x.shape[1] // 128):  # unrolled at trace time: element-wise adds of [bm, 128] slices
        acc_ref[...] += x[:, c * 128:(c + 1) * 128]

    @pl.when(j == pl.num_programs(1) - 1)  # last column block: one cross-lane reduction
    def _finish():
        o_ref[...] = jnp.sum(acc_ref[...], axis=1, keepdims=True)


def row_sum(x, block=(64, 256), interpret=cfg.interpret):
    (rows, cols), (bm, bn) = x.shape, block
    return pl.pallas_call(
        row_sum_kernel, grid=(rows // bm, cols // bn),
        in_specs=[pl.BlockSpec((bm, bn), lambda i, j: (i, j))],
        out_specs=pl.BlockSpec((bm, 1), lambda i, j: (i, 0)),  # same block for every j: resident across the row
        out_shape=jax.ShapeDtypeStruct((rows, 1), jnp.float32),
        scratch_shapes=[pltpu.VMEM((bm, 128), jnp.float32)],
        compiler_params=None if interpret else pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
        interpret=interpret,
    )(x)


check_close("row_sum (grid (4, 2), scratch across the arbitrary axis) == x.sum(1)", row_sum(x),
            x.sum(axis=1, keepdims=True))
show_memory("row_sum", row_sum, x);

# %% [markdown]
# 4. **Scalar prefetch: a table that steers the index maps.** `pltpu.PrefetchScalarGridSpec(
#    num_scalar_prefetch=1, ...)` copies the first operand (a small int32 array) into SMEM, the
#    core's scalar memory, *before* the grid starts. Every index map and the body then receive
#    its ref as extra arguments, so a block index can be read from a table: data-dependent
#    addressing decided before the step's copy is issued. Below, a permutation table makes step i
#    fetch block perm[i] of x, a gather of blocks, and the body also reads the table (to scale the
#    block by perm[i] + 1). This is exactly how the sparse kernels of notebooks 05 and 06 choose
#    which kv tile each step reads.

# %%
def gather_kernel(perm_ref, x_ref, o_ref):  # perm_ref: the whole table, in SMEM
    i = pl.program_id(0)
    o_ref[...] = x_ref[...] * (perm_ref[i] + 1).astype(jnp.float32)  # a scalar read from SMEM


def gather_blocks(perm, x, block_rows=32, interpret=cfg.interpret):
    cols = x.shape[1]
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1,  # the first operand (perm) goes to SMEM
        grid=(perm.shape[0],),
        in_specs=[pl.BlockSpec((block_rows, cols), lambda i, perm_ref: (perm_ref[i], 0))],  # step i reads block perm[i]
        out_specs=pl.BlockSpec((block_rows, cols), lambda i, perm_ref: (i, 0)),
    )
    out_shape = jax.ShapeDtypeStruct((perm.shape[0] * block_rows, cols), x.dtype)
    return pl.pallas_call(gather_kernel, grid_spec=grid_spec, out_shape=out_shape, interpret=interpret)(perm, x)


perm = jnp.asarray(rng.permutation(8), jnp.int32)
want = jnp.concatenate([x[p * 32:(p + 1) * 32] * (p + 1) for p in perm.tolist()])
check_close(f"gather_blocks (blocks in order {perm.tolist()}) == jnp gather", gather_blocks(perm, x), want)
show_memory("gather_blocks", gather_blocks, perm, x);

# %% [markdown]
# What the compiler reports here is HBM: the arguments (the permutation table shows up as 512 B
# more in the last one: 8 int32 padded) and the output; no temporaries. What each kernel holds in
# VMEM follows from its specs, and is worth counting by hand: every input and output block twice
# (double buffering) plus the scratch. The tiled add holds 6 x 64 x 128 x 4 B = 192 KiB; the row
# sum 2 x 64 x 256 x 4 B + 2 x 64 x 1 x 4 B (padded to 128 lanes in VMEM: 64 KiB) + its
# 32 KiB accumulator. The end of this notebook checks such counts against the compiler's own VMEM
# allocation for the flash kernel.
#
# That is the whole vocabulary of the attention kernels: blocks and index maps, a grid with an
# "arbitrary" axis carrying scratch, `pl.when` for init / finalise / skip, and scalar-prefetched
# tables in SMEM steering the index maps.
#
# ## Part 2 · Flash attention
#
# ### The online softmax, in jnp
#
# For one query row, softmax(s) v = Σ exp(s_j - m) v_j / Σ exp(s_j - m) for any constant m; the
# maximum score keeps the exponentials in range. The online version does not know the maximum in
# advance. It keeps three running quantities per query, updated for each block of keys:
#
# * `m`, the largest score seen so far;
# * `l`, the sum of exp(s - m) over the keys seen so far;
# * `acc`, the sum of exp(s - m) v over the keys seen so far.
#
# When a block raises the maximum from m to m', everything accumulated so far is rescaled by
# α = exp(m - m'). After the last block, `acc / l` is the exact softmax-weighted sum. Below is a
# teaching version (every query row at once, one key block at a time), checked against the
# library's plain reference, `stlib.attention(impl="reference")`.

# %%
def online_softmax_attention(q, k, v, block_kv):
    """q, k, v [H, L, D] float32; one pass over the keys, block_kv at a time."""
    num_heads, length, head_dim = q.shape
    hp = jax.lax.Precision.HIGHEST
    m = jnp.full((num_heads, length, 1), -jnp.inf)  # running max
    l = jnp.zeros((num_heads, length, 1))  # running sum of exp(s - m)
    acc = jnp.zeros((num_heads, length, head_dim))  # running sum of exp(s - m) v
    for k0 in range(0, length, block_kv):
        s = jnp.einsum("hqd,hkd->hqk", q, k[:, k0:k0 + block_kv], precision=hp) / jnp.sqrt(head_dim)  # [H, L, bkv]
        m_new = jnp.maximum(m, s.max(axis=-1, keepdims=True))
        alpha = jnp.exp(m - m_new)  # rescales what was accumulated under the old maximum
        p = jnp.exp(s - m_new)
        l = alpha * l + p.sum(axis=-1, keepdims=True)
        acc = alpha * acc + jnp.einsum("hqk,hkd->hqd", p, v[:, k0:k0 + block_kv], precision=hp)
        m = m_new
    return acc / l


q, k, v = stlib.random_qkv((2, 1024, 128), jnp.float32, seed=1)
q = 4.0 * q  # sharper softmax: the running maximum changes often, so the rescaling matters
check_close("online softmax (8 key blocks of 128) == stlib reference", online_softmax_attention(q, k, v, block_kv=128),
            stlib.attention(q, k, v, impl="reference"))
print(f"scores held at once: [2, 1024, 128] = {2 * 1024 * 128 * 4 / 2**20:.1f} MiB instead of "
      f"[2, 1024, 1024] = {2 * 1024 * 1024 * 4 / 2**20:.1f} MiB; at the case-study shape one [512, 512] "
      f"float32 chunk (1 MiB) instead of {10 * 75_600**2 * 4 / 1e9:.0f} GB")

# %% [markdown]
# ### Exercise 1: combine two partial softmaxes
#
# The loop above carries one state (m, l, acc) along the keys. Split the keys in two halves, run the
# loop on each half separately (two devices, or two grid steps that run in parallel), and you hold
# two states, each under its own maximum. Write `combine(m1, l1, acc1, m2, l2, acc2)`, which returns
# the state over all the keys; `acc / l` of it must be attention over all of them. Split-kv kernels
# (flash decoding) and the tile kernel's two passes (notebook 06) end this way.
#
# Run the notebook with `SOLUTIONS = "hide"` (first cell) to write it yourself: the stub raises, and
# the check prints NOT YET and what is wrong. `exercises.show("04.combine")` prints a solution.
#
# *Hint 1:* bring both states to the larger of the two maxima, as the loop's α does for one.
# *Hint 2:* with m = max(m1, m2), state i is worth exp(mi - m) of itself: scale its l and its acc
# by that, then add the two.

# %%
@exercises.fill_in("04.combine")
def combine(m1, l1, acc1, m2, l2, acc2):
    # --- your code here: return (m, l, acc) over both key sets ---
    raise NotImplementedError


def softmax_state(q, k, v):
    """(m, l, acc) of one head's queries over the keys k, v (float32, no mask; matmuls at HIGHEST
    precision, so that on a TPU too the states are exact to float32 rounding)."""
    hp = jax.lax.Precision.HIGHEST
    s = jnp.matmul(q, k.T, precision=hp) / jnp.sqrt(q.shape[-1])
    m = s.max(axis=-1, keepdims=True)
    p = jnp.exp(s - m)
    return m, p.sum(axis=-1, keepdims=True), jnp.matmul(p, v, precision=hp)


def check_combine(combine):
    half = k.shape[1] // 2
    parts = [softmax_state(q[0], k[0, sl], v[0, sl]) for sl in (slice(0, half), slice(half, None))]
    m, l, acc = combine(*parts[0], *parts[1])
    if m.shape != parts[0][0].shape:
        raise exercises.NotYet(f"m has shape {m.shape}, expected {parts[0][0].shape}")
    if not jnp.array_equal(m, jnp.maximum(parts[0][0], parts[1][0])):  # a max is exact on every backend
        raise exercises.NotYet("m is not the max over both key sets: the next tile's update starts from it")
    whole = softmax_state(q[0], k[0], v[0])  # the state over every key at once
    err = checks.scaled_error(acc / l, stlib.attention(q, k, v, impl="reference")[0])
    l_err = checks.scaled_error(l / whole[1], jnp.ones_like(l))  # relative error of l
    tol = tolerance(jnp.float32)
    if not (err <= tol and l_err <= tol):
        raise exercises.NotYet(f"max error {err:.2e} (l off by {l_err:.1e} relative; tolerance {tol:.0e}): is "
                               "each state rescaled to the common max, l and acc alike?")
    return f"two halves of {k.shape[1]} keys combined == reference (max error {err:.1e}), m and l those of all keys"


exercises.verify("04.combine", check_combine, combine)

# %% [markdown]
# ## The flash kernel, written in view
#
# The same loop as a Pallas TPU kernel, for one head: grid (q tile i, kv tile j), j innermost and
# `"arbitrary"` because it carries the running softmax in VMEM scratch (part 1's row sum with a
# softmax inside). The q block index depends on i only, so the q tile stays in VMEM along the row;
# k and v move one tile per step, double-buffered. Three phases, each a `pl.when`:
#
# * **init** (j == 0): m = a large negative number, l = 0, acc = 0;
# * **accumulate** (every step): scores s = q kᵀ on the MXU, then the online-softmax update above;
# * **finalise** (j == last): o = acc / l, written to the output block, which goes back to HBM
#   when i changes.
#
# m and l are kept *lane-replicated* as [block_q, 128] (every lane holds the same value), the
# layout of a vector register, so broadcasting them over a score tile needs no lane shuffles
# (`jnp.tile`); Splash does the same. Per step: 4 x block_q x block_kv x D flops (two matmuls),
# block_q x block_kv exponentials, and a k and a v tile copied in (2 x block_kv x D x itemsize bytes).
#
# **Precision of p·v.** The probabilities p are float32, and the kernel casts the v tile to
# float32 before multiplying (`v.astype(f32)`), as Splash does (`v = v.astype(float32)` in
# `splash_attention_kernel.py`) and as `stlib.kernels.online_softmax.update_tile` does: p keeps its full
# precision, at the price of a float32 matmul, which the MXU runs in several bf16 passes. The
# Sparse VideoGen TPU kernels instead cast p to bf16 for a single-pass bf16 x bf16 matmul (faster,
# and p loses about three significant digits). q kᵀ runs on the inputs' dtype (bf16 x bf16 at the
# case-study shape) with float32 accumulation.

# %%
F32 = jnp.float32
NEG = stlib.reference.MASK_VALUE  # a large finite negative number, not -inf (question 3 at the end says why)


def lanes(x, width):
    """[rows, 128] lane-replicated -> [rows, width] (width a multiple of 128), without lane shuffles."""
    return jnp.tile(x, (1, width // 128))


def flash_kernel(q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref, *, scale):
    j, nk = pl.program_id(1), pl.num_programs(1)  # kv tile of this step, number of kv tiles

    @pl.when(j == 0)  # init: a new q tile starts
    def _init():
        m_ref[...] = jnp.full(m_ref.shape, NEG, F32)  # [bq, 128] running max
        l_ref[...] = jnp.zeros(l_ref.shape, F32)  # [bq, 128] running sum of exp(s - m)
        acc_ref[...] = jnp.zeros(acc_ref.shape, F32)  # [bq, D]   running sum of exp(s - m) v

    # accumulate: 4 * bq * bkv * D flops and bq * bkv exps per step
    q, k, v = q_ref[...], k_ref[...], v_ref[...]  # [bq, D], [bkv, D], [bkv, D]
    s = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=F32) * scale  # [bq, bkv] q k^T
    m_prev = m_ref[...]  # [bq, 128]
    m_next = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))  # [bq, 128]
    alpha = jnp.exp(m_prev - m_next)  # [bq, 128] rescales what was summed under the old max
    p = jnp.exp(s - lanes(m_next, s.shape[1]))  # [bq, bkv] float32 probabilities (unnormalised)
    l_ref[...] = alpha * l_ref[...] + jnp.sum(p, axis=1, keepdims=True)  # [bq, 128]
    m_ref[...] = m_next
    pv = jax.lax.dot_general(p, v.astype(F32), (((1,), (0,)), ((), ())), preferred_element_type=F32)  # [bq, D]
    acc_ref[...] = lanes(alpha, acc_ref.shape[1]) * acc_ref[...] + pv  # [bq, D]

    @pl.when(j == nk - 1)  # finalise: every key seen
    def _finish():
        o_ref[...] = (acc_ref[...] / lanes(l_ref[...], acc_ref.shape[1])).astype(o_ref.dtype)


def flash_attention(q, k, v, block_q=128, block_kv=128, interpret=cfg.interpret, kernel=flash_kernel):
    """q, k, v [L, D] (one head; L a multiple of both blocks: no padding here) -> o [L, D]."""
    (length, head_dim), scale = q.shape, q.shape[1] ** -0.5
    assert length % block_q == 0 and length % block_kv == 0, "the teaching kernel does not pad"
    return pl.pallas_call(
        functools.partial(kernel, scale=scale),
        grid=(length // block_q, length // block_kv),  # (q tile i, kv tile j), j innermost
        in_specs=[pl.BlockSpec((block_q, head_dim), lambda i, j: (i, 0)),  # q tile i: stays along the row
                  pl.BlockSpec((block_kv, head_dim), lambda i, j: (j, 0)),  # k tile j
                  pl.BlockSpec((block_kv, head_dim), lambda i, j: (j, 0))],  # v tile j
        out_specs=pl.BlockSpec((block_q, head_dim), lambda i, j: (i, 0)),  # o tile i, written at the last j
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        scratch_shapes=[pltpu.VMEM((block_q, 128), F32),  # m
                        pltpu.VMEM((block_q, 128), F32),  # l
                        pltpu.VMEM((block_q, head_dim), F32)],  # acc
        compiler_params=None if interpret else pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
        interpret=interpret,
    )(q, k, v)


def check_against_both(name, out, q, k, v, mask=None, impl=None, **kwargs):
    """out: a one-head teaching kernel's [L, D]; q, k, v [1, L, D]. Compares with the float32 reference and with
    the stlib kernel ``impl`` on the same inputs; prints one PASSED line with both errors, else raises."""
    ref = stlib.attention(q, k, v, mask, impl="reference")[0]
    production = stlib.attention(q, k, v, mask, impl=impl, interpret=cfg.interpret, **kwargs)[0]
    err_ref, err_lib = checks.scaled_error(out, ref), checks.scaled_error(out, production)
    passed(name, max(err_ref, err_lib), tolerance(q.dtype),
           detail=f": {err_ref:.1e} vs the reference, {err_lib:.1e} vs stlib {impl}")


qt, kt, vt = stlib.random_qkv((1, 1152, 128), jnp.float32, seed=3)  # one head, 9 x 9 tiles of 128
check_against_both(f"flash_kernel, 1 x 1,152 x 128 float32, 128 x 128 tiles ({'compiled' if cfg.on_tpu else 'interpret mode'})",
                   flash_attention(qt[0], kt[0], vt[0]), qt, kt, vt, impl="pallas_dense", block_q=128, block_kv=128)

# %% [markdown]
# Compiled for v6e at a moderate shape (one head, 8,192 tokens, bf16, tiles 512 x 1,024), next to
# the production kernel at the same shape and tiles:

# %%
moderate = jax.ShapeDtypeStruct((8192, 128), jnp.bfloat16)
moderate_h = jax.ShapeDtypeStruct((1, 8192, 128), jnp.bfloat16)
for name, fn, shapes in [
    ("teaching flash_kernel", functools.partial(flash_attention, block_q=512, block_kv=1024, interpret=False),
     [moderate] * 3),
    ("stlib pallas_dense", functools.partial(stlib.attention, impl="pallas_dense", block_q=512, block_kv=1024,
                                             interpret=False), [moderate_h] * 3),
]:
    start = time.perf_counter()
    hbm = compile_for_tpu(fn, *shapes, chip="v6e").memory()
    print(f"v6e {name:<22} compiled in {time.perf_counter() - start:.1f} s: HBM arguments "
          f"{hbm['argument_size_in_bytes']:,} B, output {hbm['output_size_in_bytes']:,} B, temporaries "
          f"{hbm['temp_size_in_bytes']:,} B, code {hbm['generated_code_size_in_bytes']:,} B")
print(f"VMEM by count (both): q, o tiles x2 {4 * 512 * 128 * 2:,} B + k, v tiles x2 {4 * 1024 * 128 * 2:,} B + "
      f"m, l, acc {(2 * 128 + 128) * 512 * 4:,} B (the production kernel's allocation is checked below)")

# %% [markdown]
# The two kernels move the same bytes: what differs is what `stlib/kernels/dense.py` adds around
# the same loop. **What the production kernel adds** (`stlib/kernels/dense.py`, `dense_attention`;
# the update in `stlib/kernels/online_softmax.py`):
#
# * heads: a grid (H, q tiles, kv tiles) with the head in every index map;
# * any length: `pallas_call.pad_sequence` pads q, k, v to the blocks and the padded keys are masked
#   (`mask_info.iota_mask` with `key < length`), the output cut back;
# * a mask: evaluated in-kernel from iota for lazy masks, or read from a dense int8 copy
#   (`stlib.passes.MaskPlan`), on every tile;
# * q pre-scaled once per step (`online_softmax.scaled_q`), and the kv tile walked in chunks of
#   `block_kv_compute` keys (`online_softmax.update_tile`'s `fori_loop`) so the score tile stays small;
# * `exp2` (`online_softmax.SoftmaxOptions`): base-2 exponentials with log2 e folded into the scale;
# * a guard for rows that see no key (`online_softmax.finish_row` writes 0, not 0/0), and the
#   log-sum-exp output the tile kernel's passes need;
# * block sizes per chip from the chip table (`stlib.blocks.block_sizes_for`), validated against the
#   (8, 128) rule (`stlib.blocks.BlockSizes`), and the interpret switch (`pallas_call.run_pallas`).
#
# ### Exercise 2: the accumulate step under a mask
#
# `flash_kernel` attends to every key. The next notebooks skip and mask tiles, and a masked tile
# runs the same update with some scores refused. Write `accumulate(..., allowed, *, scale)`, the
# accumulate step for a tile whose bool `allowed` [bq, bkv] says which scores count (the kernel
# below builds it from iota and calls your step on every tile). The mask is a band |q - k| <= 100
# with two traps: every 37th key is refused to every query, and the check makes those keys loud
# (their scores far above the rest); the first 64 queries see no key at all, and their rows must
# come out 0. The check runs your step through `flash_attention` on sharp scores and compares with
# the reference under the same mask; the update of `flash_kernel` as it stands, mask ignored, gets
# NOT YET, and so do the two halves of the answer alone (the hints below).
#
# *Hint 1:* a refused score must lose the max, so give it `NEG` before the max.
# *Hint 2:* it must add nothing to l and acc either: exp(NEG - m) is 0 once m is a real score's,
# but a row whose every key so far was refused still has m = NEG there, and exp(0) = 1. Zero p
# where `allowed` is False. `exercises.show("04.accumulate")` prints a solution.

# %%
@exercises.fill_in("04.accumulate")
def accumulate(q_ref, k_ref, v_ref, m_ref, l_ref, acc_ref, allowed, *, scale):
    # --- your code here: update m_ref, l_ref and acc_ref with this step's k and v tiles,
    #     counting only the scores where allowed [bq, bkv] is True ---
    raise NotImplementedError


BAND, LOUD, SILENT = 100, 37, 64  # |q - k| <= 100, every 37th key refused, the first 64 queries see nothing


def exercise_mask(rows, cols):
    """The exercise's mask from token numbers (iota in the kernel, numpy in the check)."""
    return (abs(rows - cols) <= BAND) & (cols % LOUD != 0) & (rows >= SILENT)


def band_flash_kernel(accumulate):
    """The flash kernel with ``accumulate`` as its step, under ``exercise_mask`` from iota."""

    def kernel(q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref, *, scale):
        i, j, nk = pl.program_id(0), pl.program_id(1), pl.num_programs(1)
        bq, bkv = q_ref.shape[0], k_ref.shape[0]

        @pl.when(j == 0)
        def _init():
            m_ref[...] = jnp.full(m_ref.shape, NEG, F32)
            l_ref[...] = jnp.zeros(l_ref.shape, F32)
            acc_ref[...] = jnp.zeros(acc_ref.shape, F32)

        rows = i * bq + jax.lax.broadcasted_iota(jnp.int32, (bq, bkv), 0)  # query token numbers
        cols = j * bkv + jax.lax.broadcasted_iota(jnp.int32, (bq, bkv), 1)  # key token numbers
        accumulate(q_ref, k_ref, v_ref, m_ref, l_ref, acc_ref, exercise_mask(rows, cols), scale=scale)

        @pl.when(j == nk - 1)
        def _finish():  # a row that saw nothing has l = 0: its output is 0
            l = lanes(l_ref[...], acc_ref.shape[1])
            o_ref[...] = jnp.where(l > 0, acc_ref[...] / jnp.where(l > 0, l, 1.0), 0.0).astype(o_ref.dtype)

    return kernel


def check_kernel(accumulate):
    """Run ``accumulate`` in flash_attention under ``exercise_mask`` on sharp scores: a line for
    PASSED, or NotYet with what is wrong."""
    qx, kx, vx = stlib.random_qkv((1, 512, 128), jnp.float32, seed=7)
    qx = 4.0 * qx  # sharp softmax: the running max moves often, so a missing rescale shows
    kx = kx.at[:, ::LOUD].multiply(100.0)  # the refused keys score far above the allowed ones
    tokens = np.arange(512)
    allowed = masks.from_array(exercise_mask(tokens[:, None], tokens[None, :]))
    ref = stlib.attention(qx, kx, vx, allowed, impl="reference")[0]
    out = flash_attention(qx[0], kx[0], vx[0], interpret=cfg.interpret, kernel=band_flash_kernel(accumulate))
    if not bool(jnp.all(jnp.isfinite(out))):
        raise exercises.NotYet("the output has NaN or inf (did l stay 0 where a row saw keys, did a refused score "
                               "set the max, or did m start at -inf?)")
    silent = float(jnp.max(jnp.abs(out[:SILENT])))
    if silent != 0.0:
        raise exercises.NotYet(f"the first {SILENT} queries see no key, but their output reaches {silent:.2f} (are "
                               "refused scores kept out of l and acc, as well as out of the max?)")
    err = checks.scaled_error(out, ref)
    if not err <= tolerance(jnp.float32):
        raise exercises.NotYet(f"max error {err:.2e} against the reference under the mask (are refused scores "
                               "kept out of the max, of l and of acc?)")
    return (f"your masked flash kernel == reference under the band |q - k| <= {BAND} without every {LOUD}th key, "
            f"the first {SILENT} queries 0 (max error {err:.1e})")


exercises.verify("04.accumulate", check_kernel, accumulate)

# %% [markdown]
# ## The production kernel at the notebook's shape
#
# `stlib.attention(impl="pallas_dense")` runs that kernel for every head (at this notebook's
# workload shape); every later notebook builds on the same `update_tile`
# (`stlib/kernels/online_softmax.py`). Each step costs 4 x block_q x block_kv x D flops and
# block_q x block_kv exponentials, whatever a mask says. Off a TPU it runs in interpret mode (what
# that is: two sections below).

# %%
workload = cfg.workload
H, L, D = workload.qkv_shape
q, k, v = stlib.random_qkv(workload.qkv_shape, workload.dtype, seed=0)
dense_fn = bench.compile_function(  # compiled once: checked here, timed below
    functools.partial(stlib.attention, impl="pallas_dense", block_q=cfg.block_q, block_kv=cfg.block_kv,
                      interpret=cfg.interpret), q, k, v)
passed(f"pallas_dense ({'interpret mode' if cfg.interpret else 'compiled'}, tiles {cfg.block_q} x {cfg.block_kv}) "
       f"== reference at {H} x {L:,} x {D} {jnp.dtype(workload.dtype).name}", max_error(dense_fn(q, k, v), q, k, v), TOL);

# %%
layout = stlib.block_layout(masks.full(L), cfg.block_q, cfg.block_kv)
work = work_summary("pallas_dense", layout, H, D, jnp.dtype(workload.dtype).itemsize)
timing = bench.time_function(dense_fn, q, k, v, trials=3)  # reuses the compiled call
nq, nk = layout.grid_shape
print(f"grid (H, q tiles, kv tiles) = ({H}, {nq}, {nk}) -> {work['grid_steps']:,} steps, "
      f"{work['executed_flops'] / 1e9:.2f} GFLOP executed ({work['useful_flops'] / 1e9:.2f} useful)")
print(f"median {timing.median_ms:.1f} ms over {timing.trials} calls ({timing.compile_ms:.0f} ms to compile) "
      f"on {cfg.where}: "
      f"{timing.median_ms * 1e3 / work['grid_steps']:.0f} us per grid step"
      + ("" if cfg.on_tpu else "  <- NOT a TPU time"))
if cfg.on_tpu:
    chip = stlib.device.current_chip() or "v6e"
    print(f"{work['executed_flops'] / timing.median_ms / 1e9:.1f} TFLOP/s; the {chip} roofline for this work is "
          f"{work[f'roofline_{chip}_ms']:.2f} ms")

# %% [markdown]
# ## The teaching kernel beside the library's kernel and Splash
#
# How fast is the kernel written in view? The three kernels on the same inputs: `flash_kernel`
# above, `impl="pallas_dense"` and JAX's Splash attention without a mask (`impl="splash"`, the
# baseline of notebook 05), with the same tiles. The teaching kernel handles one head:
# `jax.vmap` runs it for every head by adding the head axis to its grid (as a parallel
# dimension), which is what `pallas_dense`'s head axis does by hand. It does not pad either, so
# the length is the largest multiple of both tiles that the workload's length holds: the first
# tokens of the same random q, k, v (the cell prints the length). Each kernel is compiled once
# and checked, then `bench.time_interleaved` times the three in a shuffled order, round after
# round, so a slow spell of the machine falls on all of them. On a TPU these are the chip's times
# at the case-study shape; off a TPU all three run in Pallas interpret mode at the small shape,
# and the times measure the interpreter, not a kernel.

# %%
tile = math.lcm(cfg.block_q, cfg.block_kv)
L_teach = L // tile * tile  # the teaching kernel does not pad: whole tiles only
qh, kh, vh = (x[:, :L_teach] for x in (q, k, v))
blocks = {"block_q": cfg.block_q, "block_kv": cfg.block_kv}
contenders = {
    "teaching flash_kernel (vmap over heads)": jax.vmap(functools.partial(flash_attention, interpret=cfg.interpret, **blocks)),
    "stlib pallas_dense": functools.partial(stlib.attention, impl="pallas_dense", interpret=cfg.interpret, **blocks),
    "Splash (no mask)": functools.partial(stlib.attention, impl="splash", interpret=cfg.interpret, **blocks),
}
print(f"{H} heads x {L_teach:,} tokens (of {L:,}: {L_teach // cfg.block_kv} kv tiles of {cfg.block_kv:,}) x {D}, "
      f"{jnp.dtype(workload.dtype).name}, tiles {cfg.block_q} x {cfg.block_kv}, "
      + ("compiled" if cfg.on_tpu else "Pallas interpret mode"))
compiled = {}
for name, fn in contenders.items():
    compiled[name] = bench.compile_function(fn, qh, kh, vh)  # compiled once: checked here, then timed
    passed(name, max_error(compiled[name](qh, kh, vh), qh, kh, vh), TOL,
           detail=f"; compiled in {compiled[name].compile_ms / 1e3:.1f} s")
rounds, trials = (2, 3) if cfg.on_tpu else (3, 3)  # a call at the case study takes about 0.2 s on a v5e
steps = H * (L_teach // cfg.block_q) * (L_teach // cfg.block_kv)
print(f"{steps:,} grid steps per call")
timings = notebook.time_side_by_side(
    cfg, compiled, qh, kh, vh, rounds=rounds, trials=trials, figure="04_teaching_vs_library",
    title=f"Teaching flash kernel vs stlib pallas_dense vs Splash, {H} x {L_teach:,} x {D} "
          f"{jnp.dtype(workload.dtype).name}, tiles {cfg.block_q} x {cfg.block_kv}",
    notebook="04_flash_attention_in_pallas", what="teaching flash kernel vs pallas_dense vs splash, no mask",
    shape=[H, L_teach, D], dtype=jnp.dtype(workload.dtype).name, blocks=blocks,
    pallas_dense_full_length={"length": L, **dataclasses.asdict(timing)})

# %% [markdown]
# ## What interpret mode is, and what it is not
#
# `pallas_call(..., interpret=True)` (what `stlib` and this notebook pass off a TPU) runs the kernel
# body as ordinary JAX operations once per grid point, in grid order, with the same index maps,
# scalar-prefetch tables, scratch buffers and copy semantics as on the chip. It is the way to test
# a TPU kernel's *logic* on a CPU: where this notebook ran off a TPU, the PASSED lines above are
# real checks of the kernels' indexing and their online softmax.
#
# It is **not**:
#
# * a timing: each grid step becomes a handful of host operations; off a TPU, the time per step and
#   the three kernels' times above measure the interpreter, not the MXU (so every CPU time in these
#   notebooks carries "not TPU times");
# * the TPU compiler: Mosaic's rules (tiles of (8, 128), supported operations, VMEM and SMEM
#   limits) are not checked;
# * TPU numerics: on the chip q kᵀ is a bf16 matmul with float32 accumulation and p·v a float32
#   one (run by the MXU in several bf16 passes); the CPU does its own thing.
#
# A concrete case: tiles of 2,048 queries x 4,096 keys. Interpret mode (asked for explicitly below,
# on any backend, at the small shape) runs them and the result is right. The TPU compiler refuses
# them at the case-study shape: the [2048, 4096] float32 score tile alone is 32 MiB of VMEM.

# %%
big = {"block_q": 2048, "block_kv": 4096}
qs, ks, vs = stlib.random_qkv(configs.SMALL_CPU.qkv_shape, jnp.float32, seed=0)
passed(f"interpret mode, {big['block_q']} x {big['block_kv']} tiles at {configs.SMALL_CPU.qkv_shape}: correct",
       max_error(stlib.attention(qs, ks, vs, impl="pallas_dense", interpret=True, **big), qs, ks, vs),
       tolerance(jnp.float32))

case = configs.CASE_STUDY
shape = jax.ShapeDtypeStruct(case.qkv_shape, jnp.bfloat16)
rejected = None
try:
    compile_for_tpu(functools.partial(stlib.attention, impl="pallas_dense", interpret=False, **big),
                    shape, shape, shape, chip="v6e")
    print("compiled (unexpected with this libtpu)")
except Exception as error:  # noqa: BLE001 - show what the compiler says
    message = str(error)
    found = re.search(r"size ([0-9.]+)M and limit ([0-9.]+)M", message)
    rejected = tuple(float(x) * 2**20 for x in found.groups()) if found else None
    print(f"v6e compiler: {type(error).__name__}: {message.splitlines()[0][:110]}")
    if rejected:
        print(f"  -> the kernel needs {rejected[0] / 2**20:.2f} MiB of scoped VMEM; "
              f"the limit is {rejected[1] / 2**20:.0f} MiB")

# %% [markdown]
# ## Compiling for a TPU without a TPU
#
# With `jax[tpu]` installed, libtpu's compiler runs on any machine: `stlib.device.compile_for_tpu`
# lowers a function for a deviceless v6e or v5e topology from abstract inputs
# (`jax.ShapeDtypeStruct`, no data) and runs the real Mosaic and XLA compilers. That is how every
# kernel in this repository is checked for the chips it targets: what compiles here compiles
# there. It gives memory use, never time. Here: the dense kernel at the full case-study shape
# (10 x 75,600 x 128, bf16) with the chip's default tiles (512 x 1,024, keys processed 512 at a time).

# %%
dense_tpu = functools.partial(stlib.attention, impl="pallas_dense", interpret=False)
for chip in ("v6e", "v5e"):
    start = time.perf_counter()
    compiled = compile_for_tpu(dense_tpu, shape, shape, shape, chip=chip)
    seconds = time.perf_counter() - start
    hbm = compiled.memory()
    print(f"{chip}: compiled in {seconds:.1f} s; HBM: arguments {hbm['argument_size_in_bytes'] / 1e6:.0f} MB, "
          f"output {hbm['output_size_in_bytes'] / 1e6:.0f} MB, temporaries {hbm['temp_size_in_bytes'] / 1e6:.0f} MB "
          f"(q, k, v padded from 75,600 to a multiple of the tile)")

# %% [markdown]
# What did the compiler put in VMEM? `stlib.compile_report` compiles in a subprocess with libtpu's
# dump switched on and reads the kernel's VMEM and SMEM allocations back. We can predict them by
# counting: q, k, v and o tiles, each double-buffered, plus the float32 scratch m, l (lane-replicated
# to 128) and acc. The score chunk [block_q, chunk] lives in the compiler's own temporary space: it
# is not in this report, but it counts against the same scoped-VMEM limit (that is what sank the
# 2,048 x 4,096 tiles above).

# %%
def vmem_by_count(block_q, block_kv, chunk, head_dim=128, itemsize=2):
    """Bytes of the dense kernel's VMEM by part (double-buffered tiles, f32 scratch, f32 scores)."""
    return {
        "q, o tiles (x2 buffers)": 2 * 2 * block_q * head_dim * itemsize,
        "k, v tiles (x2 buffers)": 2 * 2 * block_kv * head_dim * itemsize,
        "m, l, acc scratch (f32)": (2 * 128 + head_dim) * block_q * 4,
        "score chunk (f32, compiler temporary)": block_q * chunk * 4,
    }


rows = []
for block_q, block_kv, chunk in [(512, 1024, 512), (1024, 2048, 2048)]:
    explicit = (block_q, block_kv) != (512, 1024)  # explicit tiles are processed whole (no chunking)
    parts = vmem_by_count(block_q, block_kv, chunk)
    buffers = sum(v for name, v in parts.items() if "temporary" not in name)
    try:  # a subprocess compiles with libtpu's dump on
        report = compile_report(KernelConfig(impl="pallas_dense", chip="v6e", block_q=block_q if explicit else None,
                                             block_kv=block_kv if explicit else None))
    except Exception as error:  # noqa: BLE001 - say why, and show the count alone
        print(f"        {block_q} x {block_kv} tiles: {buffers:,} B counted; no compiler report on this machine "
              f"({type(error).__name__}: {(str(error).splitlines() or [''])[0][:100]}), so no marker for it")
        rows.append({"label": f"{block_q} x {block_kv}, chunk {chunk}", "parts": parts, "compiler": None})
        continue
    (kernel, spaces), = report["kernels"].items()
    assert spaces["vmem"] == buffers, (spaces, parts)
    print(f"PASSED  {block_q} x {block_kv} tiles: compiler allocated {spaces['vmem']:,} B of VMEM == {buffers:,} B "
          f"counted (max error 0 B); SMEM {spaces.get('smem', 0)} B; compiled in {report['compile_seconds']:.1f} s")
    rows.append({"label": f"{block_q} x {block_kv}, chunk {chunk}", "parts": parts, "compiler": spaces["vmem"]})
rows.append({"label": "2048 x 4096, chunk 4096\n(rejected by the compiler)", "parts": vmem_by_count(2048, 4096, 4096),
             "compiler_total": rejected[0] if rejected else None})
if rejected:
    print(f"2048 x 4096 tiles: {sum(rows[-1]['parts'].values()) / 2**20:.2f} MiB counted with the score tile, "
          f"{rejected[0] / 2**20:.2f} MiB in the compiler's message (the rest: its other temporaries)")
limit = rejected[1] if rejected else None
fig = plotting.vmem_bars(rows, "pallas_dense VMEM on v6e at 10 x 75,600 x 128 bf16: counted (bars), "
                         "compiled without a TPU (markers)",
                         limit_bytes=limit, limit_label=f"v6e scoped-VMEM limit ({limit / 2**20:.0f} MiB, from the "
                         "compiler's message)" if limit else "limit")
plotting.save(fig, cfg.figure("04_vmem"))

# %% [markdown]
# For the tiles that compile, the count is exactly what the compiler allocated. For the rejected
# tiles, the count with the score tile (41 MiB) comes close to what the compiler's message asked
# for (the rest is the compiler's other temporaries): the score tile is what breaks the limit.
# A v6e has 128 MiB of VMEM (notebook 00's hardware table), but a kernel gets a scoped slice of
# it; tiles of 512 x 1,024 use a few MiB and leave room for bigger tiles or deeper pipelines.
#
# ## Takeaway
#
# Flash attention is the online softmax run tile by tile: m, l and acc per query, rescaled by
# exp(m - m') when the maximum grows, and the [L, L] scores never exist. In Pallas this is a grid
# (heads, q tiles, kv tiles) with index maps that move one tile of each array into VMEM per step.
# Interpret mode checks the logic on a CPU; the deviceless compiler checks what the chip would
# reject (tile shapes, VMEM); neither says how fast the kernel is: only the chip does (the timing
# section, run on a TPU). And this kernel visits every tile: a mask would only add work. Notebook
# 05 skips tiles.
#
# ## Questions
#
# 1. How much VMEM (by the count above) do tiles of 256 x 2,048 processed 512 keys at a time need?
#    Would `compile_report` show more or less than that, and why?
# 2. Why must the kv axis of the grid be "arbitrary" while heads and q tiles may be "parallel"?
# 3. The teaching version starts `m` at -inf; the kernel starts it at a large finite negative
#    number (`stlib.reference.MASK_VALUE`). What goes wrong with -inf once a mask hides a whole key
#    block from some row?
#
# <details><summary>Answers</summary>
#
# 1. `vmem_by_count(256, 2048, 512)`: q, o 256 KiB + k, v 2 MiB + scratch 384 KiB + scores 512 KiB
#    = 3.1 MiB. `compile_report` shows the first three (2.6 MiB): the score chunk is a compiler
#    temporary, not a scoped allocation of the kernel.
# 2. The kv steps of one q tile share the scratch m, l, acc: step j + 1 needs the state step j
#    left, and the output is written at the last kv step. Different heads and q tiles share nothing,
#    so a device with two TensorCores (a megacore) may split those axes between its cores.
# 3. A row with every score in the block masked to -inf keeps m_new = -inf, and exp(s - m_new)
#    computes exp(-inf - (-inf)) = exp(nan): the row's l and acc become NaN for good. With a finite
#    MASK_VALUE the difference is 0 or a huge negative number, whose exponential is 1 (then zeroed
#    by the mask) or 0.
#
# </details>
