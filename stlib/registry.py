"""The implementation registry: every attention implementation is one ``Implementation`` object,
registered once, that owns what the rest of the library needs to know about it.

``stlib.attention(..., impl=name, options=...)`` runs ``forward``; ``config`` resolves the blocks
and options of a call once (the forward, the estimator and the sweeps all ask it); ``supports``
says what the implementation accepts (shared kv heads, its own v head dim, a mask, a chip); the
roofline and benchmarks ask ``work`` what it computes; the static estimator asks
``compute_regions`` how to name the compiled schedule's conditional regions and
``schedule_counts`` how often each runs; sweeps take ``tuned_candidates``; a routed plan runs
through ``plan_runner``; compile tests iterate over ``tpu_kernels()``; ``baseline()`` is the dense
kernel every comparison is a ratio to. Adding a kernel is its own file plus one registration (its
import in ``stlib/kernels/__init__.py``): nothing else names it.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field


class Role(enum.StrEnum):
    """What the rest of stlib (routing, benchmarks, plots, notebooks) asks the registry for instead
    of importing a kernel's module or naming it: ``by_role(Role.BEST_TILE)``. Each role is held by
    one implementation at most."""

    REFERENCE = "the materialising reference"
    XLA = "blocked attention compiled by XLA"
    BASELINE = "the dense kernel comparisons divide by"
    DENSE = "dense Pallas flash attention"
    BLOCK_SPARSE = "block-sparse Pallas kernel"
    TILE = "first tile kernel (runs routed plans)"
    BEST_TILE = "best tile kernel"


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
    tile; all None for an implementation without blocks) and ``options`` (its ``options_type``)."""

    block_q: int | None
    block_kv: int | None
    block_kv_compute: int | None
    options: object

    def blocks(self) -> dict:
        return {"block_q": self.block_q, "block_kv": self.block_kv, "block_kv_compute": self.block_kv_compute}


