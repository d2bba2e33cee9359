"""The built-in masks at the case-study grid, named: one place for benchmarks, notebooks and tests.
The sliding-tile geometry is the case study's own (``stlib.configs.CASE_STUDY.sta_tile`` and
``.sta_window``); every other pattern is raster order unless its name says otherwise.
"""

from __future__ import annotations

from stlib.configs import CASE_STUDY
from stlib.geometry import VideoGrid, tiled_order, token_major_order
from stlib.masks.base import Mask
from stlib.masks.sequence import band, band_width_for_density, full, per_head
from stlib.masks.video import (
    frame_causal,
    neighborhood,
    radial,
    sliding_tile,
    spatial,
    spatial_band,
    temporal,
    temporal_band,
)

#: The 3-D neighbourhood (NATTEN) kernel of the catalogue, cut to a smaller grid's odd sizes.
NEIGHBORHOOD_KERNEL = (7, 15, 15)


def case_study_masks(
    grid: VideoGrid = CASE_STUDY.grid,
    num_heads: int = CASE_STUDY.num_heads,
    *,
    sta_tile: tuple[int, int, int] = CASE_STUDY.sta_tile,
    sta_window: tuple[int, int, int] = CASE_STUDY.sta_window,
) -> dict[str, Mask]:
    """Every built-in pattern on ``grid``, by name (raster order unless the name says otherwise);
    ``sta_tile`` and ``sta_window``: the sliding-tile geometry (the case study's by default; another
    grid may need its own, e.g. ``stlib.SMALL_CPU.sta_tile``).

    >>> import stlib
    >>> masks = stlib.masks.case_study_masks()  # Wan 720p: 21 x 45 x 80 tokens
    >>> len(masks), masks["sliding tile, 3-D tiled order"]
    (13, sliding_tile((21, 45, 80), tile=(3, 8, 16), window=(3, 3, 3)).permute('tiled 3x8x16 (padded)'))
    """
    length = grid.num_tokens
    tile, window = sta_tile, sta_window
    kernel = tuple(min(k, n - 1 + n % 2) for k, n in zip(NEIGHBORHOOD_KERNEL, grid.shape))  # odd, fits
    svg_spatial = spatial_band(grid, 0.25, anchor=True)
    svg_temporal = temporal_band(grid, 0.25, anchor=True)
    sta = sliding_tile(grid, tile, window)
    return {
        "full": full(length),
        "band (density 0.25)": band(length, band_width_for_density(length, 0.25)),
        "spatial (frame window 1)": spatial(grid, 1),
        "temporal (spatial window 40)": temporal(grid, 40),
        "spatial band 0.25 + anchor": svg_spatial,
        "temporal band 0.25 + anchor": svg_temporal,
        # without the anchor: frame 0 is every T-th token in token-major order, so an anchor there
        # touches every kv tile (the anchor belongs in raster order or in a pass of its own)
        "temporal band 0.25, token-major": temporal_band(grid, 0.25).permute(token_major_order(grid)),
        f"neighborhood {_dims(kernel)}": neighborhood(grid, kernel),
        f"sliding tile {_dims(tile)}, window {_dims(window)}": sta,
        "sliding tile, 3-D tiled order": sta.permute(tiled_order(grid, tile)),
        "radial (window 1200)": radial(grid, 1200),
        "frame causal": frame_causal(grid),
        f"per-head SVG ({num_heads // 2} spatial, {num_heads - num_heads // 2} temporal)": per_head(
            [svg_spatial] * (num_heads // 2) + [svg_temporal] * (num_heads - num_heads // 2)
        ),
    }


def _dims(sizes: tuple[int, int, int]) -> str:
    """(3, 8, 16) -> "3x8x16"; (3, 3, 3) -> "3"."""
    return str(sizes[0]) if len(set(sizes)) == 1 else "x".join(map(str, sizes))
