"""``python -m stlib.bench.same_mask``: the tile kernel and Splash on the same masks, timed side by
side on the TPU at hand, each beside the floor its mask allows.

The comparison a user makes before switching kernels: on each mask of ``MASKS`` (the case-study
catalogue's, ``stlib.masks.case_study_masks``, and the per-head SVG mix routed, ``ROUTED``) at each head count of ``HEADS`` (the case study's 10
and Wan 14B's 40, 75,600 tokens x 128, bfloat16), the best tile kernel (``Role.BEST_TILE``) at its
own default blocks and Splash (``impl="splash"``: its lazy mask where it has one, else from stlib's
block layout) at each of ``SPLASH_BLOCKS``, forward and training step (``jax.grad``, Splash's split
backward: its fused one needs more HBM than a v5e has at this size). Splash's row is its fastest
blocks, found on the chip, never estimated.

The floor is the chip's nominal bf16 peak on the pairs the mask allows: forward 4 x pairs x D flops
(q k^T and p v), a training step ``TRAIN_FLOPS`` times that; the share of peak is floor / measured.

    python -m stlib.bench.same_mask run [--heads 10 40] [--mask NAME ...] [--impl NAME ...] [--forward-only] [--trials 5]
    python -m stlib.bench.same_mask table        # anywhere: the latest records, Splash at its best blocks

Records: ``data/tpu_same_mask.jsonl``, one per (chip, heads, mask, impl, blocks, direction), with the
blocks the call resolved, the allowed pairs, the floor, the device kind, versions and revision; a call
that fails to compile or run (Splash past VMEM at large blocks) is recorded with its error and the run
goes on.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from stlib import paths

RECORDS = "tpu_same_mask.jsonl"
#: Catalogue masks compared (``case_study_masks`` names; "per-head SVG" names the per-head mix at any
#: head count: half spatial, half temporal heads).
MASKS = (
    "band (density 0.25)",
    "sliding tile, 3-D tiled order",
    "frame causal",
    "per-head SVG",
    "per-head SVG, routed",
)
#: The per-head mix as Sparse VideoGen runs it: each head in its own token order, its band contiguous
#: there (``stlib.routing.svg_plan`` at ``ROUTED_DENSITY``, the tile kernel's blocks on the chip). The
#: tile kernel runs the plan (``SvgPlan.run``); Splash, which has no reordering, its mask in raster
#: order, as a user of Splash would.
ROUTED = "per-head SVG, routed"
ROUTED_DENSITY = 0.25
#: Heads per call: the case study's 10 and Wan 14B's attention (40 heads of 128).
HEADS = (10, 40)
#: Splash's blocks (block_q, block_kv) tried on each mask: its default, the blocks dense Splash was
#: tuned to on the v5e, one 3-D tile of the case study (384 = 3 x 8 x 16 tokens) and a block of two.
SPLASH_BLOCKS = ((512, 1024), (1024, 2048), (384, 384), (768, 768))
#: A training step's flops over its forward's: the forward (2 matmuls) again in the backward, and
#: dq, dk, dv, dp (4 more: 2 of them the forward's size each), as the case-study issue counts it.
TRAIN_FLOPS = 3.5
DIRECTIONS = ("forward", "train")


@dataclass(frozen=True)
class Case:
    """One call: ``impl`` on catalogue mask ``mask`` with ``heads`` heads at ``blocks`` (None: the
    implementation's own default) and ``options``."""

    heads: int
    mask: str
    impl: str
    blocks: tuple[int, int] | None = None
    options: tuple[tuple[str, object], ...] = ()

    @property
    def label(self) -> str:
        blocks = f" {self.blocks[0]} x {self.blocks[1]}" if self.blocks else ""
        return f"{self.impl}{blocks}, {self.mask}, {self.heads} heads"


def catalogue_mask(name: str, heads: int, workload=None):
    """The catalogue mask ``name`` for ``heads`` heads on ``workload``'s grid (default: the case
    study): ``case_study_masks`` at that head count, "per-head SVG" matching its per-head mix.
    Raises KeyError for a name the catalogue lacks."""
    from stlib.bench.cases import workload_sta_window
    from stlib.configs import CASE_STUDY
    from stlib.masks import case_study_masks

    workload = workload or CASE_STUDY
    catalogue = case_study_masks(
        workload.grid, heads, sta_tile=workload.sta_tile, sta_window=workload_sta_window(workload)
    )
    if name == ROUTED:
        return routed_plan(heads, workload).mask
    if name == "per-head SVG":
        name = next((n for n in catalogue if n.startswith("per-head SVG")), name)
    if name not in catalogue:
        raise KeyError(f"unknown mask {name!r}: one of {sorted(catalogue)} or 'per-head SVG'")
    return catalogue[name]


def routed_plan(heads: int, workload=None, interpret: bool = False):
    """The per-head SVG plan (half spatial, half temporal heads) on ``workload``'s grid (default: the
    case study) at ``ROUTED_DENSITY``, cut at the best tile kernel's blocks for the chip at hand."""
    from stlib import registry
    from stlib.configs import CASE_STUDY
    from stlib.registry import Role, by_role
    from stlib.routing import svg_plan

    workload = workload or CASE_STUDY
    kinds = ["spatial"] * (heads - heads // 2) + ["temporal"] * (heads // 2)
    tile = registry.get(by_role(Role.BEST_TILE).name)
    config = tile.config(None, workload.grid.num_tokens, interpret=interpret)
    return svg_plan(workload.grid, kinds, ROUTED_DENSITY, block_q=config.block_q, block_kv=config.block_kv)


def allowed_pairs(mask, heads: int) -> int:
    """Allowed (query, key) pairs of ``mask`` over ``heads`` heads, from its block layout (a
    head-uniform mask counts once per head), never an L x L array."""
    from stlib import block_layout

    layout = block_layout(mask, 512, 1024)
    return layout.allowed_pairs * (heads if layout.num_heads == 1 else 1)


def floor_ms(pairs: int, head_dim: int, peak_flops: float, direction: str) -> float:
    """Milliseconds the allowed pairs take at ``peak_flops``: 4 x pairs x head_dim flops forward
    (q k^T and p v), ``TRAIN_FLOPS`` times that for a training step.

    >>> round(floor_ms(10 * 75_600**2, 128, 197e12, "forward"), 1)
    148.5
    """
    flops = 4.0 * pairs * head_dim * (TRAIN_FLOPS if direction == "train" else 1.0)
    return flops / peak_flops * 1e3


def cases(heads=HEADS, mask_names=MASKS, impls=None) -> list[Case]:
    """Per head count and mask: the best tile kernel at its default blocks, then Splash at each of
    ``SPLASH_BLOCKS`` (split backward); only the implementations named in ``impls`` (None: both)."""
    from stlib import registry
    from stlib.registry import Role, by_role

    tile, splash = by_role(Role.BEST_TILE).name, registry.baseline().name
    split = (("fused_backward", False),)
    out = []
    for h in heads:
        for name in mask_names:
            out.append(Case(h, name, tile))
            out += [Case(h, name, splash, blocks, split) for blocks in SPLASH_BLOCKS]
    return [c for c in out if impls is None or c.impl in impls]


def measure_case(case: Case, trials: int, directions=DIRECTIONS, *, workload=None, interpret: bool = False):
    """The records of ``case`` (one per direction): median, min and max of ``trials`` calls after a
    warm-up, compile time apart, the blocks the call resolved, allowed pairs and the floor on the chip
    at hand (None off a TPU). A call that raises gives a record with its ``error`` instead."""
    import stlib
    from stlib import registry
    from stlib.bench.records import time_function
    from stlib.bench.tpu_measure import training_step
    from stlib.configs import CASE_STUDY
    from stlib.device import chip_spec, current_chip

    workload = workload or CASE_STUDY
    plan = routed_plan(case.heads, workload, interpret) if case.mask == ROUTED else None
    mask = catalogue_mask(case.mask, case.heads, workload) if plan is None else plan.mask
    length, head_dim = mask.length, workload.head_dim  # a padded 3-D tiled order: the mask's length
    blocks = dict(zip(("block_q", "block_kv"), case.blocks or (None, None)))
    options = dict(case.options) or None
    chip = current_chip()
    pairs = allowed_pairs(mask, case.heads)
    head = {"heads": case.heads, "mask": case.mask, "impl": case.impl, "options": dict(case.options)}
    try:
        resolved = registry.get(case.impl).config(
            mask, length, **blocks, options=options, interpret=interpret
        )
    except (ValueError, TypeError) as error:
        return [
            {**head, "direction": d, "requested_blocks": case.blocks, "error": str(error)} for d in directions
        ]
    if plan is not None and registry.get(case.impl).plan_runner is not None:
        resolved = plan  # the tile kernel runs the plan's own blocks
    q, k, v = stlib.random_qkv((case.heads, length, head_dim), workload.dtype, seed=0)

    def call(q, k, v):
        if plan is not None:  # the tile kernel runs the plan's own layout; Splash its raster-order mask
            return plan.run(q, k, v, impl=case.impl, **blocks, options=options, interpret=interpret)
        return stlib.attention(q, k, v, mask, impl=case.impl, **blocks, options=options, interpret=interpret)

    out = []
    for direction in directions:
        record = {
            **head,
            "direction": direction,
            "chip": chip,
            "requested_blocks": case.blocks,
            "blocks": {"block_q": resolved.block_q, "block_kv": resolved.block_kv},
            "length": length,
            "pairs": pairs,
            "interpret": interpret,
        }
        if chip is not None:
            record["floor_ms"] = floor_ms(pairs, head_dim, chip_spec(chip).bf16_flops, direction)
        try:
            timing = time_function(
                call if direction == "forward" else training_step(call), q, k, v, trials=trials
            )
        except Exception as error:  # noqa: BLE001 - a compile or run failure is a result to record
            out.append({**record, "error": f"{type(error).__name__}: {str(error)[:500]}"})
            continue
        out.append({**record, **dataclasses.asdict(timing)})
    return out


def run(
    heads=HEADS,
    mask_names=MASKS,
    trials: int = 5,
    directions=DIRECTIONS,
    out_dir: Path | None = None,
    impls=None,
) -> Path:
    """Time every case of ``cases`` on this TPU, appending each record as it is made, a line per case.
    Raises RuntimeError off a TPU (interpret-mode times would say nothing here)."""
    from stlib.bench.progress import Progress
    from stlib.bench.records import Recorder
    from stlib.bench.tpu_measure import tpu_chip

    chip = tpu_chip()
    recorder = Recorder(Path(out_dir or paths.data_dir()) / RECORDS)
    todo = cases(heads, mask_names, impls)
    with Progress(len(todo), f"same masks on {chip}") as tracker:
        for case in todo:
            records = [recorder.write(r) for r in measure_case(case, trials, directions)]
            tracker.step(
                f"{case.label}: "
                + ", ".join(
                    f"{r['direction']} " + (f"{r['median_ms']:.2f} ms" if "median_ms" in r else "failed")
                    for r in records
                )
            )
    return recorder.path


def read(path: Path | None = None) -> list[dict]:
    """The latest record of each (chip, heads, mask, impl, requested blocks, direction)."""
    from stlib.bench.records import latest_per_key

    def key(r):
        return (
            r.get("chip"),
            r["heads"],
            r["mask"],
            r["impl"],
            json.dumps(r.get("requested_blocks")),
            r["direction"],
        )

    return list(latest_per_key(Path(path or paths.data_dir() / RECORDS), key).values())


def best_rows(records: list[dict]) -> list[dict]:
    """Per (chip, heads, mask, direction): the tile kernel's time and Splash's at its fastest blocks,
    their ratio, the floor and each one's share of it (records that failed are skipped).

    >>> recs = [{"chip": "v5e", "heads": 10, "mask": "m", "impl": "pallas_tile_lane_dense", "direction": "forward",
    ...          "median_ms": 30.0, "floor_ms": 20.0, "blocks": {"block_q": 1920, "block_kv": 1920}},
    ...         {"chip": "v5e", "heads": 10, "mask": "m", "impl": "splash", "direction": "forward",
    ...          "median_ms": 70.0, "floor_ms": 20.0, "blocks": {"block_q": 512, "block_kv": 1024}},
    ...         {"chip": "v5e", "heads": 10, "mask": "m", "impl": "splash", "direction": "forward",
    ...          "median_ms": 60.0, "floor_ms": 20.0, "blocks": {"block_q": 384, "block_kv": 384}}]
    >>> row, = best_rows(recs)
    >>> row["tile_ms"], row["splash_ms"], row["splash_blocks"], round(row["tile / splash"], 2), row["tile share"]
    (30.0, 60.0, (384, 384), 0.5, 0.6666666666666666)
    """
    from stlib import registry

    splash = registry.baseline().name
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        if "median_ms" in r:
            groups.setdefault((r.get("chip"), r["heads"], r["mask"], r["direction"]), []).append(r)
    rows = []
    for (chip, heads, mask, direction), group in sorted(
        groups.items(), key=lambda kv: tuple(map(str, kv[0]))
    ):
        tiles = [r for r in group if r["impl"] != splash]
        splashes = [r for r in group if r["impl"] == splash]
        tile = min(tiles, key=lambda r: r["median_ms"]) if tiles else None
        best = min(splashes, key=lambda r: r["median_ms"]) if splashes else None
        floor = group[0].get("floor_ms")
        row = {"chip": chip, "heads": heads, "mask": mask, "direction": direction, "floor_ms": floor}
        row["tile_ms"] = tile["median_ms"] if tile else None
        row["splash_ms"] = best["median_ms"] if best else None
        row["splash_blocks"] = (best["blocks"]["block_q"], best["blocks"]["block_kv"]) if best else None
        row["tile / splash"] = row["tile_ms"] / row["splash_ms"] if tile and best else None
        row["tile share"] = floor / row["tile_ms"] if floor and tile else None
        row["splash share"] = floor / row["splash_ms"] if floor and best else None
        rows.append(row)
    return rows


def format_table(rows: list[dict]) -> str:
    """``best_rows`` as a Markdown table."""

    def ms(value):
        return "-" if value is None else f"{value:.2f}"

    def share(value):
        return "-" if value is None else f"{value:.0%}"

    lines = [
        (
            "MEASURED on a TPU (median of the trials): the best tile kernel at its default blocks and Splash "
            "at its fastest blocks of those tried, on the same mask; floor = the chip's nominal bf16 peak on "
            "the allowed pairs; share = floor / measured"
        ),
        "",
        "| chip | heads | mask | direction | tile kernel ms | Splash ms (blocks) | tile / Splash | floor ms | share: tile, Splash |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        blocks = f" ({r['splash_blocks'][0]} x {r['splash_blocks'][1]})" if r["splash_blocks"] else ""
        ratio = "-" if r["tile / splash"] is None else f"{r['tile / splash']:.2f}"
        lines.append(
            f"| {r['chip']} | {r['heads']} | {r['mask']} | {r['direction']} | {ms(r['tile_ms'])} | "
            f"{ms(r['splash_ms'])}{blocks} | {ratio} | {ms(r['floor_ms'])} | "
            f"{share(r['tile share'])}, {share(r['splash share'])} |"
        )
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m stlib.bench.same_mask", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run_parser = sub.add_parser("run", help="time every case on this TPU")
    run_parser.add_argument("--heads", type=int, nargs="+", default=list(HEADS))
    run_parser.add_argument("--mask", nargs="+", default=list(MASKS), metavar="NAME")
    run_parser.add_argument(
        "--impl", nargs="+", default=None, metavar="NAME", help="only these (default: both)"
    )
    run_parser.add_argument("--forward-only", action="store_true", help="no training steps")
    run_parser.add_argument("--trials", type=int, default=5)
    run_parser.add_argument("--out", type=Path, default=None, help="folder of the records (default: data/)")
    sub.add_parser("table", help="the latest records, Splash at its fastest blocks")
    args = parser.parse_args(argv)
    path = None
    if args.command == "run":
        directions = ("forward",) if args.forward_only else DIRECTIONS
        path = run(args.heads, args.mask, args.trials, directions, args.out, args.impl)
    print(format_table(best_rows(read(path))))


if __name__ == "__main__":
    main()
