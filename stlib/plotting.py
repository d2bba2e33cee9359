"""Figures of the notebooks and benchmarks: one palette, labelled axes and units, backend and shape
in every title. Everything that depends on hardware is drawn from records (``stlib.bench``), so a
figure can be redrawn without the hardware. Interpret-mode times are labelled as such; static
estimates are hatched.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import seaborn as sns
from matplotlib.colors import ListedColormap
from matplotlib.patches import Patch

from stlib._intmath import cdiv
from stlib.layout import BlockLayout, TileKind

PALETTE = sns.color_palette("colorblind")
KIND_COLORS = ["#f2f2f2", PALETTE[1], PALETTE[0]]  # EMPTY, PARTIAL, FULL
ESTIMATE_HATCH = "//"
FIGURES_DIR = Path(__file__).resolve().parent.parent / "figures"

sns.set_theme(style="whitegrid", palette=PALETTE, font_scale=0.9)


def save(fig, path) -> Path:
    """Write ``fig`` as PNG (creating the folder) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130, bbox_inches="tight")
    return path


def _color_of(labels):
    unique = list(dict.fromkeys(labels))
    return {label: PALETTE[i % len(PALETTE)] for i, label in enumerate(unique)}


def where_measured(record: dict) -> str:
    """'TPU v6e lite', or 'CPU, Pallas interpret mode (not TPU times)'."""
    if record.get("interpret"):
        return f"{record.get('backend', 'cpu').upper()}, Pallas interpret mode (not TPU times)"
    return record.get("device_kind", record.get("backend", "?"))


def occupancy_heatmap(layout: BlockLayout, title: str, head: int = 0, ax_pair=None):
    """Tile kinds (EMPTY / PARTIAL / FULL) and the allowed fraction of each tile, side by side."""
    if ax_pair is None:
        fig, ax_pair = plt.subplots(1, 2, figsize=(10.5, 4.6), constrained_layout=True)
    else:
        fig = ax_pair[0].figure
    kinds = layout.kinds[head]
    fill = layout.counts[head] / np.maximum(layout.valid_pairs, 1)
    ax_kind, ax_fill = ax_pair
    ax_kind.imshow(
        kinds, cmap=ListedColormap(KIND_COLORS), vmin=0, vmax=2, interpolation="nearest", aspect="auto"
    )
    counts = layout.kind_counts()
    ax_kind.legend(
        handles=[Patch(color=KIND_COLORS[k], label=f"{k.name} ({counts[k.name]:,})") for k in TileKind],
        loc="upper right",
        fontsize=7,
        framealpha=0.9,
    )
    ax_kind.set(
        title="tile kind",
        xlabel=f"kv tile ({layout.block_kv} keys)",
        ylabel=f"q tile ({layout.block_q} queries)",
    )
    image = ax_fill.imshow(fill, cmap="viridis", vmin=0, vmax=1, interpolation="nearest", aspect="auto")
    fig.colorbar(image, ax=ax_fill, label="allowed pairs / tile pairs")
    ax_fill.set(title="work per tile", xlabel=f"kv tile ({layout.block_kv} keys)", ylabel="q tile")
    ax_kind.grid(False)
    ax_fill.grid(False)
    fig.suptitle(
        f"{title}\ndensity {layout.density:.3f}, tile occupancy {layout.occupancy:.3f}, "
        f"partial {layout.partial_fraction:.3f} of non-empty, work efficiency {layout.work_efficiency:.3f}",
        fontsize=10,
    )
    return fig


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
    colors = _color_of(labels)
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
            + ("\n(hatched: static estimate, not a measurement)" if estimates else ""),
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
    colors = _color_of(labels)
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
    ax.barh(np.arange(len(labels)), frac, color=[_color_of(labels)[lab] for lab in labels])
    ax.set_yticks(np.arange(len(labels)), labels)
    ax.invert_yaxis()
    ax.set(xlabel=f"fraction of the {chip} roofline reached", title=title)
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
        for j, point in enumerate(points):
            x = point["flops"] / point["bytes"]
            y = min(spec.bf16_flops, x * spec.hbm_bandwidth) / 1e12
            ax.plot(x, y, "o", color=PALETTE[i], markersize=6)
            if i == len(chips) - 1:
                ax.annotate(
                    point["label"],
                    (x, y),
                    textcoords="offset points",
                    xytext=(-10, -14 - 10 * j),
                    fontsize=8,
                    ha="right",
                )
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="arithmetic intensity (flop per HBM byte)",
        ylabel="attainable bf16 TFLOP/s",
        title=title,
    )
    ax.legend(fontsize=8, loc="lower right")
    return fig


