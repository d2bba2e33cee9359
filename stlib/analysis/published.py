"""Predicted vs published: every public measurement in ``data/published_measurements.json`` next to
its static estimate, the calibration points (one per chip) marked, the rest held out.

``table`` compiles (``python -m stlib.estimate published`` writes its rows to
``data/estimate_published.json``); ``load_predictions``, ``load_calibration`` and ``format_table``
only read the committed records, so a notebook shows them without a compiler."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from stlib.analysis.static import static_estimate
from stlib.paths import data_dir

#: Records in ``stlib.paths.data_dir()``: the published measurements, the last run's predictions,
#: and the calibration table as ``python -m stlib.estimate calibrate`` printed it (per chip, the
#: implied clock for each block choice).
MEASUREMENTS = "published_measurements.json"
RECORDS = "estimate_published.json"
CALIBRATION_RECORD = "estimate_calibration.txt"


def record_path(name: str) -> Path:
    """``name`` in the data folder (``stlib.paths.data_dir()``)."""
    return data_dir() / name


def load(path: Path | None = None) -> list[dict]:
    """The published measurements (rows of ``path``, default the data folder's ``MEASUREMENTS``)."""
    return json.loads(Path(path or record_path(MEASUREMENTS)).read_text())["measurements"]


def load_predictions(path: Path | None = None) -> list[dict]:
    """The rows of the last ``python -m stlib.estimate published`` run: each published measurement
    with its estimate (``estimate_ms``, ``error_pct``, ``estimate_blocks``, ...) or the reason there
    is none (``estimate_error``). Raises FileNotFoundError when the record is missing."""
    return json.loads(Path(path or record_path(RECORDS)).read_text())["rows"]


def load_calibration(path: Path | None = None) -> str:
    """The committed calibration table (text). Raises FileNotFoundError when it is missing."""
    return Path(path or record_path(CALIBRATION_RECORD)).read_text()


def _heads(row: dict) -> str:
    return f"{row['num_heads']}:{row['num_kv_heads']}"


def format_table(rows: list[dict], libtpu: str | None = None) -> str:
    """Predicted vs published as text, one line per row (``*``: calibration point), then the held-out
    rows' median and largest absolute error; ``rows`` as ``table`` or ``load_predictions`` give them."""
    version = f" (libtpu {libtpu})" if libtpu else ""
    lines = [
        f"STATIC ESTIMATES vs published{version}; * = calibration point, others held out",
        (
            f"{'':2}{'chip':<6} {'mask':<7} {'heads':>6} {'D':>4} {'L':>7} {'published':>10} "
            f"{'estimate':>9} {'error':>7}  blocks     source"
        ),
    ]
    for r in rows:
        if "estimate_ms" in r:
            blocks = f"{r['estimate_blocks']['block_q']}/{r['estimate_blocks']['block_kv']}"
            est = f"{r['estimate_ms']:>9.3f} {r['error_pct']:>+6.1f}%  {blocks:<9}"
        else:
            est = f"  no estimate: {r['estimate_error'][:70]}"
        lines.append(
            f"{'*' if r['calibration'] else ' ':2}{r['chip']:<6} {r['mask']:<7} {_heads(r):>6} "
            f"{r['head_dim']:>4} {r['length']:>7,} {r['published_ms']:>10.3f} {est}  {r['source_title'][:40]}"
        )
    held = [abs(r["error_pct"]) for r in rows if not r["calibration"] and "estimate_ms" in r]
    refused = sum(1 for r in rows if "estimate_ms" not in r)
    if held:
        lines.append(
            f"held out: {len(held)} estimated, |error| median {statistics.median(held):.1f}%, "
            f"largest {max(held):.1f}%; {refused} without an estimate"
        )
    return "\n".join(lines)


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


def table(use_cache: bool = True, path: Path | None = None) -> list[dict]:
    """Every published row with its prediction (``predict``)."""
    return [predict(row, use_cache) for row in load(path)]
