"""Dense attention from Splash to the tile kernel, one difference at a time, measured on a TPU.

On dense work the tile kernel is cheaper than Splash at its defaults, and that gain multiplies into
every sparse speed-up over dense Splash. Four things differ between the two: the blocks, the
exponential (exp2 in the tile kernel), the precision of p . v (bf16 p in the tile kernel, f32 in
Splash's source) and the kernel's layout. ``ROWS`` changes one at a time: Splash at its default and
at its best swept blocks, then the tile kernel at its own blocks with Splash's arithmetic (natural
exp, f32 p . v), with bf16 p . v, and with exp2 (its default). Notebook 08 estimates the same rows
(static, v6e) and prints these measurements under them.

    python -m stlib.bench.like_for_like run [--trials 5] [--out DIR]   # on a TPU: about a minute
    python -m stlib.bench.like_for_like table                          # anywhere: the records

Records: ``data/tpu_like_for_like.jsonl``, one per row and chip (the forward on the full mask at the
case-study shape, 10 x 75,600 x 128 bf16, median of the trials after a warm-up), with the blocks the
kernel resolved on the chip.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from stlib import paths
from stlib.bench.block_sweep import BASELINE, NAME

RECORDS = "data/tpu_like_for_like.jsonl"
#: Dense Splash's best blocks in the block sweep's records (estimates), on every chip swept (its
#: table's last column).
SPLASH_BEST = (1024, 2048)
#: (label, impl, blocks (block_q, block_kv) or None for the implementation's defaults on the chip,
#: options), one difference from the row before each.
ROWS = (
    ("Splash, its default blocks", BASELINE, None, None),
    (f"Splash at its best blocks ({SPLASH_BEST[0]:,} x {SPLASH_BEST[1]:,})", BASELINE, SPLASH_BEST, None),
    ("tile kernel: natural exp, f32 p.v", NAME, None, {"exp2": False, "bf16_probs": False}),
    ("tile kernel: natural exp, bf16 p.v", NAME, None, {"exp2": False}),
    ("tile kernel: exp2, bf16 p.v (default)", NAME, None, None),
)


def run(trials: int = 5, out_dir: Path | None = None) -> Path:
    """Time the forward of every row of ``ROWS`` on the full mask at the case-study shape on this TPU,
    appending a record per row. Raises RuntimeError off a TPU."""
    from stlib.bench.progress import Progress
    from stlib.bench.records import Recorder
    from stlib.bench.tpu_measure import measure_case, tpu_chip

    chip = tpu_chip()
    recorder = Recorder(Path(out_dir or paths.data_dir()) / Path(RECORDS).name)
    tracker = Progress(len(ROWS), f"like for like on {chip}")
    for label, impl, blocks, options in ROWS:
        case = {
            "impl": impl,
            "mask": "full",
            "blocks": {"block_q": blocks[0], "block_kv": blocks[1]} if blocks else None,
            "options": options or {},
        }
        (forward,) = measure_case(case, trials, directions=("forward",))
        record = recorder.write({"label": label, **forward})
        tracker.step(f"{label}: {record['median_ms']:.2f} ms")
    return recorder.path


def read(path=None) -> list[dict]:
    """The committed records (``RECORDS`` under the data folder), [] where there are none."""
    from stlib.bench.records import read_records

    path = Path(path or paths.home() / RECORDS)
    return read_records(path) if path.exists() else []


def format_rows(records: list[dict]) -> str:
    """The records of one chip as a table in ``ROWS``' order: blocks, the median ms and each row's
    speed-up over the row before it ("x prev"); a row not measured is left out.

    >>> rows = [{"label": label, "blocks": {"block_q": 512, "block_kv": 1024}, "median_ms": ms}
    ...         for (label, *_), ms in zip(ROWS[:2], (180.0, 150.0))]
    >>> print(format_rows(rows).splitlines()[-1])
    Splash at its best blocks (1,024 x 2,048)       512x1,024     150.00  1.20x
    """
    by_label = {r["label"]: r for r in records}
    lines = [f"{'dense, measured':<44} {'blocks':>13} {'median ms':>9} {'x prev':>6}"]
    previous = None
    for label, *_ in ROWS:
        if label not in by_label:
            continue
        r = by_label[label]
        ms = r["median_ms"]
        step = "" if previous is None else f"{previous / ms:.2f}x"
        lines.append(
            f"{label:<44} {r['blocks']['block_q']:>6,}x{r['blocks']['block_kv']:<6,} {ms:>9.2f} {step:>6}"
        )
        previous = ms
    return "\n".join(lines)


def format_table(records: list[dict]) -> str:
    """``format_rows`` for each chip measured, under a line naming the chip and its device."""
    blocks = []
    for chip in sorted({r["chip"] for r in records}):
        mine = [r for r in records if r["chip"] == chip]
        blocks.append(
            f"measured on {chip} ({mine[0].get('device_kind', '?')}), forward, 10 x 75,600 x 128 bf16, "
            f"no mask:\n{format_rows(mine)}"
        )
    return "\n\n".join(blocks)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m stlib.bench.like_for_like", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run_parser = sub.add_parser("run", help="time every row on this TPU")
    run_parser.add_argument("--trials", type=int, default=5)
    run_parser.add_argument("--out", type=Path, default=None, help="folder of the records (default: data/)")
    sub.add_parser("table", help="the records, chip by chip")
    args = parser.parse_args(argv)
    path = run(args.trials, args.out) if args.command == "run" else None
    print(format_table(read(path)))


if __name__ == "__main__":
    main()
