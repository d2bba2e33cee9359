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
# # 06 · Tile-aligned sparse attention
#
# Notebook 05 ended with a mask whose pairs are scattered over many PARTIAL tiles, where skipping
# buys little. The way out is to make the mask *tile-aligned*: mostly FULL and EMPTY tiles. This
# notebook walks through the four pieces of the tile-aligned kernel (`impl="pallas_tile"`,
# `stlib/kernels/tile.py`) and the design it follows (the Sparse VideoGen TPU port and Sliding
# Tile Attention):
#
# 1. **token reordering**: permute the tokens so that each head's pattern becomes contiguous
#    (token-major order for temporal heads, 3-D tiled order for sliding tiles);
# 2. **the boundary-tile policy**: PARTIAL tiles either run in a separate masked pass (exact) or
#    are rounded in or out while keeping the pair budget (balanced, approximate);
# 3. **the compacted grid**: visit only non-empty tiles, per row ("rows") or as one flat list ("flat");
# 4. **the ragged tail**: 75,600 is not a multiple of 128; the padded last kv tile runs in a pass
#    of its own, and the passes are merged with a log-sum-exp merge.
#
# It ends with `stlib.video_attention`, which does all of it behind one call, and with the kernel
# written in view timed beside `pallas_tile` and Splash.

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
import jax.numpy as jnp
import numpy as np

import stlib
import stlib.kernels  # registers the Pallas kernels with stlib.attention
from stlib import configs, exercises, masks, notebook, plotting
from stlib.kernels.tile import TileOptions, tile_attention, tile_work
from stlib.passes import balanced_keep, split_passes
from stlib.reference import merge_partials
from stlib.reorder import choose_orders

cfg = notebook.setup(SIZE, solutions=SOLUTIONS)
max_error, tolerance = notebook.max_error, notebook.tolerance  # checks against the plain reference

workload, case = cfg.workload, configs.CASE_STUDY
H, L, D = workload.qkv_shape
q, k, v = stlib.random_qkv(workload.qkv_shape, workload.dtype, seed=0)
scale = D**-0.5
TOL = tolerance(workload.dtype)
# the checks in view run on the small grid on every backend (what they show needs no more); the
# case-study size is for what is measured (the last section) and for stlib.video_attention
small = configs.SMALL_CPU
qs, ks, vs = stlib.random_qkv(small.qkv_shape, small.dtype, seed=1)
print(f"checks in view: the small grid {small.grid.shape} = {small.num_tokens:,} tokens, {small.num_heads} heads, "
      f"{jnp.dtype(small.dtype).name}")

# %% [markdown]
# ## 1. Token reordering
#
# A temporal head (Sparse VideoGen) lets a token see the same spatial location in every frame. In
# raster order (t, y, x) those keys are 3,600 tokens apart: every tile they touch is PARTIAL. In
# token-major order (y, x, t) the 21 frames of one location are neighbours, and the pattern
# becomes a plain band |p(q) - p(k)| <= w. Below: the temporal band at density 0.25 on the
# case-study grid, in both orders, with the v6e default tiles of 512 x 1,024 (layouts are cheap
# to build on a CPU, even at 75,600 tokens).

# %%
temporal = masks.temporal_band(case.grid, 0.25)
views = {
    "temporal band, raster order (t, y, x)": temporal,
    "temporal band, token-major order (y, x, t)": temporal.permute(stlib.token_major_order(case.grid)),
}
temporal_layouts = {name: stlib.block_layout(m, 512, 1024) for name, m in views.items()}
for name, lay in temporal_layouts.items():
    print(f"{name:<44} occupied tiles {lay.occupancy:.3f}  partial {lay.partial_fraction:5.1%} of occupied  "
          f"work efficiency {lay.work_efficiency:.2f}")
fig = plotting.occupancy_comparison(temporal_layouts, "Temporal head at 21 x 45 x 80 (75,600 tokens), 512 x 1,024 "
                                    "tiles: before and after token-major reordering")
plotting.save(fig, cfg.figure("06_reorder_temporal"))

# %% [markdown]
# Sliding Tile Attention is built from 3-D tiles (here 3 frames x 8 rows x 16 columns = 384
# tokens; each query sees the 3 x 3 x 3 tiles around its own). In raster order a 3-D tile is 24
# scattered runs of 16 tokens. In the 3-D tiled order each tile is 384 contiguous tokens, and with
# kernel tiles of 384 x 384 every tile of the layout is exactly FULL or EMPTY. 45 rows are not a
# multiple of 8, so the tiled order pads the last row of tiles with empty slots (80,640 positions
# for 75,600 tokens): padding slots see nothing and are seen by nothing.

# %%
sta = masks.sliding_tile(case.grid, (3, 8, 16), (3, 3, 3))
sta_order = stlib.tiled_order(case.grid, (3, 8, 16))
sta_layouts = {
    "sliding tile, raster order": stlib.block_layout(sta, 384, 384),
    f"sliding tile, {sta_order.name} order": stlib.block_layout(sta.permute(sta_order), 384, 384),
}
for name, lay in sta_layouts.items():  # over the padded positions, density and occupancy share a denominator
    print(f"{name:<44} {lay.length:,} positions: density {lay.allowed_pairs / lay.length**2:.3f}, occupied tiles "
          f"{lay.occupancy:.3f}  partial {lay.partial_fraction:5.1%} of occupied  "
          f"work efficiency {lay.work_efficiency:.2f}")
fig = plotting.occupancy_comparison(sta_layouts, "Sliding tile (3 x 8 x 16 tiles, window 3 x 3 x 3) at 75,600 "
                                    "tokens, 384 x 384 tiles: raster vs 3-D tiled order")
plotting.save(fig, cfg.figure("06_reorder_sliding_tile"))

# %% [markdown]
# `stlib.reorder.choose_orders` makes this choice by measurement: it builds the layout of the mask
# in each candidate order (raster, token-major, and the 3-D tiled orders the mask suggests) and
# keeps the one with the fewest non-empty tiles. Reordering is a gather before the kernel and a
# gather after it (not part of the kernel time in the case study). Here is the kernel with the
# reordering written out: permute q, k, v; run `pallas_tile` on the permuted mask; restore the
# output. It runs on the small grid on every backend (the setup cell prints it: 3 frames of 8 x 48
# tokens; tiles of 128 x 128, one 1 x 8 x 16 tile each), which is all a check of the reordering
# needs; the case-study size is timed at the end of the notebook.