def mask_gallery(named_masks: dict, title: str, columns: int = 4, head: int = 0):
    """Each (small) mask as a black-and-white L x L image: row = query, column = key."""
    rows = cdiv(len(named_masks), columns)
    fig, axes = plt.subplots(
        rows, columns, figsize=(3.0 * columns, 3.1 * rows), constrained_layout=True, squeeze=False
    )
    for ax, (name, mask) in zip(axes.flat, named_masks.items()):
        dense = mask.to_dense()
        dense = dense[head] if dense.ndim == 3 else dense
        ax.imshow(dense, cmap="Greys", interpolation="nearest", vmin=0, vmax=1)
        ax.set_title(f"{name}\ndensity {dense.mean():.2f}", fontsize=8)
        ax.set_xticks([])
        ax.set_yticks([])
        ax.grid(False)
    for ax in list(axes.flat)[len(named_masks) :]:
        ax.axis("off")
    fig.suptitle(title, fontsize=11)
    return fig


def kind_gallery(named_layouts: dict, title: str, columns: int = 4, head: int = 0):
    """The tile kinds (EMPTY / PARTIAL / FULL) of several layouts, one small map each."""
    rows = cdiv(len(named_layouts), columns)
    fig, axes = plt.subplots(
        rows, columns, figsize=(3.2 * columns, 3.4 * rows), constrained_layout=True, squeeze=False
    )
    for ax, (name, layout) in zip(axes.flat, named_layouts.items()):
        ax.imshow(
            layout.kinds[head],
            cmap=ListedColormap(KIND_COLORS),
            vmin=0,
            vmax=2,
            interpolation="nearest",
            aspect="auto",
        )
        counts = layout.kind_counts()
        nonempty = counts["PARTIAL"] + counts["FULL"]
        ax.set_title(
            f"{name}\ndensity {layout.density:.3f}, occupied {layout.occupancy:.3f}\n"
            f"partial {counts['PARTIAL'] / max(nonempty, 1):.0%} of occupied",
            fontsize=8,
        )
        ax.set_xticks([])
        ax.set_yticks([])
        ax.grid(False)
    for ax in list(axes.flat)[len(named_layouts) :]:
        ax.axis("off")
    fig.legend(
        handles=[Patch(color=KIND_COLORS[k], label=k.name) for k in TileKind],
        loc="lower center",
        ncol=3,
        bbox_to_anchor=(0.5, -0.03),
    )
    fig.suptitle(title, fontsize=11)
    return fig


def density_vs_work(named_layouts: dict, title: str):
    """Per mask: density (useful work) against the fraction of tiles a tile-skipping kernel computes."""
    fig, ax = plt.subplots(figsize=(8.5, 0.42 * len(named_layouts) + 1.6), constrained_layout=True)
    names = list(named_layouts)
    y = np.arange(len(names))
    ax.barh(
        y - 0.2,
        [named_layouts[n].density for n in names],
        0.4,
        color=PALETTE[2],
        label="density (useful pairs)",
    )
    ax.barh(
        y + 0.2,
        [named_layouts[n].occupancy for n in names],
        0.4,
        color=PALETTE[0],
        label="tile occupancy (pairs computed by a tile-skipping kernel)",
    )
    ax.set_yticks(y, names)
    ax.invert_yaxis()
    ax.set(xlabel="fraction of all L² pairs", xlim=(0, 1), title=title)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.09), ncol=2)
    return fig


