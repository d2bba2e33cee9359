"""The benchmark runs, one per command: each times or measures, prints a line per record and
appends its records to ``<out_dir>/<name>.jsonl`` (``out_dir`` None: ``stlib.paths.data_dir()``, read
at each call, so ``STLIB_HOME`` set later still counts)."""

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
from stlib import masks, paths
from stlib.bench.cases import case_function, case_inputs, case_study_cases, case_work, estimate_fields
from stlib.bench.progress import Progress
from stlib.bench.records import Compiled, Recorder, compile_function, time_function, time_interleaved
from stlib.configs import CASE_STUDY, DENSITIES, PUBLISHED, SMALL_CPU
from stlib.device import backend, compile_for_tpu, on_tpu, resolve_interpret
from stlib.registry import Role, by_role

#: The workload the case study runs at off a TPU (Pallas interpret mode).
CPU_CASE = SMALL_CPU


def _out_dir(out_dir: Path | None) -> Path:
    """``out_dir``, or ``stlib.paths.data_dir()`` when None."""
    return paths.data_dir() if out_dir is None else Path(out_dir)


#: Cases compiled by ``compile_case`` and not yet timed by ``run_case_study`` (which takes them out).
_COMPILED: dict = {}


def _case_key(case, scale: float, interpret: bool, args) -> tuple:
    return (
        case.impl,
        case.label,
        case.mask,
        case.order,
        case.grid,
        case.block_q,
        case.block_kv,
        json.dumps(case.options, sort_keys=True),
        scale,
        interpret,
        tuple((tuple(a.shape), jnp.dtype(a.dtype).name) for a in args),
    )


def compile_case(case, scale: float, interpret: bool, *args) -> Compiled:
    """The call of ``case`` (``case_function``) compiled for ``args``, compiled once: a later
    ``run_case_study`` of the same case and shapes times this executable instead of compiling again
    (check a case with it first, as notebook 08 does)."""
    key = _case_key(case, scale, interpret, args)
    if key not in _COMPILED:
        _COMPILED[key] = compile_function(case_function(case, scale, interpret), *args)
    return _COMPILED[key]


def run_case_study(
    out_dir: Path | None = None,
    trials: int = 3,
    compile_check: bool = True,
    densities=DENSITIES,
    size: str | None = None,
    estimates: bool = False,
    cases=None,
) -> Path:
    """Time every case on this backend (interpret mode off a TPU: ``trials`` rounds, each case once a
    round in a shuffled order, ``stlib.bench.time_interleaved``), record times and work.
    ``size``: "full" (the case-study shape), "small" (the CPU stand-in) or None (full on a TPU).
    ``cases``: the cases to time, built for that size's workload (e.g. ``focus_cases``); None: every
    case of ``case_study_cases`` at ``densities``. Raises ValueError for any other ``size``."""
    if size not in (None, "full", "small"):
        raise ValueError(f"size={size!r} must be 'full', 'small' or None")
    tpu = on_tpu() if size is None else size == "full"
    workload = CASE_STUDY if tpu else CPU_CASE
    recorder = Recorder(_out_dir(out_dir) / "case_study.jsonl")
    interpret = resolve_interpret(None)
    cases = case_study_cases(workload, tpu, densities) if cases is None else list(cases)
    if interpret:
        print(
            f"No TPU ({backend()}): Pallas kernels run in INTERPRET mode at {workload.grid.shape} "
            f"x {workload.num_heads} heads; these times say nothing about TPU speed.",
            flush=True,
        )
    q, k, v = stlib.random_qkv(workload.qkv_shape, workload.dtype, seed=0)
    scale = workload.head_dim**-0.5
    bound = {}  # each case compiled once and bound to its own inputs, timed below all together
    for n, case in enumerate(cases):
        qq, kk, vv = case_inputs(case, q, k, v)
        compiled = _COMPILED.pop(_case_key(case, scale, interpret, (qq, kk, vv)), None)  # compiled by a check
        compiled = compiled or compile_function(case_function(case, scale, interpret), qq, kk, vv)
        bound[n] = Compiled(functools.partial(compiled.executable, qq, kk, vv), compiled.compile_ms)
    tracker = Progress(len(cases), "case study")
    # rounds of one call per case in a shuffled order: a slow spell of a shared machine falls on one
    # call of several cases, not on every call of one (the median then keeps the figure's shape)
    timings = time_interleaved(
        bound, rounds=trials, trials=1, progress=lambda n: tracker.step(cases[n].label)
    )
    for n, case in enumerate(cases):
        timing = timings[n]
        work = case_work(case, workload)
        if estimates and not interpret and workload is CASE_STUDY:
            work.update(estimate_fields(case))
        record = recorder.write(
            {
                "benchmark": "case-study",
                **case.record_fields(),
                "shape": list(workload.qkv_shape),
                "grid": list(workload.grid.shape),
                "dtype": jnp.dtype(workload.dtype).name,
                "interpret": interpret,
                **dataclasses.asdict(timing),
                **work,
            }
        )
        print(
            f"{case.label:<30} {case.pattern:<13} density {record['density']:.3f}  "
            f"median {timing.median_ms:9.2f} ms{' (interpret)' if interpret else ''}",
            flush=True,
        )
    if interpret:
        record_full_scale_work(out_dir, compile_check=compile_check, estimates=estimates)
    return recorder.path


