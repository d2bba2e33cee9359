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
# # 00 · The problem and the hardware
#
# Video diffusion transformers spend most of their time in self-attention over tens of thousands
# of tokens. This notebook counts that cost for the workload of the case study this project
# reproduces (Google for Developers blog, 2026-09-30, "Accelerating Spatio-Temporal Attention for
# Video Diffusion on TPUs": one TPU v6e, 75,600 tokens, 10 heads, head dim 128; dense Splash
# 78.70 ms, tile-aligned sparse kernel 32.76 ms) and sets it against what the TPUs of the hardware
# table below (v5e, v6e, TPU7x) can do.
#
# Every number a cell prints comes from `stlib`; the notebook explains, and the answers at the end
# work a few more by hand.

# %% tags=["parameters"]
SIZE = None  # "full", "small" or None (automatic: case-study sizes on a TPU, small elsewhere); env STLIB_SIZE wins

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

import stlib
from stlib import configs, masks, notebook, plotting
from stlib.device import CHIP_TABLE, CHIPS
from stlib.roofline import bytes_moved, kernel_work, roofline

cfg = notebook.setup(SIZE)

# %% [markdown]
# ## Where 75,600 tokens come from
#
# Wan 2.1 / 2.2 generate 81 frames at 720 x 1280. The causal VAE keeps the first frame and
# compresses the rest 4x in time and 8x in space; 2 x 2 patchification halves each spatial side
# again. Every token attends to every other token in every block of the model (Wan 14B has 40),
# at every denoising step.

# %%
grid_720p = configs.wan_latent_grid(81, 720, 1280)
grid_480p = configs.wan_latent_grid(81, 480, 832)
for name, grid in [("720p", grid_720p), ("480p", grid_480p)]:
    print(f"{name}: T x Y x X = {grid.shape} -> {grid.num_tokens:,} tokens ({grid.tokens_per_frame:,} per frame)")
print(f"75,600 = {grid_720p.num_tokens}: not a multiple of 128 -> every kernel meets a ragged last tile "
      f"({grid_720p.num_tokens % 128} tokens)")

# %% [markdown]
# ## Attention's share of the cost
#
# A Wan 14B block has width 5,120 (40 heads of 128). Its linear layers cost O(L d²); its
# self-attention costs O(L² d). At 75,600 tokens the quadratic term wins by a wide margin.

# %%
shares = {f"{name} ({g.num_tokens:,} tokens)": configs.WAN_14B.flops(g.num_tokens)
          for name, g in [("480p", grid_480p), ("720p", grid_720p)]}
for label, parts in shares.items():
    total = sum(parts.values())
    print(f"{label}: {total / 1e12:,.0f} TFLOP per block, self-attention {parts['self-attention (QK^T and PV)'] / total:.0%}")
fig = plotting.cost_breakdown(shares, "Wan 14B block, forward flops by part (computed, hardware-independent)")
plotting.save(fig, cfg.figure("00_cost_share"))

# %% [markdown]
# ## The hardware table
#
# Every hardware number in these notebooks comes from one table, `stlib.device.CHIP_TABLE`,
# which reads JAX's own per-chip figures (`pltpu.get_tpu_info_for_chip`) and adds the compiler's
# default scoped-VMEM limit. Numbers are per device, except the last three rows: a TPU7x chip shows
# its two TensorCores as two devices, each with half the chip's HBM and bandwidth and its own VMEM
# and SMEM, so its per-chip rows are twice its per-device ones (on v5e and v6e a chip is one
# device). Later notebooks refer back to this table instead of repeating its numbers.

