"""stlib inside a model: ``stlib.attention_fn`` keeps flax's ``attention_fn`` contract (flax's own
``nnx.MultiHeadAttention`` gives the same outputs and parameter gradients as with its default
attention and the same mask as an array), refuses what it cannot honour by name, and the Wan-style
block runs forward and backward, sharded over a 4-device CPU mesh as on one device."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _kernels import assert_close
from conftest import qkv
from flax import nnx
from jax.sharding import Mesh

import stlib
from stlib import checks, masks
from stlib.routing import svg_plan
from stlib.wan import WanBlock

GRID = stlib.VideoGrid(2, 8, 12)  # 192 tokens
HEADS, DIM = 4, 64
TOL = checks.tolerance(jnp.float32)


def _mix(grid=GRID):
    """Spatial and temporal heads; every query sees at least itself (no empty rows: flax's
    attention gives an empty row uniform weights, stlib zeros)."""
    return masks.per_head([masks.spatial(grid, 0), masks.temporal(grid, 1)] * (HEADS // 2))


def _relative_gap(got, want) -> float:
    """max |got - want| over every parameter's gradient, relative to the largest gradient entry (the
    key bias's gradient is zero up to rounding: softmax ignores a shift shared by every key)."""
    pairs = list(zip(jax.tree.leaves(got), jax.tree.leaves(want)))
    largest = max(float(jnp.max(jnp.abs(w))) for _, w in pairs)
    return max(float(jnp.max(jnp.abs(g - w))) for g, w in pairs) / largest


def test_flax_multi_head_attention_equals_its_default_attention_with_the_mask_as_an_array():
    mask = _mix()
    dense = jnp.broadcast_to(jnp.asarray(mask.to_dense()), (2, HEADS, GRID.num_tokens, GRID.num_tokens))
    assert bool(dense.any(axis=-1).all())
    x = jax.random.normal(jax.random.key(1), (2, GRID.num_tokens, DIM))

    def module(**kwargs):
        return nnx.MultiHeadAttention(HEADS, DIM, decode=False, rngs=nnx.Rngs(0), **kwargs)

    ours, flax_own = module(attention_fn=stlib.attention_fn(mask, grid=GRID)), module()
    out = nnx.jit(lambda m: m(x))(ours)
    assert_close(out, nnx.jit(lambda m: m(x, mask=dense))(flax_own), 1e-5)
    grads = nnx.jit(nnx.grad(lambda m: jnp.sum(m(x) ** 2)))(ours)
    want = nnx.jit(nnx.grad(lambda m: jnp.sum(m(x, mask=dense) ** 2)))(flax_own)
    assert _relative_gap(grads, want) <= 2e-3


def test_the_callable_takes_any_batch_dims_and_reorders_with_a_grid():
    mask = _mix()
    fn = stlib.attention_fn(mask, grid=GRID)
    q, k, v = qkv(0, HEADS, GRID.num_tokens, 16)
    ref = stlib.video_attention(q, k, v, GRID, mask, impl="reference")  # [H, L, D]
    as_flax = [x.transpose(1, 0, 2) for x in (q, k, v)]  # [L, H, D]
    assert_close(fn(*as_flax).transpose(1, 0, 2), ref, TOL)  # no batch dims
    batched = [jnp.stack([jnp.stack([x, 2 * x])] * 3) for x in as_flax]  # [3, 2, L, H, D]
    out = jax.jit(fn)(*batched)
    assert out.shape == batched[0].shape
    assert_close(out[2, 0].transpose(1, 0, 2), ref, TOL)
    doubled = stlib.video_attention(2 * q, 2 * k, 2 * v, GRID, mask, impl="reference")
    assert_close(out[1, 1].transpose(1, 0, 2), doubled, TOL)
    assert fn(*as_flax, dtype=jnp.bfloat16).dtype == jnp.bfloat16


