"""Work and roofline model: what a kernel computes and moves, and the best time a chip allows.

All numbers are hardware-independent counts (flops, exponentials, bytes, grid steps) derived
from the tile layout, plus the roofline bound max(flops / peak, bytes / HBM bandwidth) from
the chip table (``stlib.device.chip_spec``). Ideal sparse speed-up = 1 / density.
"""

from __future__ import annotations

from dataclasses import dataclass

from stlib.accounting import KernelWork
from stlib.device import CHIPS, chip_spec
from stlib.layout import BlockLayout


def kernel_work(impl: str, layout: BlockLayout, num_heads: int, head_dim: int, options=None) -> KernelWork:
    """Grid steps, computed / masked tiles and flops of ``impl`` on ``layout``: the work model its
    registry entry owns, with its ``options`` (None: defaults). Raises ValueError for an unknown
    impl or one without a work model."""
    from stlib import registry

    implementation = registry.get(impl)
    if implementation.work is None:
        raise ValueError(f"impl={impl!r} has no work model")
    return implementation.work(layout, num_heads, head_dim, implementation.options(options))


def bytes_moved(work: KernelWork, layout: BlockLayout, num_heads: int, head_dim: int, itemsize: int) -> float:
    """HBM bytes: q read and o written once per row of tiles, a k and a v tile per computed tile."""
    nq, _ = layout.grid_shape
    rows = num_heads * nq * layout.block_q * head_dim * itemsize
    return 2.0 * rows + work.computed_tiles * 2.0 * layout.block_kv * head_dim * itemsize


class ComputeOrMemoryBound:
    """Mixin for anything with ``compute_seconds`` and ``memory_seconds``: the time is the larger."""

    @property
    def seconds(self) -> float:
        return max(self.compute_seconds, self.memory_seconds)

    @property
    def bound(self) -> str:
        return "compute" if self.compute_seconds >= self.memory_seconds else "memory"


@dataclass(frozen=True)
class Roofline(ComputeOrMemoryBound):
    chip: str
    compute_seconds: float
    memory_seconds: float


def roofline(chip: str, flops: float, nbytes: float) -> Roofline:
    spec = chip_spec(chip)
    return Roofline(chip, flops / spec.bf16_flops, nbytes / spec.hbm_bandwidth)


def work_summary(
    impl: str, layout: BlockLayout, num_heads: int, head_dim: int, itemsize: int = 2, options=None
) -> dict:
    """One dict of work numbers and every chip's roofline times (executed and useful flops)."""
    work = kernel_work(impl, layout, num_heads, head_dim, options)
    nbytes = bytes_moved(work, layout, num_heads, head_dim, itemsize)
    out = {
        **work.as_dict(),
        "bytes": nbytes,
        "density": layout.density,
        "ideal_speedup": 1.0 / layout.density if layout.density else float("inf"),
    }
    for chip in CHIPS:
        executed = roofline(chip, work.executed_flops, nbytes)
        out[f"roofline_{chip}_ms"] = executed.seconds * 1e3
        out[f"roofline_{chip}_bound"] = executed.bound
        out[f"useful_roofline_{chip}_ms"] = roofline(chip, work.useful_flops, 0.0).seconds * 1e3
    return out
