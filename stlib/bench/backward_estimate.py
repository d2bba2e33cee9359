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
#: Splash's (dense only), its backward over its forward (sliding tile), and its forward + backward
#: over dense Splash's, both at their tuned blocks.
TARGETS = {
    "full": {"backward / Splash backward": 0.92},
    "band (density 0.25)": {"train / dense Splash train": 0.22},
    "sliding tile, 3-D tiled order": {"backward / forward": 2.7, "train / dense Splash train": 0.13},
}


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


def targets(records: dict[tuple, dict]) -> list[dict]:
    """Per chip and tile-kernel mask: forward, backward and their ratio, and forward + backward over
    dense Splash's (its forward tuned, its backward the better of fused and split, each tuned)."""
    baseline, rows = _baseline(), []
    for chip in sorted({k[0] for k in records}):
        splash_fwd = records.get((chip, baseline, "none", False, "{}"))
        splash_bwd = [
            records.get((chip, baseline, "none", True, json.dumps({"fused_backward": f})))
            for f in (True, False)
        ]
        splash_bwd = [r for r in splash_bwd if r and r["estimated"]]
        best_bwd = min(splash_bwd, key=lambda r: r["total_ms"]) if splash_bwd else None
        splash_train = (
            splash_fwd["total_ms"] + best_bwd["total_ms"]
            if splash_fwd and splash_fwd["estimated"] and best_bwd
            else None
        )
        for mask in MASKS:
            fwd = records.get((chip, TILE_KERNEL, mask, False, "{}"))
            bwd = records.get((chip, TILE_KERNEL, mask, True, "{}"))
            if not (fwd and bwd and fwd["estimated"] and bwd["estimated"]):
                continue
            train = fwd["total_ms"] + bwd["total_ms"]
            rows.append(
                {
                    "chip": chip,
                    "mask": mask,
                    "forward_ms": fwd["total_ms"],
                    "backward_ms": bwd["total_ms"],
                    "backward / forward": bwd["total_ms"] / fwd["total_ms"],
                    "train / dense Splash train": train / splash_train if splash_train else None,
                    "splash_forward_ms": splash_fwd["total_ms"] if splash_fwd else None,
                    "splash_backward_ms": best_bwd["total_ms"] if best_bwd else None,
                    "splash_backward_kind": (
                        ("fused" if best_bwd["options"]["fused_backward"] else "split") if best_bwd else None
                    ),
                    "splash backward / forward": (
                        best_bwd["total_ms"] / splash_fwd["total_ms"] if best_bwd and splash_fwd else None
                    ),
                    "backward / Splash backward": bwd["total_ms"] / best_bwd["total_ms"]
                    if best_bwd
                    else None,
                }
            )
    return rows


def format_table(records: dict[tuple, dict]) -> str:
    """The targets as a Markdown table (static estimates, ms), then every case that failed."""
    from stlib.bench.records import failure_reason

    goals = "; ".join(
        f"{mask.split(' (')[0].split(',')[0]}: " + ", ".join(f"{k} <= {v}" for k, v in goal.items())
        for mask, goal in TARGETS.items()
    )
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


if __name__ == "__main__":
    main()


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
