"""Sparse ring attention (``stlib.ring``, ``parallel_attention(strategy="ring")`` and the 2-D
"ulysses-ring"): on a 4-device CPU mesh (4, or 2 x 2) it equals single-device attention, gradients
included, for per-head spatial / temporal masks, a frame-causal mask and dense attention, with the
tile kernels (interpret mode: the best one runs every hop through one kernel, the other a kernel a
block) and with plain JAX; a routed plan's heads keep their masks;
hops no device needs are not issued (counted in the compiled program); a small ring compiles for a
v6e slice without a TPU; bad input is refused by name."""

from __future__ import annotations

import re
from functools import partial

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
from stlib.bench.collectives import all_to_all_bytes, kernel_bodies, permute_bytes, permutes_ahead
from stlib.parallel import parallel_attention
from stlib.registry import Role, by_role
from stlib.ring import plan_mask, ring_hops
from stlib.routing import svg_plan

GRID = stlib.VideoGrid(4, 8, 16)  # 512 tokens: one frame of 128 per device
HEADS = 3  # does not divide over the 4 devices: the ring does not need it to
TOL = checks.tolerance(jnp.float32)
PERMUTE = re.compile(r"collective-permute(?:-start)?\(")


def _mesh():
    return jax.make_mesh((4,), ("x",))


def _svg_mix():
    """Per-head spatial (one hop), temporal (every hop) and frame-causal (every hop, empty halves)."""
    return masks.per_head([masks.spatial(GRID), masks.temporal(GRID, 1), masks.frame_causal(GRID)])


def _ring(mask, impl, mesh=None):
    blocks = {} if impl == "xla" else {"block_q": 128, "block_kv": 128}
    mesh = mesh or _mesh()

    def run(q, k, v):
        return parallel_attention(
            q, k, v, mask, mesh=mesh, axis_name="x", strategy="ring", impl=impl, **blocks
        )

    return run


def _check_gradients(fn, mask, q, k, v):
    ct = jax.random.normal(jax.random.key(5), q.shape)
    got = jax.jit(jax.grad(lambda *a: jnp.sum(fn(*a) * ct), argnums=(0, 1, 2)))(q, k, v)

    def single(q, k, v):
        return jnp.sum(stlib.video_attention(q, k, v, GRID, mask, impl="reference") * ct)

    want = jax.grad(single, argnums=(0, 1, 2))(q, k, v)
    for name, g, w in zip("qkv", got, want):
        scale = float(jnp.max(jnp.abs(w)))
        assert scale > 0, name
        assert float(jnp.max(jnp.abs(g - w))) <= 1e-4 * scale, f"d{name}"


@pytest.mark.parametrize(
    ("impl", "mask_name"),
    [
        *(("xla", name) for name in ("per-head SVG mix", "frame causal", "dense")),
        (by_role(Role.TILE).name, "frame causal"),  # a Pallas kernel a block, idle devices skipped
        (by_role(Role.BEST_TILE).name, "per-head SVG mix"),  # one kernel for every hop (shared_kernel)
        (by_role(Role.BEST_TILE).name, "frame causal"),
    ],
)
def test_the_ring_equals_single_device_attention_gradients_included(impl, mask_name):
    mask = {"per-head SVG mix": _svg_mix(), "frame causal": masks.frame_causal(GRID), "dense": None}[
        mask_name
    ]
    q, k, v = qkv(0, HEADS, GRID.num_tokens, 32)
    fn = _ring(mask, impl)
    out = jax.jit(fn)(q, k, v)
    assert out.sharding.is_equivalent_to(NamedSharding(_mesh(), P(None, "x", None)), 3)
    want = stlib.video_attention(q, k, v, GRID, mask, impl="reference")
    assert_close(out, want, TOL)
    _check_gradients(fn, mask, q, k, v)


