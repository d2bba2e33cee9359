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
# # 08 · The case-study table
#
# The published case study (Google for Developers blog, 2026-09-30, "Accelerating Spatio-Temporal
# Attention for Video Diffusion on TPUs") measured one TPU v6e at 75,600 tokens x 10 heads x 128:
# dense Splash attention 78.70 ms, its tile-aligned sparse kernel 32.76 ms (2.40x), kernel time
# only (no routing, reordering or communication), synthetic inputs. This notebook runs the same
# comparison with the `stlib` kernels, through the benchmark harness `stlib.bench`, on the cases
# the table is about (`stlib.bench.focus_cases`, one kernel each): dense Splash and the tile kernel
# without a mask; on a band built for density 0.35, Splash, the block-sparse kernel and both tile
# kernels; on the sliding-tile pattern, the block-sparse kernel in raster order, and Splash and
# the tile kernels in 3-D tiled order (Splash reads that mask from stlib's block layout, at its own
# blocks: one 3-D tile a block).
#
# * on a TPU: at the full case-study shape, each case compiled once, checked and timed on the chip;
# * elsewhere: the same cases at the small shape in Pallas interpret mode (times that say nothing
#   about a TPU, labelled as such);
# * on both: the hardware-independent work of every case of the whole benchmark (six band
#   densities, four sliding-tile windows) at the full shape, and static estimates read from the
#   compiled schedules (`stlib.estimate`). Off a TPU they are compiled here for v6e without a TPU,
#   or read from the estimate cache that an earlier run left; on a TPU they are read from the
#   committed cache only (`data/estimate_cache`), since compiling for another chip beside the held
#   chip costs tens of seconds a kernel.
#
# Every record is appended to `data/*.jsonl` (with versions, device kind and git revision); the
# figures are drawn from the records of this run. `python -m stlib.bench case-study` times every
# case of the benchmark instead of the focused ones.

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
import json

import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask_info

import stlib
import stlib.kernels  # registers the Pallas kernels with stlib.attention
from stlib import bench, configs, masks, notebook, plotting
from stlib.device import current_chip
from stlib.kernels.splash import splash_blocks, splash_mask
from stlib.masks import case_study_masks

STA_MASK, STA_RASTER = "sliding tile, 3-D tiled order", "sliding tile 3x8x16, window 3"  # catalogue names
BAND_DENSITY = 0.35  # the band the table measures, and the static estimates take at the full shape

cfg = notebook.setup(SIZE)
max_error, tolerance = notebook.max_error, notebook.tolerance  # checks against the plain reference

# The size switch picks the shape: the case study at "full", the small shape at "small".
workload = configs.CASE_STUDY if cfg.size == "full" else bench.CPU_CASE
TOL = tolerance(workload.dtype)

# %% [markdown]
# ## Every case is checked before it is timed
#
# The benchmark times; it does not check. So first: every case against the plain reference
# (tile-aligned cases with a token order get permuted inputs, as in the benchmark, and are compared
# in that order; the "+ reordering" case runs `video_attention` on raster inputs, permutation and
# restore included). At the case-study size the reference runs on sampled query rows
# (`stlib.checks.max_error`: rows at the start, middle and end, never an L x L matrix). Each case
# is compiled once (`stlib.bench.compile_case`): the benchmark below times the executable checked
# here instead of compiling it again. A progress bar (tqdm) counts the cases and estimates the time
# left; every case writes its line.

# %%
q, k, v = stlib.random_qkv(workload.qkv_shape, workload.dtype, seed=0)
scale = workload.head_dim**-0.5
focus = bench.focus_cases(workload, cfg.size == "full", BAND_DENSITY)
tracker = bench.Progress(len(focus), "check")
for case in focus:
    qq, kk, vv = bench.case_inputs(case, q, k, v)  # permuted for cases whose order is applied outside the call
    out = bench.compile_case(case, scale, cfg.interpret, qq, kk, vv)(qq, kk, vv)
    approximate = case.options.get("boundary") == "balanced"
    err = max_error(out, qq, kk, vv, case.mask)
    if approximate:
        tracker.step(f"APPROX  {case.label:<30} {case.pattern:<13} approximate by design (balanced rounding): max "
                     f"difference {err:.2f} from the exact mask (notebook 06 checks it against the rounded mask)")
        continue
    assert err <= TOL, (case.label, err)
    tracker.step(f"PASSED  {case.label:<30} {case.pattern:<13} == reference (max error {err:.1e} <= {TOL:.0e})")
del out

# %% [markdown]
# ## The benchmark
#
# `stlib.bench.run_case_study` times the cases (`stlib.bench.time_interleaved`: compile excluded,
# one warm-up, then rounds of one call per case in a shuffled order, 3 off a TPU, 5 on one, so a
# slow spell of a shared machine falls on one call of several cases; the median, min and max of
# each case's calls) and appends one record per case to `data/case_study.jsonl`; on a TPU each
# record carries the device kind (`device_kind`, `interpret: false`). Then the work of every case of
# the whole benchmark at the *full* case-study shape goes to `data/case_study_work.jsonl` (grid
# steps, computed and masked tiles, executed and useful flops, bytes, the v5e / v6e roofline):
# counted, nothing compiled. The published numbers go to `data/case_study_reference.json`.
# `python -m stlib.bench figures` redraws the benchmark's figures from the records later, without
# the hardware.

# %%
times_path = cfg.data / "case_study.jsonl"
work_path = cfg.data / "case_study_work.jsonl"
seen = {path: len(bench.read_records(path)) for path in (times_path, work_path)}  # records of earlier runs
bench.run_case_study(cfg.data, trials=5 if cfg.on_tpu else 3, compile_check=False, size=cfg.size, cases=focus)
records = bench.read_records(times_path)[seen[times_path]:]  # this run only
if not cfg.interpret:  # in interpret mode the benchmark records the full-shape work itself
    bench.record_full_scale_work(cfg.data, compile_check=False)
work_records = bench.read_records(work_path)[seen[work_path]:]
published = json.loads(bench.write_published_reference(cfg.data).read_text())
print(f"\n{len(records)} timing records and {len(work_records)} work records from this run; "
      f"published reference: {published['dense_splash_ms']} ms -> {published['tile_aligned_sparse_ms']} ms")

