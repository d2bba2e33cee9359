"""Benchmarks: time any implementation on the backend at hand and record every measurement.

    python -m stlib.bench case-study   # dense Splash vs every stlib kernel across densities
    python -m stlib.bench cpu-scaling  # xla block-sparse vs dense xla for growing L (honest on CPU)
    python -m stlib.bench layout       # mask + layout construction time and peak memory
    python -m stlib.bench figures      # redraw the figures from data/ (no hardware needed)

Records are JSON lines appended to ``data/<command>.jsonl`` (flushed per record, so a crashed run
loses nothing already written). Off a TPU, Pallas kernels run in interpret mode: those times say
nothing about TPU speed and every record says so (``interpret: true``); next to them the
hardware-independent work at the full case-study shape and a compile check for v6e are recorded.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import importlib.metadata
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import stlib
import stlib.kernels
from stlib import masks
from stlib.configs import CASE_STUDY, PUBLISHED, SMALL_CPU, Workload
from stlib.device import backend, compile_for_tpu, device_kind, on_tpu, resolve_interpret
from stlib.geometry import VideoGrid, tiled_order
from stlib.roofline import work_summary

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
DENSITIES = (0.15, 0.25, 0.35, 0.45, 0.55, 0.65)
CPU_CASE = SMALL_CPU
CPU_STA_TILE = (1, 8, 16)
CASE_STA_TILE = (3, 8, 16)


# --------------------------------------------------------------------------------------------
# environment and records


@functools.cache
def environment() -> dict:
    def version(name):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None

    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             cwd=Path(__file__).parent, timeout=10, check=False).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        rev = "unknown"
    return {"backend": backend(), "device_kind": device_kind(), "jax": version("jax"), "jaxlib": version("jaxlib"),
            "libtpu": version("libtpu"), "git_rev": rev}


#: Identifies the records of one benchmark process (figures draw the latest run of each file).
RUN_ID = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S") + f"-{os.getpid()}"


class Recorder:
    """Appends one JSON object per line to ``path``; each record is flushed and synced at once."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, record: dict) -> dict:
        full = {**environment(), "run": RUN_ID,
                "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), **record}
        with open(self.path, "a") as handle:
            handle.write(json.dumps(full, default=_jsonable) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        return full


def _jsonable(value):
    if isinstance(value, (np.integer, np.floating)):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)


def read_records(path: Path, latest_run: bool = False) -> list[dict]:
    """The records of a .jsonl file (only those of its most recent run with ``latest_run``)."""
    path = Path(path)
    if not path.exists():
        return []
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if latest_run and records:
        last = records[-1].get("run")
        records = [r for r in records if r.get("run") == last]
    return records


# --------------------------------------------------------------------------------------------
# timing


@dataclass(frozen=True)
class Timing:
    median_ms: float
    min_ms: float
    max_ms: float
    compile_ms: float
    trials: int


def time_function(fn, *args, trials: int = 5, warmup: int = 1) -> Timing:
    """Compile ``fn`` (excluded, reported separately), warm up, then time ``trials`` calls with
    block_until_ready."""
    start = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    compile_ms = (time.perf_counter() - start) * 1e3
    for _ in range(warmup):
        jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(trials):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append((time.perf_counter() - start) * 1e3)
    return Timing(statistics.median(times), min(times), max(times), compile_ms, trials)


# --------------------------------------------------------------------------------------------
# the case study


@dataclass(frozen=True)
class Case:
    """One kernel configuration of the case-study comparison."""

    impl: str
    pattern: str  # "dense", "band" or "sliding tile"
    mask: object  # stlib mask in the order the kernel sees
    label: str
    block_q: int | None = None
    block_kv: int | None = None
    options: dict = dataclasses.field(default_factory=dict)
    order: object = None  # TokenOrder applied outside the kernel (excluded from kernel time) ...
    grid: object = None  # ... or, with a grid, inside the timed call: video_attention on raster inputs

    @property
    def reorders_in_timing(self) -> bool:
        return self.grid is not None

    @property
    def kernel_mask(self):
        """The mask in the order the kernel sees."""
        return self.mask.permute(self.order) if self.reorders_in_timing else self.mask


def sta_windows(grid: VideoGrid, tile) -> list[tuple[int, int, int]]:
    """Odd tile windows from the smallest to the whole grid (one per distinct size)."""
    counts = [-(-n // s) for n, s in zip(grid.shape, tile)]
    options = []
    for w in range(1, max(counts) + 1, 2):
        window = tuple(min(w, c if c % 2 else c - 1) for c in counts)
        if window not in options:
            options.append(window)
    return options


def case_study_cases(workload: Workload, sta_tile, tpu: bool, densities=DENSITIES) -> list[Case]:
    grid, length = workload.grid, workload.num_tokens
    big = {"block_q": 512, "block_kv": 1024} if tpu else {"block_q": 128, "block_kv": 128}
    tile_bq = tile_bkv = int(np.prod(sta_tile))
    cases = [
        Case("splash", "dense", masks.full(length), "Splash (dense)", **big),
        Case("pallas_dense", "dense", masks.full(length), "pallas_dense (dense)", **big),
        Case("pallas_tile", "dense", masks.full(length), "pallas_tile (dense)", **big),
    ]
    for density in densities:
        band = masks.band(length, masks.band_width_for_density(length, density))
        cases += [
            Case("splash", "band", band, "Splash (band)", **big),
            Case("pallas_dense", "band", band, "pallas_dense (masked)", **big),
            Case("pallas_block_sparse", "band", band, "pallas_block_sparse", **big),
            Case("pallas_tile", "band", band, "pallas_tile rows", **big, options={"form": "rows"}),
            Case("pallas_tile", "band", band, "pallas_tile flat", **big, options={"form": "flat"}),
            Case("pallas_tile", "band", band, "pallas_tile balanced", **big, options={"boundary": "balanced"}),
        ]
    order = tiled_order(grid, sta_tile)
    counts = [-(-n // s) for n, s in zip(grid.shape, sta_tile)]
    for window in sta_windows(grid, sta_tile):
        if all(w >= c for w, c in zip(window, counts)):
            continue  # the whole grid: that is the dense case
        sta = masks.sliding_tile(grid, sta_tile, window)
        cases += [
            Case("pallas_block_sparse", "sliding tile", sta, "pallas_block_sparse (raster)", **big),
            Case("pallas_tile", "sliding tile", sta.permute(order), "pallas_tile (3-D tiled)",
                 block_q=tile_bq, block_kv=tile_bkv, order=order),
            Case("pallas_tile", "sliding tile", sta, "pallas_tile (3-D tiled) + reordering",
                 block_q=tile_bq, block_kv=tile_bkv, order=order, grid=grid),
        ]
    return cases


def case_function(case: Case, scale: float, interpret: bool):
    """The call a case times: (q, k, v) -> o, in the order ``case_inputs`` gives."""
    if case.reorders_in_timing:
        return functools.partial(stlib.video_attention, grid=case.grid, mask=case.mask, impl=case.impl,
                                 orders=case.order, scale=scale, block_q=case.block_q, block_kv=case.block_kv,
                                 interpret=interpret)
    if case.impl == "pallas_tile" and case.options:
        from stlib.kernels.common import block_sizes_for
        from stlib.kernels.tile import TileOptions, tile_attention

        sizes = block_sizes_for(case.mask.length, case.block_q, case.block_kv, interpret=interpret)
        layout = stlib.block_layout(case.mask, sizes.block_q, sizes.block_kv)
        options = TileOptions(**case.options)
        return functools.partial(tile_attention, layout=layout, scale=scale, options=options, interpret=interpret)
    return functools.partial(stlib.attention, mask=case.mask, impl=case.impl, scale=scale, block_q=case.block_q,
                             block_kv=case.block_kv, interpret=interpret)


def case_inputs(case: Case, q, k, v):
    """Raster-order q, k, v as the case's call takes them (permuted when the order is applied
    outside the timed call)."""
    if case.order is None or case.reorders_in_timing:
        return q, k, v
    return tuple(case.order.apply(x) for x in (q, k, v))


def case_work(case: Case, workload: Workload) -> dict:
    from stlib.kernels.tile import TileOptions

    bq = case.block_q or 128
    bkv = case.block_kv or 128
    layout = stlib.block_layout(case.kernel_mask, bq, bkv)
    options = TileOptions(**case.options) if case.options else None
    return work_summary(case.impl, layout, workload.num_heads, workload.head_dim,
                        jnp.dtype(workload.dtype).itemsize, options)


def run_case_study(out_dir: Path = DATA_DIR, trials: int = 3, compile_check: bool = True,
                   densities=DENSITIES, size: str | None = None, estimates: bool = False) -> Path:
    """Time every case on this backend (interpret mode off a TPU), record times and work.
    ``size``: "full" (the case-study shape), "small" (the CPU stand-in) or None (full on a TPU)."""
    if size not in (None, "full", "small"):
        raise ValueError(f"size={size!r} must be 'full', 'small' or None")
    tpu = on_tpu() if size is None else size == "full"
    workload = CASE_STUDY if tpu else CPU_CASE
    recorder = Recorder(Path(out_dir) / "case_study.jsonl")
    interpret = resolve_interpret(None)
    cases = case_study_cases(workload, CASE_STA_TILE if tpu else CPU_STA_TILE, tpu, densities)
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


def estimate_fields(case: Case) -> dict:
    """Static v6e and v5e time estimates of a Pallas / Splash case at the full case-study shape
    (``stlib.estimate``; labelled as estimates, with method, clock and libtpu version), or the
    reason there is none."""
    from stlib import estimate

    out = {}
    mask = "full" if case.pattern == "dense" else case.kernel_mask
    for chip in ("v6e", "v5e"):
        try:
            record = estimate.estimate(case.impl, mask, chip, block_q=case.block_q, block_kv=case.block_kv,
                                       options=case.options or None).as_record()
        except Exception as error:  # noqa: BLE001 - recorded, never silently replaced by a number
            out[f"estimate_{chip}_error"] = f"{type(error).__name__}: {error}"[:500]
            continue
        record.pop("estimate_breakdown", None)
        out.update({key.replace("estimate_", f"estimate_{chip}_", 1): value for key, value in record.items()})
    return out


def record_full_scale_work(out_dir: Path = DATA_DIR, compile_check: bool = True, estimates: bool = False) -> Path:
    """Hardware-independent work of every case at the full case-study shape, (optionally) a v6e
    compile check of one configuration per kernel, and (optionally) static v6e / v5e estimates."""
    recorder = Recorder(Path(out_dir) / "case_study_work.jsonl")
    cases = case_study_cases(CASE_STUDY, CASE_STA_TILE, tpu=True)
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


# --------------------------------------------------------------------------------------------
# CPU scaling and layout construction


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
    from stlib.layout_catalog import case_study_masks

    recorder = Recorder(Path(out_dir) / "layout.jsonl")
    names = list(case_study_masks())
    for n, name in enumerate(names, 1):
        proc = subprocess.run([sys.executable, "-m", "stlib.layout_catalog", name, str(block_q), str(block_kv)],
                              capture_output=True, text=True, check=True)
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        recorder.write({"benchmark": "layout", "grid": list(CASE_STUDY.grid.shape), "heads": CASE_STUDY.num_heads,
                        "block_q": block_q, "block_kv": block_kv, **result})
        print(f"[{n}/{len(names)}] {name:<38} build {result['seconds']:6.3f} s  peak {result['peak_rss_mb']:6.0f} MB "
              f"(+{result['layout_peak_growth_mb']:4.0f} MB over the imports)  "
              f"density {result['density']:.3f}  occupancy {result['occupancy']:.3f}", flush=True)
    return recorder.path


def _near_density(records: list[dict], density: float = 0.25) -> list[dict]:
    return [r for r in records if r["pattern"] == "dense" or (r["pattern"] == "band" and abs(r["density"] - density) < 0.06)]


def draw_figures(data_dir: Path = DATA_DIR, figures_dir: Path | None = None) -> list[Path]:
    """Redraw the benchmark figures from the latest run of each record file (no hardware needed)."""
    from stlib import plotting

    data_dir = Path(data_dir)
    figures_dir = Path(figures_dir or plotting.FIGURES_DIR)
    written = []
    reference = data_dir / "case_study_reference.json"
    published = json.loads(reference.read_text()) if reference.exists() else None
    case = read_records(data_dir / "case_study.jsonl", latest_run=True)
    if case:
        where = plotting.where_measured(case[0])
        shape = " x ".join(str(n) for n in case[0]["shape"])
        dense = next(r for r in case if r["label"] == "Splash (dense)")
        work = read_records(data_dir / "case_study_work.jsonl", latest_run=True)
        estimates = [{"label": f"{r['label']}, density {r['density']:.2f}", "ms": r["estimate_v6e_ms"]}
                     for r in _near_density(work) if "estimate_v6e_ms" in r]
        fig = plotting.latency_bars(_near_density(case), f"Case study, [H, L, D] = [{shape}]: dense and band density "
                                                         "~0.25", published, estimates=estimates)
        written.append(plotting.save(fig, figures_dir / "bench_case_study_latency.png"))
        fig = plotting.speedup_vs_density([r for r in case if r["pattern"] != "dense"], dense["median_ms"],
                                          f"Speed-up over dense Splash, [{shape}]\n{where}")
        written.append(plotting.save(fig, figures_dir / "bench_case_study_speedup.png"))
        if not case[0].get("interpret"):
            chip = "v6e" if "v6" in case[0].get("device_kind", "").lower() else "v5e"
            fig = plotting.roofline_fraction(_near_density(case), chip, f"Fraction of the {chip} roofline, [{shape}]")
            written.append(plotting.save(fig, figures_dir / "bench_case_study_roofline.png"))
    work = read_records(data_dir / "case_study_work.jsonl", latest_run=True)
    if work:
        fig = plotting.work_bars(_near_density(work), "Work per call at the case-study shape [10 x 75,600 x 128], dense "
                                                      "and band density ~0.25 (computed, hardware-independent)")
        written.append(plotting.save(fig, figures_dir / "bench_case_study_work.png"))
    scaling = read_records(data_dir / "cpu_scaling.jsonl", latest_run=True)
    if scaling:
        series = {}
        for r in scaling:
            if r["density"] < 1.0:
                series.setdefault(f"L = {r['length']:,}", []).append((r["density"], r["speedup_vs_dense"]))
        fig = plotting.timing_lines(series, f"xla block-sparse vs dense xla, measured on {scaling[0]['device_kind']} "
                                            f"({scaling[0]['heads']} heads, head dim {scaling[0]['head_dim']})",
                                    "density (allowed pairs / L²)", "speed-up over dense")
        ax = fig.axes[0]
        xs = np.linspace(min(r["density"] for r in scaling) * 0.9, 0.6, 50)
        ax.plot(xs, 1 / xs, "k--", lw=1, label="ideal 1 / density")
        ax.legend(fontsize=8)
        written.append(plotting.save(fig, figures_dir / "bench_cpu_scaling.png"))
    layout = read_records(data_dir / "layout.jsonl", latest_run=True)
    if layout:
        fig = plotting.named_bars({r["mask"]: r["seconds"] for r in layout},
                                  f"Mask + layout construction at 21 x 45 x 80, {layout[0]['block_q']} x "
                                  f"{layout[0]['block_kv']} tiles, 10 heads (CPU, one process each)", "seconds")
        written.append(plotting.save(fig, figures_dir / "bench_layout_time.png"))
    return written


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m stlib.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["case-study", "cpu-scaling", "layout", "figures", "all"])
    parser.add_argument("--out", type=Path, default=DATA_DIR, help="directory of the .jsonl records")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--no-compile-check", action="store_true", help="skip the v6e compile checks")
    parser.add_argument("--no-estimates", action="store_true",
                        help="skip the static v6e / v5e estimates of the full-shape records (stlib.estimate)")
    args = parser.parse_args(argv)
    write_published_reference(args.out)
    if args.command in ("case-study", "all"):
        run_case_study(args.out, trials=args.trials, compile_check=not args.no_compile_check,
                       estimates=not args.no_estimates)
    if args.command in ("cpu-scaling", "all"):
        run_cpu_scaling(args.out, trials=args.trials)
    if args.command in ("layout", "all"):
        run_layout(args.out)
    for path in draw_figures(args.out):
        print(f"figure: {path}")


if __name__ == "__main__":
    main()
