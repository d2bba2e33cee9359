"""A static TPU time estimate from the compiled kernel schedule: the compiler as a stopwatch.

Usage::

    python -m stlib.estimate kernel splash full --chip v6e
    python -m stlib.estimate kernel pallas_tile "band (density 0.25)" --form flat
    python -m stlib.estimate calibrate
    python -m stlib.estimate table --chip v6e
    python -m stlib.estimate published       # predicted vs published, figures/estimate_published.png
"""

from __future__ import annotations

import argparse
import json

from stlib import registry
from stlib.analysis.clock import calibration, peak_clock_hz
from stlib.analysis.dump import libtpu_version
from stlib.analysis.kernel_estimate import ESTIMATE_CHIPS
from stlib.analysis.static import estimate, static_estimate
from stlib.analysis.tables import STA_MASK, calibration_table, case_study_table
from stlib.configs import CASE_STUDY, PUBLISHED


def _print_calibration(rows, chip: str = "v6e") -> None:
    cal = calibration(chip)
    print(f"STATIC ESTIMATE of the calibration point {cal.point.describe()} (libtpu {libtpu_version()})")
    print(
        f"{'block_q':>7} {'block_kv':>8} {'steps':>8} {'cycles':>13} {'implied GHz':>11} "
        f"{'est. ms':>8} {'DMA floor ms':>12}  bundles per step path"
    )
    for r in rows:
        print(
            f"{r['block_q']:>7} {r['block_kv']:>8} {r['grid_steps']:>8,} {r['cycles']:>13,} "
            f"{r['implied_clock_ghz']:>11.3f} {r['estimate_ms']:>8.2f} {r['memory_floor_ms']:>12.2f}  {r['paths']}"
        )
    print(f"calibration: {cal.describe(chip)}")
    for other in ESTIMATE_CHIPS:
        print(
            f"  {other}: calibrated {calibration(other).clock_hz(other) / 1e9:.3f} GHz; peak-implied "
            f"{peak_clock_hz(other) / 1e9:.3f} GHz"
        )


def _print_table(rows, chip: str) -> None:
    splash = estimate(registry.baseline().name, "full", chip)
    published = PUBLISHED["tile_aligned_sparse_ms"]
    print(
        f"STATIC ESTIMATES on {chip}, case-study shape (libtpu {splash.libtpu_version}); cells: estimate ms "
        f"[kernel DMA floor ms]\nclock: {splash.clock_assumption}"
    )
    masks_ = list(dict.fromkeys(r["mask"] for r in rows))
    kernels = list(dict.fromkeys(r["kernel"] for r in rows))
    by = {(r["kernel"], r["mask"]): r for r in rows}
    short = [
        m.replace("band (density ", "band ").replace(")", "").replace(STA_MASK, "sliding tile")
        for m in masks_
    ]
    print(f"{'kernel':<28}" + "".join(f"{name:>16}" for name in short))
    for k in kernels:
        print(
            f"{k:<28}"
            + "".join(
                f"{c['estimate_ms']:>8.2f} [{c['memory_floor_ms']:>4.1f}]" if c else f"{'n/a':>16}"
                for c in (by.get((k, m)) for m in masks_)
            )
        )
    if chip == "v6e":  # the published times are v6e times
        best = [min(by[(k, m)]["estimate_ms"] for k in kernels if k.startswith("pallas")) for m in masks_]
        print(f"{'best stlib - published':<28}" + "".join(f"{b - published:>+16.2f}" for b in best))
    print(
        f"dense Splash (full mask): {splash.seconds * 1e3:.2f} ms [{splash.memory_seconds * 1e3:.1f}]; "
        f"published on v6e: dense Splash {PUBLISHED['dense_splash_ms']} ms, tile-aligned sparse kernel "
        f"{published} ms (density not published)"
    )


def _published(use_cache: bool = True) -> None:
    from stlib import plotting
    from stlib.analysis.published import RECORDS, format_table, record_path, table
    from stlib.paths import figures_dir
    from stlib.provenance import provenance

    rows = table(use_cache)
    path = record_path(RECORDS)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**provenance(), "rows": rows}, indent=1) + "\n")
    print(format_table(rows, libtpu_version()))
    fig = plotting.estimate_vs_published(rows, "Static estimate vs published TPU kernel times")
    print(f"wrote {path} and {plotting.save(fig, figures_dir() / 'estimate_published.png')}")


def main(argv=None) -> None:
    """``python -m stlib.estimate kernel | calibrate | table | published``: print static estimates."""
    parser = argparse.ArgumentParser(prog="python -m stlib.estimate", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    one = sub.add_parser("kernel", help="estimate one kernel call")
    one.add_argument("impl")
    one.add_argument("mask", nargs="?", default="none")
    one.add_argument("--chip", default="v6e", choices=ESTIMATE_CHIPS)
    one.add_argument("--block-q", type=int)
    one.add_argument("--block-kv", type=int)
    tile = registry.by_role(registry.Role.TILE)
    one.add_argument("--form", choices=[f.value for f in tile.option_enum("form")])
    one.add_argument("--boundary", choices=[b.value for b in tile.option_enum("boundary")])
    one.add_argument("--heads", type=int, default=CASE_STUDY.num_heads)
    one.add_argument("--kv-heads", type=int, help="kv heads shared by the q heads (Splash only)")
    one.add_argument("--head-dim", type=int, default=CASE_STUDY.head_dim)
    one.add_argument("--head-dim-v", type=int, help="v / output head dim (Splash only)")
    one.add_argument("--tuned", action="store_true", help="the best blocks of a small sweep")
    one.add_argument("--length", type=int)
    one.add_argument("--clock", default="calibrated", help="'calibrated', 'peak' or Hz")
    one.add_argument("--json", action="store_true")
    calibrate = sub.add_parser(
        "calibrate", help="each chip's calibration point at several block sizes; the implied clock"
    )
    calibrate.add_argument("--chip", default="v6e", choices=("v6e", "tpu7x"))
    sub.add_parser(
        "published", help="every public measurement in data/published_measurements.json vs its estimate"
    )
    table = sub.add_parser("table", help="every stlib kernel at band densities 0.15-0.65 and sliding tile")
    table.add_argument("--chip", default="v6e", choices=ESTIMATE_CHIPS)
    table.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "kernel":
        opts = {k: v for k, v in (("form", args.form), ("boundary", args.boundary)) if v}
        clock = args.clock if args.clock in ("calibrated", "peak") else float(args.clock)
        blocks = "tuned" if args.tuned else {"block_q": args.block_q, "block_kv": args.block_kv}
        est = static_estimate(
            args.impl,
            args.mask,
            args.chip,
            num_heads=args.heads,
            num_kv_heads=args.kv_heads,
            head_dim=args.head_dim,
            head_dim_v=args.head_dim_v,
            length=args.length or CASE_STUDY.num_tokens,
            block_sizes=blocks,
            options=opts or None,
            clock=clock,
        )
        print(json.dumps(est.as_record(), indent=1) if args.json else est)
    elif args.command == "calibrate":
        _print_calibration(calibration_table(args.chip), args.chip)
    elif args.command == "published":
        _published()
    else:
        rows = case_study_table(args.chip)
        if args.json:
            print(json.dumps(rows, indent=1))
        else:
            _print_table(rows, args.chip)
