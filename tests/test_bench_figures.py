"""stlib.bench.figures: the benchmark figures redraw from the committed records alone."""

from __future__ import annotations

from stlib import paths
from stlib.bench.figures import _near_density, draw_figures

#: The committed records (the repository's data/, not the test session's STLIB_HOME).
DATA_DIR = paths.REPO / "data"


def test_near_density_keeps_dense_and_the_band_near_it():
    rows = [
        {"pattern": "dense", "density": 1.0},
        {"pattern": "band", "density": 0.26},
        {"pattern": "band", "density": 0.45},
        {"pattern": "sliding tile", "density": 0.25},
    ]
    assert _near_density(rows) == rows[:2]


def test_draw_figures_from_the_committed_records(tmp_path):
    written = draw_figures(DATA_DIR, tmp_path)
    assert written and all(
        p.parent == tmp_path and p.suffix == ".png" and p.stat().st_size > 0 for p in written
    )


def test_draw_figures_without_records_draws_nothing(tmp_path):
    assert draw_figures(tmp_path / "empty", tmp_path) == []


def test_the_latest_tpu_run_is_drawn_next_to_the_static_estimates(tmp_path):
    """A TPU run appended to case_study.jsonl keeps its own figure after later CPU runs."""
    import json
    import shutil

    from stlib.bench.records import read_records

    data = tmp_path / "data"
    data.mkdir()
    for name in ("case_study_work.jsonl", "case_study_reference.json"):
        shutil.copy(DATA_DIR / name, data / name)
    cpu = read_records(DATA_DIR / "case_study.jsonl", latest_run=True)
    tpu = [
        {**r, "backend": "tpu", "device_kind": "TPU v6 lite", "interpret": False, "run": "tpu"} for r in cpu
    ]
    later = [{**r, "run": "later-cpu"} for r in cpu]
    (data / "case_study.jsonl").write_text("".join(json.dumps(r) + "\n" for r in tpu + later))
    names = {p.name for p in draw_figures(data, tmp_path / "figures")}
    assert {"bench_tpu_case_study_latency.png", "bench_case_study_roofline.png"} <= names
    assert "bench_case_study_latency.png" in names  # the latest (CPU) run, as before
