"""A Wan-style video transformer block in flax nnx, its self-attention through ``stlib.attention_fn``.

The block follows Wan 2.x's ``WanAttentionBlock``: adaptive-LayerNorm modulation from the timestep
embedding (six vectors: shift, scale and gate for self-attention and for the MLP), self-attention
over the video tokens (here sparse, through stlib), dense cross-attention to the text tokens, and a
GELU MLP, each added back to the residual stream. Built from flax's own modules
(``nnx.MultiHeadAttention``, ``nnx.LayerNorm``, ``nnx.Linear``). Left out: Wan's 3-D rotary position
embedding (``nnx.MultiHeadAttention`` has no hook for it) and its RMS q / k norm (flax's
``normalize_qk`` LayerNorm stands in).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from stlib.model_attention import attention_fn as stlib_attention_fn


class WanBlock(nnx.Module):
    """One block on video tokens x [B, L, dim], text tokens [B, Lt, dim] and a timestep embedding
    [B, 6, dim]. ``self_attention_fn``: the self-attention's ``attention_fn`` (for example
    ``stlib.attention_fn(mask, grid=grid)``; None: flax's dense attention); the cross-attention
    runs ``stlib.attention_fn()`` without a mask (dense, Lq != Lkv). ``dtype``: the computation
    dtype of every layer (flax's meaning; parameters stay float32) and of the block's output (None:
    float32, as the parameters)."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        ffn_dim: int,
        *,
        self_attention_fn=None,
        rngs: nnx.Rngs,
        eps: float = 1e-6,
        dtype=None,
    ):
        if dim % num_heads:
            raise ValueError(f"dim={dim} must be a multiple of num_heads={num_heads}")
        self.dtype = dtype
        attn = {"decode": False, "normalize_qk": True, "dtype": dtype, "rngs": rngs}
        norm = {"epsilon": eps, "dtype": dtype, "rngs": rngs}
        extra = {} if self_attention_fn is None else {"attention_fn": self_attention_fn}
        self.norm1 = nnx.LayerNorm(dim, use_scale=False, use_bias=False, **norm)
        self.self_attn = nnx.MultiHeadAttention(num_heads, dim, **attn, **extra)
        self.norm3 = nnx.LayerNorm(dim, **norm)
        self.cross_attn = nnx.MultiHeadAttention(num_heads, dim, attention_fn=stlib_attention_fn(), **attn)
        self.norm2 = nnx.LayerNorm(dim, use_scale=False, use_bias=False, **norm)
        self.ffn_in = nnx.Linear(dim, ffn_dim, dtype=dtype, rngs=rngs)
        self.ffn_out = nnx.Linear(ffn_dim, dim, dtype=dtype, rngs=rngs)
        self.modulation = nnx.Param(jax.random.normal(rngs.params(), (1, 6, dim)) / dim**0.5)

    def __call__(self, x, context, time_embedding):
        shift1, scale1, gate1, shift2, scale2, gate2 = jnp.split(
            self.modulation[...] + time_embedding, 6, axis=1
        )  # each [B, 1, dim]
        h = self.norm1(x) * (1 + scale1) + shift1
        x = x + self.self_attn(h) * gate1
        x = x + self.cross_attn(self.norm3(x), context)
        h = self.norm2(x) * (1 + scale2) + shift2
        out = x + self.ffn_out(jax.nn.gelu(self.ffn_in(h), approximate=True)) * gate2
        return out if self.dtype is None else out.astype(self.dtype)  # the f32 modulation promotes


__all__ = ["WanBlock"]
