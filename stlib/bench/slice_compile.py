"""Wan 14B's attention across a TPU slice, compiled without a TPU, and what its communication costs.

``run`` compiles ``stlib.parallel_attention`` at the model shape (40 heads x 75,600 tokens x 128,
bf16; a per-head SVG plan of 20 spatial and 20 temporal heads at density 0.25), and at one minute
of 720p video (61 latent frames: 219,600 tokens), for each slice of ``SLICES`` and strategy,
deviceless, and records per case: the compile time, each device's share of the inputs, the Pallas
kernels compiled, every all-to-all and collective-permute with its bytes and the share of them that
leaves its chip (``stlib.bench.collectives``). "heads" and "ulysses" run the routed plan; "ring" and
"ulysses-ring" (Ulysses x a ring of ``RING_SIZE``) its exact masks in raster order, the sequence
split over the devices (``stlib.ring.plan_mask``). ``table`` puts the traffic beside the kernel's
static estimate (the block sweep's best, scaled to the case's heads and pairs) and says at which
density the traffic takes as long as the sparse kernel.

The communication model (a lower bound from each chip's injection bandwidth: no link contention,
no latency, no routing over several hops; never a measurement): a collective of S bytes per device
moves, per chip, its devices' S times the share bound for another chip, and receives as many; at
the chip's ICI bandwidth, both directions together (``Chip.ici_bandwidth``), that takes 2 x those
bytes / bandwidth. An all-to-all waits for the kernel and the kernel for it; a ring's next hop moves
while the current one computes, so its permutes cost only what exceeds the kernel (whose estimate
assumes its work evenly spread over the devices).

    python -m stlib.bench.slice_compile run [--only v6e-2x2-ulysses ...]   # ~10-20 s a case, minutes in all
    python -m stlib.bench.slice_compile run --only v6e-2x2-ring            # tens of minutes on 2 cores
    python -m stlib.bench.slice_compile table
"""

from __future__ import annotations

import argparse
import json
import re
import time
from dataclasses import dataclass

import numpy as np

from stlib import paths
from stlib.device import chip_spec

RECORDS = "data/slice_compiles.jsonl"
#: Wan 14B's self-attention at 720p, 81 frames: 40 heads over 21 x 45 x 80 latent tokens.
MODEL_HEADS, MODEL_GRID, HEAD_DIM = 40, (21, 45, 80), 128
#: One minute of 720p video: 61 latent frames, 219,600 tokens (cases named "...-1min").
LONG_GRID = (61, 45, 80)
#: "ulysses-ring" splits a slice's axis of N devices into N / RING_SIZE for Ulysses x a ring of this.
RING_SIZE = 2
#: The per-head SVG mix: the first half of the heads spatial, the second temporal, at this density.
SVG_DENSITY = 0.25
#: The sweep's family whose estimate stands for the SVG mix (an exact band of the same density).
SVG_FAMILY = "band 0.25"


@dataclass(frozen=True)
class Slice:
    """A slice to compile for: libtpu's topology name, the mesh shape and its axis names (the last
    axis carries heads or sequence; a first "batch" axis takes a batch of that many)."""

    name: str
    chip: str
    topology: str
    mesh_shape: tuple[int, ...]
    axis_names: tuple[str, ...]

    @property
    def batch(self) -> int | None:
        return self.mesh_shape[0] if len(self.mesh_shape) == 2 else None

    @property
    def axis_size(self) -> int:
        return self.mesh_shape[-1]


