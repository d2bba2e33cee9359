"""Benchmarks: time any implementation on the backend at hand and record every measurement
(``python -m stlib.bench --help``).

``records`` (environment, JSON-lines records, ``compile_function``, ``time_function``) · ``progress``
(counts and time left of long loops) · ``cases`` (the case-study cases, their calls, inputs, work
and estimates) · ``runs`` (one run per command) · ``figures`` (redrawn from ``data/``) ·
``svg_quality`` (what a Sparse VideoGen plan loses, and its work) · ``cli``.
"""

from stlib.bench.cases import (
    Case,
    case_function,
    case_inputs,
    case_study_cases,
    case_work,
    estimate_fields,
    focus_cases,
    sta_windows,
)
from stlib.bench.cli import main
from stlib.bench.figures import draw_figures
from stlib.bench.progress import Progress, progress
from stlib.bench.records import (
    RUN_ID,
    Compiled,
    Recorder,
    Timing,
    compile_function,
    environment,
    read_records,
    time_function,
    time_interleaved,
)
from stlib.bench.runs import (
    CPU_CASE,
    compile_case,
    record_full_scale_work,
    run_case_study,
    run_cpu_scaling,
    run_layout,
    write_published_reference,
)
from stlib.bench.svg_quality import attention_quality, plan_work, quality_sweep, record_quality

__all__ = [
    "CPU_CASE",
    "RUN_ID",
    "Case",
    "Compiled",
    "Progress",
    "Recorder",
    "Timing",
    "attention_quality",
    "case_function",
    "case_inputs",
    "case_study_cases",
    "case_work",
    "compile_case",
    "compile_function",
    "draw_figures",
    "environment",
    "estimate_fields",
    "focus_cases",
    "main",
    "plan_work",
    "progress",
    "quality_sweep",
    "read_records",
    "record_full_scale_work",
    "record_quality",
    "run_case_study",
    "run_cpu_scaling",
    "run_layout",
    "sta_windows",
    "time_function",
    "time_interleaved",
    "write_published_reference",
]
