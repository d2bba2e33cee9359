"""``python -m stlib.estimate``: static TPU time estimates from the compiled kernel schedules. The
estimator lives in ``stlib.analysis``; its public names are re-exported here.

Usage::

    python -m stlib.estimate kernel splash full --chip v6e
    python -m stlib.estimate kernel pallas_tile "band (density 0.25)" --form flat
    python -m stlib.estimate calibrate
    python -m stlib.estimate table --chip v6e
"""

import sys

from stlib.analysis import (  # noqa: F401 - re-exported
    METHOD,
    PINNED_LIBTPU,
    Calibration,
    Estimate,
    KernelEstimate,
    ScheduleFormatError,
    calibration,
    calibration_table,
    case_study_table,
    estimate,
    peak_clock_hz,
)
from stlib.analysis.cli import main

if __name__ == "__main__":
    sys.exit(main())