# %%
block = (128, 128)  # one 1 x 8 x 16 tile of the small grid is 128 tokens
reorder_checks = {
    "temporal band 0.25": masks.temporal_band(small.grid, 0.25),
    "sliding tile": masks.sliding_tile(small.grid, (1, 8, 16), (3, 1, 1)),
}
for name, mask in reorder_checks.items():
    (order,) = choose_orders(small.grid, mask, *block)
    permuted = mask.permute(order)
    out = order.restore(stlib.attention(order.apply(qs), order.apply(ks), order.apply(vs), permuted,
                                        impl="pallas_tile", block_q=block[0], block_kv=block[1],
                                        interpret=cfg.interpret))
    err = max_error(out, qs, ks, vs, mask)
    assert err < tolerance(small.dtype), (name, err)
    before = stlib.block_layout(mask, *block).kind_counts()
    after = stlib.block_layout(permuted, *block).kind_counts()
    print(f"PASSED  {name}: chose {order.name!r}; pallas_tile == reference on the raster mask (max error {err:.2e}); "
          f"tiles {block[0]} x {block[1]}: raster {before} -> {after}")

# %% [markdown]
# ## 2. The boundary-tile policy: exact or balanced
#
# Even aligned, a band has PARTIAL tiles where its edges cross (about two per row). The exact
# policy runs the FULL tiles in a mask-free pass and the PARTIAL ones in a second, masked pass.
# The Sparse VideoGen TPU design instead *rounds* each PARTIAL tile: the fullest ones are kept
# (and computed as if FULL), the rest dropped, as many as keep the computed pairs closest to the
# exact budget (`stlib.passes.balanced_keep`). One pass, no masking work at all; but the
# result is no longer exactly the band's attention. First the budget at the case-study shape:

# %%
budget_series = {"exact (every non-empty tile computed)": [], "balanced rounding": []}
for density in (0.15, 0.25, 0.35, 0.45, 0.55, 0.65):
    lay = stlib.block_layout(masks.band(case.num_tokens, masks.band_width_for_density(case.num_tokens, density)),
                             512, 1024)
    pairs = np.broadcast_to(lay.valid_pairs, lay.counts.shape)
    exact = pairs[lay.kinds != stlib.TileKind.EMPTY].sum() / lay.allowed_pairs
    balanced = pairs[balanced_keep(lay)].sum() / lay.allowed_pairs
    budget_series["exact (every non-empty tile computed)"].append((lay.density, exact))
    budget_series["balanced rounding"].append((lay.density, balanced))
    assert abs(balanced - 1) < 0.02, balanced
    print(f"PASSED  band density {lay.density:.3f}: balanced computes {balanced:.4f} x the allowed pairs "
          f"(within 2%: max error {abs(balanced - 1):.1e}); exact computes {exact:.3f} x, "
          f"{int(lay.kind_counts()['PARTIAL'])} PARTIAL tiles in its masked pass")
fig = plotting.timing_lines(budget_series, "Pairs computed / allowed pairs: band at 75,600 tokens, 512 x 1,024 tiles",
                            "density (allowed pairs / L²)", "computed pairs / allowed pairs")
fig.axes[0].set_ylim(0.95, 1.2)
fig.axes[0].axhspan(0.98, 1.02, color="grey", alpha=0.15, lw=0, label="within 2% of the allowed pairs")
fig.axes[0].legend(fontsize=8)
plotting.save(fig, cfg.figure("06_boundary_budget"))

# %% [markdown]
# The rounding changes which pairs are computed, so the balanced kernel computes attention over a
# slightly different mask: the band rounded to whole tiles. On the small shape we can build that
# rounded mask densely: the kernel matches it exactly, and differs from the band's exact result.

# %%
small_band = masks.band(small.num_tokens, masks.band_width_for_density(small.num_tokens, 0.25))
small_layout = stlib.block_layout(small_band, 128, 128)
keep = balanced_keep(small_layout)[0]  # [nq, nk]: tiles computed as FULL
rounded = masks.from_array(np.kron(keep, np.ones((128, 128), bool))[: small.num_tokens, : small.num_tokens])
out = tile_attention(qs, ks, vs, small_layout, scale=scale, options=TileOptions(boundary="balanced"),
                     interpret=cfg.interpret)
err = max_error(out, qs, ks, vs, rounded)
assert err < tolerance(jnp.float32), err
print(f"PASSED  balanced pallas_tile == reference on the tile-rounded band (max error {err:.2e}); "
      f"{int(keep.sum())} tiles kept of {int((small_layout.kinds[0] > 0).sum())} non-empty")
print(f"        ... and differs from the exact band's attention by up to {max_error(out, qs, ks, vs, small_band):.2f}: "
      f"approximate by design (whether it is good enough is a model-quality question)")

# %% [markdown]
# ## 3. The compacted grid: "rows" and "flat"
#
# The block-sparse kernel of notebook 05 visits every (q tile, kv tile) step and skips most of
# them; every skipped step still costs a trip round the grid loop. `pallas_tile` visits only
# non-empty tiles:
#
# * **rows**: grid (H, q tiles, W), W = the widest row; q tile i walks its own list of kv tiles
#   (the same idea as Splash's shrunk grid), and rows shorter than W skip their last steps;
# * **flat**: grid (H, S) over the S non-empty tiles in row order; each step reads its
#   (q tile, kv tile) from the tables, and first / last flags open and close each row.
#
# For a band every row has about the same width and the two are close. For masks whose rows
# differ (frame-causal video, where late frames see many more keys than early ones, or radial
# attention), "flat" wastes no steps.

# %%
grid_masks = {
    "band 0.25": masks.band(case.num_tokens, masks.band_width_for_density(case.num_tokens, 0.25)),
    "frame causal": masks.frame_causal(case.grid),
    "radial (window 1200)": masks.radial(case.grid, 1200),
}
work_records = []
for name, mask in grid_masks.items():
    lay = stlib.block_layout(mask, 512, 1024)
    for form in ("rows", "flat"):
        work = tile_work(lay, case.num_heads, case.head_dim, TileOptions(form=form))
        work_records.append({"label": f"{name}, {form}", **work.as_dict()})
    rows_steps, flat_steps = work_records[-2]["grid_steps"], work_records[-1]["grid_steps"]
    print(f"{name:<22} rows {rows_steps:>8,} steps, flat {flat_steps:>8,} steps "
          f"({rows_steps / flat_steps:.2f}x fewer); "
          f"widest row {lay.max_row_width} of {lay.grid_shape[1]} kv tiles; tables: rows "
          f"{lay.table_bytes('rows'):,} B, flat {lay.table_bytes('flat'):,} B of SMEM")
