"""Figures of masks and their tile layouts: occupancy heatmaps, mask and tile-kind galleries, density
against tile occupancy, and the step tables and step plans the block-sparse kernels run."""

from __future__ import annotations

import dataclasses

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from stlib._intmath import cdiv
from stlib.layout import BlockLayout, TileKind
from stlib.plotting.common import KIND_COLORS, PALETTE


def _one_head(layout: BlockLayout, head: int) -> BlockLayout:
    """``layout`` cut to ``head`` (its counts, kinds and summary numbers), for a figure that draws
    one head of several."""
    if layout.num_heads == 1:
        return layout
    return dataclasses.replace(layout, counts=layout.counts[head : head + 1])


def occupancy_heatmap(layout: BlockLayout, title: str, head: int = 0, ax_pair=None):
    """Tile kinds (EMPTY / PARTIAL / FULL) and the allowed fraction of each tile, side by side, of
    ``head``: the map, the legend's counts and the numbers in the title are that head's. The legend
    sits under the tile map, clear of it."""
    layout, head = _one_head(layout, head), 0
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
        loc="upper center",
        bbox_to_anchor=(0.5, -0.13),
        ncol=3,
        fontsize=7,
        frameon=False,
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


def occupancy_comparison(layouts: dict, title: str, head: int = 0):
    """``occupancy_heatmap`` of several layouts (e.g. one mask before and after reordering), one row each."""
    fig, axes = plt.subplots(
        len(layouts), 2, figsize=(10.5, 4.2 * len(layouts)), constrained_layout=True, squeeze=False
    )
    for row, (name, layout) in zip(axes, layouts.items()):
        layout = _one_head(layout, head)
        occupancy_heatmap(layout, name, ax_pair=row)
        row[0].set_title(f"{name}: tile kind", fontsize=9)
        padded = layout.length > layout.num_tokens  # occupancy counts tiles of padded positions too
        over_positions = layout.allowed_pairs / (layout.num_heads * float(layout.length) ** 2)
        row[1].set_title(  # two lines: one would run into the left panel's title
            f"density {layout.density:.3f}"
            + (
                f" of {layout.num_tokens:,} tokens ({over_positions:.3f} of {layout.length:,} positions)"
                if padded
                else ""
            )
            + f"\noccupied {layout.occupancy:.3f}, "
            f"partial {layout.partial_fraction:.0%} of occupied, work efficiency "
            f"{layout.work_efficiency:.2f}",
            fontsize=8,
        )
    fig.suptitle(title, fontsize=11)
    return fig


def _grid(count: int, columns: int, cell: tuple[float, float]):
    """A figure of ``count`` panels in rows of ``columns``, each ``cell`` inches (width, height)."""
    rows = cdiv(count, columns)
    return plt.subplots(
        rows, columns, figsize=(cell[0] * columns, cell[1] * rows), constrained_layout=True, squeeze=False
    )


def mask_gallery(named_masks: dict, title: str, columns: int = 4, head: int = 0):
    """Each (small) mask as a black-and-white L x L image: row = query, column = key."""
    fig, axes = _grid(len(named_masks), columns, (3.0, 3.1))
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
    fig, axes = _grid(len(named_layouts), columns, (3.2, 3.4))
    for ax, (name, layout) in zip(axes.flat, named_layouts.items()):
        layout = _one_head(layout, head)  # the map, its counts and its numbers: one head's
        ax.imshow(
            layout.kinds[0],
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


def step_codes(plan, title: str, head: int = 0):
    """A lane-dense step plan (``stlib.kernels.tile_lane_dense.StepPlan``): left, the region each
    (q tile, kv tile) runs (not computed / FULL / RAGGED / MASKED / each pattern); right, the first
    pattern's sub-tiles (kv sub-tile x q sub-tile, FULL ones computed, the rest skipped)."""
    codes = np.asarray(plan.codes)[min(head, plan.codes.shape[0] - 1)]
    names = ["not computed", *(k.name for k in plan.step_kinds)] + [
        f"pattern {n}{' (padded keys)' if p.padded else ''}" for n, p in enumerate(plan.patterns)
    ]
    colors = ["#f2f2f2", KIND_COLORS[2], "#8fb3d9", KIND_COLORS[1], *PALETTE[2 : 2 + len(plan.patterns)]]
    panels = 2 if plan.patterns else 1
    height = 5.2 * codes.shape[0] / max(codes.shape[1], 1)  # the image's own aspect, no band of white
    fig, axes = plt.subplots(
        1, panels, figsize=(5.2 * panels + 1.5, min(max(height, 3.0), 4.8) + 1.0), squeeze=False,
        constrained_layout=True,
    )  # fmt: skip
    ax = axes[0][0]
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # tiles are whole: no tick at 2.5
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
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


def forward_and_transposed_tables(selected: np.ndarray, title: str, head: int = 0):
    """The tiles one pass computes (bool [Hl, nq, nk]) as the forward walks them (per q tile, its
    kv tiles) and as the backward's dk / dv kernel walks them (per kv tile, its q tiles: the
    transpose), each row's count beside it."""
    forward = selected[head].astype(int)
    fig, axes = plt.subplots(1, 2, figsize=(11.5, 4.6), constrained_layout=True)
    panels = (
        (axes[0], forward, "forward / dq: per q tile, its kv tiles", "kv tile", "q tile"),
        (axes[1], forward.T, "dk / dv: per kv tile, its q tiles (transposed)", "q tile", "kv tile"),
    )
    for ax, table, name, xlabel, ylabel in panels:
        ax.imshow(
            table,
            cmap=ListedColormap([KIND_COLORS[0], KIND_COLORS[2]]),
            vmin=0,
            vmax=1,
            interpolation="nearest",
            aspect="auto",
        )
        counts = table.sum(axis=1)
        for r, count in enumerate(counts):
            ax.text(table.shape[1] - 0.5 + 0.3, r, str(count), va="center", fontsize=7, clip_on=False)
        ax.set(
            title=f"{name}\nwidest row {counts.max()} of {table.shape[1]}, empty rows {int((counts == 0).sum())}",
            xlabel=xlabel,
            ylabel=ylabel,
        )
        ax.grid(False)
    fig.suptitle(title, fontsize=10)
    return fig
