"""The backend at hand, the TPU chip table, and compiling for a TPU without one.

Hardware numbers come from ``pltpu.get_tpu_info_for_chip`` (one table, never retyped).
Deviceless compilation (``compile_for_tpu``) runs the real Mosaic compiler for any chip of the
table on a CPU-only machine through libtpu; it reports memory use but no time.
"""

from __future__ import annotations

import functools
import glob
from dataclasses import dataclass
from pathlib import Path

import jax


def host_has_tpu() -> bool:
    """Whether a TPU chip (a Google PCI device) is attached to this host; read from sysfs, without
    initialising JAX (the same test as JAX's own ``hardware_utils``)."""
    return any(Path(v).read_text().strip() == "0x1ae0" for v in glob.glob("/sys/bus/pci/devices/*/vendor"))


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
class Chip:
    """One row of the chip table. The peak numbers are read from JAX's own table
    (``pltpu.get_tpu_info_for_chip``, per device: a TPU7x chip shows its two TensorCores as two
    devices); the row adds what that table lacks: how libtpu names the chip, its deviceless
    topology, the compiler's default scoped-VMEM limit, and the form in which
    libtpu's bundle dump writes branches (``stlib.analysis.schedule.BRANCH_FORMS``) and the chip's ICI
    bandwidth where the Cloud TPU docs state it (REFERENCE.md section 7; v5e: not recorded)."""

    name: str  # our name: "v5e", "v6e", "tpu7x"
    jax_version: str  # tpu_info.ChipVersion value
    topology: str  # libtpu's deviceless topology name
    device_kinds: tuple[str, ...]  # lower-case jax ``device_kind`` strings of this chip
    devices_per_chip: int
    scoped_vmem_default: int  # bytes a kernel may use without ``vmem_limit_bytes``
    schedule_form: str = "delay4"  # how the bundle dump writes a branch's delay shadow
    ici_bandwidth: float | None = None  # bytes/s per chip, both directions together (Cloud TPU docs)
    #: The largest kernel program (bundles, ``kernel_estimate.program_bundles``) that runs at its
    #: schedule's pace, where measured (None: not measured). A reading of measurements, not a
    #: documented fact: on a v5e every kernel of at most 63,603 bundles ran at 0.82-0.97x its
    #: bundles-only estimate and every one of 67,704 or more at 1.7-3.9x
    #: (``stlib.bench.program_size_probe``); the limit is the power of two between them.
    program_bundles_limit: int | None = None

    @functools.cached_property
    def _info(self):
        from jax.experimental.pallas import tpu as pltpu

        return pltpu.get_tpu_info_for_chip(pltpu.ChipVersion(self.jax_version), 1)

    @property
    def bf16_flops(self) -> float:  # FLOP/s per device
        return float(self._info.bf16_ops_per_second)

    @property
    def hbm_bandwidth(self) -> float:  # bytes/s per device
        return float(self._info.mem_bw_bytes_per_second)

    @property
    def hbm_capacity(self) -> int:
        """HBM bytes per device (a TPU7x chip's two devices hold half of its HBM each).

        >>> round(CHIP_TABLE["v6e"].hbm_capacity / 1e9, 1)
        34.4
        """
        return int(self._info.hbm_capacity_bytes)

    @property
    def vmem_bytes(self) -> int:
        return int(self._info.vmem_capacity_bytes)

    @property
    def smem_bytes(self) -> int:
        return int(self._info.smem_capacity_bytes)

    @property
    def mxu_width(self) -> int:  # an MXU is mxu_width x mxu_width
        return int(self._info.mxu_column_size)

    @property
    def num_mxus(self) -> int:
        return int(self._info.num_mxus)


_MIB = 1 << 20
#: The vreg tile of every chip in the table: 8 sublanes x 128 lanes (32-bit words); block shapes,
#: SMEM tables and HBM layouts are padded to it.
SUBLANES, LANES = 8, 128

#: The chip table: adding a chip is one row. Scoped-VMEM defaults as the Mosaic compiler reports
#: them in its "exceeded scoped vmem limit" errors (16 MiB on v5e, 32 MiB on v6e); TPU7x's is
#: taken to be v6e's (no public statement found).
CHIP_TABLE: dict[str, Chip] = {
    chip.name: chip
    for chip in (
        Chip(
            "v5e",
            "v5e",
            "v5e:2x2",
            ("tpu v5 lite", "tpu v5e", "tpu v5litepod"),
            1,
            16 * _MIB,
            program_bundles_limit=2**16,
        ),
        Chip("v6e", "v6e", "v6e:2x2", ("tpu v6 lite", "tpu v6e"), 1, 32 * _MIB, ici_bandwidth=800e9),
        Chip(
            "tpu7x",
            "7x",
            "tpu7x:2x2x1",
            ("tpu7x",),
            2,
            32 * _MIB,
            schedule_form="tpu7x",
            ici_bandwidth=1200e9,
        ),
    )
}
#: Chip names, in table order.
CHIPS = tuple(CHIP_TABLE)


def chip_spec(chip: str) -> Chip:
    """The chip table's row for ``chip``. Raises ValueError for a chip not in the table."""
    if chip not in CHIP_TABLE:
        raise ValueError(f"chip={chip!r} must be one of {CHIPS}")
    return CHIP_TABLE[chip]


def chip_of_device_kind(kind: str) -> str | None:
    """The chip-table name of a jax ``device_kind`` string ("TPU v6 lite" -> "v6e"), else None."""
    return next((chip.name for chip in CHIP_TABLE.values() if kind.lower() in chip.device_kinds), None)


def current_chip() -> str | None:
    """The chip-table name of the TPU this process runs on, else None (CPU, GPU, an unknown TPU)."""
    return chip_of_device_kind(device_kind()) if on_tpu() else None


def smem_limit() -> int:
    """SMEM bytes a kernel's prefetched tables may use: the current chip's, else the smallest in the
    table (a kernel traced off a TPU must fit every chip it may be compiled for)."""
    chip = current_chip()
    return chip_spec(chip).smem_bytes if chip else min(c.smem_bytes for c in CHIP_TABLE.values())


@functools.cache
def tpu_device(chip: str):
    """A TPU device of ``chip`` to compile for, from libtpu's deviceless topology."""
    from jax.experimental import topologies

    topology = topologies.get_topology_desc(platform="tpu", topology_name=chip_spec(chip).topology)
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
        names = (
            "argument_size_in_bytes",
            "output_size_in_bytes",
            "temp_size_in_bytes",
            "generated_code_size_in_bytes",
        )
        return {n: int(getattr(stats, n)) for n in names if hasattr(stats, n)}

    def text(self) -> str:
        return self.compiled.as_text()


def compile_for_tpu(fn, *shapes, chip: str = "v6e") -> CompiledKernel:
    """Compile ``fn`` for a TPU ``chip`` from abstract inputs (``jax.ShapeDtypeStruct``, or pytrees
    of them), on any machine. Raises whatever the Mosaic / XLA compiler raises (VMEM or SMEM overflow, bad tiling)."""
    from jax.sharding import SingleDeviceSharding

    sharding = SingleDeviceSharding(tpu_device(chip))
    args = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding), shapes)
    return CompiledKernel(chip, jax.jit(fn).lower(*args).compile())
