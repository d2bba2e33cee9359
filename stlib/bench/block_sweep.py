"""Block sizes chosen, not guessed: the second-generation tile kernel (``pallas_tile_lane_dense``)
at every candidate (block_q, block_kv, block_kv_compute) per chip and mask family, and dense Splash
at its own candidates, scored by the static estimate; records appended to
``data/tile_block_sweep.jsonl`` (``figure_rows`` turns them into the data ``plotting.block_sweep`` draws).

    python -m stlib.bench.block_sweep [run] [chip ...]   # then writes the tuned blocks
    python -m stlib.bench.block_sweep tune | table | figure
"""

from __future__ import annotations

import math
from pathlib import Path

from stlib import paths, registry, tuned
from stlib.configs import CASE_STUDY
from stlib.device import chip_spec
from stlib.geometry import tile_rows, tiled_order
from stlib.registry import Role

#: The kernel swept (the best tile kernel) and the baseline every candidate is a ratio to (dense Splash).
KERNEL = registry.by_role(Role.BEST_TILE)
NAME = KERNEL.name
BASELINE = registry.baseline().name
#: Mask families of the sweep (estimator mask names); the block candidates (block_q, block_kv,
#: block_kv_compute) of each are the kernel's ``sweep_candidates``.
SWEEP_MASKS = {
    "dense": "full",
    "band 0.25": "band (density 0.25)",
    "sliding tile": "sliding tile, 3-D tiled order",
}
SWEEP_BLOCKS = KERNEL.presentation.sweep_candidates
SWEEP_CHIPS = ("v6e", "v5e", "tpu7x")
#: The sweep's records and figure, relative to ``stlib.paths.home()``.
RECORDS = "data/tile_block_sweep.jsonl"
#: The sweep's candidates timed on a TPU (``python -m stlib.bench.tpu_measure sweep``): where they
#: cover a chip, ``tune`` ranks that chip's candidates by them.
MEASUREMENTS = "data/tpu_block_measurements.jsonl"
#: Tokens in one row of the case study's 3-D tiles (a 3x8x16 tile times five along x, 1,920): the
#: sliding-tile candidates' unit, whose whole rows the kernel's default rule can express.
SLIDING_TILE_ROW = math.prod(tile_rows(tiled_order(CASE_STUDY.grid, CASE_STUDY.sta_tile)))


