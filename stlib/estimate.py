"""A static TPU time estimate from the compiled kernel schedule: the compiler as a stopwatch.

A kernel is compiled for a v6e / v5e chip without a TPU (``stlib.compile_report.compile_with_dump``,
libtpu's dump on) and its scheduled VLIW program (``...-final_bundles.txt``) is parsed: bundles,
their ``Start region N`` / ``End region N`` annotations, the branches ``sbr.rel (p) target =
$regionN`` (4 delay-slot bundles follow each branch), the loops (``LB`` marker, backward branch,
``loop exit test`` against the trip count). The grid loop runs steps + 2 iterations (the DMA
pipeline's fill and drain); in each, a conditional region holds the step's work, and inside it the
kernel's ``pl.when`` regions: row init, tile compute (mask-free and masked variants), row
finalisation. Bundles are attributed to these paths, multiplied by the counts of each path from
the tile layout, and turned into time through an explicit clock. A VLIW bundle issues in one
cycle; stalls (DMA waits, MXU result latency not covered by the schedule) are not in the count, so a
memory floor (HBM bytes the kernel's DMAs move / bandwidth) bounds the time from below.

Everything here is a *static estimate*, never a measurement. The dump is an internal format of the
pinned libtpu (``PINNED_LIBTPU``): a different libtpu, or a structure the parser does not know,
raises ``ScheduleFormatError``; no number is returned then.

Usage::

    python -m stlib.estimate kernel splash full --chip v6e
    python -m stlib.estimate kernel pallas_tile "band (density 0.25)" --form flat
    python -m stlib.estimate calibrate
    python -m stlib.estimate table --chip v6e
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib.metadata
import json
import math
import os
import pickle
import re
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from stlib.compile_report import _STEP, KernelConfig, compile_with_dump, is_pallas_kernel, resolve_mask
from stlib.configs import CASE_STUDY, PUBLISHED
from stlib.roofline import ComputeOrMemoryBound

PINNED_LIBTPU = "0.0.42.1"
METHOD = ("static estimate: VLIW bundles of the libtpu schedule per control path (1 bundle = 1 cycle, no "
          "stalls) x path counts from the tile layout / clock, floored by kernel DMA bytes / HBM bandwidth")
#: Bundles issued after a branch before it takes effect (libtpu 0.0.42.1, v5e and v6e).
DELAY_SLOTS = 4
#: Bumped when the attribution format or rules change (invalidates the cache).
FORMAT_VERSION = 1
PUBLISHED_DENSE_SPLASH_SECONDS = PUBLISHED["dense_splash_ms"] * 1e-3


class ScheduleFormatError(RuntimeError):
    """The libtpu dump is not in the format (or structure) this estimator understands."""


# ============================================================================================
# 1. the scheduled program: bundles, branches, loops


_KEY = ("= control target key start", "LH: loop header", "LB: loop body", "LE: loop exit",
        "PB: predicated region body", "PF: predicated region fallthrough", "CT: control target",
        "= control target key end")
_BUNDLE = re.compile(r"^\s*(0x[0-9a-f]+|0)\s+(?:([A-Z]{2}):|:)\s*(>*)\s*\{")
_REGION = re.compile(r"(Start/End empty region|Start region|End region) (\d+)")
_BRANCH = re.compile(r"sbr\.rel \((!?)(%p\w+)\) target = \$region(\d+)")
_EXIT = re.compile(r"(%p\w+) = scmp\.ge\.s32\.totalorder %s\w+, (\d+) /\* loop exit test \*/")
_CONTROL = ("sbr", "sjmp", "scall", "sret", "br.", "jmp", "call", "ret")
_OP = re.compile(r"%[\w.]+ = ([a-z_][\w.\-]*)")
_COMMENT = re.compile(r"/\*.*?\*/", re.DOTALL)
_TOTAL = re.compile(r"total scheduled bundles:\s+(\d+)")
_BOUNDS = re.compile(r"iteration_bounds: \(([\d, ]+)\)")
_OPERAND = re.compile(r"inlined_call_operand\.(\w+) \[shape: (\w+)\[([\d,]*)\], index: (\d+), kind: (\w+)")


@dataclass(frozen=True)
class Bundle:
    address: int
    marker: str  # "LB", "LH", "LE", "PB", "PF", "CT" or ""
    text: str  # the bundle and its continuation lines

    @property
    def code(self) -> str:
        """The ops without comments."""
        return _COMMENT.sub("", self.text)


@dataclass
class Node:
    """A loop (body ``first..last``, ``trip`` iterations) or a conditional region (bundles
    ``first..last`` skipped when the branch at ``branch`` is taken), with the nodes nested in it."""

    kind: str  # "loop" or "cond"
    first: int
    last: int
    branch: int
    predicate: str
    trip: int | None = None
    children: list = field(default_factory=list)

    @property
    def size(self) -> int:
        return self.last - self.first + 1


@dataclass
class Schedule:
    bundles: list[Bundle]
    roots: list[Node]

    def has_mxu(self, node: Node) -> bool:
        return any("vmatmul" in b.code for b in self.bundles[node.first:node.last + 1])

    def ops(self, first: int, last: int, skip: tuple[Node, ...] = ()) -> dict[str, int]:
        """Op counts by unit over bundles first..last, outside the ranges of ``skip``."""
        out: dict[str, int] = {}
        for i in range(first, last + 1):
            if any(n.first <= i <= n.last for n in skip):
                continue
            for op in _OP.findall(self.bundles[i].code):
                unit = _unit(op)
                out[unit] = out.get(unit, 0) + 1
        return out


def _unit(op: str) -> str:
    if "mxu" in op or op.startswith("vmat"):
        return "mxu"
    if "eup" in op or op.split(".")[0] in ("vpow2", "vexp", "vrcp", "vlog2", "vtanh", "vrsqrt", "vlog"):
        return "eup"
    if "xlu" in op:
        return "xlu"
    if op.startswith(("vld", "vst")):
        return "vmem"
    if op.startswith("dma"):
        return "dma"
    if op.startswith("v"):
        return "valu"
    return "scalar"


def parse_bundles(text: str) -> list[Bundle]:
    """The bundles of a ``...-final_bundles.txt`` dump. Raises ScheduleFormatError when the marker
    key, the bundle syntax or the addressing differ from libtpu 0.0.42.1's."""
    lines = text.split("\n")
    if tuple(line.strip() for line in lines[:len(_KEY)]) != _KEY:
        raise ScheduleFormatError("final_bundles dump does not start with the control-target key of libtpu "
                                  f"{PINNED_LIBTPU}: {lines[:3]!r}")
    bundles: list[list] = []
    for line in lines[len(_KEY):]:
        match = _BUNDLE.match(line)
        if match:
            bundles.append([int(match[1], 16) if match[1] != "0" else 0, match[2] or "", line])
        elif bundles:
            bundles[-1][2] += "\n" + line
        elif line.strip():
            raise ScheduleFormatError(f"unexpected line before the first bundle: {line[:120]!r}")
    if not bundles:
        raise ScheduleFormatError("no bundles found in the final_bundles dump")
    for i, (address, _, _) in enumerate(bundles):
        if address != i:
            raise ScheduleFormatError(f"bundle {i} has address {address:#x}: bundles are not contiguous")
    return [Bundle(a, m, t) for a, m, t in bundles]