@pytest.mark.parametrize(
    ("impl", "mask_name"),
    [
        ("xla", "per-head SVG mix"),
        (by_role(Role.BEST_TILE).name, "per-head SVG mix"),
    ],
)
def test_ulysses_ring_on_a_2x2_mesh_equals_single_device_attention(impl, mask_name):
    """All-to-all over the first axis (2 head slices), a ring of 2 over the second, 4 heads; the
    best tile kernel runs every hop of both rings through one kernel (``stlib.ring.shared_kernel``:
    the blocks' heads and offsets in the whole mask as data)."""
    mix = masks.per_head([*_svg_mix().masks, masks.spatial(GRID, 1)])
    mask = {"per-head SVG mix": mix, "frame causal": masks.frame_causal(GRID)}[mask_name]
    mesh = jax.make_mesh((2, 2), ("u", "r"))
    blocks = {} if impl == "xla" else {"block_q": 128, "block_kv": 128}
    q, k, v = qkv(3, 4, GRID.num_tokens, 32)

    def fn(q, k, v):
        return parallel_attention(
            q, k, v, mask, mesh=mesh, axis_name=("u", "r"), strategy="ulysses-ring", impl=impl, **blocks
        )

    out = jax.jit(fn)(q, k, v)
    assert out.sharding.is_equivalent_to(NamedSharding(mesh, P(None, ("r", "u"), None)), 3)
    assert_close(out, stlib.video_attention(q, k, v, GRID, mask, impl="reference"), TOL)
    _check_gradients(fn, mask, q, k, v)


def test_a_routed_plan_rides_the_ring_as_its_exact_masks_head_by_head():
    """Heads of a routed SVG plan (spatial, temporal, spatial) keep their own masks on the ring: the
    plan's exact masks in raster order; an EXACT plan's ring equals the plan run on one device."""
    plan = svg_plan(
        GRID, ["spatial", "temporal", "spatial"], 0.3, block_q=128, block_kv=128, boundary="exact"
    )
    q, k, v = qkv(4, HEADS, GRID.num_tokens, 32)
    out = parallel_attention(q, k, v, plan=plan, mesh=_mesh(), axis_name="x", strategy="ring", impl="xla")
    assert_close(out, plan.run(q, k, v, impl="reference"), TOL)
    assert_close(out, stlib.attention(q, k, v, plan_mask(plan), impl="reference"), TOL)
    with pytest.raises(ValueError, match="the plan has 3 heads but q has 2"):
        parallel_attention(q[:2], k[:2], v[:2], plan=plan, mesh=_mesh(), axis_name="x", strategy="ring")


def test_the_shared_kernel_stacks_each_issued_block_once_with_its_offsets():
    """The stack of a 2 x 2 Ulysses x ring over the per-head mix: every issued (hop, device) block is
    in it once (devices whose blocks allow the same pairs share one), head b * 2 + h of the stack is
    head h of block b, at the offsets in the whole mask of its group's heads and devices' shards;
    idle devices get -1."""
    from stlib.ring import ring_call, shared_kernel

    mix = masks.per_head([*_svg_mix().masks, masks.spatial(GRID, 1)])
    slices = [stlib.parallel.head_slice(mix, g * 2, (g + 1) * 2) for g in range(2)]
    hops = ring_hops(slices, 2)
    kernel = by_role(Role.BEST_TILE)
    call = ring_call(kernel, 32, {"block_q": 128, "block_kv": 128, "interpret": True})
    shared = shared_kernel(kernel, call, hops, mix, 2, 2)
    stack, size = shared.stack, GRID.num_tokens // 2
    issued = [
        (n, flat)
        for n, hop in enumerate(hops)
        for flat in range(4)
        if hop.branches[hop.branch_of_device[flat]]
    ]
    assert {shared.positions[n][flat] for n, flat in issued} == set(range(stack.num_blocks))
    for n, flat in issued:
        hop = hops[n]
        block = shared.positions[n][flat]
        # the block's offsets are those of the first device with its pairs (devices alike share one)
        group, device = divmod(hop.branch_of_device.index(hop.branch_of_device[flat]), 2)
        assert tuple(stack.offsets[block]) == (2 * group, device * size, (device - hop.offset) % 2 * size)
        for h in range(2):
            want = hop.branches[hop.branch_of_device[flat]].head(h).to_dense()
            assert np.array_equal(stack.head(2 * block + h).to_dense(), want)
    idle = [
        (n, flat)
        for n, hop in enumerate(hops)
        for flat in range(4)
        if not hop.branches[hop.branch_of_device[flat]]
    ]
    assert all(shared.positions[n][flat] == -1 for n, flat in idle)


