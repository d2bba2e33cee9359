"""The benchmark figures, redrawn from the records in ``data/`` (no hardware needed); both folders
default to those of ``stlib.paths`` (read at each call)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from stlib import paths
from stlib.bench.records import read_records


def _near_density(records: list[dict], density: float = 0.25) -> list[dict]:
    return [
        r
        for r in records
        if r["pattern"] == "dense" or (r["pattern"] == "band" and abs(r["density"] - density) < 0.06)
    ]


def draw_figures(data_dir: Path | None = None, figures_dir: Path | None = None) -> list[Path]:
    """Redraw the benchmark figures from the latest run of each record file (no hardware needed), from
    ``data_dir`` (default ``stlib.paths.data_dir()``) into ``figures_dir`` (default
    ``stlib.paths.figures_dir()``)."""
    from stlib import plotting
    from stlib.device import chip_of_device_kind

    data_dir = paths.data_dir() if data_dir is None else Path(data_dir)
    figures_dir = paths.figures_dir() if figures_dir is None else Path(figures_dir)
    written = []
    reference = data_dir / "case_study_reference.json"
    published = json.loads(reference.read_text()) if reference.exists() else None
    case = read_records(data_dir / "case_study.jsonl", latest_run=True)
    if case:
        where = plotting.where_measured(case[0])
        shape = " x ".join(str(n) for n in case[0]["shape"])
        dense = next(r for r in case if r["label"] == "Splash (dense)")
        work = read_records(data_dir / "case_study_work.jsonl", latest_run=True)
        estimates = [
            {"label": f"{r['label']}, density {r['density']:.2f}", "ms": r["estimate_v6e_ms"]}
            for r in _near_density(work)
            if "estimate_v6e_ms" in r
        ]
        fig = plotting.latency_bars(
            _near_density(case),
            f"Case study, [H, L, D] = [{shape}]: dense and band density ~0.25",
            published,
            estimates=estimates,
        )
        written.append(plotting.save(fig, figures_dir / "bench_case_study_latency.png"))
        fig = plotting.speedup_vs_density(
            [r for r in case if r["pattern"] != "dense"],
            dense["median_ms"],
            f"Speed-up over dense Splash, [{shape}]\n{where}",
        )
        written.append(plotting.save(fig, figures_dir / "bench_case_study_speedup.png"))
    # the latest TPU run, even when CPU runs were appended since: its times next to the static estimates
    tpu = read_records(
        data_dir / "case_study.jsonl", latest_run=True, where=lambda r: not r.get("interpret", True)
    )
    chip = chip_of_device_kind(tpu[0].get("device_kind", "")) if tpu else None
    if tpu and chip is not None:
        shape = " x ".join(str(n) for n in tpu[0]["shape"])
        field = f"estimate_{chip}_ms"
        work = read_records(data_dir / "case_study_work.jsonl", latest_run=True, where=lambda r: field in r)
        estimates = [
            {"label": f"{r['label']}, density {r['density']:.2f} (static estimate)", "ms": r[field]}
            for r in _near_density(work)
        ]
        fig = plotting.latency_bars(
            _near_density(tpu),
            f"Measured on {tpu[0]['device_kind']} ({tpu[0]['date'][:10]}, "
            f"rev {tpu[0]['git_rev']}), [{shape}]: dense and band density ~0.25",
            published,
            estimates=estimates or None,
        )
        written.append(plotting.save(fig, figures_dir / "bench_tpu_case_study_latency.png"))
        fig = plotting.roofline_fraction(
            _near_density(tpu), chip, f"Fraction of the {chip} roofline, [{shape}]"
        )
        written.append(plotting.save(fig, figures_dir / "bench_case_study_roofline.png"))
    work = read_records(data_dir / "case_study_work.jsonl", latest_run=True)
    if work:
        fig = plotting.work_bars(
            _near_density(work),
            "Work per call at the case-study shape [10 x 75,600 x 128], dense "
            "and band density ~0.25 (computed, hardware-independent)",
        )
        written.append(plotting.save(fig, figures_dir / "bench_case_study_work.png"))
    scaling = read_records(data_dir / "cpu_scaling.jsonl", latest_run=True)
    if scaling:
        series = {}
        for r in scaling:
            if r["density"] < 1.0:
                series.setdefault(f"L = {r['length']:,}", []).append((r["density"], r["speedup_vs_dense"]))
        fig = plotting.timing_lines(
            series,
            f"xla block-sparse vs dense xla, measured on {scaling[0]['device_kind']} "
            f"({scaling[0]['heads']} heads, head dim {scaling[0]['head_dim']})",
            "density (allowed pairs / L²)",
            "speed-up over dense",
        )
        ax = fig.axes[0]
        xs = np.linspace(min(r["density"] for r in scaling) * 0.9, 0.6, 50)
        ax.plot(xs, 1 / xs, "k--", lw=1, label="ideal 1 / density")
        ax.legend(fontsize=8)
        written.append(plotting.save(fig, figures_dir / "bench_cpu_scaling.png"))
    layout = read_records(data_dir / "layout.jsonl", latest_run=True)
    if layout:
        fig = plotting.named_bars(
            {r["mask"]: r["seconds"] for r in layout},
            f"Mask + layout construction at 21 x 45 x 80, {layout[0]['block_q']} x "
            f"{layout[0]['block_kv']} tiles, 10 heads (CPU, one process each)",
            "seconds",
        )
        written.append(plotting.save(fig, figures_dir / "bench_layout_time.png"))
    return written