def test_what_the_contract_cannot_honour_is_refused_by_name():
    fn = stlib.attention_fn(_mix(), grid=GRID)
    x = jnp.zeros((1, GRID.num_tokens, HEADS, 16))
    text = jnp.zeros((1, 24, HEADS, 16))
    cases = [
        ({"mask": jnp.ones((1, HEADS, 192, 192), bool)}, "flax mask array"),
        ({"bias": jnp.zeros((1, HEADS, 192, 192))}, "no attention bias"),
        ({"dropout_rate": 0.1, "deterministic": False}, r"dropout_rate=0.1 in training mode"),
        ({"is_causal": True}, "is_causal=True"),
        ({"module": object()}, "sow attention weights"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            fn(x, x, x, **kwargs)
    fn(x, x, x, dropout_rate=0.1, deterministic=True)  # inference: no dropout to apply
    with pytest.raises(ValueError, match=r"cross-attention \(Lq=192, Lkv=24\) with a sparse mask"):
        fn(x, text, text)
    with pytest.raises(ValueError, match="mesh and axis_name together"):
        stlib.attention_fn(mesh=Mesh(np.array(jax.devices()[:1]), ("x",)))
    with pytest.raises(TypeError, match="stlib mask"):
        stlib.attention_fn(np.ones((4, 4), bool))


def test_bad_keywords_are_refused_when_the_callable_is_built():
    """attention_fn refuses an unknown impl, keyword, option or block size at build time, in an error
    that names it (not Python's TypeError from stlib.attention at the first forward)."""
    with pytest.raises(
        ValueError,
        match=r"stlib.attention_fn\(\): impl='pallas-tile' is unknown \(did you mean 'pallas_tile'\?\)",
    ):
        stlib.attention_fn(_mix(), impl="pallas-tile")
    with pytest.raises(TypeError, match=r"stlib.attention_fn\(\) got unexpected keyword\(s\) \['blockq'\]"):
        stlib.attention_fn(_mix(), blockq=128)
    with pytest.raises(TypeError, match=r"\['orders'\]"):
        stlib.attention_fn(_mix(), orders=None)  # orders only with a grid or plan
    with pytest.raises(ValueError, match=r"stlib.attention_fn\(\): block_q=0 must be a positive int"):
        stlib.attention_fn(_mix(), block_q=0)
    with pytest.raises(TypeError, match=r"stlib.attention_fn\(\): .*no_such_option"):
        stlib.attention_fn(_mix(), impl="pallas_tile", options={"no_such_option": 1})
    stlib.attention_fn(_mix(), grid=GRID, impl="xla", orders=None, scale=0.5, block_q=128)  # all fine
    mesh = jax.make_mesh((1,), ("x",))  # a strategy, its axes and its inputs' order: checked at build too
    with pytest.raises(ValueError, match=r"stlib.attention_fn\(\): strategy='rign' must be one of"):
        stlib.attention_fn(_mix(), mesh=mesh, axis_name="x", strategy="rign")
    with pytest.raises(ValueError, match=r"stlib.attention_fn\(\): axis_name='y' is not an axis of the mesh"):
        stlib.attention_fn(_mix(), mesh=mesh, axis_name="y")
    with pytest.raises(
        ValueError, match=r"stlib.attention_fn\(\): strategy='ring' takes the mask in the order"
    ):
        stlib.attention_fn(_mix(), grid=GRID, mesh=mesh, axis_name="x", strategy="ring")
    stlib.attention_fn(_mix(), mesh=mesh, axis_name="x", strategy="ring", impl="xla")  # all fine


def test_a_routed_plan_runs_through_the_callable():
    plan = svg_plan(GRID, ["spatial", "temporal"] * (HEADS // 2), 0.3, block_q=128, block_kv=128)
    q, k, v = qkv(4, HEADS, GRID.num_tokens, 16)
    out = stlib.attention_fn(plan=plan)(*(x.transpose(1, 0, 2)[None] for x in (q, k, v)))
    assert_close(out[0].transpose(1, 0, 2), stlib.attention(q, k, v, plan.mask, impl="reference"), TOL)
    with pytest.raises(ValueError, match="mask has 2 heads but q has 4"):
        stlib.attention_fn(masks.per_head([masks.spatial(GRID, 0)] * 2))(
            *(x.transpose(1, 0, 2) for x in (q, k, v))
        )


def test_cross_attention_without_a_mask_runs_dense():
    q = jax.random.normal(jax.random.key(0), (2, 40, HEADS, 16))
    kv = jax.random.normal(jax.random.key(1), (2, 24, HEADS, 16))
    out = stlib.attention_fn()(q, kv, kv)
    s = jnp.einsum("bqhd,bkhd->bhqk", q, kv, precision="highest") / 4.0
    want = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, axis=-1), kv, precision="highest")
    assert_close(out, want, 1e-5)


def test_the_wan_block_runs_forward_and_backward_sharded_as_on_one_device():
    """Ulysses (the strategy with communication; tests/test_parallel.py covers both)."""
    strategy = "ulysses"
    mask = masks.sliding_tile(GRID, (1, 2, 4), (1, 3, 3))
    mesh = Mesh(np.array(jax.devices()[:4]), ("x",))
    sharded = stlib.attention_fn(mask, grid=GRID, mesh=mesh, axis_name="x", strategy=strategy)
    one_device = stlib.attention_fn(mask, grid=GRID, impl="reference")
    blocks = [
        WanBlock(DIM, HEADS, 128, self_attention_fn=fn, rngs=nnx.Rngs(0)) for fn in (sharded, one_device)
    ]
    x = jax.random.normal(jax.random.key(1), (2, GRID.num_tokens, DIM))
    text = jax.random.normal(jax.random.key(2), (2, 16, DIM))
    time_embedding = 0.1 * jax.random.normal(jax.random.key(3), (2, 6, DIM))

    def loss(block):  # the output rides along: one compiled program per block gives both
        out = block(x, text, time_embedding)
        return jnp.sum(out**2), out

    (grads, outs) = zip(*[nnx.jit(nnx.grad(loss, has_aux=True))(b) for b in blocks])
    assert outs[0].shape == x.shape
    assert_close(outs[0], outs[1], 1e-4)
    assert _relative_gap(grads[0], grads[1]) <= 2e-3
    with pytest.raises(ValueError, match="dim=60 must be a multiple of num_heads=8"):
        WanBlock(60, 8, 128, rngs=nnx.Rngs(0))


def test_the_wan_block_returns_its_dtype():
    from flax import nnx

    from stlib.wan import WanBlock

    x = jax.random.normal(jax.random.key(0), (1, GRID.num_tokens, 64), jnp.bfloat16)
    text = jax.random.normal(jax.random.key(1), (1, 24, 64), jnp.bfloat16)
    time_embedding = jax.random.normal(jax.random.key(2), (1, 6, 64), jnp.bfloat16)
    for dtype in (jnp.bfloat16, jnp.float32):
        block = WanBlock(64, HEADS, 128, rngs=nnx.Rngs(0), dtype=dtype)
        args = (x.astype(dtype), text.astype(dtype), time_embedding.astype(dtype))
        out = nnx.jit(lambda block, *args: block(*args))(block, *args)  # jit: one program, not op by op
        assert out.dtype == dtype and out.shape == x.shape and bool(jnp.isfinite(out).all())
