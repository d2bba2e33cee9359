"""The backward targets table's cases (stlib/bench/backward_estimate.py) and its reading of
records; the estimates themselves compile in the script (``run``), not here."""

from __future__ import annotations

import json

import pytest

from stlib import registry
from stlib.bench import backward_estimate as be
from stlib.bench import target_gaps


def test_every_chip_has_the_tile_kernel_both_ways_on_every_mask_and_splash_fused_and_split():
    cases = be.cases()
    baseline = registry.baseline().name
    for chip in be.CHIPS:
        mine = [c for c in cases if c["chip"] == chip]
        tile = [(c["mask"], c["backward"]) for c in mine if c["impl"] == be.TILE_KERNEL]
        assert sorted(tile) == sorted((m, b) for m in be.MASKS for b in (False, True))
        splash = [c for c in mine if c["impl"] == baseline]
        assert [c["backward"] for c in splash] == [False, True, True]
        assert [c.get("options") for c in splash[1:]] == [{"fused_backward": True}, {"fused_backward": False}]


def test_impls_keeps_one_kernels_cases_and_refuses_a_kernel_not_in_the_table():
    only = be.cases(["v6e"], impls=[be.TILE_KERNEL])
    assert only == [c for c in be.cases(["v6e"]) if c["impl"] == be.TILE_KERNEL] and len(only) == 6
    with pytest.raises(ValueError, match="pallas_dense"):
        be.cases(impls=["pallas_dense"])


def record(impl, mask, backward, total_ms, options=None, **more):
    """A v6e estimate record of the table's form, ``more`` fields beside."""
    return {
        "chip": "v6e",
        "impl": impl,
        "mask": mask,
        "backward": backward,
        "options": options,
        "estimated": True,
        "total_ms": total_ms,
        **more,
    }


def test_the_latest_record_of_a_case_wins_and_the_ratios_come_from_it(tmp_path):
    baseline = registry.baseline().name
    band = be.MASKS[0]
    lines = [
        record(be.TILE_KERNEL, band, False, 99.0),  # an older forward, superseded below
        record(be.TILE_KERNEL, band, False, 10.0),
        record(be.TILE_KERNEL, band, True, 25.0),
        record(baseline, "none", False, 60.0),
        record(baseline, "none", True, 130.0, {"fused_backward": True}),
        record(baseline, "none", True, 120.0, {"fused_backward": False}),
    ]
    path = tmp_path / "records.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    (row,) = be.targets(be.read(path))
    assert row["backward / forward"] == 2.5 and row["splash_backward_kind"] == "split"
    assert row["train / dense Splash train"] == pytest.approx(35.0 / 180.0)
    assert row["backward / Splash backward"] == pytest.approx(25.0 / 120.0)
    assert "band: train / dense Splash train <= 0.22" in be.format_table(be.read(path))


def test_the_backward_sweep_runs_candidates_within_the_forward_blocks_and_tunes_on_both_masks(tmp_path):
    """``backward_sweep``: no candidate larger than a chip's forward blocks or without a dq window in
    its VMEM (TPU7x: 512-key updates at 2,048 x 2,048, not 1,024); the winner is the
    candidate with the fewest milliseconds on every mask together, and a candidate missing a mask
    is never a winner."""
    from stlib.bench import backward_sweep as bs
    from stlib.kernels.tile_lane_dense import DEFAULT_BLOCKS

    for chip in bs.CHIPS:
        blocks = {tuple(c["options"]["backward_blocks"]) for c in bs.cases([chip])}
        forward = DEFAULT_BLOCKS[chip]
        assert blocks and all(b[0] <= forward.block_q and b[1] <= forward.block_kv for b in blocks)
        assert {c["mask"] for c in bs.cases([chip])} == set(bs.MASKS)
    tpu7x = {tuple(c["options"]["backward_blocks"]) for c in bs.cases(["tpu7x"])}
    assert (2048, 2048, 512) in tpu7x and (2048, 2048, 1024) not in tpu7x

    def record(mask, blocks, ms):
        return {"chip": "v6e", "mask": mask, "estimated": True, "total_ms": ms,
                "options": {"backward_blocks": list(blocks)}}  # fmt: skip

    full, band = bs.MASKS
    lines = [
        record(full, (1024, 2048, 1024), 130.0),
        record(band, (1024, 2048, 1024), 38.0),
        record(full, (2048, 2048, 1024), 126.0),
        record(band, (2048, 2048, 1024), 36.0),
        record(full, (2560, 2560, 640), 100.0),  # fastest on dense, but never estimated on the band
        {
            **record(band, (2560, 2560, 640), 0.0),
            "estimated": False,
            "error": "compiling failed:\nstderr\nkilled",
        },
    ]
    path = tmp_path / "sweep.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    won = bs.winners(bs.read(path))["v6e"]
    assert won["blocks"] == [2048, 2048, 1024] and won["total_ms"] == pytest.approx(162.0)
    table = bs.format_table(bs.read(path))
    assert "2048 x 2048 / 1024 (tuned)" in table
    assert (
        "not estimated: v6e band (density 0.25) (2560, 2560, 640): killed" in table.splitlines()
    )  # one line


def test_a_missed_target_is_listed_with_its_bundles_only_reading_dense_pace_and_largest_path():
    baseline, sliding = registry.baseline().name, "sliding tile, 3-D tiled order"

    def estimate(impl, mask, backward, total_ms, bundles_ms, options=None, fed=0):
        kernel = {
            "kernel": f"{impl}-{mask}-{backward}",
            "bundles": {"step": 10, "compute": 100},
            "mxu_fed": {"compute": fed} if fed else {},
            "counts": {"step": 50, "compute": 50},
        }
        return record(impl, mask, backward, total_ms, options, bundles_only_ms=bundles_ms, kernels=[kernel])

    records = {
        be._key(r): r
        for r in [
            estimate(be.TILE_KERNEL, sliding, False, 15.0, 12.0, fed=150),  # forward / Splash 0.15
            estimate(be.TILE_KERNEL, sliding, True, 30.0, 27.0),  # backward / forward 2.0: met
            estimate(be.TILE_KERNEL, "full", False, 80.0, 80.0),
            estimate(be.TILE_KERNEL, "full", True, 180.0, 180.0),
            estimate(baseline, "none", False, 100.0, 100.0),
            estimate(baseline, "none", True, 200.0, 200.0, {"fused_backward": True}),
        ]
    }
    rows = {r["quantity"]: r for r in target_gaps.missed(records)}
    assert set(rows) == {"forward / Splash forward", "train / dense Splash train"}  # 2.0 <= 2.7 is met
    forward = rows["forward / Splash forward"]
    assert forward["estimate"] == pytest.approx(0.15) and forward["target"] == 0.105
    assert forward["bundles only"] == pytest.approx(0.12)
    assert forward["density x dense"] == pytest.approx(target_gaps.mask_density(sliding) * 0.8)
    assert forward["density x dense, bundles only"] == pytest.approx(target_gaps.mask_density(sliding) * 0.8)
    path = forward["largest path"]  # the forward's compute path, charged its feed: 150 x 50 of 150 x 50 + 500
    assert path["path"] == "compute" and path["share"] == pytest.approx(7500 / 8000)
    assert rows["train / dense Splash train"]["estimate"] == pytest.approx(45.0 / 300.0)
    assert "forward / Splash forward | 0.150 | 0.105 | 0.120" in target_gaps.format_missed(records)
