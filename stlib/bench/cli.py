"""Benchmarks: time any implementation on the backend at hand and record every measurement.

    python -m stlib.bench case-study   # dense Splash vs every stlib kernel across densities
    python -m stlib.bench cpu-scaling  # xla block-sparse vs dense xla for growing L (honest on CPU)
    python -m stlib.bench layout       # mask + layout construction time and peak memory
    python -m stlib.bench figures      # redraw the figures from data/ (no hardware needed)

Records are JSON lines appended to ``data/<command>.jsonl`` of stlib's home (``stlib.paths``: the
clone, or ``STLIB_HOME``; ``--out`` names another folder), flushed per record, so a crashed run
loses nothing already written. Off a TPU, Pallas kernels run in interpret mode: those times say
nothing about TPU speed and every record says so (``interpret: true``); next to them the
hardware-independent work at the full case-study shape and a compile check for v6e are recorded.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from stlib import paths
from stlib.bench.figures import draw_figures
from stlib.bench.runs import run_case_study, run_cpu_scaling, run_layout, write_published_reference


def main(argv=None) -> None:
    """Run the command named in ``argv`` (``sys.argv[1:]`` by default), then redraw the figures."""
    parser = argparse.ArgumentParser(
        prog="python -m stlib.bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("command", choices=["case-study", "cpu-scaling", "layout", "figures", "all"])
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="directory of the .jsonl records (default: data/ of stlib.paths.home())",
    )
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--no-compile-check", action="store_true", help="skip the v6e compile checks")
    parser.add_argument(
        "--no-estimates",
        action="store_true",
        help="skip the static v6e / v5e estimates of the full-shape records (stlib.estimate)",
    )
    args = parser.parse_args(argv)
    args.out = paths.data_dir() if args.out is None else args.out
    write_published_reference(args.out)
    if args.command in ("case-study", "all"):
        run_case_study(
            args.out,
            trials=args.trials,
            compile_check=not args.no_compile_check,
            estimates=not args.no_estimates,
        )
    if args.command in ("cpu-scaling", "all"):
        run_cpu_scaling(args.out, trials=args.trials)
    if args.command in ("layout", "all"):
        run_layout(args.out)
    for path in draw_figures(args.out):
        print(f"figure: {path}")
