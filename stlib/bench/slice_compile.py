"""Wan 14B's attention across a TPU slice, compiled without a TPU, and what its communication costs.

``run`` compiles ``stlib.parallel_attention`` at the model shape (40 heads x 75,600 tokens x 128,
bf16; a per-head SVG plan of 20 spatial and 20 temporal heads at density 0.25), and at a longer
720p clip (61 latent frames: 219,600 tokens), for each slice of ``SLICES`` and strategy,
deviceless, and records per case: the compile time, each device's share of the inputs, the Pallas
kernels compiled, every all-to-all and collective-permute with its bytes and the share of them that
leaves its chip (``stlib.bench.collectives``). "heads" and "ulysses" run the routed plan; "ring" and
"ulysses-ring" (Ulysses x a ring of ``RING_SIZE``) its exact masks in raster order, the sequence
split over the devices (``stlib.ring.plan_mask``). ``stlib.bench.slice_traffic`` reads the records:
the traffic beside the kernel's static estimate, and the density at which the traffic takes as long
as the sparse kernel.

    python -m stlib.bench.slice_compile run [--only v6e-2x2-ulysses ...]   # ~10-20 s a case, minutes in all
    python -m stlib.bench.slice_compile run --only v6e-2x2-ring            # ~3 min on 2 cores
    python -m stlib.bench.slice_compile run --only v6e-2x2-ring-train      # ~7 min: forward and backward
    python -m stlib.bench.slice_compile run --only v6e-4x4-ulysses-train   # a training step's attention
    python -m stlib.bench.slice_compile table
    python -m stlib.bench.slice_compile reuse                               # ~1 min: one kernel body, many calls

A program's compile time follows its distinct kernel bodies, not its kernel calls (``reuse``;
``collectives.kernel_bodies`` counts them in a compiled program): a ring runs its (hop, device)
blocks through one kernel body a direction (``stlib.ring.shared_kernel``).
"""

from __future__ import annotations

import argparse
import json
import re
import time
from dataclasses import dataclass

import numpy as np

from stlib import paths
from stlib.bench.slice_traffic import fastest, format_fastest, format_table, table

RECORDS = "data/slice_compiles.jsonl"
#: Wan 14B's self-attention at 720p, 81 frames: 40 heads over 21 x 45 x 80 latent tokens.
MODEL_HEADS, MODEL_GRID, HEAD_DIM = 40, (21, 45, 80), 128
#: A longer 720p clip: 61 latent frames (241 video frames), 219,600 tokens; cases named "...-1min"
#: after the one minute the ring issue asked for, which 241 frames are at 4 fps (15 s at Wan's 16).
LONG_GRID = (61, 45, 80)
#: "ulysses-ring" splits a slice's axis of N devices into N / RING_SIZE for Ulysses x a ring of this.
RING_SIZE = 2
#: The per-head SVG mix: the first half of the heads spatial, the second temporal, at this density.
SVG_DENSITY = 0.25


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
#: What ``run`` compiles unless ``--only`` names cases. A ring runs every hop through one kernel a
#: direction (``stlib.ring.shared_kernel``): v6e 2x2's 16 (hop, device) blocks compile as one
#: forward body in 162 s (a kernel a block: 16 bodies, 1,932 s), its training step as one forward
#: and one backward body in 387 s; minutes a case, so the rings run by name.
DEFAULT_STRATEGIES = ("heads", "ulysses")
#: The strategies with cases at ``LONG_GRID`` too.
LONG_STRATEGIES = STRATEGY_NAMES