def timing_lines(
    series: dict[str, list[tuple[float, float]]], title: str, xlabel: str, ylabel: str = "median time (ms)"
):
    """One line per series of (x, y) points."""
    fig, ax = plt.subplots(figsize=(6.8, 4.4), constrained_layout=True)
    for i, (name, points) in enumerate(series.items()):
        xs, ys = zip(*sorted(points))
        ax.plot(xs, ys, "o-", color=PALETTE[i % len(PALETTE)], label=name)
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
    for yi, total, row in zip(y, left, rows):
        right = max(total, (row.get("compiler_total") or 0) / mib)
        ax.text(right, yi, f"   {total:.2f} MiB", va="center", fontsize=8)
    for key, style, label in [
        ("compiler", "kD", "allocated by the compiler (buffers + scratch)"),
        ("compiler_total", "kX", "scoped VMEM the compiler asked for (its error message)"),
    ]:
        marked = [(yi, row[key] / mib) for yi, row in zip(y, rows) if row.get(key) is not None]
        if marked:
            ax.plot([m[1] for m in marked], [m[0] for m in marked], style, markersize=8, label=label)
    if limit_bytes is not None:
        ax.axvline(limit_bytes / mib, color="black", ls="--", lw=1.2, label=limit_label)
    ax.set_yticks(y, [row["label"] for row in rows])
    ax.invert_yaxis()
    ax.set(xlabel="VMEM (MiB)", title=title)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=2)
    return fig


def step_table_map(table, title: str, head: int = 0, annotate_max: int = 24):
    """A block-sparse step table (int32 [Hl, nq, nk], entry = fetch_kv << 2 | kind, kind 0 skip /
    1 masked / 2 mask-free): each grid step's kind as a colour, and (for small grids) the kv tile
    it fetches as a number, bold where the step needs a new DMA, grey where the tile is already there."""
    table = np.asarray(table)[head]
    kind, fetch = table & 3, table >> 2
    nq, nk = table.shape
    fig, ax = plt.subplots(
        figsize=(min(0.5 * nk + 2.5, 10), min(0.45 * nq + 1.8, 9)), constrained_layout=True
    )
    ax.imshow(kind, cmap=ListedColormap(KIND_COLORS), vmin=0, vmax=2, interpolation="nearest", aspect="auto")
    if max(nq, nk) <= annotate_max:
        flat = fetch.reshape(-1)
        new = np.ones(flat.shape, bool)
        new[1:] = flat[1:] != flat[:-1]  # grid order: kv fastest, then the next q row
        new = new.reshape(nq, nk)
        for i in range(nq):
            for j in range(nk):
                ax.text(
                    j,
                    i,
                    str(fetch[i, j]),
                    ha="center",
                    va="center",
                    fontsize=8,
                    fontweight="bold" if new[i, j] else "normal",
                    color="black" if new[i, j] else "grey",
                )
    if nk <= annotate_max:
        ax.set_xticks(range(nk))
    if nq <= annotate_max:
        ax.set_yticks(range(nq))
    ax.grid(False)
    names = ["skip (pl.when: no compute)", "masked tile", "mask-free tile"]
    ax.legend(
        handles=[Patch(color=KIND_COLORS[k], label=names[k]) for k in range(3)],
        fontsize=8,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.12),
        ncol=3,
    )
    ax.set(xlabel="grid step j along the kv axis", ylabel="q tile i", title=title)
    return fig


def occupancy_comparison(layouts: dict, title: str, head: int = 0):
    """``occupancy_heatmap`` of several layouts (e.g. one mask before and after reordering), one row each."""
    fig, axes = plt.subplots(
        len(layouts), 2, figsize=(10.5, 4.2 * len(layouts)), constrained_layout=True, squeeze=False
    )
    for row, (name, layout) in zip(axes, layouts.items()):
        occupancy_heatmap(layout, name, head=head, ax_pair=row)
        row[0].set_title(f"{name}: tile kind", fontsize=9)
        row[1].set_title(
            f"density {layout.density:.3f}, occupied {layout.occupancy:.3f}, "
            f"partial {layout.partial_fraction:.0%} of occupied, work efficiency "
            f"{layout.work_efficiency:.2f}",
            fontsize=8,
        )
    fig.suptitle(title, fontsize=11)
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


