"""The SVG-mix table (stlib/bench/svg_estimate.py): its cases, the mask the tile kernel is estimated
on, and its reading of records; the estimates themselves compile in the script (``run``), not here."""

from __future__ import annotations

import json
import math

import pytest

from stlib import registry, routing
from stlib.bench import svg_estimate as se
from stlib.configs import CASE_STUDY
from stlib.geometry import raster_order, token_major_order
from stlib.masks import band_width_for_density


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
    raster, _ = se.raster_mask_and_orders(se.SVG_MIX)
    grid = CASE_STUDY.grid
    catalogue = se.kernel_mask("case study", anchor="frame0")
    assert catalogue.num_heads == CASE_STUDY.num_heads and catalogue.length == grid.num_tokens
    assert catalogue.head(0) == raster.head(0).permute(raster_order(grid))
    assert catalogue.head(9) == raster.head(9).permute(token_major_order(grid))
    assert catalogue.head(9) != raster.head(9)
    with pytest.raises(ValueError, match="anchor='frame1'"):
        se.kernel_mask("case study", anchor="frame1")


def test_the_default_anchor_is_the_routed_plans():
    grid = CASE_STUDY.grid
    width = band_width_for_density(grid.num_tokens, 0.25)
    mask, catalogue = se.kernel_mask("case study"), se.kernel_mask("case study", anchor="frame0")
    assert se.ANCHORS[0] == "reordered"
    assert mask.head(0) == catalogue.head(0)  # a spatial head's anchor is frame 0 either way
    temporal = routing.exact_mask(grid, routing.HeadKind.TEMPORAL, width, anchor=routing.Anchor.REORDERED)
    assert mask.head(9) == temporal.permute(token_major_order(grid)) != catalogue.head(9)
    assert {c.get("anchor") for c in se.cases()} == {"reordered", None}
    assert len(se.cases(anchors=se.ANCHORS)) == 3 * len(se.CHIPS) * len(se.VIDEOS)
    with pytest.raises(ValueError, match="anchors"):
        se.cases(anchors=["frame1"])


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
        record(se.TILE_KERNEL, 50.0),  # superseded below; written before anchors were named: frame0
        record(se.TILE_KERNEL, 20.0),
        {**record(se.TILE_KERNEL, 8.0), "anchor": "reordered"},
        record(registry.baseline().name, 80.0),
        record(se.TILE_KERNEL, 1.0, chip="tpu7x", estimated=False),
    ]
    path = tmp_path / "records.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    records = se.read(path)
    rows = se.ratios(records)
    assert [(r["chip"], r["anchor"], r["ratio"]) for r in rows] == [
        ("v6e", "frame0", 0.25),
        ("v6e", "reordered", 0.1),
    ]
    table = se.format_table(records)
    assert "| v6e | case study | frame0 | 75,600 | 20.00 | 80.00 | 0.250 |" in table
    assert "| v6e | case study | reordered | 75,600 | 8.00 | 80.00 | 0.100 |" in table
    assert "not estimated: tpu7x case study" in table and "VMEM" in table