# %% [markdown]
# One check before drawing: Splash shrinks its kv axis to the widest row when every head shares one
# mask (notebook 05), and the generic work model (`stlib.roofline.kernel_work`) counts Splash's grid
# that way. The cell takes Splash's grid steps from its own `MaskInfo` and prints the model's count
# beside them: they agree at every density, and the figures use Splash's own.

# %%
def splash_grid_steps(case, num_heads):
    """Grid steps of Splash's forward kernel for ``case``: heads x its MaskInfo's (q tiles, kv extent),
    at the blocks the call resolves (one 3-D tile a block on a padded 3-D tiled order)."""
    length = case.mask.length  # a padded 3-D tiled order is longer than the workload
    config = stlib.registry.baseline().config(case.mask, length, case.block_q, case.block_kv, interpret=False)
    blocks = splash_blocks(length, config.block_q, config.block_kv)
    multi_head, _ = splash_mask(case.mask, num_heads, length, blocks.padded_length(length))
    info, _ = splash_attention_mask_info.process_mask(multi_head, (blocks.block_q, blocks.block_kv))
    return num_heads * info.block_mask.shape[1] * info.block_mask.shape[2]


full_cases = bench.case_study_cases(configs.CASE_STUDY, tpu=True)  # what record_full_scale_work counted
assert [c.label for c in full_cases] == [r["label"] for r in work_records]
for case, record in zip(full_cases, work_records):
    if case.impl == "splash":
        model = record["grid_steps"]
        record["grid_steps"] = splash_grid_steps(case, configs.CASE_STUDY.num_heads)
        print(f"{case.label:<18} {case.pattern:<12} density {record['density']:.3f}: {record['grid_steps']:>7,} grid steps "
              f"(the generic model says {model:,})")

# %% [markdown]
# ## The table
#
# One line per case: the measured median (on a TPU, the chip's time; off a TPU, interpret mode:
# **not** TPU times), the speed-up over dense Splash measured the same way, and next to it the ideal
# speed-up 1 / density.

# %%
dense_splash = next(r for r in records if r["label"] == "Splash (dense)")
print(f"measured on {plotting.where_measured(dense_splash)}, shape {dense_splash['shape']}")
print(f"{'kernel':<42} {'pattern':<13} {'density':>7} {'median ms':>10} {'speed-up':>9} {'ideal':>6}")
for r in records:
    print(f"{r['label']:<42} {r['pattern']:<13} {r['density']:>7.3f} {r['median_ms']:>10.2f} "
          f"{dense_splash['median_ms'] / r['median_ms']:>8.2f}x {r['ideal_speedup']:>5.2f}x")


# %%
def closest(rows, density):
    """The rows of the pattern's density closest to ``density``."""
    best = min(rows, key=lambda r: abs(r["density"] - density))["density"]
    return [r for r in rows if r["density"] == best]


def pick(rows, density=BAND_DENSITY):
    """Dense cases, band cases at the density closest to ``density``, sliding-tile cases likewise;
    labelled with pattern and their actual density."""
    chosen = [r for r in rows if r["pattern"] == "dense"]
    for pattern in ("band", "sliding tile"):
        chosen += closest([r for r in rows if r["pattern"] == pattern], density)
    return [{**r, "label": r["label"] if r["pattern"] == "dense" else
             f"{r['label']}, {r['pattern']} {r['density']:.2f}"} for r in chosen]


picked = pick(records)
band_density = next(r["density"] for r in picked if r["pattern"] == "band")  # the measured band
band_name = f"band (density {BAND_DENSITY:.2f})"  # the estimates' band: built for the same density at the full shape
full_masks = {band_name: masks.band(configs.CASE_STUDY.num_tokens,
                                    masks.band_width_for_density(configs.CASE_STUDY.num_tokens, BAND_DENSITY)),
              STA_MASK: case_study_masks()[STA_MASK], STA_RASTER: case_study_masks()[STA_RASTER]}
full_density = {name: stlib.block_layout(m, 512, 1024).density for name, m in full_masks.items()}
print(f"the band built for density {BAND_DENSITY} has density {band_density:.3f} at this run's shape and "
      f"{full_density[band_name]:.3f} at the case-study shape (its width is rounded up to 128 tokens); the "
      f"estimates take the case-study one")
band_label, sta_label = f"band {full_density[band_name]:.2f}", f"sliding tile {full_density[STA_MASK]:.2f}"
like = {"exp2": False}  # like for like: every Pallas kernel with the natural exponential, as Splash has it
estimate_runs = [  # (label, impl, mask, blocks, options)
    ("Splash (dense), the calibration point", "splash", "full", None, None),
    (f"Splash, {band_label}", "splash", band_name, None, None),
    (f"pallas_dense (masked), {band_label}", "pallas_dense", band_name, None, like),
    (f"pallas_block_sparse, {band_label}", "pallas_block_sparse", band_name, None, like),
    (f"pallas_tile flat, {band_label}", "pallas_tile", band_name, None, {"form": "flat", **like}),
    (f"pallas_tile balanced, {band_label}", "pallas_tile", band_name, None, {"boundary": "balanced", **like}),
    (f"pallas_tile flat + exp2, {band_label}", "pallas_tile", band_name, None,
     {"form": "flat", "exp2": True}),  # the exp2 effect on its own: the only difference from the flat row
    # the second-generation tile kernel at its swept default blocks (printed below), exp2 on
    (f"pallas_tile_lane_dense, {band_label}", "pallas_tile_lane_dense", band_name, None, None),
    (f"pallas_block_sparse (raster), {sta_label}", "pallas_block_sparse", STA_RASTER, None, like),
    (f"pallas_tile flat (3-D tiled), {sta_label}", "pallas_tile", STA_MASK, 384, {"form": "flat", **like}),
    # ... and at its own blocks for a tiled order: two rows of 3-D tiles against one, run as patterns
    (f"pallas_tile_lane_dense (rows of 3-D tiles), {sta_label}", "pallas_tile_lane_dense", STA_MASK, None, None),
]
# each kernel's own dense estimate (the same kernel, options and blocks on the full mask): a sparse case's
# speed-up over it shows what skipping buys that kernel; its speed-up over dense Splash adds how much
# cheaper the kernel is than Splash on dense work
def config_of(run):
    """What an estimate compiles: (impl, mask, blocks, options), without the label."""
    return run[1], run[2], run[3], repr(run[4])


