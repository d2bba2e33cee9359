"""The backend at hand, the TPU chip table, and compiling for a TPU without one.

Hardware numbers come from ``pltpu.get_tpu_info_for_chip`` (one table, never retyped).
Deviceless compilation (``compile_for_tpu``) runs the real Mosaic compiler for a v5e / v6e
topology on a CPU-only machine through libtpu; it reports memory use but no time.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import jax

CHIPS = ("v5e", "v6e")


def backend() -> str:
    return jax.default_backend()


def device_kind() -> str:
    return jax.devices()[0].device_kind


def on_tpu() -> bool:
    return backend() == "tpu"


def resolve_interpret(interpret: bool | None) -> bool:
    """``None`` means: interpret unless running on a TPU."""
    if interpret is None:
        return not on_tpu()
    if not isinstance(interpret, bool):
        raise TypeError(f"interpret={interpret!r} must be None, True or False")
    return interpret


@dataclass(frozen=True)
class ChipSpec:
    name: str
    bf16_flops: float  # FLOP/s
    hbm_bandwidth: float  # bytes/s
    vmem_bytes: int
    smem_bytes: int
    mxu_width: int


@functools.cache
def chip_spec(chip: str) -> ChipSpec:
    """Peak numbers of a TPU chip ("v5e" or "v6e") from JAX's own table."""
    from jax._src.pallas.mosaic import tpu_info
    from jax.experimental.pallas import tpu as pltpu

    if chip not in CHIPS:
        raise ValueError(f"chip={chip!r} must be one of {CHIPS}")
    info = pltpu.get_tpu_info_for_chip(tpu_info.ChipVersion(chip), 1)
    return ChipSpec(
        name=chip,
        bf16_flops=float(info.bf16_ops_per_second),
        hbm_bandwidth=float(info.mem_bw_bytes_per_second),
        vmem_bytes=int(info.vmem_capacity_bytes),
        smem_bytes=int(info.smem_capacity_bytes),
        mxu_width=int(info.mxu_column_size),
    )


def current_chip() -> str | None:
    """"v5e" / "v6e" when running on one of them, else None."""
    if not on_tpu():
        return None
    kind = device_kind().lower()
    if "v6" in kind:
        return "v6e"
    if "v5 lite" in kind or "v5e" in kind or "v5litepod" in kind:
        return "v5e"
    return None


@functools.cache
def tpu_device(chip: str):
    """A TPU device of ``chip`` to compile for, real or from a deviceless topology."""
    from jax.experimental import topologies

    if chip not in CHIPS:
        raise ValueError(f"chip={chip!r} must be one of {CHIPS}")
    topology = topologies.get_topology_desc(platform="tpu", topology_name=f"{chip}:2x2")
    return topology.devices[0]


@dataclass(frozen=True)
class CompiledKernel:
    chip: str
    compiled: object

    def memory(self) -> dict:
        """Bytes of the compiled program's arguments, outputs, temporaries and code, when known."""
        try:
            stats = self.compiled.memory_analysis()
        except Exception:  # noqa: BLE001 - not every backend reports memory
            return {}
        if stats is None:
            return {}
        names = ("argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes",
                 "generated_code_size_in_bytes")
        return {n: int(getattr(stats, n)) for n in names if hasattr(stats, n)}

    def text(self) -> str:
        return self.compiled.as_text()


def compile_for_tpu(fn, *shapes, chip: str = "v6e") -> CompiledKernel:
    """Compile ``fn`` for a TPU ``chip`` from abstract inputs (``jax.ShapeDtypeStruct``), on any
    machine. Raises whatever the Mosaic / XLA compiler raises (VMEM or SMEM overflow, bad tiling)."""
    from jax.sharding import SingleDeviceSharding

    sharding = SingleDeviceSharding(tpu_device(chip))
    args = [jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding) for s in shapes]
    return CompiledKernel(chip, jax.jit(fn).lower(*args).compile())
