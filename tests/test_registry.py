"""The implementation registry: one entry per implementation owns its options, work model and
schedule counts; ``stlib.attention`` passes options through it and checks inputs once."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

import stlib
from stlib import contract, masks, registry
from stlib.geometry import TokenOrder
from stlib.kernels.flash_options import FlashOptions
from stlib.kernels.tile import GridForm, TileOptions
from stlib.passes import BoundaryPolicy
from stlib.roofline import kernel_work


def test_every_implementation_is_registered_once_with_what_it_owns():
    names = set(registry.IMPLEMENTATIONS)
    assert names >= {"reference", "xla", "pallas_dense", "pallas_block_sparse", "pallas_tile", "splash"}
    assert stlib.IMPLEMENTATIONS is registry.IMPLEMENTATIONS
    for impl in registry.IMPLEMENTATIONS.values():
        assert impl.work is not None, impl.name
        assert dataclasses.is_dataclass(impl.options_type) and impl.options_type.__dataclass_params__.frozen
        if impl.is_pallas:
            assert (
                impl.estimator.compute_regions is not None and impl.estimator.schedule_counts is not None
            ), impl.name
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
    with pytest.raises(TypeError, match="SplashOptions"):
        registry.get("splash").options(TileOptions())
    with pytest.raises(TypeError, match="NoOptions"):
        registry.get("xla").options(TileOptions())


def test_attention_passes_options_to_the_kernel():
    """The same call with different options runs different kernels: the flat grid and the
    balanced boundary agree with the exact result where they should, and differ where they must."""
    length = 300
    q, k, v = stlib.random_qkv((2, length, 128), jnp.float32, seed=3)
    mask = masks.band(length, 45)
    ref = stlib.attention(q, k, v, mask, impl="reference")
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
        stlib.attention(x, x, x, impl="reference")


def test_mixed_dtypes_are_refused():
    q = jnp.zeros((1, 16, 8), jnp.bfloat16)
    kv = jnp.zeros((1, 16, 8), jnp.float32)
    with pytest.raises(TypeError, match="one dtype"):
        stlib.attention(q, kv, kv, impl="pallas_dense")


def test_every_pallas_kernel_takes_the_chip_defaults_off_a_tpu():
    from stlib.blocks import TPU_BLOCK_SIZES, block_sizes_for, default_block_sizes
    from stlib.device import CHIP_TABLE

    assert block_sizes_for(75_600, None, None, interpret=True).block_q == 128  # interpret mode: small tiles
    for chip in CHIP_TABLE.values():  # the flash kernels' defaults, the same on every chip
        assert default_block_sizes(chip.name) == TPU_BLOCK_SIZES
        assert not hasattr(chip, "block_q")  # the chip table holds hardware facts, no kernel choice
    with pytest.raises(ValueError, match="chip='v4'"):
        default_block_sizes("v4")
    # per-implementation tuned defaults (package data written by a block sweep) name chips of the table only
    from stlib import tuned

    for impl in registry.IMPLEMENTATIONS.values():
        assert set(tuned.load(impl.name).get("chips", {})) <= set(CHIP_TABLE), impl.name


def test_one_baseline_and_every_pallas_kernel_has_its_block_rule_and_candidates():
    assert registry.baseline().name == "splash"
    with pytest.raises(ValueError, match="the role BASELINE .* is already held by 'splash'"):
        registry.register(dataclasses.replace(registry.baseline(), name="another_baseline"))
    for impl in registry.tpu_kernels():
        assert impl.resolve is not None and impl.estimator.tuned_candidates, impl.name
        assert all(bq % 8 == 0 and bkv % 128 == 0 for bq, bkv in impl.estimator.tuned_candidates), impl.name
    assert registry.get("reference").config(None, 300) == contract.Config(
        None, None, None, contract.NoOptions()
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
    tiled = sta.permute(stlib.tiled_order(stlib.CASE_STUDY.grid, (3, 8, 16)))
    assert splash.supports(mask=sta) and splash.supports(mask=tiled)  # no lazy form: from the layout
    shard = tiled.block_view(0, 0, masks.DENSE_LIMIT + 128)  # rows from no key intervals: refused
    assert "no lazy Splash form" in splash.unsupported(mask=shard)
    assert splash.supports(mask=masks.band(75_600, 1000)) and tile.supports(mask=sta)


def test_the_tile_kernels_run_routed_plans_the_others_run_the_plan_mask():
    runners = {impl.name for impl in registry.IMPLEMENTATIONS.values() if impl.plan_runner is not None}
    assert runners == {"pallas_tile", "pallas_tile_lane_dense"}
    # every stlib Pallas kernel brings its backward kernels; Splash differentiates through its own
    # custom_vjp, the plain-JAX implementations through JAX
    trained = {impl.name for impl in registry.IMPLEMENTATIONS.values() if impl.backward is not None}
    assert trained == {impl.name for impl in registry.tpu_kernels() if not impl.baseline}


def test_auto_picks_the_tile_kernel_on_a_tpu_splash_when_dense_and_xla_elsewhere():
    band = masks.band(512, 64)
    tile = registry.choose("auto", band, backend="tpu")
    assert tile.is_pallas and not tile.baseline and tile.plan_runner is not None
    tpu_masked, cpu_masked = registry.Situation("tpu", True), registry.auto_situation(band, "cpu")
    assert cpu_masked == registry.Situation(registry.ANY_BACKEND, True)
    assert registry.auto_rank(tile, tpu_masked) == 0 and registry.auto_rank(tile, cpu_masked) is None
    assert registry.choose("auto", None, backend="tpu") is registry.baseline()
    for backend in ("cpu", "gpu"):
        assert registry.choose("auto", band, backend=backend).name == "xla"
        assert registry.choose("auto", None, backend=backend).name == "xla"
    assert registry.choose("pallas_dense", band, backend="tpu").name == "pallas_dense"
    assert registry.DEFAULT_IMPL == registry.AUTO
    for masked in (True, False):  # every backend finds a row
        assert registry.Situation(registry.ANY_BACKEND, masked) in registry.AUTO_PICKS
    for situation, roles in registry.AUTO_PICKS.items():  # every role the table names is held
        assert all(registry.by_role(role) for role in roles), situation


def test_register_takes_typed_adapters_only():
    entry = registry.IMPLEMENTATIONS["xla"]
    with pytest.raises(TypeError, match="estimator= takes an EstimatorHooks, got dict"):
        registry.register(dataclasses.replace(entry, name="xla_again"), estimator={"kernel_names": ()})
    with pytest.raises(TypeError, match="presentation= takes a Presentation, got str"):
        registry.register(dataclasses.replace(entry, name="xla_again"), presentation="XLA")
    assert "xla_again" not in registry.IMPLEMENTATIONS


def _shuffled_band(length: int) -> masks.Mask:
    """A 1-D band over shuffled tokens: nearly every 128 x 128 tile is PARTIAL (a lazy mask)."""
    perm = np.random.default_rng(0).permutation(length).astype(np.int32)
    return masks.band(length, 4).permute(TokenOrder("shuffled", perm, length))


def test_auto_falls_back_to_the_next_rank_when_a_mask_is_refused():
    refused_by_xla = _shuffled_band(9_000)  # more PARTIAL tiles than xla tabulates; reference takes it
    assert "too many to tabulate" in registry.get("xla").unsupported(mask=refused_by_xla)
    assert registry.choose("auto", refused_by_xla, backend="cpu").name == "reference"
    with pytest.raises(
        ValueError, match=r"impl='auto' \(any other backend, masked\) found no .*tabulate.*L=20000 > 16384"
    ):
        registry.choose("auto", _shuffled_band(20_000), backend="cpu")


def test_the_default_impl_is_auto_and_an_unknown_name_lists_it():
    q, k, v = stlib.random_qkv((2, 64, 8))
    mask = masks.band(64, 5)
    assert (stlib.attention(q, k, v, mask) == stlib.attention(q, k, v, mask, impl="xla")).all()
    with pytest.raises(ValueError, match="'auto'"):
        stlib.attention(q, k, v, mask, impl="fastest")


def test_every_role_is_held_once_and_names_what_the_rest_asks_for():
    holders = {role: registry.by_role(role) for role in registry.Role}
    assert len({impl.name for impl in holders.values()}) == len(registry.Role)
    assert holders[registry.Role.BASELINE] is registry.baseline() and holders[registry.Role.BASELINE].baseline
    assert holders[registry.Role.TILE].plan_runner is not None  # routed plans run on it
    assert holders[registry.Role.REFERENCE].capabilities.max_length > 0
    assert {b.value for b in holders[registry.Role.TILE].option_enum("boundary")} == {"exact", "balanced"}
    with pytest.raises(TypeError, match="not an enum"):
        holders[registry.Role.BEST_TILE].option_enum("lookahead")
    with pytest.raises(ValueError):
        registry.by_role("the fastest kernel")


def test_the_chip_is_resolved_once_where_the_call_is_made(monkeypatch):
    """``config`` looks up the TPU at hand once and hands it on in ``Config.chip``: the blocks are that
    chip's; a chip the options name is taken without a lookup; off a TPU it is None."""
    from stlib.kernels import tile_lane_dense as ld

    lookups = []

    def at_hand():
        lookups.append(1)
        return "v5e"

    monkeypatch.setattr(registry, "current_chip", at_hand)
    lane_dense = registry.get("pallas_tile_lane_dense")
    config = lane_dense.config(None, 75_600, interpret=False)
    assert config.chip == "v5e" and lookups == [1]
    assert (config.block_q, config.block_kv) == (
        ld.DEFAULT_BLOCKS["v5e"].block_q,
        ld.DEFAULT_BLOCKS["v5e"].block_kv,
    )
    named = lane_dense.config(None, 75_600, options={"chip": "tpu7x"}, interpret=False)
    assert named.chip == "tpu7x" and lookups == [1]
    assert (named.block_q, named.block_kv) == (
        ld.DEFAULT_BLOCKS["tpu7x"].block_q,
        ld.DEFAULT_BLOCKS["tpu7x"].block_kv,
    )
    monkeypatch.setattr(registry, "current_chip", lambda: None)
    assert registry.get("pallas_tile").config(None, 4096, interpret=True).chip is None
