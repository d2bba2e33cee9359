"""Why some block sizes run 2.5-2.8x their schedule on a TPU v5e: the same work in programs of
different sizes, measured.

``python -m stlib.bench.tpu_measure sweep`` found 6 of 19 forward candidates on a v5e running
2.45-2.81x their bundles-only estimate (``tpu_measure.SLOW``), and they were exactly the programs of
72,179 bundles and more (``kernel_estimate.program_bundles``); every program of 61,547 or fewer ran
at 0.82-0.91x. The schedule does not see what slows them. ``PROBES`` are calls that keep a slow
candidate's blocks and change only an option that changes the program (no pattern regions, no scores
issued ahead, whole q tiles instead of folds), and fast candidates changed the same way: if the size
of the program is what slows it, a slow candidate made small runs at pace and a fast one made large
runs slow; if the time follows the blocks whatever the program, it is not the size.

    python -m stlib.bench.program_size_probe run [--only LABEL ...] [--out DIR]   # on a TPU: minutes
    python -m stlib.bench.program_size_probe table                               # anywhere (compiles)

Records: ``data/tpu_program_size_probe.jsonl``, one per probe and chip (the measured forward, median
of the trials). ``table`` puts each beside its static estimate on that chip: bundles-only ms
(``Estimate.bundles_only_seconds``) and program bundles, compiled here (deviceless); ``backward_rows``
does the same for the backward sweep's measurements of the band (``tpu_measure.backward_sweep``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from stlib import paths
from stlib.bench.block_sweep import NAME as IMPL  # the tile kernel the block sweep tunes

RECORDS = "data/tpu_program_size_probe.jsonl"
BAND, SLIDING, DENSE = "band (density 0.25)", "sliding tile, 3-D tiled order", "full"


@dataclass(frozen=True)
class Probe:
    """One forward call at the case-study shape: ``mask`` (a ``stlib.analysis.dump`` mask name) at
    ``blocks`` (block_q, block_kv, keys per chunk) with ``options`` beside them."""

    label: str
    mask: str
    blocks: tuple[int, int, int]
    options: tuple = ()

    def call_options(self, chip: str) -> dict:
        """The kernel's options for ``chip``: the chunk, the chip, and the probe's own."""
        return {"block_kv_compute": self.blocks[2], "chip": chip, **dict(self.options)}


PROBES = (
    Probe("band 2048x2048 (slow)", BAND, (2048, 2048, 256)),
    Probe("band 2048x2048, no patterns", BAND, (2048, 2048, 256), (("pattern_grain", 0),)),
    Probe("band 2048x2048, no lookahead", BAND, (2048, 2048, 256), (("lookahead", 0),)),
    Probe("band 2048x2048, grain 512", BAND, (2048, 2048, 256), (("pattern_grain", 512),)),
    Probe("band 2048x2048, grain 1024", BAND, (2048, 2048, 256), (("pattern_grain", 1024),)),
    Probe("band 2560x2560, no patterns", BAND, (2560, 2560, 256), (("pattern_grain", 0),)),
    Probe("band 2048x1024", BAND, (2048, 1024, 256)),
    Probe("band 1024x2048 (at pace)", BAND, (1024, 2048, 256)),
    Probe("band 1024x2048, no patterns", BAND, (1024, 2048, 256), (("pattern_grain", 0),)),
    Probe("band 1024x2048, register 96", BAND, (1024, 2048, 256), (("block_kv_register", 96),)),
    Probe("band 1024x2048, register 64", BAND, (1024, 2048, 256), (("block_kv_register", 64),)),
    Probe("sliding 1920x3840 (slow)", SLIDING, (1920, 3840, 384)),
    Probe("sliding 1920x3840, no lookahead", SLIDING, (1920, 3840, 384), (("lookahead", 0),)),
    Probe("dense 2048x2048 (at pace)", DENSE, (2048, 2048, 256)),
    Probe("dense 2048x2048, whole q tiles", DENSE, (2048, 2048, 256), (("block_q_compute", 2048),)),
)


def probes(only=None) -> list[Probe]:
    """``PROBES``, or those labelled in ``only``. Raises ValueError naming an unknown label."""
    if not only:
        return list(PROBES)
    labels = {p.label for p in PROBES}
    unknown = sorted(set(only) - labels)
    if unknown:
        raise ValueError(f"unknown probes {unknown}; choose among {sorted(labels)}")
    return [p for p in PROBES if p.label in only]


def run(only=None, trials: int = 5, out_dir: Path | None = None) -> Path:
    """Time the forward of each probe on this TPU, appending each record as it is made. Raises
    RuntimeError off a TPU."""
    from stlib.bench.progress import Progress
    from stlib.bench.records import Recorder, time_function
    from stlib.bench.tpu_measure import case_call, tpu_chip

    chip = tpu_chip()
    todo = probes(only)
    recorder = Recorder(Path(out_dir or paths.data_dir()) / Path(RECORDS).name)
    tracker = Progress(len(todo), f"program-size probes on {chip}")
    for probe in todo:
        blocks = {"block_q": probe.blocks[0], "block_kv": probe.blocks[1]}
        fn, _, q, k, v = case_call(
            {"impl": IMPL, "mask": probe.mask, "blocks": blocks, "options": probe.call_options(chip)}
        )
        timing = time_function(fn, q, k, v, trials=trials)
        record = recorder.write(
            {
                "chip": chip,
                "probe": probe.label,
                "impl": IMPL,
                "mask": probe.mask,
                "blocks": list(probe.blocks),
                "options": dict(probe.options),
                **dataclasses.asdict(timing),  # median_ms, min_ms, max_ms, compile_ms, trials
                "interpret": False,
            }
        )
        tracker.step(f"{probe.label}: {record['median_ms']:.2f} ms")
    return recorder.path


def read(path=None) -> dict[tuple, dict]:
    """The latest record of each (chip, probe) in ``path`` (default ``RECORDS`` under the home)."""
    from stlib.bench.records import latest_per_key

    return latest_per_key(Path(path or paths.home() / RECORDS), lambda r: (r["chip"], r["probe"]))


def rows(records: dict[tuple, dict]) -> list[dict]:
    """Per record: the measured ms beside the static estimate of the same call on its chip (compiled
    here, cached as every estimate): bundles-only ms, program bundles, and measured / bundles-only."""
    from stlib.analysis.static import static_estimate
    from stlib.configs import CASE_STUDY

    by_label = {p.label: p for p in PROBES}
    out = []
    for (chip, label), r in records.items():
        probe = by_label.get(label)
        if probe is None:
            continue
        est = static_estimate(
            IMPL,
            probe.mask,
            chip,
            num_heads=CASE_STUDY.num_heads,
            head_dim=CASE_STUDY.head_dim,
            length=CASE_STUDY.num_tokens,
            block_sizes={"block_q": probe.blocks[0], "block_kv": probe.blocks[1]},
            options=probe.call_options(chip),
        )
        out.append(_row(chip, label, r["median_ms"], est))
    return out


def _row(chip: str, label: str, measured_ms: float, est) -> dict:
    """One table row: a measured time beside its static estimate's bundles-only ms and program size."""
    bare_ms = est.bundles_only_seconds * 1e3
    return {
        "chip": chip,
        "probe": label,
        "measured_ms": measured_ms,
        "bundles_only_ms": bare_ms,
        "program_bundles": max(k.program_bundles for k in est.kernels),
        "ratio": measured_ms / bare_ms,
    }