@dataclass(frozen=True)
class Backward:
    """The training path of an implementation: ``forward(q, k, v, mask, **call) -> (o, residuals)``
    (the forward that also keeps what the backward needs) and ``backward(residuals, do, mask,
    **call) -> (dq, dk, dv)``; ``call``: the keywords of ``Implementation.forward``. ``stlib.api``
    joins them into a ``jax.custom_vjp``. ``kernel_names``, ``compute_regions`` and
    ``schedule_counts``: as ``Implementation``'s, for the backward's own Pallas kernels."""

    forward: Callable
    backward: Callable
    kernel_names: tuple[str, ...] = ()
    compute_regions: Callable | None = None
    schedule_counts: Callable | None = None


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
    for. ``resolve(mask, length, block_q, block_kv, options, interpret)`` -> (blocks with
    ``block_q``, ``block_kv``, ``block_kv_compute``; options with the chunk resolved): the one rule
    by which it picks its blocks (None: it has none). ``capabilities``: see ``Capabilities``.
    ``tuned_candidates``: the (block_q, block_kv) a tuned static estimate sweeps;
    ``sweep_candidates``: {mask family: (block_q, block_kv, block_kv_compute)} of a block sweep. ``plan_runner(q,
    k, v, plan, *, scale, options, interpret)`` runs a routed ``stlib.routing.SvgPlan`` with the
    plan's own tile layout (None: the plan's masks go through ``forward``). ``backward``: its
    training path (``Backward``; None: differentiable only where ``forward`` is plain JAX). ``roles``:
    the ``Role`` entries it holds (what the rest of stlib asks ``by_role`` for; one holder a role). ``auto_rank``: {situation of
    ``AUTO_SITUATIONS``: rank} where ``impl="auto"`` may pick it, the lowest rank that accepts the
    mask first (``choose``). ``probe_regions``: its two compute
    regions are told apart by a probe compiled with no masked tile. ``title`` and ``variants``
    (label -> options) say how the case-study comparisons run it.
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
    resolve: Callable | None = (
        None  # (mask, length, block_q, block_kv, options, interpret) -> (blocks, options)
    )
    capabilities: Capabilities = field(default_factory=Capabilities)
    tuned_candidates: tuple[tuple[int, int], ...] = ()
    sweep_candidates: Mapping[str, tuple] = field(default_factory=dict)  # family -> (bq, bkv, chunk)
    plan_runner: Callable | None = None
    backward: Backward | None = None
    roles: frozenset = frozenset()  # the ``Role`` entries it holds
    auto_rank: Mapping[str, int] = field(default_factory=dict)  # situation -> rank (0 first)
    probe_regions: bool = False
    title: str = ""  # how comparisons name it ("" : its name)
    variants: Mapping[str, Mapping] = field(default_factory=dict)  # labelled options comparisons run

    def __repr__(self) -> str:
        return f"<stlib implementation {self.name!r}: {self.description}>"

    def comparison_runs(self) -> list[tuple[str, dict]]:
        """(label, options) of each variant the benchmark and estimate comparisons run: its
        ``variants``, or its defaults under its title."""
        title = self.title or self.name
        if not self.variants:
            return [(title, {})]
        return [(f"{title} {label}", dict(options)) for label, options in self.variants.items()]

    def trainable(self, mask, call: dict, primal: Callable | None = None) -> Callable:
        """(q, k, v) -> o: ``forward`` with ``mask`` and ``call`` (its keywords) as a function whose
        gradient is this implementation's own backward (``Backward``, joined as a
        ``jax.custom_vjp``; without one, ``forward`` as it is, differentiable where it is plain
        JAX). ``primal``: what runs when nothing is differentiated (default ``forward``; a plan
        runner passes its kernel on the plan's own layout). A second derivative through the
        backward kernels is refused by name."""
        import jax

        def forward(q, k, v):
            return self.forward(q, k, v, mask, **call)

        if self.backward is None:
            return forward
        run = jax.custom_vjp(primal or forward)
        message = (
            f"impl={self.name!r} has first derivatives only (its kernels have no derivative of their own); "
            'take higher-order derivatives through impl="reference" or "xla"'
        )
        keep_residuals = _first_order_only(
            lambda q, k, v: self.backward.forward(q, k, v, mask, **call), message
        )
        gradients = _first_order_only(lambda res, do: self.backward.backward(res, do, mask, **call), message)
        run.defvjp(keep_residuals, gradients)
        return run

    @property
    def baseline(self) -> bool:
        """Whether comparisons divide by it (``Role.BASELINE``)."""
        return Role.BASELINE in self.roles

    def option_enum(self, name: str) -> type[enum.Enum]:
        """The enum type of option ``name`` of its options type (its members: a CLI's choices)."""
        import typing

        kind = typing.get_type_hints(self.options_type)[name]
        if not (isinstance(kind, type) and issubclass(kind, enum.Enum)):
            raise TypeError(f"option {name!r} of {self.name!r} is not an enum ({kind})")
        return kind

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

    def config(
        self, mask, length: int, block_q=None, block_kv=None, options=None, *, interpret=None
    ) -> Config:
        """The ``Config`` a call on ``length`` tokens with ``mask`` runs with: ``options`` validated
        (see ``options``), blocks by the implementation's own rule (``resolve``; compiled for a TPU
        when ``interpret`` is False). Raises TypeError / ValueError for bad options or blocks."""
        options = self.options(options)
        if self.resolve is None:
            return Config(None, None, None, options)
        sizes, options = self.resolve(mask, length, block_q, block_kv, options, interpret)
        return Config(sizes.block_q, sizes.block_kv, sizes.block_kv_compute, options)

    def unsupported(
        self, *, mask=None, shared_kv_heads: bool = False, head_dim_v: bool = False, chip: str | None = None
    ) -> str | None:
        """Why this implementation cannot run a call (None: it can): k / v heads shared by several q
        heads, a v head dim of its own, a mask it has no form for, a chip it does not compile for."""
        caps = self.capabilities
        if shared_kv_heads and not caps.shared_kv_heads:
            return f"impl={self.name!r} takes as many k / v heads as q heads"
        if head_dim_v and not caps.head_dim_v:
            return f"impl={self.name!r} takes v with the head dim of q and k"
        if chip is not None and self.is_pallas and chip not in self.chips:
            return f"impl={self.name!r} does not compile for chip={chip!r} (its chips: {self.chips})"
        if mask is not None and caps.mask_support is not None:
            return caps.mask_support(mask)
        return None

    def supports(self, **call) -> bool:
        """Whether this implementation can run a call (the keywords of ``unsupported``)."""
        return self.unsupported(**call) is None

    def check_supports(self, **call) -> None:
        """Raise ValueError, saying why, unless this implementation can run the call."""
        reason = self.unsupported(**call)
        if reason is not None:
            raise ValueError(reason)

    def owns_kernel(self, kernel: str) -> bool:
        """Whether a compiled Pallas kernel of this name belongs to this implementation (its
        forward's or its backward's)."""
        backward = self.backward.kernel_names if self.backward else ()
        return any(kernel.startswith(prefix) for prefix in (*self.kernel_names, *backward))

    def schedule_rules(self, kernel: str) -> tuple[Callable | None, Callable | None]:
        """(compute_regions, schedule_counts) of the compiled kernel ``kernel``: the backward's for
        one of its backward's kernels, else the implementation's."""
        backward = self.backward
        if backward and any(kernel.startswith(prefix) for prefix in backward.kernel_names):
            return backward.compute_regions, backward.schedule_counts
        return self.compute_regions, self.schedule_counts


def _first_order_only(fn: Callable, message: str) -> Callable:
    """``fn`` with a derivative that raises NotImplementedError(``message``): the rules of a
    ``custom_vjp`` whose Pallas kernels have none, so that a second derivative says why it fails."""
    import jax

    wrapped = jax.custom_jvp(fn)

    @wrapped.defjvp
    def _(primals, tangents):
        raise NotImplementedError(message)

    return wrapped


