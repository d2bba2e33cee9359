"""The contract every registered implementation keeps (``stlib.registry.IMPLEMENTATIONS``: a new
kernel is picked up here with no edit), after tokamax's ``attention/test_base.py``: one set of cases,
each run on every implementation, what a case does decided by the implementation's registry entry
(``capabilities``, ``config``, ``plan_runner``, ``is_pallas``), never by its name. Gradients:
``tests/test_gradients.py``.

Small shapes in interpret mode on CPU (L = 300, ragged against every block; H 2-3; D 128 or 64;
32 x 128 tiles, 128 x 128 where an implementation takes no smaller: ``_kernels.small_blocks``).
Tolerances: ``stlib.checks.tolerance`` of the inputs' dtype, errors ``stlib.checks.scaled_error``
(``_kernels.assert_close``).
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _kernels import assert_close, mixed_tile_mask, small_blocks

import stlib
from stlib import checks, masks, registry
from stlib.routing import svg_plan

IMPLS = sorted(registry.IMPLEMENTATIONS)
LENGTH = 300  # no block size divides it
DTYPES = [jnp.float32, jnp.bfloat16]
DTYPE_IDS = ["f32", "bf16"]


# --------------------------------------------------------------------------------------------
# the output


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("impl", IMPLS)
def test_random_per_head_mask_at_ragged_length_equals_reference(impl, dtype):
    """EMPTY, FULL and PARTIAL tiles per head, an all-empty head and rows that see nothing: equal to
    impl="reference", and every row the mask leaves empty exactly zero."""
    rng = np.random.default_rng(7)
    mask = mixed_tile_mask(rng, 3, LENGTH, 32, 128)
    kinds = stlib.block_layout(mask, 32, 128).kinds
    assert {int(k) for k in np.unique(kinds)} == {0, 1, 2}  # the test really mixes all tile kinds
    q, k, v = stlib.random_qkv((3, LENGTH, 128), dtype, seed=1)
    block_q, block_kv = small_blocks(impl, mask, LENGTH)
    ref = stlib.attention(q, k, v, mask, impl="reference")
    out = stlib.attention(q, k, v, mask, impl=impl, block_q=block_q, block_kv=block_kv)
    assert_close(out, ref, checks.tolerance(dtype), mask=mask)  # the empty head and rows 3..6 included


@pytest.mark.parametrize("impl", IMPLS)
def test_jit_takes_the_mask_as_an_argument(impl):
    """Masks are static pytrees: ``jax.jit`` of a function of (q, k, v, mask) runs every
    implementation, equal to the reference, and traces again only for a mask of another value."""
    traces = []

    def call(q, k, v, mask):
        traces.append(mask)
        block_q, block_kv = small_blocks(impl, mask, LENGTH)
        return stlib.attention(q, k, v, mask, impl=impl, block_q=block_q, block_kv=block_kv)

    q, k, v = stlib.random_qkv((2, LENGTH, 128), jnp.float32, seed=3)
    band = masks.band(LENGTH, 40)
    jitted = jax.jit(call)
    out = jitted(q, k, v, band)
    assert_close(
        out, stlib.attention(q, k, v, band, impl="reference"), checks.tolerance(jnp.float32), mask=band
    )
    jitted(q, k, v, masks.band(LENGTH, 40))  # an equal mask, another object: no new trace
    assert len(traces) == 1
    jitted(q, k, v, masks.band(LENGTH, 41))
    assert len(traces) == 2


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("impl", IMPLS)
def test_mask_with_no_pair_gives_zeros(impl, dtype):
    """Nothing to compute (every tile EMPTY): zeros in q's dtype, never NaN."""
    mask = masks.from_array(np.zeros((LENGTH, LENGTH), bool))
    q, k, v = stlib.random_qkv((2, LENGTH, 128), dtype, seed=0)
    block_q, block_kv = small_blocks(impl, mask, LENGTH)
    out = stlib.attention(q, k, v, mask, impl=impl, block_q=block_q, block_kv=block_kv)
    assert_close(out, jnp.zeros_like(q), 0.0, mask=mask)


