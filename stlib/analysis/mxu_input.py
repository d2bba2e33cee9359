"""What each MXU of a compiled kernel is fed, per control path: the rows of the operands it
multiplies (``vmatmul``) and the rows of the weights pushed into it (``vmatpush``), and the cycles
these take at the compiler's own MXU rate.

The schedule is a VLIW program: a bundle issues in one cycle, and libtpu's per-bundle utilization
dump (``...-final_hlo-static-per-bundle-utilization.txt``) says how long the compiler holds an MXU
busy for each ``vmatmul``: about half a cycle per streamed row on v6e and TPU7x (a bf16 vreg of 16
rows: 8 cycles), about one on v5e. It charges nothing for a ``vmatpush``, which loads the MXU's
stationary operand (the weights) into a staging register while the previous weights multiply.

The assumption this module adds (the dump does not state it, and no TPU here can test it): a push
moves rows into the MXU as a ``vmatmul`` does, 16 rows of a bf16 register through the same operand
path of the same unit, so the two cannot overlap. It charges a push at the compiler's cycles per row,
so an MXU's input on a path is (multiplied rows + pushed rows) x the kernel's cycles per row
(``KernelMxu.rate``). Where that exceeds the path's bundles, the path cannot issue faster than its
busiest MXU is fed (``stlib.analysis.kernel_estimate``: path cycles = max(bundles, MXU input)).
Nothing is fitted: the rows come from the ops' element types, the rate from the compiler's dump.

Which kernels it matters for (Splash at 2,048 x 2,048 blocks, kv chunks of 512, head dim 128, on
TPU7x): the forward streams the 2,048-row q block through each weight tile and pushes one weight row
for every 10.7 rows it multiplies; its busiest MXU is fed for 0.62 of the compute region's bundles.
The dK/dV kernel streams the 512-row kv chunk through q- and dO-weights: one pushed row for every
2.2 multiplied on its busier MXU, fed for 1.26 of its bundles (the compiler's occupancy alone, the
vmatmuls: 0.87).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from stlib.analysis.schedule import Node, Schedule, ScheduleFormatError

#: Rows of one vector register an MXU op moves, by its element type (8 sublanes x packing); an op
#: that names no type moves 32-bit words (libtpu writes f32 weight pushes as ``vmatpush1.msra``).
ROWS_PER_REGISTER = {"f32": 8, "bf16": 16}
UNTYPED = "f32"
#: Element types of other widths an MXU op may name: refused by name (no rows known for them here).
_OTHER_TYPES = re.compile(r"^(s|u|f|bf|e\d)\w*\d+$")

_MXU_OP = re.compile(r"= (vmatmul|vmatpush)\w*((?:\.\w+|\[\d+\])*)")
_UNIT = re.compile(r"^mxu\d+$")


def register_rows(code: str) -> dict[str, tuple[int, int]]:
    """{MXU unit: (rows multiplied, weight rows pushed)} by the ops of one bundle's code.

    >>> register_rows("%v1 = vmatmul.mubr.bf16.gmra.mrb[248].mxu1 %v2 ;; %3 = vmatpush1.bf16.msra.mxu0 %v4")
    {'mxu1': (16, 0), 'mxu0': (0, 16)}
    >>> register_rows("%v1 = vmatmul.mubr.f32.gmra.mxu0 %v2 ;; %v5 = vmatprep.mubr.f32.mxu0 %v6")
    {'mxu0': (8, 0)}
    >>> register_rows("%7 = vmatpush1.msra.mxu1 %v3")  # no type named: 32-bit words
    {'mxu1': (0, 8)}
    """
    out: dict[str, list[int]] = {}
    for kind, suffix in _MXU_OP.findall(code):
        parts = re.sub(r"\[\d+\]", "", suffix).strip(".").split(".")
        units = [p for p in parts if _UNIT.match(p)]
        types = [p for p in parts if p in ROWS_PER_REGISTER]
        other = [p for p in parts if p not in ROWS_PER_REGISTER and _OTHER_TYPES.match(p)]
        if len(units) != 1 or len(types) > 1 or other:
            raise ScheduleFormatError(
                f"MXU op {kind}{suffix}: expected one unit and at most one element type of "
                f"{sorted(ROWS_PER_REGISTER)}"
            )
        types = types or [UNTYPED]
        rows = out.setdefault(units[0], [0, 0])
        rows[kind == "vmatpush"] += ROWS_PER_REGISTER[types[0]]
    return {unit: (a, b) for unit, (a, b) in out.items()}


def parse_utilization(text: str, bundles: int) -> list[int]:
    """The compiler's MXU occupancy per bundle (units busy, 0..number of MXUs) from libtpu's
    per-bundle utilization dump; raises ScheduleFormatError unless it lists ``bundles`` rows and an
    MXU column."""
    head, sep, body = text.partition("== UTILIZATION:")
    names = [line for line in head.splitlines() if line.strip().startswith("MXU")]
    if not sep or len(names) != 1:
        raise ScheduleFormatError("per-bundle utilization dump without a capacity header naming MXU")
    column = [n.strip() for n in names[0].split(",")].index("MXU")
    rows = [line.split() for line in body.splitlines() if line.strip()]
    if len(rows) != bundles or any(not r[column].isdigit() for r in rows):
        raise ScheduleFormatError(f"per-bundle utilization lists {len(rows)} rows for {bundles} bundles")
    return [int(r[column]) for r in rows]


@dataclass(frozen=True)
class KernelMxu:
    """The MXU input of one kernel's bundles: ``rows[i]`` the {unit: (multiplied, pushed)} rows of
    bundle i; ``rate`` the compiler's MXU cycles per multiplied row (its occupancy summed over the
    kernel / the rows its vmatmuls stream; 0 for a kernel without MXU ops)."""

    rows: list[dict[str, tuple[int, int]]]
    rate: float

    @classmethod
    def of(cls, schedule: Schedule, occupancy: list[int]) -> KernelMxu:
        rows = [register_rows(b.code) for b in schedule.bundles]
        multiplied = sum(m for r in rows for m, _ in r.values())
        return cls(rows, sum(occupancy) / multiplied if multiplied else 0.0)

    def _flat(self, node: Node, skip_conds: bool = False) -> dict[str, int]:
        """Rows into each unit to run ``node`` once (multiplied + pushed), inner loops times their
        trips, a conditional region inside as taken (``schedule.flat_cost``'s rule); ``skip_conds``:
        without the conditional regions directly inside (they are paths of their own)."""
        inner = [(c.first, c.last) for c in node.children]
        total: dict[str, int] = {}
        for i in range(node.first, node.last + 1):
            if any(a <= i <= b for a, b in inner):
                continue
            for unit, (m, p) in self.rows[i].items():
                total[unit] = total.get(unit, 0) + m + p
        for child in node.children:
            if child.kind == "cond" and skip_conds:
                continue
            times = child.trip if child.kind == "loop" else 1
            for unit, n in self._flat(child).items():
                total[unit] = total.get(unit, 0) + times * n
        return total

    def cycles(self, node: Node, skip_conds: bool = False) -> int:
        """Cycles the busiest MXU is fed to run ``node`` once, at ``rate`` (0 without MXU ops)."""
        fed = self._flat(node, skip_conds)
        return round(max(fed.values(), default=0) * self.rate)