def parse_schedule(text: str, analysis: str | None = None) -> Schedule:
    """Bundles plus the loop / conditional-region tree of a final_bundles dump. ``analysis`` (the
    ``...-schedule-analysis_final_bundles.txt`` text) is cross-checked against the bundle count.
    Raises ScheduleFormatError on any structure this parser does not know."""
    bundles = parse_bundles(text)
    if analysis is not None:
        total = _TOTAL.search(analysis)
        if total is None:
            raise ScheduleFormatError("schedule analysis has no 'total scheduled bundles' line")
        if int(total[1]) != len(bundles):
            raise ScheduleFormatError(f"schedule analysis counts {total[1]} bundles, the dump has {len(bundles)}")
    starts: dict[int, int] = {}
    for b in bundles:
        for what, region in _REGION.findall(b.text):
            if what != "End region":
                starts.setdefault(int(region), b.address)
    nodes = []
    for b in bundles:
        code = b.code
        for op in _OP.findall(code):
            if op.startswith(_CONTROL) and op != "sbr.rel":
                raise ScheduleFormatError(f"unknown control op {op!r} at bundle {b.address:#x}")
        branches = _BRANCH.findall(code)
        if code.count("sbr.rel") != len(branches) or len(branches) > 1:
            raise ScheduleFormatError(f"unparsed branch at bundle {b.address:#x}: {code[:200]!r}")
        if not branches:
            continue
        negated, predicate, region = branches[0]
        if int(region) not in starts:
            raise ScheduleFormatError(f"branch at {b.address:#x} targets region {region}, which never starts")
        target, a = starts[int(region)], b.address
        if a + DELAY_SLOTS >= len(bundles) or "End region" not in bundles[a + DELAY_SLOTS].text:
            raise ScheduleFormatError(f"branch at {a:#x}: no region ends {DELAY_SLOTS} delay slots later")
        if target <= a:
            nodes.append(_loop(bundles, target, a, negated, predicate))
        else:
            if bundles[target].marker != "PF":
                raise ScheduleFormatError(f"forward branch at {a:#x} lands on {target:#x}, not a PF bundle")
            if a + DELAY_SLOTS + 1 <= target - 1:
                nodes.append(Node("cond", a + DELAY_SLOTS + 1, target - 1, a, negated + predicate))
    for b in bundles:
        if b.marker == "LB" and not any(n.kind == "loop" and n.first == b.address for n in nodes):
            raise ScheduleFormatError(f"loop body marker at {b.address:#x} without a backward branch to it")
        if b.marker not in ("", "LB", "PF"):  # LH, LE, PB, CT: never seen in Pallas kernels of this libtpu
            raise ScheduleFormatError(f"marker {b.marker} at {b.address:#x}: a control structure this parser "
                                      "does not know")
    return Schedule(bundles, _nest(nodes))


def _loop(bundles, target: int, branch: int, negated: str, predicate: str) -> Node:
    if bundles[target].marker != "LB":
        raise ScheduleFormatError(f"backward branch at {branch:#x} targets {target:#x}, not a loop body (LB)")
    exits = [m for b in bundles[target:branch + 1] for m in _EXIT.findall(b.text) if m[0] == predicate]
    if negated != "!" or len(exits) != 1:
        raise ScheduleFormatError(f"loop {target:#x}..{branch:#x}: expected one 'loop exit test' defining "
                                  f"{predicate} and a branch on its negation")
    return Node("loop", target, branch + DELAY_SLOTS, branch, negated + predicate, trip=int(exits[0][1]))


def _nest(nodes: list[Node]) -> list[Node]:
    roots: list[Node] = []
    stack: list[Node] = []
    for node in sorted(nodes, key=lambda n: (n.first, -n.last, n.kind != "loop")):
        while stack and node.first > stack[-1].last:
            stack.pop()
        if stack and node.last > stack[-1].last:
            raise ScheduleFormatError(f"{node.kind} {node.first:#x}..{node.last:#x} overlaps "
                                      f"{stack[-1].kind} {stack[-1].first:#x}..{stack[-1].last:#x}")
        (stack[-1].children if stack else roots).append(node)
        stack.append(node)
    return roots


def _flat_cost(node: Node, where: str) -> int:
    """Bundles to run ``node``'s range once, inner loops times their trips; a conditional region
    inside it cannot be attributed and raises."""
    total = node.size
    for child in node.children:
        if child.kind == "cond":
            raise ScheduleFormatError(f"unattributed branch at {child.branch:#x} inside the {where} region")
        total += child.trip * _flat_cost(child, where) - child.size
    return total


# ============================================================================================
# 2. attribution: bundles per control path of one Pallas kernel


@dataclass(frozen=True)
class Attribution:
    """Bundles per execution of each path of one compiled kernel.

    ``paths``: "call" (outside the grid loop, once), "iteration" (grid loop outside the step
    region, steps + 2 times), "step" (every grid step), then per region "init", "compute",
    "compute_full", "compute_masked", "finalise" (when it runs)."""

    kernel: str
    trip: int
    grid: tuple[int, ...] | None  # from the dump's DMA bounds checks (None: not named there)
    paths: dict[str, int]
    ops: dict[str, dict[str, int]]
    total_bundles: int
    operands: list  # per operand index: [memory space ("hbm" / "vmem"), dtype, shape, "input" / "output"]

    @property
    def grid_steps(self) -> int:
        return self.trip - 2


