"""Figures of attention over a slice: which tile table each device runs, which (q shard, kv shard)
blocks a ring computes and which hops it skips, and what the all-to-alls and a ring's permutes cost
beside the kernel (a model over static estimates, never a measurement)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.patches import Patch

from stlib.layout import TileKind
from stlib.plotting.common import KIND_COLORS, PALETTE


def device_tables(device_layouts: list, title: str):
    """Tile kinds of every head each device runs: ``device_layouts[d]`` is the BlockLayout of device
    d's head slice (its heads [Hd, nq, nk]); one row per device, one panel per head."""
    rows, cols = len(device_layouts), max(layout.kinds.shape[0] for layout in device_layouts)
    fig, axes = plt.subplots(rows, cols, figsize=(2.1 * cols + 0.6, 1.9 * rows + 0.8), squeeze=False)
    cmap = ListedColormap(KIND_COLORS)
    for d, (row, layout) in enumerate(zip(axes, device_layouts)):
        for h, ax in enumerate(row):
            ax.grid(False)
            ax.set(xticks=[], yticks=[])
            if h >= layout.kinds.shape[0]:
                ax.axis("off")
                continue
            ax.imshow(layout.kinds[h], cmap=cmap, vmin=0, vmax=2, interpolation="nearest", aspect="auto")
            ax.set_title(f"device {d}, local head {h}", fontsize=8)
        row[0].set_ylabel("q tile")
    for ax in axes[-1]:
        ax.set_xlabel("kv tile")
    handles = [Patch(color=KIND_COLORS[k], label=k.name) for k in TileKind]
    fig.legend(handles=handles, loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return fig


def _traffic_kind(row: dict) -> str:
    if row.get("all-to-alls") and row.get("permutes"):
        return "all-to-alls + ring permutes"
    return "all-to-alls" if row.get("all-to-alls") else "ring permutes"


#: Line style of a case's (modelled) traffic by its kind (the kernel's line is solid, one per slice).
_TRAFFIC_STYLES = {
    "all-to-alls": "--",
    "ring permutes": ":",
    "all-to-alls + ring permutes": "-.",
}


def communication_vs_kernel(rows: list[dict], title: str):
    """Per forward case of ``stlib.bench.slice_traffic.table`` with traffic (Ulysses' all-to-alls, a
    ring's permutes), one panel per sequence length (``tokens``): the kernel's estimated time per device
    against density, one solid line per slice (through its band 0.25 and dense estimates: every
    strategy of a slice runs the same work per device), and each case's modelled traffic time as a
    horizontal line styled by its kind, with the density where they meet marked (x) where they do
    and written in the case's legend entry (the legend below the panels), beside the part of its
    ring permutes the model charges as exposed where there is one."""
    cases = [
        r
        for r in rows
        if (r.get("all-to-alls") or r.get("permutes"))
        and r.get("kernel ms, dense (est.)") is not None
        and r.get("call", "forward") == "forward"
    ]
    lengths = sorted({r["tokens"] for r in cases})
    slices = list(dict.fromkeys(r["slice"] for r in cases))
    color_of = {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(slices)}
    panels = max(len(lengths), 1)
    fig, axes = plt.subplots(1, panels, figsize=(6.4 * panels, 5.6), squeeze=False, constrained_layout=True)
    density = np.linspace(0.0, 1.0, 201)
    for ax, length in zip(axes[0], lengths):
        here = [r for r in cases if r["tokens"] == length]
        drawn = set()
        for r in here:
            slice_name = r["slice"]
            color = color_of[slice_name]
            band, dense = r["kernel ms, band 0.25 (est.)"], r["kernel ms, dense (est.)"]
            if slice_name not in drawn:
                drawn.add(slice_name)
                kernel = band + (density - 0.25) * (dense - band) / 0.75
                ax.plot(density, kernel, color=color, lw=1.8, label=f"{slice_name}: kernel per device (est.)")
                ax.plot([0.25, 1.0], [band, dense], "o", color=color, ms=4)
            kind = _traffic_kind(r)
            crossing = r.get("density where traffic = kernel")
            meets = isinstance(crossing, float) and 0 <= crossing <= 1
            exposed = r.get("of the permutes exposed ms (model)")  # no kernel before the first shard lands
            ax.axhline(
                r["traffic ms (model)"],
                color=color,
                ls=_TRAFFIC_STYLES[kind],
                lw=1.3,
                label=f"{slice_name} {r['strategy']}: {kind}"
                + (f" ({exposed:.2f} ms exposed)" if exposed else "")
                + (f", x at d = {crossing:.3f}" if meets else ""),
            )
            if meets:  # the density in the legend: labels at the points crowd where the curves start
                ax.plot([crossing], [r["traffic ms (model)"]], "x", color=color, ms=8, mew=2)
        ax.set_yscale("log")  # the traffic sits an order of magnitude below the kernel: a log axis shows both
        ax.set(
            xlabel="attention density (fraction of pairs)",
            ylabel="ms per call per device (log)",
            xlim=(0, 1),
            title=f"{length:,} tokens",
        )
        ax.legend(fontsize=6.5, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, frameon=False)
    fig.suptitle(title, fontsize=10)
    return fig


__all__ = ["communication_vs_kernel", "device_tables"]


def ring_blocks(panels: dict, title: str):
    """One panel per mask: ``panels[name] = (attended, offsets)``, ``attended`` bool [N, N] (device
    d's queries attend device j's kv shard: ``stlib.ring.ring_blocks``) and the issued hop offsets.
    A computed block is coloured by its hop ((d - j) mod N), a skipped one left pale; the title
    names the hops issued and skipped."""
    fig, axes = plt.subplots(1, len(panels), figsize=(3.1 * len(panels) + 0.4, 3.6), squeeze=False)
    for ax, (name, (attended, offsets)) in zip(axes[0], panels.items()):
        n = attended.shape[0]
        hop = (np.arange(n)[:, None] - np.arange(n)[None, :]) % n
        ax.grid(False)
        ax.imshow(
            np.where(attended, hop, np.nan),
            cmap=ListedColormap([PALETTE[h % len(PALETTE)] for h in range(n)]),
            vmin=-0.5,
            vmax=n - 0.5,
        )
        ax.imshow(np.where(attended, np.nan, 0.0), cmap=ListedColormap(["#eeeeee"]), vmin=0, vmax=1)
        for d in range(n):
            for j in range(n):
                ax.text(
                    j,
                    d,
                    f"hop {hop[d, j]}" if attended[d, j] else "skip",
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="white" if attended[d, j] else "#888888",
                )
        skipped = [h for h in range(n) if h not in offsets]
        ax.set_title(f"{name}\nhops issued {list(offsets)}, skipped {skipped}", fontsize=8)
        ax.set(xticks=range(n), yticks=range(n), xlabel="kv shard (device)", ylabel="q shard (device)")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig
