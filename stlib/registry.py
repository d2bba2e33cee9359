"""The implementation registry: every attention implementation is one ``Implementation`` object,
registered once, that owns what the rest of the library needs to know about it.

``stlib.attention(..., impl=name, options=...)`` runs ``forward``; the roofline and benchmarks ask
``work`` what it computes; the static estimator asks ``compute_regions`` how to name the compiled
schedule's conditional regions and ``schedule_counts`` how often each runs; compile tests iterate
over ``tpu_kernels()``. Adding a kernel is its own file plus one registration (its import in
``stlib/kernels/__init__.py``): nothing else names it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class NoOptions:
    """The options of an implementation that takes none."""


@dataclass(frozen=True)
class ScheduleCounts:
    """What one compiled Pallas kernel of a call executes (all heads), for the static estimator:
    ``paths`` executions of each conditional path ("init", "compute_full", ...), ``grid_steps``,
    ``q_rows`` q-block fetches (each also writes an output block), ``kv_fetches`` k/v block fetches,
    the kernel's blocks, the output's itemsize and whether it writes a [block_q, 1] f32 LSE."""

    paths: dict[str, int]
    grid_steps: int
    q_rows: int
    kv_fetches: int
    block_q: int
    block_kv: int
    out_itemsize: int
    writes_lse: bool


@dataclass(frozen=True)
class Implementation:
    """One attention implementation.

    ``forward(q, k, v, mask, *, scale, block_q, block_kv, options, interpret)`` -> [H, L, D] gets
    validated inputs (``stlib.api``); ``options`` is an instance of ``options_type``.
    ``work(layout, num_heads, head_dim, options)`` -> ``KernelWork`` (grid steps, computed and
    masked tiles, flops) on a tile layout. ``kernel_names``: name prefixes of its Pallas kernels in
    a compiled program (empty: not a Pallas implementation). ``compute_regions(kernel, n)`` names
    the n conditional compute regions of a compiled step; ``schedule_counts(setup, attribution)``
    -> ``ScheduleCounts`` of one compiled kernel (stlib.analysis). ``chips``: the chips it compiles
    for. ``blocks``: per-chip default blocks where they differ from the chip table's;
    ``resolve_blocks``: how it turns (mask, length, block_q, block_kv, options, interpret) into the
    blocks it runs, where that differs from ``common.block_sizes_for`` (the estimator asks it). ``title`` and
    ``variants`` (label -> options) say how the case-study comparisons run it.
    """

    name: str
    forward: Callable
    description: str
    options_type: type = NoOptions
    work: Callable | None = None
    kernel_names: tuple[str, ...] = ()
    compute_regions: Callable | None = None
    schedule_counts: Callable | None = None
    chips: tuple[str, ...] = ()
    blocks: Mapping[str, object] = field(default_factory=dict)
    resolve_blocks: Callable | None = (
        None  # (mask, length, block_q, block_kv, options, interpret) -> (BlockSizes, options)
    )
    title: str = ""  # how comparisons name it ("" : its name)
    variants: Mapping[str, Mapping] = field(default_factory=dict)  # labelled options comparisons run

    def comparison_runs(self) -> list[tuple[str, dict]]:
        """(label, options) of each variant the benchmark and estimate comparisons run: its
        ``variants``, or its defaults under its title."""
        title = self.title or self.name
        if not self.variants:
            return [(title, {})]
        return [(f"{title} {label}", dict(options)) for label, options in self.variants.items()]

    @property
    def is_pallas(self) -> bool:
        return bool(self.kernel_names)

    def options(self, options=None, **overrides):
        """``options`` validated as this implementation's options type (None: the defaults; a dict:
        its fields), with ``overrides`` applied. Raises TypeError for another type or unknown field."""
        if options is None:
            options = self.options_type()
        elif isinstance(options, Mapping):
            names = {f.name for f in dataclasses.fields(self.options_type)}
            unknown = sorted(set(options) - names)
            if unknown:
                raise TypeError(
                    f"impl={self.name!r} has no options {unknown}; its options are {sorted(names)}"
                )
            options = self.options_type(**options)
        elif not isinstance(options, self.options_type):
            raise TypeError(
                f"impl={self.name!r} takes options of type {self.options_type.__name__}, "
                f"got {type(options).__name__}"
            )
        return dataclasses.replace(options, **overrides) if overrides else options

    def owns_kernel(self, kernel: str) -> bool:
        """Whether a compiled Pallas kernel of this name belongs to this implementation."""
        return any(kernel.startswith(prefix) for prefix in self.kernel_names)


IMPLEMENTATIONS: dict[str, Implementation] = {}


def register(implementation: Implementation) -> Implementation:
    """Make ``implementation`` available as ``stlib.attention(..., impl=implementation.name)``.
    Raises ValueError if the name is taken."""
    if not isinstance(implementation, Implementation):
        raise TypeError(f"register takes an Implementation, got {type(implementation).__name__}")
    if implementation.name in IMPLEMENTATIONS:
        raise ValueError(f"impl={implementation.name!r} is already registered")
    IMPLEMENTATIONS[implementation.name] = implementation
    return implementation


def get(name: str) -> Implementation:
    """The registered implementation ``name``. Raises ValueError naming the known ones."""
    if name not in IMPLEMENTATIONS:
        raise ValueError(f"impl={name!r} is unknown; choose one of {sorted(IMPLEMENTATIONS)}")
    return IMPLEMENTATIONS[name]


def tpu_kernels() -> list[Implementation]:
    """The implementations that compile to Pallas TPU kernels (Splash included)."""
    return [impl for impl in IMPLEMENTATIONS.values() if impl.is_pallas]


def owner_of_kernel(kernel: str) -> Implementation | None:
    """The implementation whose Pallas kernel is named ``kernel`` in a compiled program, if any."""
    return next((impl for impl in IMPLEMENTATIONS.values() if impl.owns_kernel(kernel)), None)


__all__ = [
    "IMPLEMENTATIONS",
    "Implementation",
    "NoOptions",
    "ScheduleCounts",
    "get",
    "owner_of_kernel",
    "register",
    "tpu_kernels",
]
