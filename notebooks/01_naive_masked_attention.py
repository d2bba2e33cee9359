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
# # 01 · Naive masked attention
#
# Attention is softmax(q kᵀ / √D) v. A *mask* says which query may see which key. The obvious way
# to use a sparse mask is to compute every score and then throw the forbidden ones away. This
# notebook shows, by measurement, that this saves nothing: the cost of a masked dense kernel does
# not drop with the mask's density.

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

import stlib
from stlib import bench, masks, notebook, plotting

cfg = notebook.setup(SIZE)

# %% [markdown]
# ## Dense attention, written out
#
# A teaching version in a few lines of jnp: scores, a mask as a boolean matrix (masked scores
# become -inf, so their probability is exactly 0), a softmax per query row, and the weighted sum
# of values. Rows that see no key at all are defined to return zeros. We check it against
# `stlib.attention(impl="reference")`, the library's plain implementation, within the tolerance
# `notebook.tolerance` sets for this backend: float32 matrix products are exact to rounding on a
# CPU, while a TPU's matrix unit takes bfloat16 passes at the default precision (the reference
# asks for the highest), so there the check allows more (the PASSED line prints the bound).

# %%
def naive_attention(q, k, v, mask):
    """q, k, v [H, L, D]; mask bool [L, L]."""
    s = jnp.einsum("hqd,hkd->hqk", q, k) / jnp.sqrt(q.shape[-1])  # [H, L, L]
    s = jnp.where(mask, s, -jnp.inf)
    m = jnp.max(s, axis=-1, keepdims=True)
    p = jnp.exp(s - jnp.where(jnp.isfinite(m), m, 0.0))  # [H, L, L]
    l = p.sum(-1, keepdims=True)
    return jnp.einsum("hqk,hkd->hqd", p, v) / jnp.where(l > 0, l, 1.0)


length = 256
band = masks.band(length, 20)
q, k, v = stlib.random_qkv((2, length, 64), jnp.float32, seed=0)
mine = naive_attention(q, k, v, band.to_dense())
lib = stlib.attention(q, k, v, band, impl="reference")
notebook.check_close("naive masked attention == stlib reference", mine, lib)
case_tokens = stlib.configs.CASE_STUDY.num_tokens
print(f"the mask as an L x L matrix: {length**2:,} entries at L = {length}, {case_tokens**2 / 1e9:.1f} billion per head "
      f"at the case study's {case_tokens:,} tokens")

# %% [markdown]
# The mask itself is an L x L boolean matrix. At 256 tokens that is 65,536 entries; at the
# case-study length it would be 5.7 billion per head, which is why `stlib.masks` never builds it
# (more in notebook 02).

# %%
fig = plotting.mask_gallery({"band |q - k| <= 20": band, "frame-causal (4 frames)": masks.frame_causal(stlib.VideoGrid(4, 8, 8)),
                             "full": masks.full(length)}, "Masks as boolean matrices (black: query may see key)", columns=3)
plotting.save(fig, cfg.figure("01_masks"))

# %% [markdown]
# ## A mask inside a dense kernel saves nothing
#
# Measure it, with band masks of four densities and two implementations of each kind. On a CPU
# (the small configuration: 2 heads x 4,096 tokens in float32) `impl="reference"` computes every
# score and applies the mask element by element, and `impl="xla"` walks the same scores tile by
# tile but skips tiles where the mask allows nothing: both plain XLA compiled for the CPU, an
# honest measurement of that backend. On a TPU (the case-study shape in bfloat16, the case study's
# tiles) the pair is two compiled Pallas kernels: `pallas_dense` visits every tile and masks
# every score, `pallas_block_sparse` skips the empty tiles (notebook 05 builds it). The cell
# prints which pair ran, and the figure's title where it was measured.

# %%
if cfg.size == "full":
    H, L, D, dtype = cfg.workload.num_heads, cfg.workload.num_tokens, cfg.workload.head_dim, jnp.bfloat16
    dense_impl, skip_impl, block = "pallas_dense", "pallas_block_sparse", {"block_q": cfg.block_q, "block_kv": cfg.block_kv}
else:
    H, L, D, dtype = 2, 4096, 64, jnp.float32  # big enough to time on a CPU, small enough to materialise
    dense_impl, skip_impl, block = "reference", "xla", {"block_q": 256, "block_kv": 256}
q, k, v = stlib.random_qkv((H, L, D), dtype, seed=1)
rounds, trials = (2, 2) if cfg.on_tpu else (3, 3)  # a call at the case study takes 0.05 to 0.5 s on a TPU
names = {dense_impl: f"{dense_impl}: every score, then the mask", skip_impl: f"{skip_impl}: skips empty tiles"}
densities = (0.1, 0.25, 0.5, 1.0)  # the band builder rounds its width up to a multiple of 128: the figure shows the true density
cases, layouts = {}, {}
for target in densities:
    mask = masks.band(L, masks.band_width_for_density(L, target))  # at 1.0 a band of width L: masked like the others
    layouts[target] = stlib.block_layout(mask, block["block_q"], block["block_kv"])
    for impl in names:
        cases[impl, target] = functools.partial(stlib.attention, mask=mask, impl=impl,
                                                **(block if impl != "reference" else {}))
