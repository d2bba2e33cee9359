"""The prepared plan: one ``jax.grad`` through a tile kernel builds its call's plan once, and the
forward, the backward and the estimator read it (``stlib.plan``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import stlib
from stlib import masks, plan, registry
from stlib.kernels import backward
from stlib.registry import Role

TILE_KERNELS = [
    registry.by_role(role).name for role in (Role.BEST_TILE, Role.TILE, Role.BLOCK_SPARSE, Role.DENSE)
]


@pytest.mark.parametrize("impl", TILE_KERNELS)
def test_one_grad_builds_its_plan_once(impl, monkeypatch):
    """One ``jax.grad(stlib.attention)``: one ``KernelPlan`` (one forward layout, and for the
    step-coded kernel one forward step plan, built when the forward first reads it), one backward
    plan; the forward and the backward both read that plan, and nothing below builds the layout
    again."""
    built, layouts, backwards = [], [], []
    original_init = plan.KernelPlan.__post_init__
    original_layout, original_backward = plan.call_layout, backward.backward_plan

    def counting_init(self):
        built.append(self)
        original_init(self)

    def counting_layout(*args):
        layouts.append(args)
        return original_layout(*args)

    def counting_backward(the_plan, *args):
        backwards.append(the_plan)
        return original_backward(the_plan, *args)

    monkeypatch.setattr(plan.KernelPlan, "__post_init__", counting_init)
    monkeypatch.setattr(plan, "call_layout", counting_layout)
    monkeypatch.setattr(backward, "backward_plan", counting_backward)
    length = 640
    mask = masks.band(length, 150)
    q, k, v = stlib.random_qkv((2, length, 128), jnp.float32, seed=1)

    def loss(q, k, v):
        out = stlib.attention(q, k, v, mask, impl=impl, block_q=128, block_kv=128, interpret=True)
        return jnp.sum(out * out)

    grads = jax.grad(loss, argnums=(0, 1, 2))(q, k, v)
    assert all(bool(jnp.isfinite(g).all()) for g in grads)
    assert len(built) == 1 and len(layouts) == 1
    assert backwards == built  # the backward's plan came from the forward's call plan
    (the_plan,) = built
    step_coded = impl == registry.by_role(Role.BEST_TILE).name
    backward_key = ("backward", 128, 4)  # q's head dim and itemsize
    assert list(the_plan._built) == (["steps", backward_key] if step_coded else [backward_key])
    assert (the_plan.steps is not None) == step_coded


def test_a_plan_builds_what_it_keeps_once():
    config = registry.get(TILE_KERNELS[0]).config(None, 512, 128, 128, None, interpret=True)
    the_plan = plan.prepare(None, 512, config, True)
    made = []
    assert the_plan.once("x", lambda: made.append(1) or "first") == "first"
    assert the_plan.once("x", lambda: made.append(1) or "second") == "first"
    assert made == [1] and the_plan.layout.grid_shape == (4, 4)


def test_a_plan_refuses_a_layout_at_other_blocks():
    implementation = registry.get(TILE_KERNELS[0])
    config = implementation.config(None, 512, 128, 128, None, interpret=True)
    layout = stlib.block_layout(masks.full(512), 256, 128)
    with pytest.raises(ValueError, match=r"the layout's blocks \(256, 128\) are not the config's"):
        plan.KernelPlan(None, 512, config, True, layout)
