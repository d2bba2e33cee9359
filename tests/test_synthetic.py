"""Synthetic video-like inputs: seeded, shaped, and their attention concentrates where planted."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from stlib import VideoGrid
from stlib.synthetic import HeadKind, video_qkv

GRID = VideoGrid(4, 8, 16)


def _probs(q, k):
    return np.asarray(jax.nn.softmax(jnp.einsum("hqd,hkd->hqk", q, k) / np.sqrt(q.shape[2]), axis=-1))


def test_shapes_dtype_and_seed():
    q, k, v = video_qkv(GRID, ["spatial", "temporal", "spatial"], 64, dtype=jnp.bfloat16)
    assert q.shape == k.shape == v.shape == (3, GRID.num_tokens, 64)
    assert q.dtype == jnp.bfloat16
    again = video_qkv(GRID, ["spatial", "temporal", "spatial"], 64, dtype=jnp.bfloat16)
    assert all(bool(jnp.array_equal(a, b)) for a, b in zip((q, k, v), again))
    other = video_qkv(GRID, ["spatial", "temporal", "spatial"], 64, seed=1, dtype=jnp.bfloat16)
    assert not bool(jnp.array_equal(q, other[0]))
    assert all(bool(jnp.all(jnp.isfinite(x))) for x in (q, k, v))


def test_attention_concentrates_as_planted():
    q, k, _ = video_qkv(GRID, [HeadKind.SPATIAL, HeadKind.TEMPORAL], 64)
    p = _probs(q, k)
    tokens = np.arange(GRID.num_tokens)
    frame = tokens // GRID.tokens_per_frame
    where = tokens % GRID.tokens_per_frame
    same_frame = (p * (frame[:, None] == frame[None, :])).sum(-1).mean(-1)  # [H]
    same_place = (p * (where[:, None] == where[None, :])).sum(-1).mean(-1)
    self_mass = np.einsum("hii->h", p) / GRID.num_tokens
    # spatial head: nearly all mass in the query's frame, spread over many keys (not only itself)
    assert same_frame[0] > 0.9 and self_mass[0] < 0.3
    # temporal head: nearly all mass at the query's position, across frames
    assert same_place[1] > 0.8 and same_frame[1] < 0.7
    # uniform attention would give 1 / T and 1 / (Y X)
    assert same_place[0] < 0.5 and same_frame[1] < same_frame[0]


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ((GRID, ["spatial", "diagonal"], 64), ValueError),
        ((GRID, "spatial", 64), TypeError),
        ((GRID, [], 64), ValueError),
        ((GRID, ["spatial"], 4), ValueError),
        (((4, 8, 16), ["spatial"], 64), TypeError),
    ],
)
def test_bad_input(args, error):
    with pytest.raises(error):
        video_qkv(*args)
