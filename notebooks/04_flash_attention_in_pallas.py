# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 04 · Flash attention in Pallas
#
# Plain attention materialises the [L, L] score matrix: at the case-study shape that is
# 10 x 75,600² float32 scores, 229 GB, far beyond any chip. Flash attention never builds it: it
# walks over the keys one tile at a time and keeps a running softmax per query (the *online
# softmax*). This notebook writes that algorithm in a few lines of jnp, then runs the dense Pallas
# kernel that does the same thing tile by tile in TPU VMEM (`impl="pallas_dense"`), explains what
# Pallas interpret mode does and does not tell you, and compiles the kernel for TPU v6e and v5e on
# a machine without a TPU, reading back how much VMEM the compiler allocated.

# %% tags=["parameters"]
SIZE = None  # "full", "small" or None (automatic: case-study sizes on a TPU, small elsewhere); env STLIB_SIZE wins

# %%
import sys
from pathlib import Path

# find stlib when the repository is cloned but not installed
repo = next((p for p in [Path.cwd(), *Path.cwd().parents] if (p / "stlib" / "__init__.py").is_file()), None)
if repo is not None and str(repo) not in sys.path:
    sys.path.insert(0, str(repo))

import functools
import re
import time

import jax
import jax.numpy as jnp

import stlib
import stlib.kernels  # registers the Pallas kernels with stlib.attention
from stlib import bench, configs, masks, notebook, plotting
from stlib.analysis import KernelConfig, compile_report
from stlib.device import compile_for_tpu
from stlib.roofline import work_summary

cfg = notebook.setup(SIZE)
max_error, tolerance = notebook.max_error, notebook.tolerance  # checks against the plain reference

TOL = tolerance(cfg.workload.dtype)

# %% [markdown]
# ## The online softmax, in jnp
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
err = float(jnp.max(jnp.abs(online_softmax_attention(q, k, v, block_kv=128) - stlib.attention(q, k, v))))
assert err < tolerance(jnp.float32), err
print(f"PASSED  online softmax (8 key blocks of 128) == stlib reference (max error {err:.2e})")
print(f"scores held at once: [2, 1024, 128] = {2 * 1024 * 128 * 4 / 2**20:.1f} MiB instead of "
      f"[2, 1024, 1024] = {2 * 1024 * 1024 * 4 / 2**20:.1f} MiB; at the case-study shape one [512, 512] "
      f"float32 chunk (1 MiB) instead of {10 * 75_600**2 * 4 / 1e9:.0f} GB")

# %% [markdown]
# ## The dense Pallas kernel
#
# `stlib/kernels/dense.py` is that loop as a Pallas TPU kernel. Pallas splits the work into a
# *grid* of steps; for each step, `BlockSpec` index maps say which tile of each array to copy
# from HBM into VMEM, and the kernel body sees only those tiles:
#
# ```python
# grid = (H, L / block_q, L / block_kv)            # (head h, q tile i, kv tile j), j innermost
# q: BlockSpec((None, block_q, D),  lambda h, i, j: (h, i, 0))
# k, v: BlockSpec((None, block_kv, D), lambda h, i, j: (h, j, 0))
# scratch: m, l [block_q, 128] and acc [block_q, D] in float32 VMEM, alive across steps
#
# def kernel(q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref):
#     @pl.when(j == 0)         init m = -big, l = 0, acc = 0
#     update_tile(...)         the online-softmax step above, on one [block_q, block_kv] tile
#     @pl.when(j == nk - 1)    o = acc / l
# ```
#
# The kv axis is declared `"arbitrary"` (it carries m, l and acc from step to step, so it runs in
# order); heads and q tiles are `"parallel"`. While step j computes, the pipeline already copies
# the k and v tiles of step j + 1: every input is double-buffered in VMEM. The same
# `update_tile` (`stlib/kernels/common.py`) serves every kernel of the following notebooks. Each
# step costs 4 x block_q x block_kv x D flops and block_q x block_kv exponentials, whatever the
# mask says. Off a TPU, the kernel runs in interpret mode (next section).

