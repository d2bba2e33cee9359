"""The communication model of Wan 14B's attention across a TPU slice: the collectives of each
compiled case (the records of ``stlib.bench.slice_compile``) beside the tile kernel's static estimate,
and which strategy is fastest at which density.

The communication model (a lower bound from each chip's injection bandwidth: no link contention,
no latency, no routing over several hops; never a measurement): a collective of S bytes per device
moves, per chip, its devices' S times the share bound for another chip, and receives as many; at
the chip's ICI bandwidth, both directions together (``Chip.ici_bandwidth``), that takes 2 x those
bytes / bandwidth. An all-to-all waits for the kernel and the kernel for it; a ring's next hop moves
while the current one computes, so its permutes cost only what exceeds the kernel (whose estimate
assumes its work evenly spread over the devices).

    python -m stlib.bench.slice_compile table   # the table from the committed records
"""

from __future__ import annotations

import numpy as np

from stlib.device import chip_spec

#: The sweep's family whose estimate stands for the SVG mix (an exact band of the same density).
SVG_FAMILY = "band 0.25"


def _chip_with_ici(record: dict):
    chip = chip_spec(record["chip"])
    if chip.ici_bandwidth is None:
        raise ValueError(f"chip {record['chip']!r} has no ICI bandwidth in the chip table")
    return chip


def all_to_all_seconds(record: dict) -> float:
    """The communication model's time for one record's all-to-alls (module docstring): per chip, its
    devices' bytes times the share bound for another chip (``all_to_all_offchip``), each way."""
    chip = _chip_with_ici(record)
    moved = sum(record["all_to_all_bytes"]) * chip.devices_per_chip * record["all_to_all_offchip"]
    return 2 * moved / chip.ici_bandwidth


def permute_seconds(record: dict) -> float:
    """The communication model's time for one record's collective-permutes (module docstring): per
    chip, its devices' bytes times the share bound for another chip (``permute_offchip``), each way."""
    chip = _chip_with_ici(record)
    permutes = record.get("permute_bytes") or ()
    moved = sum(permutes) * chip.devices_per_chip * (record["permute_offchip"] if permutes else 0.0)
    return 2 * moved / chip.ici_bandwidth


def attention_devices(record: dict) -> int:
    """The devices one call's attention spreads over: every mesh axis but the batch's."""
    return int(np.prod([size for name, size in record["mesh"].items() if name != "batch"]))


def _scaled(ms: float, heads: int, length: int, measured_heads: int, measured_length: int) -> float:
    """Seconds for ``heads`` heads at ``length`` tokens from ``ms`` estimated at ``measured_heads`` x
    ``measured_length``, scaled by the pairs (heads x length^2: a density's pairs grow with the square
    of the length; a model, the estimates compiled one length)."""
    return ms * 1e-3 * heads / measured_heads * (length / measured_length) ** 2


def kernel_seconds(sweep_records, chip: str, family: str, heads: int, length: int) -> float | None:
    """The tile kernel's best static estimate (seconds, glue included) for ``family`` on ``chip``
    in the committed block sweep (10 heads x 75,600 x 128), scaled to ``heads`` heads at ``length``
    tokens (``_scaled``); None where the sweep has no such record."""
    from stlib.bench.block_sweep import NAME

    times = [
        r["total_ms"]
        for r in sweep_records
        if r["chip"] == chip and r["family"] == family and r["impl"] == NAME and "total_ms" in r
    ]
    if not times:
        return None
    swept_heads, swept_length, _ = next(
        r["shape"] for r in sweep_records if r["chip"] == chip and r["family"] == family
    )
    return _scaled(min(times), heads, length, swept_heads, swept_length)


def step_seconds(step_rows, chip: str, mask: str, heads: int, length: int) -> float | None:
    """The tile kernel's static estimate of a training step's attention (forward + backward, seconds,
    glue included) for ``mask`` (a mask name of ``stlib.bench.backward_estimate``) on ``chip``, from
    ``backward_estimate.targets`` rows (the case-study shape, 10 heads x 75,600 x 128), scaled to
    ``heads`` heads at ``length`` tokens (``_scaled``); None where the chip and mask have no row."""
    from stlib.configs import CASE_STUDY

    row = next((r for r in step_rows if r["chip"] == chip and r["mask"] == mask), None)
    if row is None:
        return None
    ms = row["forward_ms"] + row["backward_ms"]
    return _scaled(ms, heads, length, CASE_STUDY.num_heads, CASE_STUDY.num_tokens)