@pytest.mark.parametrize(
    "base",
    [
        pytest.param("mix", id="per-head mix, 3 heads a block"),
        pytest.param("spatial", id="head-uniform spatial, an empty block"),
    ],
)
def test_each_block_of_a_stack_trains_through_one_kernel_as_the_reference(base):
    """The best tile kernel's stacked forward and backward (one jitted function, the block traced)
    give each block of a ``StackedBlocks`` the reference's output and gradients on that block's own
    mask: blocks of 256 tokens at four offsets, their backward grids padded to the same rows (the
    padding rows idle); a block that allows nothing (spatial, keys of the next frames) has no worked
    row and gives zeros."""
    from stlib.masks import StackedBlocks
    from stlib.reference import reference_attention_lse, reference_gradients
    from stlib.ring import ring_call

    mask = {"mix": _svg_mix(), "spatial": masks.spatial(GRID)}[base]
    heads, size = 3, 256
    starts = [(0, 0, 0), (0, 256, 0), (0, 0, 256), (0, 256, 256)]
    stack = StackedBlocks(mask, starts, size, heads if mask.num_heads else 1)
    kernel = by_role(Role.BEST_TILE)
    call = ring_call(kernel, 32, {"block_q": 128, "block_kv": 128, "interpret": True})
    config = kernel.kernel_call(stack, size, **call)

    @jax.jit
    def run(q, k, v, do, block):
        o, lse = kernel.stack_forward(q, k, v, stack, block, **config)
        return o, lse, kernel.backward.stack_backward((q, k, v, o, lse), do, stack, block, **config)

    q, k, v = qkv(6, heads, size, 32)
    do = jax.random.normal(jax.random.key(7), q.shape)
    empty = []
    for b in range(stack.num_blocks):
        views = [stack.head(b * stack.heads + h) for h in range(stack.heads)]
        dense = np.stack([view.to_dense() for view in views]) if mask.num_heads else views[0].to_dense()
        empty.append(not dense.any())
        o, lse, grads = run(q, k, v, do, jnp.int32(b))
        want_o, want_lse = reference_attention_lse(q, k, v, dense, call["scale"])
        assert_close(o, want_o, TOL)
        want_lse = want_lse[..., 0]  # rows that see nothing: -inf in both
        assert np.array_equal(np.isneginf(lse), np.isneginf(want_lse))
        assert_close(jnp.where(jnp.isinf(lse), 0, lse), jnp.where(jnp.isinf(want_lse), 0, want_lse), TOL)
        want = reference_gradients(q, k, v, want_o, want_lse[..., None], do, dense, call["scale"])
        for g, w in zip(grads, want, strict=True):
            assert_close(g, w, 1e-4 * max(float(jnp.max(jnp.abs(w))), 1.0))
    assert empty == ([False] * 4 if base == "mix" else [False, True, True, False])


def test_a_mask_without_a_predicate_rides_the_shared_kernel_by_its_tile_table():
    """A mask the kernel cannot evaluate from indices (an array): the shared forward reads each
    block's MASKED tiles from the stack's table of tile masks (each device's rows of its index)."""
    allowed = np.random.default_rng(0).random((GRID.num_tokens, GRID.num_tokens)) < 0.3
    mask = masks.from_array(allowed)
    assert not mask.traceable
    q, k, v = qkv(4, 2, GRID.num_tokens, 32)
    out = jax.jit(_ring(mask, by_role(Role.BEST_TILE).name))(q, k, v)
    assert_close(out, stlib.attention(q, k, v, mask, impl="reference"), TOL)


def test_a_batch_axis_and_bad_data_go_through_the_ring():
    """[B, H, L, D] under the ring; a NaN in one key reaches exactly the rows that see it."""
    mask = masks.spatial(GRID)
    q, k, v = qkv(1, HEADS, GRID.num_tokens, 32)
    k = k.at[1, 5].set(jnp.nan)  # head 1, key 5: frame 0, seen by frame 0's queries only
    out = _ring(mask, "xla")(q[None], k[None], v[None])[0]
    bad = np.asarray(jnp.isnan(out).any(axis=-1))
    assert bad[1, :128].all() and not bad[1, 128:].any() and not bad[[0, 2]].any()
    rows = ~bad
    want = stlib.attention(q, k, v, mask, impl="reference")
    assert_close(jnp.where(rows[..., None], out, 0), jnp.where(rows[..., None], want, 0), TOL)


