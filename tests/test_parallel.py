"""Attention over a device mesh (``stlib.parallel``): both strategies on a 4-device CPU mesh equal
single-device attention, gradients included; per-head masks and plans follow their heads; bad
meshes and shapes are refused by name; a small sharded program of each strategy compiles for a
v6e 2x2 slice without a TPU, each device holding a quarter of the inputs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _kernels import assert_close
from conftest import qkv
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import stlib
from stlib import checks, masks
from stlib.parallel import device_branches, parallel_attention
from stlib.routing import svg_plan

GRID = stlib.VideoGrid(3, 8, 12)  # 288 tokens: ragged against 128-token tiles
HEADS = 8
TOL = checks.tolerance(jnp.float32)


def _mesh(*shape, names=("x",)):
    devices = jax.devices()
    assert len(devices) >= 4, "conftest sets --xla_force_host_platform_device_count=4"
    return Mesh(np.array(devices[: int(np.prod(shape))]).reshape(shape), names)


def _svg_mix(grid=GRID, heads=HEADS):
    """Per-head SVG-style mask: spatial and temporal heads in pairs (two distinct device slices on 4
    devices), the last head seeing nothing in its first frame row."""
    spatial, temporal = masks.spatial(grid, 0), masks.temporal(grid, 1)
    return masks.per_head([spatial if (h // 2) % 2 == 0 else temporal for h in range(heads)])


def _loss(fn):
    ct = jax.random.normal(jax.random.key(7), (HEADS, GRID.num_tokens, 16))
    return lambda q, k, v: jnp.sum(fn(q, k, v) * ct)


@pytest.mark.parametrize("strategy", ["heads", "ulysses"])
def test_both_strategies_equal_single_device_attention_gradients_included(strategy):
    mask = _svg_mix()
    q, k, v = qkv(0, HEADS, GRID.num_tokens, 16)
    mesh = _mesh(4)

    def sharded(q, k, v):
        return parallel_attention(q, k, v, mask, mesh=mesh, axis_name="x", strategy=strategy, grid=GRID)

    def single(q, k, v):
        return stlib.video_attention(q, k, v, GRID, mask, impl="reference")

    out = jax.jit(sharded)(q, k, v)
    spec = P("x", None, None) if strategy == "heads" else P(None, "x", None)
    assert out.sharding.is_equivalent_to(NamedSharding(mesh, spec), 3)
    assert_close(out, single(q, k, v), TOL)
    got = jax.jit(jax.grad(_loss(sharded), argnums=(0, 1, 2)))(q, k, v)
    want = jax.grad(_loss(single), argnums=(0, 1, 2))(q, k, v)
    for name, g, w in zip("qkv", got, want):
        scale = float(jnp.max(jnp.abs(w)))
        assert scale > 0, name
        assert float(jnp.max(jnp.abs(g - w))) <= 2e-3 * scale, f"d{name}"


@pytest.mark.parametrize("strategy", ["heads", "ulysses"])
def test_a_mesh_of_explicit_axes_takes_unsharded_inputs(strategy):
    """``jax.make_mesh`` gives explicit axes, whose ``shard_map`` refuses inputs not already sharded
    as its specs: ``parallel_attention`` places them, inside jit and out."""
    mesh = jax.make_mesh((4,), ("x",))
    assert mesh.axis_types == (jax.sharding.AxisType.Explicit,)
    mask = _svg_mix()
    q, k, v = qkv(1, HEADS, GRID.num_tokens, 16)
    want = stlib.video_attention(q, k, v, GRID, mask, impl="reference")

    def sharded(q, k, v):
        return parallel_attention(q, k, v, mask, mesh=mesh, axis_name="x", strategy=strategy, grid=GRID)

    assert_close(sharded(q, k, v), want, TOL)
    assert_close(jax.jit(sharded)(q, k, v), want, TOL)


def test_per_head_masks_follow_their_heads_to_their_devices():
    mask = _svg_mix()
    branches = device_branches(mask, None, HEADS, 4)
    assert branches.branch_of_device == (0, 1, 0, 1)  # spatial pair, temporal pair, spatial, temporal
    assert branches.branches == (masks.spatial(GRID, 0), masks.temporal(GRID, 1))  # head-uniform slices
    assert list(branches.heads_of(3)) == [6, 7]
    assert device_branches(masks.spatial(GRID, 0), None, HEADS, 4).branches == (masks.spatial(GRID, 0),)
    # a mask whose device slices all differ gets one branch per device, and still equals one device
    rng = np.random.default_rng(1)
    dense = rng.random((HEADS, GRID.num_tokens, GRID.num_tokens)) < 0.2
    dense[5, :, :40] = False  # keys no query of head 5 sees
    dense[2, 10:20] = False  # rows head 2 leaves empty
    random = masks.from_array(dense)
    assert len(device_branches(random, None, HEADS, 4).branches) == 4
    q, k, v = qkv(1, HEADS, GRID.num_tokens, 16)
    out = parallel_attention(q, k, v, random, mesh=_mesh(4), axis_name="x")
    assert_close(out, stlib.attention(q, k, v, random, impl="reference"), TOL, mask=random)


def test_a_routed_plan_runs_per_device_with_its_own_head_slices():
    kinds = ["spatial", "spatial", "temporal", "temporal"] * 2
    plan = svg_plan(GRID, kinds, 0.3, block_q=128, block_kv=128)
    assert plan.head_slice(2, 4).kinds == plan.kinds[2:4]
    q, k, v = qkv(2, HEADS, GRID.num_tokens, 16)
    for strategy in ("heads", "ulysses"):
        out = parallel_attention(q, k, v, plan=plan, mesh=_mesh(4), axis_name="x", strategy=strategy)
        assert_close(out, stlib.attention(q, k, v, plan.mask, impl="reference"), TOL)
    with pytest.raises(ValueError, match="not a slice"):
        plan.head_slice(4, 9)


def test_a_batch_axis_shards_over_its_own_mesh_axis():
    mask = _svg_mix()
    q, k, v = (jnp.stack([x, 0.5 * x]) for x in qkv(3, HEADS, GRID.num_tokens, 16))
    mesh = _mesh(2, 2, names=("batch", "x"))
    for strategy in ("heads", "ulysses"):
        out = parallel_attention(
            q, k, v, mask, mesh=mesh, axis_name="x", batch_axis_name="batch", strategy=strategy, grid=GRID
        )
        assert out.shape == q.shape and out.sharding.spec[0] == "batch"
        for b in range(2):
            ref = stlib.video_attention(q[b], k[b], v[b], GRID, mask, impl="reference")
            assert_close(out[b], ref, TOL)


def test_bad_meshes_and_shapes_are_refused_by_name():
    q, k, v = qkv(0, HEADS, GRID.num_tokens, 16)
    mesh = _mesh(4)
    call = {"mesh": mesh, "axis_name": "x"}
    with pytest.raises(ValueError, match="axis_name='heads' is not an axis of the mesh"):
        parallel_attention(q, k, v, mesh=mesh, axis_name="heads")
    with pytest.raises(ValueError, match="H=6 heads do not divide over the 4 devices"):
        parallel_attention(q[:6], k[:6], v[:6], **call)
    with pytest.raises(ValueError, match="L=286 tokens do not divide over the 4 devices"):
        parallel_attention(q[:, :286], k[:, :286], v[:, :286], strategy="ulysses", **call)
    with pytest.raises(ValueError, match="mask has 4 heads but q has 8"):
        parallel_attention(q, k, v, _svg_mix(heads=4), grid=GRID, **call)
    with pytest.raises(ValueError, match="strategy='rings' must be one of"):
        parallel_attention(q, k, v, strategy="rings", **call)
    with pytest.raises(ValueError, match="batch_axis_name='b' is not an axis"):
        parallel_attention(q[None], k[None], v[None], batch_axis_name="b", **call)
    with pytest.raises(TypeError, match="mesh must be a jax.sharding.Mesh"):
        parallel_attention(q, k, v, mesh=jax.devices(), axis_name="x")
    with pytest.raises(ValueError, match="the plan has 8 heads but q has 4"):
        plan = svg_plan(GRID, ["spatial"] * HEADS, 0.3, block_q=128, block_kv=128)
        parallel_attention(q[:4], k[:4], v[:4], plan=plan, **call)


@pytest.mark.parametrize("strategy", ["heads", "ulysses"])
def test_a_sharded_program_compiles_for_a_v6e_slice(strategy):
    """Deviceless: 8 heads x 1,536 tokens x 128 bf16 with a per-head spatial / temporal mask on
    v6e:2x2 (4 chips), impl="auto" resolving to the TPU tile kernel for the slice."""
    from jax.experimental import topologies

    topology = topologies.get_topology_desc(platform="tpu", topology_name="v6e:2x2")
    mesh = Mesh(np.array(topology.devices), ("x",))
    grid = stlib.VideoGrid(3, 16, 32)
    spatial, temporal = masks.spatial(grid, 0), masks.temporal(grid, 1)
    mask = masks.per_head([spatial] * 4 + [temporal] * 4)
    spec = P("x", None, None) if strategy == "heads" else P(None, "x", None)
    shape = jax.ShapeDtypeStruct((8, grid.num_tokens, 128), jnp.bfloat16, sharding=NamedSharding(mesh, spec))

    def fn(q, k, v):
        return parallel_attention(q, k, v, mask, mesh=mesh, axis_name="x", strategy=strategy, grid=grid)

    compiled = jax.jit(fn).lower(shape, shape, shape).compile()
    text = compiled.as_text()
    assert compiled.memory_analysis().argument_size_in_bytes == 3 * 8 * grid.num_tokens * 128 * 2 // 4
    assert text.count("all-to-all") == (0 if strategy == "heads" else 4)  # q, k, v in; o out
    tile_kernel = stlib.registry.choose("auto", mask, backend="tpu")
    kernels = {name for name in tile_kernel.estimator.kernel_names if name in text}
    assert kernels, f"no {tile_kernel.name} kernel in the compiled program"


def test_xla_runs_inside_a_checked_shard_map():
    """A user's own ``jax.shard_map`` (replication checks on, the default) around ``impl="xla"``."""
    mask = masks.band(GRID.num_tokens, 30)
    q, k, v = qkv(4, HEADS, GRID.num_tokens, 16)
    mesh = _mesh(4)

    def local(q, k, v):
        return stlib.attention(q, k, v, mask, impl="xla")

    out = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=P("x"), out_specs=P("x")))(q, k, v)
    assert_close(out, stlib.attention(q, k, v, mask, impl="reference"), TOL)
