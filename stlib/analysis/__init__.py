"""What the TPU compiler makes of a kernel, without a TPU: the compile report (VMEM / SMEM per
Pallas kernel) and the static time estimate read from the compiled schedule.

Modules, in the order of the analysis: ``dump`` (compile in a subprocess with libtpu's dump on, read
the dump), ``schedule`` (the bundle / region parser), ``attribution`` (bundles per control path),
``cache`` (compiled attributions on disk), ``counts`` (executions of each path from the tile
layout and each kernel's registry entry), ``kernel_estimate`` (the clock-free estimate of one
call), ``clock`` (peak-implied clocks and the calibration, on top of it), ``static`` (``estimate``
and ``static_estimate``: the two composed, tuned blocks), ``tables``, ``published`` and ``cli``
(``python -m stlib.estimate``). Each imports only those before it.
"""

from stlib.analysis.attribution import Attribution, attribute
from stlib.analysis.cache import cache_dir, compiled_attributions
from stlib.analysis.clock import Calibration, calibration, peak_clock_hz
from stlib.analysis.counts import PathCounts, Setup, path_counts
from stlib.analysis.dump import (
    KernelConfig,
    check_libtpu,
    compile_report,
    compile_with_dump,
    glue_bytes,
    is_pallas_kernel,
    libtpu_version,
    parse_dump,
    resolve_mask,
)
from stlib.analysis.kernel_estimate import (
    ESTIMATE_CHIPS,
    METHOD,
    Estimate,
    KernelEstimate,
    estimate_at_clock,
    make_config,
    setup_for,
)
from stlib.analysis.schedule import (
    PINNED_LIBTPU,
    Schedule,
    ScheduleFormatError,
    parse_bundles,
    parse_schedule,
)
from stlib.analysis.static import TunedEstimate, estimate, static_estimate
from stlib.analysis.tables import calibration_table, case_study_table

__all__ = [
    "ESTIMATE_CHIPS",
    "METHOD",
    "PINNED_LIBTPU",
    "Attribution",
    "Calibration",
    "Estimate",
    "KernelConfig",
    "KernelEstimate",
    "PathCounts",
    "Schedule",
    "ScheduleFormatError",
    "Setup",
    "TunedEstimate",
    "attribute",
    "cache_dir",
    "calibration",
    "calibration_table",
    "case_study_table",
    "check_libtpu",
    "compile_report",
    "compile_with_dump",
    "compiled_attributions",
    "estimate",
    "estimate_at_clock",
    "glue_bytes",
    "is_pallas_kernel",
    "libtpu_version",
    "make_config",
    "parse_bundles",
    "parse_dump",
    "parse_schedule",
    "path_counts",
    "peak_clock_hz",
    "resolve_mask",
    "setup_for",
    "static_estimate",
]
