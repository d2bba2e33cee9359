"""Predicted vs published: every public measurement in ``data/published_measurements.json`` next to
its static estimate, the calibration points (one per chip) marked, the rest held out."""

from __future__ import annotations

import json
from pathlib import Path

from stlib.analysis.static import static_estimate

DATA = Path(__file__).resolve().parents[2] / "data"
MEASUREMENTS = DATA / "published_measurements.json"
RECORDS = DATA / "estimate_published.json"


def load(path: Path = MEASUREMENTS) -> list[dict]:
    """The published measurements (rows of ``path``)."""
    return json.loads(Path(path).read_text())["measurements"]


def predict(row: dict, use_cache: bool = True) -> dict:
    """``row`` with the static estimate of its call: tuned blocks where the benchmark tuned its own,
    the calibration's blocks where it names none; or the reason there is no estimate."""
    from stlib.analysis.clock import CALIBRATION_POINTS

    point = CALIBRATION_POINTS.get(row["chip"])
    fixed = row["calibration"] and point is not None and point.blocks != "tuned"
    blocks = {"block_q": point.blocks[0], "block_kv": point.blocks[1]} if fixed else "tuned"
    try:
        est = static_estimate(
            row["impl"],
            row["mask"],
            row["chip"],
            num_heads=row["num_heads"] * row.get("batch", 1),
            num_kv_heads=row["num_kv_heads"] * row.get("batch", 1),
            head_dim=row["head_dim"],
            length=row["length"],
            dtype=row["dtype"],
            block_sizes=blocks,
            use_cache=use_cache,
        )
    except Exception as error:  # noqa: BLE001 - recorded, never replaced by a number
        return {**row, "estimate_error": f"{type(error).__name__}: {error}"[:400]}
    # every published time here is a kernel time (no padding / scaling glue around it): like for like
    ms = (est.seconds if row.get("scope", "kernel") == "kernel" else est.total_seconds) * 1e3
    return {
        **row,
        "estimate_ms": ms,
        "estimate_total_ms": est.total_seconds * 1e3,
        "estimate_glue_ms": est.glue_seconds * 1e3,
        "estimate_blocks": est.blocks,
        "estimate_clock_ghz": est.clock_hz / 1e9,
        "estimate_sweep": list(getattr(est, "sweep", ())),
        "error_pct": 100 * (ms / row["published_ms"] - 1),
    }


def table(use_cache: bool = True, path: Path = MEASUREMENTS) -> list[dict]:
    """Every published row with its prediction (``predict``)."""
    return [predict(row, use_cache) for row in load(path)]