def sweep(
    chips=SWEEP_CHIPS,
    families=tuple(SWEEP_MASKS),
    workers: int = 2,
    path=None,
    resume: bool = True,
):
    """Static estimates of this kernel at every candidate block of ``SWEEP_BLOCKS`` (and the baseline,
    dense Splash, at the ``tuned_candidates`` of its tuned estimate) on ``chips``,
    appended as records to ``path``; returns the new records. A chip's records are appended together
    once its last candidate is done, so ``read`` never takes a chip's sweep from a run stopped halfway
    (run again, its finished compiles come back from the estimate cache). With ``resume``, candidates
    that already have an estimate in ``path`` are not run again. Candidates that do not compile (VMEM)
    are recorded with the compiler's reason."""
    import json
    from collections import Counter
    from concurrent.futures import ThreadPoolExecutor
    from pathlib import Path

    from stlib import analysis
    from stlib.analysis.cache import estimator_hash, source_hash
    from stlib.bench.progress import Progress
    from stlib.provenance import provenance

    path = path or paths.home() / RECORDS
    origin = provenance()  # date, git revision, jax and libtpu versions, under every record's names
    jobs = [  # chip by chip: a partial run is whole for its chips
        (chip, family, impl, blocks)
        for chip in chips
        for impl in (NAME, BASELINE)
        for family, blocks in candidates(impl)
        if family in families or impl == BASELINE  # every ratio needs the baseline
    ]
    sources = {impl: source_hash(impl) for impl in (NAME, BASELINE)}
    estimator = estimator_hash()
    if resume and Path(path).exists():  # an estimate of the same kernel source and estimator is not run again
        done = {
            (r["chip"], r["family"], r["impl"], (r["block_q"], r["block_kv"], r["block_kv_compute"]))
            for r in read(path)
            if "cycles" in r and r.get("source") == sources[r["impl"]] and r.get("estimator") == estimator
        }
        jobs = [job for job in jobs if job not in done]

    def one(chip, family, impl, blocks):
        bq, bkv, chunk = blocks
        record = {
            "chip": chip,
            "family": family,
            "mask": SWEEP_MASKS[family],
            "impl": impl,
            "block_q": bq,
            "block_kv": bkv,
            "block_kv_compute": chunk,
            "shape": list(CASE_STUDY.qkv_shape),
            "dtype": "bfloat16",
            "source": sources[impl],  # the kernel's sources (stlib.analysis.cache.source_hash)
            "estimator": estimator,  # the estimator's own sources (stlib.analysis.cache.estimator_hash)
            **origin,
        }
        options = None
        if impl == NAME:
            options = {"block_kv_compute": chunk, "chip": chip}
            facts = KERNEL.presentation.sweep_facts
            if facts is not None:
                record |= facts(chip, family, bq, bkv, chunk, head_dim=CASE_STUDY.head_dim, itemsize=2)
        try:
            est = analysis.estimate(
                impl, SWEEP_MASKS[family], chip, block_q=bq, block_kv=bkv, options=options
            )
        except (ValueError, RuntimeError) as error:
            lines = [line.strip() for line in str(error).splitlines() if line.strip()]
            return {**record, "error": " ".join(lines[-3:])[-400:]}  # the compiler's reason comes last
        kernels = est.kernels
        return {
            **record,
            "estimate_ms": est.seconds * 1e3,
            "total_ms": est.total_seconds * 1e3,
            "glue_ms": est.glue_seconds * 1e3,
            "cycles": est.cycles,
            "grid_steps": sum(k.grid_steps for k in kernels),
            "dma_floor_ms": est.memory_seconds * 1e3,
            "breakdown": {k.kernel: k.breakdown for k in kernels},
            "libtpu": est.libtpu_version,
            "clock_hz": est.clock_hz,
            "static_estimate": True,
        }

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    records, unwritten = [], []
    left = Counter(job[0] for job in jobs)  # jobs left per chip
    with ThreadPoolExecutor(max_workers=workers) as pool, Progress(len(jobs), "sweep") as tracker:
        for record in pool.map(lambda job: one(*job), jobs):
            records.append(record)
            unwritten.append(record)
            left[record["chip"]] -= 1
            if not left[record["chip"]]:  # a chip's records land together: no partial sweep is read
                with out.open("a") as handle:
                    handle.writelines(json.dumps(r) + "\n" for r in unwritten)
                unwritten.clear()
            tracker.step(
                f"{record['chip']:<5} {record['family']:<12} {record['impl']:<24} {record['block_q']:>5} "
                f"{record['block_kv']:>5} {record['block_kv_compute'] or '-':>5} "
                f"{record.get('total_ms', float('nan')):>8.2f} ms  {record.get('error', '')[:80]}"
            )
    return records


#: Targets per chip (clock-free fractions of dense Splash at its best blocks on the same chip,
#: 10 x 75,600 x 128 bf16, glue included): the third round's.
TARGETS = {
    "v6e": {"dense": 0.69, "band 0.25": 0.185, "sliding tile": 0.11},
    "tpu7x": {"dense": 0.66, "band 0.25": 0.175, "sliding tile": 0.105},
    "v5e": {"dense": 0.97, "band 0.25": 0.26, "sliding tile": 0.14},
}
FIGURE = "figures/tile_block_sweep.png"


def candidates(impl: str) -> list[tuple]:
    """(family, (block_q, block_kv, block_kv_compute)) of a whole sweep of ``impl`` on one chip, in
    the order the sweep runs them: this kernel at ``SWEEP_BLOCKS`` on every family of ``SWEEP_MASKS``,
    the baseline at its tuned candidates on dense work."""
    if impl == NAME:
        return [(family, tuple(b)) for family in SWEEP_MASKS for b in SWEEP_BLOCKS[family]]
    return [("dense", (bq, bkv, None)) for bq, bkv in registry.get(impl).estimator.tuned_candidates]


def read(path=None) -> list[dict]:
    """The sweep's records (``path``, default ``RECORDS`` in ``stlib.paths.home()``) of each kernel's
    last swept source and estimator on each chip (its ``source`` and ``estimator`` hashes: an older
    kernel's or estimator's estimates are never compared with a newer one's, and a chip keeps its last
    whole sweep until it is swept again: ``sweep`` writes a chip's records once the chip is done);
    where a configuration was swept more than once, its latest record."""
    import json
    from pathlib import Path

    latest, last = {}, {}
    for line in Path(path or paths.home() / RECORDS).read_text().splitlines():
        r = json.loads(line)
        latest[config_key(r)] = r
        last[(r["chip"], r["impl"])] = (r.get("source"), r.get("estimator"))
    return [
        r for r in latest.values() if (r.get("source"), r.get("estimator")) == last[(r["chip"], r["impl"])]
    ]


