"""The implementation registry: one entry per implementation owns its options, work model and
schedule counts; ``stlib.attention`` passes options through it and checks inputs once."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import pytest

import stlib
from stlib import masks, registry
from stlib.kernels.common import FlashOptions
from stlib.kernels.tile import BoundaryPolicy, GridForm, TileOptions
from stlib.roofline import kernel_work


def test_every_implementation_is_registered_once_with_what_it_owns():
    names = set(registry.IMPLEMENTATIONS)
    assert names >= {"reference", "xla", "pallas_dense", "pallas_block_sparse", "pallas_tile", "splash"}
    assert stlib.IMPLEMENTATIONS is registry.IMPLEMENTATIONS
    for impl in registry.IMPLEMENTATIONS.values():
        assert impl.work is not None, impl.name
        assert dataclasses.is_dataclass(impl.options_type) and impl.options_type.__dataclass_params__.frozen
        if impl.is_pallas:
            assert impl.compute_regions is not None and impl.schedule_counts is not None, impl.name
            assert impl.chips, impl.name
    with pytest.raises(ValueError, match="already registered"):
        registry.register(registry.IMPLEMENTATIONS["xla"])
    with pytest.raises(ValueError, match="unknown"):
        registry.get("nope")


def test_compiled_kernel_names_map_back_to_their_implementation():
    assert registry.owner_of_kernel("stlib_tile_ragged.1").name == "pallas_tile"
    assert registry.owner_of_kernel("stlib_block_sparse.1").name == "pallas_block_sparse"
    assert registry.owner_of_kernel("splash_mha_fwd_segmented_no_residuals.1").name == "splash"
    assert registry.owner_of_kernel("fusion.3") is None


def test_options_are_validated_and_typed():
    tile = registry.get("pallas_tile")
    assert tile.options() == TileOptions()
    opts = tile.options({"form": "flat", "boundary": "balanced"})
    assert opts.form is GridForm.FLAT and opts.boundary is BoundaryPolicy.BALANCED
    assert TileOptions(form="flat") == TileOptions(form=GridForm.FLAT)
    with pytest.raises(ValueError, match="form='diagonal'"):
        TileOptions(form="diagonal")
    with pytest.raises(ValueError, match="block_kv_compute=100"):
        TileOptions(block_kv_compute=100)
    with pytest.raises(TypeError, match="exp2"):
        FlashOptions(exp2="yes")
    with pytest.raises(TypeError, match="no options"):
        tile.options({"shape": "round"})
    with pytest.raises(TypeError, match="TileOptions"):
        tile.options(FlashOptions())
    with pytest.raises(TypeError, match="NoOptions"):
        registry.get("splash").options(TileOptions())


def test_attention_passes_options_to_the_kernel():
    """The same call with different options runs different kernels: the flat grid and the
    balanced boundary agree with the exact result where they should, and differ where they must."""
    length = 300
    q, k, v = stlib.random_qkv((2, length, 128), jnp.float32, seed=3)
    mask = masks.band(length, 45)
    ref = stlib.attention(q, k, v, mask)
    for options in ({"form": "flat"}, TileOptions(form="rows", exp2=False), {"block_kv_compute": 128}):
        out = stlib.attention(q, k, v, mask, impl="pallas_tile", block_q=32, block_kv=128, options=options)
        assert float(jnp.abs(out - ref).max()) < 2e-5
    balanced = stlib.attention(
        q, k, v, mask, impl="pallas_tile", block_q=32, block_kv=128, options={"boundary": "balanced"}
    )
    assert float(jnp.abs(balanced - ref).max()) > 1e-3  # rounds PARTIAL tiles: approximate by design
    with pytest.raises(TypeError, match="no options"):
        stlib.attention(q, k, v, mask, impl="pallas_dense", options={"form": "flat"})


def test_work_model_comes_from_the_registry():
    layout = stlib.block_layout(masks.band(1024, 100), 128, 128)
    rows = kernel_work("pallas_tile", layout, 2, 64)
    flat = kernel_work("pallas_tile", layout, 2, 64, {"form": "flat"})
    assert rows.computed_tiles == flat.computed_tiles and flat.grid_steps <= rows.grid_steps
    dense = kernel_work("pallas_dense", layout, 2, 64)
    assert dense.computed_tiles == 2 * 8 * 8
    assert kernel_work("xla", layout, 2, 64) == kernel_work("pallas_block_sparse", layout, 2, 64)
    with pytest.raises(ValueError, match="unknown"):
        kernel_work("nope", layout, 2, 64)


@pytest.mark.parametrize(("shape", "letter"), [((0, 16, 8), "H"), ((1, 0, 8), "L"), ((1, 16, 0), "D")])
def test_empty_axes_are_named(shape, letter):
    x = jnp.zeros(shape, jnp.float32)
    with pytest.raises(ValueError, match=f"q has {letter}=0"):
        stlib.attention(x, x, x)


def test_mixed_dtypes_are_refused():
    q = jnp.zeros((1, 16, 8), jnp.bfloat16)
    kv = jnp.zeros((1, 16, 8), jnp.float32)
    with pytest.raises(TypeError, match="one dtype"):
        stlib.attention(q, kv, kv, impl="pallas_dense")


def test_every_pallas_kernel_takes_the_chip_defaults_off_a_tpu():
    from stlib.device import CHIP_TABLE
    from stlib.kernels.common import block_sizes_for, default_block_sizes

    assert block_sizes_for(75_600, None, None, interpret=True).block_q == 128  # interpret mode: small tiles
    for chip in CHIP_TABLE.values():
        sizes = default_block_sizes(chip.name)
        assert (sizes.block_q, sizes.block_kv, sizes.block_kv_compute) == (
            chip.block_q,
            chip.block_kv,
            chip.block_kv_compute,
        )
    # per-implementation tuned defaults (package data written by a block sweep) name chips of the table only
    from stlib.kernels import tuned

    for impl in registry.IMPLEMENTATIONS.values():
        assert set(tuned.load(impl.name).get("chips", {})) <= set(CHIP_TABLE), impl.name


def test_one_baseline_and_every_pallas_kernel_has_its_block_rule_and_candidates():
    assert registry.baseline().name == "splash"
    with pytest.raises(ValueError, match="a baseline is already registered"):
        registry.register(dataclasses.replace(registry.baseline(), name="another_baseline"))
    for impl in registry.tpu_kernels():
        assert impl.resolve is not None and impl.tuned_candidates, impl.name
        assert all(bq % 8 == 0 and bkv % 128 == 0 for bq, bkv in impl.tuned_candidates), impl.name
    assert registry.get("reference").config(None, 300) == registry.Config(
        None, None, None, registry.NoOptions()
    )


def test_config_is_the_one_block_rule_the_kernel_runs():
    tile = registry.get("pallas_tile")
    explicit = tile.config(None, 300, 32, 128, {"block_kv_compute": 128}, interpret=True)
    assert (explicit.block_q, explicit.block_kv, explicit.block_kv_compute) == (32, 128, 128)
    assert explicit.options == TileOptions(block_kv_compute=128)
    compiled = tile.config(None, 75_600, interpret=False)  # compiled for a TPU from a CPU: v6e's table row
    assert (compiled.block_q, compiled.block_kv) == (512, 1024)
    small = tile.config(None, 300, interpret=True)  # interpret mode: small tiles, shrunk to the sequence
    assert small.block_q <= 304 and small.block_kv <= 384
    with pytest.raises(ValueError, match="multiple of 8"):
        tile.config(None, 300, 12, 128)


def test_supports_says_why_not():
    splash, tile = registry.get("splash"), registry.get("pallas_tile")
    assert splash.supports(shared_kv_heads=True, head_dim_v=True)
    assert "as many k / v heads" in tile.unsupported(shared_kv_heads=True)
    assert "head dim of q and k" in tile.unsupported(head_dim_v=True)
    assert "does not compile for chip='v4'" in tile.unsupported(chip="v4")
    with pytest.raises(ValueError, match="as many k / v heads"):
        tile.check_supports(shared_kv_heads=True)
    sta = masks.sliding_tile(stlib.CASE_STUDY.grid, (3, 8, 16), (3, 3, 3))
    assert "no lazy Splash form" in splash.unsupported(mask=sta)  # above DENSE_LIMIT, no lazy form
    assert splash.supports(mask=masks.band(75_600, 1000)) and tile.supports(mask=sta)


def test_the_tile_kernels_run_routed_plans_the_others_run_the_plan_mask():
    runners = {impl.name for impl in registry.IMPLEMENTATIONS.values() if impl.plan_runner is not None}
    assert runners == {"pallas_tile", "pallas_tile_lane_dense"}
    assert all(impl.backward is None for impl in registry.IMPLEMENTATIONS.values())  # the training issue