def attribute(schedule: Schedule, impl: str, kernel: str) -> Attribution:
    """Attribute the bundles of ``schedule`` (the Pallas kernel ``kernel`` of ``impl``) to paths.
    Raises ScheduleFormatError when the structure differs from the one expected for ``impl``."""
    loops = [n for n in schedule.roots if n.kind == "loop"]
    if len(loops) != 1 or len(schedule.roots) != 1:
        raise ScheduleFormatError(f"{kernel}: expected one grid loop at top level, found "
                                  f"{[(n.kind, hex(n.first)) for n in schedule.roots]}")
    grid_loop = loops[0]
    stages = [n for n in grid_loop.children if n.kind == "cond"]
    if len(stages) != 1 or len(grid_loop.children) != 1:
        raise ScheduleFormatError(f"{kernel}: expected one conditional step region in the grid loop")
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
    if len(before) > 1 or len(after) > 1 or len(before) + len(after) + len(compute) != len(conds):
        raise ScheduleFormatError(f"{kernel}: step region has conditional regions "
                                  f"{[(hex(c.first), hex(c.last), schedule.has_mxu(c)) for c in conds]}; "
                                  "expected [init] compute... [finalise]")
    names = _compute_names(impl, kernel, len(compute))
    labelled = [("init", c) for c in before] + list(zip(names, compute)) + [("finalise", c) for c in after]

    step = stage.size - sum(c.size for c in stage.children)
    step += sum(c.trip * _flat_cost(c, "step") for c in stage.children if c.kind == "loop")
    paths = {"call": len(schedule.bundles) - grid_loop.size, "iteration": grid_loop.size - stage.size, "step": step}
    ops = {"call": {}, "iteration": schedule.ops(grid_loop.first, grid_loop.last, (stage,)),
           "step": schedule.ops(stage.first, stage.last, tuple(conds))}
    for name, node in labelled:
        paths[name] = _flat_cost(node, name)
        ops[name] = schedule.ops(node.first, node.last)
    operands = {}
    for memory, dtype, dims, index, kind in _OPERAND.findall(schedule.bundles[0].text):
        operands[int(index)] = [memory, dtype, [int(x) for x in dims.split(",") if x], kind]
    if sorted(operands) != list(range(len(operands))):
        raise ScheduleFormatError(f"{kernel}: entry bundle lists operands {sorted(operands)}")
    return Attribution(kernel, grid_loop.trip, grid, paths, ops, len(schedule.bundles),
                       [operands[i] for i in range(len(operands))])


def _compute_names(impl: str, kernel: str, n: int) -> list[str]:
    if impl == "splash":
        expected = ["compute"]
    elif impl == "pallas_dense":
        expected = []
    elif impl == "pallas_block_sparse":
        expected = ["compute_full", "compute_masked"][:n] if n in (1, 2) else ["?"]
    elif impl == "pallas_tile":
        expected = ["compute_full" if kernel.startswith("stlib_tile_full") else "compute_masked"]
    else:
        raise ValueError(f"no attribution rules for impl={impl!r}")
    if len(expected) != n:
        raise ScheduleFormatError(f"{kernel}: {n} conditional compute regions, expected {len(expected)} for {impl}")
    return expected


# ============================================================================================
# 3. compiling, probing and caching


def libtpu_version() -> str:
    return importlib.metadata.version("libtpu")


def check_libtpu() -> str:
    """The installed libtpu version; raises ScheduleFormatError unless it is the pinned one."""
    version = libtpu_version()
    if version != PINNED_LIBTPU:
        raise ScheduleFormatError(f"libtpu {version} is installed; the dump parser knows libtpu {PINNED_LIBTPU} only")
    return version


def cache_dir() -> Path:
    return Path(os.environ.get("STLIB_CACHE_DIR", Path.home() / ".cache" / "stlib")) / "estimate"


def _source_hash() -> str:
    """Hash of the sources that shape the compiled kernels (a kernel edit invalidates the cache)."""
    root = Path(__file__).parent
    digest = hashlib.sha256()
    for path in sorted([*root.glob("kernels/*.py"), root / "masks.py", root / "layout.py", root / "geometry.py"]):
        digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()[:16]


def compiled_attributions(impl: str, config: KernelConfig, mask_bytes: bytes | None = None,
                          use_cache: bool = True) -> dict:
    """{"kernels": [Attribution as dict], "glue_bytes": int, "compile_seconds": float} of ``config``,
    compiled in a subprocess and attributed; cached on disk by libtpu version and config."""
    version = check_libtpu()
    key_data = {"format": FORMAT_VERSION, "libtpu": version, "jax": importlib.metadata.version("jax"),
                "source": _source_hash(), "config": dataclasses.asdict(dataclasses.replace(config, mask_file=None)),
                "mask": hashlib.sha256(mask_bytes).hexdigest() if mask_bytes else None}
    key = hashlib.sha256(json.dumps(key_data, sort_keys=True).encode()).hexdigest()[:24]
    path = cache_dir() / version / f"{key}.json"
    if use_cache and path.exists():
        return json.loads(path.read_text())
    with tempfile.TemporaryDirectory(prefix="stlib-estimate-") as dump:
        if mask_bytes is not None:
            config = dataclasses.replace(config, mask_file=os.path.join(dump, "mask.pkl"))
            Path(config.mask_file).write_bytes(mask_bytes)
        seconds = compile_with_dump(config, dump)
        found = _dump_files(dump)
        kernels = []
        for name, (text, analysis) in sorted(found.items()):
            attribution = attribute(parse_schedule(text, analysis), impl, name)
            kernels.append(dataclasses.asdict(attribution))
        glue = glue_bytes(_read_hlo(dump))
    result = {"key": key_data, "kernels": kernels, "glue_bytes": glue, "compile_seconds": seconds}
    if use_cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(result, indent=1))
        tmp.replace(path)
    return result


def _dump_files(directory: str) -> dict[str, tuple[str, str]]:
    files: dict[str, dict[str, str]] = {}
    for name in os.listdir(directory):
        match = _STEP.match(name)
        if match and is_pallas_kernel(match["kernel"]) and match["what"] in ("final_bundles",
                                                                        "schedule-analysis_final_bundles"):
            entry = files.setdefault(match["kernel"], {})
            if match["what"] in entry:
                raise ScheduleFormatError(f"two {match['what']} dumps for kernel {match['kernel']}")
            entry[match["what"]] = Path(directory, name).read_text(errors="replace")
    if not files or any(len(v) != 2 for v in files.values()):
        raise ScheduleFormatError(f"no final_bundles + schedule-analysis pair per Pallas kernel in {directory}: "
                                  f"{ {k: sorted(v) for k, v in files.items()} }")
    return {k: (v["final_bundles"], v["schedule-analysis_final_bundles"]) for k, v in files.items()}


