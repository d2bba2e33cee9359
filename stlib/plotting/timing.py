"""Figures of measured times: latency bars (with the published and estimated times in a panel of their
own), speed-up against density, timing lines and bars of named or relative values."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from stlib.plotting.common import ESTIMATE_HATCH, PALETTE, color_of, where_measured


def latency_bars(
    records: list[dict], title: str, published: dict | None = None, estimates: list[dict] | None = None
):
    """Median latency per label with min-max whiskers; the published v6e bars and hatched static
    estimates (``{"label", "ms"}``) in a panel of their own, never on the same axis as CPU times."""
    panels = 1 + (published is not None or bool(estimates))
    fig, axes = plt.subplots(
        1,
        panels,
        figsize=(6.2 * panels, 0.42 * max(len(records), 4) + 1.6),
        constrained_layout=True,
        squeeze=False,
    )
    ax = axes[0, 0]
    labels = [r["label"] for r in records]
    colors = color_of(labels)
    y = np.arange(len(records))
    med = np.array([r["median_ms"] for r in records])
    err = np.array([[r["median_ms"] - r["min_ms"], r["max_ms"] - r["median_ms"]] for r in records]).T
    ax.barh(y, med, xerr=err, color=[colors[lab] for lab in labels], capsize=2)
    ax.set_yticks(y, labels)
    ax.invert_yaxis()
    ax.set(xlabel="median latency (ms)", title=f"measured: {where_measured(records[0])}")
    if panels == 2:
        ax2 = axes[0, 1]
        rows = []
        if published:
            rows += [
                ("published: dense Splash", published["dense_splash_ms"], False),
                ("published: tile-aligned sparse", published["tile_aligned_sparse_ms"], False),
            ]
        rows += [(f"estimate: {e['label']}", e["ms"], True) for e in (estimates or [])]
        y2 = np.arange(len(rows))
        bars = ax2.barh(y2, [r[1] for r in rows], color=[PALETTE[7] if r[2] else PALETTE[3] for r in rows])
        for bar, row in zip(bars, rows):
            if row[2]:
                bar.set_hatch(ESTIMATE_HATCH)
                bar.set_facecolor("white")
                bar.set_edgecolor(PALETTE[7])
            ax2.text(
                bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {row[1]:.2f}", va="center", fontsize=8
            )
        ax2.set_yticks(y2, [r[0] for r in rows])
        ax2.invert_yaxis()
        ax2.set(
            xlabel="latency (ms)",
            title="one TPU v6e, 75,600 tokens x 10 heads x 128"
            + (
                "\n(hatched: static estimate, calibrated on one dense v6e point; not a measurement)"
                if estimates
                else ""
            ),
        )
    fig.suptitle(title, fontsize=11)
    return fig


def speedup_vs_density(
    records: list[dict], baseline_ms: float, title: str, ax=None, legend_outside: bool = False
):
    """Speed-up over a dense baseline against density, one line per label, with the ideal 1/density.
    ``legend_outside``: the legend to the right of the axes (for many lines)."""
    if ax is None:
        fig, ax = plt.subplots(figsize=(9.6 if legend_outside else 6.8, 4.6), constrained_layout=True)
    else:
        fig = ax.figure
    labels = list(dict.fromkeys(r["label"] for r in records))
    colors = color_of(labels)
    for label in labels:
        rows = sorted((r for r in records if r["label"] == label), key=lambda r: r["density"])
        ax.plot(
            [r["density"] for r in rows],
            [baseline_ms / r["median_ms"] for r in rows],
            "o-",
            label=label,
            color=colors[label],
        )
    grid = np.linspace(min(r["density"] for r in records) * 0.9, 1.0, 100)
    ax.plot(grid, 1 / grid, "k--", lw=1, label="ideal 1 / density")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set(xlabel="density (allowed pairs / L²)", ylabel="speed-up over dense", yscale="log", title=title)
    if legend_outside:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)
    else:
        ax.legend(fontsize=8)
    return fig


def timing_lines(
    series: dict[str, list[tuple[float, float]]], title: str, xlabel: str, ylabel: str = "median time (ms)"
):
    """One line per series of (x, y) points, or of (x, y, low, high) points drawn with whiskers from
    low to high (for example the fastest and slowest of the timed calls)."""
    fig, ax = plt.subplots(figsize=(6.8, 4.4), constrained_layout=True)
    for i, (name, points) in enumerate(series.items()):
        columns = list(zip(*sorted(points)))
        xs, ys, color = columns[0], columns[1], PALETTE[i % len(PALETTE)]
        ax.plot(xs, ys, "o-", color=color, label=name)
        if len(columns) == 4:
            low, high = np.asarray(columns[2]), np.asarray(columns[3])
            ax.errorbar(
                xs,
                ys,
                yerr=[np.asarray(ys) - low, high - np.asarray(ys)],
                fmt="none",
                ecolor=color,
                capsize=3,
                linewidth=1,
            )
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    return fig


def named_bars(values: dict[str, float], title: str, xlabel: str, sort: bool = True):
    """One horizontal bar per name (sorted by value)."""
    names = sorted(values, key=values.get) if sort else list(values)
    fig, ax = plt.subplots(figsize=(7.5, 0.34 * len(names) + 1.4), constrained_layout=True)
    bars = ax.barh(np.arange(len(names)), [values[n] for n in names], color=PALETTE[0])
    for bar, name in zip(bars, names):
        ax.text(
            bar.get_width(),
            bar.get_y() + bar.get_height() / 2,
            f" {values[name]:.3f}",
            va="center",
            fontsize=8,
        )
    ax.set_yticks(np.arange(len(names)), names, fontsize=8)
    ax.set(xlabel=xlabel, title=title)
    return fig


def relative_bars(
    rows: dict[str, dict[str, float]], baseline: str, title: str, xlabel: str = "relative to the baseline"
):
    """Grouped horizontal bars: for each metric (e.g. allowed pairs, tiles computed, measured time),
    each row's value over the ``baseline`` row's, annotated with the value itself. ``rows``:
    ``{row label: {metric label: value}}``, every row with the same metrics."""
    labels = list(rows)
    metrics = list(rows[baseline])
    fig, ax = plt.subplots(figsize=(8.8, 0.5 * len(metrics) * len(labels) + 1.8), constrained_layout=True)
    height = 0.8 / len(labels)
    for i, label in enumerate(labels):
        y = np.arange(len(metrics)) - 0.4 + height * (i + 0.5)
        ratios = [rows[label][m] / rows[baseline][m] for m in metrics]
        bars = ax.barh(y, ratios, height * 0.92, color=PALETTE[i % len(PALETTE)], label=label)
        for bar, ratio in zip(bars, ratios):
            ax.text(
                bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {ratio:.2f}x", va="center", fontsize=8
            )
    ax.axvline(1.0, color="grey", lw=0.8)
    ax.set_yticks(np.arange(len(metrics)), metrics)
    ax.invert_yaxis()
    ax.set_xlim(0, 1.25 * max(rows[lab][m] / rows[baseline][m] for lab in labels for m in metrics))
    ax.set(xlabel=xlabel, title=title)
    ax.legend(
        fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.08 - 0.3 / len(metrics)), ncol=len(labels)
    )
    return fig


def same_mask_bars(rows: list[dict], title: str):
    """Per direction (a panel each), per mask: the tile kernel's and Splash's measured times side by
    side, each annotated with its ms (Splash's with its blocks), and the floor the mask allows as a
    black tick, on a log scale. ``rows``: ``stlib.bench.same_mask.best_rows`` of one chip and head
    count."""
    directions = sorted({r["direction"] for r in rows}, key=["forward", "train"].index)
    masks = sorted({r["mask"] for r in rows})
    fig, axes = plt.subplots(
        1, len(directions), figsize=(6.4 * len(directions), 0.9 * len(masks) + 1.8),
        constrained_layout=True, squeeze=False,
    )  # fmt: skip
    for ax, direction in zip(axes[0], directions):
        by_mask = {r["mask"]: r for r in rows if r["direction"] == direction}
        for m, mask in enumerate(masks):
            row = by_mask.get(mask)
            if row is None:
                continue
            bars = [("tile kernel", row["tile_ms"], PALETTE[0], "")]
            if row["splash_ms"] is not None:
                bq, bkv = row["splash_blocks"]
                bars.append(("Splash", row["splash_ms"], PALETTE[3], f" ({bq} x {bkv})"))
            for b, (label, ms, color, note) in enumerate(bars):
                if ms is None:
                    continue
                y = m - 0.2 + 0.4 * b
                ax.barh(y, ms, 0.38, color=color, label=label if m == 0 else None)
                ax.text(ms, y, f" {ms:.1f}{note}", va="center", fontsize=8)
            if row["floor_ms"]:
                ax.plot([row["floor_ms"]] * 2, [m - 0.42, m + 0.42], color="black", lw=2,
                        label="floor (peak on the allowed pairs)" if m == 0 else None)  # fmt: skip
        ax.set_yticks(np.arange(len(masks)), masks, fontsize=8)
        ax.invert_yaxis()
        values = [
            v
            for r in rows
            if r["direction"] == direction
            for v in (r["tile_ms"], r["splash_ms"], r["floor_ms"])
            if v
        ]
        ax.set_xscale("log")  # masks a hundredfold apart in time, each still readable
        ax.set_xlim(min(values) / 2, max(values) * 4)
        ax.set(xlabel="median ms (measured, log scale)", title=direction)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, loc="outside lower center", ncol=len(labels))
    fig.suptitle(title)
    return fig
