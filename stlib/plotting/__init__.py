"""Figures of the notebooks and benchmarks: one palette, labelled axes and units, backend and shape
in every title. Everything that depends on hardware is drawn from records (``stlib.bench``), so a
figure can be redrawn without the hardware. Interpret-mode times are labelled as such; static
estimates are hatched. Figures take plain data: no kernel is named here.

``common`` (palette, ``save``, ``where_measured``) · ``layouts`` (masks, tile layouts, step tables and
step plans) · ``timing`` (measured times and speed-ups) · ``work`` (hardware-independent work and
rooflines) · ``blocks`` (VMEM, tile-size trade-off, block sweep) · ``estimates`` (static estimates) ·
``quality`` (error vs work) · ``slices`` (per-device tables, a ring's blocks, communication beside the kernel). Every figure is re-exported here: ``plotting.X`` is the import path.
"""

from stlib.plotting.blocks import block_sweep, tile_size_tradeoff, vmem_bars
from stlib.plotting.common import ESTIMATE_HATCH, KIND_COLORS, PALETTE, save, where_measured
from stlib.plotting.estimates import estimate_speedups, estimate_vs_published, measured_vs_estimated
from stlib.plotting.layouts import (
    density_vs_work,
    forward_and_transposed_tables,
    kind_gallery,
    mask_gallery,
    occupancy_comparison,
    occupancy_heatmap,
    step_codes,
    step_table_map,
)
from stlib.plotting.quality import quality_vs_work
from stlib.plotting.slices import communication_vs_kernel, device_tables, ring_blocks
from stlib.plotting.timing import (
    latency_bars,
    named_bars,
    relative_bars,
    same_mask_bars,
    speedup_vs_density,
    timing_lines,
)
from stlib.plotting.work import cost_breakdown, roofline_chart, roofline_fraction, work_bars

__all__ = [
    "ESTIMATE_HATCH",
    "KIND_COLORS",
    "PALETTE",
    "block_sweep",
    "communication_vs_kernel",
    "cost_breakdown",
    "density_vs_work",
    "device_tables",
    "estimate_speedups",
    "estimate_vs_published",
    "forward_and_transposed_tables",
    "kind_gallery",
    "latency_bars",
    "mask_gallery",
    "measured_vs_estimated",
    "named_bars",
    "occupancy_comparison",
    "occupancy_heatmap",
    "quality_vs_work",
    "relative_bars",
    "ring_blocks",
    "roofline_chart",
    "roofline_fraction",
    "same_mask_bars",
    "save",
    "speedup_vs_density",
    "step_codes",
    "step_table_map",
    "tile_size_tradeoff",
    "timing_lines",
    "vmem_bars",
    "where_measured",
    "work_bars",
]
