"""stlib.bench.figures: the benchmark figures redraw from the committed records alone."""

from __future__ import annotations

from stlib.bench.figures import _near_density, draw_figures
from stlib.bench.records import DATA_DIR


def test_near_density_keeps_dense_and_the_band_near_it():
    rows = [{"pattern": "dense", "density": 1.0}, {"pattern": "band", "density": 0.26},
            {"pattern": "band", "density": 0.45}, {"pattern": "sliding tile", "density": 0.25}]
    assert _near_density(rows) == rows[:2]


def test_draw_figures_from_the_committed_records(tmp_path):
    written = draw_figures(DATA_DIR, tmp_path)
    assert written and all(p.parent == tmp_path and p.suffix == ".png" and p.stat().st_size > 0 for p in written)


def test_draw_figures_without_records_draws_nothing(tmp_path):
    assert draw_figures(tmp_path / "empty", tmp_path) == []
