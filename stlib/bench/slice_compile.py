"""Wan 14B's attention across a TPU slice, compiled without a TPU, and what its communication costs.

``run`` compiles ``stlib.parallel_attention`` at the model shape (40 heads x 75,600 tokens x 128,
bf16; a per-head SVG plan of 20 spatial and 20 temporal heads at density 0.25) for each slice of
``SLICES`` and strategy, deviceless (libtpu), and records per case: the compile time, each
device's share of the inputs (``memory_analysis``), the Pallas kernels compiled, and every
all-to-all and collective-permute of the program with its bytes (read from the compiled HLO).
"heads" and "ulysses" run the routed plan; "ring" runs the plan's exact mask in raster order with
the sequence split over the devices (``stlib.ring``: a hop no device needs is not issued). ``table``
puts the traffic beside the kernel's static estimate (the committed block sweep's best blocks) and
says at which density the traffic takes as long as the sparse kernel.

The communication model (a model, not a measurement; a lower bound from each chip's injection
bandwidth: no link contention, no latency, no routing over several hops): an all-to-all of an
S-byte array per device moves, per chip, the bytes its devices send to other chips, (n_chips - 1)
/ n_chips of the chip's devices_per_chip * S, and receives as many; a ring's collective-permute of
S bytes per device sends all of them to a neighbour and receives as many (every neighbour counted
on another chip: on TPU7x, two devices a chip, half are not); with the chip's ICI bandwidth
counting both directions together (``Chip.ici_bandwidth``), either takes 2 * those bytes /
bandwidth. An all-to-all waits for the kernel and the kernel for it (no overlap); a ring's next
hop can move while the current one computes, so a ring costs the longer of its traffic and its
kernel (overlap counted; the kernel estimate assumes its work evenly spread over the devices).

    python -m stlib.bench.slice_compile run [--only v6e-2x2-ulysses ...]   # ~10 s a case, 2 min in all
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
STRATEGY_NAMES = ("heads", "ulysses", "ring")
#: What ``run`` compiles unless ``--only`` names cases: the ring's model-shape program for v6e 2x2
#: did not finish compiling within 10 minutes, twice, on 2 cores shared with another compile (the
#: temporal heads need every hop and every device's block differs: 16 tile-kernel branches of 40
#: heads), so its cases are run by name.
DEFAULT_STRATEGIES = ("heads", "ulysses")


def cases(only=None) -> list[tuple[Slice, str]]:
    """(slice, strategy) pairs, named "<slice>-<strategy>": those of ``DEFAULT_STRATEGIES``, or
    ``only`` (any of ``STRATEGY_NAMES``, e.g. "v6e-2x2-ring")."""
    every = [(s, strategy) for s in SLICES for strategy in STRATEGY_NAMES]
    if not only:
        return [(s, st) for s, st in every if st in DEFAULT_STRATEGIES]
    names = {f"{s.name}-{st}" for s, st in every}
    unknown = sorted(set(only) - names)
    if unknown:
        raise ValueError(f"unknown cases {unknown}; choose among {sorted(names)}")
    return [(s, st) for s, st in every if f"{s.name}-{st}" in only]


_ALL_TO_ALL = re.compile(r"= (\w+)\[([\d,]*)\][^ ]* all-to-all\(")
#: A collective-permute's result: its array, or the (operand, result, contexts) tuple of the async
#: "-start" form, whose first array is the one sent.
_PERMUTE = re.compile(r"= \(?(\w+)\[([\d,]*)\][^=\n]*? collective-permute(?:-start)?\(")
_ITEMSIZE = {"bf16": 2, "f16": 2, "f32": 4, "s32": 4, "u32": 4, "s8": 1, "u8": 1, "pred": 1}


def _collective_bytes(pattern: re.Pattern, hlo_text: str) -> list[int]:
    return [
        int(np.prod([int(d) for d in dims.split(",") if d])) * _ITEMSIZE[dtype]
        for dtype, dims in pattern.findall(hlo_text)
    ]


def all_to_all_bytes(hlo_text: str) -> list[int]:
    """The bytes per device of every all-to-all in a compiled program's HLO text."""
    return _collective_bytes(_ALL_TO_ALL, hlo_text)


