"""impl="splash": the adapter over JAX's Splash attention.

Interpret mode on CPU against impl="reference" (tolerances: f32 atol 2e-5; bf16 atol 1e-2, about
two bf16 steps at |out| ~ 1, covering the bf16 rounding of q * scale and of the output), and compiled for TPU v6e / v5e at the
case-study shape without a TPU (REFERENCE.md section 6).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _kernels import assert_close, random_mask
from hypothesis import given, settings
from hypothesis import strategies as st

import stlib
from stlib import checks, masks
from stlib.configs import CASE_STUDY
from stlib.device import compile_for_tpu
from stlib.kernels import splash


def check(mask, shape, dtype=jnp.float32, seed=0, **kwargs):
    """Splash on seeded q, k, v of ``shape``, asserted equal to the reference (``assert_close``, rows
    the mask leaves empty exactly zero); returns Splash's output as float32 numpy."""
    q, k, v = stlib.random_qkv(shape, dtype, seed)
    out = stlib.attention(q, k, v, mask, impl="splash", interpret=True, **kwargs)
    ref = stlib.attention(q, k, v, mask, impl="reference", scale=kwargs.get("scale"))
    assert_close(out, ref, checks.tolerance(dtype), mask=mask)
    return np.asarray(out, np.float32)


# --- interpret mode vs the reference -----------------------------------------------------------


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("length", [512, 700])  # 700: no block size divides it
def test_full_mask(length, dtype):
    check(masks.full(length), (2, length, 128), dtype)


def test_no_mask_means_full_and_scale_is_applied():
    check(None, (2, 300, 64), scale=0.3)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_band_with_small_tiles(dtype):
    # 128 x 128 tiles: Splash shrinks its grid to the band's tiles and masks in-kernel
    check(masks.band(700, 100), (2, 700, 128), dtype, block_q=128, block_kv=256)


def test_band_and_combinations():
    length = 600
    mask = (masks.band(length, 200) & masks.band(length, 50)) | masks.band(length, 0)
    check(mask, (1, length, 128), block_q=128, block_kv=128)


def test_per_head_lazy_and_dense_heads():
    length = 400
    rng = np.random.default_rng(1)
    mask = masks.per_head(
        [
            masks.full(length),
            masks.band(length, 30),
            masks.band(length, 30),  # same as head 1: Splash deduplicates it
            random_mask(rng, None, length, 0.2),  # no lazy form: from its block layout
        ]
    )
    check(mask, (4, length, 128), block_q=128, block_kv=128)


def test_a_padded_tiled_order_runs_from_its_block_layout():
    """A mask with no lazy Splash form and padding slots (a sliding tile in a padded 3-D tiled order):
    padding never attended, its rows exactly zero."""
    grid = stlib.VideoGrid(3, 8, 40)  # 40 tokens along x: 16-token tiles pad to 48
    mask = masks.sliding_tile(grid, (1, 8, 16), (1, 1, 1)).permute(stlib.tiled_order(grid, (1, 8, 16)))
    assert not mask.token_validity().all()
    out = check(mask, (2, mask.length, 128), block_q=128, block_kv=256)
    assert np.all(out[:, ~mask.token_validity()] == 0.0)


def test_a_long_mask_without_a_lazy_form_evaluates_only_its_partial_tiles(monkeypatch):
    """Above DENSE_LIMIT Splash takes a mask with no lazy form from stlib's block layout: its tiles
    are classified from the layout's counts and only PARTIAL ones are evaluated (``Mask.block``),
    each once, never an L x L array."""
    grid = stlib.VideoGrid(5, 60, 60)  # 18,000 tokens
    mask = masks.sliding_tile(grid, (1, 6, 6), (3, 3, 3))
    assert mask.length > masks.DENSE_LIMIT and splash.mask_support(mask) is None
    blocks = splash.splash_blocks(mask.length)
    padded = blocks.padded_length(mask.length)
    layout = stlib.block_layout(mask, blocks.block_q, blocks.block_kv)
    evaluated = []
    original = type(mask).block

    def block(self, q0, q1, k0, k1, head=0):
        assert (q1 - q0) * (k1 - k0) <= blocks.block_q * blocks.block_kv, "only tiles are evaluated"
        evaluated.append((q0, k0))
        return original(self, q0, q1, k0, k1, head)

    monkeypatch.setattr(type(mask), "block", block)
    shape = jax.ShapeDtypeStruct((2, mask.length, 128), jnp.bfloat16)
    jax.eval_shape(
        lambda q, k, v: stlib.attention(q, k, v, mask, impl="splash", interpret=False), shape, shape, shape
    )
    partial = {
        (i * blocks.block_q, j * blocks.block_kv)
        for i, j in zip(*np.nonzero(layout.kinds[0] == stlib.TileKind.PARTIAL))
    }
    assert sorted(evaluated) == sorted(partial)  # every PARTIAL tile once, nothing else
    assert padded > mask.length  # the padded rows and columns were answered without evaluation