full_runs = [(f"{impl} on the full mask", impl, "full", block, options) for _, impl, _, block, options in estimate_runs]
OWN_DENSE = {run[0]: config_of(full) for run, full in zip(estimate_runs, full_runs)}  # label -> its own dense run
own_dense_runs = [r for r in {config_of(r): r for r in full_runs}.values()  # each once; Splash's is the calibration point
                  if config_of(r) != config_of(estimate_runs[0])]
# Static TPU estimates (stlib.estimate), each where it is available. The committed estimate cache seeds this
# machine's (entries missing here only); on a TPU nothing is compiled: an estimate not in the cache is missing.
from stlib.analysis import cache as estimate_cache

estimate_cache.seed_cache(cfg.data / estimate_cache.SEED_FOLDER)
estimate_cache.cached_only(cfg.on_tpu)
estimates, missing, own_ms = [], {}, {}  # own_ms: (impl, "full", blocks, options) -> each kernel's own dense ms
try:
    from stlib import analysis as static

    calibration_line = static.calibration().describe("v6e")
except Exception as error:  # noqa: BLE001 - the estimate is optional; say why it is missing
    calibration_line, missing["the calibration"] = None, f"{type(error).__name__}: {str(error)[:160]}"
for run in bench.progress(estimate_runs + own_dense_runs if calibration_line else [], "static estimate"):
    label, impl, mask, block, options = run
    try:
        est = static.estimate(impl, mask, "v6e", block_q=block, block_kv=block, options=options)
    except Exception as error:  # noqa: BLE001 - one missing estimate: say why, keep the others
        missing[label] = f"{type(error).__name__}: {str(error)[:160]}"
        continue
    if mask == "full":
        own_ms[config_of(run)] = est.seconds * 1e3
    if run in estimate_runs:
        estimates.append({"label": label, "ms": est.seconds * 1e3, "density": full_density.get(mask, 1.0),
                          "estimate": est})
for e in estimates:
    if OWN_DENSE[e["label"]] in own_ms:
        e["own_dense_ms"] = own_ms[OWN_DENSE[e["label"]]]
if estimates:
    print(f"static v6e estimates ({calibration_line}); Pallas kernels with exp2 off unless named:")
    for e in estimates:
        blocks = ", ".join(f"{k}={v}" for k, v in e["estimate"].blocks.items())
        print(f"  {e['label']:<52} {e['ms']:7.2f} ms (estimate, not a measurement; {blocks or 'default blocks'})"
              + (f"; its own dense estimate {e['own_dense_ms']:.2f} ms" if "own_dense_ms" in e else ""))
by_label = {e["label"]: e["ms"] for e in estimates}
flat_ms, flat_exp2_ms = (by_label.get(f"pallas_tile flat{x}, {band_label}") for x in ("", " + exp2"))
if flat_ms and flat_exp2_ms:
    print(f"exp2 on its own (pallas_tile flat, band): {flat_ms:.2f} -> {flat_exp2_ms:.2f} ms "
          f"({flat_ms / flat_exp2_ms:.2f}x)")
for label, why in missing.items():
    print(f"  no static estimate of {label}: {why}")

fig = plotting.latency_bars(picked, f"Case-study comparison at {workload.num_heads} x {workload.num_tokens:,} x "
                            f"{workload.head_dim} ({jnp.dtype(workload.dtype).name}), measured on {cfg.where}",
                            published=published, estimates=[{"label": e["label"], "ms": e["ms"]} for e in estimates] or None)
plotting.save(fig, cfg.timed_figure("08_latency"))

# %% [markdown]
# Left: what this run measured, on the backend named in the title (the chip's milliseconds on a
# TPU; interpret-mode milliseconds elsewhere). Right, on its own axis: the published v6e numbers
# and, where a static estimate is available, v6e estimates read from the compiled kernels'
# schedules (hatched: estimates, calibrated so that dense Splash takes the published 78.70 ms;
# never measurements), for the band built for 0.35 at the case-study shape and for the sliding-tile
# pattern, where tile alignment matters most. The estimates run the first-generation Pallas kernels
# with `exp2` off, as Splash computes; one extra row switches it on for the flat tile kernel, so the
# exp2 effect shows on its own. The lane-dense rows keep their default, exp2 on (the like-for-like
# table further down takes it apart). (The measured left panel runs each kernel at its defaults:
# the tile kernel with exp2.) The two panels never share an axis: the left panel's chip (or
# interpreter) is not the published v6e.
#
# Speed-ups next: the measured speed-up over dense Splash on this run's backend, next to the ideal
# 1 / density (on a TPU a TPU speed-up; off a TPU an interpret-mode one, which says nothing about a
# TPU), then two views that do not depend on this run's backend: the static estimates' speed-up
# over dense Splash, and the v6e roofline time of the work each case executes at every density.
# Off a TPU the measured band is the small shape's, built for 0.35 and denser after rounding; the
# estimates and `08_work` take the case-study shape's band built for 0.35.

# %%
measured_title = (f"Measured speed-up over dense Splash on {cfg.where}, {workload.num_heads} x {workload.num_tokens:,} x "
                  f"{workload.head_dim}" if cfg.on_tpu else
                  f"Interpret-mode speed-up over dense Splash, {cfg.where}\nNOT a TPU speed-up")
fig = plotting.speedup_vs_density([r for r in picked if r["pattern"] != "dense"], dense_splash["median_ms"],
                                  measured_title, legend_outside=True)
plotting.save(fig, cfg.timed_figure("08_speedup_measured"))

dense_estimate = next((e["ms"] for e in estimates if e["label"].startswith("Splash (dense)")), None)
if dense_estimate:
    fig = plotting.estimate_speedups(
        [{"label": e["label"], "speedup": dense_estimate / e["ms"], "ideal": 1 / e["density"],
          **({"own": e["own_dense_ms"] / e["ms"]} if "own_dense_ms" in e else {})}
         for e in estimates if e["density"] < 1],
        "Estimated speed-up, one v6e, 10 x 75,600 x 128 (static estimate, calibrated on one dense v6e point;\n"
        "not a measurement): over dense Splash, and over each kernel's own dense estimate")
    plotting.save(fig, cfg.figure("08_speedup"))
