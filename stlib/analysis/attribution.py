"""Attribution: the bundles of one compiled Pallas kernel per control path (outside the grid loop,
per grid-loop iteration, per grid step, and per ``pl.when`` region of the step: row init, tile
compute, row finalisation), read from its parsed schedule."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from stlib.analysis.mxu_input import KernelMxu
from stlib.analysis.schedule import Node, Schedule, ScheduleFormatError, flat_cost

_BOUNDS = re.compile(r"iteration_bounds: \(([\d, ]+)\)")
# an operand's memory space: "hbm", "vmem", ..., or "<no memory space>" (a one-element scalar-prefetch
# table passed in a register)
_OPERAND = re.compile(
    r"inlined_call_operand\.(\w+|<no memory space>) \[shape: (\w+)\[([\d,]*)\], index: (\d+), kind: (\w+)"
)


@dataclass(frozen=True)
class Attribution:
    """Bundles per execution of each path of one compiled kernel.

    ``paths``: "call" (outside the grid loop, once), "iteration" (grid loop outside the step
    region, steps + 2 times; conditional copy regions beside the step region are counted in it at
    every iteration: an upper bound), "step" (every grid step), then per region "init", "compute",
    "compute_full", "compute_masked", "finalise" (when it runs). ``mxu_cycles``: per execution of
    a path with MXU ops, the cycles its busiest MXU is fed (``stlib.analysis.mxu_input``; empty when
    the dump had no per-bundle utilization)."""

    kernel: str
    trip: int
    grid: tuple[int, ...] | None  # from the dump's DMA bounds checks (None: not named there)
    paths: dict[str, int]
    ops: dict[str, dict[str, int]]
    total_bundles: int
    operands: list  # per operand index: [memory space ("hbm" / "vmem"), dtype, shape, "input" / "output"]
    mxu_cycles: dict[str, int] = field(default_factory=dict)

    @property
    def grid_steps(self) -> int:
        return self.trip - 2


def attribute(
    schedule: Schedule,
    impl: str | None,
    kernel: str,
    compute_names: list[str] | None = None,
    occupancy: list[int] | None = None,
) -> Attribution:
    """Attribute the bundles of ``schedule`` (the Pallas kernel ``kernel`` of ``impl``) to paths.
    ``compute_names``: the names of its conditional compute regions, in order, for a kernel of no
    registered implementation (``impl`` None); ``occupancy``: the compiler's MXU occupancy per
    bundle (``mxu_input.parse_utilization``), for the paths' MXU input. Raises ScheduleFormatError
    when the structure differs from the one expected."""
    loops = [n for n in schedule.roots if n.kind == "loop"]
    one_step = not loops
    if one_step and len(schedule.roots) == 1 and schedule.roots[0].kind == "cond":
        # a grid of one step: the compiler drops the grid loop and keeps the step region; read it as
        # a loop of one step (trip = steps + 2, as the grid loop's exit test counts) costing nothing
        step_region = schedule.roots[0]
        loops = [Node("loop", step_region.first, step_region.last, -1, "", 3, [step_region])]
    elif len(loops) != 1 or len(schedule.roots) != 1:
        raise ScheduleFormatError(
            f"{kernel}: expected one grid loop at top level, found "
            f"{[(n.kind, hex(n.first)) for n in schedule.roots]}"
        )
    grid_loop = loops[0]
    stages = [n for n in grid_loop.children if n.kind == "cond"]
    if len(stages) > 1:  # blocks that end past the array: their copies are issued in regions of their own
        stages = [n for n in stages if schedule.has_mxu(n)]
    if len(stages) != 1 or any(n.kind != "cond" for n in grid_loop.children):
        raise ScheduleFormatError(
            f"{kernel}: expected one conditional step region in the grid loop (and, besides "
            "it, only conditional copy regions without MXU ops)"
        )
    stage = stages[0]
    bounds = {tuple(int(x) for x in m.split(",")) for b in schedule.bundles for m in _BOUNDS.findall(b.text)}
    if len(bounds) > 1:
        raise ScheduleFormatError(f"{kernel}: more than one grid (iteration_bounds) in the dump: {bounds}")
    grid = bounds.pop() if bounds else None  # the DMA bounds checks name the grid, when there are any
    if grid is not None and grid_loop.trip != math.prod(grid) + 2:
        raise ScheduleFormatError(f"{kernel}: grid loop trip {grid_loop.trip} != prod{grid} + 2")

    conds = [c for c in stage.children if c.kind == "cond"]
    compute = [c for c in conds if schedule.has_mxu(c)]
    if compute:
        lo, hi = compute[0].first, compute[-1].last
    else:
        mxu = [i for i in range(stage.first, stage.last + 1) if "vmatmul" in schedule.bundles[i].code]
        if not mxu:
            raise ScheduleFormatError(f"{kernel}: no MXU op in the step region")
        lo, hi = mxu[0], mxu[-1]
    before = [c for c in conds if c.last < lo]
    after = [c for c in conds if c.first > hi]
    if len(before) + len(after) + len(compute) != len(conds):
        raise ScheduleFormatError(
            f"{kernel}: step region has conditional regions "
            f"{[(hex(c.first), hex(c.last), schedule.has_mxu(c)) for c in conds]}; "
            "expected [init...] compute... [finalise...]"
        )
    if compute_names is not None and len(compute_names) != len(compute):
        raise ScheduleFormatError(
            f"{kernel}: {len(compute)} conditional compute regions, named {compute_names}"
        )
    if one_step and not conds:  # its one step runs every bundle of the region once: the "step" path
        names = []
    else:
        names = compute_names if compute_names is not None else _compute_names(impl, kernel, len(compute))
    # several regions before / after the compute (a row's copy of a block that ends past the array next to
    # its init / output write) run once per row each: their bundles add up to one init / finalise path,
    # except those the kernel's rules name (a head's dq window in and out: ``_edge_names``)
    first, last = _edge_names(impl, kernel, len(before), len(after))
    labelled = list(zip(first, before)) + list(zip(names, compute)) + list(zip(last, after))

    step = stage.size - sum(c.size for c in stage.children)
    step += sum(c.trip * flat_cost(c, "step") for c in stage.children if c.kind == "loop")
    paths = {
        "call": len(schedule.bundles) - grid_loop.size,
        "iteration": grid_loop.size - stage.size,
        "step": step,
    }
    ops = {
        "call": {},
        "iteration": schedule.ops(grid_loop.first, grid_loop.last, (stage,)),
        "step": schedule.ops(stage.first, stage.last, tuple(conds)),
    }
    feed = KernelMxu.of(schedule, occupancy) if occupancy is not None else None
    mxu_cycles = {"step": feed.cycles(stage, skip_conds=True)} if feed else {}
    for name, node in labelled:
        paths[name] = paths.get(name, 0) + flat_cost(node, name)
        if feed:
            mxu_cycles[name] = mxu_cycles.get(name, 0) + feed.cycles(node)
        merged = ops.setdefault(name, {})
        for unit, n in schedule.ops(node.first, node.last).items():
            merged[unit] = merged.get(unit, 0) + n
    operands = {}
    for memory, dtype, dims, index, kind in _OPERAND.findall(schedule.bundles[0].text):
        operands[int(index)] = [memory, dtype, [int(x) for x in dims.split(",") if x], kind]
    if sorted(operands) != list(range(len(operands))):
        raise ScheduleFormatError(f"{kernel}: entry bundle lists operands {sorted(operands)}")
    return Attribution(
        kernel,
        grid_loop.trip,
        grid,
        paths,
        ops,
        len(schedule.bundles),
        [operands[i] for i in range(len(operands))],
        {path: n for path, n in mxu_cycles.items() if n},
    )


def _edge_names(impl: str | None, kernel: str, n_before: int, n_after: int) -> tuple[list[str], list[str]]:
    """The path of each conditional region before and after a step's compute: the names ``impl``'s
    rules give (``registry.Implementation.edge_regions``), by position, the regions after the named
    ones "finalise" (a row's copy of a block past the array); else "init" and "finalise" throughout,
    as also where the regions before are not the ones named."""
    from stlib import registry

    named = registry.get(impl).edge_regions(kernel) if impl is not None else None
    if named is None or len(named[0]) != n_before or len(named[1]) > n_after:
        return ["init"] * n_before, ["finalise"] * n_after
    return list(named[0]), [*named[1], *["finalise"] * (n_after - len(named[1]))]


def _compute_names(impl: str, kernel: str, n: int) -> list[str]:
    """The names of the n conditional compute regions of ``kernel``, from ``impl``'s registry entry.
    Raises ScheduleFormatError when the entry expects another number of regions."""
    from stlib import registry

    compute_regions, _ = registry.get(impl).schedule_rules(kernel)
    if compute_regions is None:
        raise ValueError(f"no attribution rules for impl={impl!r}, kernel {kernel!r}")
    expected = compute_regions(kernel, n)
    if len(expected) != n:
        raise ScheduleFormatError(
            f"{kernel}: {n} conditional compute regions, expected {len(expected)} for {impl}"
        )
    return expected