dense_steps = case.num_heads * lay.grid_shape[0] * lay.grid_shape[1]
fig = plotting.work_bars(work_records, "pallas_tile grids at the case-study shape (10 x 75,600 x 128, 512 x 1,024 "
                         "tiles): computed, not measured",
                         step_lines={f"the full grid of a dense / block-sparse kernel ({dense_steps:,} steps)": dense_steps})
plotting.save(fig, cfg.figure("06_grids"))

# why "rows" can walk more steps than the full grid: each pass has a rows grid of its own
causal_case = stlib.block_layout(grid_masks["frame causal"], 512, 1024)
widths = {str(p.name): int(p.selected.sum(axis=2).max()) for p in split_passes(causal_case, TileOptions().boundary)}
nq, nk = causal_case.grid_shape
print(f"frame causal, rows: {case.num_heads} heads x {nq} q tiles x (" + " + ".join(
    f"{w} ({name} pass)" for name, w in widths.items()) + f") = {case.num_heads * nq * sum(widths.values()):,} steps; "
      f"the full grid: {case.num_heads} x {nq} x {nk} = {dense_steps:,}")
# radial: is a better token order or a smaller tile the cure for its 3x work?
radial = grid_masks["radial (window 1200)"]
print(f"radial: choose_orders keeps {choose_orders(case.grid, radial, 512, 1024)[0].name!r}; "
      "work efficiency (allowed / computed pairs) by tile: " + ", ".join(
          f"{bq} x {bkv} {stlib.block_layout(radial, bq, bkv).work_efficiency:.2f}" for bq, bkv in [(512, 1024), (128, 128)]))

# %% [markdown]
# Two bars of the figure need a word.
#
# * **Frame-causal "rows" walks more steps than the full grid** (the dashed line). `pallas_tile`
#   runs up to three passes (section 4: mask-free FULL tiles, the ragged tail, the masked PARTIAL
#   tiles), and in the rows form each pass has a grid of its own: q tiles x *that pass's* widest
#   row. A frame-causal mask's last frame sees every key, so the main pass alone is nearly as wide
#   as the full grid, and the masked and ragged passes add their own rows on top (the widths and
#   their sum printed above).
#   Rows of very different widths are exactly what "flat" is for: it walks only the non-empty
#   tiles, half the steps here. `pallas_tile` lets you pick the form (`TileOptions(form="flat")`).
# * **Radial attention computes about 3x its useful work**, and the figure shows it in raster
#   order on purpose: it is the best order on offer. `choose_orders` tries raster, token-major
#   (and the 3-D tiled orders a mask suggests; radial suggests none) and keeps raster: in
#   token-major order every occupied tile becomes PARTIAL.
#   The waste comes from the tile size: radial's window halves each time the frame distance
#   doubles (keys within 1,200 positions either side in the same frame, 600 in the next, ..., 75
#   in far frames), so every far
#   frame contributes a thin diagonal slice that still occupies whole 1,024-key tiles. With
#   128 x 128 tiles the same mask wastes far less (the efficiencies printed above), at the price
#   of many more grid steps (tiles of a 32nd of the area, fewer of them wasted) and bigger tables:
#   the trade-off of notebook 03.
#
# Both forms compute the same attention. The check runs them with the frame-causal mask on the
# small grid, on every backend (which form is right does not depend on the size):

# %%
causal = masks.frame_causal(small.grid)
causal_layout = stlib.block_layout(causal, *block)
for form in ("rows", "flat"):
    out = tile_attention(qs, ks, vs, causal_layout, scale=scale, options=TileOptions(form=form),
                         interpret=cfg.interpret)
    err = max_error(out, qs, ks, vs, causal)
    assert err < tolerance(small.dtype), (form, err)
    print(f"PASSED  pallas_tile ({form}) with the frame-causal mask == reference on the small grid (max error "
          f"{err:.2e}); {tile_work(causal_layout, small.num_heads, D, TileOptions(form=form)).grid_steps:,} grid steps")

# %% [markdown]
# ## 4. The ragged tail, merged by log-sum-exp
#
# 75,600 = 590 x 128 + 80: the last kv tile holds 80 real keys and 48 padding slots that no query
# may see. `pallas_tile` keeps its main pass mask-free by giving the tiles that need any masking
# passes of their own: a *ragged* pass for FULL tiles whose keys end in padding (one comparison
# per score: is this key before the tile's count of real keys?) and a *masked* pass for PARTIAL
# tiles (the mask itself). Each pass returns its partial output o_i and, per query, the
# log-sum-exp of its scores, lse_i = log Σ exp(s). Softmaxes over disjoint key sets combine exactly:
#
# lse = log(exp(lse_1) + exp(lse_2)),  o = exp(lse_1 - lse) o_1 + exp(lse_2 - lse) o_2
#
# (a query that saw no key in a pass has lse_i = -inf and weight 0). The teaching version below
# takes dense attention over a ragged sequence of 1,000 tokens (7 x 128 + 104), splits the keys at
# the start of the last kv tile, runs `tile_attention(..., return_lse=True)` on each side, and
# merges by hand.

# %%
length, cut = 1000, 896
qr, kr, vr = stlib.random_qkv((2, length, 128), jnp.float32, seed=2)
key = np.broadcast_to(np.arange(length)[None, :], (length, length))
halves = [masks.from_array(key < cut), masks.from_array(key >= cut)]  # keys of kv tiles 0-6, and of tile 7
(o1, lse1), (o2, lse2) = (tile_attention(qr, kr, vr, stlib.block_layout(m, 128, 128), scale=scale,
                                         interpret=cfg.interpret, return_lse=True) for m in halves)
