"""Figures of hardware-independent work: executed vs useful flops and grid steps, the roofline of
each chip, the fraction of the roofline a measurement reaches, and a model's flops by part."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from stlib.plotting.common import PALETTE, color_of


def work_bars(work_records: list[dict], title: str, step_lines: dict[str, float] | None = None):
    """Executed vs useful flops and grid steps per kernel (hardware-independent work).
    ``step_lines``: reference step counts ``{label: steps}`` drawn as dashed lines on the steps panel."""
    fig, (ax1, ax2) = plt.subplots(
        1, 2, figsize=(12, 0.4 * max(len(work_records), 4) + 1.6), constrained_layout=True
    )
    labels = [r["label"] for r in work_records]
    y = np.arange(len(labels))
    ax1.barh(
        y - 0.2, [r["executed_flops"] / 1e12 for r in work_records], 0.4, label="executed", color=PALETTE[0]
    )
    ax1.barh(
        y + 0.2,
        [r["useful_flops"] / 1e12 for r in work_records],
        0.4,
        label="useful (allowed pairs)",
        color=PALETTE[2],
    )
    ax1.set_yticks(y, labels)
    ax1.invert_yaxis()
    ax1.set(xlabel="TFLOP per call", title="flops")
    ax1.legend(fontsize=8)
    ax2.barh(y, [r["grid_steps"] for r in work_records], color=PALETTE[4])
    ax2.set_yticks(y, [])
    ax2.invert_yaxis()
    ax2.set(xlabel="grid steps per call", title="grid steps (every step pays loop overhead)")
    for i, (label, steps) in enumerate((step_lines or {}).items()):
        ax2.axvline(steps, color="black", ls=["--", ":", "-."][i % 3], lw=1.2, label=label)
    if step_lines:
        ax2.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16))
    fig.suptitle(title, fontsize=11)
    return fig


def roofline_fraction(records: list[dict], chip: str, title: str):
    """Roofline time on ``chip`` (executed flops / bytes) over the measured median, per label."""
    fig, ax = plt.subplots(figsize=(6.8, 0.42 * max(len(records), 4) + 1.4), constrained_layout=True)
    labels = [r["label"] for r in records]
    frac = [r[f"roofline_{chip}_ms"] / r["median_ms"] for r in records]
    ax.barh(np.arange(len(labels)), frac, color=[color_of(labels)[lab] for lab in labels])
    ax.set_yticks(np.arange(len(labels)), labels)
    ax.invert_yaxis()
    ax.set(xlabel=f"fraction of the {chip} roofline reached", title=title)
    return fig


def roofline_chart(chips: list[str], points: list[dict], title: str):
    """Attainable bf16 FLOP/s against arithmetic intensity (flop / HBM byte) for each chip, with
    workload points ``{"label", "flops", "bytes"}`` marked on every roof."""
    from stlib.device import chip_spec

    fig, ax = plt.subplots(figsize=(7.2, 4.8), constrained_layout=True)
    intensity = np.logspace(0, 6, 200)
    for i, chip in enumerate(chips):
        spec = chip_spec(chip)
        ax.plot(
            intensity,
            np.minimum(spec.bf16_flops, intensity * spec.hbm_bandwidth) / 1e12,
            color=PALETTE[i],
            label=f"{chip}: {spec.bf16_flops / 1e12:.0f} TFLOP/s, {spec.hbm_bandwidth / 1e12:.2f} TB/s",
        )
        for point in points:
            x = point["flops"] / point["bytes"]
            ax.plot(
                x, min(spec.bf16_flops, x * spec.hbm_bandwidth) / 1e12, "o", color=PALETTE[i], markersize=6
            )
    for point in points:  # each point's intensity as a labelled vertical line, readable against every roof
        x = point["flops"] / point["bytes"]
        ax.axvline(x, color="grey", lw=0.8, ls="--", zorder=0)
        ax.text(  # right of its line, clear of the dots on it, over a light box where a roof crosses it
            x * 1.15,
            1.2,
            f"{point['label']} ({x:,.0f})",
            rotation=90,
            fontsize=8,
            va="bottom",
            ha="left",
            bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 1.0},
        )
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="arithmetic intensity (flop per HBM byte)",
        ylabel="attainable bf16 TFLOP/s",
        title=title,
    )
    ax.legend(fontsize=8, loc="upper left")  # the empty corner above the slopes
    return fig


def cost_breakdown(parts_by_label: dict[str, dict[str, float]], title: str):
    """Stacked horizontal bars: the share of each part of the forward flops, one bar per label."""
    fig, ax = plt.subplots(figsize=(8.5, 0.6 * len(parts_by_label) + 1.8), constrained_layout=True)
    labels = list(parts_by_label)
    names = list(next(iter(parts_by_label.values())))
    left = np.zeros(len(labels))
    for i, name in enumerate(names):
        values = np.array([parts_by_label[lab][name] / sum(parts_by_label[lab].values()) for lab in labels])
        ax.barh(labels, values, left=left, color=PALETTE[i % len(PALETTE)], label=name)
        for y, (x0, w) in enumerate(zip(left, values)):
            if w > 0.06:
                ax.text(x0 + w / 2, y, f"{w:.0%}", ha="center", va="center", fontsize=8, color="white")
        left += values
    ax.set(xlim=(0, 1), xlabel="share of the block's forward flops", title=title)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=2)
    return fig
