"""The backward's blocks chosen, not guessed: the tile kernel's (``pallas_tile_lane_dense``) step-coded
backward at every candidate (block_q, block_kv, keys per update) per chip, on dense and band 0.25 at
the case-study shape, scored by the static estimate (glue included); the candidate with the fewest
milliseconds on both together is the chip's tuned backward block (``stlib/tuned/NAME_backward.json``,
read by the kernel's ``backward_step_blocks``). The sliding tile in its 3-D tiled order runs rows of
3-D tiles at the forward's own blocks (``backward_steps.step_layout``) and is not swept.

    python -m stlib.bench.backward_sweep [run] [--chips v6e tpu7x v5e] [--workers 2]   # then tunes
    python -m stlib.bench.backward_sweep tune | table

Records: ``data/backward_block_sweep.jsonl``, one per (chip, mask, blocks), marked with the kernel's
source hash; a run skips the candidates already estimated for the same sources (resumable).
"""

from __future__ import annotations

import argparse
import json
from concurrent.futures import ThreadPoolExecutor

from stlib import paths, registry, tuned
from stlib.bench.backward_estimate import TILE_KERNEL, estimate_case
from stlib.configs import CASE_STUDY

#: The kernel whose backward is swept (the best tile kernel, the targets table's).
KERNEL = registry.get(TILE_KERNEL)

RECORDS = "data/backward_block_sweep.jsonl"
CHIPS = ("v6e", "tpu7x", "v5e")
#: The masks a chip's backward blocks are chosen on (estimator names; both count equally).
MASKS = ("full", "band (density 0.25)")
#: (block_q, block_kv, keys per update): blocks of 1,024 to 2,560 tokens (the forward's tuned blocks
#: on v5e / TPU7x, 2,048, and v6e, 2,560), updates of 512 to 1,280 keys (the scores of one update,
#: [keys, block_q] f32, sit beside the dq window in VMEM). First probes, dense on v6e before the
#: lone call wrote its outputs final: 2,048 x 2,048 at 1,024 keys an update 126.5 ms, at 512 keys
#: 141.9 ms (its MXU fed 27,028 cycles a step against 23,958), 2,560 x 2,560 at 640 keys 137.4 ms,
#: the one-tile kernel at 1,024 x 1,024 136.3 ms. A candidate larger than the chip's forward blocks,
#: or with no dq window in the chip's VMEM, is not run (the backward would run other blocks).
CANDIDATES = (
    (1024, 2048, 512),
    (1024, 2048, 1024),
    (2048, 1024, 1024),
    (2048, 2048, 512),
    (2048, 2048, 1024),
    (2560, 2560, 1280),
)


def runs_on(chip: str, blocks) -> bool:
    """Whether the kernel's backward runs ``blocks`` on ``chip`` at the case-study shape (its
    ``Presentation.backward_runs``: no larger than the forward's blocks, a dq window in VMEM).

    >>> runs_on("v6e", (2048, 2048, 1024)), runs_on("tpu7x", (2048, 2048, 1024)), runs_on("tpu7x", (2048, 2048, 512))
    (True, False, True)
    """
    return KERNEL.presentation.backward_runs(chip, blocks, CASE_STUDY.num_tokens, CASE_STUDY.head_dim, 2)


def cases(chips=CHIPS) -> list[dict]:
    """The backward estimates of the sweep: per chip, mask and candidate that ``runs_on`` it."""
    out = []
    for chip in chips:
        for blocks in CANDIDATES:
            if not runs_on(chip, blocks):
                continue
            for mask in MASKS:
                out.append(
                    {
                        "chip": chip,
                        "impl": TILE_KERNEL,
                        "mask": mask,
                        "backward": True,
                        "options": {"backward_blocks": list(blocks)},
                    }
                )
    return out


def _key(record: dict) -> tuple:
    return record["chip"], record["mask"], tuple(record["options"]["backward_blocks"])


def read(path=None) -> dict[tuple, dict]:
    """The latest record per (chip, mask, blocks) in ``path`` (default ``RECORDS``)."""
    from stlib.bench.records import latest_per_key

    return latest_per_key(path or paths.home() / RECORDS, _key)


