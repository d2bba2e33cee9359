"""A static TPU time estimate of one attention call from its compiled kernel schedules: the
compiler as a stopwatch.

Each Pallas kernel of the call is compiled for a chip of ``ESTIMATE_CHIPS`` without a TPU, its
scheduled bundles are attributed to control paths (``stlib.analysis.attribution``), multiplied by how
often each path runs (``stlib.analysis.counts``: from the step tables; a branch inside a path that
only the data decides, such as a rescale taken when the running max grows, counts as taken on every
execution of its path, ``schedule.flat_cost``) and turned into time through the clock it is
given (this module knows no calibration: ``stlib.analysis.clock`` calibrates on top of it and
``stlib.analysis.static`` composes the two). A bundle issues in one cycle, and a path takes no fewer
cycles than its busiest MXU is fed (``stlib.analysis.mxu_input``: the rows it multiplies and the
weight rows pushed into it, at the compiler's own MXU rate); stalls the schedule does not show are
folded into the calibrated clock, except the DMA the pipeline cannot hide (``PathCounts.
exposed_seconds``: prologue, and steps whose compute is shorter than their copies), which is added;
the HBM bytes the kernel's DMAs move (at their laid-out sizes) / bandwidth floor each kernel's time.
The XLA glue around the kernels (padding, scaling, merging) is a memory-bound line of its own:
``total_seconds = seconds (kernels) + glue_seconds``. A static estimate, never a measurement: a
libtpu or a dump this parser does not know raises ``ScheduleFormatError`` and no number is returned.
"""

from __future__ import annotations

import dataclasses
import math
import pickle
from dataclasses import dataclass

import numpy as np

from stlib import registry
from stlib.analysis.attribution import Attribution
from stlib.analysis.cache import compiled_attributions
from stlib.analysis.counts import Setup, path_counts
from stlib.analysis.dump import KernelConfig, resolve_mask
from stlib.analysis.schedule import ScheduleFormatError
from stlib.configs import CASE_STUDY
from stlib.roofline import ComputeOrMemoryBound

#: Chips the estimate covers: the schedule reader knows their dump form (the chip table's
#: ``schedule_form``) and ``stlib.analysis.clock`` has a calibrated clock for each.
ESTIMATE_CHIPS = ("v6e", "v5e", "tpu7x")

METHOD = (
    "static estimate: VLIW bundles of the libtpu schedule per control path (1 bundle = 1 cycle; the "
    "busiest MXU's input where longer: multiplied + pushed rows at the compiler's MXU rate) x path "
    "counts from the tile layout / calibrated clock, + exposed DMA (prologue, steps shorter than their "
    "copies), floored by laid-out kernel DMA bytes / HBM bandwidth; + XLA glue bytes / HBM bandwidth"
)


@dataclass(frozen=True)
class KernelEstimate(ComputeOrMemoryBound):
    kernel: str
    grid_steps: int
    cycles: int
    breakdown: dict[str, dict]  # path -> {"bundles", "mxu" (cycles fed) per execution, "count", "cycles"}
    compute_seconds: float
    dma_bytes: int
    memory_seconds: float
    exposed_dma_seconds: float = 0.0  # copies not hidden behind compute (counts.PathCounts.exposed_seconds)

    @property
    def seconds(self) -> float:
        return max(self.compute_seconds + self.exposed_dma_seconds, self.memory_seconds)

    @property
    def program_bundles(self) -> int:
        """The kernel's program size: the bundles of its paths, each counted once."""
        return program_bundles(self.breakdown)


def program_bundles(breakdown: dict[str, dict]) -> int:
    """Bundles of a kernel's paths (``KernelEstimate.breakdown``), each counted once: its program's
    size, which the schedule's time does not depend on (``stlib.bench.tpu_measure`` puts it beside
    measured times: on a v5e some large programs ran 2.5-3.9x their schedule, others did not).

    >>> program_bundles({"step": {"bundles": 52, "count": 10}, "compute_full": {"bundles": 8_732, "count": 9}})
    8784
    """
    return sum(v["bundles"] for v in breakdown.values())


