"""Clocks: the static cycle count becomes time through an explicit clock, by default the chip's
calibration (the static estimate of one published measurement on that chip, solved for the clock),
or the peak-implied clock. Built on the clock-free per-kernel estimate
(``stlib.analysis.kernel_estimate``); ``stlib.analysis.static`` composes the two.

One published point per chip, nothing else fitted (``CALIBRATION_POINTS``); a chip without one
borrows another chip's calibration scaled by their peak-implied clocks (``BORROWED``). Every other
published measurement (``data/published_measurements.json``) is held out to judge the model.
"""

from __future__ import annotations

from dataclasses import dataclass

from stlib import registry
from stlib.analysis.kernel_estimate import ESTIMATE_CHIPS, estimate_at_clock  # noqa: F401 - ESTIMATE_CHIPS re-exported
from stlib.analysis.schedule import ScheduleFormatError
from stlib.configs import CASE_STUDY, PUBLISHED

PUBLISHED_DENSE_SPLASH_SECONDS = PUBLISHED["dense_splash_ms"] * 1e-3


@dataclass(frozen=True)
class CalibrationPoint:
    """A published kernel time on one chip and the call that produced it. ``kernel``: the
    implementation that ran it (None: the registry's ``baseline()``, dense Splash); ``blocks``: the
    blocks (block_q, block_kv) assumed, or "tuned" (the best of its ``tuned_candidates``, as blocks
    tuned by the benchmark's authors)."""

    chip: str
    published_seconds: float
    source: str
    kernel: str | None = None
    mask: str = "full"
    num_heads: int = CASE_STUDY.num_heads
    num_kv_heads: int | None = None
    head_dim: int = CASE_STUDY.head_dim
    length: int = CASE_STUDY.num_tokens
    blocks: tuple[int, int] | str = (512, 1024)

    @property
    def impl(self) -> str:
        return self.kernel or registry.baseline().name

    def estimate(
        self,
        block_q: int | None,
        block_kv: int | None,
        *,
        chip: str | None = None,
        clock=1.0,
        use_cache: bool = True,
    ):
        """The static estimate of this point's call with these blocks (on ``chip``, default its own)
        at ``clock`` (see ``resolve_clock``)."""
        chip = chip or self.chip
        hz, assumption = resolve_clock(clock, chip, use_cache)
        return estimate_at_clock(
            self.impl,
            self.mask,
            chip,
            block_q=block_q,
            block_kv=block_kv,
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            length=self.length,
            clock_hz=hz,
            clock_assumption=assumption,
            use_cache=use_cache,
        )

    def describe(self) -> str:
        kv = "" if self.num_kv_heads is None else f" ({self.num_kv_heads} kv heads)"
        return (
            f"{self.impl} {self.mask}, {self.num_heads} heads{kv} x {self.length:,} x {self.head_dim} bf16 on "
            f"{self.chip}: {self.published_seconds * 1e3:.2f} ms ({self.source})"
        )


#: The one published point per chip the clock is solved from.
CALIBRATION_POINTS = {
    "v6e": CalibrationPoint("v6e", PUBLISHED_DENSE_SPLASH_SECONDS, PUBLISHED["source"]),
    "tpu7x": CalibrationPoint(
        "tpu7x",
        24.75e-3,
        'tokamax, "Performance Benchmarks on Ironwood TPU", November 2025 (Splash forward, '
        "batch 1, blocks tuned by its authors)",
        mask="causal",
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        length=32768,
        blocks="tuned",
    ),
}
#: Chips without a published point: whose calibration they borrow, scaled by peak-implied clocks
#: (an assumption: the same share of cycles lost to stalls the schedule does not show).
BORROWED = {"v5e": "v6e"}


def peak_clock_hz(chip: str) -> float:
    """bf16 peak / (2 flops x MXUs x MXU width^2), all from the chip table. Caveat: the table
    gives v6e 2 MXUs of 256 (3.5 GHz from this formula); some Google pages say 4 (1.75 GHz)."""
    from stlib.device import chip_spec

    spec = chip_spec(chip)
    return spec.bf16_flops / (2 * spec.num_mxus * spec.mxu_width**2)


