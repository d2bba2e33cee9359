"""Predicted vs published (stlib.analysis.published): the committed records match the committed
measurements, and the table and figure are drawn from records alone (no compiler)."""

from __future__ import annotations

import json

import matplotlib

from stlib import plotting
from stlib.analysis import published

matplotlib.use("Agg")


def _row(id_, chip, calibration, published_ms, estimate_ms=None, kv=32):
    row = {
        "id": id_,
        "source_title": "a source",
        "chip": chip,
        "mask": "causal",
        "num_heads": 32,
        "num_kv_heads": kv,
        "head_dim": 256,
        "length": 8192,
        "published_ms": published_ms,
        "calibration": calibration,
    }
    if estimate_ms is None:
        return {**row, "estimate_error": "ScheduleFormatError: branch at 0xc9: ..."}
    blocks = {"block_q": 512, "block_kv": 1024, "block_kv_compute": 512}
    error = 100 * (estimate_ms / published_ms - 1)
    return {**row, "estimate_ms": estimate_ms, "estimate_blocks": blocks, "error_pct": error}


ROWS = [
    _row("cal", "tpu7x", True, 24.75, 24.75, kv=8),
    _row("mha", "tpu7x", False, 2.0, 2.5),
    _row("gqa", "tpu7x", False, 4.0, 3.0, kv=4),
    _row("refused", "tpu7x", False, 8.0),
]


def test_format_table_marks_calibration_errors_and_refusals():
    text = published.format_table(ROWS, "0.0.42.1").splitlines()
    assert "libtpu 0.0.42.1" in text[0]
    assert text[2].startswith("* tpu7x") and "+0.0%" in text[2]
    assert "+25.0%" in text[3] and "-25.0%" in text[4]
    assert "no estimate: ScheduleFormatError" in text[5]
    assert text[-1] == "held out: 2 estimated, |error| median 25.0%, largest 25.0%; 1 without an estimate"


def test_load_predictions_reads_the_records(tmp_path):
    path = tmp_path / "records.json"
    path.write_text(json.dumps({"libtpu": "0.0.42.1", "rows": ROWS}))
    assert published.load_predictions(path) == ROWS


def test_committed_records_cover_every_published_measurement():
    measured = [r["id"] for r in published.load()]
    rows = published.load_predictions()
    assert [r["id"] for r in rows] == measured, "rerun `python -m stlib.estimate published`"
    assert all(("estimate_ms" in r) != ("estimate_error" in r) for r in rows)
    assert sum(r["calibration"] for r in rows) == 2  # one point per calibrated chip: v6e, tpu7x
    assert "implied GHz" in published.load_calibration()


def test_estimate_vs_published_figure(tmp_path):
    fig = plotting.estimate_vs_published(ROWS, "t")
    assert len(fig.axes) == 2
    assert "1 published row without an estimate" in fig._suptitle.get_text()
    assert plotting.save(fig, tmp_path / "p.png").stat().st_size > 0
