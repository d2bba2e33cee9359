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
# # 02 · Video masks
#
# A video token has coordinates (t, y, x): frame, row, column. Most of what a video diffusion
# model attends to is near in space or in time, and the published sparse-attention methods turn
# that into masks: Sparse VideoGen's spatial and temporal heads, neighbourhood attention (NATTEN),
# Sliding Tile Attention (FastVideo), Radial Attention, frame-causal attention for autoregressive
# video, and global text tokens. `stlib.masks` builds all of them lazily: a mask answers "may
# query i see key j" for any block of indices without ever materialising L x L.

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
import numpy as np

import stlib
from stlib import masks, notebook, plotting
from stlib.masks import case_study_masks

cfg = notebook.setup(SIZE)

# %% [markdown]
# ## Every pattern on a grid you can see
#
# 4 frames of 6 x 8 tokens: 192 tokens, so each mask is a 192 x 192 picture. Rows are queries,
# columns keys, both in raster (t, y, x) order; the 48-token frames show as blocks. (On a grid this
# small the SVG rule, which rounds band widths up to a multiple of 128, would allow almost
# everything, so the two bands get their widths directly.)

# %%
small = stlib.VideoGrid(4, 6, 8)
gallery = {
    "spatial: same frame (SVG)": masks.spatial(small, frame_window=0),
    "spatial band (w = 20) + frame-0 anchor": masks.spatial_band(small, width=20, anchor=True),
    "temporal: location ± 1, every frame (SVG)": masks.temporal(small, spatial_window=1),
    "temporal band (w = 8, raster view)": masks.temporal_band(small, width=8),
    "neighbourhood 3x3x3": masks.neighborhood(small, 3),
    "sliding tile 1x2x4, window 3x3x1": masks.sliding_tile(small, (1, 2, 4), (3, 3, 1)),
    "radial, frame-0 sink": masks.radial(small, 8),
    "frame-causal": masks.frame_causal(small),
    "causal-in-time neighbourhood": masks.neighborhood(small, (2, 3, 3), causal=(True, False, False)),
    "dilated neighbourhood (x: 2)": masks.neighborhood(small, (1, 3, 3), dilation=(1, 1, 2)),
    "16 text tokens + neighbourhood": masks.global_tokens(masks.neighborhood(small, 3), 16),
    "per head: head 1 of [spatial, temporal]": masks.per_head([masks.spatial(small), masks.temporal(small)]).head(1),
}
fig = plotting.mask_gallery(gallery, f"Video masks on a {small.shape} grid ({small.num_tokens} tokens, raster order)")
plotting.save(fig, cfg.figure("02_mask_gallery"))

# %% [markdown]
# ## Exact semantics, checked
#
# Neighbourhood attention follows NATTEN: along each axis the window holds exactly `kernel_size`
# positions centred on the query and is *shifted*, not clipped, at the borders, so border tokens
# see as many keys as central ones. Here is that rule written out for one axis, checked pair by
# pair against the library's 3-D mask.

# %%
def window_1d(i, n, kernel):
    start = min(max(i - kernel // 2, 0), n - kernel)
    return set(range(start, start + kernel))


kernel = (3, 3, 5)
lib = masks.neighborhood(small, kernel).to_dense()
coords = np.stack(small.coords(np.arange(small.num_tokens)), axis=1)
mine = np.array([[all(kc in window_1d(qc, n, kk) for qc, kc, n, kk in zip(qa, ka, small.shape, kernel))
                  for ka in coords] for qa in coords])
mismatches = int((mine != lib).sum())
assert mismatches == 0
print(f"PASSED  neighbourhood {kernel} == per-axis shifted windows on every pair (max error {mismatches})")
print(f"every query sees exactly {lib.sum(1).min()}..{lib.sum(1).max()} keys (3 x 3 x 5 = 45)")

# %% [markdown]
# ## Density at the case-study grid
#
# The same builders at 21 x 45 x 80 (75,600 tokens). Densities are counted exactly, row by row from
# each mask's key intervals, without an L x L array.

# %%
catalog = case_study_masks()
densities = {}
for name, mask in catalog.items():
    densities[name] = stlib.block_layout(mask, 512, 1024).density
    print(f"{name:<40} density {densities[name]:.3f}")
case_tokens = next(iter(catalog.values())).length
print(f"pairs per head at {case_tokens:,} tokens: {case_tokens**2 / 1e9:.1f} billion")
fig = plotting.named_bars(densities, "Density of each pattern at 21 x 45 x 80 (75,600 tokens; computed, "
                          "hardware-independent)", "density (allowed pairs / L²)")
plotting.save(fig, cfg.figure("02_case_study_density"))

# %% [markdown]
# ## Takeaway
#
# Each pattern keeps a different few percent to a few tens of percent of the 5.7 billion pairs per
# head. Density is what the ideal speed-up is measured against (1 / density): a mask at density
# 0.25 could, at best, make attention 4x faster. Whether a kernel gets anywhere near that depends on
# how the allowed pairs fall on the hardware's tiles: notebook 03.
#
# ## Questions
#
# 1. Why does `temporal band (raster view)` look like scattered diagonals while the spatial band is
#    one band? What does it look like after `.permute(stlib.token_major_order(small))`?
# 2. Which query sees the fewest keys under `radial(small, 8)`, and why does the frame-0 sink
#    matter for it?
# 3. Show that `sliding_tile(small, (1, 2, 4), (3, 3, 1))` equals
#    `neighborhood(small, (3, 6, 4), stride=(1, 2, 4))` on this grid, which the tile divides
#    (hint: `np.array_equal(a.to_dense(), b.to_dense())`).
#
# <details><summary>Answers</summary>
#
# 1. The temporal band is a band in token-major (y, x, t) order, where a location's 4 frames are
#    consecutive: |i - j| <= 8 reaches the same location and the next one on either side (in
#    raster x) in every frame, and the second one on either side in some frames: 17 keys. In raster order those keys lie in runs one frame (48 tokens) apart. After the
#    permutation it is exactly the plain band |i - j| <= w.
# 2. Count them: `masks.radial(small, 8).to_dense().sum(1).reshape(4, 48).min(1)` gives 61, 67, 67,
#    67 keys per frame. The fewest are seen by queries of frame 0 at the border of the frame (61):
#    the sink gives every query all of frame 0, which adds nothing for frame 0's own queries, while
#    a later frame's queries gain frame 0 on top of their own window. Without the sink
#    (`sink=False`) the first and last frames tie at 22: their windows reach one way in time only,
#    halving with each doubling of the distance. The sink keeps long-range context (and the softmax
#    denominator) from collapsing.
# 3. Along each axis both select the `window` tiles around the query's tile, shifted at the borders:
#    the stride groups queries by tile and uses the tile centre's window (a window of 3 tiles of 2
#    rows is a kernel of 6 rows).
#
# </details>
