"""``stlib.attention`` (impl="reference" and "xla") and ``video_attention`` against float64 numpy.

Tolerances (absolute, against float64 computed from the same, already rounded, inputs; the
outputs are O(1) since v ~ N(0, 1)):
- float32: 2e-5 (float32 accumulation of a softmax over <= a few hundred keys);
- bfloat16: 2e-2 (the output is rounded to bf16: 2^-8 relative on values of magnitude <= ~4).
"""

from __future__ import annotations

import _brute as bf
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _kernels import as64, assert_close, random_dense
from conftest import qkv

import stlib
from stlib import VideoGrid, checks, masks, tiled_order

jax.config.update("jax_enable_x64", False)

IMPLS = ["reference", "xla"]


def check(out, q, k, v, dense, dtype, scale=None):
    """``out`` against float64 attention of the same inputs; rows ``dense`` leaves empty are zeros."""
    want = bf.attention_f64(as64(q), as64(k), as64(v), dense, scale)
    assert_close(out, want, checks.tolerance(dtype), dtype=q.dtype, mask=dense)


# ------------------------------------------------------------------------------------------------
# correctness


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize(
    "length,density,blocks",
    [(37, 0.3, (8, 16)), (50, 0.05, (16, 16)), (64, 0.7, (None, None)), (23, 0.5, (24, 8))],
    ids=["L37", "L50-sparse", "L64-default-blocks", "L23-one-q-tile"],
)
def test_random_head_uniform_masks(impl, dtype, length, density, blocks):
    rng = np.random.default_rng(length)
    arr = random_dense(rng, None, length, density, empty_fraction=0.15)
    q, k, v = qkv(length, 2, length, 16, dtype)
    out = stlib.attention(q, k, v, masks.from_array(arr), impl=impl, block_q=blocks[0], block_kv=blocks[1])
    check(out, q, k, v, arr, dtype)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_two_head_array_mask_with_empty_head(impl, dtype):
    rng = np.random.default_rng(11)
    arr = random_dense(rng, 2, 45, 0.25, empty_fraction=0.15, empty_heads=(1,))  # head 1: zeros
    q, k, v = qkv(11, 2, 45, 8, dtype)
    out = stlib.attention(q, k, v, masks.from_array(arr), impl=impl, block_q=16, block_kv=8)
    check(out, q, k, v, arr, dtype)
    assert np.all(as64(out)[1] == 0.0)


@pytest.mark.parametrize("impl", IMPLS)
def test_per_head_video_masks(impl):
    g = VideoGrid(3, 4, 5)
    m = masks.per_head(
        [masks.spatial(g), masks.temporal(g, 1), masks.neighborhood(g, (1, 3, 3), causal=True)]
    )
    q, k, v = qkv(3, 3, g.num_tokens, 16)
    out = stlib.attention(q, k, v, m, impl=impl, block_q=16, block_kv=24)
    check(out, q, k, v, m.to_dense(), jnp.float32)


@pytest.mark.parametrize("impl", IMPLS)
def test_no_mask_and_explicit_scale(impl):
    q, k, v = qkv(5, 2, 30, 8)
    check(stlib.attention(q, k, v, impl=impl), q, k, v, None, jnp.float32)
    check(
        stlib.attention(q, k, v, masks.band(30, 4), impl=impl, scale=0.7, block_q=8, block_kv=8),
        q,
        k,
        v,
        np.abs(np.subtract.outer(np.arange(30), np.arange(30))) <= 4,
        jnp.float32,
        scale=0.7,
    )


@pytest.mark.parametrize("impl", IMPLS)
def test_video_attention(impl):
    g = VideoGrid(4, 5, 6)
    m = masks.neighborhood(g, (3, 3, 3)) | masks.frame_causal(g)
    q, k, v = qkv(8, 2, g.num_tokens, 16)
    out = stlib.video_attention(q, k, v, g, m, impl=impl, block_q=32, block_kv=16)
    check(out, q, k, v, m.to_dense(), jnp.float32)


def test_tiled_order_attention_round_trip():
    """Reorder q/k/v into a padded 3-D tiled order, attend with the permuted mask, restore."""
    g = VideoGrid(3, 5, 6)
    tile = (1, 2, 2)
    order = tiled_order(g, tile)
    base = masks.sliding_tile(g, tile, (1, 3, 3))
    q, k, v = qkv(9, 2, g.num_tokens, 8)
    want = bf.attention_f64(as64(q), as64(k), as64(v), base.to_dense())
    permuted = base.permute(order)
    for impl in IMPLS:
        out = stlib.attention(
            *(order.apply(x) for x in (q, k, v)), permuted, impl=impl, block_q=8, block_kv=8
        )
        assert_close(order.restore(out), want, checks.tolerance(jnp.float32), dtype=q.dtype)


def test_xla_padding_rows_are_zero():
    g = VideoGrid(3, 5, 6)
    order = tiled_order(g, (1, 2, 2))
    m = masks.sliding_tile(g, (1, 2, 2), (1, 3, 3)).permute(order)
    q, k, v = (order.apply(x) for x in qkv(9, 2, g.num_tokens, 8))
    out = as64(stlib.attention(q, k, v, m, impl="xla", block_q=8, block_kv=8))
    assert np.all(out[:, ~np.asarray(order.valid)] == 0.0)


