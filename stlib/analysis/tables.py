"""The calibration table (dense Splash at several block sizes) and the case-study table (every
kernel at the benchmark band densities and the sliding-tile pattern), as static estimates."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

from stlib import registry
from stlib.analysis.clock import calibration, solve_clock
from stlib.analysis.dump import KernelConfig, resolve_mask
from stlib.analysis.static import estimate
from stlib.configs import DENSITIES

STA_MASK = "sliding tile, 3-D tiled order"


def _parallel(fn, items, workers: int | None = None):
    with ThreadPoolExecutor(max_workers=workers or max(1, min(4, os.cpu_count() or 1))) as pool:
        return list(pool.map(lambda item: fn(*item), items))


def calibration_table(chip: str = "v6e", use_cache: bool = True) -> list[dict]:
    """``chip``'s calibration point (v6e: dense Splash at the case-study shape; tpu7x: tokamax's GQA
    causal Splash) at several block sizes: static cycles, the clock each would imply for the
    published time (the calibration's uncertainty), and its estimate under the calibration."""
    cal = calibration(chip, use_cache)
    point = cal.point

    def one(bq, bkv):
        est = point.estimate(bq, bkv, clock=cal.clock_hz(chip), use_cache=use_cache)
        _, hz = solve_clock(point, bq, bkv, use_cache)
        return {
            "block_q": bq,
            "block_kv": bkv,
            "grid_steps": est.kernels[0].grid_steps,
            "cycles": est.cycles,
            "implied_clock_ghz": hz / 1e9,
            "estimate_ms": est.seconds * 1e3,
            "memory_floor_ms": est.memory_seconds * 1e3,
            "paths": est.path_bundles(),
        }

    candidates = registry.get(point.impl).estimator.tuned_candidates
    rows = [one(bq, bkv) for bq, bkv in candidates]  # one at a time: the calibration's compiles are cached
    for row in rows:
        row["calibrated_clock_ghz"] = cal.implied_clock_hz / 1e9
    return rows


def case_study_table(chip: str = "v6e", use_cache: bool = True) -> list[dict]:
    """Every stlib kernel (and Splash) at the case-study shape: bands at DENSITIES and the
    sliding-tile pattern (3-D tiled order, 384-token tiles)."""
    masks_ = [(f"band (density {d})", None) for d in DENSITIES] + [(STA_MASK, 384)]
    calibration(chip, use_cache)
    items = [
        (impl.name, label, opts, m, b)
        for impl in registry.tpu_kernels()
        for label, opts in impl.comparison_runs()
        for m, b in masks_
        if impl.supports(mask=resolve_mask(KernelConfig(impl.name, m)))
    ]  # a mask an implementation refuses has no row

    def one(impl, label, opts, mask, block):
        est = estimate(
            impl, mask, chip, block_q=block, block_kv=block, options=opts or None, use_cache=use_cache
        )
        return {
            "kernel": label,
            "mask": mask,
            "estimate_ms": est.seconds * 1e3,
            "compute_ms": est.compute_seconds * 1e3,
            "memory_floor_ms": est.memory_seconds * 1e3,
            "grid_steps": sum(k.grid_steps for k in est.kernels),
            "paths": est.path_bundles(),
        }

    return _parallel(one, items)
