"""The per-head SVG mix in the static estimate: the best tile kernel (``pallas_tile_lane_dense``, its
default blocks) on the 10-head mix of ``backward_compile`` (5 spatial heads in raster order, 5
temporal heads in token-major order, density 0.25 each, with an anchor) against dense Splash at its
tuned blocks, per chip and video length, glue included.

The anchor (``ANCHORS``): "reordered", the default, is what SVG's plan runs (``stlib.routing``): a
temporal head keeps the first H*W keys of its token-major order, one run of kv tiles. "frame0" is the
catalogue's mix as it stands (``case_study_masks``): frame 0 in token-major order is every T-th
token, so that anchor puts keys in every kv tile of a temporal head, and the kernel computes every
tile of those heads (the catalogue warns of it). The ratio is clock-free (both
estimates share the chip's calibrated clock): the block sweep's table (``block_sweep``) for a fourth
mask. Static estimates, never measurements.

    python -m stlib.bench.svg_estimate run [--chips v6e tpu7x] [--videos "case study"]   # minutes a case
    python -m stlib.bench.svg_estimate table

Records: ``data/svg_estimates.jsonl``, one per (chip, video, impl); the table reads the latest of each.
"""

from __future__ import annotations

import argparse

import stlib.kernels  # noqa: F401 - registers the kernels the roles name
from stlib import paths
from stlib.bench.backward_compile import LONG_VIDEOS, SVG_MIX, raster_mask_and_orders
from stlib.registry import Role, by_role

TILE_KERNEL = by_role(Role.BEST_TILE).name

RECORDS = "data/svg_estimates.jsonl"
#: The videos of the table: the case study's 21 x 45 x 80 latent grid and Wan's 161-frame 720p one.
VIDEOS = {"case study": (21, 45, 80), "720p, 161 frames": LONG_VIDEOS["720p, 161 frames"]}
CHIPS = ("v6e", "tpu7x", "v5e")
#: The temporal heads' anchors (module docstring); the first is the default.
ANCHORS = ("reordered", "frame0")


def _baseline() -> str:
    from stlib import registry

    return registry.baseline().name


def kernel_mask(video: str, anchor: str = ANCHORS[0]):
    """The mask the tile kernel runs for the SVG mix on ``video``: each head's raster mask in that
    head's token order (as ``stlib.video_attention`` permutes it), the temporal heads with ``anchor``
    (``ANCHORS``; "frame0": the catalogue's mix, "reordered": each head's ``stlib.routing.exact_mask``)."""
    from stlib import routing
    from stlib.configs import CASE_STUDY
    from stlib.geometry import VideoGrid
    from stlib.masks import band_width_for_density, per_head

    if anchor not in ANCHORS:
        raise ValueError(f"anchor={anchor!r}: choose from {ANCHORS}")
    grid = VideoGrid(*VIDEOS[video])
    if anchor == "frame0":
        mask, orders = raster_mask_and_orders(SVG_MIX, grid)
        return per_head([mask.head(h).permute(order) for h, order in enumerate(orders)])
    half = CASE_STUDY.num_heads // 2  # as the catalogue's mix: spatial heads first, then temporal
    kinds = [routing.HeadKind.SPATIAL] * half + [routing.HeadKind.TEMPORAL] * (CASE_STUDY.num_heads - half)
    width = band_width_for_density(grid.num_tokens, 0.25)
    return per_head(
        [routing.exact_mask(grid, kind, width).permute(routing.order_of(grid, kind)) for kind in kinds]
    )