def _read_hlo(directory: str) -> str:
    names = [n for n in os.listdir(directory) if n.endswith("-TLP-hlo.txt")]
    if len(names) != 1:
        raise ScheduleFormatError(f"expected one ...-TLP-hlo.txt in the dump, found {names}")
    return Path(directory, names[0]).read_text(errors="replace")


_ITEMSIZE = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4, "s32": 4,
             "u32": 4, "f64": 8, "s64": 8, "u64": 8}
_ARRAY = re.compile(r"\b(pred|[fsu]\d+|bf16)\[([\d,]*)\]\{([^}]*)\}")
_INSTR = re.compile(r"^\s*(?:ROOT )?(%[\w.\-]+) = (\(.*?\)|\S+) ([\w\-]+)\(([^)]*)\)")
_NOT_GLUE = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "custom-call", "copy-done",
             "after-all", "partition-id", "replica-id"}


def glue_bytes(hlo: str) -> int:
    """HBM bytes read and written by the XLA ops around the kernels (padding, scaling, merging,
    slicing) in the entry computation of the scheduled HLO: outputs plus operands of every op that
    is not a kernel call or a no-op. Arrays placed in other memory spaces (layout ``S(n)``) are
    left out."""
    entry = hlo[hlo.index("\nENTRY"):] if "\nENTRY" in hlo else ""
    if not entry:
        raise ScheduleFormatError("no ENTRY computation in the scheduled HLO")
    sizes: dict[str, int] = {}
    total = 0
    for line in entry.split("\n")[1:]:
        match = _INSTR.match(line)
        if not match:
            continue
        name, shape, opcode, operands = match.groups()
        size = sum(_ITEMSIZE[t] * math.prod(int(d) for d in dims.split(",") if d)
                   for t, dims, layout in _ARRAY.findall(shape) if "S(" not in layout)
        sizes[name] = size
        if opcode not in _NOT_GLUE:
            total += size + sum(sizes.get(op, 0) for op in re.findall(r"%[\w.\-]+", operands))
    return total


# ============================================================================================
# 4. counts of each path, and DMA bytes, from the layout


@dataclass(frozen=True)
class PathCounts:
    """Executions of each path of one kernel call (all heads) and the HBM bytes its DMAs move."""

    counts: dict[str, int]
    grid_steps: int
    dma_bytes: int


def _changes(seq) -> int:
    """Block fetches of a pipelined operand whose block index runs through ``seq`` in grid order
    (a fetch wherever the index differs from the previous step's)."""
    seq = np.asarray(seq).reshape(-1)
    return 0 if seq.size == 0 else 1 + int(np.count_nonzero(seq[1:] != seq[:-1]))


@dataclass(frozen=True)
class Setup:
    """The kernel call as the compile subprocess traces it, resolved in this process."""

    impl: str
    mask: object  # stlib Mask or None
    length: int  # tokens the kernel sees (mask.length)
    num_heads: int
    head_dim: int
    itemsize: int
    block_q: int
    block_kv: int
    block_kv_compute: int | None
    options: dict

    @property
    def layout(self):
        from stlib import masks

        return _layout(self.mask if self.mask is not None else masks.full(self.length), self.block_q, self.block_kv)


_LAYOUTS: dict = {}


def _layout(mask, block_q: int, block_kv: int):
    from stlib.layout import block_layout

    key = (repr(mask), mask.length, block_q, block_kv)
    if key not in _LAYOUTS:
        _LAYOUTS[key] = block_layout(mask, block_q, block_kv)
    return _LAYOUTS[key]


def _hbm_roles(att: Attribution, head_dim: int) -> dict[str, bool]:
    """Which of q, k, v, o, lse the kernel moves through HBM: XLA may place whole operands in VMEM
    (small shapes), and then the kernel's pipeline moves nothing for them."""
    inputs = [op for op in att.operands if op[3] == "input" and len(op[2]) == 3 and op[2][-1] == head_dim]
    outputs = [op for op in att.operands if op[3] == "output" and len(op[2]) == 3]
    o = [op for op in outputs if op[2][-1] == head_dim]
    lse = [op for op in outputs if op[2][-1] == 1]
    if len(inputs) != 3 or len(o) != 1 or len(lse) > 1:
        raise ScheduleFormatError(f"{att.kernel}: cannot tell q, k, v, o apart among operands {att.operands}")
    roles = {name: op[0] == "hbm" for name, op in zip("qkv", inputs)}
    return {**roles, "o": o[0][0] == "hbm", "lse": bool(lse) and lse[0][0] == "hbm"}


def path_counts(setup: Setup, att: Attribution) -> PathCounts:
    """Executions of each path of the kernel ``att.kernel`` (one pallas_call of ``setup.impl``) and
    the HBM bytes of its q / k / v block fetches and o / lse block writes."""
    d, item = setup.head_dim, setup.itemsize
    if setup.impl == "splash":
        counts, steps, q_rows, kv_fetches, bq, bkv, out_item = _splash_counts(setup, att)
        lse = 0
    else:
        counts, steps, q_rows, kv_fetches, out_item, lse = _stlib_counts(setup, att.kernel)
        bq, bkv = setup.block_q, setup.block_kv
    hbm = _hbm_roles(att, d)
    nbytes = (q_rows * bq * d * (item * hbm["q"] + out_item * hbm["o"] + lse * 4 * hbm["lse"] / d)
              + kv_fetches * bkv * d * item * (hbm["k"] + hbm["v"]))
    return PathCounts(counts, steps, int(nbytes))