def test_per_head_masks_combined_with_a_band():
    length = 300
    mask = masks.per_head([masks.band(length, 20), masks.full(length)]) & masks.band(length, 100)
    check(mask, (2, length, 128), block_q=128, block_kv=128)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_random_mask_with_empty_rows_gives_zeros(dtype):
    length = 520
    mask = random_mask(
        np.random.default_rng(2),
        3,
        length,
        0.3,
        # one row that sees nothing, inside a tile that runs; a whole q tile that sees nothing
        # (Splash runs no step for it); a head that sees nothing
        empty_rows=((0, 7), (0, slice(128, 256))),
        empty_heads=(-1,),
    )
    out = check(mask, (3, length, 128), dtype, block_q=128, block_kv=128)
    assert np.all(out[0, 7] == 0) and np.all(out[0, 128:256] == 0) and np.all(out[-1] == 0)


def test_a_video_mask_runs_from_its_block_layout():
    grid = stlib.VideoGrid(3, 8, 12)
    check(
        masks.sliding_tile(grid, tile=(1, 4, 4), window=(3, 1, 1)),
        (2, grid.num_tokens, 128),
        block_q=128,
        block_kv=128,
    )


@settings(max_examples=6, deadline=None)
@given(
    length=st.integers(129, 400),
    density=st.floats(0.0, 1.0),
    blocks=st.sampled_from([128, 256]),
    seed=st.integers(0, 2**16),
)
def test_random_masks_property(length, density, blocks, seed):
    mask = random_mask(np.random.default_rng(seed), 2, length, density)
    check(mask, (2, length, 128), seed=seed, block_q=blocks, block_kv=128)


# --- block sizes and errors ----------------------------------------------------------------------


def test_default_blocks():
    blocks = splash.splash_blocks(CASE_STUDY.num_tokens)
    assert (blocks.block_q, blocks.block_kv, blocks.block_kv_compute) == (512, 1024, 512)
    assert blocks.padded_length(CASE_STUDY.num_tokens) == 75_776
    small = splash.splash_blocks(300)
    assert (small.block_q, small.block_kv, small.block_kv_compute) == (384, 384, 384)
    assert small.padded_length(300) == 384
    assert splash.splash_blocks(700).padded_length(700) == 1024  # padding stays below one kv tile


@pytest.mark.parametrize("name", ["block_q", "block_kv"])
def test_block_sizes_must_be_multiples_of_128(name):
    q, k, v = stlib.random_qkv((1, 256, 128))
    with pytest.raises(ValueError, match=f"{name}=192 must be a multiple of 128"):
        stlib.attention(q, k, v, impl="splash", interpret=True, **{name: 192})


# --- compiled for TPU at the case-study shape, without a TPU --------------------------------------


@pytest.mark.tpu_compile
@pytest.mark.parametrize("chip", ["v6e", "v5e"])
@pytest.mark.parametrize("pattern", ["full", "band"])
def test_compiles_for_tpu_at_case_study_shape(chip, pattern):
    length = CASE_STUDY.num_tokens
    mask = masks.full(length) if pattern == "full" else masks.band(length, 10_240)
    shape = jax.ShapeDtypeStruct(CASE_STUDY.qkv_shape, CASE_STUDY.dtype)
    compiled = compile_for_tpu(
        lambda q, k, v: stlib.attention(q, k, v, mask, impl="splash", interpret=False),
        shape,
        shape,
        shape,
        chip=chip,
    )
    assert "tpu_custom_call" in compiled.text()  # a Mosaic kernel, not an XLA fallback
    memory = compiled.memory()
    nbytes = int(np.prod(CASE_STUDY.qkv_shape)) * jnp.dtype(CASE_STUDY.dtype).itemsize
    assert memory["argument_size_in_bytes"] == 3 * nbytes
    assert memory["output_size_in_bytes"] == nbytes


