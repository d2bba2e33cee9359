"""How often each control path of a kernel runs, and the HBM bytes its DMAs move: each kernel's
registry entry counts its paths and fetches (``Implementation.schedule_counts``); this module turns
them into bytes, knowing which operands the compiled program keeps in HBM."""

from __future__ import annotations

from dataclasses import dataclass

from stlib.analysis.attribution import Attribution
from stlib.analysis.schedule import ScheduleFormatError


@dataclass(frozen=True)
class PathCounts:
    """Executions of each path of one kernel call (all heads) and the HBM bytes its DMAs move."""

    counts: dict[str, int]
    grid_steps: int
    dma_bytes: int


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

    key = (mask, block_q, block_kv)  # masks compare and hash by value
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
    from stlib import registry

    d, item = setup.head_dim, setup.itemsize
    implementation = registry.get(setup.impl)
    if implementation.schedule_counts is None:
        raise ValueError(f"no path counts for impl={setup.impl!r}")
    try:
        c = implementation.schedule_counts(setup, att)
    except ValueError as error:  # the layout and the compiled grid disagree
        raise ScheduleFormatError(str(error)) from error
    hbm = _hbm_roles(att, d)
    lse = int(c.writes_lse)
    nbytes = (c.q_rows * c.block_q * d * (item * hbm["q"] + c.out_itemsize * hbm["o"] + lse * 4 * hbm["lse"] / d)
              + c.kv_fetches * c.block_kv * d * item * (hbm["k"] + hbm["v"]))
    return PathCounts(c.paths, c.grid_steps, int(nbytes))
