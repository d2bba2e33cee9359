"""What every figure shares: one palette (tile kinds in fixed colours, estimates hatched), the
theme, ``save``, and the line that says where a record was measured."""

from __future__ import annotations

from pathlib import Path

import seaborn as sns

PALETTE = sns.color_palette("colorblind")
KIND_COLORS = ["#f2f2f2", PALETTE[1], PALETTE[0]]  # EMPTY, PARTIAL, FULL
ESTIMATE_HATCH = "//"

sns.set_theme(style="whitegrid", palette=PALETTE, font_scale=0.9)


def save(fig, path) -> Path:
    """Write ``fig`` as PNG (creating the folder) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130, bbox_inches="tight")
    return path


def color_of(labels) -> dict:
    """{label: palette colour}, in the order the labels first appear."""
    unique = list(dict.fromkeys(labels))
    return {label: PALETTE[i % len(PALETTE)] for i, label in enumerate(unique)}


def where_measured(record: dict) -> str:
    """'TPU v6e lite', or 'CPU, Pallas interpret mode (not TPU times)'."""
    if record.get("interpret"):
        return f"{record.get('backend', 'cpu').upper()}, Pallas interpret mode (not TPU times)"
    return record.get("device_kind", record.get("backend", "?"))
