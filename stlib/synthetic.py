"""Synthetic, video-like q, k, v whose attention is planted, per head, to concentrate in space or
in time. These inputs are SYNTHETIC: no model produced them. They exist because random normal
q / k / v give nearly uniform attention, on which every sparse pattern looks equally bad.

Construction of head h (positions p = (t, y, x) on the grid, head dim D):

* position part (3/4 of D, rotary style): M random 3-D frequency vectors w_j ~ N(0, diag(1/s^2)),
  features phi(p) = [cos(w_j . p), sin(w_j . p)] / sqrt(M), so phi(p) . phi(p') is the mean of
  cos(w_j . (p - p')): a stationary kernel equal to 1 at p = p' that approximates the Gaussian
  exp(-sum_a (p_a - p'_a)^2 / (2 s_a^2)) (random Fourier features of a Gaussian). Per-axis widths
  s = (s_t, s_y, s_x): a "spatial" head is sharp in t (same frame) and a few positions wide in y, x;
  a "temporal" head is sharp in y, x (same position) and wide in t. q and k carry the same features
  scaled by sqrt(beta_h * sqrt(D)), so the scaled score q.k / sqrt(D) is beta_h times the kernel:
  beta_h is the head's inverse temperature (drawn around ``TEMPERATURE``).
* content part (the remaining D / 4): a smooth random field over the grid (a few low random
  frequencies), the same for q and k plus independent noise, weighted so that it perturbs but does
  not dominate the position part.
* v: a smooth random field over the grid plus white noise, so an output depends on which keys a
  head attends to.
"""

from __future__ import annotations

import enum

import jax
import jax.numpy as jnp
import numpy as np

from stlib._checks import check_positive_int
from stlib.geometry import VideoGrid

#: Mean inverse temperature of the position kernel (the scaled score at p = p').
TEMPERATURE = 9.0


class HeadKind(enum.StrEnum):
    """Where a head's attention concentrates: the same frame (SPATIAL) or the same position (TEMPORAL)."""

    SPATIAL = "spatial"
    TEMPORAL = "temporal"


def head_kinds(kinds) -> tuple[HeadKind, ...]:
    """``kinds`` (a sequence of HeadKind or their names) as a tuple of HeadKind; ValueError otherwise."""
    if isinstance(kinds, str):
        raise TypeError(f"kinds must be a sequence of head kinds, one per head, got the string {kinds!r}")
    out = []
    for h, kind in enumerate(kinds):
        try:
            out.append(HeadKind(kind))
        except ValueError:
            raise ValueError(f"kinds[{h}]={kind!r} must be one of {[k.value for k in HeadKind]}") from None
    if not out:
        raise ValueError("kinds must name at least one head")
    return tuple(out)


def kernel_widths(grid: VideoGrid, kind: HeadKind) -> tuple[float, float, float]:
    """Per-axis widths (s_t, s_y, s_x), in grid steps, of a head's position kernel."""
    if kind == HeadKind.SPATIAL:
        return 0.35, max(1.0, 0.3 * grid.height), max(1.0, 0.3 * grid.width)
    return float(grid.frames), 0.5, 0.5


def _smooth_field(key, coords, channels: int, scale, num_freqs: int = 8):
    """[L, channels] random field: a few random low frequencies (wavelength ~ ``scale`` per axis)."""
    kw, kp, ka = jax.random.split(key, 3)
    w = jax.random.normal(kw, (num_freqs, 3)) / jnp.asarray(scale)[None, :]  # [F, 3]
    phase = jax.random.uniform(kp, (num_freqs,), maxval=2 * jnp.pi)
    amp = jax.random.normal(ka, (num_freqs, channels)) / jnp.sqrt(num_freqs)
    return jnp.cos(coords @ w.T + phase) @ amp * jnp.sqrt(2.0)  # [L, channels], unit variance


def video_qkv(grid: VideoGrid, kinds, head_dim: int, *, seed: int = 0, dtype=jnp.float32):
    """Synthetic q, k, v [H, L, D] (H = len(kinds), L = grid.num_tokens, D = head_dim) in raster
    order, head h planted as ``kinds[h]`` ("spatial": attention stays in the query's frame, near its
    position; "temporal": at the query's position, in nearby frames). Seeded (``jax.random.key``);
    see the module docstring for the construction. Raises TypeError / ValueError for a bad grid,
    kind or head_dim (at least 8)."""
    if not isinstance(grid, VideoGrid):
        raise TypeError(f"grid must be a stlib.VideoGrid, got {type(grid).__name__}")
    kinds = head_kinds(kinds)
    check_positive_int("head_dim", head_dim)
    if head_dim < 8:
        raise ValueError(f"{head_dim=} must be at least 8")
    t, y, x = np.meshgrid(*(np.arange(n) for n in grid.shape), indexing="ij")
    coords = jnp.asarray(np.stack([t, y, x], axis=-1).reshape(-1, 3), jnp.float32)  # [L, 3]
    num_freqs = (3 * head_dim // 4) // 2  # M frequency vectors -> 2M position dims
    content = head_dim - 2 * num_freqs
    field_scale = jnp.asarray([max(1.0, n / 4) for n in grid.shape], jnp.float32)
    root = jax.random.key(seed)
    qs, ks, vs = [], [], []
    for h, kind in enumerate(kinds):
        kf, kb, kc, kn1, kn2, kv, kvn = jax.random.split(jax.random.fold_in(root, h), 7)
        widths = jnp.asarray(kernel_widths(grid, kind), jnp.float32)
        w = jax.random.normal(kf, (num_freqs, 3)) / widths[None, :]  # [M, 3]
        angle = coords @ w.T  # [L, M]
        phi = jnp.concatenate([jnp.cos(angle), jnp.sin(angle)], axis=1) / jnp.sqrt(num_freqs)  # [L, 2M]
        beta = TEMPERATURE * jnp.exp(jax.random.uniform(kb, (), minval=-0.2, maxval=0.2))
        gain = jnp.sqrt(beta * jnp.sqrt(head_dim))
        field = _smooth_field(kc, coords, content, field_scale) / jnp.sqrt(max(content, 1))  # [L, Dc]
        cq = field + 0.3 * jax.random.normal(kn1, field.shape) / jnp.sqrt(max(content, 1))
        ck = field + 0.3 * jax.random.normal(kn2, field.shape) / jnp.sqrt(max(content, 1))
        content_gain = jnp.sqrt(2.0 * jnp.sqrt(head_dim))  # content adds ~2 to the scaled score
        qs.append(jnp.concatenate([gain * phi, content_gain * cq], axis=1))
        ks.append(jnp.concatenate([gain * phi, content_gain * ck], axis=1))
        vs.append(
            _smooth_field(kv, coords, head_dim, field_scale)
            + 0.5 * jax.random.normal(kvn, (coords.shape[0], head_dim))
        )
    return tuple(jnp.stack(a).astype(dtype) for a in (qs, ks, vs))


__all__ = ["TEMPERATURE", "HeadKind", "head_kinds", "kernel_widths", "video_qkv"]
