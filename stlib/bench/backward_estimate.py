"""The backward in the static estimate: forward and backward of the best tile kernel
(``pallas_tile_lane_dense``) against dense Splash at its tuned blocks, at the case-study shape (10
heads x 75,600 tokens x 128, bf16), glue included, per chip. Static estimates with the forward's
calibrated clock (nothing fitted to backward timings), never measurements.

    python -m stlib.bench.backward_estimate run [--chips v6e tpu7x] [--impls pallas_tile_lane_dense]
    python -m stlib.bench.backward_estimate table   # ~1-4 min a case above, cached; this one reads

Records: ``data/backward_estimates.jsonl``, one per (chip, impl, mask, direction, options); Splash's
backward is the better of its fused and split kernels, each at the best of its tuned candidates.
"""

from __future__ import annotations

import argparse
import json

import stlib.kernels  # noqa: F401 - registers the kernels the roles name
from stlib import paths
from stlib.registry import Role, by_role

TILE_KERNEL = by_role(Role.BEST_TILE).name

RECORDS = "data/backward_estimates.jsonl"
#: The tile kernel's masks (case-study catalogue names); Splash runs dense.
MASKS = ("band (density 0.25)", "sliding tile, 3-D tiled order", "full")
CHIPS = ("v6e", "tpu7x", "v5e")
#: The targets (static, clock-free; v6e and TPU7x) per tile-kernel mask: its backward over dense
#: Splash's (dense only), its backward over its forward and its forward over dense Splash's forward
#: (sliding tile), and its forward + backward over dense Splash's, each at its tuned blocks.
TARGETS = {
    "full": {"backward / Splash backward": 0.92},
    "band (density 0.25)": {"train / dense Splash train": 0.22},
    "sliding tile, 3-D tiled order": {
        "backward / forward": 2.7,
        "train / dense Splash train": 0.13,
        "forward / Splash forward": 0.105,
    },
}
#: A chip's own target where it differs from ``TARGETS``: (chip, mask, quantity) -> target.
CHIP_TARGETS = {("tpu7x", "sliding tile, 3-D tiled order", "forward / Splash forward"): 0.10}


def _baseline() -> str:
    """The dense kernel the table compares with (the registry's baseline: Splash)."""
    from stlib import registry

    return registry.baseline().name


def cases(chips=None, impls=None) -> list[dict]:
    """The estimates of the table: per chip, the tile kernel forward and backward on every mask
    of ``MASKS`` at its default blocks, and dense Splash forward (tuned) and backward (tuned, fused
    and split); only those of ``impls`` where given (a kernel changed, the others' records stand)."""
    baseline, out = _baseline(), []
    for chip in chips or CHIPS:
        for mask in MASKS:
            for backward in (False, True):
                out.append({"chip": chip, "impl": TILE_KERNEL, "mask": mask, "backward": backward})
        out.append({"chip": chip, "impl": baseline, "mask": "none", "backward": False, "blocks": "tuned"})
        for fused in (True, False):
            out.append(
                {
                    "chip": chip,
                    "impl": baseline,
                    "mask": "none",
                    "backward": True,
                    "blocks": "tuned",
                    "options": {"fused_backward": fused},
                }
            )
    if impls is not None:
        unknown = set(impls) - {TILE_KERNEL, baseline}
        if unknown:
            raise ValueError(f"impls {sorted(unknown)}: the table has {TILE_KERNEL} and {baseline} only")
        out = [case for case in out if case["impl"] in impls]
    return out