def stale_chips(records) -> list[str]:
    """The chips of ``records`` (``read``) whose estimates come from another estimator than this one
    (``stlib.analysis.cache.estimator_hash``): re-sweep them before trusting their ranking."""
    from stlib.analysis.cache import estimator_hash

    current = estimator_hash()
    return sorted({r["chip"] for r in records if r.get("estimator") != current})


def best_blocks(records) -> dict:
    """{(chip, family, impl): the record with the fewest static cycles}."""
    best: dict = {}
    for r in records:
        key = (r["chip"], r["family"], r["impl"])
        if "cycles" in r and (key not in best or r["cycles"] < best[key]["cycles"]):
            best[key] = r
    return best


#: The families a chip's default blocks must serve together (the sliding tile has its own rule: rows
#: of 3-D tiles, ``tile_lane_dense.tiled_rows``).
DEFAULT_FAMILIES = ("dense", "band 0.25")


def config_key(record: dict) -> tuple:
    """(chip, family, impl, block_q, block_kv, block_kv_compute): one candidate of the sweep, in its
    records and in the TPU measurements of them."""
    return (
        record["chip"],
        record["family"],
        record["impl"],
        record["block_q"],
        record["block_kv"],
        record["block_kv_compute"],
    )


def measured_scores(records, measurements) -> dict:
    """{config: measured ms} for the chips whose every compiled candidate of this kernel in ``records``
    (``read``) has a TPU measurement of the same kernel source in ``measurements`` (the records of
    ``stlib.bench.tpu_measure sweep``); a chip measured in part keeps its estimates (a measured
    candidate is never ranked against an estimated one)."""
    timed = {config_key(m): m for m in measurements}  # the latest of each configuration
    out = {}
    for chip in dict.fromkeys(r["chip"] for r in records):
        mine = [r for r in records if r["chip"] == chip and r["impl"] == NAME and "cycles" in r]
        found = [timed.get(config_key(r)) for r in mine]
        if mine and all(m is not None and m.get("source") == r.get("source") for m, r in zip(found, mine)):
            out |= {config_key(r): m["median_ms"] for m, r in zip(found, mine)}
    return out


def fits(record: dict) -> bool:
    """Whether a sweep record's largest kernel program is within its chip's
    ``Chip.program_bundles_limit`` (every record fits a chip without one; a record without its
    breakdown says no size, and fits).

    >>> fits({"chip": "v5e", "breakdown": {"k": {"step": {"bundles": 70_000, "count": 1}}}})
    False
    """
    from stlib.analysis.kernel_estimate import program_bundles

    limit = chip_spec(record["chip"]).program_bundles_limit
    return (
        limit is None
        or "breakdown" not in record
        or max(program_bundles(k) for k in record["breakdown"].values()) <= limit
    )


