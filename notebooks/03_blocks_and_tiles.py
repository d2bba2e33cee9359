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
# # 03 · Blocks and tiles
#
# A TPU does not compute one score at a time: a flash-attention kernel loads a block of
# `block_q` queries and a block of `block_kv` keys into VMEM and computes their whole
# `block_q x block_kv` tile of scores on the matrix unit. So a kernel's cost is set by tiles, not
# by pairs. Each tile of a mask is one of three kinds (the Splash convention):
#
# * **EMPTY**: no allowed pair: the tile can be skipped entirely;
# * **FULL**: every pair allowed: computed with no mask at all;
# * **PARTIAL**: some pairs allowed: computed *in full*, plus the work of evaluating and applying
#   the mask on the vector unit.
#
# `stlib.block_layout(mask, block_q, block_kv)` classifies every tile, row by row from the mask's
# key intervals, without an L x L array: cheap enough to build at the case-study shape on a CPU.

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
import functools

import jax
import jax.numpy as jnp
import numpy as np

import stlib
from stlib import bench, masks, notebook, plotting
from stlib.masks import case_study_masks

cfg = notebook.setup(SIZE)

# %% [markdown]
# ## Tile kinds, checked by brute force
#
# On a small grid we can afford the dense mask: sum it over each tile and compare with the layout.

# %%
small = stlib.VideoGrid(4, 6, 8)
mask = masks.neighborhood(small, (3, 3, 5))
layout = stlib.block_layout(mask, 16, 32)
dense = mask.to_dense()
nq, nk = layout.grid_shape
padded = np.zeros((nq * 16, nk * 32), int)
padded[: small.num_tokens, : small.num_tokens] = dense
brute = padded.reshape(nq, 16, nk, 32).sum(axis=(1, 3))
err = int(np.abs(brute - layout.counts[0]).max())
assert err == 0
print(f"PASSED  per-tile allowed-pair counts == brute force (max error {err}); kinds: {layout.kind_counts()}")

# %% [markdown]
# ## Occupancy of every pattern at the case-study shape, in raster order
#
# Tiles of 512 queries x 1,024 keys (the default blocks of Splash and of the first stlib kernels). Grey tiles are skipped,
# blue tiles run mask-free, orange tiles run in full *and* pay for the mask.

# %%
catalog = case_study_masks()
raster = {name: m for name, m in catalog.items() if "order" not in name and "token-major" not in name
          and "per-head" not in name}
layouts = {name: stlib.block_layout(m, 512, 1024) for name, m in raster.items()}
for name, lay in layouts.items():
    print(f"{name:<32} density {lay.density:.3f}  occupied tiles {lay.occupancy:.3f}  "
          f"partial {lay.partial_fraction:5.1%} of occupied  work efficiency {lay.work_efficiency:.2f}")
fig = plotting.kind_gallery(layouts, "Tile kinds at 21 x 45 x 80 (75,600 tokens), raster order, 512 x 1,024 tiles")
plotting.save(fig, cfg.figure("03_tile_kinds"))
fig = plotting.density_vs_work(layouts, "Useful pairs (density) vs pairs a tile-skipping kernel computes")
plotting.save(fig, cfg.figure("03_density_vs_occupancy"))

# %% [markdown]
# Read the two figures together: a band keeps its tiles mostly FULL, so a tile-skipping kernel
# computes barely more than the allowed pairs. The temporal pattern, sliding tile and neighbourhood
# masks scatter their pairs over many tiles in raster order: almost every occupied tile is PARTIAL,
# and the kernel computes many times the useful work.

# %% [markdown]
# ## A partial tile costs a full tile, plus the masking
#
# Measured directly: two masks with exactly the same occupied tiles, one with every pair of those
# tiles allowed, one with only half of them (every other key, so that no part of a tile is empty
# either). The second has half the density. Both are sliding-tile masks (notebook 02) on the
# sequence laid out as a 1 x (L / 2) x 2 grid, where a tile of `block_kv / 2` rows holds the
# `block_kv` consecutive tokens of one kv tile: with tiles two columns wide, a query sees its tile
# and one on either side, three whole kv tiles (FULL); with tiles one column wide, only its own
# column of the same three (PARTIAL). Each is checked against the reference, then both are timed.
#
# On a CPU (the small configuration: 2 heads x 4,096 tokens in float32, 256 x 256 tiles) the
# tile-skipping `impl="xla"` path computes the same tiles for both, and in the second it also
# applies the mask: plain XLA compiled for the CPU, an honest measurement of that backend. On a TPU
# (the case-study shape in bfloat16, its tiles) the pair runs through `pallas_tile_lane_dense`, the
# library's tile kernel (notebook 07), which computes only the occupied tiles and evaluates the
# mask only on the tiles that need it.

