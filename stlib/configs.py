"""Named workloads: imported everywhere, never retyped."""

from __future__ import annotations

from dataclasses import dataclass

import jax.numpy as jnp

from stlib.geometry import VideoGrid


@dataclass(frozen=True)
class Workload:
    name: str
    grid: VideoGrid
    num_heads: int
    head_dim: int
    dtype: object = jnp.bfloat16
    #: sliding tile attention on this grid: 3-D token tiles (T, Y, X) and the window in tiles
    sta_tile: tuple[int, int, int] = (3, 8, 16)
    sta_window: tuple[int, int, int] = (3, 3, 3)

    @property
    def num_tokens(self) -> int:
        return self.grid.num_tokens

    @property
    def qkv_shape(self) -> tuple[int, int, int]:
        return (self.num_heads, self.num_tokens, self.head_dim)

    def dense_flops(self) -> float:
        """4 * L^2 * D * H: QK^T and PV, two flops per multiply-add."""
        return 4.0 * self.num_tokens**2 * self.head_dim * self.num_heads


#: The published case study: Wan 2.1 720p, 10 heads per chip, one TPU v6e.
CASE_STUDY = Workload("case-study (Wan 720p)", VideoGrid(21, 45, 80), num_heads=10, head_dim=128)
#: Wan at 480p.
WAN_480P = Workload("Wan 480p", VideoGrid(21, 30, 52), num_heads=10, head_dim=128)
#: The CPU stand-in for the case study: small enough for Pallas interpret mode (1,152 tokens, 2 heads),
#: with 3-D tiles of 1x8x16 = 128 tokens that fit the grid exactly.
SMALL_CPU = Workload(
    "small (CPU, interpret mode)",
    VideoGrid(3, 8, 48),
    num_heads=2,
    head_dim=128,
    dtype=jnp.float32,
    sta_tile=(1, 8, 16),
)

#: Band densities that every benchmark sweep and estimate table uses.
DENSITIES = (0.15, 0.25, 0.35, 0.45, 0.55, 0.65)

#: Published timings of the case study (one TPU v6e, kernel time only).
PUBLISHED = {
    "source": 'Google for Developers blog, 2026-09-30, "Accelerating Spatio-Temporal Attention for '
    'Video Diffusion on TPUs"',
    "dense_splash_ms": 78.70,
    "tile_aligned_sparse_ms": 32.76,
}


def wan_latent_grid(
    frames: int, height: int, width: int, *, temporal_stride: int = 4, vae_stride: int = 8, patch: int = 2
) -> VideoGrid:
    """The token grid Wan 2.x attends over for a video of ``frames`` x ``height`` x ``width`` pixels:
    the causal VAE keeps frame 0 and compresses the rest 4x in time and 8x in space, then 2x2
    patchification. 81 frames at 720 x 1280 -> 21 x 45 x 80 = 75,600 tokens."""
    return VideoGrid(
        (frames - 1) // temporal_stride + 1, height // vae_stride // patch, width // vae_stride // patch
    )


@dataclass(frozen=True)
class DiTBlock:
    """One diffusion-transformer block of width ``model_dim`` (Wan 14B: 5120, 40 heads, FFN 13,824,
    40 blocks, text context of 512 tokens)."""

    model_dim: int = 5120
    num_heads: int = 40
    ffn_dim: int = 13824
    text_tokens: int = 512

    def flops(self, num_tokens: int) -> dict[str, float]:
        """Forward flops per block (2 per multiply-add) by part."""
        L, d = num_tokens, self.model_dim
        return {
            "self-attention (QK^T and PV)": 4.0 * L * L * d,
            "QKV and output projections": 8.0 * L * d * d,
            "cross-attention to text": 4.0 * L * d * d
            + 4.0 * self.text_tokens * d * d
            + 4.0 * L * self.text_tokens * d,
            "feed-forward": 4.0 * L * d * self.ffn_dim,
        }


WAN_14B = DiTBlock()
