"""stlib: sparse spatio-temporal attention for video diffusion transformers on TPUs."""

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
