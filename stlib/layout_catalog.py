"""The built-in masks at the case-study grid, named: one place for benchmarks, notebooks and tests.

``python -m stlib.layout_catalog NAME BLOCK_Q BLOCK_KV`` builds one layout and prints its build
time and peak memory as JSON (used by ``python -m stlib.bench layout``, one process per mask).
"""

from __future__ import annotations

from stlib import masks
from stlib.configs import CASE_STUDY
from stlib.geometry import VideoGrid, tiled_order, token_major_order

#: Sliding-tile geometry used at the case-study grid: 3x8x16 = 384-token tiles, 3x3x3 tile window.
STA_TILE = (3, 8, 16)
STA_WINDOW = (3, 3, 3)


def case_study_masks(grid: VideoGrid = CASE_STUDY.grid, num_heads: int = CASE_STUDY.num_heads) -> dict:
    """Every built-in pattern on ``grid`` (raster order unless the name says otherwise)."""
    length = grid.num_tokens
    spatial = masks.spatial_band(grid, 0.25, anchor=True)
    temporal = masks.temporal_band(grid, 0.25, anchor=True)
    sta = masks.sliding_tile(grid, STA_TILE, STA_WINDOW)
    return {
        "full": masks.full(length),
        "band (density 0.25)": masks.band(length, masks.band_width_for_density(length, 0.25)),
        "spatial (frame window 1)": masks.spatial(grid, 1),
        "temporal (spatial window 40)": masks.temporal(grid, 40),
        "spatial band 0.25 + anchor": spatial,
        "temporal band 0.25 + anchor": temporal,
        # without the anchor: frame 0 is every T-th token in token-major order, so an anchor there
        # touches every kv tile (the anchor belongs in raster order or in a pass of its own)
        "temporal band 0.25, token-major": masks.temporal_band(grid, 0.25).permute(token_major_order(grid)),
        "neighborhood 7x15x15": masks.neighborhood(grid, (7, 15, 15)),
        "sliding tile 3x8x16, window 3": sta,
        "sliding tile, 3-D tiled order": sta.permute(tiled_order(grid, STA_TILE)),
        "radial (window 1200)": masks.radial(grid, 1200),
        "frame causal": masks.frame_causal(grid),
        "per-head SVG (5 spatial, 5 temporal)": masks.per_head(
            [spatial] * (num_heads // 2) + [temporal] * (num_heads - num_heads // 2)
        ),
    }


def measure_layout(name: str, block_q: int, block_kv: int) -> dict:
    """Build the mask and its layout (with row and flat tables) once; time and peak memory."""
    import time

    from stlib.layout import block_layout

    imports_mb = _peak_rss_mb()
    start = time.perf_counter()
    mask = case_study_masks()[name]
    layout = block_layout(mask, block_q, block_kv)
    _ = layout.kinds, layout.row_kv_tiles, layout.step_q
    seconds = time.perf_counter() - start
    peak_mb = _peak_rss_mb()
    return {"mask": name, "repr": repr(mask), "seconds": seconds, "peak_rss_mb": peak_mb,
            "peak_after_imports_mb": imports_mb, "layout_peak_growth_mb": peak_mb - imports_mb,
            "density": layout.density,
            "occupancy": layout.occupancy, "partial_fraction": layout.partial_fraction,
            "work_efficiency": layout.work_efficiency, "row_table_bytes": layout.table_bytes("rows"),
            "flat_table_bytes": layout.table_bytes("flat")}


def _peak_rss_mb() -> float:
    """This process's resident-memory high-water mark (VmHWM; unlike ru_maxrss it is not inherited
    from the parent that started the process)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(measure_layout(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))))
