"""The plotting helpers added for the notebooks draw and save without error (smoke tests)."""

import matplotlib

from stlib import plotting

matplotlib.use("Agg")


def test_relative_bars(tmp_path):
    rows = {
        "FULL": {"pairs": 10.0, "tiles": 4, "time": 2.0},
        "PARTIAL": {"pairs": 5.0, "tiles": 4, "time": 2.1},
    }
    fig = plotting.relative_bars(rows, "FULL", "t")
    assert plotting.save(fig, tmp_path / "r.png").stat().st_size > 0


def test_tile_size_tradeoff(tmp_path):
    panels = {
        "work": ("eff", {"a": [0.9, 0.8], "b": [0.5, 0.4]}, False),
        "steps": ("steps", {"a": [100, 10], "b": [200, 20]}, True),
    }
    fig = plotting.tile_size_tradeoff(
        ["128 x 128", "256 x 256"], panels, "t", limits={"steps": (50, "limit")}
    )
    assert len(fig.axes) == 2
    assert plotting.save(fig, tmp_path / "t.png").stat().st_size > 0


def test_estimate_speedups(tmp_path):
    fig = plotting.estimate_speedups([{"label": "a", "speedup": 2.0, "ideal": 2.5}], "t")
    assert plotting.save(fig, tmp_path / "e.png").stat().st_size > 0


def test_work_bars_step_lines_and_legend_outside(tmp_path):
    work = [{"label": "a", "executed_flops": 2e12, "useful_flops": 1e12, "grid_steps": 10}]
    fig = plotting.work_bars(work, "t", step_lines={"full grid": 20})
    assert fig.axes[1].get_legend() is not None
    records = [{"label": "a", "density": d, "median_ms": 1 / d} for d in (0.2, 0.5)]
    fig = plotting.speedup_vs_density(records, 1.0, "t", legend_outside=True)
    assert plotting.save(fig, tmp_path / "s.png").stat().st_size > 0