lse = jnp.logaddexp(lse1, lse2)  # [H, L]
w1 = jnp.where(jnp.isfinite(lse1), jnp.exp(lse1 - lse), 0.0)[..., None]
w2 = jnp.where(jnp.isfinite(lse2), jnp.exp(lse2 - lse), 0.0)[..., None]
merged = w1 * o1 + w2 * o2
err = max_error(merged, qr, kr, vr)
assert err < tolerance(jnp.float32), err
print(f"PASSED  hand merge of the two halves == dense reference over all 1,000 keys (max error {err:.2e})")
stlib_merged, _ = merge_partials(o1, lse1[..., None], o2, lse2[..., None])
gap = float(jnp.max(jnp.abs(stlib_merged - merged)))
print(f"PASSED  stlib.reference.merge_partials == hand merge (max error {gap:.1e})")

whole = stlib.block_layout(masks.full(length), 128, 128)
for p in split_passes(whole, "exact"):
    print(f"inside pallas_tile: pass {p.name!r:<9} {int(p.selected.sum()):>3} tiles, mask work: {p.plan.mode!r}")
out = tile_attention(qr, kr, vr, whole, scale=scale, interpret=cfg.interpret)
err = float(jnp.max(jnp.abs(out - merged)))
assert err < tolerance(jnp.float32), err
print(f"PASSED  pallas_tile on the whole sequence == the hand merge (max error {err:.2e})")

# %% [markdown]
# ## The tile-aligned kernel, written in view
#
# All four pieces together, for one head, in about eighty lines: a temporal band (density 0.25)
# on the small grid (on every backend: the kernel and its exercises need no more; the last
# section times it at about the case-study length), whose occupied tiles in raster order are all
# PARTIAL.
#
# 1. **reorder**: token-major order (`stlib.token_major_order`) makes the pattern a band; the
#    layout of the permuted mask has FULL, PARTIAL and EMPTY tiles;
# 2. **the compacted per-row table**: `compact_rows` lists, for each q tile, the kv tiles of one
#    kind, then repeats the last one up to the widest row W (so the steps past a row's count fetch
#    nothing new), plus the count per row; both go to SMEM. The grid is (q tiles, W), not
#    (q tiles, kv tiles): EMPTY tiles cost no step at all;
# 3. **two passes of one kernel**: `masked` is a Python bool, fixed at trace time. The main pass
#    over FULL tiles has no mask code at all; the masked pass over PARTIAL tiles reads its step's
#    int8 mask tile from HBM: `mask_tiles` cuts one [block_q, block_kv] tile per slot of the pass's
#    table out of the mask (`mask.block`, never an [L, L] array), and the index map picks the slot
#    (a skipped slot repeats the row's last one, so it fetches nothing new). The production kernel
#    evaluates the mask's predicate from iota instead, or reads a deduplicated tile table. Each pass
#    writes its partial output and, per query, its log-sum-exp (lse = -inf for a row that saw no
#    key in that pass);
# 4. **the merge**: the section above's log-sum-exp merge, then restore raster order.
#
# One piece is left for you: the pass's finalise step, `finish`, which the kernel takes as an
# argument (the first exercise, right after the kernel).

# %%
import functools
import math
import time

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from stlib.device import compile_for_tpu
from stlib.reference import MASK_VALUE

F32 = jnp.float32


def lanes(x, width):
    """[rows, 128] lane-replicated -> [rows, width] (width a multiple of 128), without lane shuffles."""
    return jnp.tile(x, (1, width // 128))


def compact_rows(selected):
    """selected bool [nq, nk] -> (tiles int32 [nq * W], counts int32 [nq]): each row's selected kv tiles
    in order, then its last one repeated (0 for an empty row); W = the widest row (at least 1)."""
    counts = selected.sum(axis=1).astype(np.int32)
    tiles = np.zeros((selected.shape[0], max(int(counts.max()), 1)), np.int32)
    for i, row in enumerate(selected):
        listed = np.flatnonzero(row)
        if listed.size:
            tiles[i] = np.concatenate([listed, np.full(tiles.shape[1] - listed.size, listed[-1])])
    return tiles.reshape(-1), counts


def mask_tiles(mask, tiles, counts, block_q, block_kv):
    """int8 [nq * W, block_q, block_kv]: the mask tile of each real slot of a pass's table (tiles, counts),
    zeros past a row's count; cut from ``mask`` tile by tile (``mask.block``), never an [L, L] array."""
    width = tiles.size // counts.size
    table = np.zeros((tiles.size, block_q, block_kv), np.int8)
    for i, count in enumerate(counts):
        for slot in range(i * width, i * width + count):
            k0 = int(tiles[slot]) * block_kv
            table[slot] = mask.block(i * block_q, (i + 1) * block_q, k0, k0 + block_kv)
    return table


def tile_pass_kernel(tiles_ref, counts_ref, q_ref, k_ref, v_ref, *refs, scale, masked, finish):
    mask_ref, (o_ref, lse_ref, m_ref, l_ref, acc_ref) = (refs[0], refs[1:]) if masked else (None, refs)
    i, j, width = pl.program_id(0), pl.program_id(1), pl.num_programs(1)  # q tile, slot in its list, W

    @pl.when(j == 0)
    def _init():
        m_ref[...] = jnp.full(m_ref.shape, MASK_VALUE, F32)
        l_ref[...] = jnp.zeros(l_ref.shape, F32)
        acc_ref[...] = jnp.zeros(acc_ref.shape, F32)

    @pl.when(j < counts_ref[i])  # a real entry of this row's list; past it: skip (and nothing was fetched)
    def _update():
        s = jax.lax.dot_general(q_ref[...], k_ref[...], (((1,), (1,)), ((), ())),
                                preferred_element_type=F32) * scale  # [bq, bkv]
        if masked:  # trace time: the main pass carries no mask code at all
            allowed = mask_ref[...] != 0  # [bq, bkv] int8 mask tile of this slot
            s = jnp.where(allowed, s, MASK_VALUE)
        m_prev = m_ref[...]
        m_next = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))
        alpha = jnp.exp(m_prev - m_next)
        p = jnp.exp(s - lanes(m_next, s.shape[1]))
        if masked:
            p = jnp.where(allowed, p, 0.0)
        l_ref[...] = alpha * l_ref[...] + jnp.sum(p, axis=1, keepdims=True)
        m_ref[...] = m_next
        pv = jax.lax.dot_general(p, v_ref[...].astype(F32), (((1,), (0,)), ((), ())), preferred_element_type=F32)
        acc_ref[...] = lanes(alpha, acc_ref.shape[1]) * acc_ref[...] + pv

    @pl.when(j == width - 1)  # the row's last slot: write o and lse
    def _finish():
        finish(o_ref, lse_ref, m_ref, l_ref, acc_ref)


