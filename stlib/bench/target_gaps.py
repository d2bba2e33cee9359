"""What stands in the way of a missed backward-estimate target (``stlib.bench.backward_estimate``):
per missed target, the same ratio with every path charged its bundles alone, the ratio at the tile
kernel's mask-free pace (the mask's density times its ratio without a mask), and the tile kernel's
path with the most charged cycles, from the committed records. Notebook 10 prints it.

    python -m stlib.bench.target_gaps
"""

from __future__ import annotations

import functools
import re

from stlib.bench import backward_estimate as be

#: The quantities whose floor at the kernel's mask-free pace is the mask's density times the same
#: quantity without a mask (a ratio of times over dense Splash's).
DENSE_PACE = ("forward / Splash forward", "train / dense Splash train")


@functools.cache
def mask_density(mask: str) -> float:
    """Allowed pairs / L^2 of a case-study mask (its real tokens; the catalogue name of ``MASKS``).

    >>> round(mask_density("sliding tile, 3-D tiled order"), 3)
    0.132
    """
    from stlib.analysis.dump import KernelConfig, resolve_mask
    from stlib.configs import CASE_STUDY
    from stlib.layout import block_layout

    config = KernelConfig(
        be.TILE_KERNEL, mask=mask, num_heads=CASE_STUDY.num_heads, head_dim=CASE_STUDY.head_dim
    )
    return block_layout(resolve_mask(config), 2048, 2048).density


def largest_path(kernel_records: list[dict]) -> dict | None:
    """The path with the most charged cycles (count x the longer of its bundles and its MXU feed, as
    the estimate charges) among the records' kernels, a region of a kernel split over dq windows
    (``..._w0``, ``..._w1``) summed over its windows: its kernel (without the window), path, share of
    all the records' kernel cycles, and MXU feed over bundles (count-weighted; above 1: charged its
    feed). None for records without path counts or kernels.

    >>> def kernel(name, fed):
    ...     return {"kernel": name, "bundles": {"step": 50, "compute": 900}, "mxu_fed": {"compute": fed},
    ...             "counts": {"step": 10, "compute": 10}}
    >>> path = largest_path([{"kernels": [kernel("k.1", 1200)]}])
    >>> path["path"], round(path["share"], 3), round(path["fed / bundles"], 2)
    ('compute', 0.96, 1.33)
    >>> split = [{"kernels": [kernel("fwd.1", 1300), kernel("bwd_w0.1", 1000), kernel("bwd_w1.1", 1000)]}]
    >>> path = largest_path(split)  # the backward's two windows together outweigh the forward
    >>> path["kernel"], round(path["share"], 3)
    ('bwd', 0.58)
    """
    cycles: dict[tuple[str, str], list[int]] = {}
    for record in kernel_records:
        for kernel in record["kernels"]:
            if "counts" not in kernel:
                return None
            name = re.sub(r"_w\d+$", "", kernel["kernel"].split(".")[0])
            for path, count in kernel["counts"].items():
                bundles = kernel["bundles"][path]
                fed = kernel.get("mxu_fed", {}).get(path, 0)
                total = cycles.setdefault((name, path), [0, 0, 0])
                total[0] += count * max(bundles, fed)
                total[1] += count * fed
                total[2] += count * bundles
    if not cycles:
        return None
    (name, path), (charged, fed, bundles) = max(cycles.items(), key=lambda item: item[1][0])
    share = charged / sum(c[0] for c in cycles.values())
    return {"kernel": name, "path": path, "share": share, "fed / bundles": fed / bundles if bundles else 0.0}


#: The tile kernel's calls each ratio reads (the largest path is sought among their kernels).
READS = {
    "forward / Splash forward": ("forward",),
    "backward / Splash backward": ("backward",),
    "backward / forward": ("forward", "backward"),
    "train / dense Splash train": ("forward", "backward"),
}


def missed(records: dict[tuple, dict]) -> list[dict]:
    """Every target a row of ``backward_estimate.targets`` misses, beside what the estimate shows in its way: the
    quantity with every path charged its bundles alone and no exposed DMA (without the MXU-feed rule,
    which measurements on a TPU v5e contradicted: notebook 08); the mask's density times the same
    quantity of the kernel without a mask, read both ways (where a target lies below it, no schedule
    of this kernel at its mask-free pace reaches it); and the largest path of the kernels the
    quantity reads (``READS``)."""
    rows, computed = [], be.targets(records)
    full = {row["chip"]: row for row in computed if row["mask"] == "full"}
    for row in computed:
        chip, mask = row["chip"], row["mask"]
        for quantity in be.TARGETS.get(mask, {}):
            goal, value = be.target(chip, mask, quantity), row[quantity]
            if value is None or value <= goal:
                continue
            fwd, bwd = be.tile_records(records, chip, mask)
            at_bundles = bundles_only(records, chip, mask)
            dense, dense_at_bundles = None, None
            if quantity in DENSE_PACE and chip in full and full[chip][quantity] is not None:
                dense = mask_density(mask) * full[chip][quantity]
                full_at_bundles = bundles_only(records, chip, "full")
                if full_at_bundles and full_at_bundles[quantity] is not None:
                    dense_at_bundles = mask_density(mask) * full_at_bundles[quantity]
            calls = {"forward": fwd, "backward": bwd}
            rows.append(
                {
                    "chip": chip,
                    "mask": mask,
                    "quantity": quantity,
                    "estimate": value,
                    "target": goal,
                    "bundles only": at_bundles[quantity] if at_bundles else None,
                    "density x dense": dense,
                    "density x dense, bundles only": dense_at_bundles,
                    "largest path": largest_path([calls[c] for c in READS[quantity]]),
                }
            )
    return rows


def bundles_only(records: dict[tuple, dict], chip: str, mask: str) -> dict | None:
    """``backward_estimate.ratios`` of the tile kernel on ``mask`` with every record read at its
    bundles alone (dense Splash's better backward by that reading too); None where a record lacks it.

    >>> bundles_only({}, "v6e", "full") is None
    True
    """
    tile = be.tile_records(records, chip, mask)
    splash = be.splash_records(records, chip, "bundles_only_ms")
    if tile is None or not all(r and "bundles_only_ms" in r for r in (*tile, *splash)):
        return None
    return be.ratios(*tile, *splash, "bundles_only_ms")


def format_missed(records: dict[tuple, dict]) -> str:
    """``missed`` as a Markdown table."""
    lines = [
        (
            "| chip | tile-kernel mask | quantity | estimate | target | every path at its bundles | "
            "density x the kernel's own ratio without a mask (at its bundles) | "
            "largest path (share of the kernel's cycles, MXU feed / bundles) |"
        ),
        "|" + "---|" * 8,
    ]

    def cell(value):
        return "-" if value is None else f"{value:.3f}"

    for r in missed(records):
        path = r["largest path"]
        where = (
            f"{path['kernel']} {path['path']} ({path['share']:.0%}, {path['fed / bundles']:.2f})"
            if path
            else "-"
        )
        cells = [cell(r[k]) for k in ("estimate", "target", "bundles only")]
        dense = f"{cell(r['density x dense'])} ({cell(r['density x dense, bundles only'])})"
        lines.append(
            f"| {r['chip']} | {r['mask']} | {r['quantity']} | {' | '.join(cells)} | {dense} | {where} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    print(format_missed(be.read()))