def tile_size_tradeoff(
    tile_shapes: list[str],
    panels: dict[str, tuple[str, dict[str, list[float]], bool]],
    title: str,
    limits: dict[str, tuple[float, str]] | None = None,
):
    """Both sides of the tile-size trade-off, one panel per metric against the tile shape (labels
    such as "512 x 1,024", in the order given), one line per pattern. ``panels``: ``{panel title:
    (y label, {pattern: [value per tile shape]}, log y)}``; ``limits``: ``{panel title: (value,
    label)}`` drawn as a dashed line (e.g. the SMEM of a chip)."""
    fig, axes = plt.subplots(
        1, len(panels), figsize=(4.6 * len(panels), 4.4), constrained_layout=True, squeeze=False
    )
    x = np.arange(len(tile_shapes))
    patterns = list(dict.fromkeys(p for _, series, _ in panels.values() for p in series))
    colors = {p: PALETTE[i % len(PALETTE)] for i, p in enumerate(patterns)}
    for ax, (name, (ylabel, series, log)) in zip(axes[0], panels.items()):
        for pattern, values in series.items():
            ax.plot(x, values, "o-", color=colors[pattern], label=pattern)
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


def estimate_speedups(rows: list[dict], title: str):
    """Static speed-up estimates over a dense baseline (hatched: estimates, not measurements) next
    to each one's ideal bound 1 / density. ``rows``: ``{"label", "speedup", "ideal"}``."""
    fig, ax = plt.subplots(figsize=(8.2, 0.45 * max(len(rows), 4) + 1.6), constrained_layout=True)
    y = np.arange(len(rows))
    bars = ax.barh(
        y,
        [r["speedup"] for r in rows],
        color="white",
        edgecolor=PALETTE[0],
        hatch=ESTIMATE_HATCH,
        label="static v6e estimate (not a measurement)",
    )
    for bar, row in zip(bars, rows):  # the value right of both the bar and the ideal mark
        ax.text(
            max(row["speedup"], row["ideal"]),
            bar.get_y() + bar.get_height() / 2,
            f"  {row['speedup']:.2f}x",
            va="center",
            fontsize=8,
        )
    ax.plot([r["ideal"] for r in rows], y, "k|", markersize=16, mew=2, label="ideal 1 / density")
    ax.axvline(1.0, color="grey", lw=0.8)
    ax.set_yticks(y, [r["label"] for r in rows])
    ax.invert_yaxis()
    ax.set_xlim(0, 1.2 * max(max(r["speedup"], r["ideal"]) for r in rows))
    ax.set(xlabel="speed-up over dense Splash", title=title)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2)
    return fig


def _tokens(length: int) -> str:
    return f"{length // 1024}K" if length % 1024 == 0 else f"{length:,}"


