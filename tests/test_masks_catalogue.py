"""The named case-study masks (stlib/masks/catalogue.py)."""

from __future__ import annotations

from stlib import VideoGrid, masks
from stlib.configs import CASE_STUDY
from stlib.masks import SlidingTileMask

NAMES = [
    "full",
    "band (density 0.25)",
    "spatial (frame window 1)",
    "temporal (spatial window 40)",
    "spatial band 0.25 + anchor",
    "temporal band 0.25 + anchor",
    "temporal band 0.25, token-major",
    "neighborhood 7x15x15",
    "sliding tile 3x8x16, window 3",
    "sliding tile, 3-D tiled order",
    "radial (window 1200)",
    "frame causal",
    "per-head SVG (5 spatial, 5 temporal)",
]


def test_case_study_names_and_lengths():
    catalog = masks.case_study_masks()
    assert list(catalog) == NAMES
    assert all(m.length >= CASE_STUDY.num_tokens for m in catalog.values())
    assert catalog["per-head SVG (5 spatial, 5 temporal)"].num_heads == CASE_STUDY.num_heads


def test_sliding_tile_geometry_comes_from_the_workload():
    sta = masks.case_study_masks()["sliding tile 3x8x16, window 3"]
    assert isinstance(sta, SlidingTileMask)
    assert (sta.tile, sta.window) == (CASE_STUDY.sta_tile, CASE_STUDY.sta_window)


def test_catalogue_is_equal_by_value_when_rebuilt():
    grid = VideoGrid(9, 24, 48)
    first, second = masks.case_study_masks(grid, 4), masks.case_study_masks(grid, 4)
    assert "per-head SVG (2 spatial, 2 temporal)" in first
    assert first == second and all(first[n] is not second[n] for n in first)
    assert len(set(first.values())) == len(first)
