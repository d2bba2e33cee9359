"""Clocks: the static cycle count becomes time through an explicit clock, by default the one
calibration (dense Splash's static cycles against its published time), or the peak-implied clock."""

from __future__ import annotations

from dataclasses import dataclass

from stlib.configs import PUBLISHED

PUBLISHED_DENSE_SPLASH_SECONDS = PUBLISHED["dense_splash_ms"] * 1e-3
#: Chips the estimate covers: the schedule reader knows their dump form (TPU7x writes branches in
#: another form, see ../shared/REFERENCE.md section 6, and has no reader yet) and a clock exists.
ESTIMATE_CHIPS = ("v6e", "v5e")


def peak_clock_hz(chip: str) -> float:
    """bf16 peak / (2 flops x MXUs x MXU width^2), all from the chip table. Caveat: the table
    gives v6e 2 MXUs of 256 (3.5 GHz from this formula); some Google pages say 4 (1.75 GHz)."""
    from stlib.device import chip_spec

    spec = chip_spec(chip)
    return spec.bf16_flops / (2 * spec.num_mxus * spec.mxu_width**2)


@dataclass(frozen=True)
class Calibration:
    """The one calibration used throughout: the clock at which the static cycles of dense Splash
    (impl "splash", mask "full", the adapter's default blocks 512 / 1024 / 512, case-study shape,
    v6e) take the published 78.70 ms. It folds the stalls the static count misses into the clock.
    Other chips scale it by the ratio of their peak-implied clocks (an assumption: the same
    fraction of the clock lost to stalls)."""

    static_cycles: int
    implied_clock_hz: float
    published_seconds: float = PUBLISHED_DENSE_SPLASH_SECONDS

    def clock_hz(self, chip: str) -> float:
        return self.implied_clock_hz * peak_clock_hz(chip) / peak_clock_hz("v6e")

    def describe(self, chip: str) -> str:
        return (f"calibrated: {self.clock_hz(chip) / 1e9:.3f} GHz effective = clock at which dense Splash's "
                f"{self.static_cycles:,} static v6e cycles (blocks 512/1024/512) take the published "
                f"{self.published_seconds * 1e3:.2f} ms" + ("" if chip == "v6e" else
                f", scaled by peak-implied clocks {chip}/v6e"))


_CALIBRATION: Calibration | None = None


def calibration(use_cache: bool = True) -> Calibration:
    """The calibration (computed once per process; ``use_cache=False`` recompiles and recomputes it)."""
    global _CALIBRATION
    from stlib.analysis.kernel_estimate import estimate  # the calibration is itself an estimate

    if _CALIBRATION is None or not use_cache:
        reference = estimate("splash", "full", "v6e", clock=1.0, use_cache=use_cache)
        if reference.memory_seconds >= PUBLISHED_DENSE_SPLASH_SECONDS:
            raise RuntimeError("dense Splash's memory floor exceeds its published time: cannot calibrate a clock")
        _CALIBRATION = Calibration(reference.cycles, reference.cycles / PUBLISHED_DENSE_SPLASH_SECONDS)
    return _CALIBRATION


def _clock(clock, chip: str, use_cache: bool) -> tuple[float, str]:
    if clock == "calibrated":
        cal = calibration(use_cache)
        return cal.clock_hz(chip), cal.describe(chip)
    if clock == "peak":
        hz = peak_clock_hz(chip)
        return hz, f"peak-implied: {hz / 1e9:.3f} GHz = bf16 peak / (2 x MXUs x width^2) from JAX's chip table"
    if isinstance(clock, (int, float)) and clock > 0:
        return float(clock), f"given: {clock / 1e9:.3f} GHz"
    raise ValueError(f"clock={clock!r} must be 'calibrated', 'peak' or a positive frequency in Hz")
