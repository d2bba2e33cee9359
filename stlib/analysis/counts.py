"""How often each control path of a kernel runs, and the HBM bytes its DMAs move: each kernel's
registry entry counts its paths and fetches (``EstimatorHooks.schedule_counts``); this module turns
them into bytes, knowing which operands the compiled program keeps in HBM and how XLA lays them out
there (an f32 [H, L, 1] LSE laid out ``T(8,128)`` moves 128 lanes per row: 128x its logical bytes).

Exposed DMA, kept simple: the pipeline fetches step i+1's blocks while step i computes, so a copy
is exposed only (1) in the prologue (the first step's q, k, v blocks) and epilogue (the last output
block), (2) where a step's compute is shorter than the copies issued behind it: per kv fetch,
max(0, k + v block time - the time of one computed step), and per row start, max(0, q + o + k + v
block time - that step time). Skipped steps and DMA queueing are not modelled."""

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
    q_rows: int = 0  # q-block fetches (row starts)
    kv_fetches: int = 0
    q_block_bytes: int = 0  # one q block in + one output (and LSE) block out, laid out
    kv_block_bytes: int = 0  # one k block + one v block, laid out
    waited_bytes: int = 0  # copies the kernel starts and waits for (ScheduleCounts.waited_bytes)

    def exposed_seconds(self, step_seconds: float, bandwidth: float) -> float:
        """DMA time the pipeline does not hide behind compute (module docstring), given the time of
        one computed grid step."""
        kv = self.kv_block_bytes / bandwidth
        row = (self.q_block_bytes + self.kv_block_bytes) / bandwidth
        prologue = row  # the first step waits for its q, k, v blocks; the last output block drains
        return (
            prologue
            + self.kv_fetches * max(0.0, kv - step_seconds)
            + self.q_rows * max(0.0, row - step_seconds)
            + self.waited_bytes / bandwidth
        )


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
    num_kv_heads: int | None = None  # None: num_heads
    head_dim_v: int | None = None  # None: head_dim

    @property
    def layout(self):
        from stlib import masks

        return _layout(
            self.mask if self.mask is not None else masks.full(self.length), self.block_q, self.block_kv
        )


_LAYOUTS: dict = {}


def _layout(mask, block_q: int, block_kv: int):
    from stlib.layout import block_layout

    key = (mask, block_q, block_kv)  # masks compare and hash by value
    if key not in _LAYOUTS:
        _LAYOUTS[key] = block_layout(mask, block_q, block_kv)
    return _LAYOUTS[key]


_FLOATS = ("bf16", "f16", "f32")


def _hbm_roles(
    att: Attribution, head_dim: int, head_dim_v: int | None = None, layouts: list[str] | None = None
) -> dict[str, tuple[bool, int]]:
    """Per role q, k, v, o, lse: whether the kernel moves it through HBM (XLA may place whole operands
    in VMEM at small shapes, and then the pipeline moves nothing for them) and its row's minor
    dimension as laid out (``layouts``: per operand index, from the scheduled HLO)."""
    from stlib.analysis.dump import laid_out_minor

    dv = head_dim_v or head_dim
    inputs = [
        (i, op)
        for i, op in enumerate(att.operands)
        if op[3] == "input" and len(op[2]) == 3 and op[2][-1] in (head_dim, dv) and op[1] in _FLOATS
    ]  # integer operands of the same shape (Splash's int8 mask blocks) are tables, never data
    outputs = [(i, op) for i, op in enumerate(att.operands) if op[3] == "output" and len(op[2]) == 3]
    o = [(i, op) for i, op in outputs if op[2][-1] == dv]
    lse = [(i, op) for i, op in outputs if op[2][-1] == 1]
    if (
        len(inputs) != 3
        or len(o) != 1
        or len(lse) > 1
        or [op[2][-1] for _, op in inputs][:2] != [head_dim] * 2
    ):
        raise ScheduleFormatError(f"{att.kernel}: cannot tell q, k, v, o apart among operands {att.operands}")

    def role(i, op):
        layout = layouts[i] if layouts and i < len(layouts) else "{}"
        return op[0] == "hbm", laid_out_minor(op[2][-1], layout)

    roles = {name: role(*x) for name, x in zip("qkv", inputs)}
    return {**roles, "o": role(*o[0]), "lse": role(*lse[0]) if lse else (False, 1)}


def path_counts(setup: Setup, att: Attribution, layouts: list[str] | None = None) -> PathCounts:
    """Executions of each path of the kernel ``att.kernel`` (one pallas_call of ``setup.impl``) and
    the HBM bytes of its q / k / v block fetches and o / lse block writes, at the sizes ``layouts``
    (the kernel's operand layouts in the scheduled HLO) give them."""
    from stlib import registry

    d, item = setup.head_dim, setup.itemsize
    _, schedule_counts = registry.get(setup.impl).schedule_rules(att.kernel)
    if schedule_counts is None:
        raise ValueError(f"no path counts for impl={setup.impl!r}, kernel {att.kernel!r}")
    try:
        c = schedule_counts(setup, att)
    except ValueError as error:  # the layout and the compiled grid disagree
        raise ScheduleFormatError(str(error)) from error
    if c.row_bytes is not None:  # a kernel that states its bytes (a backward kernel)
        nbytes = c.q_rows * c.row_bytes + c.kv_fetches * c.fetch_bytes + c.waited_bytes
        return PathCounts(
            c.paths,
            c.grid_steps,
            int(nbytes),
            c.q_rows,
            c.kv_fetches,
            c.row_bytes,
            c.fetch_bytes,
            c.waited_bytes,
        )
    hbm = _hbm_roles(att, d, setup.head_dim_v, layouts)
    moved = {name: minor * on for name, (on, minor) in hbm.items()}  # laid-out row elements in HBM
    q_block = c.block_q * (item * moved["q"] + c.out_itemsize * moved["o"] + 4 * moved["lse"] * c.writes_lse)
    kv_block = c.block_kv * item * (moved["k"] + moved["v"])
    nbytes = c.q_rows * q_block + c.kv_fetches * kv_block
    return PathCounts(c.paths, c.grid_steps, int(nbytes), c.q_rows, c.kv_fetches, int(q_block), int(kv_block))