# %%
if cfg.size == "full":
    H, L, D, dtype = cfg.workload.num_heads, cfg.workload.num_tokens, cfg.workload.head_dim, jnp.bfloat16
    impl, block_q, block_kv = "pallas_tile_lane_dense", cfg.block_q, cfg.block_kv
else:
    H, L, D, dtype = 2, 4096, 64, jnp.float32
    impl, block_q, block_kv = "xla", 256, 256
columns = stlib.VideoGrid(1, L // 2, 2)  # token 2 y + x: a tile of block_kv / 2 rows is one kv tile
cases = {"FULL tiles": masks.sliding_tile(columns, (1, block_kv // 2, 2), (1, 3, 1)),
         "the same tiles, PARTIAL (half the keys)": masks.sliding_tile(columns, (1, block_kv // 2, 1), (1, 3, 1))}
layouts = {name: stlib.block_layout(mask, block_q, block_kv) for name, mask in cases.items()}
q, k, v = stlib.random_qkv((H, L, D), dtype, seed=0)
compiled = {name: bench.compile_function(functools.partial(stlib.attention, mask=mask, impl=impl, block_q=block_q,
                                                           block_kv=block_kv), q, k, v)
            for name, mask in cases.items()}
for name, fn in compiled.items():  # the reference on every row at 4,096 tokens, on sampled rows at the case study
    notebook.passed(f"{impl}, {name}", notebook.max_error(fn(q, k, v), q, k, v, cases[name]), notebook.tolerance(dtype))
rounds, trials = 3, 3
tracker = bench.Progress(len(cases), "timing")  # a progress bar (tqdm) with its estimate of the time left
# both masks timed in rounds, in a shuffled order, so a slow spell of a shared machine falls on both;
# the fastest call of each is its cost with the least noise on top
timings = bench.time_interleaved(compiled, q, k, v, rounds=rounds, trials=trials, progress=lambda name: tracker.step(name))
calls = min(t.trials for t in timings.values())
measured = f"measured time (fastest of {calls})"
rows = {}
for name, lay in layouts.items():
    timing = timings[name]
    rows[name] = {"allowed pairs (useful work)": lay.density * L * L,
                  "tiles computed": int((lay.kinds > 0).sum()),
                  measured: timing.min_ms}
    print(f"{name:<42} density {lay.density:.3f}  tiles computed {int((lay.kinds > 0).sum())}  "
          f"kinds {lay.kind_counts()}  fastest {timing.min_ms:.1f} ms (median {timing.median_ms:.1f}, "
          f"max {timing.max_ms:.1f})")
full, half = (rows[name][measured] for name in rows)  # in the order of `cases`
# plain XLA on a CPU, a compiled Pallas kernel on a TPU (cfg.where names the chip)
where = cfg.where if cfg.on_tpu else f"{jax.default_backend().upper()} (plain XLA: not a TPU time)"
print(f"half the pairs cost {half / full:.2f}x the time of all of them: {impl}, {H} heads x {L:,} tokens x {D}, "
      f"{jnp.dtype(dtype).name}, on {where}")
fig = plotting.relative_bars(rows, "FULL tiles", f"Half the pairs, the same tiles: a PARTIAL tile costs a FULL one\n"
                             f"({H} heads x {L:,} tokens, {block_q} x {block_kv} tiles, impl={impl!r}, "
                             f"{jnp.dtype(dtype).name}; measured on {where})", xlabel="relative to the FULL tiles")
plotting.save(fig, cfg.timed_figure("03_partial_costs_full"))
kept = cfg.record("03_blocks_and_tiles", "the same tiles FULL and PARTIAL (half the keys)", impl=impl,
                  shape=[H, L, D], dtype=jnp.dtype(dtype).name, blocks=[block_q, block_kv],
                  cases=[{"mask": name, "density": layouts[name].density, "tiles": rows[name]["tiles computed"],
                          "median_ms": t.median_ms, "min_ms": t.min_ms, "max_ms": t.max_ms, "compile_ms": t.compile_ms,
                          "calls": t.trials} for name, t in timings.items()])
if kept:
    print(f"recorded in data/notebook_measurements.jsonl ({kept['device_kind']}, revision {kept.get('git_rev')})")

# %% [markdown]
# The figure puts both masks side by side, each measure relative to the FULL-tile mask: half the
# allowed pairs, the same tiles computed, and no less time. The ratio printed above is nowhere near
# the half that the pairs would suggest: the PARTIAL tiles do all the work of FULL ones and then
# apply the mask on top, which in plain XLA on a CPU is one select per score next to its share of a
# matrix product, and on a TPU is vector-unit work on every score of the tile while the matrix unit
# does the products.
#
# ## Tile size is a trade-off
#
# Bigger tiles cover the mask more coarsely: more of each occupied tile is wasted, so work
# efficiency (allowed pairs / pairs in occupied tiles) falls. Smaller tiles cost in other ways:
# more grid steps (every step pays the loop's overhead and issues its own copies) and bigger
# prefetched tables, which must fit in SMEM (the hardware table of notebook 00; the tables are
# padded to whole 8 x 128 words: a row of q tiles takes at least 128 words, so once no row is
# wider than that, from 512 x 512 on, the three patterns' tables are the same size, set by the
# number of q tiles alone). Both sides for three patterns, per head, in raster order: grid steps
# of the compacted "rows" grid a tile-skipping kernel walks (q tiles x the widest row, notebook
# 06), and of the full grid a block-sparse kernel walks (notebook 05); SMEM of the "rows" tables
# (`layout.table_bytes("rows")`).

# %%
from stlib.device import smem_limit

sizes = [(128, 128), (256, 256), (512, 512), (512, 1024), (1024, 2048)]
patterns = ("band (density 0.25)", "spatial (frame window 1)", "sliding tile 3x8x16, window 3")
efficiency, steps, table = ({name: [] for name in patterns} for _ in range(3))
steps["full grid (block-sparse)"] = []
for bq, bkv in sizes:
    for name in patterns:
        lay = stlib.block_layout(catalog[name], bq, bkv)
        efficiency[name].append(lay.work_efficiency)
        steps[name].append(lay.grid_shape[0] * lay.max_row_width)
        table[name].append(lay.table_bytes("rows") / 1024)
    steps["full grid (block-sparse)"].append(lay.grid_shape[0] * lay.grid_shape[1])
shapes = [f"{bq:,} x {bkv:,}" for bq, bkv in sizes]
for i, shape in enumerate(shapes):
    print(f"{shape:>13}: " + "; ".join(f"{name.split(' (')[0].split(' 3x')[0]} efficiency {efficiency[name][i]:.2f}, "
                                       f"{steps[name][i]:,} steps, {table[name][i]:,.0f} KiB" for name in patterns))
fig = plotting.tile_size_tradeoff(
    shapes, {"useful work (higher is better)": ("allowed / computed pairs", efficiency, False),
             "grid steps per head (lower is better)": ("grid steps", steps, True),
             "SMEM tables, rows form (must fit)": ("KiB of SMEM", table, True)},
    "Tile size trade-off at 75,600 tokens, raster order: coarse tiles waste work, fine tiles cost steps and SMEM\n"
    "(computed from the layouts, hardware-independent)",
    limits={"SMEM tables, rows form (must fit)": (smem_limit() / 1024, f"SMEM per device ({smem_limit() / 1024:,.0f} KiB)")})
plotting.save(fig, cfg.figure("03_tile_size"))

# %% [markdown]
# ## Takeaway
#
# Sparsity pays in tiles, not pairs. A kernel can skip EMPTY tiles and run FULL tiles mask-free, but
# a PARTIAL tile costs a whole tile plus masking. In raster order the video patterns that matter
# most (temporal, sliding tile, neighbourhood) are almost all PARTIAL: that is the case study's
# lesson of a sparse mask that is no faster than dense. Tile size trades wasted work against grid
# steps and SMEM. Next, notebook 04 writes the flash-attention kernel that computes one tile at a
# time in Pallas, notebook 05 teaches it to skip EMPTY tiles and run FULL ones mask-free (the
# Splash way), and notebook 06 reorders the tokens so the same masks become mostly FULL and EMPTY
# tiles.
#
# ## Questions
#
# 1. Why does the band at density 0.25 have only about 2 PARTIAL tiles per row of tiles?
# 2. Sliding tile with 3 x 8 x 16 tiles: why is nearly every occupied raster-order tile PARTIAL even
#    though the mask is made of whole 3-D tiles?
# 3. Predict the work efficiency of the spatial (frame window 1) mask with one frame per q tile and
#    kv tiles of 3,712 keys (3,600 rounded up to a multiple of 128, as a kv tile must be), then check
#    with `stlib.block_layout(catalog["spatial (frame window 1)"], 3600, 3712).work_efficiency`.
#
# <details><summary>Answers</summary>
#
# 1. Only the two tiles each row's band edges cross are partial; everything between them is inside
#    the band (FULL) and everything beyond is outside (EMPTY).
# 2. A 3-D tile's tokens are not contiguous in raster order: its 16-token x-runs are scattered over
#    3 frames x 8 rows, so every 512 x 1,024 raster tile meets a tile window's edge somewhere.
# 3. Not close to 1 (about three quarters): a q tile is one frame, and its allowed keys are the
#    three whole frames around it (10,800 keys), but kv tiles of 3,712 keys drift against frames of
#    3,600, so those frames straddle four kv tiles, two of them FULL and two PARTIAL
#    (`kind_counts()`: 42 FULL, 38 PARTIAL). Tile-aligned means the kv
#    tiles must line up with the frames too, which 128-multiples of a 3,600-token frame cannot.
#
# </details>