def bundles_only_cycles(breakdown: dict[str, dict]) -> int:
    """Cycles of a kernel (``KernelEstimate.breakdown``) with every path charged its bundles alone,
    no MXU feed (``stlib.analysis.mxu_input``): the reading a TPU v5e's measurements agreed with
    (``stlib.bench.tpu_measure``).

    >>> bundles_only_cycles({"step": {"bundles": 52, "count": 10}, "compute_full": {"bundles": 8_732, "count": 9}})
    79108
    """
    return sum(v["count"] * v["bundles"] for v in breakdown.values())


@dataclass(frozen=True)
class Estimate:
    """A static estimate of one attention call on a chip: the kernels (``seconds``), the XLA glue
    around them (padding, scaling, merging: ``glue_seconds``, its bytes / HBM bandwidth) and their
    sum (``total_seconds``); ``blocks`` the kernel blocks used, ``kernels`` the per-path breakdown."""

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

    @property
    def exposed_dma_seconds(self) -> float:
        return sum(k.exposed_dma_seconds for k in self.kernels)

    @property
    def total_seconds(self) -> float:
        return self.seconds + self.glue_seconds

    @property
    def bundles_only_seconds(self) -> float:
        """``total_seconds`` with every path charged its bundles alone (``bundles_only_cycles``) at
        the same clock, glue included, exposed DMA left out."""
        return sum(bundles_only_cycles(k.breakdown) for k in self.kernels) / self.clock_hz + self.glue_seconds

    @property
    def direction(self) -> str:
        """ "backward" for the estimate of a call's backward alone, else "forward"."""
        return "backward" if self.config.get("backward") else "forward"

    @property
    def blocks(self) -> dict:
        """The blocks the kernels ran with (resolved: defaults filled in)."""
        return dict(self.config.get("resolved_blocks") or {})

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
            "estimate_direction": self.direction,
            "estimate_ms": self.seconds * 1e3,
            "estimate_compute_ms": self.compute_seconds * 1e3,
            "estimate_memory_floor_ms": self.memory_seconds * 1e3,
            "estimate_glue_floor_ms": self.glue_seconds * 1e3,
            "estimate_glue_ms": self.glue_seconds * 1e3,
            "estimate_total_ms": self.total_seconds * 1e3,
            "estimate_exposed_dma_ms": self.exposed_dma_seconds * 1e3,
            "estimate_blocks": self.blocks,
            "estimate_cycles": self.cycles,
            "estimate_clock_hz": self.clock_hz,
            "estimate_clock_assumption": self.clock_assumption,
            "estimate_libtpu": self.libtpu_version,
            "estimate_breakdown": {k.kernel: k.breakdown for k in self.kernels},
            "estimate_program_bundles": {k.kernel: k.program_bundles for k in self.kernels},
        }

    def __str__(self) -> str:
        lines = [
            (
                f"STATIC ESTIMATE (not a measurement) {self.direction} {self.impl} / {self.mask} on {self.chip}: "
                f"{format_seconds(self.total_seconds)} total = kernels {format_seconds(self.seconds)} + glue "
                f"{format_seconds(self.glue_seconds)}; blocks {self.blocks}"
            ),
            f"  clock: {self.clock_assumption}",
            f"  libtpu {self.libtpu_version}; {self.method}",
        ]
        for k in self.kernels:
            lines.append(
                f"  kernel {k.kernel}: {k.grid_steps:,} grid steps, {k.cycles:,} cycles -> compute "
                f"{format_seconds(k.compute_seconds)} + exposed DMA {format_seconds(k.exposed_dma_seconds)}, "
                f"DMA floor {format_seconds(k.memory_seconds)} ({k.dma_bytes / 1e9:.2f} GB), {k.bound}-bound"
            )
            for path, v in k.breakdown.items():
                fed = v.get("mxu", 0) > v["bundles"]  # the path's busiest MXU is fed for longer
                per, unit = (v["mxu"], "MXU-fed") if fed else (v["bundles"], "bundles")
                lines.append(
                    f"    {path:<15} {per:>7,} {unit} x {v['count']:>11,} = "
                    f"{v['cycles']:>15,} cycles ({v['cycles'] / max(k.cycles, 1):6.1%})"
                    + (f"  ({v['bundles']:,} bundles)" if fed else "")
                )
        lines.append(
            f"  XLA glue around the kernels ({self.glue_bytes / 1e9:.3f} GB / HBM bandwidth, included in the "
            f"total): {format_seconds(self.glue_seconds)}"
        )
        return "\n".join(lines)


