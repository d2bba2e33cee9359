"""stlib.bench.block_sweep: the winners and the table read from sweep records, and the lane-dense
kernel's per-chip defaults are exactly the committed sweep's winners."""

from __future__ import annotations

from pathlib import Path

import pytest

from stlib import tuned
from stlib.bench import block_sweep
from stlib.device import chip_spec
from stlib.kernels import tile_lane_dense as ld

RECORDS = Path(__file__).resolve().parents[1] / block_sweep.RECORDS
ROW = block_sweep.SLIDING_TILE_ROW


def record(chip, family, impl, blocks, cycles):
    bq, bkv, chunk = blocks
    return {
        "chip": chip,
        "family": family,
        "impl": impl,
        "block_q": bq,
        "block_kv": bkv,
        "block_kv_compute": chunk,
        "cycles": cycles,
        "total_ms": cycles / 1e6,
        "grid_steps": 1,
    }


def test_one_default_serves_dense_and_band_and_rows_of_tiles_come_from_the_sliding_tile():
    name = ld.NAME
    records = [
        record("v6e", "dense", name, (1024, 2048, 512), 100),
        record("v6e", "band 0.25", name, (1024, 2048, 512), 40),
        record("v6e", "dense", name, (2048, 2048, 512), 90),  # best dense alone ...
        record("v6e", "band 0.25", name, (2048, 2048, 512), 60),  # ... but the worse sum
        record("v6e", "dense", name, (4096, 4096, 512), 10),  # no band record: not a candidate
        record("v6e", "sliding tile", name, (384, 384, 384), 5),  # not whole rows: no rule can say it
        record("v6e", "sliding tile", name, (2 * ROW, ROW, 384), 20),
        record("v6e", "sliding tile", name, (ROW, ROW, 384), 30),
        record("v6e", "dense", "splash", (512, 1024, None), 200),
        record("v6e", "dense", "splash", (1024, 2048, None), 150),
        {
            "chip": "v6e",
            "family": "band 0.25",
            "impl": name,
            "block_q": 8192,
            "block_kv": 8192,
            "block_kv_compute": 512,
            "error": "over the VMEM limit",
        },  # refused: no estimate
    ]
    assert block_sweep.winners(records) == {"v6e": {"blocks": (1024, 2048, 512), "tiled_rows": (2, 1)}}
    rows = {r["family"]: r for r in block_sweep.table(records)}
    assert rows["dense"]["ratio"] == pytest.approx(10 / 150)  # against Splash at its best blocks
    assert rows["band 0.25"]["ratio"] == pytest.approx(40 / 150)
    assert rows["sliding tile"]["blocks"] == (384, 384, 384)


def test_a_partial_sweep_names_what_it_ran():
    name = ld.NAME
    records = [
        record("tpu7x", "dense", name, (2048, 2048, 512), 100),
        record("tpu7x", "band 0.25", name, (2048, 2048, 512), 40),
        record("v5e", "sliding tile", name, (ROW, ROW, 384), 30),
        record("v5e", "dense", name, (2048, 2048, 512), 100),  # no band record: no default blocks
    ]
    assert block_sweep.winners(records) == {
        "tpu7x": {"blocks": (2048, 2048, 512)},
        "v5e": {"tiled_rows": (1, 1)},
    }


def test_records_of_an_older_kernel_source_are_not_compared_with_a_newer_ones(tmp_path):
    import json

    name = ld.NAME
    old = [
        record("v6e", "dense", name, (2048, 2048, 512), 10),
        record("v6e", "dense", name, (512, 1024, 512), 5),
    ]
    new = [
        record("v6e", "dense", name, (2048, 2048, 512), 90),
        record("v6e", "dense", "splash", (512, 1024, None), 200),
    ]
    lines = [{**r, "source": "old"} for r in old] + [{**r, "source": "new"} for r in new]
    path = tmp_path / "sweep.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    kept = block_sweep.read(path)
    assert sorted((r["impl"], r["block_q"], r["cycles"]) for r in kept) == [
        (name, 2048, 90),
        ("splash", 512, 200),
    ]