# --------------------------------------------------------------------------------------------
# capabilities


@pytest.mark.parametrize("impl", IMPLS)
def test_shared_kv_heads_and_own_v_head_dim_run_or_are_refused(impl):
    """What ``capabilities`` allows runs through ``implementation.forward`` (``stlib.attention``
    takes equal shapes only; stlib.analysis.dump calls the forward the same way) and equals the
    reference on k, v repeated per q head (v's columns: a slice of a D-wide v); what it does not
    allow ``check_supports`` refuses with ValueError naming the implementation."""
    implementation = registry.get(impl)
    caps = implementation.capabilities
    for flag, allowed in (("shared_kv_heads", caps.shared_kv_heads), ("head_dim_v", caps.head_dim_v)):
        assert implementation.supports(**{flag: True}) == allowed
        if not allowed:
            with pytest.raises(ValueError, match=re.escape(f"impl={impl!r}")):
                implementation.check_supports(**{flag: True})
    if not (caps.shared_kv_heads or caps.head_dim_v):
        return
    heads, dim = 2, 128
    kv_heads = 1 if caps.shared_kv_heads else heads
    dim_v = 64 if caps.head_dim_v else dim
    implementation.check_supports(shared_kv_heads=kv_heads != heads, head_dim_v=dim_v != dim)
    mask = mixed_tile_mask(np.random.default_rng(3), heads, LENGTH, 32, 128)
    q, _, _ = stlib.random_qkv((heads, LENGTH, dim), jnp.float32, seed=2)
    _, k, v = stlib.random_qkv((kv_heads, LENGTH, dim), jnp.float32, seed=3)
    block_q, block_kv = small_blocks(impl, mask, LENGTH)
    call = implementation.kernel_call(mask, LENGTH, scale=dim**-0.5, block_q=block_q, block_kv=block_kv)
    out = implementation.forward(q, k, v[..., :dim_v], mask, **call)
    group = heads // kv_heads  # q head h reads kv head h // group
    k_rep, v_rep = jnp.repeat(k, group, axis=0), jnp.repeat(v, group, axis=0)
    ref = stlib.attention(q, k_rep, v_rep, mask, impl="reference")[..., :dim_v]
    assert_close(out, ref, checks.tolerance(jnp.float32), mask=mask)


@pytest.mark.parametrize("impl", IMPLS)
def test_config_blocks_are_the_blocks_the_forward_runs(impl):
    """``config``: blocks on the TPU tiling (block_q a multiple of 8, block_kv and the chunk of 128,
    the chunk dividing block_kv) for a Pallas kernel, xla's own tiles, all None for the reference; explicit blocks kept as
    given; and the forward with the config's blocks and options passed explicitly is the forward
    with none passed, bit for bit."""
    implementation = registry.get(impl)
    mask = masks.per_head([masks.band(LENGTH, 40), masks.full(LENGTH)])
    config = implementation.config(mask, LENGTH)
    assert isinstance(config.options, implementation.options_type)
    if implementation.is_pallas:
        assert config.block_q % 8 == 0 and config.block_kv % 128 == 0, config
        chunk = config.block_kv_compute
        assert chunk is None or (chunk % 128 == 0 and config.block_kv % chunk == 0), config
        block_q, block_kv = small_blocks(impl, mask, LENGTH)
        explicit = implementation.config(mask, LENGTH, block_q, block_kv)
        assert (explicit.block_q, explicit.block_kv) == (block_q, block_kv)
    elif implementation.resolve is not None:  # a plain-JAX op with tiles of its own (xla)
        assert config.block_q > 0 and config.block_kv > 0 and config.block_kv_compute is None, config
        assert (implementation.config(mask, LENGTH, 64, 128).block_q, config.block_q) == (64, 128)
    else:
        assert config.blocks() == {"block_q": None, "block_kv": None, "block_kv_compute": None}
    q, k, v = stlib.random_qkv((2, LENGTH, 64), jnp.float32, seed=4)
    out = stlib.attention(q, k, v, mask, impl=impl)
    pinned = stlib.attention(
        q, k, v, mask, impl=impl, block_q=config.block_q, block_kv=config.block_kv, options=config.options
    )
    np.testing.assert_array_equal(np.asarray(pinned), np.asarray(out))
    assert_close(out, stlib.attention(q, k, v, mask, impl="reference"), checks.tolerance(jnp.float32))