else:
    print("no static estimate of dense Splash in this run: no estimated speed-ups (08_speedup is not drawn)")

# hardware-independent: the v6e roofline time of the work each case executes, at the full shape;
# cases whose curves coincide (the same executed work) share one line and one legend entry
modelled = [{**r, "median_ms": r["roofline_v6e_ms"]} for r in work_records if r["pattern"] != "dense"]
curves = {}
for r in modelled:
    curves.setdefault(r["label"], []).append((round(r["density"], 4), round(r["median_ms"], 3)))
same_as = {}
for label, curve in curves.items():
    same_as.setdefault(tuple(sorted(curve)), []).append(label)
merged = {labels[0]: "\n= ".join(labels) for labels in same_as.values()}
modelled = [{**r, "label": merged[r["label"]]} for r in modelled if r["label"] in merged]
dense_model = next(r for r in work_records if r["label"] == "Splash (dense)")["roofline_v6e_ms"]
fig = plotting.speedup_vs_density(modelled, dense_model, "Work model at 10 x 75,600 x 128: v6e roofline of the "
                                  "executed work\n(hardware-independent, not a measurement)", legend_outside=True)
plotting.save(fig, cfg.figure("08_speedup_work"))

fig = plotting.work_bars(pick(work_records), "Work at the case-study shape (10 x 75,600 x 128): computed, not measured")
plotting.save(fig, cfg.figure("08_work"))
if cfg.on_tpu:
    chip = current_chip() or "v6e"
    fig = plotting.roofline_fraction(picked, chip, f"Fraction of the {chip} roofline reached, measured on {cfg.where}")
    plotting.save(fig, cfg.timed_figure("08_roofline"))

# %% [markdown]
# ## The second-generation tile kernel, in schedule numbers
#
# Notebook 07 writes `pallas_tile_lane_dense` in view: keys on sublanes with lane-dense
# statistics, register tiles, one pass with no LSE and no padded inputs, large blocks chosen by the
# block sweep, and pattern steps for rows of 3-D tiles. Here is what the compiled schedules say,
# side by side with the first-generation kernel on the same masks (static v6e estimates from the
# run above: grid steps, kernel time, the XLA glue around the kernels, e.g. padding and the
# log-sum-exp merge of the ragged pass, and the total as a fraction of dense Splash's).

# %%
second_generation = [  # (first generation, second generation) on the same mask
    (f"pallas_tile flat + exp2, {band_label}", f"pallas_tile_lane_dense, {band_label}"),
    (f"pallas_tile flat (3-D tiled), {sta_label}", f"pallas_tile_lane_dense (rows of 3-D tiles), {sta_label}"),
]
by_label = {e["label"]: e["estimate"] for e in estimates}
shown = [pair for pair in second_generation if all(label in by_label for label in pair)]
if shown and "Splash (dense), the calibration point" in by_label:
    dense_total = by_label["Splash (dense), the calibration point"].total_seconds
    print(f"{'kernel (static v6e estimate)':<58} {'grid steps':>10} {'kernel ms':>9} {'glue ms':>8} "
          f"{'total ms':>8} {'/ dense':>7}")
    for pair in shown:
        for label in pair:
            est = by_label[label]
            print(f"{label:<58} {sum(k.grid_steps for k in est.kernels):>10,} {est.seconds * 1e3:>9.2f} "
                  f"{est.glue_seconds * 1e3:>8.2f} {est.total_seconds * 1e3:>8.2f} "
                  f"{est.total_seconds / dense_total:>7.3f}")
    print("(the first-generation sliding-tile row runs with exp2 off, like Splash; the lane-dense rows with exp2 on)")
else:
    print("these static estimates are not in this run (the estimate cell above says why)")

# %% [markdown]
# ## Where the dense advantage comes from, like for like
#
# On dense work the tile kernel's own estimate is below Splash's calibration point, and that gain
# multiplies into every sparse speed-up over dense Splash above. Four things differ between the two
# at their defaults: the blocks (Splash 512 x 1,024, the tile kernel the block sweep's), the
# exponential (exp2 in the tile kernel), the precision of p · v (bf16 p in the tile kernel, f32 in
# Splash's source) and the kernel's layout (keys on sublanes, statistics one per query). The rows
# below change one of them at a time, on the full mask at the case-study shape (static v6e
# estimates): Splash at its default and at its best swept blocks (`python -m stlib.bench.block_sweep
# table`), then the tile kernel at its own blocks with natural exp and f32 p · v (Splash's
# arithmetic), with bf16 p · v, and with exp2 (its default). For each, the compute region of one grid
# step per 1,000 score pairs: its bundles (VLIW instructions) and the cycles the MXUs need to be fed
# (the larger of the two is what the estimate charges).

# %%
from stlib import analysis as static
from stlib.bench import like_for_like

print(f"{'dense, static v6e estimate':<44} {'blocks':>13} {'ms':>7} {'x prev':>6} {'bundles':>8} {'MXU feed':>8} "
      f"{'bound':>8}  (compute region, per 1,000 score pairs)")
previous = None
for label, impl, blocks, options in like_for_like.ROWS:  # one difference from the row before each
    call = {"block_q": blocks[0], "block_kv": blocks[1]} if blocks else {}
    try:
        est = static.estimate(impl, "full", "v6e", options=options, **call)
    except Exception as error:  # noqa: BLE001 - the estimate is optional; say why it is missing
        print(f"{label:<44} no static estimate in this run ({type(error).__name__}: {str(error)[:160]})")
        previous = None
        continue
    (kernel,) = est.kernels
    region = max((r for r in kernel.breakdown.values() if r.get("mxu")), key=lambda r: r["cycles"])
    pairs = est.blocks["block_q"] * est.blocks["block_kv"] / 1000
    ms = est.seconds * 1e3  # the kernel, as in the list above (XLA glue left out)
    print(f"{label:<44} {est.blocks['block_q']:>6,}x{est.blocks['block_kv']:<6,} {ms:>7.2f} "
          f"{'' if previous is None else f'{previous / ms:.2f}x':>6} {region['bundles'] / pairs:>8.2f} "
          f"{region['mxu'] / pairs:>8.2f} {'MXU feed' if region['mxu'] > region['bundles'] else 'bundles':>8}")
    previous = ms