def format_seconds(seconds: float) -> str:
    """A time in the unit that shows three significant figures or more: ns, µs, ms or s.

    >>> format_seconds(1.2345e-6), format_seconds(0.0421), format_seconds(2.5), format_seconds(0.0)
    ('1.23 µs', '42.10 ms', '2.50 s', '0 s')
    """
    if seconds == 0:
        return "0 s"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.2f} {unit}"
    return f"{seconds / 1e-9:.2f} ns"


def setup_for(impl: str, config: KernelConfig, mask) -> Setup:
    """Resolve block sizes and options for ``mask`` exactly as the compile subprocess does: the
    implementation's own ``config`` rule, compiled for a TPU."""
    length = (config.length or CASE_STUDY.num_tokens) if mask is None else mask.length
    itemsize = np.dtype(config.dtype).itemsize if config.dtype != "bfloat16" else 2
    resolved = registry.get(impl).config(
        mask, length, config.block_q, config.block_kv, config.options or None, interpret=False
    )
    return Setup(
        impl,
        mask,
        length,
        config.num_heads,
        config.head_dim,
        itemsize,
        resolved.block_q,
        resolved.block_kv,
        resolved.block_kv_compute,
        dict(config.options),
        config.num_kv_heads,
        config.head_dim_v,
    )


def check_chip(chip: str) -> None:
    """Raise ValueError unless the static estimate covers ``chip`` (``ESTIMATE_CHIPS``)."""
    if chip not in ESTIMATE_CHIPS:
        raise ValueError(
            f"chip={chip!r}: the static estimate covers {ESTIMATE_CHIPS} (the schedule reader "
            "knows their dump form)"
        )


