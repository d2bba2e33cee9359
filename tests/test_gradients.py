"""Gradients through every implementation: ``jax.grad`` and ``jax.jit(jax.grad(...))`` of
``stlib.attention`` equal the float64 analytic gradient on random per-head masks with empty rows,
keys no query sees and a ragged length (``stlib.checks``: the error relative to the largest gradient
entry within the tolerance of the inputs' dtype); rows that see nothing get zero dq, unseen keys zero dk and dv; a NaN reaches exactly the
gradients that depend on it; video_attention and routed plans train too; second derivatives through
the backward kernels are refused by name."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _kernels import as64, random_dense, small_blocks

import stlib
from stlib import checks, masks, registry
from stlib.kernels import online_softmax
from stlib.routing import svg_plan

HEADS, LENGTH, DIM = 3, 300, 32  # ragged against every tile size the kernels take
ALL = sorted(registry.IMPLEMENTATIONS)


def analytic_gradients(q, k, v, dense, do, scale):
    """(dq, dk, dv) of sum(attention(q, k, v) * do) in float64 numpy: P = softmax(S), dV = P^T dO,
    dS = P * (dO V^T - rowsum(dO * O)), dQ = scale dS K, dK = scale dS^T Q; empty rows have P = 0."""
    q, k, v, do = (as64(x) for x in (q, k, v, do))
    s = np.where(dense, np.einsum("hqd,hkd->hqk", q, k) * scale, -np.inf)
    m = np.max(s, axis=-1, keepdims=True)
    e = np.where(dense, np.exp(s - np.where(np.isfinite(m), m, 0.0)), 0.0)
    total = e.sum(axis=-1, keepdims=True)
    p = e / np.where(total > 0, total, 1.0)
    o = p @ v
    dv = np.swapaxes(p, 1, 2) @ do
    ds = p * (do @ np.swapaxes(v, 1, 2) - np.sum(do * o, axis=-1, keepdims=True))
    return scale * ds @ k, scale * np.swapaxes(ds, 1, 2) @ q, dv


def _mask_and_data(dtype, seed=0):
    rng = np.random.default_rng(seed)
    dense = random_dense(rng, HEADS, LENGTH, 0.25, tiles=(128, 128), empty_rows=((0, slice(3, 9)),))
    dense[1, :, 40:70] = False  # keys no query of head 1 sees
    q, k, v = stlib.random_qkv((HEADS, LENGTH, DIM), dtype, seed)
    do = jax.random.normal(jax.random.key(seed + 9), q.shape, jnp.float32)
    return dense, masks.from_array(dense), (q, k, v), do


def _grad_fn(loss, jit):
    grad = jax.grad(loss, argnums=(0, 1, 2))
    return jax.jit(grad) if jit else grad


def _assert_gradients(got, want, dtype, dense, unseen_keys: bool = True):
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        assert g.dtype == dtype, name
        g = as64(g)
        assert np.all(np.isfinite(g)), name
        gap = checks.scaled_error(g, w)
        assert gap <= checks.tolerance(dtype), f"{name}: {gap:.2e} of the largest entry"
    dq, dk, dv = (as64(x) for x in got)
    assert np.all(dq[~dense.any(axis=2)] == 0.0), "rows that see nothing get zero dq"
    unseen = ~dense.any(axis=1)
    assert unseen.any() == unseen_keys
    assert np.all(dk[unseen] == 0.0) and np.all(dv[unseen] == 0.0), "keys no query sees get zero dk, dv"


#: bf16 for every implementation but the teaching kernels (pallas_dense, pallas_block_sparse), whose
#: backward is the same kernels as pallas_tile's: f32 covers them.
CASES = [(impl, jnp.float32) for impl in ALL] + [
    (impl, jnp.bfloat16) for impl in ALL if impl not in ("pallas_dense", "pallas_block_sparse")
]


@pytest.mark.parametrize(("impl", "dtype"), CASES, ids=[f"{i}-{jnp.dtype(d).name}" for i, d in CASES])
def test_jit_gradients_equal_the_analytic_gradient(impl, dtype):
    """jax.jit(jax.grad(...)) of every implementation (eager jax.grad: the next test)."""
    jit = True
    dense, mask, (q, k, v), do = _mask_and_data(dtype)
    blocks = dict(zip(("block_q", "block_kv"), small_blocks(impl, mask, LENGTH)))
    if registry.get(impl).resolve is None:
        blocks = {}

    def loss(q, k, v):
        return jnp.sum(stlib.attention(q, k, v, mask, impl=impl, **blocks).astype(jnp.float32) * do)

    got = _grad_fn(loss, jit)(q, k, v)
    _assert_gradients(got, analytic_gradients(q, k, v, dense, do, DIM**-0.5), dtype, dense)


def test_eager_grad_equals_the_analytic_gradient():
    """jax.grad without jit, through the kernel that impl="auto" runs on a TPU."""
    dense, mask, (q, k, v), do = _mask_and_data(jnp.float32, seed=1)

    def loss(q, k, v):
        out = stlib.attention(q, k, v, mask, impl="pallas_tile_lane_dense", block_q=128, block_kv=128)
        return jnp.sum(out * do)

    got = _grad_fn(loss, jit=False)(q, k, v)
    _assert_gradients(got, analytic_gradients(q, k, v, dense, do, DIM**-0.5), jnp.float32, dense)


@pytest.mark.parametrize("impl", ["xla", "pallas_tile_lane_dense"])
def test_a_nan_reaches_the_gradients_that_depend_on_it_and_no_other_head(impl):
    """A NaN in q at row 150 (head 0): its dq, and dk and dv of every key it attends to, are NaN
    (a kernel may spread it further within the head, through 0 x NaN, as the dense reference
    does); head 1 holds no NaN and its gradients stay finite."""
    width = 20
    band = masks.band(LENGTH, width)
    q, k, v = stlib.random_qkv((2, LENGTH, DIM))
    q = q.at[0, 150].set(jnp.nan)

    def loss(q, k, v):
        return jnp.sum(stlib.attention(q, k, v, band, impl=impl))

    dq, dk, dv = (np.asarray(g) for g in jax.grad(loss, argnums=(0, 1, 2))(q, k, v))
    seen = np.abs(np.arange(LENGTH) - 150) <= width
    assert np.isnan(dq[0, 150]).all()
    assert np.isnan(dk[0, seen]).any(axis=1).all() and np.isnan(dv[0, seen]).any(axis=1).all()
    assert all(np.isfinite(g[1]).all() for g in (dq, dk, dv))


def test_video_attention_and_routed_plans_train_through_the_tile_kernels():
    grid = stlib.VideoGrid(3, 8, 12)
    q, k, v = stlib.random_qkv((2, grid.num_tokens, DIM), seed=4)
    do = jax.random.normal(jax.random.key(5), q.shape)
    mix = masks.per_head([masks.spatial(grid, 0), masks.temporal(grid, 1)])
    dense = mix.to_dense()
    want = analytic_gradients(q, k, v, dense, do, DIM**-0.5)

    def loss(q, k, v):
        return jnp.sum(stlib.video_attention(q, k, v, grid, mix, impl="pallas_tile_lane_dense") * do)

    _assert_gradients(_grad_fn(loss, True)(q, k, v), want, jnp.float32, dense, unseen_keys=False)
    for impl, boundary in (
        ("pallas_tile", "exact"),
        ("pallas_tile", "balanced"),
        ("pallas_tile_lane_dense", "balanced"),
    ):
        plan = svg_plan(grid, ["spatial", "temporal"], 0.3, block_q=128, block_kv=128, boundary=boundary)

        def plan_loss(q, k, v, plan=plan, impl=impl):
            return jnp.sum(stlib.video_attention(q, k, v, grid, plan=plan, impl=impl) * do)

        rounded = plan.mask.to_dense()  # the gradient of what the plan computes, rounding included
        got = _grad_fn(plan_loss, True)(q, k, v)
        want = analytic_gradients(q, k, v, rounded, do, DIM**-0.5)
        _assert_gradients(got, want, jnp.float32, rounded, unseen_keys=bool((~rounded.any(axis=1)).any()))


def test_second_derivatives_through_the_backward_kernels_are_refused_by_name():
    q, k, v = stlib.random_qkv((1, 256, DIM))
    band = masks.band(256, 30)

    def loss(q):
        return jnp.sum(stlib.attention(q, k, v, band, impl="pallas_tile", block_q=128, block_kv=128))

    with pytest.raises(NotImplementedError, match="impl='pallas_tile' has first derivatives only"):
        jax.grad(lambda q: jnp.sum(jax.grad(loss)(q)))(q)
    second = jax.jit(  # jit: one program, not every op dispatched on its own
        jax.grad(
            lambda q: jnp.sum(jax.grad(lambda x: jnp.sum(stlib.attention(x, k, v, band, impl="xla")))(q))
        )
    )
    assert np.all(np.isfinite(np.asarray(second(q))))


def _forward_residuals(q, k, v, dense, scale):
    """o and the natural-log lse of the masked attention, float64 numpy (-inf for empty rows)."""
    s = np.where(dense, np.einsum("hqd,hkd->hqk", as64(q), as64(k)) * scale, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(m), m, 0.0))
    total = e.sum(axis=-1)
    lse = np.where(
        total > 0, np.log(np.where(total > 0, total, 1.0)) + np.where(np.isfinite(m), m, 0.0)[..., 0], -np.inf
    )
    return (e / np.where(total > 0, total, 1.0)[..., None]) @ as64(v), lse


@pytest.mark.parametrize("method", ["split", "fused", "fused in windows"])
def test_the_fused_and_the_split_backward_equal_the_analytic_gradient(method, monkeypatch):
    """tile_backward itself, over the forward's exact passes: the split kernels (the oracle), the
    fused kernel with one dq window, and the fused kernel with a VMEM so small that each window
    holds two q tiles (the dq of a head then crosses several calls)."""
    from stlib.kernels import backward as bw
    from stlib.kernels import pallas_call
    from stlib.passes import exact_passes

    dense, mask, (q, k, v), do = _mask_and_data(jnp.float32, seed=2)
    scale = DIM**-0.5
    o, lse = _forward_residuals(q, k, v, dense, scale)
    bq, bkv = 64, 128
    if method == "fused in windows":
        room = bw.fused_vmem_bytes(bq, bkv, DIM, 4) + 2 * bq * DIM * 4
        monkeypatch.setattr(pallas_call, "vmem_limit", lambda chip: room)
        assert [w for w in bw.dq_windows(5, bq, bkv, DIM, 4)] == [(0, 2), (2, 4), (4, 5)]
    layout = stlib.block_layout(mask, bq, bkv)
    calls = bw.kernel_calls(
        exact_passes(layout), method.split()[0], num_q_tiles=5, block_q=bq, block_kv=bkv,
        head_dim=DIM, itemsize=4, chip=None,
    )  # fmt: skip
    assert {c.kind for c in calls} == ({"dq", "dkv"} if method == "split" else {"fused"})
    residuals = (q, k, v, jnp.asarray(o, jnp.float32), jnp.asarray(lse, jnp.float32))
    softmax = online_softmax.SoftmaxOptions(scale, exp2=True)
    got = bw.tile_backward(residuals, do, calls, block_q=bq, block_kv=bkv, softmax=softmax, interpret=True)
    _assert_gradients(got, analytic_gradients(q, k, v, dense, do, scale), jnp.float32, dense)


def test_backward_methods_are_checked(monkeypatch):
    from stlib.kernels import backward as bw
    from stlib.kernels import pallas_call
    from stlib.passes import exact_passes

    layout = stlib.block_layout(masks.band(512, 40), 128, 128)
    args = {"num_q_tiles": 4, "block_q": 128, "block_kv": 128, "head_dim": DIM, "itemsize": 4, "chip": None}
    with pytest.raises(ValueError, match="method='fastest' must be one of"):
        bw.kernel_calls(exact_passes(layout), "fastest", **args)
    monkeypatch.setattr(pallas_call, "vmem_limit", lambda chip: 1024)
    with pytest.raises(ValueError, match="does not fit in VMEM.*use method='split'"):
        bw.kernel_calls(exact_passes(layout), "fused", **args)
    assert {c.kind for c in bw.kernel_calls(exact_passes(layout), "auto", **args)} == {"dq", "dkv"}


def test_step_coded_backward_equals_the_analytic_gradient():
    """The fused kernel over a step-coded pass (``backward_steps``): a band at 256 x 256 blocks with
    patterns at a 128 grain (EMPTY sub-tiles skipped, FULL ones mask-free, the diagonal's PARTIAL
    ones masked from indices) and FULL tiles, the rest of the tiles in their exact passes."""
    from stlib.kernels import backward as bw
    from stlib.kernels.backward_steps import coded_passes
    from stlib.kernels.steps import FIRST_PATTERN, MASK, plan_steps
    from stlib.passes import PassKind, exact_passes

    length, heads = 1024, 2
    mask = masks.band(length, 300)
    dense = np.broadcast_to(mask.to_dense(), (heads, length, length))
    q, k, v = stlib.random_qkv((heads, length, DIM), seed=4)
    do = jax.random.normal(jax.random.key(5), q.shape)
    scale = DIM**-0.5
    o, lse = _forward_residuals(q, k, v, dense, scale)
    layout = stlib.block_layout(mask, 256, 256)
    plan = plan_steps(layout, length, 128)
    assert any(MASK in row for p in plan.patterns for row in p.rows)  # PARTIAL sub-tiles on the diagonal
    passes = coded_passes(plan, exact_passes(layout))
    coded = passes[0]
    assert coded.name == PassKind.STEPS and set(coded.steps.present(coded.selected)) >= {0, FIRST_PATTERN}
    calls = bw.kernel_calls(
        passes, "auto", num_q_tiles=4, block_q=256, block_kv=256, head_dim=DIM, itemsize=4, chip=None
    )
    assert calls[0].name.startswith(f"{bw.FUSED_PREFIX}_steps_full_p0")
    residuals = (q, k, v, jnp.asarray(o, jnp.float32), jnp.asarray(lse, jnp.float32))
    softmax = online_softmax.SoftmaxOptions(scale, exp2=True)
    got = bw.tile_backward(residuals, do, calls, block_q=256, block_kv=256, softmax=softmax, interpret=True)
    _assert_gradients(
        got, analytic_gradients(q, k, v, dense, do, scale), jnp.float32, dense, unseen_keys=False
    )
    with pytest.raises(ValueError, match="step-coded pass runs fused only"):
        bw.kernel_calls(
            passes, "split", num_q_tiles=4, block_q=256, block_kv=256, head_dim=DIM, itemsize=4, chip=None
        )


def test_rows_of_3d_tiles_train_as_pattern_steps():
    """The lane-dense forward runs a sliding tile in rows of 3-D tiles (pattern steps); so does its
    backward (``backward_steps.step_layout``: padding slots masked by key), and its gradient is the
    analytic one. Where no dq window fits, the backward runs one tile per block, where every tile
    is FULL or EMPTY (``one_tile_layout``)."""
    from stlib.kernels.backward import one_tile_layout
    from stlib.kernels.backward_steps import step_layout

    grid, tile = stlib.VideoGrid(4, 6, 64), (2, 4, 16)  # tiles of 128 tokens, rows of 4; h padded 6 -> 8
    mask = masks.sliding_tile(grid, tile, (1, 1, 3))
    order = stlib.tiled_order(grid, tile)
    permuted = mask.permute(order)
    rows = stlib.block_layout(permuted, 512, 512)
    assert rows.kind_counts()["PARTIAL"] > 0  # a row of tiles against another: the w-window masks
    steps_layout, plan = step_layout(rows, permuted.length)
    assert (steps_layout.block_q, steps_layout.block_kv) == (512, 512) and plan.patterns
    assert any(p.padded for p in plan.patterns)  # h padded: keys masked by the validity column
    assert step_layout(stlib.block_layout(masks.band(order.length, 300), 512, 512), order.length) is None
    tiles = one_tile_layout(rows)
    assert (tiles.block_q, tiles.block_kv) == (128, 128) and tiles.kind_counts()["PARTIAL"] == 0
    assert (
        one_tile_layout(stlib.block_layout(masks.band(order.length, 300), 512, 512)) is None
    )  # no 3-D tiles
    assert one_tile_layout(tiles) is None and step_layout(tiles, permuted.length) is None  # one tile a block
    q, k, v = stlib.random_qkv((2, grid.num_tokens, DIM), seed=6)
    do = jax.random.normal(jax.random.key(7), q.shape)
    dense = mask.to_dense()
    want = analytic_gradients(q, k, v, np.broadcast_to(dense, (2, *dense.shape)), do, DIM**-0.5)

    def loss(q, k, v):
        out = stlib.video_attention(
            q, k, v, grid, mask, impl="pallas_tile_lane_dense", orders=order, block_q=512, block_kv=512
        )
        return jnp.sum(out * do)

    lowered = str(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v))
    assert "stlib_bwd_fused_steps_p" in lowered, "the backward runs the pattern steps"
    got = _grad_fn(loss, True)(q, k, v)
    _assert_gradients(got, want, jnp.float32, np.broadcast_to(dense, (2, *dense.shape)), unseen_keys=False)


def test_band_and_dense_train_as_steps_at_the_backward_blocks():
    """The lane-dense kernel's backward on a layout without 3-D tiles runs one step-coded pass at its
    own blocks (``backward_steps.block_steps``), as its only call, which writes dq, dk and dv final
    (``backward.KernelCall.finishes``): FULL, RAGGED (the piece the array ends in masked
    past it), MASKED (a traceable mask from indices, rows past the array masked) and the band's edge
    patterns, every update [grain, block_q]; dense runs FULL and RAGGED. Both equal the analytic
    gradient; a NaN in one key reaches the dq of every row that sees it and its own dk and dv (within
    the head it may spread further, through 0 x NaN, as the dense reference does), never the other head."""
    from stlib.kernels.tile_lane_dense import LaneDenseOptions

    length, heads = 992, 2  # ragged: the last 256-key tile holds 224 keys, its last 128-key piece 96
    options = LaneDenseOptions(backward_blocks=(256, 256, 128))
    q, k, v = stlib.random_qkv((heads, length, DIM), seed=8)
    do = jax.random.normal(jax.random.key(9), q.shape)
    for mask, words in (
        (masks.band(length, 300), ("full", "ragged", "masked", "p0")),
        (None, ("full", "ragged")),
    ):
        dense = np.ones((length, length), bool) if mask is None else mask.to_dense()
        dense = np.broadcast_to(dense, (heads, length, length))

        def loss(q, k, v, mask=mask):
            out = stlib.attention(
                q, k, v, mask, impl="pallas_tile_lane_dense", block_q=256, block_kv=256, options=options
            )
            return jnp.sum(out * do)

        lowered = str(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v))
        kernels = {name for name in lowered.split() if "stlib_bwd" in name}
        assert all(f"_{w}" in " ".join(kernels) for w in words), kernels  # one step-coded pass of these codes
        assert "stlib_bwd_fused_steps" in lowered and "stlib_bwd_dq" not in lowered, kernels
        finished = re.search(rf"(\w+:f32\[{heads},{length},{DIM}\] ){{3}}= pallas_call", lowered)
        assert finished, "the lone call writes dq, dk, dv final: unpadded, no scale-and-cast after it"
        got = _grad_fn(loss, True)(q, k, v)
        _assert_gradients(got, analytic_gradients(q, k, v, dense, do, DIM**-0.5), jnp.float32, dense, False)
    k_nan = k.at[1, 600].set(jnp.nan)  # a key of head 1 inside the band's reach of rows 301..899

    def band_loss(q, k, v):
        out = stlib.attention(
            q, k, v, masks.band(length, 300), impl="pallas_tile_lane_dense", block_q=256, block_kv=256,
            options=options,
        )  # fmt: skip
        return jnp.sum(out * do)

    dq, dk, dv = (np.asarray(g) for g in _grad_fn(band_loss, True)(q, k_nan, v))
    sees = masks.band(length, 300).to_dense()[:, 600]
    assert (
        np.isnan(dq[1][sees]).any(axis=-1).all() and np.isnan(dk[1, 600]).all() and np.isnan(dv[1, 600]).all()
    )
    assert all(np.isfinite(g[0]).all() for g in (dq, dk, dv))
