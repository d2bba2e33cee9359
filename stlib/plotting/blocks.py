"""Figures of block-size choices: VMEM per kernel configuration, the tile-size trade-off, and the
static-estimate block sweep (its data from ``stlib.bench.block_sweep.figure_rows``)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from stlib.plotting.common import PALETTE, color_of


def vmem_bars(rows: list[dict], title: str, limit_bytes: float | None = None, limit_label: str = "limit"):
    """VMEM of kernel configurations, stacked by part. ``rows``: ``{"label", "parts": {name: bytes},
    "compiler": bytes or None, "compiler_total": bytes or None}``; the compiler's figures are drawn
    as markers, ``limit_bytes`` as a line."""
    fig, ax = plt.subplots(figsize=(8.8, 0.75 * len(rows) + 2.0), constrained_layout=True)
    names = list(dict.fromkeys(name for row in rows for name in row["parts"]))
    y = np.arange(len(rows))
    left = np.zeros(len(rows))
    mib = float(1 << 20)
    for i, name in enumerate(names):
        widths = np.array([row["parts"].get(name, 0) / mib for row in rows])
        ax.barh(y, widths, left=left, color=PALETTE[i % len(PALETTE)], label=name, height=0.55)
        left += widths
    widest = 0.0
    for yi, total, row in zip(y, left, rows):
        asked = (row.get("compiler_total") or 0) / mib
        text = f"{total:.2f} MiB" + (f" counted, {asked:.2f} asked for" if asked else "")
        widest = max(widest, total, asked)
        # clear of the bar's end and of a marker there (8 points wide)
        ax.annotate(
            text, (max(total, asked), yi), xytext=(8, 0), textcoords="offset points", va="center", fontsize=8
        )
    for key, style, label in [
        ("compiler", "kD", "allocated by the compiler (buffers + scratch)"),
        ("compiler_total", "kX", "scoped VMEM the compiler asked for (its error message)"),
    ]:
        marked = [(yi, row[key] / mib) for yi, row in zip(y, rows) if row.get(key) is not None]
        if marked:
            ax.plot([m[1] for m in marked], [m[0] for m in marked], style, markersize=8, label=label)
    if limit_bytes is not None:
        ax.axvline(limit_bytes / mib, color="black", ls="--", lw=1.2, label=limit_label)
    ax.set_xlim(0, 1.3 * widest)  # room for the totals' text
    ax.set_yticks(y, [row["label"] for row in rows])
    ax.invert_yaxis()
    ax.set(xlabel="VMEM (MiB)", title=title)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=2)
    return fig


#: Markers of ``tile_size_tradeoff``'s lines, drawn largest first so coinciding points nest.
_NESTED_MARKERS = ("o", "s", "^", "D", "v")


def tile_size_tradeoff(
    tile_shapes: list[str],
    panels: dict[str, tuple[str, dict[str, list[float]], bool]],
    title: str,
    limits: dict[str, tuple[float, str]] | None = None,
):
    """Both sides of the tile-size trade-off, one panel per metric against the tile shape (labels
    such as "512 x 1,024", in the order given), one line per pattern, each with its own marker and
    the earlier ones larger, so lines that coincide still show every pattern. ``panels``: ``{panel
    title: (y label, {pattern: [value per tile shape]}, log y)}``; ``limits``: ``{panel title:
    (value, label)}`` drawn as a dashed line (e.g. the SMEM of a chip)."""
    fig, axes = plt.subplots(
        1, len(panels), figsize=(4.6 * len(panels), 4.4), constrained_layout=True, squeeze=False
    )
    x = np.arange(len(tile_shapes))
    patterns = list(dict.fromkeys(p for _, series, _ in panels.values() for p in series))
    colors = {p: PALETTE[i % len(PALETTE)] for i, p in enumerate(patterns)}
    for ax, (name, (ylabel, series, log)) in zip(axes[0], panels.items()):
        for pattern, values in series.items():
            n = patterns.index(pattern)
            ax.plot(
                x,
                values,
                "-",
                marker=_NESTED_MARKERS[n % len(_NESTED_MARKERS)],
                ms=max(11 - 2.5 * n, 4),
                lw=max(3.2 - 0.8 * n, 1.2),
                mfc="none" if n < len(patterns) - 1 else colors[pattern],
                mew=1.6,
                color=colors[pattern],
                label=pattern,
            )
        if limits and name in limits:
            value, label = limits[name]
            ax.axhline(value, color="black", ls="--", lw=1.2, label=label)
        ax.set_xticks(x, tile_shapes, rotation=30, ha="right")
        ax.set(
            xlabel="tile (block_q x block_kv)", ylabel=ylabel, title=name, yscale="log" if log else "linear"
        )
    handles = {}
    for ax in axes[0]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    fig.legend(
        list(handles.values()),
        list(handles),
        loc="lower center",
        ncol=len(handles),
        fontsize=8,
        bbox_to_anchor=(0.5, -0.09),
    )
    fig.suptitle(title, fontsize=11)
    return fig


def block_sweep(
    panels: dict[str, list[dict]],
    chips: list[str],
    title: str,
    ylabel: str,
    targets: dict[str, tuple[float, str]] | None = None,
):
    """Bars of a ratio per block candidate, one panel per ``panels`` key, one colour per chip (in the
    order of ``chips``), each chip's best ratio written above its bar, 1.0 dashed. ``panels``:
    ``{panel title: [{"chip", "blocks" (the candidate's label), "ratio"}]}``; ``targets``:
    ``{panel title: (ratio, label)}`` drawn as a dotted line. ``stlib.bench.block_sweep.figure_rows``
    turns the sweep's records into these arguments."""
    colors = color_of(chips)
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4.0), squeeze=False)
    for ax, (name, rows) in zip(axes[0], panels.items()):
        labels = list(dict.fromkeys(r["blocks"] for r in rows))
        width = 0.8 / max(len(chips), 1)
        for c, chip in enumerate(chips):
            by = {r["blocks"]: r["ratio"] for r in rows if r["chip"] == chip}
            xs = [i + c * width for i, lab in enumerate(labels) if lab in by]
            ys = [by[lab] for lab in labels if lab in by]
            ax.bar(xs, ys, width, color=colors[chip], label=chip)
            if ys:
                best = min(ys)
                ax.annotate(f"{best:.2f}", (xs[ys.index(best)], best), ha="center", va="bottom", fontsize=7)
        ax.axhline(1.0, ls="--", color="0.3", lw=1)
        if targets and name in targets:
            value, label = targets[name]
            ax.axhline(value, ls=":", color="C3", lw=1.2, label=label)
        ax.set_xticks(
            [i + width * (len(chips) - 1) / 2 for i in range(len(labels))],
            labels,
            rotation=35,
            ha="right",
            fontsize=8,
        )
        ax.set_title(name)
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    return fig
