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
# # 09 · Sparse VideoGen routing: which pattern per head, at what budget, and what it loses
#
# The case study's sparse kernel is driven by a router (Sparse VideoGen, SVG, as ported to TPU in
# maxdiffusion's pull request #480): per head, a few sampled queries decide whether the head is
# *spatial* (it attends within its frame) or *temporal* (it attends to its own position in other
# frames). Spatial heads keep raster order (t, y, x); temporal heads are permuted to token-major
# order (y, x, t). In its own order each head's mask is then a 1-D band |p - p'| <= w plus an
# anchor, the first H*W keys *of the reordered sequence*. The band half-width comes from the density
# budget, w = L (1 - sqrt(1 - d)) rounded up to 128. Tiles are FULL or PARTIAL. Balanced rounding
# keeps the fullest PARTIAL tiles and drops the rest, so the computed pairs stay within 2% of the
# exact mask's. Tiles whose keys run into the sequence padding go to a pass of their own.
#
# This notebook walks **routing -> reorder -> tile plan -> kernel -> restore** at the size its first
# cell picks (the case study's 10 x 75,600 x 128 on a TPU, a small grid elsewhere), shows the budget
# at the case-study shape, and measures what each pattern loses against dense attention.
#
# **The inputs are synthetic** (`stlib.synthetic.video_qkv`). Random normal q / k give nearly
# uniform attention, on which every sparse pattern looks equally bad. These inputs instead plant,
# per head, attention that concentrates in space or in time: rotary-style position features with
# per-head widths and temperature, plus a smooth random field. No model produced them. The error
# numbers below measure the machinery on inputs built to be sparse, not Wan's quality.

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
import time

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

import stlib
from stlib import checks, configs, exercises, notebook, plotting
from stlib.bench.records import compile_function, read_records
from stlib.reference import reference_attention
from stlib.routing import Anchor, exact_mask, route, svg_plan
from stlib.synthetic import video_qkv