SLICES = (
    Slice("v6e-2x2", "v6e", "v6e:2x2", (4,), ("heads",)),
    Slice("tpu7x-2x2x1", "tpu7x", "tpu7x:2x2x1", (8,), ("heads",)),
    # 16 devices over 4 processes; 40 heads do not divide by 16: a batch of 2 (classifier-free
    # guidance) x 8 for heads or sequence, as maxdiffusion's data x context meshes
    Slice("v6e-4x4", "v6e", "v6e:4x4", (2, 8), ("batch", "heads")),
)
STRATEGY_NAMES = ("heads", "ulysses", "ring", "ulysses-ring")
#: What ``run`` compiles unless ``--only`` names cases. A ring compiles one tile kernel per distinct
#: (hop, device) block: on v6e 2x2 every hop is issued and every device's block differs (the frames
#: fall at a different place in each shard), 16 kernels of 40 heads, 49 minutes on 2 busy cores; a
#: ring of 8 would be 64. So the rings run by name, and the long video only as heads and Ulysses.
DEFAULT_STRATEGIES = ("heads", "ulysses")
#: The strategies compiled at ``LONG_GRID`` too.
LONG_STRATEGIES = ("heads", "ulysses")


@dataclass(frozen=True)
class Case:
    """One compile: ``slice_`` with ``strategy`` on a video of ``grid`` (frames, height, width)."""

    slice_: Slice
    strategy: str
    grid: tuple[int, int, int] = MODEL_GRID

    @property
    def name(self) -> str:
        return f"{self.slice_.name}-{self.strategy}" + ("-1min" if self.grid == LONG_GRID else "")

    def mesh_axes(self) -> tuple[tuple[int, ...], tuple[str, ...]]:
        """(mesh shape, axis names): the slice's, its last axis split into ("ulysses", "ring") for
        "ulysses-ring"."""
        shape, names = self.slice_.mesh_shape, self.slice_.axis_names
        if self.strategy != "ulysses-ring":
            return shape, names
        return (*shape[:-1], shape[-1] // RING_SIZE, RING_SIZE), (*names[:-1], "ulysses", "ring")


def every_case() -> list[Case]:
    """Every case ``run`` can compile: each slice and strategy at the model shape, and the
    ``LONG_STRATEGIES`` at ``LONG_GRID``."""
    model = [Case(s, strategy) for s in SLICES for strategy in STRATEGY_NAMES]
    return model + [Case(s, strategy, LONG_GRID) for s in SLICES for strategy in LONG_STRATEGIES]


def cases(only=None) -> list[Case]:
    """The cases named "<slice>-<strategy>[-1min]": those of ``DEFAULT_STRATEGIES`` at both lengths,
    or ``only`` (e.g. "v6e-2x2-ring"). Raises ValueError naming an unknown case."""
    every = every_case()
    if not only:
        return [c for c in every if c.strategy in DEFAULT_STRATEGIES]
    names = {c.name for c in every}
    unknown = sorted(set(only) - names)
    if unknown:
        raise ValueError(f"unknown cases {unknown}; choose among {sorted(names)}")
    return [c for c in every if c.name in only]


def compile_case(case: Case, plan=None) -> dict:
    """Compile the call of one case (its plan: ``model_plan(case.grid)`` unless given); returns its
    record."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import topologies
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from stlib import registry
    from stlib.bench.collectives import (
        all_to_all_bytes,
        all_to_all_offchip,
        chip_groups,
        permute_bytes,
        permute_offchip,
    )
    from stlib.parallel import device_branches, head_slice, parallel_attention
    from stlib.ring import plan_mask, ring_hops

    slice_, strategy = case.slice_, case.strategy
    plan = plan or model_plan(case.grid)
    topology = topologies.get_topology_desc(platform="tpu", topology_name=slice_.topology)
    mesh_shape, axis_names = case.mesh_axes()
    mesh = Mesh(np.array(topology.devices).reshape(mesh_shape), axis_names)
    batch_axis = axis_names[0] if slice_.batch else None
    lead = (batch_axis,) if slice_.batch else ()
    if strategy == "ulysses-ring":
        axis, sequence = ("ulysses", "ring"), ("ring", "ulysses")  # the ring's stretches, Ulysses inside
    else:
        axis = sequence = axis_names[-1]
    spec = P(*lead, axis, None, None) if strategy == "heads" else P(*lead, None, sequence, None)
    shape = ((slice_.batch,) if slice_.batch else ()) + (MODEL_HEADS, plan.grid.num_tokens, HEAD_DIM)
    arg = jax.ShapeDtypeStruct(shape, jnp.bfloat16, sharding=NamedSharding(mesh, spec))
    call = {"mesh": mesh, "axis_name": axis, "strategy": strategy, "batch_axis_name": batch_axis}

    def fn(q, k, v):
        return parallel_attention(q, k, v, plan=plan, **call)

    start = time.perf_counter()
    compiled = jax.jit(fn).lower(arg, arg, arg).compile()
    seconds = time.perf_counter() - start
    memory = compiled.memory_analysis()
    text = compiled.as_text()
    kernel = registry.choose(registry.AUTO, plan.mask, backend="tpu")
    global_bytes = 3 * int(np.prod(shape)) * 2
    hops = None
    if strategy in ("heads", "ulysses"):
        branches = len(device_branches(None, plan, MODEL_HEADS, slice_.axis_size).branches)
    else:
        ring_size = mesh.shape[axis_names[-1]]
        per = MODEL_HEADS // (slice_.axis_size // ring_size)
        exact = plan_mask(plan)
        slices = [head_slice(exact, g * per, (g + 1) * per) for g in range(slice_.axis_size // ring_size)]
        issued = ring_hops(slices, ring_size)
        branches = len({b for hop in issued for b in hop.branches if b is not None})
        hops = [hop.offset for hop in issued]
    collective_axes = {  # the mesh axis of each kind of collective the strategy issues
        "heads": {},
        "ulysses": {"ulysses": axis_names[-1]},
        "ring": {"ring": axis_names[-1]},
        "ulysses-ring": {"ulysses": "ulysses", "ring": "ring"},
    }[strategy]
    return {
        "case": case.name,
        "slice": slice_.name,
        "chip": slice_.chip,
        "topology": slice_.topology,
        "devices": int(np.prod(mesh_shape)),
        "mesh": dict(zip(axis_names, mesh_shape)),
        "strategy": strategy,
        "shape": list(shape),
        "grid": list(case.grid),
        "impl": kernel.name,
        "branches": branches,
        "hops_issued": hops,
        "kernels_in_program": len(
            {
                m
                for name in kernel.estimator.kernel_names
                for m in re.findall(rf"%({re.escape(name)}[\w.]*) = ", text)
            }
        ),
        "compile_s": round(seconds, 1),
        "global_input_bytes": global_bytes,
        "argument_bytes_per_device": int(memory.argument_size_in_bytes),
        "output_bytes_per_device": int(memory.output_size_in_bytes),
        "temp_bytes_per_device": int(memory.temp_size_in_bytes),
        "all_to_all_bytes": all_to_all_bytes(text),
        "permute_bytes": permute_bytes(text),
        "all_to_all_offchip": None
        if "ulysses" not in collective_axes
        else all_to_all_offchip(chip_groups(mesh, collective_axes["ulysses"])),
        "permute_offchip": None
        if "ring" not in collective_axes
        else permute_offchip(chip_groups(mesh, collective_axes["ring"]), hops or ()),
    }


def model_plan(grid=MODEL_GRID):
    """The per-head SVG plan of the model on ``grid`` (frames, height, width): ``MODEL_HEADS`` heads,
    half spatial then half temporal, at ``SVG_DENSITY``, with the TPU tile kernel's default blocks."""
    from stlib import registry
    from stlib.geometry import VideoGrid
    from stlib.masks import full
    from stlib.routing import svg_plan

    grid = VideoGrid(*grid)
    kinds = ["spatial"] * (MODEL_HEADS // 2) + ["temporal"] * (MODEL_HEADS // 2)
    kernel = registry.choose(registry.AUTO, full(grid.num_tokens), backend="tpu")  # a masked call's choice
    config = kernel.config(None, grid.num_tokens, interpret=False)
    return svg_plan(grid, kinds, SVG_DENSITY, block_q=config.block_q, block_kv=config.block_kv)


def run(only=None, path=None) -> list[dict]:
    """Compile each case (``cases(only)``) and append its record to ``path`` (default ``RECORDS``
    under ``stlib.paths.home()``), with the run's provenance."""
    from stlib.bench.records import record_each

    plans = {}

    def compile_one(case: Case) -> dict:
        if case.grid not in plans:
            plans[case.grid] = model_plan(case.grid)
        return compile_case(case, plans[case.grid])

    return record_each(
        cases(only),
        compile_one,
        path or paths.home() / RECORDS,
        "slice compiles",
        report=lambda r: json.dumps({k: r[k] for k in ("case", "compile_s", "argument_bytes_per_device")}),
    )


def read(path=None) -> list[dict]:
    """The latest record of each case in ``path`` (default ``RECORDS`` under ``stlib.paths.home()``)."""
    from stlib.bench.records import latest_per_key

    return list(latest_per_key(path or paths.home() / RECORDS, lambda r: r["case"]).values())


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


def kernel_seconds(sweep_records, chip: str, family: str, heads: int, length: int) -> float | None:
    """The tile kernel's best static estimate (seconds, glue included) for ``family`` on ``chip``
    in the committed block sweep (10 heads x 75,600 x 128), scaled to ``heads`` heads at ``length``
    tokens by the pairs (heads x length^2: a density's pairs grow with the square of the length; a
    model, the sweep compiled one length); None where the sweep has no such record."""
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
    return min(times) * 1e-3 * heads / swept_heads * (length / swept_length) ** 2


#: ``table``'s entry where the traffic is below the kernel's time at every density.
NEVER = "none: below the kernel at any density"


def crossing_density(comm: float, band: float, dense: float) -> float:
    """The density at which the kernel's time, linear in density through ``band`` (at 0.25) and
    ``dense`` (at 1), equals ``comm`` (all seconds); negative when ``comm`` is below the line's
    value at density 0 (the kernel's fixed cost)."""
    slope = (dense - band) / (1.0 - 0.25)
    return 0.25 + (comm - band) / slope


def table(records=None, sweep_records=None) -> list[dict]:
    """One row per compiled case: its collectives and their modelled time beside the per-device
    kernel estimate (dense and band 0.25 from the block sweep, ``kernel_seconds``; each device does
    the work of 40 / devices heads at full length, whatever the strategy), the modelled attention
    time at band 0.25 (all-to-alls plus the longer of a ring's permutes and the kernel: the ring's
    next hop moves while the current one computes), and the density at which the traffic equals the
    kernel's time (``crossing_density``; ``NEVER`` where it is below the kernel at every density)."""
    from stlib.bench import block_sweep

    records = read() if records is None else records
    sweep_records = block_sweep.read() if sweep_records is None else sweep_records
    rows = []
    for r in records:
        heads = MODEL_HEADS // attention_devices(r)
        length = r["shape"][-2]
        permutes = r.get("permute_bytes") or []
        exchanged = all_to_all_seconds(r) if r["all_to_all_bytes"] else 0.0
        moved = permute_seconds(r) if permutes else 0.0
        comm = exchanged + moved
        dense = kernel_seconds(sweep_records, r["chip"], "dense", heads, length)
        band = kernel_seconds(sweep_records, r["chip"], SVG_FAMILY, heads, length)
        row = {
            "case": r["case"],
            "slice": r["slice"],
            "strategy": r["strategy"],
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
            "kernel ms, dense (est.)": None if dense is None else dense * 1e3,
            "kernel ms, band 0.25 (est.)": None if band is None else band * 1e3,
            "band 0.25 ms (model)": None if band is None else (exchanged + max(moved, band)) * 1e3,
            "compile s": r["compile_s"],
        }
        if comm and dense is not None and band is not None:
            crossing = crossing_density(comm, band, dense)
            row["density where traffic = kernel"] = crossing if crossing >= 0 else NEVER
        rows.append(row)
    return rows


def modelled_ms(row: dict, density: float) -> float | None:
    """The modelled time of one ``table`` row's call at ``density`` (ms): its all-to-alls, then the
    longer of its ring permutes and the kernel (its line through the band 0.25 and dense estimates);
    None without kernel estimates."""
    band, dense = row["kernel ms, band 0.25 (est.)"], row["kernel ms, dense (est.)"]
    if band is None or dense is None:
        return None
    kernel = band + (density - 0.25) * (dense - band) / 0.75
    moved = row["of it ring permutes ms (model)"]
    return row["traffic ms (model)"] - moved + max(moved, kernel)


#: The densities ``fastest`` compares the strategies at.
DENSITIES = (0.05, 0.1, 0.25, 0.5, 1.0)
#: Cases whose modelled times lie within this fraction of the fastest's tie with it.
TIE = 1e-3
#: The strategies that take q, k, v split over the sequence, as a DiT's sequence-parallel layers hand
#: them over ("heads" needs them split over the heads: from a sequence split, that is Ulysses).
SEQUENCE_SPLIT = ("ulysses", "ring", "ulysses-ring")


def fastest(rows, densities=DENSITIES, strategies=SEQUENCE_SPLIT) -> list[dict]:
    """Per slice and sequence length: the strategies whose ``modelled_ms`` is lowest at each density
    (those within ``TIE`` of it, fastest first), among the cases of ``strategies`` compiled for that slice
    and length (a model over static estimates).

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
            groups.setdefault((row["slice"], row["tokens"]), []).append(row)
    for (slice_name, tokens), group in groups.items():
        for density in densities:
            timed = [(modelled_ms(r, density), r["strategy"]) for r in group]
            timed = [(t, strategy) for t, strategy in timed if t is not None]
            if timed:
                ms = min(t for t, _ in timed)
                tied = [strategy for t, strategy in sorted(timed) if t <= ms * (1 + TIE)]
                out.append(
                    {"slice": slice_name, "tokens": tokens, "density": density, "fastest": tied, "ms": ms}
                )
    return out


def format_fastest(picks: list[dict]) -> str:
    """``fastest``'s picks as a Markdown table: a row per slice and length, a column per density, each
    cell the fastest strategy (tied ones joined by "=") and its modelled ms."""
    densities = list(dict.fromkeys(p["density"] for p in picks))
    lines = [
        "| slice | tokens | " + " | ".join(f"density {d:g}" for d in densities) + " |",
        "|---|---|" + "---|" * len(densities),
    ]
    for key in dict.fromkeys((p["slice"], p["tokens"]) for p in picks):
        cells = {p["density"]: p for p in picks if (p["slice"], p["tokens"]) == key}
        row = [
            " = ".join(cells[d]["fastest"]) + f" {cells[d]['ms']:.3g}" if d in cells else "-"
            for d in densities
        ]
        lines.append(f"| {key[0]} | {key[1]:,} | " + " | ".join(row) + " |")
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


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m stlib.bench.slice_compile", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run_parser = sub.add_parser("run", help="compile the model-shape cases for their slices (no TPU needed)")
    run_parser.add_argument("--only", nargs="*", help="case names, e.g. v6e-2x2-ulysses")
    sub.add_parser("table", help="the communication table from the records")
    args = parser.parse_args(argv)
    if args.command == "run":
        run(args.only)
    rows = table()
    print(format_table(rows))
    print("\nthe fastest strategy on a sequence split, per density (modelled ms per call):")
    print(format_fastest(fastest(rows)))


if __name__ == "__main__":
    main()