def permute_bytes(hlo_text: str) -> list[int]:
    """The bytes per device each collective-permute of a compiled program's HLO text sends."""
    return _collective_bytes(_PERMUTE, hlo_text)


def compile_case(slice_: Slice, strategy: str, plan=None) -> dict:
    """Compile the model-shape call for one slice and strategy; returns its record."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import topologies
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from stlib import registry
    from stlib.parallel import device_branches, parallel_attention
    from stlib.ring import ring_hops

    plan = plan or model_plan()
    topology = topologies.get_topology_desc(platform="tpu", topology_name=slice_.topology)
    mesh = Mesh(np.array(topology.devices).reshape(slice_.mesh_shape), slice_.axis_names)
    axis, batch_axis = slice_.axis_names[-1], (slice_.axis_names[0] if slice_.batch else None)
    lead = (batch_axis,) if slice_.batch else ()
    spec = P(*lead, axis, None, None) if strategy == "heads" else P(*lead, None, axis, None)
    shape = ((slice_.batch,) if slice_.batch else ()) + (MODEL_HEADS, plan.grid.num_tokens, HEAD_DIM)
    arg = jax.ShapeDtypeStruct(shape, jnp.bfloat16, sharding=NamedSharding(mesh, spec))

    call = {"mesh": mesh, "axis_name": axis, "strategy": strategy, "batch_axis_name": batch_axis}
    ring_mask = ring_mask_of(plan) if strategy == "ring" else None

    def fn(q, k, v):
        if ring_mask is not None:  # the sequence split: the mask in the tokens' own (raster) order
            return parallel_attention(q, k, v, ring_mask, **call)
        return parallel_attention(q, k, v, plan=plan, **call)

    start = time.perf_counter()
    compiled = jax.jit(fn).lower(arg, arg, arg).compile()
    seconds = time.perf_counter() - start
    memory = compiled.memory_analysis()
    text = compiled.as_text()
    kernel = registry.choose(registry.AUTO, plan.mask, backend="tpu")
    global_bytes = 3 * int(np.prod(shape)) * 2
    if ring_mask is None:
        branches = len(device_branches(None, plan, MODEL_HEADS, slice_.axis_size).branches)
        hops = None
    else:
        issued = ring_hops(ring_mask, slice_.axis_size)
        branches = len({b for hop in issued for b in hop.branches if b is not None})
        hops = [hop.offset for hop in issued]
    return {
        "case": f"{slice_.name}-{strategy}",
        "slice": slice_.name,
        "chip": slice_.chip,
        "topology": slice_.topology,
        "devices": int(np.prod(slice_.mesh_shape)),
        "mesh": dict(zip(slice_.axis_names, slice_.mesh_shape)),
        "strategy": strategy,
        "shape": list(shape),
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
    }


def ring_mask_of(plan):
    """The mask a ring runs for ``plan``: its heads' exact masks in raster order (the ring splits
    the tokens as they come; the routed plan's per-kind orders and rounded tiles are for "heads"
    and "ulysses")."""
    from stlib.masks import per_head

    return per_head(list(plan.exact_masks))


def model_plan():
    """The per-head SVG plan of the model: ``MODEL_HEADS`` heads, half spatial then half temporal,
    at ``SVG_DENSITY``, with the TPU tile kernel's default blocks."""
    from stlib import registry
    from stlib.geometry import VideoGrid
    from stlib.masks import full
    from stlib.routing import svg_plan

    grid = VideoGrid(*MODEL_GRID)
    kinds = ["spatial"] * (MODEL_HEADS // 2) + ["temporal"] * (MODEL_HEADS // 2)
    kernel = registry.choose(registry.AUTO, full(grid.num_tokens), backend="tpu")  # a masked call's choice
    config = kernel.config(None, grid.num_tokens, interpret=False)
    return svg_plan(grid, kinds, SVG_DENSITY, block_q=config.block_q, block_kv=config.block_kv)


def run(only=None, path=None) -> list[dict]:
    """Compile each case (``cases(only)``) and append its record to ``path`` (default ``RECORDS``
    under ``stlib.paths.home()``), with the run's provenance."""
    from stlib.bench.records import record_each

    plan = model_plan()
    return record_each(
        cases(only),
        lambda case: compile_case(*case, plan),
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
    """The communication model's time for one record's all-to-alls (module docstring)."""
    chip = _chip_with_ici(record)
    per_chip = chip.devices_per_chip
    n_chips = max(record["mesh"]["heads"] // per_chip, 1)  # chips along the all-to-all's axis
    moved = sum(record["all_to_all_bytes"]) * per_chip * (n_chips - 1) / n_chips
    return 2 * moved / chip.ici_bandwidth


def permute_seconds(record: dict) -> float:
    """The communication model's time for one record's collective-permutes (module docstring)."""
    chip = _chip_with_ici(record)
    return 2 * sum(record.get("permute_bytes", ())) * chip.devices_per_chip / chip.ici_bandwidth


def kernel_seconds(sweep_records, chip: str, family: str, heads: int) -> float | None:
    """The tile kernel's best static estimate (seconds, glue included) for ``family`` on ``chip``
    in the committed block sweep (10 heads x 75,600 x 128), scaled to ``heads`` heads per device
    (grid steps are per head); None where the sweep has no such record."""
    from stlib.bench.block_sweep import NAME

    times = [
        r["total_ms"]
        for r in sweep_records
        if r["chip"] == chip and r["family"] == family and r["impl"] == NAME and "total_ms" in r
    ]
    if not times:
        return None
    (swept_heads, *_) = next(r["shape"] for r in sweep_records if r["chip"] == chip and r["family"] == family)
    return min(times) * 1e-3 * heads / swept_heads


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
    kernel estimate (dense and band 0.25 from the block sweep; each device does the work of
    40 / devices heads at full length, whatever the strategy), the modelled attention time at band
    0.25 (traffic plus kernel; a ring: the longer of the two), and the density at which the traffic
    equals the kernel's time (``crossing_density``; ``NEVER`` where it is below the kernel at every
    density)."""
    from stlib.bench import block_sweep

    records = read() if records is None else records
    sweep_records = block_sweep.read() if sweep_records is None else sweep_records
    rows = []
    for r in records:
        heads = MODEL_HEADS // r["mesh"]["heads"]
        permutes = r.get("permute_bytes", [])
        comm = (all_to_all_seconds(r) if r["all_to_all_bytes"] else 0.0) + (
            permute_seconds(r) if permutes else 0.0
        )
        dense = kernel_seconds(sweep_records, r["chip"], "dense", heads)
        band = kernel_seconds(sweep_records, r["chip"], SVG_FAMILY, heads)
        overlapped = r["strategy"] == "ring"
        row = {
            "case": r["case"],
            "devices": r["devices"],
            "heads' work per device": heads,
            "input share": r["argument_bytes_per_device"] / r["global_input_bytes"],
            "all-to-alls": len(r["all_to_all_bytes"]),
            "permutes": len(permutes),
            "hops issued": "-" if r.get("hops_issued") is None else len(r["hops_issued"]),
            "traffic MB per device": (sum(r["all_to_all_bytes"]) + sum(permutes)) / 1e6,
            "traffic ms (model)": comm * 1e3,
            "kernel ms, dense (est.)": None if dense is None else dense * 1e3,
            "kernel ms, band 0.25 (est.)": None if band is None else band * 1e3,
            "band 0.25 ms (model)": None
            if band is None
            else (max(comm, band) if overlapped else comm + band) * 1e3,
            "compile s": r["compile_s"],
        }
        if comm and dense is not None and band is not None:
            crossing = crossing_density(comm, band, dense)
            row["density where traffic = kernel"] = crossing if crossing >= 0 else NEVER
        rows.append(row)
    return rows


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
    print(format_table(table()))


if __name__ == "__main__":
    main()
