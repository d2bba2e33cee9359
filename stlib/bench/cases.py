"""The case-study cases: which kernel runs which mask at which block sizes, the call each case
times, its inputs, its hardware-independent work and its static TPU estimates."""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass

import jax.numpy as jnp
import numpy as np

import stlib
import stlib.kernels  # registers the Pallas kernels with stlib.attention
from stlib import masks, registry
from stlib._intmath import cdiv
from stlib.configs import DENSITIES, Workload
from stlib.geometry import VideoGrid, tile_rows, tiled_order
from stlib.registry import Role, by_role
from stlib.roofline import work_summary


@dataclass(frozen=True)
class Case:
    """One kernel configuration of the case-study comparison."""

    impl: str
    pattern: str  # "dense", "band" or "sliding tile"
    mask: object  # stlib mask in the order the kernel sees
    label: str
    block_q: int | None = None
    block_kv: int | None = None
    options: dict = dataclasses.field(default_factory=dict)
    order: object = None  # TokenOrder applied outside the kernel (excluded from kernel time) ...
    grid: object = None  # ... or, with a grid, inside the timed call: video_attention on raster inputs

    @property
    def reorders_in_timing(self) -> bool:
        return self.grid is not None

    def record_fields(self) -> dict:
        """What every record of this case names: kernel, label, pattern, mask, blocks, options."""
        return {
            "impl": self.impl,
            "label": self.label,
            "pattern": self.pattern,
            "mask": repr(self.mask),
            "block_q": self.block_q,
            "block_kv": self.block_kv,
            "options": self.options,
        }

    @property
    def kernel_mask(self):
        """The mask in the order the kernel sees."""
        return self.mask.permute(self.order) if self.reorders_in_timing else self.mask


def sta_windows(grid: VideoGrid, tile) -> list[tuple[int, int, int]]:
    """Odd tile windows from the smallest to the whole grid (one per distinct size)."""
    counts = [cdiv(n, s) for n, s in zip(grid.shape, tile)]
    options = []
    for w in range(1, max(counts) + 1, 2):
        window = tuple(min(w, c if c % 2 else c - 1) for c in counts)
        if window not in options:
            options.append(window)
    return options


def workload_sta_window(workload: Workload) -> tuple[int, int, int]:
    """The sliding-tile window of ``workload``: its ``sta_window`` where that is short of the whole grid
    of its ``sta_tile``s, else the widest of ``sta_windows`` within it that is (a small grid has few
    tiles); (1, 1, 1) where none is."""
    counts = [cdiv(n, s) for n, s in zip(workload.grid.shape, workload.sta_tile)]
    windows = [
        w
        for w in sta_windows(workload.grid, workload.sta_tile)
        if all(a <= b for a, b in zip(w, workload.sta_window)) and any(a < c for a, c in zip(w, counts))
    ]
    return windows[-1] if windows else (1, 1, 1)


def case_study_cases(workload: Workload, tpu: bool, densities=DENSITIES) -> list[Case]:
    """Every case of the comparison at ``workload``: dense, a band per density, and the sliding-tile
    pattern (the workload's ``sta_tile``) at each window short of the whole grid. ``tpu`` picks the
    block sizes (512 x 1024 on a TPU, 128 x 128 elsewhere)."""
    grid, length, sta_tile = workload.grid, workload.num_tokens, workload.sta_tile
    big = {"block_q": 512, "block_kv": 1024} if tpu else {"block_q": 128, "block_kv": 128}
    tile_bq = tile_bkv = int(np.prod(sta_tile))
    baseline = registry.baseline()
    dense, block_sparse = by_role(Role.DENSE).name, by_role(Role.BLOCK_SPARSE).name
    tile, best_tile = by_role(Role.TILE).name, by_role(Role.BEST_TILE).name
    cases = [
        Case(baseline.name, "dense", masks.full(length), f"{baseline.title} (dense)", **big),
        Case(dense, "dense", masks.full(length), f"{dense} (dense)", **big),
        Case(tile, "dense", masks.full(length), f"{tile} (dense)", **big),
    ]
    for density in densities:
        band = masks.band(length, masks.band_width_for_density(length, density))
        cases += [
            Case(impl.name, "band", band, label, **big, options=options)
            for impl in registry.tpu_kernels()
            for label, options in impl.comparison_runs()
        ]
    order = tiled_order(grid, sta_tile)
    counts = [cdiv(n, s) for n, s in zip(grid.shape, sta_tile)]
    for window in sta_windows(grid, sta_tile):
        if all(w >= c for w, c in zip(window, counts)):
            continue  # the whole grid: that is the dense case
        sta = masks.sliding_tile(grid, sta_tile, window)
        cases += [
            Case(block_sparse, "sliding tile", sta, f"{block_sparse} (raster)", **big),
            # Splash on the same mask in the same order, at its own blocks (one 3-D tile a block where
            # a tile is a multiple of 128 tokens: splash_blocks), from stlib's block layout
            Case(
                baseline.name,
                "sliding tile",
                sta.permute(order),
                f"{baseline.title} (3-D tiled)",
                order=order,
            ),
            Case(
                tile,
                "sliding tile",
                sta.permute(order),
                f"{tile} (3-D tiled)",
                block_q=tile_bq,
                block_kv=tile_bkv,
                order=order,
            ),
            Case(
                tile,
                "sliding tile",
                sta,
                f"{tile} (3-D tiled) + reordering",
                block_q=tile_bq,
                block_kv=tile_bkv,
                order=order,
                grid=grid,
            ),
        ]
        rows = _tiled_rows_config(sta.permute(order))  # a row of 3-D tiles per block: pattern steps
        if rows is not None:
            cases.append(
                Case(
                    best_tile,
                    "sliding tile",
                    sta.permute(order),
                    f"{best_tile} (rows of 3-D tiles)",
                    block_q=rows.block_q,
                    block_kv=rows.block_kv,
                    order=order,
                )
            )
    return cases