def test_records_of_an_older_estimator_are_not_ranked_and_the_table_names_them_stale(tmp_path, capsys):
    import json

    from stlib.analysis.cache import estimator_hash

    name, now = ld.NAME, estimator_hash()
    lines = [  # v6e swept again by this estimator; v5e last swept by an older one
        {**record("v6e", "dense", name, (2560, 2560, 256), 10), "estimator": "older"},
        {**record("v6e", "dense", name, (2048, 2048, 512), 90), "estimator": now},
        {**record("v6e", "dense", "splash", (1024, 2048, None), 100), "estimator": now},
        {**record("v5e", "dense", name, (2048, 2048, 128), 95), "estimator": "older"},
        {**record("v5e", "dense", "splash", (512, 2048, None), 100), "estimator": "older"},
    ]
    path = tmp_path / "sweep.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    kept = block_sweep.read(path)
    assert sorted((r["chip"], r["impl"], r["block_q"]) for r in kept) == [
        ("v5e", name, 2048),
        ("v5e", "splash", 512),
        ("v6e", name, 2048),  # the older estimator's 2560 (fewer cycles) is not ranked beside it
        ("v6e", "splash", 1024),
    ]
    assert block_sweep.stale_chips(kept) == ["v5e"]
    block_sweep.print_table(kept)
    assert "stale: v5e estimated by another estimator" in capsys.readouterr().out


@pytest.mark.skipif(not RECORDS.exists(), reason="no committed sweep records")
def test_package_data_holds_the_committed_sweeps_winners_and_the_kernel_runs_them():
    """The winners of the committed sweep, ranked by the committed TPU measurements where they cover
    a chip (``block_sweep.measured_scores``), are the kernel's defaults."""
    records = block_sweep.read(RECORDS)
    measurements = block_sweep.read_measurements(RECORDS.parent / Path(block_sweep.MEASUREMENTS).name)
    won = block_sweep.winners(records, measurements)
    assert won, "the committed sweep names no winner"
    package = tuned.load(ld.NAME)
    assert package["chips"] == {c: {k: list(v) for k, v in w.items()} for c, w in won.items()}
    measured = sorted({config[0] for config in block_sweep.measured_scores(records, measurements)})
    assert sorted(package.get("measured_chips", {})) == measured
    assert {"date", "git_rev", "jax", "libtpu"} <= set(package)
    for chip, best in won.items():
        if "blocks" in best:
            blocks = ld.DEFAULT_BLOCKS[chip]
            assert (blocks.block_q, blocks.block_kv, blocks.block_kv_compute) == best["blocks"], chip
            sizes, _ = ld.resolve_blocks(None, 75_600, None, None, ld.LaneDenseOptions(chip=chip), False)
            assert (sizes.block_q, sizes.block_kv) == best["blocks"][:2], chip
        if "tiled_rows" in best:
            assert ld.TILED_ROWS[chip] == best["tiled_rows"], chip


def test_a_chip_without_a_sliding_tile_sweep_takes_the_rows_of_the_chip_it_borrows():
    unswept = [chip for chip in ("v5e", "v6e", "tpu7x") if chip not in ld.TILED_ROWS]
    for chip in unswept:
        assert ld.tiled_rows(chip) == ld.TILED_ROWS[ld.ROWS_FROM]
    for chip, rows in ld.TILED_ROWS.items():
        assert ld.tiled_rows(chip) == rows


def test_the_table_says_met_or_missed_against_the_chips_target_to_four_places(capsys):
    name = ld.NAME
    target = block_sweep.TARGETS["tpu7x"]["band 0.25"]
    splash = record("tpu7x", "dense", "splash", (1024, 2048, None), 10_000)
    band = record("tpu7x", "band 0.25", name, (2048, 2048, 512), round(10_000 * (target + 0.0002)))
    block_sweep.print_table([splash, band])
    (line,) = [row for row in capsys.readouterr().out.splitlines() if row.startswith("tpu7x  band")]
    assert f"{target + 0.0002:.4f} {target:g} missed" in line