#: The masks of ``stlib.bench.backward_estimate`` whose training-step estimates stand for dense and
#: for the SVG mix.
STEP_MASKS = {"dense": "full", SVG_FAMILY: "band (density 0.25)"}


def exposed_seconds(record: dict, moved: float) -> float:
    """The part of a ring's permutes (``moved`` seconds) that no kernel hides: one hop's share where
    the compiled program runs no kernel before the first kv shard lands (its
    ``kernels_before_first_arrival`` is 0: the local hop's kernel scheduled after the transfers), else
    none. A record without the count (compiled before it was kept) is taken as overlapping: the
    compiled programs differ (the small ring programs of notebook 11 run no kernel before the first
    arrival, the small Ulysses x ring program one)."""
    remote = [offset for offset in record.get("hops_issued") or () if offset]
    if not remote or record.get("kernels_before_first_arrival") != 0:
        return 0.0
    return moved / len(remote)


#: ``table``'s entry where the traffic is below the kernel's time at every density.
NEVER = "none: below the kernel at any density"


def crossing_density(comm: float, band: float, dense: float) -> float:
    """The density at which the kernel's time, linear in density through ``band`` (at 0.25) and
    ``dense`` (at 1), equals ``comm`` (all seconds); negative when ``comm`` is below the line's
    value at density 0 (the kernel's fixed cost)."""
    slope = (dense - band) / (1.0 - 0.25)
    return 0.25 + (comm - band) / slope


def table(records, sweep_records, step_records=None) -> list[dict]:
    """One row per compiled case: its collectives and their modelled time beside the per-device
    kernel estimate (dense and band 0.25 from the block sweep, ``kernel_seconds``, or for a training
    step's case from ``step_records``, ``backward_estimate.read()``'s records, ``step_seconds``; each
    device does the work of 40 / devices
    heads at full length, whatever the strategy), the modelled attention time at band 0.25
    (all-to-alls, a ring's exposed permutes, ``exposed_seconds``, plus the longer of its other
    permutes and the kernel: the ring's next hop moves while the current one computes), and the
    density at which the traffic equals the kernel's time (``crossing_density``; ``NEVER`` where it
    is below the kernel at every density)."""
    from stlib.bench.backward_estimate import targets

    step_rows = None if step_records is None else targets(step_records)
    rows = []
    for r in records:
        training = r.get("direction") == "training"
        heads = r["shape"][-3] // attention_devices(r)
        length = r["shape"][-2]
        permutes = r.get("permute_bytes") or []
        exchanged = all_to_all_seconds(r) if r["all_to_all_bytes"] else 0.0
        moved = permute_seconds(r) if permutes else 0.0
        exposed = exposed_seconds(r, moved)
        comm = exchanged + moved
        if training:
            dense, band = (
                None
                if step_rows is None
                else step_seconds(step_rows, r["chip"], STEP_MASKS[f], heads, length)
                for f in ("dense", SVG_FAMILY)
            )
        else:
            dense, band = (
                kernel_seconds(sweep_records, r["chip"], f, heads, length) for f in ("dense", SVG_FAMILY)
            )
        first = r.get("kernels_before_first_arrival")
        row = {
            "case": r["case"],
            "slice": r["slice"],
            "strategy": r["strategy"],
            "call": "training step" if training else "forward",
            "tokens": length,
            "devices": r["devices"],
            "heads' work per device": heads,
            "input share": r["argument_bytes_per_device"] / r["global_input_bytes"],
            "all-to-alls": len(r["all_to_all_bytes"]),
            "permutes": len(permutes),
            "hops issued": "-" if r.get("hops_issued") is None else len(r["hops_issued"]),
            "traffic MB per device": (sum(r["all_to_all_bytes"]) + sum(permutes)) / 1e6,
            "traffic ms (model)": comm * 1e3,
            "of it ring permutes ms (model)": moved * 1e3,
            "kernels before the first shard lands": "-" if first is None else first,
            "of the permutes exposed ms (model)": exposed * 1e3,
            "kernel ms, dense (est.)": None if dense is None else dense * 1e3,
            "kernel ms, band 0.25 (est.)": None if band is None else band * 1e3,
        }
        row["band 0.25 ms (model)"] = modelled_ms(row, 0.25)
        row["compile s"] = r["compile_s"]
        if comm and dense is not None and band is not None:
            crossing = crossing_density(comm, band, dense)
            row["density where traffic = kernel"] = crossing if crossing >= 0 else NEVER
        rows.append(row)
    return rows