def test_hops_no_device_needs_are_not_issued():
    """Same-frame keys (one frame per device): hop 0 only; a band narrower than a shard: the shard
    itself and its two neighbours; frame-causal: every hop, each device's later shards left idle."""
    assert [hop.offset for hop in ring_hops(masks.spatial(GRID), 4)] == [0]
    assert [hop.offset for hop in ring_hops(masks.band(GRID.num_tokens, 64), 4)] == [0, 1, 3]
    causal = ring_hops(masks.frame_causal(GRID), 4)
    assert [hop.offset for hop in causal] == [0, 1, 2, 3]
    # hop 1: device 0 would attend device 3's later frames, which it cannot see: no kernel there
    assert causal[1].branches[causal[1].branch_of_device[0]] is None
    assert all(b is not None for b in (causal[1].branches[causal[1].branch_of_device[d]] for d in (1, 2, 3)))
    # devices whose blocks allow the same pairs share one compiled branch
    assert len(ring_hops(masks.full(GRID.num_tokens), 4)[1].branches) == 1


def test_the_compiled_program_issues_only_the_transfers_the_mask_needs():
    mesh = _mesh()
    shape = jax.ShapeDtypeStruct(
        (HEADS, GRID.num_tokens, 32), jnp.float32, sharding=NamedSharding(mesh, P(None, "x", None))
    )
    counts = {}
    for name, mask in {"spatial": masks.spatial(GRID), "band": masks.band(512, 64), "dense": None}.items():
        text = jax.jit(_ring(mask, "xla", mesh)).lower(shape, shape, shape).compile().as_text()
        counts[name] = len(PERMUTE.findall(text))
    assert counts == {"spatial": 0, "band": 4, "dense": 6}  # k and v per issued hop past the first


def test_a_ring_compiles_for_a_v6e_slice():
    """Deviceless: 5 heads (not a multiple of 4) x 2,048 tokens x 128 bf16, a per-head spatial /
    temporal mask, the best tile kernel, forward and gradient on v6e:2x2."""
    from jax.experimental import topologies

    topology = topologies.get_topology_desc(platform="tpu", topology_name="v6e:2x2")
    mesh = Mesh(np.array(topology.devices), ("x",))
    grid = stlib.VideoGrid(4, 16, 32)
    mask = masks.per_head([masks.spatial(grid)] * 2 + [masks.temporal(grid, 1)] * 3)
    spec = NamedSharding(mesh, P(None, "x", None))
    shape = jax.ShapeDtypeStruct((5, grid.num_tokens, 128), jnp.bfloat16, sharding=spec)
    kernel = by_role(Role.BEST_TILE)

    def fn(q, k, v):
        return parallel_attention(q, k, v, mask, mesh=mesh, axis_name="x", strategy="ring", impl=kernel.name)

    compiled = jax.jit(fn).lower(shape, shape, shape).compile()
    text = compiled.as_text()
    assert compiled.memory_analysis().argument_size_in_bytes == 3 * 5 * grid.num_tokens * 128 * 2 // 4
    assert len(PERMUTE.findall(text)) == 6  # the temporal heads need every hop
    assert permutes_ahead(text) == (6, 6)  # every transfer under way before the first kernel
    assert any(name in text for name in kernel.estimator.kernel_names)
    # every hop's forward through one kernel (stlib.ring.shared_kernel): a call a hop and one body,
    # what libtpu compiles, for the 16 distinct (hop, device) blocks (the temporal heads' all differ)
    blocks = {branch for hop in ring_hops(mask, 4) for branch in hop.branches if branch is not None}
    assert len(blocks) == 16 and kernel_bodies(text) == (4, 1)
    # the training step: one backward body too, for the same 16 blocks (each device's rows of the
    # backward kernel's tables and its block's offsets as data: Backward.stack_backward)

    def loss(q, k, v):
        out = parallel_attention(q, k, v, mask, mesh=mesh, axis_name="x", strategy="ring", impl=kernel.name)
        return out.astype(jnp.float32).sum()

    grad_text = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(shape, shape, shape).compile().as_text()
    # k, v out on the three hops past the first (the backward reuses the forward's transfers), dk,
    # dv back from them; a forward and a backward call a hop, one body each
    assert len(PERMUTE.findall(grad_text)) == 3 * 2 + 3 * 2 and kernel_bodies(grad_text) == (8, 2)