def _stlib_counts(setup: Setup, kernel: str):
    """(path counts, grid steps, q-row visits, kv-tile fetches, output itemsize, writes lse)."""
    h, item = setup.num_heads, setup.itemsize
    layout = setup.layout
    nq, nk = layout.grid_shape
    mult = h if layout.num_heads == 1 else 1
    heads = np.arange(h)[:, None, None]
    rows = {"init": h * nq, "finalise": h * nq}
    if setup.impl == "pallas_dense":
        kv = np.broadcast_to(heads * nk + np.arange(nk), (h, nq, nk))
        return rows, h * nq * nk, h * nq, _changes(kv), item, 0
    if setup.impl == "pallas_block_sparse":
        from stlib.kernels.block_sparse import MASK_FREE, MASKED, step_table

        table = step_table(layout)
        counts = {**rows, "compute_full": int(np.sum((table & 3) == MASK_FREE)) * mult,
                  "compute_masked": int(np.sum((table & 3) == MASKED)) * mult}
        kv = heads * nk + np.broadcast_to(table >> 2, (h, nq, nk))
        return counts, h * nq * nk, h * nq, _changes(kv), item, 0
    if setup.impl != "pallas_tile":
        raise ValueError(f"no path counts for impl={setup.impl!r}")
    from stlib.kernels.tile import TileOptions, split_passes
    from stlib.layout import flat_steps, row_tables

    options = TileOptions(**setup.options)
    passes = split_passes(layout, options.boundary)
    this = next(p for p in passes if kernel.startswith(f"stlib_tile_{p.name}"))
    selected = this.selected
    out_item = 4 if len(passes) > 1 else item  # f32 partial results to merge
    name = "compute_full" if this.name == "full" else "compute_masked"
    if options.form == "rows":
        tiles, row_counts = row_tables(selected)
        kv = heads * nk + np.broadcast_to(tiles, (h,) + tiles.shape[1:])
        counts = {**rows, name: int(row_counts.sum()) * mult}
        return counts, h * nq * tiles.shape[2], h * nq, _changes(kv), out_item, 1
    flat = flat_steps(selected)
    groups = np.arange(mult)[:, None]
    kv = (groups + flat["step_head"]) * nk + flat["step_kv"]
    q = (groups + flat["step_head"]) * nq + flat["step_q"]
    first = int(flat["step_first"].sum()) * mult
    counts = {"init": first, "finalise": first, name: int(flat["step_active"].sum()) * mult}
    return counts, flat["step_q"].size * mult, _changes(q), _changes(kv), out_item, 1


def _splash_counts(setup: Setup, att: Attribution):
    """Splash's grid (from the dump) is H x q tiles x (widest row of non-empty kv tiles); every
    non-empty tile of its padded mask is computed (its masking is branch-free), and a kv tile is
    fetched once per non-empty tile (data_next)."""
    from stlib import masks
    from stlib.kernels.block_sparse import step_table
    from stlib.kernels.splash import splash_blocks

    blocks = splash_blocks(setup.length, setup.block_q, setup.block_kv)
    padded = blocks.padded_length(setup.length)
    mask = setup.mask
    if mask is None or isinstance(mask, masks.FullMask):
        padded_mask = masks.full(padded)
    elif isinstance(mask, masks.BandMask):
        padded_mask = masks.band(padded, mask.width)
    else:
        raise NotImplementedError(f"the Splash estimate knows full and band masks, not {mask!r}")
    if att.grid is None:
        raise ScheduleFormatError(f"{att.kernel}: the dump does not name Splash's grid")
    layout = _layout(padded_mask, blocks.block_q, blocks.block_kv)
    nq, nk = layout.grid_shape
    h = setup.num_heads
    if att.grid[:2] != (h, nq):
        raise ScheduleFormatError(f"{att.kernel}: grid {att.grid} does not start with (heads, q tiles) = {(h, nq)}")
    kv = np.arange(h)[:, None, None] * nk + np.broadcast_to(step_table(layout) >> 2, (h, nq, nk))
    counts = {"init": h * nq, "finalise": h * nq, "compute": int(np.sum(layout.kinds != 0)) * h}
    return counts, att.grid_steps, h * nq, _changes(kv), blocks.block_q, blocks.block_kv, setup.itemsize


# ============================================================================================
# 5. clocks and the calibration


def peak_clock_hz(chip: str) -> float:
    """bf16 peak / (2 flops x MXUs x MXU width^2), all from JAX's chip table. Caveat: the table
    gives v6e 2 MXUs of 256 (3.5 GHz from this formula); some Google pages say 4 (1.75 GHz)."""
    from jax._src.pallas.mosaic import tpu_info
    from jax.experimental.pallas import tpu as pltpu

    info = pltpu.get_tpu_info_for_chip(tpu_info.ChipVersion(chip), 1)
    return info.bf16_ops_per_second / (2 * info.num_mxus * info.mxu_column_size**2)


@dataclass(frozen=True)
class Calibration:
    """The one calibration used throughout: the clock at which the static cycles of dense Splash
    (impl "splash", mask "full", the adapter's default blocks 512 / 1024 / 512, case-study shape,
    v6e) take the published 78.70 ms. It folds the stalls the static count misses into the clock.
    Other chips scale it by the ratio of their peak-implied clocks (an assumption: the same
    fraction of the clock lost to stalls)."""

    static_cycles: int
    implied_clock_hz: float
    published_seconds: float = PUBLISHED_DENSE_SPLASH_SECONDS

    def clock_hz(self, chip: str) -> float:
        return self.implied_clock_hz * peak_clock_hz(chip) / peak_clock_hz("v6e")

    def describe(self, chip: str) -> str:
        return (f"calibrated: {self.clock_hz(chip) / 1e9:.3f} GHz effective = clock at which dense Splash's "
                f"{self.static_cycles:,} static v6e cycles (blocks 512/1024/512) take the published "
                f"{self.published_seconds * 1e3:.2f} ms" + ("" if chip == "v6e" else
                f", scaled by peak-implied clocks {chip}/v6e"))


_CALIBRATION: Calibration | None = None


def calibration(use_cache: bool = True) -> Calibration:
    global _CALIBRATION
    if _CALIBRATION is None or not use_cache:
        reference = estimate("splash", "full", "v6e", clock=1.0, use_cache=use_cache)
        if reference.memory_seconds >= PUBLISHED_DENSE_SPLASH_SECONDS:
            raise RuntimeError("dense Splash's memory floor exceeds its published time: cannot calibrate a clock")
        _CALIBRATION = Calibration(reference.cycles, reference.cycles / PUBLISHED_DENSE_SPLASH_SECONDS)
    return _CALIBRATION