def tile_pass(tiles, counts, q, k, v, mask=None, *, finish, block_q=128, block_kv=128, interpret=True):
    """One pass over the tiles listed in (tiles, counts); q, k, v [L, D]; mask: int8 [nq * W, bq, bkv], the
    pass's tiles (``mask_tiles``), or None (mask-free); finish(o_ref, lse_ref, m_ref, l_ref, acc_ref): the
    finalise step. Returns o [L, D] and lse [L, 1], float32."""
    (length, head_dim), scale = q.shape, q.shape[1] ** -0.5
    nq = length // block_q
    width = tiles.shape[0] // nq
    q_map = lambda i, j, *_: (i, 0)
    kv_map = lambda i, j, tiles_ref, counts_ref: (tiles_ref[i * width + j], 0)  # the compacted table steers k, v
    in_specs = [pl.BlockSpec((block_q, head_dim), q_map), pl.BlockSpec((block_kv, head_dim), kv_map),
                pl.BlockSpec((block_kv, head_dim), kv_map)]
    if mask is not None:  # the mask tile of slot (i, j); past the row's count, of its last slot (no new fetch)
        slot = lambda i, j, t, c: (i * width + jnp.minimum(j, jnp.maximum(c[i] - 1, 0)), 0, 0)
        in_specs.append(pl.BlockSpec((None, block_q, block_kv), slot))
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=2, grid=(nq, width), in_specs=in_specs,
        out_specs=[pl.BlockSpec((block_q, head_dim), q_map), pl.BlockSpec((block_q, 1), q_map)],
        scratch_shapes=[pltpu.VMEM((block_q, 128), F32), pltpu.VMEM((block_q, 128), F32),
                        pltpu.VMEM((block_q, head_dim), F32)])
    return pl.pallas_call(
        functools.partial(tile_pass_kernel, scale=scale, masked=mask is not None, finish=finish),
        grid_spec=grid_spec,
        out_shape=[jax.ShapeDtypeStruct(q.shape, F32), jax.ShapeDtypeStruct((length, 1), F32)],
        compiler_params=None if interpret else pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
        interpret=interpret,
    )(*(jnp.asarray(t) for t in (tiles, counts)), q, k, v, *([] if mask is None else [mask]))


def tile_aligned_attention(q, k, v, mask, *, kinds, finish, block_q=128, block_kv=128, interpret=True):
    """q, k, v [L, D] in the reordered token order; kinds [nq, nk] of its layout; mask: the PARTIAL pass's
    mask tiles, ``mask_tiles(mask, *compact_rows(kinds == PARTIAL), block_q, block_kv)``."""
    passes = [(kinds == int(stlib.TileKind.FULL), None), (kinds == int(stlib.TileKind.PARTIAL), mask)]
    (o1, lse1), (o2, lse2) = (tile_pass(*compact_rows(sel), q, k, v, m, block_q=block_q, block_kv=block_kv,
                                        interpret=interpret, finish=finish) for sel, m in passes)
    lse = jnp.logaddexp(lse1, lse2)  # [L, 1]; -inf only for a row no pass saw
    safe = jnp.where(jnp.isfinite(lse), lse, 0.0)
    return (jnp.exp(lse1 - safe) * o1 + jnp.exp(lse2 - safe) * o2).astype(q.dtype)


# %% [markdown]
# ### Exercise 1: finish a pass
#
# The merge needs from every pass its output *and* its log-sum-exp per query. Write
# `finish(o_ref, lse_ref, m_ref, l_ref, acc_ref)`, the finalise step of a pass, before reading on.
# The check runs both passes of the kernel above with it on a temporal band in token-major order,
# merges, and compares with the reference.
#
# Run the notebook with `SOLUTIONS = "hide"` (first cell) to write it yourself: the stub raises, and
# the check prints NOT YET and what is wrong. `exercises.show("06.finish")` prints a solution.
#
# *Hint 1:* m and l are lane-replicated [bq, 128]; lse is [bq, 1] (take lane 0).
# *Hint 2:* in a pass, a row may see no key at all (l = 0): its o must be 0 and its lse -inf, or
# the merge breaks.

# %%
band_t = masks.temporal_band(small.grid, 0.25)  # raster order: every occupied tile PARTIAL
order_t = stlib.token_major_order(small.grid)
permuted_t = band_t.permute(order_t)
layout_t = stlib.block_layout(permuted_t, 128, 128)
partial_t = np.asarray(layout_t.kinds[0]) == int(stlib.TileKind.PARTIAL)  # [nq, nk]
tiles_t = jnp.asarray(mask_tiles(permuted_t, *compact_rows(partial_t), 128, 128))  # int8 [nq * W, 128, 128]
qt, kt, vt = stlib.random_qkv((1, small.num_tokens, D), jnp.float32, seed=3)
qo, ko, vo = (order_t.apply(x) for x in (qt, kt, vt))  # 1. reorder


@exercises.fill_in("06.finish")
def finish(o_ref, lse_ref, m_ref, l_ref, acc_ref):
    # --- your code here: write o_ref [bq, D] and lse_ref [bq, 1] ---
    raise NotImplementedError


def check_finish(finish):
    """Run both passes with ``finish`` on the temporal band, and one pass whose first q tile lists no
    kv tile at all: a line for PASSED, or NotYet."""
    kinds = np.asarray(layout_t.kinds[0])
    out = order_t.restore(tile_aligned_attention(qo[0], ko[0], vo[0], tiles_t, kinds=kinds, finish=finish,
                                                 interpret=cfg.interpret)[None])
    err = float(jnp.max(jnp.abs(out - stlib.attention(qt, kt, vt, band_t, impl="reference"))))
    if not np.isfinite(err):
        raise exercises.NotYet("NaN or inf in the merged output: what do o and lse hold for a row a pass never saw?")
    if err >= tolerance(jnp.float32):
        raise exercises.NotYet(f"max error {err:.2e}: is lse = m + log(l), in the natural log?")
    unseen = kinds == int(stlib.TileKind.FULL)
    unseen[0] = False  # q tile 0: this pass lists none of its kv tiles, so its 128 rows see no key
    o, lse = tile_pass(*compact_rows(unseen), qo[0], ko[0], vo[0], finish=finish, interpret=cfg.interpret)
    if not (bool(jnp.all(o[:128] == 0)) and bool(jnp.all(jnp.isneginf(lse[:128])))):
        raise exercises.NotYet("a row the pass never saw must get o = 0 and lse = -inf (l is 0 there)")
    return f"both passes merged == reference (max error {err:.1e}); rows a pass never saw: o = 0, lse = -inf"