# %% [markdown]
# Read the "x prev" column down: the first ratio is what its best blocks give Splash alone; the
# second, what the tile kernel's layout and its own swept blocks give at Splash's arithmetic
# (natural exp, f32 p · v), against Splash at its best blocks; the last two, bf16 p · v and exp2.
# The last three columns say why a ratio is near 1: the estimate charges a compute region the larger
# of its bundles and the cycles its MXUs need to be fed, so an option that cuts bundles buys nothing
# where the MXU feed is the larger ("bound"). The sparse speed-ups over dense Splash above hold the
# first two factors, which are not sparsity: dense Splash at its default blocks against the tile
# kernel at its swept ones.
#
# The same five rows, measured on a TPU v5e (`python -m stlib.bench.like_for_like run`, median
# of 5 calls; the tile kernel at its v5e default blocks, 1,024 x 2,048, Splash's best by the block
# sweep's estimates; measured, Splash's best v5e blocks are 512 x 2,048, the last section):

# %%
print(like_for_like.format_table(like_for_like.read(cfg.data / Path(like_for_like.RECORDS).name)))

# %% [markdown]
# On the v5e the blocks are the whole story: Splash at its best blocks gains about a tenth over its
# defaults, and the tile kernel at the same blocks with Splash's arithmetic runs within a few
# percent of it, a little slower, not faster; bf16 p · v and exp2 each change the time by about
# one percent. The v6e estimate above credits the tile kernel's layout with a further gain at
# Splash's arithmetic; on the one chip measured that gain is not there, as the last section's v5e
# measurements found for the estimate's dense rows in general (the lane-dense forward runs at the
# pace of its bundles, as Splash does). A v6e run is what would settle it for the case study's chip.

# %% [markdown]
# ## Reading the results
#
# * **The ideal is 1 / density.** The work model puts the tile-skipping kernels on or near that line
#   for the band (executed flops within about 10% of the useful ones), and `pallas_dense`
#   flat at 1x whatever the density: it computes every tile and masks it.
# * **Skipping is necessary, not sufficient.** The block-sparse kernel executes the right flops,
#   but it walks every grid step of the full grid; the tile kernel walks only non-empty tiles
#   (fewer still with the flat grid) and runs its FULL tiles without masking.
# * **The sliding-tile pattern needs its order.** In raster order the block-sparse kernel computes
#   mostly PARTIAL tiles; in 3-D tiled order every computed tile is FULL at the grain of a 3-D tile,
#   and the padding of the last row of tiles (45 rows are not a multiple of 8) is the about 10% of
#   executed flops over useful ones that remains. Its 384 x 384 tiles are
#   small enough that the roofline turns memory-bound (a 384-query tile re-reads k and v
#   for every 384 queries), a reminder that tile size is part of the design.
# * **The static estimates see what the work model cannot**: instructions per grid step and per
#   tile (masking, the softmax on the vector units, loop overhead), read from the compiled
#   schedule. In `08_speedup` each kernel has two bars: its speed-up over its own dense estimate
#   (what skipping tiles buys that kernel, at most about the ideal 1 / density mark) and over dense
#   Splash. A bar over dense Splash beyond the ideal mark is no paradox: that kernel is cheaper than
#   Splash on dense work already (its own dense estimate is below Splash's), and the two gains
#   multiply; the like-for-like rows above name that dense gain's sources (the blocks, the layout).
#   Where the
#   estimates rank kernels differently from the work model, the difference lies in how each
#   kernel's inner loop is written, not in which tiles it computes; only a TPU run can confirm it.
#   Splash's forward (`jax.experimental.pallas.ops.tpu.splash_attention`, jax 0.10.2) casts v to
#   f32 before p · v, an f32 matmul; tokamax's copy of Splash dropped that cast in January 2026.
# * **The second generation wins where the first paid for layout and passes**: one pass instead of
#   three, no LSE written and merged, statistics one per query instead of 128 copies, the block
#   sweep's large blocks instead of 512 x 1,024 (the estimate cell prints the blocks each ran with),
#   and for the sliding tile blocks of whole rows of 3-D tiles whose FULL sub-tiles run mask-free. The block sweep (`python -m stlib.bench.block_sweep table`) gives
#   the ratios to dense Splash at its own best blocks per chip.
# * **Blocks.** The measured table runs every band kernel at Splash's 512 x 1,024 blocks, the
#   second-generation one included; the estimates run that kernel at its own swept blocks (the
#   estimate cell prints them). Compare the two with that in mind.
# * **Which backend measured.** On a TPU the measured table and figures are that chip's, at the
#   case-study shape (the titles name it): read them beside the v6e estimates and the published v6e
#   bars as another chip's times. Off a TPU the measured times are interpreter times: they track how
#   many grid steps and how much work the interpreter runs, not what a TPU would do; there the TPU
#   numbers are the static estimates and the published bars.

# %% [markdown]
# ## The results in one table
#
# Every static estimate of this notebook at the case-study shape, with its work: density, executed
# and useful flops (the work model, `stlib.roofline.kernel_work`, at the blocks the estimate
# resolved), grid steps of the compiled kernels, and the published v6e times where there are any.
# The last column says what each time is: a static estimate (calibrated on one dense v6e point), or
# a published measurement.

# %%
from stlib.roofline import kernel_work

catalog = case_study_masks()
by_run = dict(zip([r[0] for r in estimate_runs], estimate_runs))
H_CS, L_CS, D_CS = configs.CASE_STUDY.qkv_shape
print(f"{'kernel':<56} {'density':>7} {'executed TFLOP':>14} {'useful TFLOP':>12} {'grid steps':>10} "
      f"{'v6e ms':>7} {'published':>9}  what the time is")
for e in estimates:
    _, impl, mask_name, _, options = by_run[e["label"]]
    mask = full_masks.get(mask_name) or (masks.full(L_CS) if mask_name == "full" else catalog[mask_name])
    blocks = e["estimate"].blocks
    work = kernel_work(impl, stlib.block_layout(mask, blocks["block_q"], blocks["block_kv"]), H_CS, D_CS, options)
    published_ms = configs.PUBLISHED["dense_splash_ms"] if e["label"].startswith("Splash (dense)") else None
    print(f"{e['label']:<56} {e['density']:>7.3f} {work.executed_flops / 1e12:>14.1f} {work.useful_flops / 1e12:>12.1f} "
          f"{sum(k.grid_steps for k in e['estimate'].kernels):>10,} {e['ms']:>7.2f} "
          f"{'' if published_ms is None else f'{published_ms:.2f}':>9}  static estimate"
          + ("; published: measured (the calibration point)" if published_ms else ""))
