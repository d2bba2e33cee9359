"""The SVG-mix table (stlib/bench/svg_estimate.py): its cases, the mask the tile kernel is estimated
on, and its reading of records; the estimates themselves compile in the script (``run``), not here."""

from __future__ import annotations

import json
import math

import pytest

from stlib import registry
from stlib.bench import svg_estimate as se
from stlib.configs import CASE_STUDY
from stlib.geometry import raster_order, token_major_order


def test_every_chip_and_video_has_the_tile_kernel_and_tuned_dense_splash():
    cases = se.cases()
    assert len(cases) == 2 * len(se.CHIPS) * len(se.VIDEOS)
    assert {(c["chip"], c["video"]) for c in cases} == {(c, v) for c in se.CHIPS for v in se.VIDEOS}
    splash = [c for c in cases if c["impl"] == registry.baseline().name]
    assert all(c["mask"] == "full" and c["blocks"] == "tuned" for c in splash)
    assert se.VIDEOS["case study"] == CASE_STUDY.grid.shape
    assert math.prod(se.VIDEOS["720p, 161 frames"]) == 147_600
    with pytest.raises(ValueError, match="1080p"):
        se.cases(videos=["1080p"])


def test_the_kernel_mask_is_each_head_in_its_own_order():
    mask = se.kernel_mask("case study")
    raster, _ = se._raster_mask_and_orders(se.SVG_MIX)
    grid = CASE_STUDY.grid
    assert mask.num_heads == CASE_STUDY.num_heads and mask.length == grid.num_tokens
    assert mask.head(0) == raster.head(0).permute(raster_order(grid))
    assert mask.head(9) == raster.head(9).permute(token_major_order(grid))
    assert mask.head(9) != raster.head(9)


def test_the_ratio_is_the_latest_tile_record_over_the_latest_splash_record(tmp_path):
    def record(impl, ms, chip="v6e", estimated=True):
        return {
            "chip": chip,
            "video": "case study",
            "impl": impl,
            "tokens": 75_600,
            "estimated": estimated,
            "total_ms": ms,
            "blocks": {},
            "error": "RuntimeError: VMEM",
        }

    lines = [
        record(se.TILE_KERNEL, 50.0),  # superseded below
        record(se.TILE_KERNEL, 20.0),
        record(registry.baseline().name, 80.0),
        record(se.TILE_KERNEL, 1.0, chip="tpu7x", estimated=False),
    ]
    path = tmp_path / "records.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    records = se.read(path)
    (row,) = se.ratios(records)
    assert (row["chip"], row["ratio"]) == ("v6e", 0.25)
    table = se.format_table(records)
    assert "| v6e | case study | 75,600 | 20.00 | 80.00 | 0.250 |" in table
    assert "not estimated: tpu7x case study" in table and "VMEM" in table