def backward_rows(measurements: list[dict], mask: str = BAND) -> list[dict]:
    """Per TPU measurement of the backward sweep on ``mask`` (``tpu_measure.backward_sweep``'s
    records): the measured backward beside the static estimate of that backward on its chip (compiled
    here): bundles-only ms, program bundles of its largest kernel, and measured / bundles-only."""
    from stlib.analysis.static import static_estimate
    from stlib.configs import CASE_STUDY

    out = []
    for m in measurements:
        if m["mask"] != mask:
            continue
        est = static_estimate(
            IMPL,
            mask,
            m["chip"],
            num_heads=CASE_STUDY.num_heads,
            head_dim=CASE_STUDY.head_dim,
            length=CASE_STUDY.num_tokens,
            options={"backward_blocks": list(m["backward_blocks"])},
            backward=True,
        )
        label = "backward " + "x".join(map(str, m["backward_blocks"]))
        out.append(_row(m["chip"], label, m["backward_ms"], est))
    return out


def format_rows(table_rows: list[dict]) -> str:
    """``rows`` (or ``backward_rows``) as a fixed-width table, in ``PROBES``' order."""
    order = {p.label: n for n, p in enumerate(PROBES)}
    header = (
        f"{'chip':<5} {'probe':<34} {'measured ms':>11} {'bundles-only ms':>15} {'program bundles':>15} "
        f"{'measured / bundles-only':>23}"
    )
    lines = [header]
    for row in sorted(table_rows, key=lambda r: (r["chip"], order.get(r["probe"], len(order)))):
        lines.append(
            f"{row['chip']:<5} {row['probe']:<34} {row['measured_ms']:>11.2f} {row['bundles_only_ms']:>15.2f} "
            f"{row['program_bundles']:>15,} {row['ratio']:>23.2f}"
        )
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m stlib.bench.program_size_probe", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run_parser = sub.add_parser("run", help="time the probes on this TPU")
    run_parser.add_argument("--only", nargs="*", help="probe labels")
    run_parser.add_argument("--trials", type=int, default=5)
    run_parser.add_argument("--out", type=Path, default=None, help="folder of the records (default: data/)")
    sub.add_parser("table", help="the records beside their static estimates")
    args = parser.parse_args(argv)
    if args.command == "run":
        print(json.dumps(str(run(args.only, args.trials, args.out))))
        return
    print(format_rows(rows(read())))


if __name__ == "__main__":
    main()