print(f"{'tile-aligned sparse kernel of the case study':<56} {'n/a':>7} {'n/a':>14} {'n/a':>12} {'n/a':>10} {'':>7} "
      f"{configs.PUBLISHED['tile_aligned_sparse_ms']:>9.2f}  published: measured (its mask and density not published)")

# %% [markdown]
# ## What to try next
#
# * **Run it on a TPU, then time the whole benchmark.** This notebook picks the case-study shape by
#   itself on a TPU VM and times the focused cases there; `python -m stlib.bench case-study` times
#   every case of the benchmark (every band density and sliding-tile window: many more kernels to
#   compile). Their records (`data/case_study.jsonl`, with the device kind) turn the estimates above
#   into measurements to judge them by.
# * **The dense tile.** The second-generation kernel's own dense estimate is the floor of every
#   sparse speed-up it reports: each bundle saved in its FULL region (notebook 07's schedule table)
#   is saved on every computed tile. Issuing a tile's later scores ahead (notebook 07) took the
#   v6e FULL region from 2.68 to 2.35 bundles per 1,000 score pairs (notebook 07's schedule table);
#   the scores still pass through VMEM
#   between the max and the exponential, and v5e gained nothing from the new order, so v5e's dense
#   tile is where the next bundles are. Under the estimate's MXU-feed rule (notebook 10: a pushed
#   weight row costs the MXU what a streamed row does), the lane-dense FULL region at its default
#   blocks is fed for longer than it issues, since each of its kv chunks streams through freshly
#   pushed q weights; the v5e measured below runs it at the pace of its bundles instead, so read the
#   lane-dense rows above as upper bounds until the rule is mended.
# * **Training.** The backward over the same tiles (notebook 10) costs more than twice the forward;
#   the fused kernel is where a training step's time goes.
# * **Other chips.** The block sweep and the estimates have v5e and TPU7x rows (`python -m
#   stlib.bench.block_sweep table`); the v5e rows are judged against a v5e measurement below.
#
# ## Takeaway
#
# The case study's 2.40x over dense Splash is the product of all the previous notebooks: skip
# EMPTY tiles (05), make the mask tile-aligned by reordering tokens so most computed tiles are FULL
# and run mask-free (06), visit only the tiles that matter, and keep the boundary and the ragged
# tail out of the main pass. A masked dense kernel, or a block-sparse kernel on a misaligned mask,
# gets none of it.
#
# ## Questions
#
# 1. Find the density at which the work model says `pallas_tile` flat reaches 2.40x over dense
#    Splash. Is the published sparse kernel's density likely above or below that, and why?
# 2. Redraw `figures/08_latency.png` from the records alone, without running any kernel.
# 3. In the work records, compare `grid_steps` of "pallas_tile rows" and "pallas_tile flat" across
#    densities. Why does the gap grow with density?
#
# <details><summary>Answers</summary>
#
# 1. The roofline model's speed-up is about 1 / (density x executed/useful), so 2.40x needs a
#    density near 0.4. A real kernel loses some time per grid step and to the softmax's vector
#    work, so the published kernel probably ran at a lower density than the model's break-even.
# 2. `records = stlib.bench.read_records("data/case_study.jsonl", latest_run=True)` (every record
#    carries its `run`, `date` and `git_rev`), then `plotting.latency_bars(pick(records), title,
#    published=json.load(open("data/case_study_reference.json")))`. `python -m stlib.bench figures`
#    redraws the benchmark's own figures the same way.
# 3. "rows" pays for the widest row in every row. A band's first and last rows are shorter than the
#    middle ones by about the band's width in tiles, and that width grows with density.
#
# </details>

# %% [markdown]
# ## Appendix: how far to trust the estimate (calibration and published measurements)
#
# The static estimate counts the bundles libtpu scheduled for each control path and multiplies them
# by how often each path runs; only the clock that turns cycles into milliseconds is fitted, and it
# is fitted to one published measurement per chip, nothing else:
#
# * **v6e**: the case study's dense Splash, 78.70 ms at 10 heads x 75,600 tokens x 128. Its blocks
#   were not published; the estimate assumes Splash's 512 / 1024 (kv compute 512). The table below
#   gives the clock every plausible block choice would imply: that spread is the calibration's
#   uncertainty, and every v6e number inherits it.
# * **TPU7x**: tokamax's Splash forward, 32 q heads sharing 8 kv heads, causal, head dim 128,
#   32,768 tokens, 24.75 ms with blocks tuned by its authors; the estimate takes the best blocks of
#   its own sweep, as a practitioner who tunes would.
# * **v5e**: no published Splash time was found. Its clock is v6e's, scaled by the two chips'
#   peak-implied clocks (bf16 peak / MXU work per cycle): an assumption that v5e loses the same
#   share of cycles to what the schedule does not show. Treat v5e numbers as the least certain.
#
# Every other public measurement in `data/published_measurements.json` is **held out**: never
# fitted, only compared. The cells below read the committed records (`python -m stlib.estimate
# calibrate` and `python -m stlib.estimate published` wrote them); nothing is compiled here.

# %%
from stlib.analysis.published import format_table, load_calibration, load_predictions

print(load_calibration())

# %%
predictions = load_predictions()
print(format_table(predictions))
fig = plotting.estimate_vs_published(predictions, "Static estimate vs published TPU kernel times")
plotting.save(fig, cfg.figure("08_estimate_published"))