def _clock(clock, chip: str, use_cache: bool) -> tuple[float, str]:
    if clock == "calibrated":
        cal = calibration(use_cache)
        return cal.clock_hz(chip), cal.describe(chip)
    if clock == "peak":
        hz = peak_clock_hz(chip)
        return hz, f"peak-implied: {hz / 1e9:.3f} GHz = bf16 peak / (2 x MXUs x width^2) from JAX's chip table"
    if isinstance(clock, (int, float)) and clock > 0:
        return float(clock), f"given: {clock / 1e9:.3f} GHz"
    raise ValueError(f"clock={clock!r} must be 'calibrated', 'peak' or a positive frequency in Hz")


# ============================================================================================
# 6. the estimate


@dataclass(frozen=True)
class KernelEstimate(ComputeOrMemoryBound):
    kernel: str
    grid_steps: int
    cycles: int
    breakdown: dict[str, dict]  # path -> {"bundles": per execution, "count": executions, "cycles"}
    compute_seconds: float
    dma_bytes: int
    memory_seconds: float


@dataclass(frozen=True)
class Estimate:
    """A static estimate of one attention call on a chip: kernels only (``seconds``), with the XLA
    glue around them (padding, merging) as a separate memory floor (``glue_seconds``)."""

    impl: str
    mask: str
    chip: str
    config: dict
    kernels: tuple[KernelEstimate, ...]
    clock_hz: float
    clock_assumption: str
    glue_bytes: int
    glue_seconds: float
    libtpu_version: str
    method: str = METHOD

    @property
    def cycles(self) -> int:
        return sum(k.cycles for k in self.kernels)

    @property
    def compute_seconds(self) -> float:
        return sum(k.compute_seconds for k in self.kernels)

    @property
    def memory_seconds(self) -> float:
        return sum(k.memory_seconds for k in self.kernels)

    @property
    def seconds(self) -> float:
        return sum(k.seconds for k in self.kernels)

    def path_bundles(self) -> dict[str, int]:
        """Bundles one grid step costs on each path: "skipped step" (grid-loop iteration + step
        overhead), "tile" / "FULL tile" / "masked tile" (the same plus the kernel's compute region;
        "tile" for a kernel whose compute is unconditional). Row init / finalisation not included."""
        names = {"compute": "tile", "compute_full": "FULL tile", "compute_masked": "masked tile"}
        out: dict[str, int] = {}
        for k in self.kernels:
            b = {p: v["bundles"] for p, v in k.breakdown.items()}
            base = b["iteration"] + b["step"]
            if not any(p in b for p in names):
                out["tile"] = base
                continue
            out.setdefault("skipped step", base)
            out.update({label: base + b[p] for p, label in names.items() if p in b})
        return out

    def as_record(self) -> dict:
        """Flat fields for a benchmark record (all labelled as a static estimate)."""
        return {
            "estimate_method": self.method,
            "estimate_static": True,
            "estimate_chip": self.chip,
            "estimate_ms": self.seconds * 1e3,
            "estimate_compute_ms": self.compute_seconds * 1e3,
            "estimate_memory_floor_ms": self.memory_seconds * 1e3,
            "estimate_glue_floor_ms": self.glue_seconds * 1e3,
            "estimate_cycles": self.cycles,
            "estimate_clock_hz": self.clock_hz,
            "estimate_clock_assumption": self.clock_assumption,
            "estimate_libtpu": self.libtpu_version,
            "estimate_breakdown": {k.kernel: k.breakdown for k in self.kernels},
        }

    def __str__(self) -> str:
        lines = [(f"STATIC ESTIMATE (not a measurement) {self.impl} / {self.mask} on {self.chip}: "
                  f"{self.seconds * 1e3:.2f} ms"),
                 f"  clock: {self.clock_assumption}",
                 f"  libtpu {self.libtpu_version}; {self.method}"]
        for k in self.kernels:
            lines.append(f"  kernel {k.kernel}: {k.grid_steps:,} grid steps, {k.cycles:,} cycles -> compute "
                         f"{k.compute_seconds * 1e3:.2f} ms, DMA floor {k.memory_seconds * 1e3:.2f} ms "
                         f"({k.dma_bytes / 1e9:.2f} GB), {k.bound}-bound")
            for path, v in k.breakdown.items():
                lines.append(f"    {path:<15} {v['bundles']:>7,} bundles x {v['count']:>11,} = "
                             f"{v['cycles']:>15,} cycles ({v['cycles'] / max(k.cycles, 1):6.1%})")
        lines.append(f"  XLA glue around the kernels (memory floor, not included): {self.glue_seconds * 1e3:.3f} ms")
        return "\n".join(lines)


def setup_for(impl: str, config: KernelConfig, mask) -> Setup:
    """Resolve block sizes and options for ``mask`` exactly as the compile subprocess does."""
    from stlib.kernels.common import block_sizes_for

    length = (config.length or CASE_STUDY.num_tokens) if mask is None else mask.length
    itemsize = np.dtype(config.dtype).itemsize if config.dtype != "bfloat16" else 2
    if impl == "splash":
        from stlib.kernels.splash import splash_blocks

        blocks = splash_blocks(length, config.block_q, config.block_kv)
        return Setup(impl, mask, length, config.num_heads, config.head_dim, itemsize, blocks.block_q,
                     blocks.block_kv, blocks.block_kv_compute, {})
    sizes = block_sizes_for(length, config.block_q, config.block_kv, interpret=False)
    return Setup(impl, mask, length, config.num_heads, config.head_dim, itemsize, sizes.block_q, sizes.block_kv,
                 sizes.block_kv_compute, dict(config.options))


def make_config(impl: str, mask, chip: str, *, block_q=None, block_kv=None, options: dict | None = None,
                num_heads: int = CASE_STUDY.num_heads, head_dim: int = CASE_STUDY.head_dim,
                dtype: str = "bfloat16", length: int | None = None) -> tuple[KernelConfig, bytes | None]:
    """The KernelConfig (and pickled mask, for a mask object) of an estimate request."""
    from stlib.masks import Mask

    mask_bytes = None
    if mask is None:
        mask = "none"
    if isinstance(mask, Mask):
        try:
            mask_bytes = pickle.dumps(mask)
        except Exception as err:  # any pickling failure means the same thing
            raise TypeError(f"cannot send {mask!r} to the compile subprocess ({err}); use a named mask") from err
        name = repr(mask)
    elif isinstance(mask, str):
        name = mask
    else:
        raise TypeError(f"mask must be a name, a stlib mask or None, got {type(mask).__name__}")
    config = KernelConfig(impl=impl, mask=name if mask_bytes is None else "none", num_heads=num_heads,
                          head_dim=head_dim, dtype=dtype, block_q=block_q, block_kv=block_kv, chip=chip,
                          length=length)
    if impl == "pallas_tile":
        from stlib.kernels.tile import TileOptions

        resolved = pickle.loads(mask_bytes) if mask_bytes else resolve_mask(config)
        sizes = setup_for(impl, config, resolved)
        opts = {"block_kv_compute": sizes.block_kv_compute, **(options or {})}
        config = dataclasses.replace(config, options=dataclasses.asdict(TileOptions(**opts)))
    elif options:
        raise ValueError(f"options are TileOptions fields, only for impl='pallas_tile' (got impl={impl!r})")
    return config, mask_bytes