def focus_cases(workload: Workload, tpu: bool, density: float = 0.35) -> list[Case]:
    """The cases of ``case_study_cases`` the case-study table is about, one kernel each (notebook 08
    compiles, checks and times them at the full size on a TPU): dense Splash and the tile kernel
    without a mask; on the band built for ``density``, Splash, the block-sparse kernel, the tile
    kernel (flat grid) and the best tile kernel; on the sliding-tile pattern at the workload's window
    (``workload_sta_window``), every case: the
    block-sparse kernel in raster order, Splash and the tile kernels in 3-D tiled order (Splash on
    the same mask, from stlib's block layout)."""
    baseline, block_sparse = registry.baseline().name, by_role(Role.BLOCK_SPARSE).name
    tile, best_tile = by_role(Role.TILE).name, by_role(Role.BEST_TILE).name
    kept = {
        "dense": {(baseline, "{}"), (tile, "{}")},
        "band": {(baseline, "{}"), (block_sparse, "{}"), (tile, '{"form": "flat"}'), (best_tile, "{}")},
    }
    grid, sta_tile = workload.grid, workload.sta_tile
    sta = masks.sliding_tile(grid, sta_tile, workload_sta_window(workload))
    sta_masks = {sta, sta.permute(tiled_order(grid, sta_tile))}

    def wanted(case: Case) -> bool:
        if case.pattern == "sliding tile":
            return case.mask in sta_masks
        return (case.impl, json.dumps(case.options, sort_keys=True)) in kept[case.pattern]

    return [case for case in case_study_cases(workload, tpu, densities=(density,)) if wanted(case)]


def _tiled_rows_config(mask):
    """The best tile kernel's v6e config for ``mask`` in a padded 3-D tiled order when its blocks are
    whole rows of 3-D tiles (what its own rule picks for such an order), else None."""
    rows = tile_rows(mask.order) if getattr(mask, "order", None) is not None else None
    if rows is None:
        return None
    config = by_role(Role.BEST_TILE).config(mask, mask.length, options={"chip": "v6e"}, interpret=False)
    row = rows[0] * rows[1]
    return config if config.block_q % row == 0 and config.block_kv % row == 0 else None


def case_function(case: Case, scale: float, interpret: bool):
    """The call a case times: (q, k, v) -> o, in the order ``case_inputs`` gives."""
    if case.reorders_in_timing:
        return functools.partial(
            stlib.video_attention,
            grid=case.grid,
            mask=case.mask,
            impl=case.impl,
            orders=case.order,
            scale=scale,
            block_q=case.block_q,
            block_kv=case.block_kv,
            options=case.options or None,
            interpret=interpret,
        )
    return functools.partial(
        stlib.attention,
        mask=case.mask,
        impl=case.impl,
        scale=scale,
        block_q=case.block_q,
        block_kv=case.block_kv,
        options=case.options or None,
        interpret=interpret,
    )


def case_inputs(case: Case, q, k, v):
    """Raster-order q, k, v as the case's call takes them (permuted when the order is applied
    outside the timed call)."""
    if case.order is None or case.reorders_in_timing:
        return q, k, v
    return tuple(case.order.apply(x) for x in (q, k, v))


def case_work(case: Case, workload: Workload) -> dict:
    """Hardware-independent work of ``case`` at ``workload`` (``stlib.roofline.work_summary``), at the
    blocks its call resolves compiled for a TPU (a case without blocks: the kernel's own, e.g.
    Splash's one 3-D tile a block on a padded 3-D tiled order); 128 x 128 for a kernel without blocks."""
    mask = case.kernel_mask
    config = registry.get(case.impl).config(
        mask, mask.length, case.block_q, case.block_kv, case.options or None, interpret=False
    )
    layout = stlib.block_layout(mask, config.block_q or 128, config.block_kv or 128)
    return work_summary(
        case.impl,
        layout,
        workload.num_heads,
        workload.head_dim,
        jnp.dtype(workload.dtype).itemsize,
        case.options or None,
    )


def estimate_fields(case: Case) -> dict:
    """Static v6e and v5e time estimates of a Pallas / Splash case at the full case-study shape
    (``stlib.estimate``; labelled as estimates, with method, clock and libtpu version), or the
    reason there is none."""
    from stlib import estimate
    from stlib.analysis.clock import ESTIMATE_CHIPS

    out = {}
    mask = "full" if case.pattern == "dense" else case.kernel_mask
    for chip in ESTIMATE_CHIPS:
        try:
            record = estimate.estimate(
                case.impl,
                mask,
                chip,
                block_q=case.block_q,
                block_kv=case.block_kv,
                options=case.options or None,
            ).as_record()
        except Exception as error:  # noqa: BLE001 - recorded, never silently replaced by a number
            out[f"estimate_{chip}_error"] = f"{type(error).__name__}: {error}"[:500]
            continue
        record.pop("estimate_breakdown", None)
        out.update({key.replace("estimate_", f"estimate_{chip}_", 1): value for key, value in record.items()})
    return out