# %% [markdown]
# Stars are the calibration points (on the diagonal by construction); every other point is a
# prediction the model was not fitted to. In the right panel the stars carry no token label: the
# "64K" and "32K" labels beside them belong to the held-out points just to their right. Read the right panel before the left one: a log-log plot
# flatters any model whose times span three decades, the error in percent does not. Rows without an
# estimate are listed with the reason (a schedule the reader does not know, a kernel that does not
# compile): an estimate is never a silent guess.
#
# Mind what the held-out set covers: every held-out point is a TPU7x one (tokamax's Splash in the
# flywheel-tpu benchmark, causal, head dim 256, its blocks tuned per cell by its authors, measured
# with libtpu 0.0.44 while the estimate compiles with 0.0.42.1). No public v6e or v5e Splash time
# was found beyond the calibration point, so on those chips, the one this notebook's table is about
# included, the estimate rests on one published point and has not been judged at all.
#
# The backward has no held-out table here. The only public backward kernel times found for these
# chips are tokamax's own Ironwood table (Splash backward, 32 q / 8 kv heads, causal, head dims
# 128 to 256, 4,096 to 131,072 tokens), and those are kept aside to judge the backward estimate
# from outside this notebook; no v5e or v6e backward time was found. The backward estimate uses the
# forward's calibrated clock and the same schedule reading, plus one rule the forward rarely meets:
# a path takes no fewer cycles than its busiest MXU is fed (`stlib.analysis.mxu_input`, notebook 10).

# %% [markdown]
# ## Measured on a TPU v5e: the estimate judged by a clock
#
# One real chip was reachable once: a TPU v5e. `python -m stlib.bench.tpu_measure run` timed the
# calls of the backward estimate's table there (10 x 75,600 x 128 bf16: the tile kernel on the band,
# the sliding tile and no mask at its default blocks; dense Splash at its tuned blocks with its fused
# and its split backward), forward alone and as a training step (`jax.grad`), median of 5 calls after
# a warm-up; the backward is the step minus the forward. `python -m stlib.bench.tpu_measure sweep`
# timed the forward of every candidate of the block sweep's v5e records. Nothing in the estimator was
# fitted to these times. The cells read the committed records (`data/tpu_measurements.jsonl`,
# `data/tpu_block_measurements.jsonl`); nothing runs on a TPU here.

# %%
from stlib.bench import backward_estimate, block_sweep, tpu_measure
from stlib.bench.records import read_records

measured = tpu_measure.read(cfg.data / Path(tpu_measure.RECORDS).name)
print(tpu_measure.format_table(tpu_measure.judged(measured, backward_estimate.read(
    cfg.data / Path(backward_estimate.RECORDS).name))))
sweep_measured = read_records(cfg.data / Path(tpu_measure.SWEEP_RECORDS).name)
sweep_rows = tpu_measure.sweep_rows(sweep_measured, block_sweep.read(cfg.data / Path(block_sweep.RECORDS).name))
print("\n" + tpu_measure.format_sweep_rows(sweep_rows))
fig = plotting.measured_vs_estimated(sweep_rows, "TPU v5e, 10 x 75,600 x 128 bf16 forward: the block sweep's "
                                     "candidates, measured vs static estimate")
plotting.save(fig, cfg.figure("08_v5e_measured_vs_estimated"))
print("\n" + tpu_measure.format_backward_sweep(
    read_records(cfg.data / Path(tpu_measure.BACKWARD_SWEEP_RECORDS).name)))

# %% [markdown]
# What the v5e says about the estimate (read the numbers above; the figure draws the second table):
#
# * **The MXU-feed rule is wrong for the tile kernel's forward.** Charging a path the rows its busiest
#   MXU is fed, pushed weights included (`stlib.analysis.mxu_input`, adopted to mend the backward on
#   TPU7x), raises the lane-dense forward's estimate well above its bundles-only one (the first
#   table's two estimates); the chip runs it at the pace of its bundles, as it runs Splash. With
#   every path charged its bundles alone, the estimates of the programs that fit run 13-22% over
#   the measured times for the forwards and 3-11% over for the backwards, Splash and the tile
#   kernel alike (the first table's measured and bundles-only columns; the sweep's forwards measure
#   0.82-0.91 of theirs, 10-22% over): the v5e's borrowed clock (v6e's, scaled by peak) is then the
#   common error.
# * **Some runs take far longer than their schedule, and the schedule does not say which.** Six
#   candidates ran 2.45-2.81 times their bundles-only estimate: the band at 2,048 x 2,048 and
#   2,560 x 2,560 blocks, and the sliding tile at 1,920 x 3,840 (82.60 ms measured, 33.68
#   bundles-only). Among the forwards, every one of them has the larger programs (the last column), as if
#   instructions past an instruction memory were fetched while the kernel runs; the next cells put
#   that to the chip. The band's backward (last lines) runs at pace at its tuned blocks and about
#   four times slower at every other. Where the chip has been timed, the tuner trusts the clock over
#   the estimate: `python -m stlib.bench.block_sweep tune` ranks a chip by its measured times where
#   every candidate was timed, which on v5e moved the sliding tile from the estimate's choice to one
#   row of tiles each way (29.4 ms). v6e and TPU7x were not measured.
# * **On v5e the tile kernel without a mask is as fast as Splash** (its best blocks 160.07 ms against
#   Splash's best 177.19 ms), not twice as slow as the estimate said; its training steps over dense
#   Splash's fused one, measured, are printed under the first table above.

# %% [markdown]
# ### Is it the size of the program?
#
# `python -m stlib.bench.program_size_probe run` put the question to the same v5e: it kept a slow
# candidate's blocks and changed one option that changes the program, not the work, and changed fast
# candidates the same way. No pattern regions (`pattern_grain=0`: the band's edge tiles run MASKED),
# no scores issued ahead (`lookahead=0`), whole q tiles instead of folds, coarser patterns. Each
# measured forward (median of 5) stands beside its own static estimate, bundles only, and its program
# size, compiled here for the v5e without a TPU (on a TPU: read from the committed estimate cache;
# where an estimate is missing there, the cell says so).

# %%
from stlib.bench import program_size_probe
from stlib.device import chip_spec

try:  # each row's static estimate: compiled here, or (on a TPU) read from the estimate cache
    probe_rows = program_size_probe.rows(program_size_probe.read(cfg.data / Path(program_size_probe.RECORDS).name))
    backward_probe = program_size_probe.backward_rows(
        read_records(cfg.data / Path(tpu_measure.BACKWARD_SWEEP_RECORDS).name))
