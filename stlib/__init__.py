"""stlib: sparse spatio-temporal attention for video diffusion transformers on TPUs.

The public entry points (README.md has a quickstart, docs/architecture.md the module map):

- ``attention(q, k, v, mask, impl=...)``: attention over [H, L, D] under a lazy mask, by any
  implementation in ``IMPLEMENTATIONS``; ``impl="auto"`` runs what ``choose(mask)`` picks.
- ``video_attention(q, k, v, grid, mask)``: the same on raster-order video tokens, reordered so the
  mask is tile-aligned and restored after.
- ``attention_fn(mask, ...)``: flax's ``attention_fn`` contract; ``parallel_attention(..., mesh=...)``:
  attention sharded over a device mesh (heads, Ulysses, ring).
- ``masks``: the sequence and video masks; ``block_layout``, ``BlockLayout``, ``TileKind``: which
  tiles a mask leaves EMPTY, PARTIAL or FULL.
- ``VideoGrid``, ``TokenOrder``, ``raster_order``, ``token_major_order``, ``tiled_order``,
  ``pad_tokens``, ``padded_length``: video grids and token orders.
- ``Workload``, ``CASE_STUDY``, ``WAN_480P``, ``SMALL_CPU``: the named workloads; ``random_qkv``: inputs.
- ``register``: add an implementation; ``kernels``: importing it registers stlib's own.
- ``static_estimate(impl, mask, chip, ...)``: the static TPU time estimate, read from the compiled
  schedule without a TPU (loads ``stlib.analysis`` on first use).
"""

from stlib import _versions

_versions.check_jax(_versions.installed_jax())  # before any jax import: an older jax is one sentence

from stlib import kernels, masks  # importing kernels registers pallas_dense, _block_sparse, _tile, splash
from stlib.api import IMPLEMENTATIONS, attention, choose, random_qkv, register, video_attention
from stlib.configs import CASE_STUDY, SMALL_CPU, WAN_480P, Workload
from stlib.geometry import (
    TokenOrder,
    VideoGrid,
    pad_tokens,
    padded_length,
    raster_order,
    tiled_order,
    token_major_order,
)
from stlib.layout import BlockLayout, TileKind, block_layout
from stlib.model_attention import attention_fn
from stlib.parallel import parallel_attention
from stlib.support import support_table as _support_table

attention.__doc__ += (
    "\n    What each implementation supports (``stlib.support.support_table``):\n\n"
    + "\n".join("    " + line for line in _support_table().splitlines())
)

__all__ = [
    "CASE_STUDY",
    "IMPLEMENTATIONS",
    "SMALL_CPU",
    "WAN_480P",
    "BlockLayout",
    "TileKind",
    "TokenOrder",
    "VideoGrid",
    "Workload",
    "attention",
    "attention_fn",
    "block_layout",
    "choose",
    "kernels",
    "masks",
    "pad_tokens",
    "padded_length",
    "parallel_attention",
    "random_qkv",
    "raster_order",
    "register",
    "static_estimate",
    "tiled_order",
    "token_major_order",
    "video_attention",
]


def __getattr__(name: str):
    """``stlib.static_estimate`` loads the estimator (``stlib.analysis``) on first use only."""
    if name == "static_estimate":
        from stlib.analysis.static import static_estimate

        return static_estimate
    raise AttributeError(f"module 'stlib' has no attribute {name!r}")
