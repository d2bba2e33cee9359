"""The benchmark runs, one per command: each times or measures, prints a line per record and
appends its records to ``<out_dir>/<name>.jsonl``."""

from __future__ import annotations

import dataclasses
import functools
import json
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp

import stlib
from stlib import masks
from stlib.bench.cases import case_function, case_inputs, case_study_cases, case_work, estimate_fields
from stlib.bench.records import DATA_DIR, Recorder, time_function
from stlib.configs import CASE_STUDY, DENSITIES, PUBLISHED, SMALL_CPU
from stlib.device import backend, compile_for_tpu, on_tpu, resolve_interpret

#: The workload the case study runs at off a TPU (Pallas interpret mode).
CPU_CASE = SMALL_CPU


def run_case_study(out_dir: Path = DATA_DIR, trials: int = 3, compile_check: bool = True,
                   densities=DENSITIES, size: str | None = None, estimates: bool = False) -> Path:
    """Time every case on this backend (interpret mode off a TPU), record times and work.
    ``size``: "full" (the case-study shape), "small" (the CPU stand-in) or None (full on a TPU).
    Raises ValueError for any other ``size``."""
    if size not in (None, "full", "small"):
        raise ValueError(f"size={size!r} must be 'full', 'small' or None")
    tpu = on_tpu() if size is None else size == "full"
    workload = CASE_STUDY if tpu else CPU_CASE
    recorder = Recorder(Path(out_dir) / "case_study.jsonl")
    interpret = resolve_interpret(None)
    cases = case_study_cases(workload, tpu, densities)
    if interpret:
        print(f"No TPU ({backend()}): Pallas kernels run in INTERPRET mode at {workload.grid.shape} "
              f"x {workload.num_heads} heads; these times say nothing about TPU speed.", flush=True)
    q, k, v = stlib.random_qkv(workload.qkv_shape, workload.dtype, seed=0)
    scale = workload.head_dim**-0.5
    for n, case in enumerate(cases, 1):
        qq, kk, vv = case_inputs(case, q, k, v)
        timing = time_function(case_function(case, scale, interpret), qq, kk, vv, trials=trials)
        work = case_work(case, workload)
        if estimates and not interpret and workload is CASE_STUDY:
            work.update(estimate_fields(case))
        record = recorder.write({
            "benchmark": "case-study", "impl": case.impl, "label": case.label, "pattern": case.pattern,
            "mask": repr(case.mask), "block_q": case.block_q, "block_kv": case.block_kv, "options": case.options,
            "shape": list(workload.qkv_shape), "grid": list(workload.grid.shape), "dtype": jnp.dtype(workload.dtype).name,
            "interpret": interpret, **dataclasses.asdict(timing), **work,
        })
        print(f"[{n}/{len(cases)}] {case.label:<30} {case.pattern:<13} density {record['density']:.3f}  "
              f"median {timing.median_ms:9.2f} ms{' (interpret)' if interpret else ''}", flush=True)
    if interpret:
        record_full_scale_work(out_dir, compile_check=compile_check, estimates=estimates)
    return recorder.path


def record_full_scale_work(out_dir: Path = DATA_DIR, compile_check: bool = True, estimates: bool = False) -> Path:
    """Hardware-independent work of every case at the full case-study shape, (optionally) a v6e
    compile check of one configuration per kernel, and (optionally) static v6e / v5e estimates."""
    recorder = Recorder(Path(out_dir) / "case_study_work.jsonl")
    cases = case_study_cases(CASE_STUDY, tpu=True)
    compiled = set()
    for n, case in enumerate(cases, 1):
        work = case_work(case, CASE_STUDY)
        key = (case.impl, case.pattern, json.dumps(case.options, sort_keys=True))
        compiles = None
        if compile_check and key not in compiled:
            compiled.add(key)
            shape = jax.ShapeDtypeStruct(CASE_STUDY.qkv_shape[:1] + (case.mask.length,) + CASE_STUDY.qkv_shape[2:],
                                         jnp.bfloat16)
            start = time.perf_counter()
            compile_for_tpu(case_function(case, 128**-0.5, False), shape, shape, shape, chip="v6e")
            compiles = {"chip": "v6e", "seconds": time.perf_counter() - start}
        extra = estimate_fields(case) if estimates else {}
        recorder.write({"benchmark": "case-study-work", "impl": case.impl, "label": case.label,
                        "pattern": case.pattern, "mask": repr(case.mask), "block_q": case.block_q,
                        "block_kv": case.block_kv, "options": case.options, "shape": list(CASE_STUDY.qkv_shape),
                        "compiled_for": compiles, **work, **extra})
        print(f"[work {n}/{len(cases)}] {case.label:<30} density {work['density']:.3f}  steps {work['grid_steps']:>8,}"
              f"  executed/useful {work['flop_ratio']:.2f}  v6e roofline {work['roofline_v6e_ms']:.2f} ms"
              + ("  compiled for v6e" if compiles else "")
              + (f"  static v6e estimate {extra['estimate_v6e_ms']:.2f} ms" if "estimate_v6e_ms" in extra else ""),
              flush=True)
    return recorder.path


