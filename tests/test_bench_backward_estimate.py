"""The backward targets table's cases (stlib/bench/backward_estimate.py) and its reading of
records; the estimates themselves compile in the script (``run``), not here."""

from __future__ import annotations

import json

import pytest

from stlib import registry
from stlib.bench import backward_estimate as be


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


def test_the_latest_record_of_a_case_wins_and_the_ratios_come_from_it(tmp_path):
    baseline = registry.baseline().name

    def record(impl, mask, backward, total_ms, options=None):
        return {
            "chip": "v6e",
            "impl": impl,
            "mask": mask,
            "backward": backward,
            "options": options,
            "estimated": True,
            "total_ms": total_ms,
        }

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
