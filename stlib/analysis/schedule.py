"""The scheduled VLIW program of one compiled Pallas kernel (libtpu's ``...-final_bundles.txt``):
its bundles, and the tree of loops and conditional regions their branches form.

A bundle issues in one cycle. ``Start region N`` / ``End region N`` annotate the bundles; a branch
``sbr.rel (p) target = $regionN`` is followed by a shadow of bundles that run on both paths; a loop
is an ``LB`` body closed by a backward branch on the negation of its ``loop exit test`` against the
trip count. How long the shadow is and how it is marked differs per chip (``BRANCH_FORMS``, keyed
from the chip table's ``schedule_form``):

* ``"delay4"`` (v5e, v6e): four delay bundles, the fourth carrying an ``End region``;
* ``"tpu7x"``: six delay slots. Written out, they are the six bundles behind the branch, the sixth
  carrying the ``End region`` of the branch's region. But libtpu's delay converter writes a trailing
  run of empty delay slots as one empty bundle (its ``pre-delay`` and ``final`` per-bundle
  utilization dumps show the six empty slots of a lone branch become one), so a shorter shadow ends
  in an empty bundle: the first one behind the last bundle that must lie in the shadow, i.e. one
  that closes a region open at the branch (its predicate check, a loop's header), or, behind a forward
  branch, one holding only conditional-region ops the scheduler moved up and predicated on the
  branch's negated predicate. A second empty bundle that could end it as well raises. The folded
  bundle counts as one, like every stall the converter folds (a kernel's pre-delay dump lists 7-13%
  more bundles than its final one, on v6e too): the calibrated clock absorbs them.

The dump is an internal format of the pinned libtpu (``PINNED_LIBTPU``): anything this parser does
not know, a form included, raises ``ScheduleFormatError``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

PINNED_LIBTPU = "0.0.42.1"
#: Bundles issued after a branch before it takes effect (libtpu 0.0.42.1, v5e and v6e).
DELAY_SLOTS = 4
#: Delay slots of a TPU7x branch (libtpu 0.0.42.1); a trailing run of empty ones is one empty bundle.
TPU7X_SHADOW = 6


class ScheduleFormatError(RuntimeError):
    """The libtpu dump is not in the format (or structure) this estimator understands."""


_KEY = (
    "= control target key start",
    "LH: loop header",
    "LB: loop body",
    "LE: loop exit",
    "PB: predicated region body",
    "PF: predicated region fallthrough",
    "CT: control target",
    "= control target key end",
)
_BUNDLE = re.compile(r"^\s*(0x[0-9a-f]+|0)\s+(?:([A-Z]{2}):|:)\s*(>*)\s*\{")
_REGION = re.compile(r"(Start/End empty region|Start region|End region) (\d+)")
_BRANCH = re.compile(r"sbr\.rel \((!?)(%p\w+)\) target = \$region(\d+)")
_GUARD = re.compile(r"[^(;]*?\((!?%p\w+)[,)]")  # an op's predicate: the first (%p..) after its opcode
_EXIT = re.compile(r"(%p\w+) = scmp\.ge\.s32\.totalorder %s\w+, (\d+) /\* loop exit test \*/")
# a loop the compiler makes of a large VMEM copy (a [1024, 128] f32 accumulator copied in a kernel)
# tests its counter against the trip count without the comment
_EXIT_UNMARKED = re.compile(r"(%p\w+) = scmp\.ge\.s32\.totalorder %s\w+, (\d+)(?= \}|  ;;)")
_CONTROL = ("sbr", "sjmp", "scall", "sret", "br.", "jmp", "call", "ret")
_OP = re.compile(r"%[\w.]+ = ([a-z_][\w.\-]*)")
_COMMENT = re.compile(r"/\*.*?\*/", re.DOTALL)
_TOTAL = re.compile(r"total scheduled bundles:\s+(\d+)")


@dataclass(frozen=True)
class Bundle:
    """One VLIW bundle of the dump (issued in one cycle)."""

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
    """The bundles of one kernel and the loops / conditional regions at its top level."""

    bundles: list[Bundle]
    roots: list[Node]

    def has_mxu(self, node: Node) -> bool:
        return any("vmatmul" in b.code for b in self.bundles[node.first : node.last + 1])

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
    if tuple(line.strip() for line in lines[: len(_KEY)]) != _KEY:
        raise ScheduleFormatError(
            "final_bundles dump does not start with the control-target key of libtpu "
            f"{PINNED_LIBTPU}: {lines[:3]!r}"
        )
    bundles: list[list] = []
    for line in lines[len(_KEY) :]:
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


def _shadow_delay4(bundles: list[Bundle], a: int, target: int, starts: dict[int, int]) -> int:
    if a + DELAY_SLOTS >= len(bundles) or "End region" not in bundles[a + DELAY_SLOTS].text:
        raise ScheduleFormatError(f"branch at {a:#x}: no region ends {DELAY_SLOTS} delay slots later")
    return DELAY_SLOTS


def _is_empty(bundle: Bundle) -> bool:
    return not _OP.search(bundle.code)


def _predicates(bundle: Bundle) -> list[str | None]:
    """The predicate of each op of ``bundle`` ("%p3", "!%p3"), None for an unpredicated op."""
    out = []
    for part in bundle.code.split(";;"):
        op = _OP.search(part)
        if op:
            guard = _GUARD.match(part[op.end() :])
            out.append(guard[1] if guard else None)
    return out


def _closes_open_region(bundles: list[Bundle], a: int, k: int, starts: dict[int, int]) -> bool:
    """Whether bundle k closes a region that was open at bundle a (started at or before it;
    ``starts``: each region's first bundle)."""
    ends = {int(r) for what, r in _REGION.findall(bundles[k].text) if what == "End region"}
    return any(starts.get(r, a + 1) <= a for r in ends)


def _shadow_tpu7x(bundles: list[Bundle], a: int, target: int, starts: dict[int, int]) -> int:
    backward = target <= a
    # the shadow runs on both paths: a forward branch's shadow ends before its target
    last = min(a + TPU7X_SHADOW, len(bundles) - 1, len(bundles) if backward else target - 1)
    if last == a + TPU7X_SHADOW and "End region" in bundles[last].text:
        return TPU7X_SHADOW  # the six delay slots written out
    negated, predicate, _ = _BRANCH.findall(bundles[a].code)[0]
    moved_up = predicate if negated else "!" + predicate  # the guard of region ops moved behind it

    def in_shadow(k: int) -> bool:  # bundle k provably runs on both paths
        if k != target - 1 and _closes_open_region(bundles, a, k, starts):
            return True  # it ends a region open at the branch (its check, a loop header): not skipped
        guards = _predicates(bundles[k])
        return not backward and bool(guards) and all(g == moved_up for g in guards)

    evidence = [k for k in range(a + 1, last + 1) if in_shadow(k)]
    after = evidence[-1] if evidence else a
    folds = [k for k in range(after + 1, min(last, a + TPU7X_SHADOW - 1) + 1) if _is_empty(bundles[k])]
    if not folds:
        raise ScheduleFormatError(
            f"branch at {a:#x}: neither {TPU7X_SHADOW} delay bundles closing a region nor a shorter "
            "shadow ending in one empty bundle (the TPU7x forms)"
        )
    if len(folds) > 1:
        raise ScheduleFormatError(
            f"branch at {a:#x}: empty bundles at {[hex(k) for k in folds]} could each end its shadow "
            "(the TPU7x forms allow one reading)"
        )
    if any("End region" in bundles[k].text and k not in evidence for k in range(a + 1, folds[0] + 1)):
        raise ScheduleFormatError(
            f"branch at {a:#x}: a region opened behind it closes in its shadow (not a TPU7x form)"
        )
    return folds[0] - a


#: Per dump form: the bundles behind a branch at address a (to the region starting at target) that
#: run on both of its paths.
BRANCH_FORMS = {"delay4": _shadow_delay4, "tpu7x": _shadow_tpu7x}


def parse_schedule(text: str, analysis: str | None = None, form: str = "delay4") -> Schedule:
    """Bundles plus the loop / conditional-region tree of a final_bundles dump. ``analysis`` (the
    ``...-schedule-analysis_final_bundles.txt`` text) is cross-checked against the bundle count;
    ``form`` names the chip's branch form (``BRANCH_FORMS``; the chip table's ``schedule_form``).
    Raises ScheduleFormatError on any form or structure this parser does not know."""
    if form not in BRANCH_FORMS:
        raise ScheduleFormatError(
            f"form={form!r}: the schedule reader knows the branch forms {sorted(BRANCH_FORMS)}"
        )
    shadow = BRANCH_FORMS[form]
    bundles = parse_bundles(text)
    if analysis is not None:
        total = _TOTAL.search(analysis)
        if total is None:
            raise ScheduleFormatError("schedule analysis has no 'total scheduled bundles' line")
        if int(total[1]) != len(bundles):
            raise ScheduleFormatError(
                f"schedule analysis counts {total[1]} bundles, the dump has {len(bundles)}"
            )
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
        delay = shadow(bundles, a, target, starts)
        if target <= a:
            nodes.append(_loop(bundles, target, a, negated, predicate, delay))
        else:
            if bundles[target].marker != "PF":
                raise ScheduleFormatError(f"forward branch at {a:#x} lands on {target:#x}, not a PF bundle")
            if a + delay + 1 <= target - 1:
                nodes.append(Node("cond", a + delay + 1, target - 1, a, negated + predicate))
    for b in bundles:
        if b.marker == "LB" and not any(n.kind == "loop" and n.first == b.address for n in nodes):
            raise ScheduleFormatError(f"loop body marker at {b.address:#x} without a backward branch to it")
        if b.marker not in ("", "LB", "PF"):  # LH, LE, PB, CT: never seen in Pallas kernels of this libtpu
            raise ScheduleFormatError(
                f"marker {b.marker} at {b.address:#x}: a control structure this parser does not know"
            )
    return Schedule(bundles, _nest(nodes))


def _loop(bundles, target: int, branch: int, negated: str, predicate: str, delay: int) -> Node:
    if bundles[target].marker != "LB":
        raise ScheduleFormatError(f"backward branch at {branch:#x} targets {target:#x}, not a loop body (LB)")
    exits = [m for b in bundles[target : branch + 1] for m in _EXIT.findall(b.text) if m[0] == predicate]
    if not exits:
        body = bundles[target : branch + 1]
        exits = [m for b in body for m in _EXIT_UNMARKED.findall(b.text) if m[0] == predicate]
    if negated != "!" or len(exits) != 1:
        raise ScheduleFormatError(
            f"loop {target:#x}..{branch:#x}: expected one 'loop exit test' defining "
            f"{predicate} and a branch on its negation"
        )
    return Node("loop", target, branch + delay, branch, negated + predicate, trip=int(exits[0][1]))


def _nest(nodes: list[Node]) -> list[Node]:
    roots: list[Node] = []
    stack: list[Node] = []
    for node in sorted(nodes, key=lambda n: (n.first, -n.last, n.kind != "loop")):
        while stack and node.first > stack[-1].last:
            stack.pop()
        if stack and node.last > stack[-1].last:
            raise ScheduleFormatError(
                f"{node.kind} {node.first:#x}..{node.last:#x} overlaps "
                f"{stack[-1].kind} {stack[-1].first:#x}..{stack[-1].last:#x}"
            )
        (stack[-1].children if stack else roots).append(node)
        stack.append(node)
    return roots


def flat_cost(node: Node, where: str) -> int:
    """Bundles to run ``node``'s range once, inner loops times their trips. A conditional region
    inside it is counted as taken every time: a branch that only the data decides (a rescale taken
    when the running max grows, FlashAttention-4's conditional rescaling) cannot be known from a
    schedule, so the estimate charges it on every execution of the path around it."""
    total = node.size
    for child in node.children:
        if child.kind == "cond":
            total += flat_cost(child, where) - child.size  # taken: its bundles, its inner loops' trips
            continue
        total += child.trip * flat_cost(child, where) - child.size
    return total