def cases(chips=None, videos=None, anchors=None) -> list[dict]:
    """Per chip and video: the tile kernel on the SVG mix (per anchor of ``anchors``, default the
    first of ``ANCHORS``), and dense Splash at its tuned blocks."""
    unknown = set(videos or ()) - set(VIDEOS)
    if unknown:
        raise ValueError(f"videos {sorted(unknown)}: choose from {sorted(VIDEOS)}")
    if set(anchors or ()) - set(ANCHORS):
        raise ValueError(f"anchors {anchors}: choose from {ANCHORS}")
    out = []
    for chip in chips or CHIPS:
        for video in videos or VIDEOS:
            for anchor in anchors or ANCHORS[:1]:
                out.append(
                    {"chip": chip, "video": video, "impl": TILE_KERNEL, "mask": SVG_MIX, "anchor": anchor}
                )
            out.append({"chip": chip, "video": video, "impl": _baseline(), "mask": "full", "blocks": "tuned"})
    return out


def estimate_case(case: dict) -> dict:
    """The record of one case (its total, kernel and glue ms, blocks and grid steps), or why it
    could not be estimated."""
    import math

    from stlib.analysis import static_estimate
    from stlib.configs import CASE_STUDY

    length = math.prod(VIDEOS[case["video"]])
    mask = kernel_mask(case["video"], case["anchor"]) if case["mask"] == SVG_MIX else case["mask"]
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


def run(chips=None, videos=None, anchors=None, path=None) -> list[dict]:
    """Estimate every case (``cases``), appending each record to ``path`` (default ``RECORDS``)."""
    from stlib.bench.records import record_each

    return record_each(
        cases(chips, videos, anchors), estimate_case, path or paths.home() / RECORDS, "SVG-mix estimates"
    )


def _anchor(record: dict) -> str:
    """A tile-kernel record's anchor ("frame0" for the records written before anchors were named);
    "" for dense Splash, which has none."""
    return record.get("anchor", ANCHORS[1]) if record["impl"] == TILE_KERNEL else ""


def read(path=None) -> dict[tuple, dict]:
    """The latest record of each (chip, video, impl, anchor) in ``path``."""
    from stlib.bench.records import latest_per_key

    return latest_per_key(
        path or paths.home() / RECORDS, lambda r: (r["chip"], r["video"], r["impl"], _anchor(r))
    )


def ratios(records: dict[tuple, dict]) -> list[dict]:
    """Per chip, video and anchor with both estimates: the tile kernel's ms, dense Splash's and their
    ratio."""
    rows = []
    for (chip, video, impl, anchor), tile in sorted(records.items()):
        splash = records.get((chip, video, _baseline(), ""))
        if impl != TILE_KERNEL or not (splash and tile["estimated"] and splash["estimated"]):
            continue
        rows.append(
            {
                "chip": chip,
                "video": video,
                "anchor": anchor,
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
    from stlib.bench.records import failure_reason

    lines = [
        (
            f"STATIC ESTIMATES (not measurements): {SVG_MIX}, 10 heads x head dim 128, bf16, glue "
            f"included; {TILE_KERNEL} at its default blocks over dense Splash at its tuned blocks"
        ),
        "",
        "| chip | video | anchor | tokens | tile kernel ms | dense Splash ms | ratio |",
        "|" + "---|" * 7,
    ]
    for row in ratios(records):
        lines.append(
            f"| {row['chip']} | {row['video']} | {row['anchor']} | {row['tokens']:,} | {row['tile_ms']:.2f} | "
            f"{row['splash_ms']:.2f} | {row['ratio']:.3f} |"
        )
    for r in records.values():
        if not r["estimated"]:
            reason = failure_reason(r["error"])
            lines.append(f"not estimated: {r['chip']} {r['video']} {r['impl']} {_anchor(r)}: {reason}")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m stlib.bench.svg_estimate", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run_parser = sub.add_parser("run", help="estimate every case (no TPU needed)")
    run_parser.add_argument("--chips", nargs="*")
    run_parser.add_argument("--videos", nargs="*", help=f"of {sorted(VIDEOS)}")
    run_parser.add_argument("--anchors", nargs="*", help=f"of {ANCHORS} (default: {ANCHORS[0]})")
    sub.add_parser("table", help="the records as the ratio table")
    args = parser.parse_args(argv)
    if args.command == "run":
        run(args.chips, args.videos, args.anchors)
    print(format_table(read()))


if __name__ == "__main__":
    main()