def write_published_reference(out_dir: Path = DATA_DIR) -> Path:
    """Write the published case-study numbers and what they cover to ``case_study_reference.json``."""
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    path = Path(out_dir) / "case_study_reference.json"
    path.write_text(json.dumps({
        **PUBLISHED,
        "chip": "TPU v6e (one chip)",
        "shape": {"tokens": CASE_STUDY.num_tokens, "heads": CASE_STUDY.num_heads, "head_dim": CASE_STUDY.head_dim},
        "inputs": "synthetic",
        "excluded": ["routing (choosing each head's pattern)", "token reordering", "communication between devices"],
    }, indent=2) + "\n")
    return path


def run_cpu_scaling(out_dir: Path = DATA_DIR, lengths=(4096, 8192, 16384, 32768), densities=(0.1, 0.25, 0.5),
                    num_heads: int = 2, head_dim: int = 64, trials: int = 3) -> Path:
    """xla block-sparse attention vs dense xla attention (the same blocked loop over every tile)."""
    recorder = Recorder(Path(out_dir) / "cpu_scaling.jsonl")
    total = len(lengths) * (1 + len(densities))
    n = 0
    for length in lengths:
        q, k, v = stlib.random_qkv((num_heads, length, head_dim), jnp.float32, seed=length)
        dense_ms = None
        for density in (1.0, *densities):
            mask = masks.full(length) if density == 1.0 else masks.band(length, masks.band_width_for_density(length, density))
            fn = functools.partial(stlib.attention, mask=mask, impl="xla", block_q=256, block_kv=256)
            timing = time_function(fn, q, k, v, trials=trials)
            layout = stlib.block_layout(mask, 256, 256)
            dense_ms = timing.median_ms if density == 1.0 else dense_ms
            n += 1
            record = recorder.write({
                "benchmark": "cpu-scaling", "impl": "xla", "mask": repr(mask), "length": length, "heads": num_heads,
                "head_dim": head_dim, "dtype": "float32", "block_q": 256, "block_kv": 256,
                "density": layout.density, "occupancy": layout.occupancy, "ideal_speedup": 1 / layout.density,
                "speedup_vs_dense": dense_ms / timing.median_ms, **dataclasses.asdict(timing),
            })
            print(f"[{n}/{total}] L={length:>6} density {record['density']:.3f}  median {timing.median_ms:9.1f} ms  "
                  f"speed-up {record['speedup_vs_dense']:.2f}x (ideal {record['ideal_speedup']:.2f}x)", flush=True)
    return recorder.path


def run_layout(out_dir: Path = DATA_DIR, block_q: int = 128, block_kv: int = 128) -> Path:
    """Mask + layout construction time and peak memory of every built-in pattern at the case-study
    grid, each in a fresh subprocess so its peak memory is its own."""
    from stlib.analysis.dump import subprocess_env
    from stlib.masks import case_study_masks

    recorder = Recorder(Path(out_dir) / "layout.jsonl")
    names = list(case_study_masks())
    for n, name in enumerate(names, 1):
        proc = subprocess.run([sys.executable, "-m", "stlib.bench.layout_probe", name, str(block_q), str(block_kv)],
                              capture_output=True, text=True, check=True, env=subprocess_env())
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        recorder.write({"benchmark": "layout", "grid": list(CASE_STUDY.grid.shape), "heads": CASE_STUDY.num_heads,
                        "block_q": block_q, "block_kv": block_kv, **result})
        print(f"[{n}/{len(names)}] {name:<38} build {result['seconds']:6.3f} s  peak {result['peak_rss_mb']:6.0f} MB "
              f"(+{result['layout_peak_growth_mb']:4.0f} MB over the imports)  "
              f"density {result['density']:.3f}  occupancy {result['occupancy']:.3f}", flush=True)
    return recorder.path