#: A mask above DENSE_LIMIT with no lazy Splash form (18,000 tokens), traced only (eval_shape).
BIG_GRID = stlib.VideoGrid(5, 60, 60)


@pytest.mark.parametrize("impl", IMPLS)
def test_mask_support_decides_what_attention_accepts(impl):
    """A mask ``unsupported(mask=...)`` refuses (Splash: rows without key intervals above DENSE_LIMIT; reference:
    L x L scores above it; xla: too many masked tiles to tabulate) is
    refused by ``stlib.attention`` with ValueError giving the same reason, before any kernel runs;
    a mask it accepts traces."""
    mask = masks.sliding_tile(BIG_GRID, tile=(1, 6, 6), window=(3, 3, 3))
    assert mask.length > masks.DENSE_LIMIT
    shape = jax.ShapeDtypeStruct((1, BIG_GRID.num_tokens, 128), jnp.bfloat16)
    reason = registry.get(impl).unsupported(mask=mask)

    def call(q, k, v):
        return stlib.attention(q, k, v, mask, impl=impl)

    if reason is not None:
        with pytest.raises(ValueError, match=re.escape(reason)):
            jax.eval_shape(call, shape, shape, shape)
    else:
        assert jax.eval_shape(call, shape, shape, shape).shape == shape.shape


# --------------------------------------------------------------------------------------------
# routed plans and gradients


@pytest.mark.parametrize("boundary", ["balanced", "exact"])
@pytest.mark.parametrize("impl", IMPLS)
def test_routed_plan_equals_reference(impl, boundary):
    """A small routed plan (one spatial, one temporal head, each in its own token order) through
    ``video_attention(plan=...)``: the implementation's ``plan_runner`` on the plan's own layout
    where it has one, else ``stlib.attention`` on ``plan.mask``; equal to the reference on
    ``plan.mask`` (what the plan computes after rounding) either way."""
    grid = stlib.VideoGrid(3, 6, 17)  # 306 tokens: ragged against the plan's 128 x 128 tiles
    plan = svg_plan(grid, ["spatial", "temporal"], 0.25, block_q=128, block_kv=128, boundary=boundary)
    q, k, v = stlib.random_qkv((2, grid.num_tokens, 64), jnp.float32, seed=5)
    out = stlib.video_attention(q, k, v, grid, plan=plan, impl=impl)
    ref = stlib.attention(q, k, v, plan.mask, impl="reference")
    assert_close(out, ref, checks.tolerance(jnp.float32), mask=plan.mask)


def test_jit_of_the_entry_points_themselves():
    """``jax.jit(stlib.attention)(q, k, v, mask)`` and ``jax.jit(stlib.video_attention)(q, k, v, grid,
    mask)`` as a user writes them: no static_argnums, no closure."""
    grid = stlib.VideoGrid(3, 4, 6)
    mask = masks.sliding_tile(grid, tile=(1, 2, 2), window=(3, 1, 3))
    q, k, v = stlib.random_qkv((2, grid.num_tokens, 64), jnp.float32, seed=5)
    ref = stlib.attention(q, k, v, mask, impl="reference")
    assert_close(jax.jit(stlib.attention)(q, k, v, mask), ref, 1e-5, mask=mask)
    assert_close(jax.jit(stlib.video_attention)(q, k, v, grid, mask), ref, 1e-5, mask=mask)