def run(chips=CHIPS, path=None, workers: int = 2) -> list[dict]:
    """Estimate every case of ``cases(chips)`` not yet estimated for the kernel's current sources,
    ``workers`` compiles at a time, each record appended to ``path`` when it is done."""
    from stlib.analysis.cache import source_hash
    from stlib.bench.progress import Progress
    from stlib.bench.records import append_line
    from stlib.provenance import provenance

    path = path or paths.home() / RECORDS
    source = source_hash(TILE_KERNEL)
    done = {k for k, r in read(path).items() if r.get("source") == source and r.get("estimated")}
    jobs = [case for case in cases(chips) if _key(case) not in done]
    origin, records = provenance(), []
    path.parent.mkdir(parents=True, exist_ok=True)

    def one(case):
        return {**estimate_case(case), "source": source, **origin}

    with ThreadPoolExecutor(max_workers=workers) as pool, Progress(len(jobs), "backward sweep") as bar:
        for record in pool.map(one, jobs):
            append_line(path, record)
            records.append(record)
            ms = record.get("total_ms")
            bar.step(
                f"{record['chip']:<5} {record['mask'][:10]:<10} {_key(record)[2]} "
                + (f"{ms:8.2f} ms" if ms is not None else record.get("error", "")[:80])
            )
    return records


def winners(records: dict[tuple, dict]) -> dict[str, dict]:
    """Per chip: the blocks whose backward estimates on every mask of ``MASKS`` sum to the fewest
    milliseconds, with those milliseconds per mask.

    >>> r = lambda chip, mask, blocks, ms: {"chip": chip, "mask": mask, "estimated": True, "total_ms": ms,
    ...                                      "options": {"backward_blocks": list(blocks)}}
    >>> recs = [r("v6e", "full", (1024, 1024, 512), 130.0), r("v6e", "band (density 0.25)", (1024, 1024, 512), 40.0),
    ...         r("v6e", "full", (2048, 2048, 512), 120.0), r("v6e", "band (density 0.25)", (2048, 2048, 512), 45.0)]
    >>> winners({_key(x): x for x in recs})["v6e"]["blocks"]
    [2048, 2048, 512]
    """
    totals: dict[tuple, dict] = {}
    for (chip, mask, blocks), record in records.items():
        if record.get("estimated"):
            totals.setdefault((chip, blocks), {})[mask] = record["total_ms"]
    best: dict[str, dict] = {}
    for (chip, blocks), per_mask in sorted(totals.items()):
        if set(per_mask) != set(MASKS):
            continue
        total = sum(per_mask.values())
        if chip not in best or total < best[chip]["total_ms"]:
            best[chip] = {"blocks": list(blocks), "total_ms": total, "per_mask_ms": per_mask}
    return best


def write_tuned(records) -> str:
    """The winners as the kernel's tuned backward blocks (package data); returns the path."""
    from stlib.provenance import provenance

    chips = {chip: {"blocks": won["blocks"]} for chip, won in winners(records).items()}
    name = KERNEL.presentation.backward_tuned
    return str(tuned.write(name, {"chips": chips, "implementation": TILE_KERNEL, **provenance()}))


def format_table(records: dict[tuple, dict]) -> str:
    """Every candidate's backward estimate per chip and mask (static estimates, ms), winners marked."""
    from stlib.bench.records import failure_reason

    won = {chip: tuple(w["blocks"]) for chip, w in winners(records).items()}
    lines = [
        "STATIC ESTIMATES (not measurements): the tile kernel's backward, 10 x 75,600 x 128 bf16, glue included",
        "",
        "| chip | block_q x block_kv / keys per update | "
        + " | ".join(f"{m} ms" for m in MASKS)
        + " | sum |",
        "|" + "---|" * (3 + len(MASKS)),
    ]
    by_blocks: dict[tuple, dict] = {}
    for (chip, mask, blocks), record in records.items():
        by_blocks.setdefault((chip, blocks), {})[mask] = record
    for (chip, blocks), per_mask in sorted(by_blocks.items()):
        cells = [
            f"{per_mask[m]['total_ms']:.2f}" if m in per_mask and per_mask[m].get("estimated") else "-"
            for m in MASKS
        ]
        done = [float(c) for c in cells if c != "-"]
        mark = " (tuned)" if won.get(chip) == blocks else ""
        total = f"{sum(done):.2f}" if len(done) == len(MASKS) else "-"
        lines.append(
            f"| {chip} | {blocks[0]} x {blocks[1]} / {blocks[2]}{mark} | {' | '.join(cells)} | {total} |"
        )
    for (chip, mask, blocks), record in sorted(records.items()):
        if not record.get("estimated"):
            lines.append(f"not estimated: {chip} {mask} {blocks}: {failure_reason(record.get('error', ''))}")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m stlib.bench.backward_sweep", description=__doc__.split("\n")[0]
    )
    parser.add_argument("command", nargs="?", default="run", choices=("run", "tune", "table"))
    parser.add_argument("--chips", nargs="*", default=list(CHIPS))
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    if args.command == "run":
        run(args.chips, workers=args.workers)
    records = read()
    if args.command in ("run", "tune"):
        print("tuned backward blocks:", write_tuned(records), json.dumps(winners(records)))
    print(format_table(records))


if __name__ == "__main__":
    main()