exercises.verify("06.finish", check_finish, finish)

# %% [markdown]
# The finalise step the kernel runs with, and the whole kernel against the reference and against
# `pallas_tile` on the same inputs:

# %%
def finish_pass(o_ref, lse_ref, m_ref, l_ref, acc_ref):
    """o = acc / l and lse = m + log l per query; o = 0 and lse = -inf where the pass saw no key."""
    l = l_ref[...][:, :1]  # [bq, 1]
    seen = l > 0
    o_ref[...] = jnp.where(seen, acc_ref[...] / jnp.where(seen, l, 1.0), 0.0)  # [bq, D] float32
    lse_ref[...] = jnp.where(seen, m_ref[...][:, :1] + jnp.log(jnp.where(seen, l, 1.0)), -jnp.inf)  # [bq, 1]


def check_against_both(name, out, q, k, v, mask, impl, **kwargs):
    """out [1, L, D] (raster order) vs the float32 reference and the stlib kernel ``impl``."""
    ref = stlib.attention(q, k, v, mask, impl="reference")
    production = kwargs.pop("production")
    err_ref, err_lib = (float(jnp.max(jnp.abs(out.astype(F32) - x.astype(F32)))) for x in (ref, production))
    assert max(err_ref, err_lib) < tolerance(q.dtype), (name, err_ref, err_lib)
    print(f"PASSED  {name}: max error {err_ref:.1e} vs the reference, {err_lib:.1e} vs stlib {impl}")


out_t = order_t.restore(tile_aligned_attention(qo[0], ko[0], vo[0], tiles_t, kinds=np.asarray(layout_t.kinds[0]),
                                               finish=finish_pass, interpret=cfg.interpret)[None])
production_t = order_t.restore(stlib.attention(qo, ko, vo, permuted_t, impl="pallas_tile", block_q=128, block_kv=128,
                                               options=TileOptions(exp2=False), interpret=cfg.interpret))
print(f"temporal band 0.25, 128 x 128 tiles: raster {stlib.block_layout(band_t, 128, 128).kind_counts()} -> "
      f"token-major {layout_t.kind_counts()}; grids: FULL pass {compact_rows(np.asarray(layout_t.kinds[0]) == 2)[0].size}"
      f" steps, PARTIAL pass {compact_rows(np.asarray(layout_t.kinds[0]) == 1)[0].size} steps "
      f"(the full grid: {layout_t.kinds[0].size})")
check_against_both(f"tile-aligned teaching kernel, 1 x {small.num_tokens:,} x {D}", out_t, qt, kt, vt, band_t, "pallas_tile",
                   production=production_t)

# %% [markdown]
# The comparison is like for like: `TileOptions(exp2=False)` switches off the production kernel's
# base-2 exponentials (on by default in both tile kernels), which the teaching kernel does not
# use. Compiled for v6e at a moderate shape (one head, a 16 x 16 x 32 video = 8,192 tokens in
# token-major order, bf16, tiles 512 x 1,024), next to the production kernel:

# %%
grid_m = stlib.VideoGrid(16, 16, 32)
mask_m = masks.temporal_band(grid_m, 0.25).permute(stlib.token_major_order(grid_m))
kinds_m = np.asarray(stlib.block_layout(mask_m, 512, 1024).kinds[0])
tiles_m = jax.ShapeDtypeStruct((compact_rows(kinds_m == int(stlib.TileKind.PARTIAL))[0].size, 512, 1024), jnp.int8)
one = jax.ShapeDtypeStruct((grid_m.num_tokens, D), jnp.bfloat16)
for name, fn, shapes in [
    ("teaching tile kernel (2 passes)", functools.partial(tile_aligned_attention, kinds=kinds_m, finish=finish_pass,
                                                          block_q=512, block_kv=1024, interpret=False),
     [one] * 3 + [tiles_m]),
    ("stlib pallas_tile", functools.partial(stlib.attention, mask=mask_m, impl="pallas_tile", block_q=512,
                                            block_kv=1024, options=TileOptions(exp2=False), interpret=False),
     [jax.ShapeDtypeStruct((1, *one.shape), one.dtype)] * 3),
]:
    start = time.perf_counter()
    hbm = compile_for_tpu(fn, *shapes, chip="v6e").memory()
    print(f"v6e {name:<32} compiled in {time.perf_counter() - start:.1f} s: HBM arguments "
          f"{hbm['argument_size_in_bytes']:,} B, output {hbm['output_size_in_bytes']:,} B, temporaries "
          f"{hbm['temp_size_in_bytes']:,} B")
print(f"(the teaching kernel's arguments include its PARTIAL pass's int8 mask tiles, {tiles_m.shape[0]} of "
      f"512 x 1,024 = {math.prod(tiles_m.shape):,} B; the production kernel evaluates the band from iota and needs none)")

# %% [markdown]
# **What the production kernel adds** (`stlib/kernels/tile.py`):
#
# * heads and per-head tables (`_pass_tables`, `_run_pass`): [Hl, nq, W] lists flattened, one
#   shared table when every head has the same mask;
# * the "flat" grid (`GridForm.FLAT`, `stlib.layout.flat_steps`): one list of active steps with
#   first / last flags bit-packed next to the kv tile, so rows of unequal width waste no step;
# * a third pass, "ragged" (`split_passes`, `PassKind.RAGGED`): FULL tiles whose keys end in
#   padding compare each key with the tile's count of real keys instead of evaluating the mask;
# * masked tiles from the mask's predicate on iota, or a deduplicated int8 tile table steered by a
#   carried index (`stlib.passes.plan_mask`, `mask_info.carried_index`), never a dense [L, L] array;
# * balanced rounding of boundary tiles (`balanced_keep`, `BoundaryPolicy.BALANCED`);
# * exp2 on by default (`TileOptions`), padding, the merge with `reference.merge_partials`, and the
#   SMEM check (`mask_info.check_prefetch`).

