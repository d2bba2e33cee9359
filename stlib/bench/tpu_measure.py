"""Measured on a TPU: the backward estimate's cases (``backward_estimate.cases``) run on the chip at
hand, forward alone and as a training step (``jax.grad`` of the call: forward and backward), at the
case-study shape (10 heads x 75,600 tokens x 128, bf16), beside their static estimates for that chip.
Nothing in the estimator was fitted to these times: they judge it. The backward's time is derived
(training step minus forward, both medians), and said so.

    python -m stlib.bench.tpu_measure run [--trials 5] [--out DIR]   # on a TPU: a few minutes
    python -m stlib.bench.tpu_measure sweep [--out DIR]              # on a TPU: the block sweep's forwards
    python -m stlib.bench.tpu_measure backward-sweep [--out DIR]     # on a TPU: the backward sweep's steps
    python -m stlib.bench.tpu_measure table                          # anywhere: measured vs estimated

Records: ``data/tpu_measurements.jsonl``, one per (chip, impl, mask, options, direction), with the
blocks the kernel resolved on the chip, the device kind, versions and git revision;
``data/tpu_block_measurements.jsonl``, the forward of every candidate of the block sweep's records
for the chip at hand (``block_sweep.read``), each beside the estimate the sweep ranked it by;
``data/tpu_backward_block_measurements.jsonl``, the training step of every candidate of the
backward sweep's records for the chip at hand, with the backward derived from it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from stlib import paths
from stlib.bench import backward_estimate, block_sweep

RECORDS = "data/tpu_measurements.jsonl"
SWEEP_RECORDS = "data/tpu_block_measurements.jsonl"
BACKWARD_SWEEP_RECORDS = "data/tpu_backward_block_measurements.jsonl"
#: A run is ``slow`` (``sweep_rows``) where it takes more than this times its bundles-only estimate.
SLOW = 1.5
#: What a record times: the call alone, or ``jax.grad`` of it (forward and backward).
DIRECTIONS = ("forward", "train")


def cases(chip: str) -> list[dict]:
    """The table's calls on ``chip``: the tile kernel on every mask of ``backward_estimate.MASKS`` at
    its default blocks, dense Splash at the (block_q, block_kv) its backward's estimate tuned (the
    fused and the split backward each), as (impl, mask, blocks or None, options)."""
    baseline, out = block_sweep.BASELINE, []
    for case in backward_estimate.cases([chip]):
        if case["backward"]:
            continue
        if case["impl"] == baseline:
            continue  # Splash once per backward kind, below
        out.append({"impl": case["impl"], "mask": case["mask"], "blocks": None, "options": {}})
    records = backward_estimate.read()
    for fused in (True, False):
        options = {"fused_backward": fused}
        estimate = records.get((chip, baseline, "none", True, json.dumps(options)))
        blocks = estimate["blocks"] if estimate and estimate.get("estimated") else None
        out.append({"impl": baseline, "mask": "none", "blocks": blocks, "options": options})
    return out


def case_call(case: dict):
    """(fn, resolved config, q, k, v): the call ``case`` names at the case-study shape on random
    bf16 inputs, as the static estimate compiles it (``stlib.analysis.dump.forward_call``)."""
    from stlib import random_qkv, registry
    from stlib.analysis.dump import KernelConfig, forward_call, resolve_mask
    from stlib.configs import CASE_STUDY

    blocks, options = case["blocks"] or {}, dict(case["options"])
    config = KernelConfig(
        impl=case["impl"],
        mask=case["mask"],
        num_heads=CASE_STUDY.num_heads,
        head_dim=CASE_STUDY.head_dim,
        length=CASE_STUDY.num_tokens,
        block_q=blocks.get("block_q"),
        block_kv=blocks.get("block_kv"),
        options=options,
    )
    fn, (q_shape, _, _) = forward_call(config)  # a 3-D tiled order pads: the mask's length, not L
    resolved = registry.get(config.impl).config(
        resolve_mask(config), q_shape.shape[1], config.block_q, config.block_kv, options or None,
        interpret=False,
    )  # fmt: skip
    q, k, v = random_qkv(q_shape.shape, q_shape.dtype, seed=0)
    return fn, resolved, q, k, v


def training_step(fn):
    """(q, k, v) -> (dq, dk, dv) of sum(fn(q, k, v) * do) for a fixed random cotangent do."""
    import jax
    import jax.numpy as jnp

    def grads(q, k, v):
        do = jax.random.normal(jax.random.key(1), q.shape, jnp.float32)
        loss = lambda q, k, v: jnp.sum(fn(q, k, v).astype(jnp.float32) * do)
        return jax.grad(loss, argnums=(0, 1, 2))(q, k, v)

    return grads


def measure_case(case: dict, trials: int, directions=DIRECTIONS) -> list[dict]:
    """The records of ``case`` on this TPU, one per direction of ``directions`` (forward, training
    step): median, min and max of ``trials`` calls after one warm-up, compile time apart."""
    from stlib.bench.records import time_function
    from stlib.device import current_chip

    fn, resolved, q, k, v = case_call(case)
    out = []
    for direction in directions:
        timed = fn if direction == "forward" else training_step(fn)
        timing = time_function(timed, q, k, v, trials=trials)
        out.append(
            {
                "chip": current_chip(),
                "impl": case["impl"],
                "mask": case["mask"],
                "options": case["options"],
                "direction": direction,
                "blocks": {
                    "block_q": resolved.block_q,
                    "block_kv": resolved.block_kv,
                    "block_kv_compute": resolved.block_kv_compute,
                },
                **dataclasses.asdict(timing),  # median_ms, min_ms, max_ms, compile_ms, trials
                "interpret": False,
            }
        )
    return out


def run(trials: int = 5, out_dir: Path | None = None) -> Path:
    """Measure every case of ``cases`` on this TPU, appending each record as it is made. Raises
    RuntimeError off a TPU (interpret-mode times would say nothing here)."""
    from stlib.bench.progress import Progress
    from stlib.bench.records import Recorder

    chip = tpu_chip()
    recorder = Recorder(Path(out_dir or paths.data_dir()) / Path(RECORDS).name)
    todo = cases(chip)
    tracker = Progress(len(todo), f"measured on {chip}")
    for case in todo:
        records = [recorder.write(r) for r in measure_case(case, trials)]
        tracker.step(
            f"{case['impl']} {case['mask']} {case['options'] or ''}: "
            + ", ".join(f"{r['direction']} {r['median_ms']:.2f} ms" for r in records)
        )
    return recorder.path


def sweep(trials: int = 5, out_dir: Path | None = None) -> Path:
    """Time the forward of every compiled candidate of the block sweep's records for this TPU's chip
    (``block_sweep.read``), each record carrying the sweep's estimate (ms and cycles) beside the
    measured median. Raises RuntimeError off a TPU."""
    from stlib.analysis.cache import source_hash
    from stlib.bench.progress import Progress
    from stlib.bench.records import Recorder, time_function

    chip = tpu_chip()
    candidates = [r for r in block_sweep.read() if r["chip"] == chip and "error" not in r]
    recorder = Recorder(Path(out_dir or paths.data_dir()) / Path(SWEEP_RECORDS).name)
    tracker = Progress(len(candidates), f"block sweep measured on {chip}")
    for candidate in candidates:
        options = {}  # as the sweep ran it: Splash's candidates have no kv compute block
        if candidate["block_kv_compute"] is not None:
            options = {"block_kv_compute": candidate["block_kv_compute"], "chip": chip}
        blocks = {"block_q": candidate["block_q"], "block_kv": candidate["block_kv"]}
        fn, _, q, k, v = case_call({"impl": candidate["impl"], "mask": candidate["mask"], "blocks": blocks,
                                    "options": options})  # fmt: skip
        timing = time_function(fn, q, k, v, trials=trials)
        record = recorder.write(
            {
                **{key: candidate[key] for key in ("chip", "family", "mask", "impl", "block_q", "block_kv")},
                "block_kv_compute": candidate["block_kv_compute"],
                "estimated_ms": candidate["total_ms"],
                "estimated_cycles": candidate["cycles"],
                "estimator": candidate.get("estimator"),
                "source": source_hash(candidate["impl"]),  # the kernel measured (the sweep's ``source``)
                **dataclasses.asdict(timing),  # median_ms, min_ms, max_ms, compile_ms, trials
                "interpret": False,
            }
        )
        tracker.step(
            f"{candidate['family']:<12} {candidate['impl']:<24} {candidate['block_q']:>5} x {candidate['block_kv']:<5} "
            f"/ {candidate['block_kv_compute']}: {record['median_ms']:.2f} ms (estimated {record['estimated_ms']:.2f})"
        )
    return recorder.path


def backward_sweep(trials: int = 5, out_dir: Path | None = None) -> Path:
    """Time the training step of every candidate of the backward sweep's records for this TPU's chip
    (``stlib.bench.backward_sweep.read``: the tile kernel's backward blocks on each mask), beside the
    forward alone at its default blocks; each record carries the backward (step minus forward, derived)
    and the sweep's estimate of it. Raises RuntimeError off a TPU."""
    from stlib.analysis.cache import source_hash
    from stlib.bench import backward_sweep as swept
    from stlib.bench.progress import Progress
    from stlib.bench.records import Recorder, time_function

    chip = tpu_chip()
    candidates = [(key, r) for key, r in swept.read().items() if key[0] == chip and r.get("estimated")]
    recorder = Recorder(Path(out_dir or paths.data_dir()) / Path(BACKWARD_SWEEP_RECORDS).name)
    forwards = {}
    tracker = Progress(len(candidates), f"backward sweep measured on {chip}")
    for (_, mask, blocks), r in candidates:
        if mask not in forwards:
            fn, _, q, k, v = case_call({"impl": r["impl"], "mask": mask, "blocks": None, "options": {}})
            forwards[mask] = time_function(fn, q, k, v, trials=trials).median_ms
        fn, _, q, k, v = case_call(
            {"impl": r["impl"], "mask": mask, "blocks": None, "options": {"backward_blocks": list(blocks)}}
        )
        timing = time_function(training_step(fn), q, k, v, trials=trials)
        record = recorder.write(
            {
                "chip": chip,
                "impl": r["impl"],
                "mask": mask,
                "backward_blocks": list(blocks),
                "forward_ms": forwards[mask],
                "train_ms": timing.median_ms,
                "backward_ms": timing.median_ms - forwards[mask],
                "estimated_backward_ms": r["total_ms"],
                "source": source_hash(r["impl"]),
                "trials": timing.trials,
                "compile_ms": timing.compile_ms,
                "interpret": False,
            }
        )
        tracker.step(
            f"{mask:<22} backward blocks {blocks}: step {record['train_ms']:.2f} ms, backward "
            f"{record['backward_ms']:.2f} (estimated {record['estimated_backward_ms']:.2f})"
        )
    return recorder.path


def tpu_chip() -> str:
    """The chip-table name of this process's TPU. Raises RuntimeError off a TPU of the table."""
    from stlib.device import current_chip, device_kind, on_tpu

    chip = current_chip()
    if not on_tpu() or chip is None:
        raise RuntimeError(
            f"python -m stlib.bench.tpu_measure times kernels on a TPU of the chip table; this process "
            f"sees {device_kind()!r}"
        )
    return chip


def _key(record: dict) -> tuple:
    return (
        record["chip"],
        record["impl"],
        record["mask"],
        json.dumps(record.get("options") or {}, sort_keys=True),
        record["direction"],
    )


def read(path=None) -> dict[tuple, dict]:
    """The latest measurement of each case in ``path``, by (chip, impl, mask, options, direction)."""
    from stlib.bench.records import latest_per_key

    return latest_per_key(Path(path or paths.home() / RECORDS), _key)


def judged(measured: dict[tuple, dict], estimated: dict[tuple, dict]) -> list[dict]:
    """Per measured case: forward, training step and backward (step minus forward), measured and
    estimated (``backward_estimate`` records of the same chip, impl, mask and options), the error of
    each estimate, and whether the estimate was made at the blocks the kernel ran.

    >>> m = {("v5e", "k", "full", "{}", "forward"): {"median_ms": 10.0, "blocks": {"block_q": 8}},
    ...      ("v5e", "k", "full", "{}", "train"): {"median_ms": 30.0, "blocks": {"block_q": 8}}}
    >>> e = {("v5e", "k", "full", False, "{}"): {"estimated": True, "total_ms": 9.0, "blocks": {"block_q": 8}},
    ...      ("v5e", "k", "full", True, "{}"): {"estimated": True, "total_ms": 22.0, "blocks": {"block_q": 8}}}
    >>> row, = judged(m, e)
    >>> row["measured"], row["estimated"], row["bundles only"], row["same blocks"]
    ({'forward': 10.0, 'backward': 20.0, 'train': 30.0}, {'forward': 9.0, 'backward': 22.0, 'train': 31.0}, {}, True)
    """
    rows = []
    for chip, impl, mask, options in sorted({k[:4] for k in measured}):
        fwd, train = (measured.get((chip, impl, mask, options, d)) for d in DIRECTIONS)
        if not (fwd and train):
            continue
        est_fwd = estimated.get((chip, impl, mask, False, "{}"))
        est_bwd = estimated.get((chip, impl, mask, True, options))
        got = {"forward": fwd["median_ms"], "backward": train["median_ms"] - fwd["median_ms"]}
        got["train"] = train["median_ms"]
        want, bare = {}, {}
        for part, est in (("forward", est_fwd), ("backward", est_bwd)):
            if est and est.get("estimated"):
                want[part] = est["total_ms"]
                if "bundles_only_ms" in est:
                    bare[part] = est["bundles_only_ms"]
        for parts in (want, bare):
            if len(parts) == 2:
                parts["train"] = parts["forward"] + parts["backward"]
        ran = (fwd["blocks"].get("block_q"), fwd["blocks"].get("block_kv"))
        same = all(
            est is not None
            and ((est.get("blocks") or {}).get("block_q"), (est.get("blocks") or {}).get("block_kv")) == ran
            for est in (est_fwd, est_bwd)
        )
        rows.append(
            {
                "chip": chip,
                "impl": impl,
                "mask": mask,
                "options": json.loads(options),
                "measured": got,
                "estimated": want,
                "bundles only": bare,
                "same blocks": same,
            }
        )
    return rows


def sweep_rows(measurements: list[dict], records: list[dict]) -> list[dict]:
    """Per measured block-sweep candidate (``sweep``'s records) whose sweep record (``block_sweep.read``)
    is of the same kernel source: the measured ms, the sweep's estimate, the estimate with every path
    charged its bundles alone (no MXU feed: ``stlib.analysis.mxu_input``), both at the sweep's clock and
    with its glue, the program's bundles (``kernel_estimate.program_bundles``), and ``slow`` where the
    measured time exceeds ``SLOW`` times that bundles-only estimate (a fact, not a model: on v5e such
    runs were 2.5-2.8x, every other 0.8-0.9x)."""
    from stlib.analysis.kernel_estimate import bundles_only_cycles, program_bundles

    swept = {block_sweep.config_key(r): r for r in records if "cycles" in r}
    rows = []
    for m in measurements:
        r = swept.get(block_sweep.config_key(m))
        if r is None or r.get("source") != m.get("source"):
            continue
        bundles = sum(bundles_only_cycles(kernel) for kernel in r["breakdown"].values())
        bare_ms = bundles / r["clock_hz"] * 1e3 + r["glue_ms"]
        rows.append(
            {
                **{
                    key: m[key]
                    for key in ("chip", "family", "impl", "block_q", "block_kv", "block_kv_compute")
                },
                "measured_ms": m["median_ms"],
                "estimated_ms": r["total_ms"],
                "bundles_only_ms": bare_ms,
                "program_bundles": max(program_bundles(kernel) for kernel in r["breakdown"].values()),
                "slow": m["median_ms"] > SLOW * bare_ms,
            }
        )
    return rows


def format_sweep_rows(rows: list[dict]) -> str:
    """``sweep_rows`` as a table, by family and measured time, then the spread of measured over
    bundles-only for the runs at pace and for the slow ones."""
    lines = [
        (
            f"{'kernel':<24} {'blocks':<16} {'family':<13} {'measured':>9} {'estimate':>9} {'bundles only':>12} "
            f"{'program bundles':>15}"
        )
    ]
    for row in sorted(rows, key=lambda r: (r["family"], r["measured_ms"])):
        blocks = f"{row['block_q']}x{row['block_kv']}/{row['block_kv_compute']}"
        lines.append(
            f"{row['impl']:<24} {blocks:<16} {row['family']:<13} {row['measured_ms']:>9.2f} "
            f"{row['estimated_ms']:>9.2f} {row['bundles_only_ms']:>12.2f} {row['program_bundles']:>15,}"
            + ("  (slow)" if row["slow"] else "")
        )
    for slow, what in ((False, "candidates"), (True, "slow ones")):
        ratios = [r["measured_ms"] / r["bundles_only_ms"] for r in rows if r["slow"] == slow]
        if ratios:
            lines.append(
                f"measured / bundles-only estimate: {min(ratios):.2f}-{max(ratios):.2f} for the {len(ratios)} {what}"
            )
    return "\n".join(lines)


def format_backward_sweep(measurements: list[dict]) -> str:
    """The records of ``backward_sweep``: the tile kernel's backward (step minus forward) at each
    backward block candidate and mask."""
    lines = [
        "the tile kernel's backward at each candidate of the backward sweep, measured (step minus forward):"
    ]
    for m in measurements:
        blocks = "x".join(map(str, m["backward_blocks"]))
        lines.append(f"  {m['mask']:<22} backward blocks {blocks}: {m['backward_ms']:7.2f} ms")
    return "\n".join(lines)


def format_table(rows: list[dict]) -> str:
    """``judged`` rows as a Markdown table: ms measured / estimated and the estimate's error."""
    lines = [
        (
            "MEASURED on a TPU (median of the trials), in brackets the STATIC ESTIMATE of the same call and "
            "then the estimate with every path charged its bundles alone, each with its error (estimate / "
            "measured - 1); backward = training step - forward (derived)"
        ),
        "",
        (
            "| chip | kernel | mask | forward ms | backward ms | training step ms | estimate at the blocks run |"
        ),
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        kind = {True: " fused", False: " split"}.get(row["options"].get("fused_backward"), "")
        cells = []
        for part in ("forward", "backward", "train"):
            got = row["measured"][part]
            guesses = [
                g for g in (row["estimated"].get(part), row["bundles only"].get(part)) if g is not None
            ]
            cells.append(
                f"{got:.2f}"
                + (" (" + "; ".join(f"{g:.2f}, {g / got - 1:+.1%}" for g in guesses) + ")" if guesses else "")
            )
        lines.append(
            f"| {row['chip']} | {row['impl']}{kind} | {row['mask']} | {' | '.join(cells)} | "
            f"{'yes' if row['same blocks'] else 'no'} |"
        )
    fused = [r for r in rows if r["impl"] == block_sweep.BASELINE and r["options"].get("fused_backward")]
    if fused:
        step = fused[0]["measured"]["train"]
        lines.append(
            "\nmeasured training step / dense Splash's (fused backward): "
            + ", ".join(
                f"{r['mask']} {r['measured']['train'] / step:.3f}"
                for r in rows
                if r["impl"] != block_sweep.BASELINE
            )
        )
    return "\n".join(lines)


def main(argv=None) -> None:
    from stlib.bench.records import read_records

    parser = argparse.ArgumentParser(
        prog="python -m stlib.bench.tpu_measure", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run_parser = sub.add_parser("run", help="time every case on this TPU")
    run_parser.add_argument("--trials", type=int, default=5)
    run_parser.add_argument("--out", type=Path, default=None, help="folder of the records (default: data/)")
    sweep_parser = sub.add_parser("sweep", help="time the block sweep's candidates for this TPU's chip")
    sweep_parser.add_argument("--trials", type=int, default=5)
    sweep_parser.add_argument("--out", type=Path, default=None, help="folder of the records (default: data/)")
    backward_parser = sub.add_parser(
        "backward-sweep", help="time the backward sweep's candidates for this TPU's chip (training steps)"
    )
    backward_parser.add_argument("--trials", type=int, default=5)
    backward_parser.add_argument(
        "--out", type=Path, default=None, help="folder of the records (default: data/)"
    )
    sub.add_parser("table", help="the records beside the static estimates")
    args = parser.parse_args(argv)
    path = None
    if args.command == "run":
        path = run(args.trials, args.out)
    if args.command == "sweep":
        sweep(args.trials, args.out)
        return
    if args.command == "backward-sweep":
        backward_sweep(args.trials, args.out)
        return
    print(format_table(judged(read(path), backward_estimate.read())))
    sweep_measured = block_sweep.read_measurements(paths.home() / SWEEP_RECORDS)
    if sweep_measured:
        print("\n" + format_sweep_rows(sweep_rows(sweep_measured, block_sweep.read())))
    backward_path = paths.home() / BACKWARD_SWEEP_RECORDS
    if backward_path.exists():
        print("\n" + format_backward_sweep(read_records(backward_path)))


if __name__ == "__main__":
    main()
