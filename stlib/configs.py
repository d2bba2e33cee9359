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
#: A shape small enough for Pallas interpret mode on a CPU (ragged: 1,440 tokens, not a multiple of 128).
SMALL_CPU = Workload("small CPU", VideoGrid(5, 12, 24), num_heads=2, head_dim=128, dtype=jnp.float32)

#: Published timings of the case study (one TPU v6e, kernel time only).
PUBLISHED = {
    "source": 'Google for Developers blog, 2026-09-30, "Accelerating Spatio-Temporal Attention for '
    'Video Diffusion on TPUs"',
    "dense_splash_ms": 78.70,
    "tile_aligned_sparse_ms": 32.76,
}
