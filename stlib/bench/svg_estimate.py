"""The per-head SVG mix in the static estimate: the best tile kernel (``pallas_tile_lane_dense``, its
default blocks) on the 10-head mix of ``backward_compile`` (5 spatial heads in raster order, 5
temporal heads in token-major order, density 0.25 each, with the first-frame anchor) against dense
Splash at its tuned blocks, per chip and video length, glue included. The ratio is clock-free (both
estimates share the chip's calibrated clock): the block sweep's table (``block_sweep``) for a fourth
mask. Static estimates, never measurements.

    python -m stlib.bench.svg_estimate run [--chips v6e tpu7x] [--videos "case study"]   # minutes a case
    python -m stlib.bench.svg_estimate table

Records: ``data/svg_estimates.jsonl``, one per (chip, video, impl); the table reads the latest of each.
"""

from __future__ import annotations

import argparse

from stlib import paths
from stlib.bench.backward_compile import LONG_VIDEOS, SVG_MIX, _raster_mask_and_orders
from stlib.kernels.tile_lane_dense import NAME as TILE_KERNEL

RECORDS = "data/svg_estimates.jsonl"
#: The videos of the table: the case study's 21 x 45 x 80 latent grid and Wan's 161-frame 720p one.
VIDEOS = {"case study": (21, 45, 80), "720p, 161 frames": LONG_VIDEOS["720p, 161 frames"]}
CHIPS = ("v6e", "tpu7x", "v5e")


def _baseline() -> str:
    from stlib import registry

    return registry.baseline().name


def kernel_mask(video: str):
    """The mask the tile kernel runs for the SVG mix on ``video``: each head's raster mask in that
    head's token order (as ``stlib.video_attention`` permutes it)."""
    from stlib.geometry import VideoGrid
    from stlib.masks import per_head

    mask, orders = _raster_mask_and_orders(SVG_MIX, VideoGrid(*VIDEOS[video]))
    return per_head([mask.head(h).permute(order) for h, order in enumerate(orders)])


def cases(chips=None, videos=None) -> list[dict]:
    """Per chip and video: the tile kernel on the SVG mix, and dense Splash at its tuned blocks."""
    unknown = set(videos or ()) - set(VIDEOS)
    if unknown:
        raise ValueError(f"videos {sorted(unknown)}: choose from {sorted(VIDEOS)}")
    out = []
    for chip in chips or CHIPS:
        for video in videos or VIDEOS:
            out.append({"chip": chip, "video": video, "impl": TILE_KERNEL, "mask": SVG_MIX})
            out.append({"chip": chip, "video": video, "impl": _baseline(), "mask": "full", "blocks": "tuned"})
    return out


def estimate_case(case: dict) -> dict:
    """The record of one case (its total, kernel and glue ms, blocks and grid steps), or why it
    could not be estimated."""
    import math

    from stlib.analysis import static_estimate
    from stlib.configs import CASE_STUDY

    length = math.prod(VIDEOS[case["video"]])
    mask = kernel_mask(case["video"]) if case["mask"] == SVG_MIX else case["mask"]
    base = {**case, "tokens": length}
    try:
        est = static_estimate(
            case["impl"],
            mask,
            case["chip"],
            num_heads=CASE_STUDY.num_heads,
            head_dim=CASE_STUDY.head_dim,
            length=length,
            block_sizes=case.get("blocks"),
        )
    except (RuntimeError, ValueError, NotImplementedError) as error:
        return {**base, "estimated": False, "error": f"{type(error).__name__}: {str(error)[-300:]}"}
    return {
        **base,
        "estimated": True,
        "total_ms": est.total_seconds * 1e3,
        "kernels_ms": est.seconds * 1e3,
        "glue_ms": est.glue_seconds * 1e3,
        "blocks": est.blocks,
        "grid_steps": sum(k.grid_steps for k in est.kernels),
        "clock": est.clock_assumption,
        "static_estimate": True,
    }


def run(chips=None, videos=None, path=None) -> list[dict]:
    """Estimate every case (``cases``), appending each record to ``path`` (default ``RECORDS``)."""
    from stlib.bench.records import record_each

    return record_each(
        cases(chips, videos), estimate_case, path or paths.home() / RECORDS, "SVG-mix estimates"
    )


def read(path=None) -> dict[tuple, dict]:
    """The latest record of each (chip, video, impl) in ``path``."""
    from stlib.bench.records import latest_per_key

    return latest_per_key(path or paths.home() / RECORDS, lambda r: (r["chip"], r["video"], r["impl"]))


def ratios(records: dict[tuple, dict]) -> list[dict]:
    """Per chip and video with both estimates: the tile kernel's ms, dense Splash's and their ratio."""
    rows = []
    for (chip, video, impl), tile in sorted(records.items()):
        splash = records.get((chip, video, _baseline()))
        if impl != TILE_KERNEL or not (splash and tile["estimated"] and splash["estimated"]):
            continue
        rows.append(
            {
                "chip": chip,
                "video": video,
                "tokens": tile["tokens"],
                "tile_ms": tile["total_ms"],
                "splash_ms": splash["total_ms"],
                "ratio": tile["total_ms"] / splash["total_ms"],
                "tile_blocks": tile["blocks"],
                "splash_blocks": splash["blocks"],
            }
        )
    return rows


def format_table(records: dict[tuple, dict]) -> str:
    """The ratios as a Markdown table, then every case that was not estimated and why."""
    lines = [
        (
            f"STATIC ESTIMATES (not measurements): {SVG_MIX}, 10 heads x head dim 128, bf16, glue "
            f"included; {TILE_KERNEL} at its default blocks over dense Splash at its tuned blocks"
        ),
        "",
        "| chip | video | tokens | tile kernel ms | dense Splash ms | ratio |",
        "|" + "---|" * 6,
    ]
    for row in ratios(records):
        lines.append(
            f"| {row['chip']} | {row['video']} | {row['tokens']:,} | {row['tile_ms']:.2f} | "
            f"{row['splash_ms']:.2f} | {row['ratio']:.3f} |"
        )
    for r in records.values():
        if not r["estimated"]:
            lines.append(f"not estimated: {r['chip']} {r['video']} {r['impl']}: {r['error']}")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m stlib.bench.svg_estimate", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run_parser = sub.add_parser("run", help="estimate every case (no TPU needed)")
    run_parser.add_argument("--chips", nargs="*")
    run_parser.add_argument("--videos", nargs="*", help=f"of {sorted(VIDEOS)}")
    sub.add_parser("table", help="the records as the ratio table")
    args = parser.parse_args(argv)
    if args.command == "run":
        run(args.chips, args.videos)
    print(format_table(read()))


if __name__ == "__main__":
    main()