def estimate_vs_published(rows: list[dict], title: str):
    """Static estimates against published kernel times. Left: estimate (y) vs published (x),
    log-log, the diagonal a perfect prediction and the band +-25%; right: the estimate's error in
    percent vs the published time, each held-out point labelled with its token count. Colour: chip;
    marker: calibration point (star), held out with a kv head per q head (circle) or with shared kv
    heads (square). ``rows``: records of ``stlib.analysis.published.table`` or ``load_predictions``;
    rows without ``estimate_ms`` are counted in the title, not drawn."""
    from stlib.device import CHIPS

    shown = [r for r in rows if r.get("estimate_ms")]
    fig, (ax, ax_err) = plt.subplots(1, 2, figsize=(12.5, 5.4), constrained_layout=True)
    chips = [c for c in CHIPS if any(r["chip"] == c for r in shown)]
    colors = dict(zip(chips, sns.color_palette("colorblind", len(chips))))

    def marker(r: dict) -> str:
        if r["calibration"]:
            return "*"
        return "s" if r.get("num_kv_heads", r["num_heads"]) < r["num_heads"] else "o"

    for r in shown:
        style = {
            "s": 170 if r["calibration"] else 46,
            "color": colors[r["chip"]],
            "marker": marker(r),
            "edgecolor": "black",
            "linewidth": 0.6,
            "zorder": 3,
        }
        ax.scatter(r["published_ms"], r["estimate_ms"], **style)
        ax_err.scatter(r["published_ms"], r["error_pct"], **style)
        if not r["calibration"]:  # shared-kv points labelled on the right, the others on the left
            right = marker(r) == "s"
            ax_err.annotate(
                _tokens(r["length"]),
                (r["published_ms"], r["error_pct"]),
                xytext=(6 if right else -6, 0),
                textcoords="offset points",
                ha="left" if right else "right",
                va="center",
                fontsize=7,
                color="0.25",
            )
    values = [v for r in shown for v in (r["published_ms"], r["estimate_ms"])] or [1.0, 10.0]
    lo, hi = min(values) / 1.6, max(values) * 1.6
    ax.plot([lo, hi], [lo, hi], color="0.3", linewidth=1)
    ax.fill_between([lo, hi], [lo * 0.75, hi * 0.75], [lo * 1.25, hi * 1.25], color="0.88", zorder=0)
    ax.set(
        xscale="log",
        yscale="log",
        xlim=(lo, hi),
        ylim=(lo, hi),
        xlabel="published kernel time (ms)",
        ylabel="static estimate (ms, not a measurement)",
        title="estimate vs published (log-log)",
    )
    errors = [r["error_pct"] for r in shown] or [0.0]
    span = max(30.0, max(abs(e) for e in errors) * 1.25)
    ax_err.axhline(0, color="0.3", linewidth=1)
    ax_err.axhspan(-25, 25, color="0.88", zorder=0)
    ax_err.set(
        xscale="log",
        xlim=(lo, hi),
        ylim=(-span, span),
        xlabel="published kernel time (ms)",
        ylabel="error of the estimate (%)",
        title="error: (estimate / published - 1), labels: tokens",
    )
    handles = [Patch(color=colors[c], label=c) for c in chips]
    handles += [
        plt.Line2D([], [], marker="*", linestyle="", color="0.4", markersize=12, label="calibration point"),
        plt.Line2D([], [], marker="o", linestyle="", color="0.4", label="held out, q heads = kv heads"),
        plt.Line2D([], [], marker="s", linestyle="", color="0.4", label="held out, shared kv heads"),
        Patch(color="0.88", label="within 25%"),
    ]
    ax.legend(handles=handles, loc="upper left", fontsize=8)
    held, missing = sum(1 for r in shown if not r["calibration"]), len(rows) - len(shown)
    counts = f"{len(shown) - held} calibration points, {held} held out"
    if missing:
        counts += f"; {missing} published row{'' if missing == 1 else 's'} without an estimate (not drawn)"
    fig.suptitle(f"{title}\n{counts}")
    return fig


def quality_vs_work(records: list[dict], title: str):
    """Relative L2 error against dense (y, log) vs executed flops relative to dense (x), one line per
    pattern, boundary policy and anchor across densities; left: work at the grid where quality was
    measured, right: the same plans' work at the full grid (``full_executed_vs_dense``), where the
    records carry it. ``records``: ``stlib.routing.quality_sweep`` records."""
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
    colors = _color_of(patterns)
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