def test_a_tiled_order_defaults_to_one_3d_tile_a_block():
    """Splash's default blocks on a mask in a padded 3-D tiled order: one tile (3 x 8 x 16 = 384
    tokens) on both axes, every block EMPTY or FULL; explicit blocks win; raster order keeps the
    defaults."""
    grid = stlib.CASE_STUDY.grid
    sta = masks.sliding_tile(grid, (3, 8, 16), (3, 3, 3))
    tiled = sta.permute(stlib.tiled_order(grid, (3, 8, 16)))
    implementation = stlib.registry.get("splash")
    config = implementation.config(tiled, tiled.length, interpret=False)
    assert (config.block_q, config.block_kv, config.block_kv_compute) == (384, 384, 384)
    kinds = stlib.block_layout(tiled, 384, 384).kinds
    assert not np.any(kinds == stlib.TileKind.PARTIAL)
    explicit = implementation.config(tiled, tiled.length, 512, 1024, interpret=False)
    assert (explicit.block_q, explicit.block_kv) == (512, 1024)
    raster = implementation.config(sta, sta.length, interpret=False)
    assert (raster.block_q, raster.block_kv) == (splash.DEFAULT_BLOCK_Q, splash.DEFAULT_BLOCK_KV)


def test_the_backward_fuses_only_where_its_dq_partials_fit_the_chip():
    """Fused, Splash's backward keeps one [H, Lp, D] dq partial per kv tile in HBM. At the case study
    dense with 1,024 x 2,048 tiles that is 7.2 GB (fused ran 589 ms a training step on a v5e, split
    735); the 3-D tiled sliding tile at 384 x 384 would be 43 GB, which a v5e's compile refuses, so
    the default splits it. An explicit choice is kept."""
    dense = splash.dq_partial_bytes(10, 75_776, 2048, 128, 2)
    sliding = splash.dq_partial_bytes(10, 80_640, 384, 128, 2)
    assert sliding == 210 * 10 * 80_640 * 128 * 2
    auto = splash.SplashOptions()
    assert auto.fused_backward is None
    assert splash.fuses_backward(auto, dense, "v5e") and not splash.fuses_backward(auto, sliding, "v5e")
    assert not splash.fuses_backward(auto, sliding, None)  # off a TPU: the smallest chip's HBM
    assert splash.fuses_backward(splash.SplashOptions(True), sliding, "v5e")
    assert not splash.fuses_backward(splash.SplashOptions(False), dense, "v5e")
    with pytest.raises(TypeError, match="True, False or None"):
        splash.SplashOptions("yes")


def test_mask_info_past_the_limit_is_refused_by_name(monkeypatch):
    """Splash's mask info (its distinct PARTIAL blocks and tables, constants of its program) past
    ``MASK_INFO_LIMIT`` is refused before anything compiles, naming the blocks and the size; the same
    call under the limit runs."""
    grid = stlib.VideoGrid(3, 8, 40)
    mask = masks.sliding_tile(grid, (1, 8, 16), (1, 1, 1)).permute(stlib.tiled_order(grid, (1, 8, 16)))
    q, k, v = stlib.random_qkv((2, mask.length, 128), jnp.float32, 0)
    stlib.attention(q, k, v, mask, impl="splash", block_q=128, block_kv=256, interpret=True)
    monkeypatch.setattr(splash, "MASK_INFO_LIMIT", 1000)
    with pytest.raises(
        ValueError, match=r"mask info .* at 128 x 256 blocks takes .* distinct partial blocks"
    ):
        stlib.attention(q, k, v, mask, impl="splash", block_q=128, block_kv=256, interpret=True)