# %%
MIB = 1 << 20
hardware = {
    "peak bf16 TFLOP/s": lambda c: f"{c.bf16_flops / 1e12:,.0f}",
    "HBM GB": lambda c: f"{c.hbm_capacity / 1e9:,.1f}",
    "HBM bandwidth TB/s": lambda c: f"{c.hbm_bandwidth / 1e12:.2f}",
    "ridge (flop / byte)": lambda c: f"{c.bf16_flops / c.hbm_bandwidth:,.0f}",
    "VMEM MiB": lambda c: f"{c.vmem_bytes / MIB:,.0f}",
    "scoped-VMEM default MiB": lambda c: f"{c.scoped_vmem_default / MIB:,.0f}",
    "SMEM KiB": lambda c: f"{c.smem_bytes / 1024:,.0f}",
    "MXUs (count x width)": lambda c: f"{c.num_mxus} x {c.mxu_width}x{c.mxu_width}",
    "devices per chip": lambda c: f"{c.devices_per_chip}",
    "per chip: peak bf16 TFLOP/s": lambda c: f"{c.devices_per_chip * c.bf16_flops / 1e12:,.0f}",
    "per chip: HBM GB": lambda c: f"{c.devices_per_chip * c.hbm_capacity / 1e9:,.1f}",
    "per chip: HBM bandwidth TB/s": lambda c: f"{c.devices_per_chip * c.hbm_bandwidth / 1e12:.2f}",
}
header = ["per device", *CHIPS]
rows = [[name] + [fmt(CHIP_TABLE[chip]) for chip in CHIPS] for name, fmt in hardware.items()]
widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
for row in [header, *rows]:
    print("  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths))))
try:  # rendered as a table in Jupyter; the printed one above is what a plain terminal shows
    from IPython.display import Markdown, display

    display(Markdown("\n".join(["| " + " | ".join(header) + " |", "|---" * len(header) + "|",
                                 *("| " + " | ".join(row) + " |" for row in rows)])))
except ImportError:
    pass

# %% [markdown]
# ## The words the series uses
#
# **The chip.** A TPU core has three memories: **HBM** (17 to 103 GB per device, off the core; the
# table's "HBM GB" and bandwidth rows), **VMEM** (64 to 128 MiB of fast vector memory next to the compute units, the table's
# "VMEM MiB"; a kernel's tiles live there) and **SMEM** (about a MiB of scalar memory, the table's
# "SMEM KiB"; step tables live there). A
# kernel's share of VMEM is **scoped VMEM** (the compiler's default, or the kernel's own
# `vmem_limit_bytes`). The **MXU** is the matrix unit (the table's count x width); the **VPU** does
# element-wise vector work, the **EUP** exponentials and the **XLU** moves data across lanes. A
# **vreg** (vector register) holds 8 **sublanes** x 128 **lanes** of 32-bit values, so arrays whose
# last two dimensions are multiples of (8, 128) fill registers exactly. A **TensorCore** is one core;
# **megacore** (v4, v5p) lets two cores split a kernel's "parallel" grid axes; v5e and v6e have one
# TensorCore per chip, and a TPU7x chip shows its two as two devices.
#
# **The kernels.** **Pallas** writes TPU kernels in Python; **Mosaic** compiles them. A kernel runs
# over a **grid** of **steps**; each step works on one **tile** (block) of each array, copied to
# VMEM by the pipeline. **Interpret mode** runs a kernel on the CPU for its arithmetic;
# **deviceless compilation** compiles it for a TPU that is not there, with libtpu. **Flash
# attention** computes attention tile by tile with an **online softmax** (a running max and sum per
# query) and never builds the L x L scores; its **log-sum-exp** per query is what a second pass, a
# merge or the backward needs. **Splash** is JAX's sparse flash attention for TPUs
# (`jax.experimental.pallas.ops.tpu.splash_attention`), the baseline of the case study.
#
# **Sparsity.** A **mask** says which (query, key) pairs are allowed; its **density** is the
# allowed fraction. Cut into tiles, a tile is **EMPTY** (nothing allowed: skipped), **FULL**
# (everything allowed: computed without a mask) or **PARTIAL** (computed with the mask). The
# **occupancy** is the non-empty fraction of the tiles, the **work efficiency** allowed pairs over
# computed pairs. A **step table** (in SMEM, **scalar prefetch**) tells each grid step which tile
# to compute; a **compacted grid** runs only non-empty tiles: one step each (a flat grid), or a row
# of steps per q tile padded to the widest row (a rows grid, notebook 03). **Token reordering**
# permutes the tokens (raster order t, y, x; **token-major** y, x, t; **3-D tiled**) so that a mask
# becomes FULL and EMPTY tiles. **Sparse VideoGen** (SVG) routes each head to a spatial or a
# temporal pattern; **Sliding Tile Attention** (STA) lets a 3-D tile of tokens see the tiles around
# it.
#
# **Speed.** The **roofline** bounds a kernel's time by its flops at the peak or its bytes at the HBM
# bandwidth, whichever is longer; their ratio, flop per byte, is its **arithmetic intensity**, and
# the **ridge** (the table's row) is the intensity above which the peak is the limit. A **static
# estimate** (notebook 08) reads a compiled kernel's schedule as a stopwatch, at a clock calibrated on
# one published timing; it is never a measurement.

# %% [markdown]
# ## Flops and bytes of dense attention at the case-study shape
#
# Per head, QK^T and PV are two L x L x D matrix products: 4 L² D flops (two per multiply-add).
# The inputs and the output are only 4 x H x L x D values. First, a check that the formula is
# the count XLA itself reports for plain attention on a small shape (the cost analysis of the
# program compiled for this backend).

# %%
H, L, D = 2, 512, 128
shape = jax.ShapeDtypeStruct((H, L, D), jnp.float32)
# the compiled program's count: on a TPU only a compiled executable has a cost analysis (lowered: None)
compiled = jax.jit(lambda q, k, v: stlib.attention(q, k, v, impl="reference")).lower(shape, shape, shape).compile()
xla_flops = compiled.cost_analysis()["flops"]
formula = 4 * L * L * D * H
rel_err = abs(xla_flops - formula) / formula
assert rel_err < 0.02, rel_err  # XLA also counts the softmax's few elementwise flops per score
print(f"PASSED  4 L^2 D H = {formula:.4g} vs XLA cost analysis {xla_flops:.4g} on {jax.default_backend()} "
      f"(relative difference {rel_err:.2e})")

# %%
case = configs.CASE_STUDY
flops = case.dense_flops()
nbytes = 4 * case.num_heads * case.num_tokens * case.head_dim * 2  # q, k, v, o in bf16
print(f"case study: {case.num_heads} heads x {case.num_tokens:,} tokens x {case.head_dim}: "
      f"{flops:.3g} flop, {nbytes / 1e6:.0f} MB moved at least -> {flops / nbytes:,.0f} flop per byte")
for chip in CHIPS:
    bound = roofline(chip, flops, nbytes)
    print(f"  {chip}: compute floor {bound.compute_seconds * 1e3:6.1f} ms, memory floor {bound.memory_seconds * 1e3:5.3f} ms "
          f"-> {bound.bound}-bound with each byte moved once (one device)")
v6e_floor = roofline("v6e", flops, nbytes).seconds * 1e3
print(f"published dense Splash on one v6e: {configs.PUBLISHED['dense_splash_ms']} ms, "
      f"{v6e_floor / configs.PUBLISHED['dense_splash_ms']:.0%} of the v6e peak; "
      f"the sparse kernel's 32.76 ms is {v6e_floor / configs.PUBLISHED['tile_aligned_sparse_ms']:.2f}x the dense floor's speed")

# %%
points = [{"label": "dense attention, case study", "flops": flops, "bytes": nbytes}]  # a grid step's: next section
fig = plotting.roofline_chart(list(CHIPS), points, "Dense attention, each byte counted once, sits right of the ridge")
plotting.save(fig, cfg.figure("00_roofline"))

# %% [markdown]
# ## The roofline per grid step
#
# Counting q, k, v and o once is the lower bound on bytes, and no flash kernel meets it. Its grid
# walks the kv tiles once for *every* q tile: a step computes 4 x block_q x block_kv x D flops on one
# k and one v tile it just copied in (2 x block_kv x D x 2 bytes in bf16), while q stays in VMEM for
# the whole row. So a step's arithmetic intensity is
#
#     4 block_q block_kv D / (4 block_kv D) = block_q flop per byte (bf16),
#
# whatever block_kv is. Set against the ridge of the hardware table, a kernel with 512-row q tiles is
# memory-bound on v6e, however compute-bound attention is overall. The cell works the problem for
# dense Splash at 512 x 1,024 tiles on v6e, with the library's work model (`kernel_work`,
# `bytes_moved`: q and o once per row of tiles, a k and a v tile per computed step).

# %%
dense_layout = stlib.block_layout(masks.full(case.num_tokens), 512, 1024)
for block_q in (512, 1024, 2048):
    step = {"flops": 4 * block_q * 1024 * case.head_dim, "bytes": 2 * 1024 * case.head_dim * 2}
    verdicts = ", ".join(f"{chip} {'memory' if step['flops'] / step['bytes'] < CHIP_TABLE[chip].bf16_flops / CHIP_TABLE[chip].hbm_bandwidth else 'compute'}"
                         for chip in CHIPS)
    print(f"block_q {block_q:>5}: {step['flops'] / step['bytes']:,.0f} flop per byte -> {verdicts}-bound")
work = kernel_work("splash", dense_layout, case.num_heads, case.head_dim)
moved = bytes_moved(work, dense_layout, case.num_heads, case.head_dim, 2)
splash_floor = roofline("v6e", work.executed_flops, moved)
print(f"dense Splash, 512 x 1,024 tiles, v6e: {work.grid_steps:,} steps move {moved / 1e9:.1f} GB (k and v re-read by "
      f"each of {dense_layout.grid_shape[0]} q tiles): DMA floor {splash_floor.memory_seconds * 1e3:.2f} ms against a "
      f"compute floor of {splash_floor.compute_seconds * 1e3:.2f} ms -> {splash_floor.bound}-bound")
points = [
    {"label": "dense attention, each byte once", "flops": flops, "bytes": nbytes},
    {"label": "grid step, 512-row q tile", "flops": 4 * 512 * 1024 * 128, "bytes": 2 * 1024 * 128 * 2},
    {"label": "grid step, 2,048-row q tile", "flops": 4 * 2048 * 1024 * 128, "bytes": 2 * 1024 * 128 * 2},
]
fig = plotting.roofline_chart(list(CHIPS), points, "Per grid step, a flash kernel's intensity is block_q: "
                              "512-row tiles are memory-bound on v6e")
plotting.save(fig, cfg.figure("00_roofline_step"))

# %% [markdown]
# **Worked problem.** Why does dense Splash at 512 x 1,024 tiles have a DMA floor above its compute
# floor on v6e, and what would remove it? *Answer:* each step's intensity is 512 flop per byte,
# below the v6e ridge (the hardware table), so the k and v copies take longer than the matrix work.
# Over the grid that is every kv tile copied once per q tile: the cell prints the bytes and the two
# floors. Doubling block_q halves the copies and doubles the intensity (the 1,024 and 2,048 rows
# above); the price is VMEM for the larger tiles and fewer, longer grid steps. This is why the
# tile kernels of notebooks 06 and 07 take large blocks, and why the block sweep (notebook 07)
# tries q tiles of up to several thousand rows.

# %% [markdown]
# ## Takeaway
#
# Self-attention is most of a 720p Wan block's flops (the share printed above). Counted with each
# byte once, it is compute-bound, and the v6e floor printed above is far below the published dense
# Splash time; per grid step, a flash kernel re-reads k and v for every q tile, so small q tiles
# are memory-bound and large ones are needed to reach the compute floor. The only way below that
# floor is to compute fewer pairs: sparsity. The next notebooks show why a sparse mask alone does
# not deliver that.
#
# ## Questions
#
# 1. How many tokens does Wan produce for 121 frames at 720p, and how much more does dense
#    attention cost than at 81 frames?
# 2. At what sequence length does self-attention become half of a Wan 14B block's flops?
# 3. Which chip is further from its dense floor on this workload if a v5e takes 4x the v6e time?
#
# <details><summary>Answers</summary>
#
# 1. `configs.wan_latent_grid(121, 720, 1280)` gives 31 x 45 x 80 = 111,600 tokens; attention
#    grows with L², so (111,600 / 75,600)² = 2.18x.
# 2. Attention is 4 L² d; the rest is L d (12 d + 4 f + 4 x 512) + 4 x 512 x d². Setting them
#    equal gives L ≈ (12 d + 4 f + 2048) / 4 ≈ 29,700 tokens: just below 480p, where
#    `configs.WAN_14B.flops` gives 52%.
# 3. The v5e floor is 148.5 ms (its peak, in the hardware table, is 4.7x below the v6e's):
#    4 x 78.7 = 315 ms would be 47% of its peak against
#    the v6e's 40%, so the v6e would be further from its floor (its exponentials and vector work
#    did not grow as much as its matrix units).
#
# </details>