def test_a_ulysses_ring_compiles_for_a_2x2_v6e_mesh():
    """Deviceless: 4 heads x 2,048 tokens x 128 bf16 on v6e:2x2 as (Ulysses 2) x (ring 2), the best
    tile kernel: each device holds a quarter of q, k, v; four all-to-alls (q, k, v in, o out) of a
    device's share, and k and v once around the ring."""
    from jax.experimental import topologies

    topology = topologies.get_topology_desc(platform="tpu", topology_name="v6e:2x2")
    mesh = Mesh(np.array(topology.devices).reshape(2, 2), ("u", "r"))
    grid = stlib.VideoGrid(4, 16, 32)
    mask = masks.per_head([masks.spatial(grid)] * 2 + [masks.temporal(grid, 1)] * 2)
    shape = jax.ShapeDtypeStruct(
        (4, grid.num_tokens, 128), jnp.bfloat16, sharding=NamedSharding(mesh, P(None, ("r", "u"), None))
    )

    def fn(q, k, v):
        return parallel_attention(q, k, v, mask, mesh=mesh, axis_name=("u", "r"), strategy="ulysses-ring")

    compiled = jax.jit(fn).lower(shape, shape, shape).compile()
    text = compiled.as_text()
    share = 4 * grid.num_tokens * 128 * 2 // 4
    assert compiled.memory_analysis().argument_size_in_bytes == 3 * share
    assert all_to_all_bytes(text) == [share] * 4
    assert permute_bytes(text) == [2 * grid.num_tokens // 2 * 128 * 2] * 2  # 2 heads x L / 2 of k, of v
    assert any(name in text for name in by_role(Role.BEST_TILE).estimator.kernel_names)


def test_bad_ring_calls_are_refused_by_name():
    q, k, v = qkv(2, HEADS, GRID.num_tokens, 32)
    call = {"mesh": _mesh(), "axis_name": "x", "strategy": "ring"}
    with pytest.raises(ValueError, match="L=510 tokens do not divide over the 4 devices"):
        parallel_attention(q[:, :510], k[:, :510], v[:, :510], **call)
    with pytest.raises(
        ValueError, match="strategy='ring' takes the mask in the order the tokens are sharded"
    ):
        parallel_attention(q, k, v, masks.spatial(GRID), grid=GRID, **call)
    with pytest.raises(ValueError, match="impl='splash' has none"):
        parallel_attention(q, k, v, masks.spatial(GRID), impl="splash", **call)
    with pytest.raises(TypeError, match="strategy='ring' takes no keyword"):
        parallel_attention(q, k, v, masks.spatial(GRID), impl="xla", allow_slow_interpret=True, **call)
    two = {"mesh": jax.make_mesh((2, 2), ("u", "r")), "strategy": "ulysses-ring"}
    with pytest.raises(ValueError, match="axis_name=\\(ulysses_axis, ring_axis\\)"):
        parallel_attention(q, k, v, axis_name="u", **two)
    with pytest.raises(TypeError, match="a pair of axes only for strategy='ulysses-ring'"):
        parallel_attention(q, k, v, mesh=two["mesh"], axis_name=("u", "r"), strategy="ring")
    with pytest.raises(
        ValueError, match="H=3 heads do not divide over the 2 devices of the Ulysses axis 'u'"
    ):
        parallel_attention(q, k, v, axis_name=("u", "r"), **two)
    with pytest.raises(ValueError, match="axis_name='t' is not an axis of the mesh"):
        parallel_attention(q[:2], k[:2], v[:2], axis_name=("u", "t"), **two)


def test_a_zigzag_order_balances_a_frame_causal_ring_and_runs_equal_to_one_device():
    """A frame-causal mask split contiguously gives device d d + 1 frames of work (4x spread on 4
    devices); ``balanced_order`` picks the zig-zag (each device 2 frames, equal steps), and the ring in
    that order equals one device, gradients included; a striped order is also exact."""
    from stlib.geometry import shard_order
    from stlib.ring import balanced_order, device_steps

    grid = stlib.VideoGrid(8, 8, 16)  # 8 frames of 128 tokens, 2 per device
    mask = masks.frame_causal(grid)
    frame = grid.tokens_per_frame
    assert device_steps(mask, 4, 128, 128).tolist() == [3, 7, 11, 15]
    order, steps = balanced_order(mask, 4, unit=frame, block_q=128, block_kv=128)
    assert order == shard_order(grid.num_tokens, 4, "zigzag", frame)
    assert steps["zigzag"].tolist() == [9, 9, 9, 9] and steps["contiguous"].max() == 15
    q, k, v = qkv(7, 2, grid.num_tokens, 32)
    want = stlib.attention(q, k, v, mask, impl="reference")
    for chosen in (order, shard_order(grid.num_tokens, 4, "striped", frame)):

        def fn(q, k, v, chosen=chosen):
            return parallel_attention(
                q, k, v, mask, mesh=_mesh(), axis_name="x", strategy="ring", impl="xla", shard_order=chosen
            )

        assert_close(jax.jit(fn)(q, k, v), want, TOL)
    ct = jax.random.normal(jax.random.key(2), q.shape)
    got = jax.jit(jax.grad(lambda *a: jnp.sum(fn(*a) * ct), argnums=(0, 1, 2)))(q, k, v)
    ref = jax.grad(lambda *a: jnp.sum(stlib.attention(*a, mask, impl="reference") * ct), argnums=(0, 1, 2))(
        q, k, v
    )
    for g, w in zip(got, ref):
        assert float(jnp.max(jnp.abs(g - w))) <= 1e-4 * float(jnp.max(jnp.abs(w)))
    with pytest.raises(ValueError, match="shard_order is for the ring strategies"):
        parallel_attention(q, k, v, mask, mesh=_mesh(), axis_name="x", strategy="ulysses", shard_order=order)
    with pytest.raises(ValueError, match="unit=100 tokens that divide over the 4 devices"):
        shard_order(grid.num_tokens, 4, "zigzag", 100)


def test_the_ring_reads_a_permuted_mask_past_the_dense_limit():
    """A block of a permuted mask over shards longer than DENSE_LIMIT is told empty or not from its
    tile counts (no dense read): the hops of a tiled sliding-tile mask at 4 x 20,160 tokens."""
    from stlib.geometry import tiled_order

    grid = stlib.VideoGrid(21, 45, 80)
    tile = (3, 8, 16)
    permuted = masks.sliding_tile(grid, tile, (3, 3, 3)).permute(tiled_order(grid, tile))
    hops = ring_hops(permuted, 4)
    assert permuted.length // 4 > masks.DENSE_LIMIT
    assert [hop.offset for hop in hops] == [0, 1, 3]  # a shard sees its neighbours' boundary frames


def test_shared_kernel_false_runs_a_kernel_a_block_with_the_same_output():
    """``shared_kernel=False``: the best tile kernel's ring runs each (hop, device) block on its own
    step plan (a ``lax.switch`` branch a block) and gives the shared kernel's output; other strategies
    refuse the keyword."""
    mask = _svg_mix()
    q, k, v = qkv(8, HEADS, GRID.num_tokens, 32)
    name = by_role(Role.BEST_TILE).name

    def fn(q, k, v, shared):
        return parallel_attention(
            q, k, v, mask, mesh=_mesh(), axis_name="x", strategy="ring", impl=name, shared_kernel=shared,
            block_q=128, block_kv=128,
        )  # fmt: skip

    own, shared = jax.jit(partial(fn, shared=False)), jax.jit(partial(fn, shared=True))
    hops = ring_hops(mask, 4)
    calls = {
        s: str(jax.make_jaxpr(f)(q, k, v)).count("pallas_call[") for s, f in ((False, own), (True, shared))
    }
    # a kernel call a distinct block of each hop, against one a hop (one body for all)
    assert calls == {
        False: sum(len([b for b in hop.branches if b is not None]) for hop in hops),
        True: len(hops),
    }
    assert calls[False] > calls[True]
    assert_close(own(q, k, v), shared(q, k, v), TOL)
    with pytest.raises(ValueError, match="shared_kernel is for the ring strategies"):
        parallel_attention(q, k, v, mask, mesh=_mesh(), axis_name="x", strategy="heads", shared_kernel=False)