def make_config(
    impl: str,
    mask,
    chip: str,
    *,
    block_q=None,
    block_kv=None,
    options: dict | None = None,
    num_heads: int = CASE_STUDY.num_heads,
    head_dim: int = CASE_STUDY.head_dim,
    dtype: str = "bfloat16",
    length: int | None = None,
    num_kv_heads: int | None = None,
    head_dim_v: int | None = None,
    backward: bool = False,
) -> tuple[KernelConfig, bytes | None]:
    """The KernelConfig (and pickled mask, for a mask object) of an estimate request (``backward``:
    of the call's backward alone)."""
    from stlib.masks import Mask

    mask_bytes = None
    if mask is None:
        mask = "none"
    if isinstance(mask, Mask):
        try:
            mask_bytes = pickle.dumps(mask)
        except Exception as err:  # any pickling failure means the same thing
            raise TypeError(
                f"cannot send {mask!r} to the compile subprocess ({err}); use a named mask"
            ) from err
        name = repr(mask)
    elif isinstance(mask, str):
        name = mask
    else:
        raise TypeError(f"mask must be a name, a stlib mask or None, got {type(mask).__name__}")
    if num_kv_heads == num_heads:
        num_kv_heads = None
    if head_dim_v == head_dim:
        head_dim_v = None
    if num_kv_heads is not None and (num_kv_heads <= 0 or num_heads % num_kv_heads):
        raise ValueError(f"num_kv_heads={num_kv_heads} must be a positive divisor of num_heads={num_heads}")
    implementation = registry.get(impl)
    implementation.check_supports(shared_kv_heads=num_kv_heads is not None, head_dim_v=head_dim_v is not None)
    config = KernelConfig(
        impl=impl,
        mask=name if mask_bytes is None else "none",
        num_heads=num_heads,
        head_dim=head_dim,
        dtype=dtype,
        block_q=block_q,
        block_kv=block_kv,
        chip=chip,
        length=length,
        num_kv_heads=num_kv_heads,
        head_dim_v=head_dim_v,
        backward=bool(backward),
    )
    fields = {f.name for f in dataclasses.fields(implementation.options_type)}
    if "chip" in fields:  # a kernel that sizes itself per chip is sized for the chip estimated
        options = {"chip": chip, **(options or {})}
        config = dataclasses.replace(config, options=dict(options))
    if "block_kv_compute" in fields:  # resolve the chunk here, so the config names the kernel exactly
        resolved = pickle.loads(mask_bytes) if mask_bytes else resolve_mask(config)
        sizes = setup_for(impl, config, resolved)
        opts = implementation.options({"block_kv_compute": sizes.block_kv_compute, **(options or {})})
        config = dataclasses.replace(config, options=dataclasses.asdict(opts))
    elif options:
        implementation.options(options)  # raises: this implementation takes no such options
        config = dataclasses.replace(config, options=dict(options))
    return config, mask_bytes


def estimate_at_clock(
    impl: str,
    mask="none",
    chip: str = "v6e",
    *,
    block_q: int | None = None,
    block_kv: int | None = None,
    options: dict | None = None,
    num_heads: int = CASE_STUDY.num_heads,
    head_dim: int = CASE_STUDY.head_dim,
    dtype: str = "bfloat16",
    length: int | None = None,
    num_kv_heads: int | None = None,
    head_dim_v: int | None = None,
    backward: bool = False,
    clock_hz: float,
    clock_assumption: str,
    use_cache: bool = True,
) -> Estimate:
    """Static estimate of ``impl`` (a registered Pallas implementation) at the clock ``clock_hz`` (its
    ``clock_assumption`` says where it comes from; ``stlib.analysis.static.estimate`` picks the
    calibrated one) on ``mask`` (a name: "none", "full", "causal", "band (density X)", "band (width W)", a case-study
    catalog name; or a picklable stlib mask) for ``chip`` (one of ``ESTIMATE_CHIPS``), q [num_heads,
    length, head_dim], k [num_kv_heads, length, head_dim], v [num_kv_heads, length, head_dim_v]
    (length defaults to the case study's; kv heads and head_dim_v other than q's: where the
    implementation ``supports`` them). ``options``: fields of the implementation's options.
    ``backward``: the estimate of the call's backward alone (its kernels from the forward's
    residuals, and their glue: di, padding, the final scaling), at the same clock.

    Raises ScheduleFormatError when the libtpu or its dump is not the one this parser knows,
    RuntimeError when the kernel does not compile."""
    from stlib.device import chip_spec

    check_chip(chip)
    config, mask_bytes = make_config(
        impl,
        mask,
        chip,
        block_q=block_q,
        block_kv=block_kv,
        options=options,
        num_heads=num_heads,
        head_dim=head_dim,
        dtype=dtype,
        length=length,
        num_kv_heads=num_kv_heads,
        head_dim_v=head_dim_v,
        backward=backward,
    )
    compiled = compiled_attributions(impl, config, mask_bytes, use_cache)
    setup = setup_for(impl, config, pickle.loads(mask_bytes) if mask_bytes else resolve_mask(config))
    attributions = [Attribution(**{**k, "grid": k["grid"] and tuple(k["grid"])}) for k in compiled["kernels"]]
    if (
        registry.get(impl).estimator.probe_regions
        and not backward
        and sum(p.startswith("compute") for p in attributions[0].paths) == 2
    ):
        _check_region_probe(impl, attributions[0], config, setup, use_cache)
    hz, assumption = clock_hz, clock_assumption
    bandwidth = chip_spec(chip).hbm_bandwidth
    layouts = compiled["layouts"]
    kernels = []
    for att in attributions:
        counts = path_counts(setup, att, layouts.get(att.kernel))
        if counts.grid_steps != att.grid_steps:
            raise ScheduleFormatError(
                f"{att.kernel}: the dump's grid loop runs {att.grid_steps} steps, the layout "
                f"says {counts.grid_steps}"
            )
        executions = {"call": 1, "iteration": att.trip, "step": att.grid_steps, **counts.counts}
        per_execution = path_cycles(att)
        breakdown = {}
        for path, bundles in att.paths.items():
            if path not in executions:
                raise ScheduleFormatError(f"{att.kernel}: no count for path {path!r}")
            breakdown[path] = {
                "bundles": bundles,
                "mxu": att.mxu_cycles.get(path, 0),
                "count": executions[path],
                "cycles": per_execution[path] * executions[path],
            }
        cycles = sum(v["cycles"] for v in breakdown.values())
        exposed = counts.exposed_seconds(_computed_step_cycles(per_execution) / hz, bandwidth)
        kernels.append(
            KernelEstimate(
                att.kernel,
                att.grid_steps,
                cycles,
                breakdown,
                cycles / hz,
                counts.dma_bytes,
                counts.dma_bytes / bandwidth,
                exposed,
            )
        )
    record = {
        **dataclasses.asdict(config),
        "resolved_blocks": {
            "block_q": setup.block_q,
            "block_kv": setup.block_kv,
            "block_kv_compute": setup.block_kv_compute,
        },
    }
    return Estimate(
        impl,
        mask if isinstance(mask, str) else repr(mask),
        chip,
        record,
        tuple(kernels),
        hz,
        assumption,
        compiled["glue_bytes"],
        compiled["glue_bytes"] / bandwidth,
        compiled["key"]["libtpu"],
    )


