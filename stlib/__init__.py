"""stlib: sparse spatio-temporal attention for video diffusion transformers on TPUs."""

from stlib import masks
from stlib.api import IMPLEMENTATIONS, attention, random_qkv, register, video_attention
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

__all__ = [
    "masks",
    "attention",
    "video_attention",
    "register",
    "random_qkv",
    "IMPLEMENTATIONS",
    "VideoGrid",
    "TokenOrder",
    "raster_order",
    "token_major_order",
    "tiled_order",
    "pad_tokens",
    "padded_length",
    "block_layout",
    "BlockLayout",
    "TileKind",
    "Workload",
    "CASE_STUDY",
    "WAN_480P",
    "SMALL_CPU",
]