def modelled_ms(row: dict, density: float) -> float | None:
    """The modelled time of one ``table`` row's call at ``density`` (ms): its all-to-alls and its
    exposed permutes, then the longer of its other ring permutes and the kernel (its line through the
    band 0.25 and dense estimates); None without kernel estimates."""
    band, dense = row["kernel ms, band 0.25 (est.)"], row["kernel ms, dense (est.)"]
    if band is None or dense is None:
        return None
    kernel = band + (density - 0.25) * (dense - band) / 0.75
    moved = row["of it ring permutes ms (model)"] - row.get("of the permutes exposed ms (model)", 0.0)
    return row["traffic ms (model)"] - moved + max(moved, kernel)


#: The densities ``fastest`` compares the strategies at.
DENSITIES = (0.05, 0.1, 0.25, 0.5, 1.0)
#: Cases whose modelled times lie within this fraction of the fastest's tie with it.
TIE = 1e-3
#: The strategies that take q, k, v split over the sequence, as a DiT's sequence-parallel layers hand
#: them over ("heads" needs them split over the heads: from a sequence split, that is Ulysses).
SEQUENCE_SPLIT = ("ulysses", "ring", "ulysses-ring")


def fastest(rows, densities=DENSITIES, strategies=SEQUENCE_SPLIT) -> list[dict]:
    """Per slice, sequence length and call (forward or training step): the strategies whose
    ``modelled_ms`` is lowest at each density (those within ``TIE`` of it, fastest first), among the
    cases of ``strategies`` compiled for that slice, length and call (a model over static estimates).

    >>> rows = [{"case": f"s-{s}", "slice": "s", "strategy": s, "tokens": 8, "traffic ms (model)": t,
    ...          "of it ring permutes ms (model)": p, "kernel ms, band 0.25 (est.)": 10.0,
    ...          "kernel ms, dense (est.)": 40.0}
    ...         for s, t, p in (("ulysses", 2.0, 0.0), ("ring", 20.0, 20.0))]
    >>> [(r["density"], r["fastest"], r["ms"]) for r in fastest(rows, (0.25, 1.0))]
    [(0.25, ['ulysses'], 12.0), (1.0, ['ring'], 40.0)]
    """
    out = []
    groups: dict = {}
    for row in rows:
        if row["strategy"] in strategies:
            groups.setdefault((row["slice"], row["tokens"], row.get("call", "forward")), []).append(row)
    for (slice_name, tokens, call), group in groups.items():
        for density in densities:
            timed = [(modelled_ms(r, density), r["strategy"]) for r in group]
            timed = [(t, strategy) for t, strategy in timed if t is not None]
            if timed:
                ms = min(t for t, _ in timed)
                tied = [strategy for t, strategy in sorted(timed) if t <= ms * (1 + TIE)]
                out.append(
                    {"slice": slice_name, "tokens": tokens, "call": call, "density": density}
                    | {"fastest": tied, "ms": ms}
                )
    return out


def format_fastest(picks: list[dict]) -> str:
    """``fastest``'s picks as a Markdown table: a row per slice, length and call, a column per
    density, each cell the fastest strategy (tied ones joined by "=") and its modelled ms."""
    densities = list(dict.fromkeys(p["density"] for p in picks))
    lines = [
        "| slice | tokens | call | " + " | ".join(f"density {d:g}" for d in densities) + " |",
        "|---|---|---|" + "---|" * len(densities),
    ]
    for key in dict.fromkeys((p["slice"], p["tokens"], p["call"]) for p in picks):
        cells = {p["density"]: p for p in picks if (p["slice"], p["tokens"], p["call"]) == key}
        row = [
            " = ".join(cells[d]["fastest"]) + f" {cells[d]['ms']:.3g}" if d in cells else "-"
            for d in densities
        ]
        lines.append(f"| {key[0]} | {key[1]:,} | {key[2]} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def format_table(rows) -> str:
    """``table`` rows as a Markdown table."""
    if not rows:
        return "(no records)"
    columns = list(dict.fromkeys(k for row in rows for k in row))
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        cells = [_cell(row.get(c)) for c in columns]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 100 else f"{value:,.0f}"
    return str(value)


__all__ = [
    "DENSITIES",
    "NEVER",
    "SEQUENCE_SPLIT",
    "STEP_MASKS",
    "SVG_FAMILY",
    "TIE",
    "all_to_all_seconds",
    "attention_devices",
    "crossing_density",
    "exposed_seconds",
    "fastest",
    "format_fastest",
    "format_table",
    "kernel_seconds",
    "modelled_ms",
    "permute_seconds",
    "step_seconds",
    "table",
]