def path_cycles(att: Attribution) -> dict[str, int]:
    """Cycles one execution of each path takes: its bundles (one issues per cycle), or the cycles
    its busiest MXU is fed where that is longer (``stlib.analysis.mxu_input``: a path cannot issue
    faster than its MXU input arrives)."""
    return {path: max(bundles, att.mxu_cycles.get(path, 0)) for path, bundles in att.paths.items()}


def _computed_step_cycles(paths: dict[str, int]) -> int:
    """Cycles of the cheapest grid step that computes a tile: loop iteration + step + its cheapest
    compute region (the step itself for a kernel whose compute is unconditional)."""
    compute = [v for p, v in paths.items() if p.startswith("compute")]
    return paths["iteration"] + paths["step"] + (min(compute) if compute else 0)


def _check_region_probe(
    impl: str, att: Attribution, config: KernelConfig, setup: Setup, use_cache: bool
) -> None:
    """Which of a kernel's two compute regions is the mask-free one (``Implementation.
    probe_regions``)? Compile a probe with the same blocks where no tile needs a mask (the masked
    region is not traced at all) and compare."""
    length = 2 * math.lcm(setup.block_q, setup.block_kv)
    probe = dataclasses.replace(config, mask="full", length=length, num_heads=1, chip=config.chip)
    kernels = compiled_attributions(impl, probe, None, use_cache)["kernels"]
    free = kernels[0]["paths"].get("compute_full")
    full, masked = att.paths["compute_full"], att.paths["compute_masked"]
    if free is None or abs(free - full) > 0.02 * full or abs(free - full) >= abs(free - masked):
        raise ScheduleFormatError(
            f"probe without masked tiles has a {free}-bundle compute region; the two "
            f"regions here have {full} and {masked}: cannot tell which is mask-free"
        )