def estimate(impl: str, mask="none", chip: str = "v6e", *, block_q: int | None = None,
             block_kv: int | None = None, options: dict | None = None, num_heads: int = CASE_STUDY.num_heads,
             head_dim: int = CASE_STUDY.head_dim, dtype: str = "bfloat16", length: int | None = None,
             clock="calibrated", use_cache: bool = True) -> Estimate:
    """Static estimate of ``impl`` ("splash", "pallas_dense", "pallas_block_sparse", "pallas_tile")
    on ``mask`` (a name: "none", "full", "band (density X)", "band (width W)", a case-study catalog
    name; or a picklable stlib mask) for ``chip`` ("v6e" / "v5e"), [num_heads, length, head_dim]
    inputs (length defaults to the case study's). ``options``: TileOptions fields for pallas_tile.
    ``clock``: "calibrated" (default, see ``calibration``), "peak", or Hz.

    Raises ScheduleFormatError when the libtpu or its dump is not the one this parser knows,
    RuntimeError when the kernel does not compile."""
    from stlib.device import CHIPS, chip_spec

    if chip not in CHIPS:
        raise ValueError(f"chip={chip!r} must be one of {CHIPS}")
    config, mask_bytes = make_config(impl, mask, chip, block_q=block_q, block_kv=block_kv, options=options,
                                     num_heads=num_heads, head_dim=head_dim, dtype=dtype, length=length)
    compiled = compiled_attributions(impl, config, mask_bytes, use_cache)
    setup = setup_for(impl, config, pickle.loads(mask_bytes) if mask_bytes else resolve_mask(config))
    attributions = [Attribution(**{**k, "grid": k["grid"] and tuple(k["grid"])}) for k in compiled["kernels"]]
    if impl == "pallas_block_sparse" and sum(p.startswith("compute") for p in attributions[0].paths) == 2:
        _check_block_sparse_probe(attributions[0], config, setup, use_cache)
    hz, assumption = _clock(clock, chip, use_cache)
    bandwidth = chip_spec(chip).hbm_bandwidth
    kernels = []
    for att in attributions:
        counts = path_counts(setup, att)
        if counts.grid_steps != att.grid_steps:
            raise ScheduleFormatError(f"{att.kernel}: the dump's grid loop runs {att.grid_steps} steps, the layout "
                                      f"says {counts.grid_steps}")
        executions = {"call": 1, "iteration": att.trip, "step": att.grid_steps, **counts.counts}
        breakdown = {}
        for path, bundles in att.paths.items():
            if path not in executions:
                raise ScheduleFormatError(f"{att.kernel}: no count for path {path!r}")
            breakdown[path] = {"bundles": bundles, "count": executions[path], "cycles": bundles * executions[path]}
        cycles = sum(v["cycles"] for v in breakdown.values())
        kernels.append(KernelEstimate(att.kernel, att.grid_steps, cycles, breakdown, cycles / hz,
                                      counts.dma_bytes, counts.dma_bytes / bandwidth))
    return Estimate(impl, mask if isinstance(mask, str) else repr(mask), chip, dataclasses.asdict(config),
                    tuple(kernels), hz, assumption, compiled["glue_bytes"], compiled["glue_bytes"] / bandwidth,
                    compiled["key"]["libtpu"])


def _check_block_sparse_probe(att: Attribution, config: KernelConfig, setup: Setup, use_cache: bool) -> None:
    """Which of block-sparse's two compute regions is the mask-free one? Compile a probe with the
    same blocks where no tile needs a mask (the masked region is not traced at all) and compare."""
    length = 2 * math.lcm(setup.block_q, setup.block_kv)
    probe = dataclasses.replace(config, mask="full", length=length, num_heads=1, chip=config.chip)
    kernels = compiled_attributions("pallas_block_sparse", probe, None, use_cache)["kernels"]
    free = kernels[0]["paths"].get("compute_full")
    full, masked = att.paths["compute_full"], att.paths["compute_masked"]
    if free is None or abs(free - full) > 0.02 * full or abs(free - full) >= abs(free - masked):
        raise ScheduleFormatError(f"probe without masked tiles has a {free}-bundle compute region; the two "
                                  f"regions here have {full} and {masked}: cannot tell which is mask-free")


# ============================================================================================
# 7. the calibration and case-study tables, and the CLI

SPLASH_BLOCKS = ((512, 1024), (512, 2048), (1024, 1024), (1024, 2048), (2048, 2048))
DENSITIES = (0.15, 0.25, 0.35, 0.45, 0.55, 0.65)
STA_MASK = "sliding tile, 3-D tiled order"
TABLE_KERNELS = (
    ("splash", {}),  # bands only: the sliding-tile order has no lazy Splash mask
    ("pallas_dense", {}),
    ("pallas_block_sparse", {}),
    ("pallas_tile", {"form": "rows"}),
    ("pallas_tile", {"form": "flat"}),
    ("pallas_tile", {"form": "rows", "boundary": "balanced"}),
    ("pallas_tile", {"form": "flat", "boundary": "balanced"}),
)


def _parallel(fn, items, workers: int | None = None):
    with ThreadPoolExecutor(max_workers=workers or max(1, min(4, os.cpu_count() or 1))) as pool:
        return list(pool.map(lambda item: fn(*item), items))