def record_full_scale_work(
    out_dir: Path | None = None, compile_check: bool = True, estimates: bool = False
) -> Path:
    """Hardware-independent work of every case at the full case-study shape, (optionally) a v6e
    compile check of one configuration per kernel, and (optionally) static v6e / v5e estimates."""
    recorder = Recorder(_out_dir(out_dir) / "case_study_work.jsonl")
    cases = case_study_cases(CASE_STUDY, tpu=True)
    compiled = set()
    tracker = Progress(len(cases), "full-shape work")
    for case in cases:
        work = case_work(case, CASE_STUDY)
        key = (case.impl, case.pattern, json.dumps(case.options, sort_keys=True))
        compiles = None
        if compile_check and key not in compiled:
            compiled.add(key)
            shape = jax.ShapeDtypeStruct(
                CASE_STUDY.qkv_shape[:1] + (case.mask.length,) + CASE_STUDY.qkv_shape[2:], jnp.bfloat16
            )
            start = time.perf_counter()
            compile_for_tpu(case_function(case, 128**-0.5, False), shape, shape, shape, chip="v6e")
            compiles = {"chip": "v6e", "seconds": time.perf_counter() - start}
        extra = estimate_fields(case) if estimates else {}
        recorder.write(
            {
                "benchmark": "case-study-work",
                **case.record_fields(),
                "shape": list(CASE_STUDY.qkv_shape),
                "compiled_for": compiles,
                **work,
                **extra,
            }
        )
        tracker.step(
            f"{case.label:<30} density {work['density']:.3f}  steps {work['grid_steps']:>8,}"
            f"  executed/useful {work['flop_ratio']:.2f}  v6e roofline {work['roofline_v6e_ms']:.2f} ms"
            + ("  compiled for v6e" if compiles else "")
            + (
                f"  static v6e estimate {extra['estimate_v6e_ms']:.2f} ms"
                if "estimate_v6e_ms" in extra
                else ""
            )
        )
    return recorder.path


def write_published_reference(out_dir: Path | None = None) -> Path:
    """Write the published case-study numbers and what they cover to ``case_study_reference.json``."""
    out_dir = _out_dir(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "case_study_reference.json"
    path.write_text(
        json.dumps(
            {
                **PUBLISHED,
                "chip": "TPU v6e (one chip)",
                "shape": {
                    "tokens": CASE_STUDY.num_tokens,
                    "heads": CASE_STUDY.num_heads,
                    "head_dim": CASE_STUDY.head_dim,
                },
                "inputs": "synthetic",
                "excluded": [
                    "routing (choosing each head's pattern)",
                    "token reordering",
                    "communication between devices",
                ],
            },
            indent=2,
        )
        + "\n"
    )
    return path


def run_cpu_scaling(
    out_dir: Path | None = None,
    lengths=(4096, 8192, 16384, 32768),
    densities=(0.1, 0.25, 0.5),
    num_heads: int = 2,
    head_dim: int = 64,
    trials: int = 3,
) -> Path:
    """xla block-sparse attention vs dense xla attention (the same blocked loop over every tile)."""
    recorder = Recorder(_out_dir(out_dir) / "cpu_scaling.jsonl")
    tracker = Progress(len(lengths) * (1 + len(densities)), "cpu scaling")
    xla = by_role(Role.XLA).name
    for length in lengths:
        q, k, v = stlib.random_qkv((num_heads, length, head_dim), jnp.float32, seed=length)
        dense_ms = None
        for density in (1.0, *densities):
            mask = (
                masks.full(length)
                if density == 1.0
                else masks.band(length, masks.band_width_for_density(length, density))
            )
            fn = functools.partial(stlib.attention, mask=mask, impl=xla, block_q=256, block_kv=256)
            timing = time_function(fn, q, k, v, trials=trials)
            layout = stlib.block_layout(mask, 256, 256)
            dense_ms = timing.median_ms if density == 1.0 else dense_ms
            record = recorder.write(
                {
                    "benchmark": "cpu-scaling",
                    "impl": xla,
                    "mask": repr(mask),
                    "length": length,
                    "heads": num_heads,
                    "head_dim": head_dim,
                    "dtype": "float32",
                    "block_q": 256,
                    "block_kv": 256,
                    "density": layout.density,
                    "occupancy": layout.occupancy,
                    "ideal_speedup": 1 / layout.density,
                    "speedup_vs_dense": dense_ms / timing.median_ms,
                    **dataclasses.asdict(timing),
                }
            )
            tracker.step(
                f"L={length:>6} density {record['density']:.3f}  median {timing.median_ms:9.1f} ms  "
                f"speed-up {record['speedup_vs_dense']:.2f}x (ideal {record['ideal_speedup']:.2f}x)"
            )
    return recorder.path


def run_layout(out_dir: Path | None = None, block_q: int = 128, block_kv: int = 128) -> Path:
    """Mask + layout construction time and peak memory of every built-in pattern at the case-study
    grid, each in a fresh subprocess so its peak memory is its own."""
    from stlib.analysis.dump import subprocess_env
    from stlib.masks import case_study_masks

    recorder = Recorder(_out_dir(out_dir) / "layout.jsonl")
    names = list(case_study_masks())
    tracker = Progress(len(names), "layout")
    for name in names:
        proc = subprocess.run(
            [sys.executable, "-m", "stlib.bench.layout_probe", name, str(block_q), str(block_kv)],
            capture_output=True,
            text=True,
            check=True,
            env=subprocess_env(),
        )
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        recorder.write(
            {
                "benchmark": "layout",
                "grid": list(CASE_STUDY.grid.shape),
                "heads": CASE_STUDY.num_heads,
                "block_q": block_q,
                "block_kv": block_kv,
                **result,
            }
        )
        tracker.step(
            f"{name:<38} build {result['seconds']:6.3f} s  peak {result['peak_rss_mb']:6.0f} MB "
            f"(+{result['layout_peak_growth_mb']:4.0f} MB over the imports)  "
            f"density {result['density']:.3f}  occupancy {result['occupancy']:.3f}"
        )
    return recorder.path