# %%
workload = cfg.workload
H, L, D = workload.qkv_shape
q, k, v = stlib.random_qkv(workload.qkv_shape, workload.dtype, seed=0)
dense_fn = functools.partial(stlib.attention, impl="pallas_dense", block_q=cfg.block_q, block_kv=cfg.block_kv,
                             interpret=cfg.interpret)
out = dense_fn(q, k, v)
err = max_error(out, q, k, v)
assert err < TOL, err
print(f"PASSED  pallas_dense ({'interpret mode' if cfg.interpret else 'compiled'}, tiles {cfg.block_q} x "
      f"{cfg.block_kv}) == reference at {H} x {L:,} x {D} {jnp.dtype(workload.dtype).name} (max error {err:.2e})")

# %%
layout = stlib.block_layout(masks.full(L), cfg.block_q, cfg.block_kv)
work = work_summary("pallas_dense", layout, H, D, jnp.dtype(workload.dtype).itemsize)
timing = bench.time_function(dense_fn, q, k, v, trials=3)
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
# ## What interpret mode is, and what it is not
#
# `pallas_call(..., interpret=True)` (what `stlib` passes off a TPU) runs the kernel body on the
# CPU once per grid point, in grid order, with the same index maps, scalar-prefetch tables, scratch
# buffers and copy semantics as on the chip. It is the way to test a TPU kernel's *logic*: the
# PASSED line above is a real check of the kernel's indexing and its online softmax.
#
# It is **not**:
#
# * a timing: each grid step becomes a handful of CPU operations; the time per step above measures
#   the interpreter, not the MXU (so every CPU time in these notebooks carries "not TPU times");
# * the TPU compiler: Mosaic's rules (tiles of (8, 128), supported operations, VMEM and SMEM
#   limits) are not checked;
# * TPU numerics: the MXU multiplies bf16 with float32 accumulation; the CPU does its own thing.
#
# A concrete case: tiles of 2,048 queries x 4,096 keys. Interpret mode runs them and the result is
# right. The TPU compiler refuses them at the case-study shape: the [2048, 4096] float32 score tile
# alone is 32 MiB of VMEM.

# %%
big = {"block_q": 2048, "block_kv": 4096}
qs, ks, vs = stlib.random_qkv(configs.SMALL_CPU.qkv_shape, jnp.float32, seed=0)
err = max_error(stlib.attention(qs, ks, vs, impl="pallas_dense", interpret=True, **big), qs, ks, vs)
assert err < tolerance(jnp.float32), err
print(f"PASSED  interpret mode, {big['block_q']} x {big['block_kv']} tiles at {configs.SMALL_CPU.qkv_shape}: "
      f"correct (max error {err:.2e})")

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
    report = compile_report(KernelConfig(impl="pallas_dense", chip="v6e", block_q=block_q if explicit else None,
                                         block_kv=block_kv if explicit else None))
    (kernel, spaces), = report["kernels"].items()
    parts = vmem_by_count(block_q, block_kv, chunk)
    buffers = sum(v for name, v in parts.items() if "temporary" not in name)
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
# VMEM is 128 MiB per chip, but a kernel gets a scoped slice of it; tiles of 512 x 1,024 use a few
# MiB and leave room for bigger tiles or deeper pipelines.
#
# ## Takeaway
#
# Flash attention is the online softmax run tile by tile: m, l and acc per query, rescaled by
# exp(m - m') when the maximum grows, and the [L, L] scores never exist. In Pallas this is a grid
# (heads, q tiles, kv tiles) with index maps that move one tile of each array into VMEM per step.
# Interpret mode checks the logic on a CPU; the deviceless compiler checks what the chip would
# reject (tile shapes, VMEM); neither says how fast the kernel is. And this kernel visits every
# tile: a mask would only add work. Notebook 05 skips tiles.
#
# ## Exercises
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
#    so a chip with two TensorCores (or megacore) may split those axes between cores.
# 3. A row with every score in the block masked to -inf keeps m_new = -inf, and exp(s - m_new)
#    computes exp(-inf - (-inf)) = exp(nan): the row's l and acc become NaN for good. With a finite
#    MASK_VALUE the difference is 0 or a huge negative number, whose exponential is 1 (then zeroed
#    by the mask) or 0.
#
# </details>