cfg = notebook.setup(SIZE, solutions=SOLUTIONS)
max_error, tolerance = notebook.max_error, notebook.tolerance
workload = cfg.workload
grid = workload.grid
PLANTED = ["spatial", "temporal"] * (workload.num_heads // 2) + ["spatial"] * (workload.num_heads % 2)
DENSITY = 0.15
# one compiled program (op by op, each of its few dozen ops per head would be dispatched alone)
q, k, v = jax.jit(lambda: video_qkv(grid, PLANTED, workload.head_dim, seed=0, dtype=workload.dtype))()
print(f"synthetic q, k, v {q.shape} {q.dtype}; planted head kinds {PLANTED}")

# %% [markdown]
# ## The synthetic attention next to the masks
#
# One query in the middle of the video, per planted head: its dense attention over all keys (each
# frame a panel, left to right), then which keys the spatial band and the temporal band (each with
# the reordered anchor) let it see at density 0.15.

# %%
def frames_image(row):
    """[L] over raster tokens -> [Y, T * X] image (frames side by side)."""
    t, y, x = grid.shape
    return np.asarray(row).reshape(t, y, x).transpose(1, 0, 2).reshape(y, t * x)


query = grid.raster_index(grid.frames // 2, grid.height // 2, grid.width // 2)
width = stlib.masks.band_width_for_density(grid.num_tokens, DENSITY)
keys = np.arange(grid.num_tokens)
mask_rows = {kind: np.broadcast_to(exact_mask(grid, kind, width, Anchor.REORDERED).allowed(np.array([query]), keys),
                                  keys.shape) for kind in ("spatial", "temporal")}
shown = [0, 1]  # one planted spatial head, one planted temporal head
fig, axes = plt.subplots(len(shown), 3, figsize=(13, 1.9 * len(shown) + 0.8), squeeze=False, constrained_layout=True)
for r, h in enumerate(shown):
    scores = (q[h, query].astype(jnp.float32) @ k[h].astype(jnp.float32).T) / np.sqrt(workload.head_dim)
    probs = jax.nn.softmax(scores)
    panels = [(f"head {h} (planted {PLANTED[h]}): dense attention of one query", np.sqrt(frames_image(probs)), "magma")]
    panels += [(f"{kind} band + anchor: keys kept", frames_image(mask_rows[kind]), "Greys_r") for kind in mask_rows]
    for ax, (title, image, cmap) in zip(axes[r], panels):
        ax.imshow(image, cmap=cmap, aspect="auto", interpolation="nearest")
        for f in range(1, grid.frames):
            ax.axvline(f * grid.width - 0.5, color="tab:cyan", lw=0.6)
        ax.set(title=title, xticks=[], yticks=[], xlabel="frames left to right (x within each)", ylabel="y")
        ax.grid(False)
fig.suptitle(f"synthetic inputs {grid.shape}: attention (sqrt of probability) and masks at density {DENSITY}")
plotting.save(fig, cfg.figure("09_synthetic_attention"))
plt.show()

# %% [markdown]
# ## 1 · Routing
#
# `stlib.routing.route` samples 64 query rows (seeded) and scores both candidates against dense
# attention on those rows, on the device in one jitted call. Per head and candidate it takes the
# mean squared error between the masked attention probabilities and the dense ones, and keeps the
# smaller. The public design compares attention *outputs*; the probabilities need no v and bound
# the output error. The plan it returns is the same one `svg_plan` builds for fixed kinds.

# %%
plan = route(q, k, grid, DENSITY)  # compiles the scoring function on first use
start = time.perf_counter()
plan = route(q, k, grid, DENSITY)
route_s = time.perf_counter() - start
print(f"routed kinds {[str(x) for x in plan.kinds]} (planted {PLANTED}); route() took {route_s * 1e3:.0f} ms "
      f"on {jax.default_backend().upper()} (sampling, scoring, and the tile plan)")
for c, kind in enumerate(plan.routing.candidates):
    print(f"  {kind:<8} mse per head {np.array2string(plan.routing.mse[c], precision=2)}   "
          f"recall per head {np.array2string(plan.routing.recall[c], precision=3)}")
assert [str(x) for x in plan.kinds] == PLANTED
print("PASSED  routing recovers every planted head kind")

# %% [markdown]
# ### Exercise 1: the pairs a band keeps
#
# Both candidates are bands of half-width w in their own order, and the budget is a density.
# `masks.band_width_for_density` turns a density into w with the formula in the introduction, which
# treats the band as continuous (it counts the triangles cut off at the ends, not the diagonal's
# own pairs), and rounds w up to a multiple of 128. How many pairs does a band really
# keep? Write `band_pairs(length, width)`: the exact number of (query, key) pairs with |q - k| <= w
# in an L x L grid, in closed form (no loop over rows). The check compares it with a count row by
# row, at lengths up to the case study's and widths from 0 to past L; then it asks for L = 10^12,
# where only a closed form answers (a row of the grid more adds 2w + 1 pairs); then it reads this
# notebook's band with it. A function that builds an array over 10^12 rows gets a NOT YET, not the
# host's memory: `exercises.verify` runs the function under test under a bound on what it may
# allocate (`exercises.bounded_memory`).
#
# Run the notebook with `SOLUTIONS = "hide"` (first cell) to write it yourself: the stub raises, and
# the check prints NOT YET and what is wrong. `exercises.show("09.band_pairs")` prints a solution.
#
# *Hint 1:* away from the ends a row keeps 2w + 1 keys.
# *Hint 2:* near the ends the band hangs past the grid: two triangles of w(w + 1) / 2 pairs each,
# while w < L.

# %%
@exercises.fill_in("09.band_pairs")
def band_pairs(length, width):
    # --- your code here: return an int, the pairs |q - k| <= width of an L x L grid ---
    raise NotImplementedError


def check_pairs(band_pairs):
    def counted(length, width):  # row q keeps the keys max(q - w, 0) ... min(q + w, L - 1)
        rows = np.arange(length, dtype=np.int64)
        return int(np.sum(np.minimum(rows + width, length - 1) - np.maximum(rows - width, 0) + 1))

    cases = [(length, w) for length in (1_152, 4_096, 23_400, 75_600)
             for w in (0, 1, 127, 1_000, length // 3, length - 1, length + 5)]
    wrong = [(length, w, band_pairs(length, w), counted(length, w)) for length, w in cases
             if band_pairs(length, w) != counted(length, w)]
    if wrong:
        length, w, got, want = wrong[0]
        raise exercises.NotYet(f"{len(wrong)} of {len(cases)} wrong; L = {length:,}, w = {w:,}: {got:,} instead of {want:,}")
    huge, w = 10**12, 10**6  # far past any row count: one more row of the grid adds 2w + 1 pairs
    if band_pairs(huge, w) - band_pairs(huge - 1, w) != 2 * w + 1:
        raise exercises.NotYet("at L = 10^12 one row more does not add 2w + 1 pairs (integer overflow?)")
    length = grid.num_tokens
    return (f"exact at all {len(cases)} (length, width) pairs; this notebook's band (L = {length:,}, w = {width}) keeps "
            f"{band_pairs(length, width) / length**2:.3f} of the pairs for a budget of {DENSITY}")


exercises.verify("09.band_pairs", check_pairs, band_pairs)

# %% [markdown]
# ### Exercise 2: the routing score
#
# Write `routing_error(q_rows, k, allowed, scale)`, the score `route` keeps the smaller of: for one
# candidate mask, the mean over sampled rows and keys of the squared difference between the masked
# softmax (the dense probabilities the mask keeps, renormalised) and the dense softmax; q_rows
# `[H, S, D]`, k `[H, L, D]`, allowed `[S, L]`, one value per head. The check scores both candidates
# on the rows `route` sampled above and compares with the library's `route_scores`.
#
# *Hint 1:* the masked softmax is the dense one's kept entries divided by their sum per row.
# *Hint 2:* a row the mask leaves empty keeps no mass; divide by 1 there.
# `exercises.show("09.routing_error")` prints a solution.

# %%
@exercises.fill_in("09.routing_error")
def routing_error(q_rows, k, allowed, scale):
    # --- your code here: return [H] ---
    raise NotImplementedError


def check_error(routing_error):
    from stlib.routing import route_scores

    rows = jnp.asarray(plan.routing.rows)
    q_rows, kf = jnp.take(q, rows, axis=1).astype(jnp.float32), k.astype(jnp.float32)
    allowed = np.stack([np.asarray(exact_mask(grid, kind, width, Anchor.REORDERED).allowed(np.asarray(plan.routing.rows)[:, None], keys))
                        for kind in plan.routing.candidates])
    hollow = allowed[:1].copy()
    hollow[0, 0] = False  # a third candidate: the first with its first sampled row left empty
    allowed = np.concatenate([allowed, hollow])
    want, _, _ = route_scores(q_rows, kf, jnp.asarray(allowed), workload.head_dim**-0.5)
    got = jnp.stack([routing_error(q_rows, kf, jnp.asarray(a), workload.head_dim**-0.5) for a in allowed])
    if got.shape != want.shape:
        raise exercises.NotYet(f"shape {got.shape} for the candidates, expected {want.shape}")
    if not bool(jnp.all(jnp.isfinite(got))):
        raise exercises.NotYet("NaN or inf: a row the mask leaves empty keeps no mass (divide by 1 there)")
    gap = float(jnp.max(jnp.abs(got - want) / jnp.maximum(jnp.abs(want), 1e-30)))
    if not gap < 1e-3:
        raise exercises.NotYet(f"relative gap {gap:.1e} to route_scores: is the kept mass renormalised per row?")
    return (f"both candidates' scores, and one with an empty row, == route_scores on {len(rows)} sampled rows "
            f"(relative gap {gap:.1e})")


exercises.verify("09.routing_error", check_error, routing_error)

# %% [markdown]
# ## 2 · Reorder and 3 · the tile plan
#
# Each head runs in its own order (`plan.orders`). In that order, with the reordered anchor,
# *every* head's mask is the same: band | key < H*W, so spatial and temporal heads cost the same
# tiles. `plan.layout` is the layout of those reordered masks. `plan.passes` are the kernel's
# passes: FULL tiles plus the kept boundary tiles mask-free, and tiles whose keys end in padding
# apart. The kernel call reads both and rebuilds neither.

# %%
print({h: plan.orders[h].name for h in range(plan.num_heads)})
print({key: value for key, value in plan.summary().items() if key not in ("grid", "kinds")})
exact_density = plan.exact_pairs[0] / grid.num_tokens**2
print(f"budget {DENSITY}, but at {grid.num_tokens:,} tokens the band's half-width rounds up to "
      f"{plan.summary()['width']} and the anchor adds {grid.tokens_per_frame} keys: the mask keeps "
      f"{exact_density:.3f} of the pairs (the figure's density): the budget sizes the band alone, and the "
      f"rounding and the anchor come on top, most of all at a small size")
fig = plotting.occupancy_heatmap(plan.layout, f"head 0 ({plan.kinds[0]}), in its own order", head=0)
plotting.save(fig, cfg.figure("09_plan_layout"))
plt.show()

# %% [markdown]
# ## 4 · Kernel and 5 · restore
#
# `stlib.video_attention(q, k, v, grid, plan=plan, impl="pallas_tile")` applies each head's order,
# runs `pallas_tile` on the plan's layout and restores raster order (compiled once here; the last
# section times the same executable). Checked against the plain reference on the mask the kernel
# computes (`plan.mask`: the rounded tiles mapped back to raster order), then compared with dense
# attention. At the case-study size both references run on sampled query rows
# (`checks.reference_rows`: rows at the start, middle and end), never on an L x L matrix.

# %%
routed = compile_function(lambda q, k, v: stlib.video_attention(q, k, v, grid, plan=plan, impl="pallas_tile",
                                                                interpret=cfg.interpret), q, k, v)
out = routed(q, k, v)
notebook.passed("routed plan + pallas_tile == reference on the routed, rounded mask", max_error(out, q, k, v, plan.mask),
                tolerance(workload.dtype))
rows = np.arange(grid.num_tokens) if grid.num_tokens <= 16_384 else checks.reference_rows(grid.num_tokens)
dense = reference_attention(q[:, rows], k, v, None, workload.head_dim**-0.5)  # [H, rows, D] f32: dense attention
rel = jnp.linalg.norm(out[:, rows].astype(jnp.float32) - dense, axis=(1, 2)) / jnp.linalg.norm(dense, axis=(1, 2))
print(f"relative L2 error vs dense attention per head "
      f"({'every row' if rows.size == grid.num_tokens else f'{rows.size} sampled rows'}): "
      f"{np.array2string(np.asarray(rel), precision=3)}")

# %% [markdown]
# ## The budget at the case-study shape
#
# The public design's tiles, 3,328 x 2,816, at 21 x 45 x 80 = 75,600 tokens. The last kv tile is
# ragged (the cell prints how many real keys it holds): kept tiles there form the ragged tail. Shown
# per head kind, at the density of this notebook, for both anchors and both boundary policies. No
# q / k is needed and no L x L array is built.

# %%
BLOCKS = {"block_q": 3328, "block_kv": 2816}
kinds = ["spatial"] * 5 + ["temporal"] * 5
tokens = configs.CASE_STUDY.num_tokens
print(f"{tokens:,} tokens: {-(-tokens // BLOCKS['block_q'])} q tiles x {-(-tokens // BLOCKS['block_kv'])} kv tiles; the "
      f"last kv tile holds {tokens - (tokens - 1) // BLOCKS['block_kv'] * BLOCKS['block_kv']:,} real keys; density {DENSITY}")
print(f"{'anchor':<10} {'boundary':<9} {'kind':<9} {'main':>5} {'tail':>5} {'masked':>7} {'of tiles':>9} "
      f"{'pairs / exact':>14}")
for anchor in ("reordered", "frame0"):
    for boundary in ("balanced", "exact"):
        p = svg_plan(configs.CASE_STUDY.grid, kinds, DENSITY, anchor=anchor, boundary=boundary, **BLOCKS)
        for h in (0, 5):
            print(f"{anchor:<10} {boundary:<9} {kinds[h]:<9} {p.main_tiles[h]:>5} {p.tail_tiles[h]:>5} "
                  f"{p.masked_tiles[h]:>7} {p.computed_tiles[h] / np.prod(p.layout.grid_shape):>9.1%} "
                  f"{p.pairs[h] / p.exact_pairs[h]:>14.4f}")

# %% [markdown]
# With the reordered anchor a temporal head costs what a spatial head costs. With frame 0 as the
# anchor, frame 0 is every 21st key in token-major order, so it touches every kv tile. The exact
# policy then runs almost every tile masked; balanced rounding drops most of the anchor instead.

# %% [markdown]
# ## What is lost: quality against work
#
# `data/svg_quality.jsonl` holds one record per pattern (every head spatial, every head temporal,
# routed), density, anchor and boundary policy. Each record gives the relative L2 error of the
# output against dense attention and the recall (the share of dense attention probability the mask
# keeps), both measured on the synthetic inputs at 9 x 12 x 16, and the executed flops relative to
# dense of the same plans, there and at the case-study shape. `stlib.bench.svg_quality` writes
# them (minutes on a CPU). Here we redraw the figure from the records and recompute
# one record to check it. At 1,728 tokens the width rounds up to a multiple of 128, so densities
# 0.15 and 0.25 give the same band (w = 256) and the same error. At the case-study shape they cost
# different work, hence the flat steps in the right panel.
# (The records were computed on a CPU in float32; the check recomputes at the highest matmul
# precision, so a TPU's default bf16 passes do not move the inputs.)

# %%
records = read_records(cfg.data / "svg_quality.jsonl", latest_run=True)
print(f"{'pattern':<9} {'density':>7} {'anchor':<10} {'boundary':<9} {'rel L2':>7} {'recall':>7} "
      f"{'routing ok':>10} {'flops/dense (full)':>18}")
for r in records:
    if r["anchor"] == "reordered" or r["boundary"] == "exact":
        print(f"{r['pattern']:<9} {r['density']:>7} {r['anchor']:<10} {r['boundary']:<9} {r['rel_l2']:>7.3f} "
              f"{r['recall']:>7.3f} {r['routing_recovery']:>10.0%} {r['full_executed_vs_dense']:>18.3f}")
fig = plotting.quality_vs_work(records, "What each pattern loses vs the work it executes (synthetic inputs; error at "
                               "9x12x16, work of the same plans at both shapes)")
plotting.save(fig, cfg.figure("09_quality_vs_work"))
plt.show()

# %%
from stlib.bench.svg_quality import quality_sweep

check = next(r for r in records if (r["pattern"], r["density"], r["anchor"], r["boundary"]) ==
             ("routed", 0.15, "reordered", "balanced"))
with jax.default_matmul_precision("highest"):  # the records' float32 matmuls, also on a TPU (bf16 passes by default)
    again = next(r for r in quality_sweep(stlib.VideoGrid(*check["grid"]), check["planted"], check["head_dim"], (0.15,),
                                          anchors=("reordered",), boundaries=("balanced",))
                 if r["pattern"] == "routed")
assert abs(again["rel_l2"] - check["rel_l2"]) < 1e-3 and again["kinds"] == check["kinds"]
print(f"PASSED  the recorded routed plan at density 0.15 reproduces (rel L2 {again['rel_l2']:.4f})")

# %% [markdown]
# ## What routing costs
#
# Routing scores 64 rows against every key: 2 H S L D flops for the scores, against the 4 H L^2 D
# flops of dense attention, a ratio of S / (2 L). Measured here on this backend, at this notebook's
# size: the scores (jitted XLA), dense attention as `stlib.attention` runs it by default (Splash on
# a TPU, the blocked XLA loop elsewhere) and the routed plan's kernel of section 4 (in Pallas
# interpret mode off a TPU: those times say nothing about a TPU). Then counted at the case-study
# shape against the kernel the plan drives.

# %%
from stlib.bench.records import time_function
from stlib.bench.svg_quality import plan_work
from stlib.registry import AUTO, choose
from stlib.routing import route_scores, sample_rows

rows = sample_rows(grid.num_tokens, 64)
allowed = jnp.asarray(np.stack([exact_mask(grid, kind, plan.width).allowed(rows[:, None], keys) for kind in
                                ("spatial", "temporal")]))
scale = workload.head_dim**-0.5
score = time_function(lambda q, k: route_scores(q[:, rows], k, allowed, scale), q, k, trials=5)
dense_impl = choose(AUTO, None).name  # what stlib.attention runs without a mask here
dense_t = time_function(lambda q, k, v: stlib.attention(q, k, v, None, impl=dense_impl), q, k, v, trials=3)
routed_t = time_function(routed, q, k, v, trials=3)  # the executable compiled and checked in section 4
print(f"{cfg.where}, {grid.shape}, {workload.num_heads} heads: routing scores {score.median_ms:.2f} ms, dense "
      f"attention ({dense_impl}) {dense_t.median_ms:.2f} ms, the routed plan's kernel {routed_t.median_ms:.2f} ms; "
      f"routing = {score.median_ms / dense_t.median_ms:.1%} of dense, {score.median_ms / routed_t.median_ms:.1%} of "
      f"the routed kernel")
cfg.record("09_routing", "routing scores, dense attention and the routed plan's kernel: median ms",
           routing_ms=score.median_ms, dense_ms=dense_t.median_ms, dense_impl=dense_impl,
           routed_ms=routed_t.median_ms, density=DENSITY, kinds=[str(x) for x in plan.kinds])
L, D, H, S = configs.CASE_STUDY.num_tokens, configs.CASE_STUDY.head_dim, configs.CASE_STUDY.num_heads, 64
full_plan = svg_plan(configs.CASE_STUDY.grid, kinds, DENSITY, **BLOCKS)
kernel_flops = plan_work(full_plan, D)["executed_vs_dense"] * 4.0 * L * L * D * H
route_flops = 2.0 * H * S * L * D
print(f"case-study shape: routing {route_flops / 1e9:.2f} GFLOP vs the sparse kernel's {kernel_flops / 1e9:.0f} GFLOP "
      f"at density {DENSITY} = {route_flops / kernel_flops:.2%} (dense: {route_flops / (4.0 * L * L * D * H):.3%})")

# %% [markdown]
# ## Takeaways
#
# * Routing on 64 sampled rows recovers every planted head kind, for a tiny fraction of the work of
#   the attention it steers.
# * The wrong pattern is expensive in quality. At equal work, a spatial band on a temporal head (or
#   the reverse) keeps much less of the attention mass than the routed mix.
# * The reordered anchor (the public design) makes a temporal head as cheap as a spatial one.
#   Frame 0 as the anchor costs every kv tile in token-major order.
# * Balanced rounding keeps the pair count within 2% of the exact mask and runs everything
#   mask-free; its error lands within a few points of the exact mask's, either way in the records:
#   rounded-in tiles add keys and rounded-out tiles drop them.
# * What is lost is what the band misses. The band leaves out keys the head's kernel reaches
#   outside it: far positions in the same frame for spatial heads, neighbouring positions beyond
#   the band for temporal ones. At density 0.15 the routed mix's relative L2 error is a few
#   percent at 9 x 12 x 16 (the figure's left panel); section 4 prints it per head at this
#   notebook's own size, on inputs built to be sparse. At the case-study size (a TPU run) some
#   temporal heads keep only part of their attention mass inside the band (section 1 prints each
#   head's recall) and their error against dense attention is large: presumably the random
#   position features' small scores on far keys, which add up over 75,600 keys. Real models' heads
#   are less clean.