# %% [markdown]
# ### Exercise 2: merge any number of passes
#
# The production kernel runs up to three passes (FULL, ragged, masked), and a split-kv kernel as
# many as it has splits. Write `merge(outputs, lses)` for any number of passes: the lists hold each
# pass's output [L, D] (already divided by its own l) and log-sum-exp [L, 1]; return attention over
# every pass's keys [L, D]. A row that a pass never saw has lse -inf there; a row that no pass saw
# (an empty row of the mask) must come out 0, not NaN. The check splits the temporal band's FULL
# tiles into two passes (even and odd kv tiles) beside its PARTIAL pass, hides row 0 from all three,
# merges with yours, and compares with the two-pass kernel. It adds 100 to every lse first (as a
# pass of scores around 100 would have): the merge must not change, and exp(lse_i) overflows.
#
# *Hint 1:* exp(lse_i) can overflow, and for the hidden row every one of them is 0.
# *Hint 2:* weigh pass i by exp(lse_i - lse), with lse the log of the sum of every pass's
# exp(lse_i) (`jax.nn.logsumexp` over the stacked lses), and guard the rows where lse is -inf.
# `exercises.show("06.merge")` prints a solution.

# %%
@exercises.fill_in("06.merge")
def merge(outputs, lses):
    # --- your code here: return the merged output [L, D] ---
    raise NotImplementedError


def check_merge(merge):
    """Three passes of the temporal band and a row no key is allowed for, merged with ``merge``."""
    kinds = np.asarray(layout_t.kinds[0])
    full, even = kinds == int(stlib.TileKind.FULL), (np.arange(kinds.shape[1]) % 2 == 0)[None, :]
    passes = [(full & even, None), (full & ~even, None), (partial_t, tiles_t)]
    results = [tile_pass(*compact_rows(sel), qo[0], ko[0], vo[0], m, finish=finish_pass, interpret=cfg.interpret)
               for sel, m in passes]
    outputs = [o for o, _ in results]
    # + 100: scores a constant higher leave the merge as it is, and exp(lse_i) past float32's range;
    # row 0 as if the mask hid every key from it
    lses = [(lse + 100.0).at[0].set(-jnp.inf) for _, lse in results]
    out = merge(outputs, lses)
    want = tile_aligned_attention(qo[0], ko[0], vo[0], tiles_t, kinds=kinds, finish=finish_pass,
                                  interpret=cfg.interpret)  # token-major
    if out.shape != outputs[0].shape:
        raise exercises.NotYet(f"the merge has shape {out.shape}, expected {outputs[0].shape}")
    if not bool(jnp.all(jnp.isfinite(out))):
        raise exercises.NotYet("NaN or inf in the merge: a row that no pass saw has lse -inf in all of them, and "
                               "exp(lse_i) overflows float32 past lse 88")
    if float(jnp.max(jnp.abs(out[0]))) != 0.0:
        raise exercises.NotYet("a row that no pass saw must be 0")
    err = float(jnp.max(jnp.abs(out[1:] - want[1:])))  # every row but the hidden one
    if not err < tolerance(jnp.float32):
        raise exercises.NotYet(f"max error {err:.2e} against the two-pass kernel: are the weights exp(lse_i - lse)?")
    return f"three passes merged == the two-pass kernel (max error {err:.1e}), a row no pass saw is 0"


exercises.verify("06.merge", check_merge, merge)

# %% [markdown]
# ## Everything at once: `stlib.video_attention`
#
# A per-head mask in the Sparse VideoGen style: half the heads spatial (a band in raster order),
# half temporal (a band in token-major order). `video_attention` takes raster-order q, k, v and the
# raster-order mask, chooses an order per head, gathers, runs the kernel on per-head tables and
# restores raster order. This one runs at the notebook's configuration (the case study on a TPU:
# the library at the size it is for, checked on sampled rows).

