"""Block sizes chosen, not guessed: the second-generation tile kernel (``pallas_tile_lane_dense``)
at every candidate (block_q, block_kv, block_kv_compute) per chip and mask family, and dense Splash
at its own candidates, scored by the static estimate; records appended to
``data/tile_block_sweep.jsonl`` (``plotting.block_sweep`` draws them).

    python -m stlib.bench.block_sweep [chip ...]
"""

from __future__ import annotations

from stlib.analysis.static import SPLASH_SWEEP
from stlib.kernels.tile_lane_dense import NAME, vmem_bytes, vmem_limit

#: Mask families of the sweep (estimator mask names) and the block candidates (block_q, block_kv,
#: block_kv_compute) for each. The sliding tile's blocks hold whole 3x8x16 tiles (384 tokens): one tile,
#: a row of five (1,920 tokens, run as pattern steps at the grain of one tile), or two rows.
SWEEP_MASKS = {
    "dense": "full",
    "band 0.25": "band (density 0.25)",
    "sliding tile": "sliding tile, 3-D tiled order",
}
_SQUARE_BLOCKS = (
    (512, 1024, 512),
    (1024, 2048, 512),
    (2048, 2048, 512),
    (2048, 2560, 512),
    (2560, 2560, 512),
    (2048, 4096, 1024),
)
SWEEP_BLOCKS = {
    "dense": _SQUARE_BLOCKS,
    "band 0.25": _SQUARE_BLOCKS,
    "sliding tile": ((384, 384, 384), (1920, 1920, 384), (3840, 1920, 384), (1920, 3840, 384)),
}
SWEEP_CHIPS = ("v6e", "v5e", "tpu7x")


def sweep(
    chips=SWEEP_CHIPS, families=tuple(SWEEP_MASKS), workers: int = 2, path="data/tile_block_sweep.jsonl"
):
    """Static estimates of this kernel at every candidate block of ``SWEEP_BLOCKS`` (and dense Splash
    at the candidates of its tuned estimate, ``stlib.analysis.static.SPLASH_SWEEP``) on ``chips``, appended as records to ``path``; returns the records.
    Candidates over the chip's VMEM limit are recorded as refused, not compiled."""
    import json
    import subprocess
    import time
    from concurrent.futures import ThreadPoolExecutor
    from pathlib import Path

    from stlib import analysis
    from stlib.configs import CASE_STUDY

    rev = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], check=False, capture_output=True, text=True
    ).stdout.strip()
    jobs = [(chip, fam, NAME, blocks) for chip in chips for fam in families for blocks in SWEEP_BLOCKS[fam]]
    jobs += [(chip, "dense", "splash", (bq, bkv, None)) for chip in chips for bq, bkv in SPLASH_SWEEP]
    jobs.sort(key=lambda job: chips.index(job[0]))  # chip by chip: a partial run is whole for its chips

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
            "git": rev,
            "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }
        options = None
        if impl == NAME:
            options = {"block_kv_compute": chunk, "chip": chip}
            record["vmem_need"] = vmem_bytes(bq, bkv, chunk, min(256, chunk), CASE_STUDY.head_dim, 2)
            record["vmem_limit"] = vmem_limit(chip)
        try:
            est = analysis.estimate(
                impl, SWEEP_MASKS[family], chip, block_q=bq, block_kv=bkv, options=options
            )
        except (ValueError, RuntimeError) as error:
            return {**record, "error": str(error)[:300]}
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
    records = []
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for record in pool.map(lambda job: one(*job), jobs):
            records.append(record)
            with out.open("a") as handle:
                handle.write(json.dumps(record) + "\n")
            print(
                f"{record['chip']:<5} {record['family']:<12} {record['impl']:<24} {record['block_q']:>5} "
                f"{record['block_kv']:>5} {record['block_kv_compute'] or '-':>5} "
                f"{record.get('total_ms', float('nan')):>8.2f} ms  {record.get('error', '')[:80]}",
                flush=True,
            )
    return records


def best_blocks(records) -> dict:
    """{(chip, family, impl): the record with the smallest total estimate}."""
    best: dict = {}
    for r in records:
        key = (r["chip"], r["family"], r["impl"])
        if "total_ms" in r and (key not in best or r["total_ms"] < best[key]["total_ms"]):
            best[key] = r
    return best


def main(argv=None) -> None:
    """``python -m stlib.bench.block_sweep [chip ...]``: run the block sweep."""
    import sys

    argv = sys.argv[1:] if argv is None else argv
    sweep(chips=tuple(argv) or SWEEP_CHIPS)


if __name__ == "__main__":
    main()