@dataclass(frozen=True)
class Calibration:
    """The clock at which the static estimate of ``point`` takes its published time: it folds the
    stalls the static count misses into the clock. ``blocks``: the blocks the point ran with here."""

    static_cycles: int
    implied_clock_hz: float
    published_seconds: float = PUBLISHED_DENSE_SPLASH_SECONDS
    point: CalibrationPoint = CALIBRATION_POINTS["v6e"]
    blocks: tuple[int, int] = (512, 1024)

    def clock_hz(self, chip: str) -> float:
        if chip == self.point.chip:
            return self.implied_clock_hz
        if BORROWED.get(chip) != self.point.chip:
            raise ValueError(f"chip={chip!r} does not borrow the {self.point.chip} calibration")
        return self.implied_clock_hz * peak_clock_hz(chip) / peak_clock_hz(self.point.chip)

    def describe(self, chip: str) -> str:
        own = self.point.chip
        return (
            f"calibrated: {self.clock_hz(chip) / 1e9:.3f} GHz effective = clock at which the static estimate of "
            f"{self.point.impl} / {self.point.mask} ({self.static_cycles:,} {own} cycles, blocks "
            f"{self.blocks[0]}/{self.blocks[1]}) takes the published {self.published_seconds * 1e3:.2f} ms"
            + (
                ""
                if chip == own
                else f"; {chip} has no published point: scaled by peak-implied clocks {chip}/{own}"
            )
        )


_CALIBRATIONS: dict[str, Calibration] = {}


def solve_clock(point: CalibrationPoint, block_q: int | None, block_kv: int | None, use_cache: bool = True):
    """(cycles, clock in Hz) at which the estimate of ``point`` with these blocks takes its published
    time: cycles / clock + exposed DMA = published (fixed point; the exposed part is small)."""

    def run(clock):
        return point.estimate(block_q, block_kv, clock=clock, use_cache=use_cache)

    est = run(1.0)
    if est.memory_seconds >= point.published_seconds:
        raise RuntimeError(
            f"the DMA floor of {point.describe()} exceeds its published time: cannot calibrate a clock"
        )
    hz = est.cycles / point.published_seconds
    for _ in range(3):
        exposed = run(hz).exposed_dma_seconds
        hz = est.cycles / (point.published_seconds - exposed)
    return est.cycles, hz


def calibration(chip: str = "v6e", use_cache: bool = True) -> Calibration:
    """The calibration ``chip``'s clock comes from (its own point, or the one it borrows); computed
    once per process (``use_cache=False`` recompiles and recomputes it)."""
    owner = BORROWED.get(chip, chip)
    if owner not in CALIBRATION_POINTS:
        raise ValueError(
            f"chip={chip!r} has no calibration point and borrows none: {sorted(CALIBRATION_POINTS)}"
        )
    if owner not in _CALIBRATIONS or not use_cache:
        point = CALIBRATION_POINTS[owner]
        if point.blocks == "tuned":
            blocks = best_blocks(point, use_cache=use_cache)
        else:
            blocks = point.blocks
        cycles, hz = solve_clock(point, *blocks, use_cache=use_cache)
        _CALIBRATIONS[owner] = Calibration(cycles, hz, point.published_seconds, point, tuple(blocks))
    return _CALIBRATIONS[owner]


def best_blocks(point: CalibrationPoint, chip: str | None = None, use_cache: bool = True) -> tuple[int, int]:
    """The (block_q, block_kv) of the point's implementation's ``tuned_candidates`` with the fewest
    static cycles for ``point`` (clock-free: the clock is what the point calibrates)."""
    results = []
    for bq, bkv in registry.get(point.impl).estimator.tuned_candidates:
        try:
            est = point.estimate(bq, bkv, chip=chip, use_cache=use_cache)
        except ScheduleFormatError:  # a schedule this reader does not know: never skipped silently
            raise
        except RuntimeError:  # does not compile (VMEM): not a candidate
            continue
        results.append((est.cycles, (bq, bkv)))
    if not results:
        raise RuntimeError(f"no candidate block size compiles for {point.describe()}")
    return min(results)[1]


def resolve_clock(clock, chip: str, use_cache: bool = True) -> tuple[float, str]:
    """(Hz, the words saying where it comes from) of ``clock``: "calibrated" (``calibration``),
    "peak" (``peak_clock_hz``) or a frequency in Hz. Raises ValueError for anything else."""
    if clock == "calibrated":
        cal = calibration(chip, use_cache)
        return cal.clock_hz(chip), cal.describe(chip)
    if clock == "peak":
        hz = peak_clock_hz(chip)
        return (
            hz,
            f"peak-implied: {hz / 1e9:.3f} GHz = bf16 peak / (2 x MXUs x width^2) from JAX's chip table",
        )
    if isinstance(clock, (int, float)) and clock > 0:
        return float(clock), f"given: {clock / 1e9:.3f} GHz"
    raise ValueError(f"clock={clock!r} must be 'calibrated', 'peak' or a positive frequency in Hz")