# %%
grid = workload.grid
spatial_head, temporal_head = masks.spatial_band(grid, 0.25), masks.temporal_band(grid, 0.25)
svg = masks.per_head([spatial_head] * (H // 2) + [temporal_head] * (H - H // 2))
# the orders choose_orders picks, head by head; one order object per distinct order, so the kernel
# evaluates two distinct head masks in-kernel (choose_orders returns a fresh object per head)
raster, token_major = stlib.raster_order(grid), stlib.token_major_order(grid)
orders = [raster] * (H // 2) + [token_major] * (H - H // 2)
assert [o.name for o in choose_orders(grid, svg, cfg.block_q, cfg.block_kv)] == [o.name for o in orders]
out = stlib.video_attention(q, k, v, grid, svg, impl="pallas_tile", orders=orders, block_q=cfg.block_q,
                            block_kv=cfg.block_kv, interpret=cfg.interpret)
err = max_error(out, q, k, v, svg)
assert err < TOL, err
raster_tiles = int((stlib.block_layout(svg, cfg.block_q, cfg.block_kv).kinds != stlib.TileKind.EMPTY).sum())
chosen = stlib.masks.per_head([svg.head(h).permute(o) for h, o in enumerate(orders)])
chosen_tiles = int((stlib.block_layout(chosen, cfg.block_q, cfg.block_kv).kinds != stlib.TileKind.EMPTY).sum())
print(f"PASSED  video_attention (pallas_tile, per-head orders) == reference on the raster mask (max error {err:.2e})")
print(f"orders: {sorted({o.name for o in orders})}; non-empty tiles over all heads: raster {raster_tiles:,} -> "
      f"chosen orders {chosen_tiles:,}")

# %% [markdown]
# ## Timed: the kernel in view beside `pallas_tile` and Splash
#
# The kernel in view runs one head; `jax.vmap` runs it over all of them (it adds the heads as one
# more axis of the same `pallas_call`'s grid, the mask tiles shared). It pads nothing, so on a TPU
# it runs at the case study's heads, head dimension and dtype on 74 x 1,024 tokens, the multiple of
# its tiles (512 x 1,024) just above 75,600, with a band of density 0.25 (the temporal head in
# token-major order is such a band). `pallas_tile` (natural exponentials, the same tiles) and
# Splash (its own blocks, the same band) run on the same inputs. Each output is checked against
# the reference on sampled rows, then the three are timed in turn (`bench.time_interleaved`:
# compile excluded, each round in a shuffled order). Off a TPU the cell runs the small grid in
# interpret mode, as cheap as the checks above: those times are the interpreter's, not a TPU's.

# %%

from stlib import bench

if cfg.size == "full":  # the case study's heads, head dim and dtype; a length the kernel in view takes as it is
    heads_b, length_b, bq_b, bkv_b, dtype_b = H, 74 * 1024, 512, 1024, workload.dtype
else:  # the small grid (interpret mode off a TPU)
    heads_b, length_b, bq_b, bkv_b, dtype_b = small.num_heads, small.num_tokens, 128, 128, small.dtype
band_b = masks.band(length_b, masks.band_width_for_density(length_b, 0.25))
layout_b = stlib.block_layout(band_b, bq_b, bkv_b)
kinds_b = np.asarray(layout_b.kinds[0])  # [nq, nk]
tiles_b = jnp.asarray(mask_tiles(band_b, *compact_rows(kinds_b == int(stlib.TileKind.PARTIAL)), bq_b, bkv_b))
qb, kb, vb = stlib.random_qkv((heads_b, length_b, D), dtype_b, seed=4)
blocks_b = {"block_q": bq_b, "block_kv": bkv_b}
timed = {  # each takes (q, k, v, the PARTIAL pass's mask tiles), so that all run on the same arguments
    "kernel in view (2 passes)": jax.vmap(functools.partial(tile_aligned_attention, kinds=kinds_b, finish=finish_pass,
                                                            interpret=cfg.interpret, **blocks_b),
                                          in_axes=(0, 0, 0, None)),  # the heads: one more grid axis
    "stlib pallas_tile": lambda q, k, v, _: stlib.attention(q, k, v, band_b, impl="pallas_tile", interpret=cfg.interpret,
                                                            options=TileOptions(exp2=False), **blocks_b),
    "Splash (the band)": lambda q, k, v, _: stlib.attention(q, k, v, band_b, impl="splash", interpret=cfg.interpret),
}
print(f"{heads_b} x {length_b:,} x {D} {jnp.dtype(dtype_b).name}, band density {layout_b.density:.3f}, tiles "
      f"{bq_b} x {bkv_b}: {layout_b.kind_counts()}; the PARTIAL pass's mask tiles {tiles_b.nbytes:,} B")
compiled = {name: bench.compile_function(fn, qb, kb, vb, tiles_b) for name, fn in timed.items()}
for name, fn in compiled.items():  # compiled once: checked, then timed
    notebook.passed(f"{name} == reference", max_error(fn(qb, kb, vb, tiles_b), qb, kb, vb, band_b), tolerance(dtype_b))
rounds, trials = (3, 2) if cfg.on_tpu else (1, 1)
timings = notebook.time_side_by_side(
    cfg, compiled, qb, kb, vb, tiles_b, rounds=rounds, trials=trials, baseline="Splash (the band)", figure="06_timed",
    title=f"Band 0.25, {heads_b} x {length_b:,} x {D} {jnp.dtype(dtype_b).name}, tiles {bq_b} x {bkv_b}",
    notebook="06_tile_aligned", what="the kernel in view, pallas_tile and Splash on one band",
    shape=[heads_b, length_b, D], dtype=jnp.dtype(dtype_b).name, density=layout_b.density, block_q=bq_b,
    block_kv=bkv_b)

# %% [markdown]
# Read the table with its whiskers. The kernel in view and `pallas_tile` run the same tiles in the
# same two passes (the length is a multiple of 1,024, so `pallas_tile` has no ragged pass here) and
# merge them alike, so what remains between them is what the library adds around the same work.
# Splash skips the same EMPTY tiles of the band with blocks of its own, in one pass that masks every
# tile it does not know to be FULL: on a band that is already tile-aligned, the gap to Splash weighs
# the tile kernels' second pass and merge against that masking and those blocks. Where the token
# order matters (a temporal head in raster order, a sliding tile) Splash has no reorder of its own;
# notebook 08 gives it the tile kernels' 3-D tiled order on the sliding tile and times them side by
# side. On a CPU the times are the interpreter's and say nothing about a
# TPU.

# %% [markdown]
# ## Takeaway
#
# Tile-aligned sparsity is a property of the mask *and* the token order: the same temporal head
# goes from 67% of the tiles occupied, all PARTIAL, to 26% occupied and 91% FULL once its tokens
# are token-major; sliding tiles in 3-D tiled order have no PARTIAL tile at all. Then the kernel
# visits only non-empty tiles (the "flat" grid wastes no step even when rows differ), runs FULL
# tiles with no mask work, and either masks the few boundary tiles in a pass of their own (exact)
# or rounds them to the pair budget (balanced, approximate). The ragged end costs one small pass
# with one comparison per score and a log-sum-exp merge, not a mask on every tile. Notebook 07 writes
# the second generation, which folds all of that into one pass with keys on sublanes and runs a
# sliding tile's rows of 3-D tiles as mask-free patterns; notebook 08 times it all against dense
# Splash.
#
# ## Questions
#
# 1. The layout catalog has a temporal band *with* a frame-0 anchor. Why does the anchor spoil
#    the token-major order? (Try `stlib.block_layout(masks.temporal_band(case.grid, 0.25,
#    anchor=True).permute(stlib.token_major_order(case.grid)), 512, 1024).kind_counts()`.)
# 2. In the 3-D tiled order every occupied tile of the sliding-tile mask is FULL, yet the work
#    efficiency is 0.90, not 1. Where does the rest go?
# 3. When does the "rows" grid take exactly as many steps as "flat"?
#
# <details><summary>Answers</summary>
#
# 1. In token-major order frame 0 is every 21st position, so the anchor's keys sit in every kv
#    tile: every tile becomes non-empty, most of them PARTIAL. An anchor belongs in raster order,
#    or in a pass of its own merged by log-sum-exp like the ragged tail.
# 2. The padding: 45 rows make 5 full tiles of 8 rows plus one of 5, so the tiled order pads
#    each block of tiles to 48 rows (80,640 positions). An occupied 384 x 384 tile that holds
#    padding slots is computed in full, although its padding pairs are not allowed.
# 3. When every row of q tiles has the same number of non-empty tiles (then W equals each row's
#    count), e.g. a mask made of whole periodic blocks. A band is not like that: every q tile whose
#    window |q - k| <= w runs past either end of the sequence is shorter. For the 0.25 band at the
#    case-study shape w is 10,240 tokens (`masks.band_width_for_density` rounds up to 128), about 20 q tiles of 512 at each end, and each of them
#    pays skipped steps in "rows": 32,560 steps against 30,160 for "flat" (8% more, the table of
#    section 3).
#
# </details>