def calibration_table(use_cache: bool = True) -> list[dict]:
    """Dense Splash at the case-study shape for several block sizes: static cycles, the clock each
    would imply for the published 78.70 ms, and its estimate under the one calibration."""
    cal = calibration(use_cache)

    def one(bq, bkv):
        est = estimate("splash", "full", "v6e", block_q=bq, block_kv=bkv, use_cache=use_cache)
        return {"block_q": bq, "block_kv": bkv, "grid_steps": est.kernels[0].grid_steps, "cycles": est.cycles,
                "implied_clock_ghz": est.cycles / PUBLISHED_DENSE_SPLASH_SECONDS / 1e9,
                "estimate_ms": est.seconds * 1e3, "memory_floor_ms": est.memory_seconds * 1e3,
                "paths": est.path_bundles()}

    rows = _parallel(one, SPLASH_BLOCKS)
    for row in rows:
        row["calibrated_clock_ghz"] = cal.implied_clock_hz / 1e9
    return rows


def case_study_table(chip: str = "v6e", use_cache: bool = True) -> list[dict]:
    """Every stlib kernel (and Splash) at the case-study shape: bands at DENSITIES and the
    sliding-tile pattern (3-D tiled order, 384-token tiles)."""
    masks_ = [(f"band (density {d})", None) for d in DENSITIES] + [(STA_MASK, 384)]
    calibration(use_cache)
    items = [(impl, opts, m, b) for impl, opts in TABLE_KERNELS for m, b in masks_
             if not (impl == "splash" and m == STA_MASK)]

    def one(impl, opts, mask, block):
        est = estimate(impl, mask, chip, block_q=block, block_kv=block, options=opts or None, use_cache=use_cache)
        label = impl + ("" if not opts else " " + ",".join(str(v) for v in opts.values()))
        return {"kernel": label, "mask": mask, "estimate_ms": est.seconds * 1e3,
                "compute_ms": est.compute_seconds * 1e3, "memory_floor_ms": est.memory_seconds * 1e3,
                "grid_steps": sum(k.grid_steps for k in est.kernels), "paths": est.path_bundles()}

    return _parallel(one, items)


def _print_calibration(rows) -> None:
    print("STATIC ESTIMATE: dense Splash, 75,600 x 10 heads x 128, bf16, v6e (libtpu "
          f"{libtpu_version()}); published {PUBLISHED['dense_splash_ms']} ms")
    print(f"{'block_q':>7} {'block_kv':>8} {'steps':>8} {'cycles':>13} {'implied GHz':>11} "
          f"{'est. ms':>8} {'DMA floor ms':>12}  bundles per step path")
    for r in rows:
        print(f"{r['block_q']:>7} {r['block_kv']:>8} {r['grid_steps']:>8,} {r['cycles']:>13,} "
              f"{r['implied_clock_ghz']:>11.3f} {r['estimate_ms']:>8.2f} {r['memory_floor_ms']:>12.2f}  {r['paths']}")
    cal = calibration()
    print(f"calibration: {cal.describe('v6e')}")
    for chip in ("v6e", "v5e"):
        print(f"  {chip}: calibrated {cal.clock_hz(chip) / 1e9:.3f} GHz; peak-implied {peak_clock_hz(chip) / 1e9:.3f} GHz")


def _print_table(rows, chip: str) -> None:
    splash = estimate("splash", "full", chip)
    published = PUBLISHED["tile_aligned_sparse_ms"]
    print(f"STATIC ESTIMATES on {chip}, case-study shape (libtpu {splash.libtpu_version}); cells: estimate ms "
          f"[kernel DMA floor ms]\nclock: {splash.clock_assumption}")
    masks_ = list(dict.fromkeys(r["mask"] for r in rows))
    kernels = list(dict.fromkeys(r["kernel"] for r in rows))
    by = {(r["kernel"], r["mask"]): r for r in rows}
    short = [m.replace("band (density ", "band ").replace(")", "").replace(STA_MASK, "sliding tile") for m in masks_]
    print(f"{'kernel':<28}" + "".join(f"{name:>16}" for name in short))
    for k in kernels:
        print(f"{k:<28}" + "".join(f"{c['estimate_ms']:>8.2f} [{c['memory_floor_ms']:>4.1f}]" if c else f"{'n/a':>16}"
                                     for c in (by.get((k, m)) for m in masks_)))
    if chip == "v6e":  # the published times are v6e times
        best = [min(by[(k, m)]["estimate_ms"] for k in kernels if k.startswith("pallas")) for m in masks_]
        print(f"{'best stlib - published':<28}" + "".join(f"{b - published:>+16.2f}" for b in best))
    print(f"dense Splash (full mask): {splash.seconds * 1e3:.2f} ms [{splash.memory_seconds * 1e3:.1f}]; "
          f"published on v6e: dense Splash {PUBLISHED['dense_splash_ms']} ms, tile-aligned sparse kernel "
          f"{published} ms (density not published)")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m stlib.estimate", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    one = sub.add_parser("kernel", help="estimate one kernel call")
    one.add_argument("impl")
    one.add_argument("mask", nargs="?", default="none")
    one.add_argument("--chip", default="v6e", choices=["v6e", "v5e"])
    one.add_argument("--block-q", type=int)
    one.add_argument("--block-kv", type=int)
    one.add_argument("--form", choices=["rows", "flat"])
    one.add_argument("--boundary", choices=["exact", "balanced"])
    one.add_argument("--heads", type=int, default=CASE_STUDY.num_heads)
    one.add_argument("--length", type=int)
    one.add_argument("--clock", default="calibrated", help="'calibrated', 'peak' or Hz")
    one.add_argument("--json", action="store_true")
    sub.add_parser("calibrate", help="dense Splash at several block sizes; the implied clock")
    table = sub.add_parser("table", help="every stlib kernel at band densities 0.15-0.65 and sliding tile")
    table.add_argument("--chip", default="v6e", choices=["v6e", "v5e"])
    table.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "kernel":
        opts = {k: v for k, v in (("form", args.form), ("boundary", args.boundary)) if v}
        clock = args.clock if args.clock in ("calibrated", "peak") else float(args.clock)
        est = estimate(args.impl, args.mask, args.chip, block_q=args.block_q, block_kv=args.block_kv,
                       options=opts or None, num_heads=args.heads, length=args.length, clock=clock)
        print(json.dumps(est.as_record(), indent=1) if args.json else est)
    elif args.command == "calibrate":
        _print_calibration(calibration_table())
    else:
        rows = case_study_table(args.chip)
        if args.json:
            print(json.dumps(rows, indent=1))
        else:
            _print_table(rows, args.chip)


if __name__ == "__main__":
    sys.exit(main())