# every case timed rounds x trials times, in an order shuffled anew per round, so a slow spell of the
# machine lands on different cases; the line is the median of those calls, the whiskers the fastest and slowest
tracker = bench.Progress(len(cases), "cases")  # a progress bar (tqdm) with its estimate of the time left
timings = bench.time_interleaved(cases, q, k, v, rounds=rounds, trials=trials,
                                 progress=lambda case: tracker.step(str(case)))
calls = min(t.trials for t in timings.values())
print(f"{dense_impl} vs {skip_impl} on {H} heads x {L:,} tokens x {D}, {jnp.dtype(dtype).name}, "
      f"tiles {block['block_q']} x {block['block_kv']}; each case's median of {calls} calls")
series = {name: [(layouts[d].density, timings[impl, d].median_ms, timings[impl, d].min_ms, timings[impl, d].max_ms)
                 for d in densities] for impl, name in names.items()}
for target in densities:
    lay = layouts[target]
    print(f"band built for density {target}: density {lay.density:.3f}, tiles computed {lay.occupancy:.0%}; "
          + ", ".join(f"{impl} {timings[impl, target].median_ms:7.1f} ms" for impl in names))
sparsest, everything = timings[dense_impl, densities[0]].median_ms, timings[dense_impl, 1.0].median_ms
print(f"{dense_impl}: {sparsest:.1f} ms at density {layouts[densities[0]].density:.3f} against {everything:.1f} ms at "
      f"density 1.0 ({sparsest / everything:.2f}x)")

# plain XLA on a CPU, compiled Pallas kernels on a TPU (cfg.where names the chip)
where = cfg.where if cfg.on_tpu else f"{jax.default_backend().upper()} (plain XLA: not TPU times)"
fig = plotting.timing_lines(series, f"Masked dense vs tile-skipping, {H} heads x {L:,} tokens x {D}, "
                            f"{jnp.dtype(dtype).name}\nmeasured on {where}; "
                            f"median of {calls} calls, whiskers: fastest and slowest",
                            "density (allowed pairs / L²)")
plotting.save(fig, cfg.timed_figure("01_mask_saves_nothing"))
kept = cfg.record("01_naive_masked_attention", "masked dense vs tile-skipping, band masks by density",
                  shape=[H, L, D], dtype=jnp.dtype(dtype).name, blocks=block, rounds=rounds, trials=trials,
                  cases=[{"impl": impl, "target_density": d, "density": layouts[d].density,
                          "occupancy": layouts[d].occupancy, "median_ms": t.median_ms, "min_ms": t.min_ms,
                          "max_ms": t.max_ms, "compile_ms": t.compile_ms, "calls": t.trials}
                         for (impl, d), t in timings.items()])
if kept:
    print(f"recorded in data/notebook_measurements.jsonl ({kept['device_kind']}, revision {kept.get('git_rev')})")

# %% [markdown]
# ## Takeaway
#
# The masked dense computation costs about the same at the sparsest band as with every pair
# allowed (the cell above prints both): it computes every score, exponentiates every score, and
# then multiplies the forbidden ones by zero. Work is only
# saved where whole tiles of scores are never computed, and then only in proportion to the tiles
# skipped, not to the pairs allowed (compare the skipping kernel's time with the "tiles computed"
# column). The rest of the sequence is about making those two numbers meet.
#
# ## Questions
#
# 1. In `naive_attention`, why subtract the row maximum, and why replace a non-finite maximum by 0?
# 2. The band built for density 0.1 at L = 4,096 (`band_width_for_density` rounds its width w, the
#    largest |q - k| it allows, up to 256 tokens, density 0.121) leaves how many of the 16 x 16 tiles of 256 x 256 non-empty? Check with `stlib.block_layout(mask, 256, 256).kind_counts()`.
# 3. Would a mask that allows a random 10% of pairs make `impl="xla"` faster than `impl="xla"` with
#    every pair allowed? Why not?
#
# <details><summary>Answers</summary>
#
# 1. exp of large scores overflows; subtracting the row maximum keeps every exponent <= 0 without
#    changing the softmax. A row with no allowed key has maximum -inf, and -inf - (-inf) is NaN:
#    replacing it by 0 makes every exp(-inf) = 0, the row sum 0, and the output 0.
# 2. A band of half-width w touches about 1 + 2 w / 256 tiles per row of tiles: with w = 256, 3 per
#    row, 46 of 256 tiles (the ends have fewer): occupancy 0.18, against a density of 0.12.
# 3. No: a random 10% of pairs touches every tile, so no tile can be skipped; every tile is
#    PARTIAL and the kernel pays full tiles plus the masking, as at density 1.0. (At density 1.0
#    `xla` already beats `reference`: it computes tile by tile, without the L x L score array.)
#
# </details>