def estimate_case(case: dict) -> dict:
    """The record of one case: total, kernel and glue ms, blocks, and per kernel its compute,
    exposed DMA and DMA floor (ms) and grid steps; a case that does not compile records why."""
    from stlib.analysis import static_estimate
    from stlib.configs import CASE_STUDY

    try:
        est = static_estimate(
            case["impl"],
            case["mask"],
            case["chip"],
            num_heads=CASE_STUDY.num_heads,
            head_dim=CASE_STUDY.head_dim,
            length=CASE_STUDY.num_tokens,
            block_sizes=case.get("blocks"),
            options=case.get("options"),
            backward=case["backward"],
        )
    except (RuntimeError, ValueError, NotImplementedError) as error:
        return {**case, "estimated": False, "error": f"{type(error).__name__}: {str(error)[-300:]}"}
    return {
        **case,
        "estimated": True,
        "total_ms": est.total_seconds * 1e3,
        "kernels_ms": est.seconds * 1e3,
        "glue_ms": est.glue_seconds * 1e3,
        "bundles_only_ms": est.bundles_only_seconds * 1e3,
        "blocks": est.blocks,
        "sweep": [list(s) for s in getattr(est, "sweep", ())],
        "kernels": [
            {
                "kernel": k.kernel,
                "grid_steps": k.grid_steps,
                "compute_ms": k.compute_seconds * 1e3,
                "exposed_dma_ms": k.exposed_dma_seconds * 1e3,
                "dma_floor_ms": k.memory_seconds * 1e3,
                "bundles": {p: v["bundles"] for p, v in k.breakdown.items()},
                "mxu_fed": {p: v["mxu"] for p, v in k.breakdown.items() if v["mxu"]},
                "counts": {p: v["count"] for p, v in k.breakdown.items()},
            }
            for k in est.kernels
        ],
        "clock": est.clock_assumption,
        "static_estimate": True,
    }


def run(chips=None, path=None, impls=None) -> list[dict]:
    """Estimate every case (``cases``), appending each record to ``path`` (default ``RECORDS``)."""
    from stlib.bench.records import record_each

    return record_each(
        cases(chips, impls), estimate_case, path or paths.home() / RECORDS, "backward estimates"
    )


def _key(record: dict) -> tuple:
    return (
        record["chip"],
        record["impl"],
        record["mask"],
        record["backward"],
        json.dumps(record.get("options") or {}, sort_keys=True),
    )


def read(path=None) -> dict[tuple, dict]:
    """The latest record of each case in ``path``, by (chip, impl, mask, backward, options)."""
    from stlib.bench.records import latest_per_key

    return latest_per_key(path or paths.home() / RECORDS, _key)


def splash_records(
    records: dict[tuple, dict], chip: str, field: str = "total_ms"
) -> tuple[dict | None, dict | None]:
    """Dense Splash's forward record on ``chip`` and its better (fused or split) backward record by
    ``field``, each None where not estimated.

    >>> fused = {"estimated": True, "total_ms": 140.0, "bundles_only_ms": 120.0}
    >>> split = {"estimated": True, "total_ms": 150.0, "bundles_only_ms": 110.0}
    >>> records = {("v6e", _baseline(), "none", True, json.dumps({"fused_backward": f})): r
    ...            for f, r in ((True, fused), (False, split))}
    >>> splash_records(records, "v6e")[1] is fused, splash_records(records, "v6e", "bundles_only_ms")[1] is split
    (True, True)
    """
    baseline = _baseline()
    forward = records.get((chip, baseline, "none", False, "{}"))
    backward = [
        records.get((chip, baseline, "none", True, json.dumps({"fused_backward": f}))) for f in (True, False)
    ]
    backward = [r for r in backward if r and r["estimated"] and field in r]
    best = min(backward, key=lambda r: r[field]) if backward else None
    return (forward if forward and forward["estimated"] else None), best


