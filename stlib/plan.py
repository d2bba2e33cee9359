"""One call's prepared plan: what a call derives from its mask, its length and its resolved
``Config``, built once where the call is made (``Implementation.kernel_call``) and read by the
forward, the backward and a ring's shared kernel, which build none of it again.

``KernelPlan`` holds the forward's tile layout and, for a step-coded kernel, its step plan (built
on first use, from what the kernel's ``prepare`` hook adds); what depends on the arrays too (the backward's layout and
kernel calls, sized by q's head dim and dtype) is built on first use and kept in the plan
(``KernelPlan.once``), so one ``jax.grad`` through a tile kernel plans its forward and its
backward once each. Compare Splash, which builds its forward and backward mask info once and keeps
them in the kernel object.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

from stlib.contract import Config
from stlib.layout import BlockLayout, call_layout
from stlib.masks import Mask


@dataclass(frozen=True, eq=False)
class KernelPlan:
    """The prepared plan of one call on ``length`` tokens with ``mask`` (None: dense) at ``config``:
    ``layout``, the forward's tiles at the config's blocks; ``planner``, what builds a step-coded
    kernel's step plan (``steps``; None for the others); ``interpret``, as the call asked. Immutable
    but for what ``once`` keeps: each entry built at most once per plan."""

    mask: Mask | None
    length: int
    config: Config
    interpret: bool | None
    layout: BlockLayout
    planner: Callable | None = None  # (layout, length, options) -> the forward's step plan
    _built: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        blocks = (self.layout.block_q, self.layout.block_kv)
        if blocks != (self.config.block_q, self.config.block_kv):
            raise ValueError(f"the layout's blocks {blocks} are not the config's {self.config.blocks()}")

    @property
    def options(self):
        return self.config.options

    @property
    def chip(self) -> str | None:
        return self.config.chip

    @property
    def steps(self):
        """The forward's step plan of a step-coded kernel (its ``planner``), built on first use: a
        call that runs another layout (a routed plan's) never builds it; None for other kernels."""
        if self.planner is None:
            return None
        return self.once("steps", lambda: self.planner(self.layout, self.length, self.options))

    def once(self, key: Hashable, build: Callable[[], object]):
        """``build()`` the first time ``key`` is asked for, that result after: what a call derives
        on use (the backward's plan at q's head dim and dtype) is built once per plan."""
        if key not in self._built:
            self._built[key] = build()
        return self._built[key]


def prepare(
    mask: Mask | None, length: int, config: Config, interpret, steps: Callable | None = None
) -> KernelPlan:
    """The ``KernelPlan`` of a call: the layout of ``mask`` (None: dense) over ``length`` tokens at
    ``config``'s blocks, and where the kernel is step-coded ``steps(layout, length, options)``, its
    step plan's builder (``KernelPlan.steps``: run on first use)."""
    layout = call_layout(mask, length, config.block_q, config.block_kv)
    return KernelPlan(mask, length, config, interpret, layout, steps)


__all__ = ["KernelPlan", "prepare"]