def test_xla_many_head_array_mask():
    """Regression for the per-head layout cache (see test_layout): head h sees exactly kv tile h."""
    heads, length = 6, 48
    arr = np.zeros((heads, length, length), bool)
    for h in range(heads):
        arr[h, :, 8 * h : 8 * h + 8] = True
    q, k, v = qkv(12, heads, length, 8)
    out = stlib.attention(q, k, v, masks.from_array(arr), impl="xla", block_q=8, block_kv=8)
    check(out, q, k, v, arr, jnp.float32)


def test_impl_registry():
    assert {"reference", "xla"} <= set(stlib.IMPLEMENTATIONS)


# ------------------------------------------------------------------------------------------------
# bad input

Q, K, V = qkv(0, 2, 16, 8)


def _bad_cases():
    g = VideoGrid(2, 2, 4)
    yield "rank 2", lambda: stlib.attention(Q[0], K[0], V[0], impl="reference"), ValueError
    yield (
        "batch axes",
        lambda: stlib.attention(Q[None], K[None, None], V[None, None], impl="reference"),
        ValueError,
    )
    yield "heads", lambda: stlib.attention(Q[:1], K, V, impl="reference"), ValueError  # 2 kv heads, 1 q head
    yield "head dims", lambda: stlib.attention(Q[..., :4], K, V, impl="reference"), ValueError
    yield "lengths", lambda: stlib.attention(Q[:, :8], K, V, impl="reference"), ValueError
    yield "k vs v", lambda: stlib.attention(Q, K, V[:, :8], impl="reference"), ValueError
    yield "int q", lambda: stlib.attention(Q.astype(jnp.int32), K, V, impl="reference"), TypeError
    yield "int v", lambda: stlib.attention(Q, K, V.astype(jnp.int32), impl="reference"), TypeError
    yield "bool k", lambda: stlib.attention(Q, K.astype(bool), V, impl="reference"), TypeError
    yield "list q", lambda: stlib.attention(np.asarray(Q).tolist(), K, V, impl="reference"), TypeError
    yield "unknown impl", lambda: stlib.attention(Q, K, V, impl="flash"), ValueError
    for impl in IMPLS:
        yield (
            f"block_q 12 {impl}",
            lambda impl=impl: stlib.attention(Q, K, V, impl=impl, block_q=12),
            ValueError,
        )
        yield (
            f"block_kv 4 {impl}",
            lambda impl=impl: stlib.attention(Q, K, V, impl=impl, block_kv=4),
            ValueError,
        )
        yield (
            f"block_q 0 {impl}",
            lambda impl=impl: stlib.attention(Q, K, V, impl=impl, block_q=0),
            ValueError,
        )
        yield (
            f"block_kv -8 {impl}",
            lambda impl=impl: stlib.attention(Q, K, V, impl=impl, block_kv=-8),
            ValueError,
        )
        yield (
            f"block_q 8.0 {impl}",
            lambda impl=impl: stlib.attention(Q, K, V, impl=impl, block_q=8.0),
            TypeError,
        )
        yield (
            f"mask length {impl}",
            lambda impl=impl: stlib.attention(Q, K, V, masks.full(15), impl=impl),
            ValueError,
        )
        yield (
            f"mask heads {impl}",
            lambda impl=impl: stlib.attention(Q, K, V, masks.per_head([masks.full(16)] * 3), impl=impl),
            ValueError,
        )
        yield (
            f"mask array {impl}",
            lambda impl=impl: stlib.attention(Q, K, V, np.ones((16, 16), bool), impl=impl),
            TypeError,
        )
    yield "scale str", lambda: stlib.attention(Q, K, V, scale="1", impl="reference"), TypeError
    yield "scale nan", lambda: stlib.attention(Q, K, V, scale=float("nan"), impl="reference"), TypeError
    yield (
        "video grid L",
        lambda: stlib.video_attention(Q, K, V, VideoGrid(2, 2, 3), impl="reference"),
        ValueError,
    )
    yield "video grid type", lambda: stlib.video_attention(Q, K, V, (2, 2, 4), impl="reference"), TypeError
    yield (
        "video mask grid",
        lambda: stlib.video_attention(Q, K, V, g, masks.frame_causal(VideoGrid(2, 2, 3)), impl="reference"),
        ValueError,
    )
    yield "video int", lambda: stlib.video_attention(Q.astype(jnp.int8), K, V, g, impl="reference"), TypeError
    yield "video unknown impl", lambda: stlib.video_attention(Q, K, V, g, impl="nope"), ValueError


BAD = list(_bad_cases())


@pytest.mark.parametrize("what,call,exc", BAD, ids=[b[0] for b in BAD])
def test_bad_input(what, call, exc):
    with pytest.raises(exc):
        call()


def test_reference_refuses_large_length():
    length = stlib.kernels.xla.REFERENCE_LIMIT + 1
    q = jnp.zeros((1, length, 8), jnp.float32)
    with pytest.raises(ValueError):
        stlib.attention(q, q, q, impl="reference")
