"""The op contract: the records an attention implementation (``stlib.registry.Implementation``)
is made of and registered with. ``Config``: the blocks and options of one call, resolved once;
``Capabilities``: what it accepts; ``Backward``: its training path; ``EstimatorHooks``: how the
static estimator reads its compiled kernels (``ScheduleCounts`` per kernel); ``Presentation``: how
benchmarks, sweeps and plots show it. Typed protocols give the hooks' signatures."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol


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
    #: A kernel whose operands are not a forward's q, k, v, o (a backward kernel) states its HBM
    #: bytes itself: per row start (``q_rows``), per step fetch (``kv_fetches``), and bytes its DMAs
    #: move while the kernel waits (never hidden). None: derived from q, k, v, o as laid out.
    row_bytes: int | None = None
    fetch_bytes: int | None = None
    waited_bytes: int = 0


@dataclass(frozen=True)
class Config:
    """The blocks and options one call of an implementation runs with, resolved once: ``block_q``
    rows x ``block_kv`` keys per grid step in chunks of ``block_kv_compute`` keys (None: the whole
    tile; all None for an implementation without blocks), ``options`` (its ``options_type``) and
    ``chip``: the TPU chip the call is sized for (the chip its options name, else the TPU at hand;
    None off a TPU: a kernel then fits the smallest VMEM of the chip table), resolved where the
    call is made (``Implementation.config``) and read, never looked up again, below it."""

    block_q: int | None
    block_kv: int | None
    block_kv_compute: int | None
    options: object
    chip: str | None = None

    def blocks(self) -> dict:
        return {"block_q": self.block_q, "block_kv": self.block_kv, "block_kv_compute": self.block_kv_compute}


class ComputeRegions(Protocol):
    """(kernel name, number of conditional compute regions of its step) -> their names."""

    def __call__(self, kernel: str, n: int) -> list[str]: ...


class ScheduleCountsRule(Protocol):
    """(the estimator's call setup, one compiled kernel's attribution) -> ``ScheduleCounts``."""

    def __call__(self, setup, attribution) -> ScheduleCounts: ...


class SweepFacts(Protocol):
    """(chip, mask family, block_q, block_kv, block_kv_compute; head_dim, itemsize of q) -> what a
    block sweep records beside that candidate's estimate (its VMEM need, say)."""

    def __call__(
        self,
        chip: str,
        family: str,
        block_q: int,
        block_kv: int,
        block_kv_compute,
        *,
        head_dim: int,
        itemsize: int,
    ) -> dict: ...


@dataclass(frozen=True)
class EstimatorHooks:
    """How the static estimator (``stlib.analysis``) reads an implementation's compiled Pallas
    kernels: ``kernel_names``, their name prefixes in a compiled program; ``compute_regions`` names a
    step's conditional compute regions; ``schedule_counts`` says how often each path of one kernel
    runs; ``probe_regions``: its two compute regions are told apart by a probe compiled with no
    masked tile; ``tuned_candidates``: the (block_q, block_kv) a tuned static estimate sweeps;
    ``edge_regions(kernel)``: (names, names) of a step's conditional regions before its compute and
    after it, by position, where some run less often than once per row (a head's), or None: every
    region before is the row's "init", after it its "finalise"."""

    kernel_names: tuple[str, ...]
    compute_regions: ComputeRegions
    schedule_counts: ScheduleCountsRule
    probe_regions: bool = False
    tuned_candidates: tuple[tuple[int, int], ...] = ()
    edge_regions: Callable[[str], tuple[tuple[str, ...], tuple[str, ...]] | None] | None = None


@dataclass(frozen=True)
class Presentation:
    """How benchmarks, sweeps and plots show an implementation: ``title`` (its name when empty),
    ``variants`` (label -> options the comparisons run), ``sweep_candidates`` ({mask family:
    (block_q, block_kv, block_kv_compute)} of its block sweep), ``sweep_facts`` (what the sweep
    records beside each candidate), and for a backward with blocks of its own, ``backward_runs(chip,
    (block_q, block_kv, keys per update), length, head_dim, itemsize) -> bool`` (whether it runs those
    blocks there) and ``backward_tuned`` (the name of the tuned data its sweep writes)."""

    title: str = ""
    variants: Mapping[str, Mapping] = field(default_factory=dict)
    sweep_candidates: Mapping[str, tuple] = field(default_factory=dict)
    sweep_facts: SweepFacts | None = None
    backward_runs: Callable[..., bool] | None = None
    backward_tuned: str = ""


@dataclass(frozen=True)
class Backward:
    """The training path of an implementation: ``forward(q, k, v, mask, **call) -> (o, residuals)``
    (the forward that also keeps what the backward needs) and ``backward(residuals, do, mask,
    **call) -> (dq, dk, dv)``; ``call``: the keywords of ``Implementation.forward``. ``stlib.api``
    joins them into a ``jax.custom_vjp``. ``estimator``: as ``Implementation``'s, for the
    backward's own Pallas kernels. ``lse_residuals``: the residuals are (q, k, v, o, lse), lse
    [H, L] f32 (natural log, -inf for rows that see nothing), and ``backward`` takes an o and lse
    of a call over more keys than k and v (the flash decomposition a ring attention runs by).
    ``stack_backward(residuals, do, stack, block, **call) -> (dq, dk, dv)``: as ``backward`` for block
    ``block`` (a traced int32) of a ``stlib.masks.StackedBlocks``, every block through one compiled
    body a kernel (a ring's hops, as ``Implementation.stack_forward``; None: a kernel a block)."""

    forward: Callable
    backward: Callable
    estimator: EstimatorHooks | None = None
    lse_residuals: bool = False
    stack_backward: Callable | None = None


@dataclass(frozen=True)
class Capabilities:
    """What an implementation accepts beyond [H, L, D] self-attention with a stlib mask:
    ``shared_kv_heads``: k / v with fewer heads than q (GQA, MQA); ``head_dim_v``: v with its own
    head dim; ``mask_support(mask) -> str | None``: why a mask is refused (None: accepted);
    ``max_length``: the longest sequence it takes (the materialising reference's L x L scores)."""

    shared_kv_heads: bool = False
    head_dim_v: bool = False
    mask_support: Callable | None = None
    max_length: int | None = None  # longest sequence it takes (None: no limit of its own)


__all__ = [
    "Backward",
    "Capabilities",
    "ComputeRegions",
    "Config",
    "EstimatorHooks",
    "NoOptions",
    "Presentation",
    "ScheduleCounts",
    "ScheduleCountsRule",
    "SweepFacts",
]