def ratios(fwd: dict, bwd: dict, splash_fwd: dict | None, splash_bwd: dict | None, field: str) -> dict:
    """The tile kernel's ratios from its forward and backward records and dense Splash's, each
    record read at ``field`` ("total_ms", or "bundles_only_ms": every path charged its bundles, no
    exposed DMA).

    >>> r = ratios({"total_ms": 10.0}, {"total_ms": 25.0}, {"total_ms": 50.0}, {"total_ms": 125.0}, "total_ms")
    >>> r["backward / forward"], r["forward / Splash forward"], r["train / dense Splash train"]
    (2.5, 0.2, 0.2)
    """
    f, b = fwd[field], bwd[field]
    sf = splash_fwd[field] if splash_fwd else None
    sb = splash_bwd[field] if splash_bwd else None
    return {
        "backward / forward": b / f,
        "forward / Splash forward": f / sf if sf else None,
        "backward / Splash backward": b / sb if sb else None,
        "train / dense Splash train": (f + b) / (sf + sb) if sf and sb else None,
        "splash backward / forward": sb / sf if sf and sb else None,
    }


def tile_records(records: dict[tuple, dict], chip: str, mask: str) -> tuple[dict, dict] | None:
    """The tile kernel's forward and backward records on ``chip`` and ``mask`` (a ``read`` dict);
    None unless both were estimated.

    >>> tile_records({}, "v6e", "full") is None
    True
    """
    fwd = records.get((chip, TILE_KERNEL, mask, False, "{}"))
    bwd = records.get((chip, TILE_KERNEL, mask, True, "{}"))
    return (fwd, bwd) if fwd and bwd and fwd["estimated"] and bwd["estimated"] else None


def targets(records: dict[tuple, dict]) -> list[dict]:
    """Per chip and tile-kernel mask: forward, backward and their ratio, and forward + backward over
    dense Splash's (its forward tuned, its backward the better of fused and split, each tuned)."""
    rows = []
    for chip in sorted({k[0] for k in records}):
        splash_fwd, best_bwd = splash_records(records, chip)
        for mask in MASKS:
            tile = tile_records(records, chip, mask)
            if tile is None:
                continue
            fwd, bwd = tile
            rows.append(
                {
                    "chip": chip,
                    "mask": mask,
                    "forward_ms": fwd["total_ms"],
                    "backward_ms": bwd["total_ms"],
                    "splash_forward_ms": splash_fwd["total_ms"] if splash_fwd else None,
                    "splash_backward_ms": best_bwd["total_ms"] if best_bwd else None,
                    "splash_backward_kind": (
                        ("fused" if best_bwd["options"]["fused_backward"] else "split") if best_bwd else None
                    ),
                    **ratios(fwd, bwd, splash_fwd, best_bwd, "total_ms"),
                }
            )
    return rows


def target(chip: str, mask: str, quantity: str) -> float | None:
    """The issue's target for ``quantity`` of the tile kernel on ``mask`` (``TARGETS``, a chip's own
    where ``CHIP_TARGETS`` has one); None where it sets none.

    >>> target("tpu7x", "sliding tile, 3-D tiled order", "forward / Splash forward")
    0.1
    >>> target("v6e", "full", "train / dense Splash train") is None
    True
    """
    return CHIP_TARGETS.get((chip, mask, quantity), TARGETS.get(mask, {}).get(quantity))


def format_table(records: dict[tuple, dict]) -> str:
    """The targets as a Markdown table (static estimates, ms), then every case that failed."""
    from stlib.bench.records import failure_reason

    goals = "; ".join(
        f"{mask.split(' (')[0].split(',')[0]}: " + ", ".join(f"{k} <= {v}" for k, v in goal.items())
        for mask, goal in TARGETS.items()
    ) + "".join(f" ({chip}: {quantity} <= {v})" for (chip, _, quantity), v in CHIP_TARGETS.items())
    lines = [
        f"STATIC ESTIMATES (not measurements), 10 x 75,600 x 128 bf16, glue included; targets: {goals}",
        "",
        (
            "| chip | tile-kernel mask | forward ms | backward ms | backward / forward | dense Splash forward + "
            "backward ms | Splash backward / forward | backward / Splash backward | train / dense Splash train |"
        ),
        "|" + "---|" * 9,
    ]
    for row in targets(records):

        def cell(value, fmt="{:.2f}"):
            return "-" if value is None else fmt.format(value)

        lines.append(
            f"| {row['chip']} | {row['mask']} | {row['forward_ms']:.2f} | {row['backward_ms']:.2f} | "
            f"{row['backward / forward']:.2f} | {cell(row['splash_forward_ms'])} + "
            f"{cell(row['splash_backward_ms'])} ({row['splash_backward_kind']}) | "
            f"{cell(row['splash backward / forward'])} | {cell(row['backward / Splash backward'], '{:.3f}')} | "
            f"{cell(row['train / dense Splash train'], '{:.3f}')} |"
        )
    failed = [r for r in records.values() if not r["estimated"]]
    for r in failed:
        lines.append(
            f"not estimated: {r['chip']} {r['impl']} {r['mask']} backward={r['backward']}: "
            f"{failure_reason(r['error'])}"
        )
    return "\n".join(lines)


