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
# It ends with `stlib.video_attention`, which does all of it behind one call.

# %% tags=["parameters"]
SIZE = None  # "full", "small" or None (automatic: case-study sizes on a TPU, small elsewhere); env STLIB_SIZE wins

# %%
import sys
from pathlib import Path

# find stlib when the repository is cloned but not installed
repo = next((p for p in [Path.cwd(), *Path.cwd().parents] if (p / "stlib" / "__init__.py").is_file()), None)
if repo is not None and str(repo) not in sys.path:
    sys.path.insert(0, str(repo))

import jax.numpy as jnp
import numpy as np

import stlib
import stlib.kernels  # registers the Pallas kernels with stlib.attention
from stlib import configs, masks, notebook, plotting
from stlib.kernels.common import merge_partials
from stlib.kernels.tile import TileOptions, balanced_keep, split_passes, tile_attention, tile_work
from stlib.reorder import choose_orders

cfg = notebook.setup(SIZE)
max_error, tolerance = notebook.max_error, notebook.tolerance  # checks against the plain reference

workload, case = cfg.workload, configs.CASE_STUDY
H, L, D = workload.qkv_shape
q, k, v = stlib.random_qkv(workload.qkv_shape, workload.dtype, seed=0)
scale = D**-0.5
TOL = tolerance(workload.dtype)

# %% [markdown]
# ## 1. Token reordering
#
# A temporal head (Sparse VideoGen) lets a token see the same spatial location in every frame. In
# raster order (t, y, x) those keys are 3,600 tokens apart: every tile they touch is PARTIAL. In
# token-major order (y, x, t) the 21 frames of one location are neighbours, and the pattern
# becomes a plain band |p(q) - p(k)| <= w. Below: the temporal band at density 0.25 on the
# case-study grid, in both orders, with the v6e default tiles of 512 x 1,024 (layouts are cheap
# to build on a CPU: about a second each at 75,600 tokens).

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
for name, lay in sta_layouts.items():
    print(f"{name:<44} occupied tiles {lay.occupancy:.3f}  partial {lay.partial_fraction:5.1%} of occupied  "
          f"work efficiency {lay.work_efficiency:.2f}")
fig = plotting.occupancy_comparison(sta_layouts, "Sliding tile (3 x 8 x 16 tiles, window 3 x 3 x 3) at 75,600 "
                                    "tokens, 384 x 384 tiles: raster vs 3-D tiled order")
plotting.save(fig, cfg.figure("06_reorder_sliding_tile"))

# %% [markdown]
# `stlib.reorder.choose_orders` makes this choice by measurement: it builds the layout of the mask
# in each candidate order (raster, token-major, and the 3-D tiled orders the mask suggests) and
# keeps the one with the fewest non-empty tiles. Reordering is a gather before the kernel and a
# gather after it (not part of the kernel time in the case study). Here is the kernel on this
# notebook's shape, with the reordering written out: permute q, k, v; run `pallas_tile` on the
# permuted mask; restore the output.

# %%
grid = workload.grid
checks = {
    "temporal band 0.25": masks.temporal_band(grid, 0.25),
    "sliding tile": masks.sliding_tile(grid, (1, 8, 16), (3, 1, 1)) if cfg.size == "small" else sta,
}
for name, mask in checks.items():
    (order,) = choose_orders(grid, mask, cfg.block_q, cfg.block_kv)
    if cfg.size == "small":
        block = (128, 128)  # one 1 x 8 x 16 tile of the small grid is 128 tokens
    else:
        block = (384, 384) if "tiled" in order.name else (cfg.block_q, cfg.block_kv)
    permuted = mask.permute(order)
    out = order.restore(stlib.attention(order.apply(q), order.apply(k), order.apply(v), permuted, impl="pallas_tile",
                                        block_q=block[0], block_kv=block[1], interpret=cfg.interpret))
    err = max_error(out, q, k, v, mask)
    assert err < TOL, (name, err)
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
# exact budget (`stlib.kernels.tile.balanced_keep`). One pass, no masking work at all; but the
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
small = configs.SMALL_CPU
qs, ks, vs = stlib.random_qkv(small.qkv_shape, jnp.float32, seed=1)
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
fig = plotting.work_bars(work_records, "pallas_tile grids at the case-study shape (10 x 75,600 x 128, 512 x 1,024 "
                         "tiles): computed, not measured")
plotting.save(fig, cfg.figure("06_grids"))

# %%
causal = masks.frame_causal(grid)
causal_layout = stlib.block_layout(causal, cfg.block_q, cfg.block_kv)
for form in ("rows", "flat"):
    out = tile_attention(q, k, v, causal_layout, scale=scale, options=TileOptions(form=form), interpret=cfg.interpret)
    err = max_error(out, q, k, v, causal)
    assert err < TOL, (form, err)
    print(f"PASSED  pallas_tile ({form}) with the frame-causal mask == reference (max error {err:.2e}); "
          f"{tile_work(causal_layout, H, D, TileOptions(form=form)).grid_steps:,} grid steps")

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
print(f"PASSED  stlib.kernels.common.merge_partials == hand merge (max error {gap:.1e})")

whole = stlib.block_layout(masks.full(length), 128, 128)
for p in split_passes(whole, "exact"):
    print(f"inside pallas_tile: pass {p.name!r:<9} {int(p.selected.sum()):>3} tiles, mask work: {p.plan.mode!r}")
out = tile_attention(qr, kr, vr, whole, scale=scale, interpret=cfg.interpret)
err = float(jnp.max(jnp.abs(out - merged)))
assert err < tolerance(jnp.float32), err
print(f"PASSED  pallas_tile on the whole sequence == the hand merge (max error {err:.2e})")

# %% [markdown]
# ## Everything at once: `stlib.video_attention`
#
# A per-head mask in the Sparse VideoGen style: half the heads spatial (a band in raster order),
# half temporal (a band in token-major order). `video_attention` takes raster-order q, k, v and the
# raster-order mask, chooses an order per head, gathers, runs the kernel on per-head tables and
# restores raster order.

# %%
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
# ## Takeaway
#
# Tile-aligned sparsity is a property of the mask *and* the token order: the same temporal head
# goes from 67% of the tiles occupied, all PARTIAL, to 26% occupied and 91% FULL once its tokens
# are token-major; sliding tiles in 3-D tiled order have no PARTIAL tile at all. Then the kernel
# visits only non-empty tiles (the "flat" grid wastes no step even when rows differ), runs FULL
# tiles with no mask work, and either masks the few boundary tiles in a pass of their own (exact)
# or rounds them to the pair budget (balanced, approximate). The ragged end costs one small pass
# with one comparison per score and a log-sum-exp merge, not a mask on every tile. Notebook 07
# times it all against dense Splash.
#
# ## Exercises
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
#    count), e.g. a mask made of whole periodic blocks. For a band only the first and last rows
#    are shorter, so the two differ by under 10%.
#
# </details>