except Exception as error:  # noqa: BLE001 - the estimate is optional; say why it is missing
    probe_rows = backward_probe = []
    print(f"no static estimates of the probes in this run ({type(error).__name__}: {str(error)[:200]})")
if probe_rows:
    print(program_size_probe.format_rows(probe_rows))
    print("\nthe band's backward at each candidate of the backward sweep (the backward's blocks cut to the forward's):")
    print(program_size_probe.format_rows(backward_probe))
for name, rows in (("forwards", probe_rows), ("backwards", backward_probe)):
    at_pace = [r["program_bundles"] for r in rows if r["ratio"] < tpu_measure.SLOW]
    slow = [r["program_bundles"] for r in rows if r["ratio"] >= tpu_measure.SLOW]
    if at_pace and slow:
        print(f"{name} at pace: programs of {min(at_pace):,}-{max(at_pace):,} bundles; slow: {min(slow):,}-{max(slow):,}")
print(f"v5e's program_bundles_limit in the chip table: {chip_spec('v5e').program_bundles_limit:,} bundles")

# %% [markdown]
# The chip's answer: the time follows the size of the program, not what it computes. The band at
# 2,048 x 2,048 runs at pace without its pattern regions (a smaller program doing more masked work)
# and slow with coarser patterns (a larger one); the band at 2,560 x 2,560 without patterns, no
# pattern region at all but a large MASKED one, is still slow, if less so; the band at 1,024 x 2,048,
# at pace, turns slow when 96- or 64-key register tiles make its program larger; issuing no scores
# ahead changes neither size nor time. The backward follows the same line: the band's backward ran
# at pace only at the blocks whose program is small (63,596 bundles as compiled now), and about 3.8 times its
# schedule at every other (its blocks are cut to the forward's, so four candidates are two
# programs). In the probes and the sweep above, every kernel at pace holds at most 63,596 bundles and
# every slow one at least 67,704: a limit between the two, as if the core held 2^16 = 65,536 bundles
# of instructions and fetched the rest while it runs. That is a reading of measurements, not a
# documented fact of the chip. The chip table keeps it (`Chip.program_bundles_limit`, v5e only) and
# the block sweep's tuner never picks a candidate past it; the estimate itself does not model it,
# and a chip not measured may have another limit.
#
# The step-coded kernels now keep to that limit themselves: on a chip that has one, a step plan keeps
# only the patterns whose regions fit it (`stlib.kernels.steps.program_pairs`, the patterns that
# save the most work first; the rest stay MASKED), at the forward's and the backward's own rate of
# code per score pair (`steps.CodeRate`). The band's and the sliding tile's plans fit as they were;
# frame causal's did not (next section).

# %% [markdown]
# ## Measured on a TPU v5e: the tile kernel and Splash on the same masks
#
# The comparison a user makes before switching kernels. `python -m stlib.bench.same_mask run` timed,
# on the v5e, the best tile kernel at its default blocks and Splash (`impl="splash"`: its own lazy
# mask where stlib's mask has one, else built from stlib's block layout, EMPTY and FULL tiles from
# the counts) at four block sizes on each mask, forward and training step (`jax.grad`, Splash's split
# backward), 10 x 75,600 x 128 bf16, median of 5 calls after a warm-up. Splash's row is its fastest
# blocks; blocks whose call failed (out of VMEM, or mask info past `splash.MASK_INFO_LIMIT`) are
# recorded as failed and skipped. The floor is the chip's nominal bf16 peak on the pairs the mask
# allows. The cell reads the committed records (`data/tpu_same_mask.jsonl`, each with its revision);
# nothing runs on a TPU here.

# %%
from stlib.bench import same_mask

same_rows = same_mask.best_rows(same_mask.read(cfg.data / same_mask.RECORDS))
print(same_mask.format_table(same_rows))
v5e_rows = [r for r in same_rows if r["chip"] == "v5e" and r["heads"] == 10]
if v5e_rows:
    fig = plotting.same_mask_bars(
        v5e_rows, "TPU v5e, 10 x 75,600 x 128 bf16: the tile kernel and Splash on the same masks (measured)"
    )
    plotting.save(fig, cfg.figure("08_v5e_same_masks"))
for r in read_records(cfg.data / same_mask.RECORDS):  # frame causal's tile kernel, every run
    if r["mask"] == "frame causal" and r["impl"] != "splash" and "median_ms" in r:
        print(f"frame causal, {r['impl']}, {r['direction']}: {r['median_ms']:.1f} ms at revision {r['git_rev']}")
svg_layout = stlib.block_layout(same_mask.catalogue_mask("per-head SVG", 10), 1024, 2048)
print(f"the per-head SVG mix in raster order at 1,024 x 2,048: {svg_layout.kind_counts()['PARTIAL']} PARTIAL "
      f"steps of {svg_layout.num_steps}")

# %% [markdown]
# What the chip says (the records' revisions in `data/tpu_same_mask.jsonl`):
#
# * **The band 0.25 and the sliding tile**: the tile kernel is ahead of Splash's best on both, by
#   little on the band's forward (48.68 against 52.31 ms at 1,024 x 2,048) and by a factor of four on
#   the sliding tile (29.42 against 113.65 ms), whose 3-D tiles Splash's larger blocks cut across:
#   at 1,024 x 2,048 its mask info holds 742 distinct partial blocks (4.67 GB of constants), which
#   no longer compiles but is refused by name.
# * **Frame causal** showed what the program limit above costs when nothing keeps to it: its first
#   run took 886.7 ms forward and 2920.5 ms a training step, nine times the floor, its forward's
#   eleven regions compiled to 89,762 bundles. Under the forward's budget (57,791 bundles) it ran
#   in 103.15 ms, 0.80 of Splash's best. Its training step then took 2135.0 ms: the backward's fused
#   pass still compiled to 98,315 bundles. Its own budget (60,191 bundles) came after the last
#   device time of that session, so the step is not yet measured under it.
# * **The per-head SVG mix, run in raster order as the catalogue mask**: 1758.91 ms forward against a
#   floor of 43.13 ms. In raster order its temporal heads touch every tile (most of its steps are
#   PARTIAL, the mask evaluated on every score, as printed above); Sparse VideoGen runs it routed,
#   each head in its own order (notebook 09), and the routed plan is not yet a case of this benchmark
#   on the chip (`same_mask.ROUTED`).
