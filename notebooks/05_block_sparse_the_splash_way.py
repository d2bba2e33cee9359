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
# # 05 · Block-sparse attention, the Splash way
#
# The dense kernel of notebook 04 visits every (q tile, kv tile) pair. A block-sparse kernel reads
# the mask's tile layout (notebook 03) *before* it runs and, at every grid step, decides whether to
# compute at all. This notebook builds that kernel from scratch (`impl="pallas_block_sparse"`),
# the way JAX's Splash attention does it: skip with `pl.when`, steer with scalar-prefetched
# tables, and make skipped steps fetch nothing. Then it runs Splash itself, and makes the case
# study's lesson visible: a sparse mask is not automatically faster than dense attention.

# %% tags=["parameters"]
SIZE = None  # "full", "small" or None (automatic: case-study sizes on a TPU, small elsewhere); env STLIB_SIZE wins

# %%
import sys
from pathlib import Path

# find stlib when the repository is cloned but not installed
repo = next((p for p in [Path.cwd(), *Path.cwd().parents] if (p / "stlib" / "__init__.py").is_file()), None)
if repo is not None and str(repo) not in sys.path:
    sys.path.insert(0, str(repo))

import dataclasses
import functools

import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask_info

import stlib
import stlib.kernels  # registers the Pallas kernels with stlib.attention
from stlib import bench, configs, masks, notebook, plotting
from stlib.kernels.block_sparse import step_table
from stlib.kernels.splash import splash_blocks, splash_mask
from stlib.layout import smem_bytes
from stlib.layout_catalog import case_study_masks
from stlib.roofline import work_summary

cfg = notebook.setup(SIZE)
max_error, tolerance = notebook.max_error, notebook.tolerance  # checks against the plain reference

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
err = max_error(out, q, k, v, band)
assert err < TOL, err
print(f"PASSED  pallas_dense with the band == reference (max error {err:.2e}); "
      f"tiles computed: {work_summary('pallas_dense', layout, H, D)['computed_tiles']:,} "
      f"of {H * layout.kinds[0].size:,}")

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
          f"table {tab.shape} = {smem_bytes(tab.shape):,} B of SMEM")

# %%
out = stlib.attention(q, k, v, band, impl="pallas_block_sparse", **kernel_args)
err = max_error(out, q, k, v, band)
assert err < TOL, err
print(f"PASSED  pallas_block_sparse with the band == reference (max error {err:.2e})")

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
err = max_error(out, q, k, v, band)
assert err < TOL, err
print(f"PASSED  splash with the band == reference (max error {err:.2e})")

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
# ## The lesson: a sparse mask that is not faster than dense
#
# Splash, the dense kernel and the block-sparse kernel, without a mask, with the band, and with a
# second mask that shows the real trap: sliding-tile
# attention (each query sees the tokens of nearby 3-D tiles) in raster token order. Its density is
# low, but in raster order its allowed pairs are scattered over most tiles, and every one of
# them is PARTIAL. First the times measured here, then the hardware-independent work of the same
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
records, work_records = [], []
for label, impl, mask, case_mask in runs:
    fn = functools.partial(stlib.attention, mask=mask, impl=impl, **kernel_args)
    err = max_error(fn(q, k, v), q, k, v, mask)
    assert err < TOL, (label, err)
    timing = bench.time_function(fn, q, k, v, trials=3)
    here = stlib.block_layout(mask or masks.full(L), cfg.block_q, cfg.block_kv)
    records.append({**environment, "interpret": cfg.interpret, "label": label, "density": here.density,
                    **dataclasses.asdict(timing)})
    lay = stlib.block_layout(case_mask or masks.full(case.num_tokens), 512, 1024)
    work = work_summary(impl, lay, case.num_heads, case.head_dim, 2)
    if impl == "splash" and case_mask is not None:
        work["grid_steps"] = splash_steps  # Splash shrinks its grid (above); the generic model does not
    work_records.append({"label": label, **work})
    print(f"PASSED {label:<44} density {here.density:.3f}  max error {err:.1e}  median {timing.median_ms:7.1f} ms"
          + ("" if cfg.on_tpu else " (interpret mode, NOT a TPU time)")
          + f" | case-study shape: {work['grid_steps']:>7,} steps, executed/useful flops {work['flop_ratio']:.2f}, "
          f"v6e roofline {work['roofline_v6e_ms']:.1f} ms")

fig = plotting.latency_bars(records, f"Measured at {H} x {L:,} x {D} ({jnp.dtype(workload.dtype).name}), "
                            f"tiles {cfg.block_q} x {cfg.block_kv}")
plotting.save(fig, cfg.figure("05_measured_times"))
fig = plotting.work_bars(work_records, "Hardware-independent work at the case-study shape (10 x 75,600 x 128, "
                         "512 x 1,024 tiles): computed, not measured")
plotting.save(fig, cfg.figure("05_work"))

# %% [markdown]
# Read the two figures side by side. On a CPU the measured times are interpreter times: the
# operations of each kernel body are dispatched one by one, so the times reflect how a body is
# written as much as how much work it does (Splash's body interprets several times faster than
# stlib's, with or without a mask), and they say nothing about a TPU. The work does not depend on
# the machine:
#
# * `pallas_dense` executes the same flops with the band as without it: 4x the useful work at
#   density 0.25, plus a mask evaluated on every tile. A mask inside a dense kernel saves nothing.
# * Skipping EMPTY tiles brings the band to within 5% of the useful flops, but the block-sparse
#   kernel still walks all 109,520 grid steps (Splash shrinks its grid to 31,080).
# * The sliding-tile mask in raster order defeats skipping: every occupied tile is PARTIAL, so
#   the block-sparse kernel executes about 3x the useful flops *and* masks every tile it computes.
#   On the small shape every tile is occupied: block-sparse is dense attention plus masking.
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
# ## Exercises
#
# 1. How many bytes of SMEM would the step table of the density-0.25 band take at the case-study
#    shape with 128 x 128 tiles? Does it fit the 1 MiB of a v5e / v6e? (`stlib.layout.smem_bytes`)
# 2. A skipped step *before* a row's first non-empty tile fetches that first tile rather than,
#    say, tile 0. Why is this free?
# 3. Splash shrank its grid for the band. Would it for a per-head mask with spatial and temporal
#    heads? What would the shrunk width be if it did?
#
# <details><summary>Answers</summary>
#
# 1. 75,600 / 128 rounds up to 591 tiles per side: a [1, 591, 591] int32 table, padded in SMEM to
#    592 x 640 words = 1,515,520 bytes. It does not fit; with 512 x 1,024 tiles the table is
#    [1, 148, 74] = 77,824 bytes. Per-head masks multiply it by the number of distinct heads.
# 2. The row's first computed step needs that tile anyway; fetching it at the first skipped step
#    starts the copy earlier, and the following skipped steps keep the same block index, so the
#    pipeline issues no further copy until the tile changes.
# 3. No: `process_mask` shrinks only when every head shares one mask (one unique mask per head
#    shard). Shrinking all heads to one width would have to use the widest row over every head.
#
# </details>