def mxu_feed(records: dict[tuple, dict]) -> list[dict]:
    """Per estimated case and kernel, each path that runs matmuls: its bundles per execution and
    the cycles its busiest MXU is fed (``stlib.analysis.mxu_input``), and which of the two the
    estimate charges (the longer).

    >>> record = {"chip": "tpu7x", "impl": "splash", "mask": "none", "backward": True, "estimated": True,
    ...           "options": {"fused_backward": True},
    ...           "kernels": [{"kernel": "splash_mha_dkv", "bundles": {"step": 400, "compute": 21042},
    ...                        "mxu_fed": {"compute": 28389}}]}
    >>> [(r["path"], r["bundles"], r["mxu_fed"], r["charged"]) for r in mxu_feed({("k",): record})]
    [('compute', 21042, 28389, 'MXU feed')]
    """
    rows = []
    for record in records.values():
        if not record.get("estimated"):
            continue
        for kernel in record["kernels"]:
            for path, fed in kernel.get("mxu_fed", {}).items():
                bundles = kernel["bundles"][path]
                rows.append(
                    {
                        "chip": record["chip"],
                        "impl": record["impl"],
                        "mask": record["mask"],
                        "direction": "backward" if record["backward"] else "forward",
                        "options": record.get("options") or {},
                        "kernel": kernel["kernel"],
                        "path": path,
                        "bundles": bundles,
                        "mxu_fed": fed,
                        "charged": "MXU feed" if fed > bundles else "bundles",
                    }
                )
    return rows


def format_mxu_feed(records: dict[tuple, dict]) -> str:
    """``mxu_feed`` as a table: one line per kernel path that runs matmuls."""
    lines = [
        (
            f"{'chip':<6} {'impl':<23} {'mask':<30} {'direction':<9} {'kernel':<38} {'path':<15} "
            f"{'bundles':>8} {'MXU fed':>8} {'fed/bundles':>11}  charged"
        )
    ]
    for r in mxu_feed(records):
        kind = " fused" if r["options"].get("fused_backward") else (" split" if r["options"] else "")
        lines.append(
            f"{r['chip']:<6} {r['impl'] + kind:<23} {r['mask'][:30]:<30} {r['direction']:<9} {r['kernel'][:38]:<38} "
            f"{r['path']:<15} {r['bundles']:>8,} {r['mxu_fed']:>8,} {r['mxu_fed'] / r['bundles']:>11.2f}  {r['charged']}"
        )
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m stlib.bench.backward_estimate", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run_parser = sub.add_parser("run", help="estimate every case (no TPU needed)")
    run_parser.add_argument("--chips", nargs="*")
    run_parser.add_argument(
        "--impls", nargs="*", help=f"only these kernels' cases ({TILE_KERNEL}, the baseline)"
    )
    sub.add_parser("table", help="the records as the targets table")
    args = parser.parse_args(argv)
    if args.command == "run":
        run(args.chips, impls=args.impls)
    print(format_table(read()))
    print("\nWhere a target is missed, what stands in its way: python -m stlib.bench.target_gaps")


if __name__ == "__main__":
    main()