@dataclass(frozen=True)
class Case:
    """One compile: ``slice_`` with ``strategy`` on a video of ``grid`` (frames, height, width); the
    forward call, or with ``training`` a training step's attention (its forward and the gradients of
    q, k, v from an output cotangent sharded as q)."""

    slice_: Slice
    strategy: str
    grid: tuple[int, int, int] = MODEL_GRID
    training: bool = False

    @property
    def name(self) -> str:
        long = "-1min" if self.grid == LONG_GRID else ""
        return f"{self.slice_.name}-{self.strategy}{long}" + ("-train" if self.training else "")

    def mesh_axes(self) -> tuple[tuple[int, ...], tuple[str, ...]]:
        """(mesh shape, axis names): the slice's, its last axis split into ("ulysses", "ring") for
        "ulysses-ring"."""
        shape, names = self.slice_.mesh_shape, self.slice_.axis_names
        if self.strategy != "ulysses-ring":
            return shape, names
        return (*shape[:-1], shape[-1] // RING_SIZE, RING_SIZE), (*names[:-1], "ulysses", "ring")


def every_case() -> list[Case]:
    """Every case ``run`` can compile: each slice and strategy at the model shape, forward and
    training step ("...-train"), and the ``LONG_STRATEGIES`` at ``LONG_GRID``."""
    model = [Case(s, strategy) for s in SLICES for strategy in STRATEGY_NAMES]
    training = [Case(s, strategy, training=True) for s in SLICES for strategy in STRATEGY_NAMES]
    return model + [Case(s, strategy, LONG_GRID) for s in SLICES for strategy in LONG_STRATEGIES] + training


def cases(only=None) -> list[Case]:
    """The cases named "<slice>-<strategy>[-1min][-train]": the forward of ``DEFAULT_STRATEGIES`` at
    both lengths, or ``only`` (e.g. "v6e-2x2-ring"). Raises ValueError naming an unknown case."""
    every = every_case()
    if not only:
        return [c for c in every if c.strategy in DEFAULT_STRATEGIES and not c.training]
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
        kernel_bodies,
        kernels_before_arrival,
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

    def step(q, k, v, do):  # the attention of a training step: o, then dq, dk, dv from do
        def loss(q, k, v):
            return jnp.sum(fn(q, k, v).astype(jnp.float32) * do.astype(jnp.float32))

        return jax.grad(loss, argnums=(0, 1, 2))(q, k, v)

    operands = 4 if case.training else 3
    start = time.perf_counter()
    compiled = jax.jit(step if case.training else fn).lower(*[arg] * operands).compile()
    seconds = time.perf_counter() - start
    memory = compiled.memory_analysis()
    text = compiled.as_text()
    kernel = registry.choose(registry.AUTO, plan.mask, backend="tpu")
    global_bytes = operands * int(np.prod(shape)) * 2
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
        "direction": "training" if case.training else "forward",
        "shape": list(shape),
        "grid": list(case.grid),
        "impl": kernel.name,
        "branches": branches,
        "hops_issued": hops,
        "kernels_in_program": len(  # its forward's and, in a training step, its backward's
            {name for name in re.findall(r"%([\w.]+) = ", text) if kernel.owns_kernel(name)}
        ),
        "kernel_bodies": kernel_bodies(text)[1],  # what libtpu compiles: one Mosaic kernel per body
        "compile_s": round(seconds, 1),
        "global_input_bytes": global_bytes,
        "argument_bytes_per_device": int(memory.argument_size_in_bytes),
        "output_bytes_per_device": int(memory.output_size_in_bytes),
        "temp_bytes_per_device": int(memory.temp_size_in_bytes),
        "all_to_all_bytes": all_to_all_bytes(text),
        "permute_bytes": permute_bytes(text),
        "kernels_before_first_arrival": kernels_before_arrival(text) if hops else None,
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


def compile_reuse(calls: int = 6, length: int = 16_384, heads: int = 8, chip: str = "v6e") -> list[dict]:
    """Deviceless compile time for ``chip`` of one program that sums ``calls`` attention calls of the
    best tile kernel on ``heads`` x ``length`` x 128 bf16: one call of a band; ``calls`` calls of that
    same band (one kernel body, its tables the same data); and ``calls`` bands of different widths (a
    kernel body each). Per program: its kernel calls, distinct bodies and compile seconds.

    >>> rows = compile_reuse(calls=2, length=1024, heads=1)
    >>> [(r["program"], r["kernel_calls"], r["kernel_bodies"]) for r in rows]
    [('one band once', 1, 1), ('one band 2 times', 2, 1), ('2 bands of different widths', 2, 2)]
    """
    import jax
    import jax.numpy as jnp

    from stlib import masks, registry
    from stlib.api import attention
    from stlib.bench.collectives import kernel_bodies
    from stlib.device import compile_for_tpu
    from stlib.registry import Role

    kernel = registry.by_role(Role.BEST_TILE).name
    shape = jax.ShapeDtypeStruct((heads, length, HEAD_DIM), jnp.bfloat16)
    band = masks.band(length, length // 8)
    programs = {
        "one band once": [band],
        f"one band {calls} times": [band] * calls,
        f"{calls} bands of different widths": [
            masks.band(length, length // 8 + 256 * i) for i in range(calls)
        ],
    }
    rows = []
    for name, bands in programs.items():

        def program(q, k, v, bands=bands):  # each call on its own q, so no two calls are one
            outs = [
                attention(q * (i + 1), k, v, m, impl=kernel, interpret=False) for i, m in enumerate(bands)
            ]
            return sum(o.astype(jnp.float32) for o in outs)

        start = time.perf_counter()
        compiled = compile_for_tpu(program, shape, shape, shape, chip=chip)
        seconds = time.perf_counter() - start
        found, distinct = kernel_bodies(compiled.text())
        rows.append({"program": name, "kernel_calls": found, "kernel_bodies": distinct, "compile_s": seconds})
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m stlib.bench.slice_compile", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run_parser = sub.add_parser("run", help="compile the model-shape cases for their slices (no TPU needed)")
    run_parser.add_argument("--only", nargs="*", help="case names, e.g. v6e-2x2-ulysses")
    sub.add_parser("table", help="the communication table from the records")
    sub.add_parser("reuse", help="compile time of one kernel body called many times (no TPU needed)")
    args = parser.parse_args(argv)
    if args.command == "reuse":
        for row in compile_reuse():
            print(
                f"{row['program']:<30} {row['kernel_calls']} kernel calls, {row['kernel_bodies']} bodies: "
                f"compiled for v6e in {row['compile_s']:.1f} s"
            )
        return
    if args.command == "run":
        run(args.only)
    from stlib.bench import backward_estimate, block_sweep

    rows = table(read(), block_sweep.read(), backward_estimate.read())
    print(format_table(rows))
    print("\nthe fastest strategy on a sequence split, per density (modelled ms per call):")
    print(format_fastest(fastest(rows)))


if __name__ == "__main__":
    main()