def test_a_sweep_stopped_halfway_writes_the_chips_it_finished_and_none_of_the_one_it_stopped_in(
    tmp_path, monkeypatch
):
    from types import SimpleNamespace

    from stlib import analysis

    class Stopped(Exception):
        """Not a compiler refusal (those are recorded): the run itself stops."""

    def estimate(impl, mask, chip, block_q, block_kv, options=None):
        if chip == "v5e" and block_q == 2048:
            raise Stopped
        kernel = SimpleNamespace(grid_steps=1, kernel=impl, breakdown={})
        return SimpleNamespace(
            seconds=1e-3,
            total_seconds=1e-3,
            glue_seconds=0.0,
            cycles=1_000,
            kernels=[kernel],
            memory_seconds=0.0,
            libtpu_version="fake",
            clock_hz=1e9,
        )

    monkeypatch.setattr(analysis, "estimate", estimate)
    path = tmp_path / "sweep.jsonl"
    with pytest.raises(Stopped):
        block_sweep.sweep(chips=("v6e", "v5e"), workers=1, path=path)
    written = block_sweep.read(path)
    assert {r["chip"] for r in written} == {"v6e"}
    swept = {(r["family"], (r["block_q"], r["block_kv"], r["block_kv_compute"])) for r in written}
    assert swept == {
        (family, blocks)
        for impl in (ld.NAME, block_sweep.BASELINE)
        for family, blocks in block_sweep.candidates(impl)
    }


def test_the_command_line_refuses_an_unknown_chip_and_help_starts_nothing(capsys):
    from stlib.bench import block_sweep

    with pytest.raises(SystemExit):
        block_sweep.main(["--help"])
    assert "any of v6e, v5e, tpu7x" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        block_sweep.main(["run", "v7"])
    assert "chip 'v7' is not one of v6e, v5e, tpu7x" in capsys.readouterr().err


def test_a_chip_measured_in_full_is_ranked_by_its_clock_and_one_measured_in_part_by_its_estimates():
    """``measured_scores``: a chip whose every candidate was timed on a TPU of the same kernel
    source ranks by the times; one with a candidate untimed, or timed on another source, keeps the
    static cycles."""
    name = ld.NAME
    fast_estimate = record("v5e", "sliding tile", name, (1920, 3840, 384), 100)
    slow_estimate = record("v5e", "sliding tile", name, (1920, 1920, 384), 200)
    records = [fast_estimate, slow_estimate]
    timed = [{**fast_estimate, "median_ms": 82.6}, {**slow_estimate, "median_ms": 29.5}]
    assert block_sweep.winners(records)["v5e"]["tiled_rows"] == (1, 2)
    assert block_sweep.winners(records, timed)["v5e"]["tiled_rows"] == (1, 1)
    assert block_sweep.winners(records, timed[:1])["v5e"]["tiled_rows"] == (1, 2)
    other_source = [timed[0], {**timed[1], "source": "an older kernel"}]
    assert block_sweep.winners(records, other_source)["v5e"]["tiled_rows"] == (1, 2)


def test_a_program_past_the_chips_limit_never_wins_however_few_its_cycles():
    """On v5e (a measured program limit) the candidate with the fewest cycles but a program past the
    limit loses to the next; on v6e (no limit measured) the same records pick it."""
    name = block_sweep.NAME

    def sized(chip, blocks, cycles, bundles):
        program = {"kernel": {"compute_full": {"bundles": bundles, "count": 1, "cycles": bundles}}}
        return [
            {**record(chip, f, name, blocks, cycles), "breakdown": program}
            for f in block_sweep.DEFAULT_FAMILIES
        ]

    limit = chip_spec("v5e").program_bundles_limit
    for chip, want in (("v5e", (1024, 2048, 256)), ("v6e", (2048, 2048, 256))):
        records = sized(chip, (2048, 2048, 256), 5, limit + 1) + sized(chip, (1024, 2048, 256), 9, limit)
        assert block_sweep.winners(records)[chip]["blocks"] == want, chip
