"""Layout build time and peak memory of one named case-study mask, measured in its own process.

``python -m stlib.bench.layout_probe NAME BLOCK_Q BLOCK_KV`` builds one layout and prints its build
time and peak memory as JSON (``python -m stlib.bench layout`` runs it once per mask, so each peak
is that mask's own).
"""

from __future__ import annotations

from stlib.masks.catalogue import case_study_masks


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
    return {
        "mask": name,
        "repr": repr(mask),
        "seconds": seconds,
        "peak_rss_mb": peak_mb,
        "peak_after_imports_mb": imports_mb,
        "layout_peak_growth_mb": peak_mb - imports_mb,
        "density": layout.density,
        "occupancy": layout.occupancy,
        "partial_fraction": layout.partial_fraction,
        "work_efficiency": layout.work_efficiency,
        "row_table_bytes": layout.table_bytes("rows"),
        "flat_table_bytes": layout.table_bytes("flat"),
    }


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
