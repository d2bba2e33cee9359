"""Layout build time and peak memory for every built-in mask at the case-study grid.

Usage: python scripts/layout_benchmark.py [--block-q 128] [--block-kv 128]
Prints one line per mask; run it on a quiet machine. Each mask is built in a fresh subprocess so
that its peak resident memory (ru_maxrss) is its own.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time


def _measure(name: str, block_q: int, block_kv: int) -> dict:
    import stlib
    from stlib.layout_catalog import case_study_masks

    mask = case_study_masks()[name]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    layout = stlib.block_layout(mask, block_q, block_kv)
    _ = layout.kinds, layout.row_kv_tiles, layout.step_q
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"mask": name, "seconds": seconds, "peak_rss_mb": peak / 1024, "rss_growth_mb": (peak - before) / 1024,
            "density": layout.density, "occupancy": layout.occupancy, "partial_fraction": layout.partial_fraction,
            "row_table_bytes": layout.table_bytes("rows"), "flat_table_bytes": layout.table_bytes("flat")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--block-q", type=int, default=128)
    parser.add_argument("--block-kv", type=int, default=128)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(_measure(args.one, args.block_q, args.block_kv)))
        return
    from stlib.layout_catalog import case_study_masks

    print(f"case-study grid 21x45x80 (75,600 tokens), 10 heads, tiles {args.block_q}x{args.block_kv}")
    print(f"{'mask':<34}{'seconds':>9}{'peak MB':>9}{'+MB':>8}{'density':>9}{'occup.':>8}{'partial':>9}")
    for name in case_study_masks():
        out = subprocess.run([sys.executable, __file__, "--one", name, "--block-q", str(args.block_q),
                              "--block-kv", str(args.block_kv)], capture_output=True, text=True, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{name:<34}{r['seconds']:>9.3f}{r['peak_rss_mb']:>9.0f}{r['rss_growth_mb']:>8.0f}"
              f"{r['density']:>9.3f}{r['occupancy']:>8.3f}{r['partial_fraction']:>9.3f}", flush=True)


if __name__ == "__main__":
    main()