def test_interpret_mode_past_a_few_minutes_is_refused_unless_asked(monkeypatch):
    """Off a TPU a Pallas kernel over more than INTERPRET_PAIR_LIMIT pairs is refused in one sentence
    (the README's case-study call ran for minutes with no output); ``allow_slow_interpret`` runs it."""
    from stlib import api

    q = jnp.zeros((4, 32_769, 8), jnp.float32)
    with pytest.raises(
        ValueError, match=r"interpret mode .* 4 heads x 32,769 tokens .* allow_slow_interpret=True"
    ):
        stlib.attention(q, q, q, impl="pallas_dense")
    monkeypatch.setattr(api, "INTERPRET_PAIR_LIMIT", 2 * LENGTH**2 - 1)
    q, k, v = stlib.random_qkv((2, LENGTH, 128), jnp.float32, seed=2)
    with pytest.raises(ValueError, match="INTERPRET_PAIR_LIMIT"):
        stlib.attention(q, k, v, impl="pallas_dense")
    stlib.attention(q, k, v, impl="xla")  # compiled for the CPU: no limit
    out = stlib.attention(q, k, v, impl="pallas_dense", allow_slow_interpret=True)
    assert_close(out, stlib.attention(q, k, v, impl="reference"), checks.tolerance(jnp.float32))
    one = jnp.zeros((1, 2, LENGTH, 8), jnp.float32)  # each batch element under the limit, all over it
    stlib.attention(one[0, :1], one[0, :1], one[0, :1], impl="pallas_dense")
    pair = jnp.zeros((2, 1, LENGTH, 8), jnp.float32)
    with pytest.raises(ValueError, match=r"over 2 batch elements x 1 heads x"):
        stlib.attention(pair, pair, pair, impl="pallas_dense")


@pytest.mark.parametrize("impl", IMPLS)
def test_jit_with_batch_axes_and_grouped_kv_heads_equals_the_reference(impl):
    """q [B, H, L, D] with k, v [B, H / 2, L, D] under jax.jit, the mask an argument: equal to the
    reference on each batch element with every kv head repeated for its two q heads; gradients too."""
    mask = masks.band(LENGTH, 40)
    keys = jax.random.split(jax.random.key(11), 3)
    q = jax.random.normal(keys[0], (2, 4, LENGTH, 64))
    k, v = (jax.random.normal(key, (2, 2, LENGTH, 64)) for key in keys[1:])
    block_q, block_kv = small_blocks(impl, mask, LENGTH)

    @jax.jit
    def run(q, k, v, mask):
        return stlib.attention(q, k, v, mask, impl=impl, block_q=block_q, block_kv=block_kv)

    @jax.jit  # one program, not every op dispatched on its own
    def reference(q, k, v):
        return jnp.stack(
            [
                stlib.attention(q[b], jnp.repeat(k[b], 2, 0), jnp.repeat(v[b], 2, 0), mask, impl="reference")
                for b in range(2)
            ]
        )

    out, want = run(q, k, v, mask), reference(q, k, v)
    assert out.shape == q.shape
    for b in range(2):
        assert_close(out[b], want[b], checks.tolerance(jnp.float32), mask=mask)
    grads = jax.grad(lambda *x: run(*x, mask).sum(), argnums=(0, 1, 2))(q, k, v)
    expected = jax.grad(lambda *x: reference(*x).sum(), argnums=(0, 1, 2))(q, k, v)
    for got, want in zip(grads, expected):
        assert got.shape == want.shape
        assert checks.scaled_error(got, want) <= checks.tolerance(jnp.float32)


def test_a_flax_layout_without_a_mask_is_refused():
    x = jnp.zeros((64, 8, 16))  # [L, H, D] as flax holds it, read as H = 64 heads of 8 tokens
    with pytest.raises(ValueError, match=r"looks like flax's \[..., L, H, D\].*stlib.attention_fn"):
        stlib.attention(x, x, x)
    with pytest.raises(ValueError, match="must divide the 4 heads of q"):
        stlib.attention(jnp.zeros((4, 16, 8)), jnp.zeros((3, 16, 8)), jnp.zeros((3, 16, 8)))
