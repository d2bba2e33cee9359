"""Figures of static estimates (hatched: estimates, not measurements): estimated speed-ups next to
their ideal bound, and estimates against published kernel times."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import seaborn as sns
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter

from stlib.plotting.common import ESTIMATE_HATCH, PALETTE


def estimate_speedups(rows: list[dict], title: str):
    """Static speed-up estimates (hatched: estimates, not measurements) next to each one's ideal
    bound 1 / density. ``rows``: ``{"label", "speedup", "ideal"}`` and optionally ``"own"``: the
    speed-up over the same kernel's own dense estimate, drawn as a second bar (what skipping buys that
    kernel; "speedup", over dense Splash, adds how much cheaper the kernel is than Splash on dense work)."""
    own = any("own" in r for r in rows)
    fig, ax = plt.subplots(
        figsize=(8.6, (0.62 if own else 0.45) * max(len(rows), 4) + 1.6), constrained_layout=True
    )
    y = np.arange(len(rows))
    height = 0.38 if own else 0.8
    series = [("speedup", "over dense Splash", PALETTE[0], -height / 2 if own else 0.0)]
    if own:
        series.append(("own", "over the same kernel's own dense estimate", PALETTE[1], height / 2))
    for key, name, color, shift in series:
        values = [r.get(key, 0.0) for r in rows]
        bars = ax.barh(
            y + shift,
            values,
            height=height,
            color="white",
            edgecolor=color,
            hatch=ESTIMATE_HATCH,
            label=f"static v6e estimate {name}",
        )
        for bar, row, value in zip(bars, rows, values):
            if key in row:
                ax.text(
                    max(value, row["ideal"]),
                    bar.get_y() + bar.get_height() / 2,
                    f"  {value:.2f}x",
                    va="center",
                    fontsize=7,
                    color=color,
                )
    ax.plot(
        [r["ideal"] for r in rows], y, "k|", markersize=18 if own else 16, mew=2, label="ideal 1 / density"
    )
    ax.axvline(1.0, color="grey", lw=0.8)
    ax.set_yticks(y, [r["label"] for r in rows])
    ax.invert_yaxis()
    ax.set_xlim(0, 1.25 * max(max(r["speedup"], r.get("own", 0.0), r["ideal"]) for r in rows))
    ax.set(xlabel="estimated speed-up", title=title)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2 if not own else 1)
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


def measured_vs_estimated(rows: list[dict], title: str):
    """Measured kernel times (x) against static estimates of the same calls (y), log-log: each
    candidate twice, as the estimate reads it (filled) and with every path charged its bundles alone
    (open), joined by a line; red where the run took far longer than its bundles (``slow``). The
    diagonal is a perfect prediction. ``rows``: ``stlib.bench.tpu_measure.sweep_rows``."""
    fig, ax = plt.subplots(figsize=(7.6, 6.2), constrained_layout=True)
    kinds = sorted({r["impl"] for r in rows})
    markers = dict(zip(kinds, "osD^v"))
    for r in rows:
        color = "tab:red" if r["slow"] else PALETTE[0]
        x = r["measured_ms"]
        ax.plot([x, x], [r["bundles_only_ms"], r["estimated_ms"]], color=color, linewidth=0.8, alpha=0.6)
        ax.scatter(x, r["estimated_ms"], marker=markers[r["impl"]], color=color, edgecolor="black", linewidth=0.5,
                   s=46, zorder=3)  # fmt: skip
        ax.scatter(x, r["bundles_only_ms"], marker=markers[r["impl"]], facecolor="white", edgecolor=color,
                   linewidth=1.2, s=46, zorder=3)  # fmt: skip
    values = [v for r in rows for v in (r["measured_ms"], r["estimated_ms"], r["bundles_only_ms"])] or [1, 10]
    lo, hi = min(values) / 1.4, max(values) * 1.4
    ax.plot([lo, hi], [lo, hi], color="0.3", linewidth=1)
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel="measured on the TPU (ms, median)",
           ylabel="static estimate (ms, not a measurement)", title=title)  # fmt: skip
    plain = FuncFormatter(lambda value, _: f"{value:g}")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(plain)
        axis.set_minor_formatter(plain)
    ax.tick_params(which="minor", labelsize=7)
    handles = [
        plt.Line2D([], [], marker=markers[k], linestyle="", color="0.4", markeredgecolor="black", label=k)
        for k in kinds
    ] + [
        plt.Line2D([], [], marker="o", linestyle="", color=PALETTE[0], markeredgecolor="black",
                   label="estimate (paths charged their MXU feed)"),
        plt.Line2D([], [], marker="o", linestyle="", markerfacecolor="white", markeredgecolor=PALETTE[0],
                   label="every path charged its bundles alone"),
        plt.Line2D([], [], marker="o", linestyle="", color="tab:red", markeredgecolor="black",
                   label="ran far slower than its bundles (a program past 65,536 bundles)"),
    ]  # fmt: skip
    ax.legend(handles=handles, fontsize=8, loc="upper left")
    return fig