def block_sweep(records: list[dict], title: str, targets: dict | None = None):
    """Static-estimate cycles of each swept (block_q, block_kv, block_kv_compute) as a fraction of
    dense Splash at its best swept blocks on the same chip (clock-free), one panel per mask family,
    one colour per chip; Splash's own candidates in the last panel. ``targets``: {family: ratio}
    drawn as a dotted line. Records without an estimate (refused blocks) are left out."""
    ok = [r for r in records if "cycles" in r]
    chips = list(dict.fromkeys(r["chip"] for r in ok))
    base = {
        chip: min(
            r["cycles"] for r in ok if r["chip"] == chip and r["impl"] == "splash" and r["family"] == "dense"
        )
        for chip in chips
        if any(r["chip"] == chip and r["impl"] == "splash" for r in ok)
    }
    chips = [chip for chip in chips if chip in base]  # a ratio needs the chip's Splash records
    ok = [r for r in ok if r["chip"] in base]
    panels = [
        (f, [r for r in ok if r["family"] == f and r["impl"] != "splash"])
        for f in dict.fromkeys(r["family"] for r in ok)
    ]
    panels = [(f, rows) for f, rows in panels if rows] + [
        ("dense Splash", [r for r in ok if r["impl"] == "splash"])
    ]
    colors = _color_of(chips)
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4.0), squeeze=False)
    for ax, (family, rows) in zip(axes[0], panels):

        def label(r):
            return f"{r['block_q']}x{r['block_kv']}" + (
                f"/{r['block_kv_compute']}" if r["block_kv_compute"] else ""
            )

        labels = list(dict.fromkeys(label(r) for r in rows))
        width = 0.8 / max(len(chips), 1)
        for c, chip in enumerate(chips):
            by = {label(r): r["cycles"] / base[chip] for r in rows if r["chip"] == chip and chip in base}
            xs = [i + c * width for i, lab in enumerate(labels) if lab in by]
            ys = [by[lab] for lab in labels if lab in by]
            ax.bar(xs, ys, width, color=colors[chip], label=chip)
            if ys:
                best = min(ys)
                ax.annotate(f"{best:.2f}", (xs[ys.index(best)], best), ha="center", va="bottom", fontsize=7)
        ax.axhline(1.0, ls="--", color="0.3", lw=1)
        if targets and family in targets:
            ax.axhline(
                targets[family], ls=":", color="C3", lw=1.2, label=f"target {targets[family]:.2f} (v6e)"
            )
        ax.set_xticks(
            [i + width * (len(chips) - 1) / 2 for i in range(len(labels))],
            labels,
            rotation=35,
            ha="right",
            fontsize=8,
        )
        ax.set_title(family)
        ax.set_ylabel("cycles / dense Splash at its best blocks")
        ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def step_codes(plan, title: str, head: int = 0):
    """A lane-dense step plan (``stlib.kernels.tile_lane_dense.StepPlan``): left, the region each
    (q tile, kv tile) runs (not computed / FULL / RAGGED / MASKED / each pattern); right, the first
    pattern's sub-tiles (kv sub-tile x q sub-tile, FULL ones computed, the rest skipped)."""
    from stlib.kernels.tile_lane_dense import StepKind

    codes = np.asarray(plan.codes)[min(head, plan.codes.shape[0] - 1)]
    names = ["not computed", *(k.name for k in StepKind)] + [
        f"pattern {n}{' (padded keys)' if p.padded else ''}" for n, p in enumerate(plan.patterns)
    ]
    colors = ["#f2f2f2", KIND_COLORS[2], "#8fb3d9", KIND_COLORS[1], *PALETTE[2 : 2 + len(plan.patterns)]]
    panels = 2 if plan.patterns else 1
    fig, axes = plt.subplots(
        1, panels, figsize=(5.2 * panels + 1.5, 4.8), squeeze=False, constrained_layout=True
    )
    ax = axes[0][0]
    ax.imshow(codes + 1, cmap=ListedColormap(colors), vmin=0, vmax=len(colors) - 1, interpolation="nearest")
    present = [0, *(c + 1 for c in plan.present)]
    counts = {c: int((codes + 1 == c).sum()) for c in present}
    ax.legend(
        handles=[Patch(color=colors[c], label=f"{names[c]} ({counts[c]:,})") for c in present],
        fontsize=7,
        loc="upper right",
        framealpha=0.9,
    )
    ax.set(
        xlabel=f"kv tile ({plan.layout.block_kv} keys)",
        ylabel=f"q tile ({plan.layout.block_q} queries)",
        title="region of each step",
    )
    ax.grid(False)
    if plan.patterns:
        pattern = plan.patterns[0]
        rows = np.array(pattern.rows)
        ax = axes[0][1]
        ax.imshow(rows, cmap=ListedColormap(["#f2f2f2", PALETTE[2]]), vmin=0, vmax=1)
        for (c, r), on in np.ndenumerate(rows):
            ax.text(r, c, "run" if on else "skip", ha="center", va="center", fontsize=8)
        ax.set(
            xlabel=f"q sub-tile ({pattern.grain} queries: a lane slice)",
            ylabel=f"kv sub-tile ({pattern.grain} keys)",
            title=f"pattern 0: {pattern.sub_tiles} of {rows.size} sub-tiles computed, mask-free",
        )
        ax.set_xticks(range(rows.shape[1]))
        ax.set_yticks(range(rows.shape[0]))
        ax.grid(False)
    fig.suptitle(title, fontsize=10)
    return fig