IMPLEMENTATIONS: dict[str, Implementation] = {}
#: ``impl="auto"``: the best registered implementation for the backend at hand and the mask
#: (``choose``); what ``stlib.attention`` and every entry point run when no ``impl`` is named.
AUTO = "auto"
DEFAULT_IMPL = AUTO
#: The situations ``auto`` tells apart: on a TPU with a mask, on a TPU without one (dense), and on
#: any other backend (CPU, GPU), where no Pallas TPU kernel runs compiled.
AUTO_SITUATIONS = ("tpu-masked", "tpu-dense", "elsewhere")


def register(implementation: Implementation) -> Implementation:
    """Make ``implementation`` available as ``stlib.attention(..., impl=implementation.name)``.
    Raises ValueError if the name is taken."""
    if not isinstance(implementation, Implementation):
        raise TypeError(f"register takes an Implementation, got {type(implementation).__name__}")
    if implementation.name in IMPLEMENTATIONS:
        raise ValueError(f"impl={implementation.name!r} is already registered")
    for role in implementation.roles:
        if not isinstance(role, Role):
            raise TypeError(
                f"impl={implementation.name!r}: roles must be stlib.registry.Role members, got {role!r}"
            )
        holder = _holder(role)
        if holder is not None:
            raise ValueError(
                f"impl={implementation.name!r}: the role {role.name} ({role}) is already held by {holder.name!r}"
            )
    IMPLEMENTATIONS[implementation.name] = implementation
    return implementation


def get(name: str) -> Implementation:
    """The registered implementation ``name``. Raises ValueError naming the known ones (and "auto",
    which ``choose`` resolves)."""
    if name not in IMPLEMENTATIONS:
        import difflib

        close = difflib.get_close_matches(str(name), [*IMPLEMENTATIONS, AUTO], n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"impl={name!r} is unknown{hint}; choose one of {sorted(IMPLEMENTATIONS) + [AUTO]}")
    return IMPLEMENTATIONS[name]


def auto_situation(mask=None, backend: str | None = None) -> str:
    """The ``AUTO_SITUATIONS`` entry of a call with ``mask`` (None: dense) on ``backend`` (None:
    JAX's default backend)."""
    if backend is None:
        import jax

        backend = jax.default_backend()
    if backend != "tpu":
        return "elsewhere"
    return "tpu-dense" if mask is None else "tpu-masked"


def choose(impl: str, mask=None, *, backend: str | None = None) -> Implementation:
    """The implementation a call with ``impl`` runs: the registered one of that name, or for
    ``impl="auto"`` the implementation of lowest ``auto_rank`` in the call's situation
    (``auto_situation``) that accepts ``mask``. Raises ValueError for an unknown name, or when no
    ranked implementation accepts the mask (saying why each refused)."""
    if impl != AUTO:
        return get(impl)
    situation = auto_situation(mask, backend)
    ranked = sorted(
        (entry.auto_rank[situation], entry.name)
        for entry in IMPLEMENTATIONS.values()
        if situation in entry.auto_rank
    )
    refusals = []
    for _, name in ranked:
        reason = None if mask is None else IMPLEMENTATIONS[name].unsupported(mask=mask)
        if reason is None:
            return IMPLEMENTATIONS[name]
        refusals.append(reason)
    raise ValueError(
        f"impl='auto' ({situation}) found no implementation for this mask: "
        + ("; ".join(refusals) if refusals else "none is ranked for it (import stlib.kernels)")
    )


def by_role(role: Role) -> Implementation:
    """The implementation that holds ``role``. Raises LookupError when none does.

    >>> import stlib.kernels
    >>> by_role(Role.BASELINE) is baseline()
    True
    """
    role = Role(role)
    holder = _holder(role)
    if holder is None:
        raise LookupError(f"no implementation holds the role {str(role)!r} (import stlib.kernels)")
    return holder


def _holder(role: Role) -> Implementation | None:
    return next((impl for impl in IMPLEMENTATIONS.values() if role in impl.roles), None)


def baseline() -> Implementation:
    """The dense kernel every comparison is a ratio to (JAX's Splash attention). Raises LookupError
    when none is registered."""
    return by_role(Role.BASELINE)


def tpu_kernels() -> list[Implementation]:
    """The implementations that compile to Pallas TPU kernels (Splash included)."""
    return [impl for impl in IMPLEMENTATIONS.values() if impl.is_pallas]


def owner_of_kernel(kernel: str) -> Implementation | None:
    """The implementation whose Pallas kernel is named ``kernel`` in a compiled program, if any."""
    return next((impl for impl in IMPLEMENTATIONS.values() if impl.owns_kernel(kernel)), None)


__all__ = [
    "AUTO",
    "AUTO_SITUATIONS",
    "DEFAULT_IMPL",
    "IMPLEMENTATIONS",
    "Backward",
    "Capabilities",
    "Config",
    "Implementation",
    "NoOptions",
    "Role",
    "ScheduleCounts",
    "auto_situation",
    "baseline",
    "by_role",
    "choose",
    "get",
    "owner_of_kernel",
    "register",
    "tpu_kernels",
]
