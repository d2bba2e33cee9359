"""What a sparse plan loses: output error against dense attention vs the work executed."""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Patch

from stlib.plotting.common import color_of


def quality_vs_work(records: list[dict], title: str):
    """Relative L2 error against dense (y, log) vs executed flops relative to dense (x), one line per
    pattern, boundary policy and anchor across densities; left: work at the grid where quality was
    measured, right: the same plans' work at the full grid (``full_executed_vs_dense``), where the
    records carry it. ``records``: ``stlib.bench.svg_quality.quality_sweep`` records."""
    has_full = any("full_executed_vs_dense" in r for r in records)
    fig, axes = plt.subplots(
        1,
        2 if has_full else 1,
        figsize=(12 if has_full else 6.4, 4.6),
        squeeze=False,
        sharey=True,
        constrained_layout=True,
    )
    patterns = list(dict.fromkeys(r["pattern"] for r in records))
    colors = color_of(patterns)
    markers = {"exact": "o", "balanced": "s"}
    styles = {"reordered": "-", "frame0": ":", "none": "--"}
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault((r["pattern"], r["boundary"], r["anchor"]), []).append(r)
    panels = [("executed_vs_dense", "measured grid")] + (
        [("full_executed_vs_dense", "full grid")] if has_full else []
    )
    for ax, (key, where) in zip(axes[0], panels):
        for (pattern, boundary, anchor), rows in groups.items():
            rows = sorted(rows, key=lambda r: r["density"])
            ax.plot(
                [r[key] for r in rows],
                [r["rel_l2"] for r in rows],
                linestyle=styles.get(anchor, "-"),
                marker=markers.get(boundary, "^"),
                color=colors[pattern],
                alpha=0.85,
            )
        ax.axvline(1.0, color="grey", lw=0.8)
        grid = records[0].get("grid" if key == "executed_vs_dense" else "full_grid")
        blocks = (
            (records[0]["block_q"], records[0]["block_kv"])
            if key == "executed_vs_dense"
            else records[0].get("full_blocks")
        )
        ax.set(
            xlabel=f"executed flops / dense flops ({where} {'x'.join(map(str, grid))}, "
            f"{blocks[0]}x{blocks[1]} tiles)",
            yscale="log",
        )
    axes[0][0].set_ylabel("relative L2 error of the output vs dense")
    handles = [Patch(color=colors[p], label=p) for p in patterns]
    handles += [
        plt.Line2D([], [], marker=m, linestyle="", color="0.4", label=f"{b} boundary")
        for b, m in markers.items()
    ]
    handles += [
        plt.Line2D([], [], linestyle=s, color="0.4", label=f"anchor {a}")
        for a, s in styles.items()
        if any(r["anchor"] == a for r in records)
    ]
    axes[0][-1].legend(handles=handles, fontsize=8, loc="upper right")
    fig.suptitle(title)
    return fig