def winners(records, measurements=()) -> dict[str, dict]:
    """Per chip: {"blocks": (block_q, block_kv, block_kv_compute) with the fewest static cycles summed
    over ``DEFAULT_FAMILIES`` (one default serves both), "tiled_rows": (rows of 3-D tiles per q
    block, per kv block) of the best sliding-tile candidate}; either is left out where the chip's
    sweep lacks its families, a chip with neither altogether. Where ``measurements`` time every
    candidate of a chip on that chip (``measured_scores``), the measured ms rank them instead: the
    clock outranks the estimate. A candidate whose program exceeds its chip's
    ``Chip.program_bundles_limit`` never wins: its schedule does not say its time.

    >>> rec = lambda family, bq, bkv, cycles: {"chip": "v5e", "family": family, "impl": NAME,
    ...     "block_q": bq, "block_kv": bkv, "block_kv_compute": 128, "cycles": cycles, "source": "s"}
    >>> records = [rec(f, bq, 2048, c) for f in DEFAULT_FAMILIES for bq, c in ((1024, 9), (2048, 5))]
    >>> winners(records)["v5e"]["blocks"]
    (2048, 2048, 128)
    >>> timed = [{**r, "median_ms": 1.0 if r["block_q"] == 1024 else 2.0} for r in records]
    >>> winners(records, timed)["v5e"]["blocks"]
    (1024, 2048, 128)
    """
    measured = measured_scores(records, measurements)
    out = {}
    for chip in dict.fromkeys(r["chip"] for r in records):
        mine = [r for r in records if r["chip"] == chip and r["impl"] == NAME and "cycles" in r and fits(r)]
        score = {id(r): measured.get(config_key(r), r["cycles"]) for r in mine}
        totals: dict = {}
        for r in mine:
            if r["family"] in DEFAULT_FAMILIES:
                key = (r["block_q"], r["block_kv"], r["block_kv_compute"])
                totals.setdefault(key, {})[r["family"]] = score[id(r)]
        complete = {k: sum(v.values()) for k, v in totals.items() if set(v) == set(DEFAULT_FAMILIES)}
        row = SLIDING_TILE_ROW
        tiles = [
            r
            for r in mine
            if r["family"] == "sliding tile" and r["block_q"] % row == 0 and r["block_kv"] % row == 0
        ]  # blocks of whole rows of tiles (what the default rule can express)
        won = {}
        if complete:
            won["blocks"] = min(complete, key=complete.get)
        if tiles:
            best_tile = min(tiles, key=lambda r: score[id(r)])
            won["tiled_rows"] = (best_tile["block_q"] // row, best_tile["block_kv"] // row)
        if won:
            out[chip] = won
    return out


def tuned_blocks(records, measurements=()) -> dict:
    """The kernel's tuned blocks as its package data holds them (``stlib.tuned``): the
    ``winners`` of ``records`` (and ``measurements``) per chip, with the records' provenance and the
    chips ranked by measured times."""
    from stlib.provenance import provenance

    measured = sorted({config[0] for config in measured_scores(records, measurements)})
    return {
        "implementation": NAME,
        "written_by": "python -m stlib.bench.block_sweep tune",
        "records": RECORDS,
        "measured_chips": {chip: MEASUREMENTS for chip in measured},
        "chips": {
            chip: {k: list(v) for k, v in won.items()} for chip, won in winners(records, measurements).items()
        },
        **provenance(),
    }


def write_tuned(records, measurements=()) -> str:
    """Write ``tuned_blocks(records, measurements)`` into the package (``stlib/tuned/NAME.json``),
    where the kernel's ``resolve`` reads its per-chip defaults; returns the path."""
    return str(tuned.write(NAME, tuned_blocks(records, measurements)))


def read_measurements(path=None) -> list[dict]:
    """The TPU measurements of the sweep's candidates (``MEASUREMENTS``; none where absent)."""
    from stlib.bench.records import read_records

    path = Path(path or paths.home() / MEASUREMENTS)
    return read_records(path) if path.exists() else []


def table(records) -> list[dict]:
    """Per chip and family: this kernel's best blocks, their cycles as a fraction of dense Splash at
    its best blocks on the same chip, its grid steps, and the chip's target (``TARGETS``)."""
    best = best_blocks(records)
    rows = []
    for (chip, family, impl), r in best.items():
        splash = best.get((chip, "dense", BASELINE))
        if impl == BASELINE or splash is None:
            continue
        rows.append(
            {
                "chip": chip,
                "family": family,
                "blocks": (r["block_q"], r["block_kv"], r["block_kv_compute"]),
                "ratio": r["cycles"] / splash["cycles"],
                "total_ms": r["total_ms"],
                "grid_steps": r["grid_steps"],
                "splash_blocks": (splash["block_q"], splash["block_kv"]),
                "splash_ms": splash["total_ms"],
                "target": TARGETS.get(chip, {}).get(family),
            }
        )
    return rows


def print_table(records) -> None:
    print(
        f"{'chip':<6} {'family':<13} {'blocks':<15} {'ratio':>7} {'target':<12} {'ms':>7} {'grid steps':>10}  "
        "dense Splash (best blocks, ms)"
    )
    for row in table(records):
        bq, bkv, chunk = row["blocks"]
        target = (
            ""
            if row["target"] is None
            else f"{row['target']:g} " + ("met" if row["ratio"] <= row["target"] else "missed")
        )
        print(
            f"{row['chip']:<6} {row['family']:<13} {f'{bq}x{bkv}/{chunk}':<15} {row['ratio']:>7.4f} {target:<12} "
            f"{row['total_ms']:>7.2f} {row['grid_steps']:>10,}  "
            f"{row['splash_blocks'][0]}x{row['splash_blocks'][1]}, {row['splash_ms']:.2f}"
        )
    print("static estimates (not measurements); ms at each chip's calibrated or assumed clock")
    stale = stale_chips(records)
    if stale:
        print(
            f"stale: {', '.join(stale)} estimated by another estimator than this one "
            f"(re-sweep: python -m stlib.bench.block_sweep run {' '.join(stale)})"
        )


def _blocks_label(r) -> str:
    return f"{r['block_q']}x{r['block_kv']}" + (f"/{r['block_kv_compute']}" if r["block_kv_compute"] else "")


def figure_rows(records, targets: dict | None = None) -> dict:
    """The arguments of ``stlib.plotting.block_sweep`` but the title: each candidate's static cycles
    as a fraction of dense Splash at its best swept blocks on the same chip (clock-free), one panel
    per mask family of this kernel's records, then Splash's own candidates. Records without an
    estimate (refused blocks) and chips without Splash records are left out. ``targets``: {family:
    ratio}, drawn as v6e's (``TARGETS["v6e"]``)."""
    ok = [r for r in records if "cycles" in r]
    chips = list(dict.fromkeys(r["chip"] for r in ok))
    base = {
        chip: min(
            r["cycles"] for r in ok if r["chip"] == chip and r["impl"] == BASELINE and r["family"] == "dense"
        )
        for chip in chips
        if any(r["chip"] == chip and r["impl"] == BASELINE for r in ok)
    }
    chips = [chip for chip in chips if chip in base]  # a ratio needs the chip's Splash records
    ok = [r for r in ok if r["chip"] in base]

    def bars(rows):
        return [
            {"chip": r["chip"], "blocks": _blocks_label(r), "ratio": r["cycles"] / base[r["chip"]]}
            for r in rows
        ]

    panels = {
        f: bars(r for r in ok if r["family"] == f and r["impl"] != BASELINE)
        for f in dict.fromkeys(r["family"] for r in ok)
    }
    panels = {f: rows for f, rows in panels.items() if rows}
    panels["dense Splash"] = bars(r for r in ok if r["impl"] == BASELINE)
    return {
        "panels": panels,
        "chips": chips,
        "ylabel": "cycles / dense Splash at its best blocks",
        "targets": {f: (t, f"target {t:g} (v6e)") for f, t in (targets or {}).items() if f in panels},
    }


def draw(records, path=None):
    from stlib import plotting

    fig = plotting.block_sweep(
        title=f"{NAME} block sweep, 10 x 75,600 x 128 bf16 (static estimates, not measurements)",
        **figure_rows(records, TARGETS["v6e"]),
    )
    path = path or paths.home() / FIGURE
    plotting.save(fig, path)
    return path


def main(argv=None) -> None:
    """``python -m stlib.bench.block_sweep [run] [chip ...]``: run the block sweep and write the
    winners as the kernel's tuned blocks; ``... tune``: only write them from the records; ``... table``:
    the best blocks per chip and family against the targets; ``... figure``: draw it."""
    import argparse
    import sys

    commands = ("run", "tune", "table", "figure")
    parser = argparse.ArgumentParser(prog="python -m stlib.bench.block_sweep", description=main.__doc__)
    parser.add_argument("command", choices=commands)
    parser.add_argument(
        "chips", nargs="*", metavar="chip", help=f"any of {', '.join(SWEEP_CHIPS)} (default: all)"
    )
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0] not in commands and not argv[0].startswith("-")):
        argv.insert(0, "run")  # "run" may be left out
    args = parser.parse_args(argv)
    unknown = [chip for chip in args.chips if chip not in SWEEP_CHIPS]
    if unknown:
        parser.error(f"chip {unknown[0]!r} is not one of {', '.join(SWEEP_CHIPS)}")
    args.chips = args.chips or list(SWEEP_CHIPS)
    if args.command == "run":
        sweep(chips=tuple(args.chips))
        print(f"tuned blocks: {write_tuned(read(), read_measurements())}")
    elif args.command == "tune":
        print(f"tuned blocks: {write_tuned(read(), read_measurements())}")
    elif args.command == "table":
        print_table(read())
    else:
        print(draw(read()))


if __name__ == "__main__":
    main()
