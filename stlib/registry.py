"""The implementation registry: every attention implementation is an ``Implementation`` (the op:
what runs), registered once with the two adapters the rest of stlib reads about it.

* The op: ``forward``; ``config`` resolves the blocks and options of a call once (the forward, the
  estimator and the sweeps all ask it); ``supports`` says what it accepts (shared kv heads, its own
  v head dim, a mask, a chip); ``work`` what it computes (roofline, benchmarks); ``plan_runner`` a
  routed plan; ``backward`` its training path (joined into a ``custom_vjp`` by ``trainable``);
  ``roles`` what the rest of stlib asks ``by_role`` for.
* ``EstimatorHooks`` (``Implementation.estimator``; None: no Pallas kernel): how the static estimator
  reads its compiled kernels (their names, the conditional regions of a step, how often each runs,
  the blocks a tuned estimate sweeps).
* ``Presentation`` (``Implementation.presentation``): how benchmarks, sweeps and plots name and vary
  it (title, variants, block-sweep candidates and the facts a sweep records beside each).

``impl="auto"`` reads one table, ``AUTO_PICKS`` (situation -> roles in order). Adding a kernel is
its own file plus one ``register`` call (its import in ``stlib/kernels/__init__.py``): nothing else
names it.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from stlib.contract import Backward, Capabilities, Config, EstimatorHooks, NoOptions, Presentation
from stlib.device import current_chip


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
class Implementation:
    """One attention implementation (the op).

    ``forward(q, k, v, mask, *, scale, config, interpret)`` -> [H, L, D] gets validated inputs
    (``stlib.api``) and the call's ``Config``, resolved once by ``config`` (its ``options`` an
    instance of ``options_type``, its blocks by ``resolve``): no forward resolves again.
    ``work(layout, num_heads, head_dim, options)`` -> ``KernelWork`` (grid steps, computed and
    masked tiles, flops) on a tile layout. ``chips``: the chips it compiles for. ``resolve(mask,
    length, block_q, block_kv, options, interpret, chip)`` -> (blocks with ``block_q``, ``block_kv``,
    ``block_kv_compute``; options with the chunk resolved): the one rule by which it picks its
    blocks (None: it has none). ``capabilities``: see ``Capabilities``. ``plan_runner(q, k, v,
    plan, *, scale, options, interpret)`` runs a routed ``stlib.routing.SvgPlan`` with the plan's
    own tile layout (None: the plan's masks go through ``forward``). ``stack_forward(q, k, v, stack,
    block, *, scale, config, interpret) -> (o, lse [H, L] f32)`` runs block ``block`` (a traced int32)
    of a ``stlib.masks.StackedBlocks`` with one compiled kernel for every block (a ring's hops; None:
    a kernel a block). ``prepare(mask, length, config, interpret)`` -> ``stlib.plan.KernelPlan``:
    what a call derives from its mask, built once in ``kernel_call`` and given to its forward,
    backward and stack forward as ``plan`` (None: they take no plan). ``backward``: its training path
    (``Backward``; None: differentiable only where ``forward`` is plain JAX). ``roles``: the
    ``Role`` entries it holds (one holder a role). ``estimator`` and ``presentation``: its adapters,
    given to ``register``.
    """

    name: str
    forward: Callable
    description: str
    options_type: type = NoOptions
    work: Callable | None = None
    chips: tuple[str, ...] = ()
    resolve: Callable | None = (
        None  # (mask, length, block_q, block_kv, options, interpret, chip) -> (blocks, options)
    )
    capabilities: Capabilities = field(default_factory=Capabilities)
    plan_runner: Callable | None = None
    stack_forward: Callable | None = None
    prepare: Callable | None = None  # (mask, length, config, interpret) -> stlib.plan.KernelPlan
    backward: Backward | None = None
    roles: frozenset = frozenset()  # the ``Role`` entries it holds
    estimator: EstimatorHooks | None = None  # set by ``register``
    presentation: Presentation = field(default_factory=Presentation)  # set by ``register``

    def __repr__(self) -> str:
        return f"<stlib implementation {self.name!r}: {self.description}>"

    def comparison_runs(self) -> list[tuple[str, dict]]:
        """(label, options) of each variant the benchmark and estimate comparisons run: its
        ``variants``, or its defaults under its title."""
        title, variants = self.title, self.presentation.variants
        if not variants:
            return [(title, {})]
        return [(f"{title} {label}", dict(options)) for label, options in variants.items()]

    @property
    def title(self) -> str:
        """How comparisons name it (its presentation's title, else its name)."""
        return self.presentation.title or self.name

    def kernel_call(
        self, mask, length: int, *, scale: float, block_q=None, block_kv=None, options=None, interpret=None
    ) -> dict:
        """The keywords ``forward`` and ``backward`` take for a call on ``length`` tokens with ``mask``:
        ``scale``, the ``Config`` (``config``: blocks and options resolved here, once),
        ``interpret`` and, where the implementation prepares one, the call's ``plan`` (built here,
        once). Raises TypeError / ValueError for bad options or blocks."""
        config = self.config(mask, length, block_q, block_kv, options, interpret=interpret)
        call = {"scale": scale, "config": config, "interpret": interpret}
        if self.prepare is not None:
            call["plan"] = self.prepare(mask, length, config, interpret)
        return call

    def trainable(self, mask, call: dict, primal: Callable | None = None) -> Callable:
        """(q, k, v) -> o: ``forward`` with ``mask`` and ``call`` (its keywords, ``kernel_call``) as a function whose
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
        """Whether it compiles to Pallas kernels that the estimator reads (its ``estimator``)."""
        return self.estimator is not None

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
        when ``interpret`` is False) and the chip it is sized for (``Config.chip``: the one place
        a call looks up the TPU at hand). Raises TypeError / ValueError for bad options or blocks."""
        options = self.options(options)
        chip = getattr(options, "chip", None) or current_chip()
        if self.resolve is None:
            return Config(None, None, None, options, chip)
        sizes, options = self.resolve(mask, length, block_q, block_kv, options, interpret, chip)
        return Config(sizes.block_q, sizes.block_kv, sizes.block_kv_compute, options, chip)

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
        forward's or its backward's); a kernel called under ``jax.vmap`` is named ``vmap_<name>`` in
        the compiled program (a batch of rings).

        >>> import stlib.kernels
        >>> by_role(Role.BEST_TILE).owns_kernel("vmap_stlib_tile_ld_p0_p1_.3")
        True
        """
        kernel = _unbatched(kernel)
        return any(hooks.kernel_names and kernel.startswith(hooks.kernel_names) for hooks in self._hooks())

    def _hooks(self) -> list[EstimatorHooks]:
        """Its estimator hooks and its backward's, where it has them."""
        hooks = [self.estimator, self.backward.estimator if self.backward else None]
        return [h for h in hooks if h is not None]

    def schedule_rules(self, kernel: str) -> tuple[Callable | None, Callable | None]:
        """(compute_regions, schedule_counts) of the compiled kernel ``kernel``: the backward's for
        one of its backward's kernels, else the implementation's."""
        hooks = self._hooks_of(kernel)
        return (None, None) if hooks is None else (hooks.compute_regions, hooks.schedule_counts)

    def edge_regions(self, kernel: str) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
        """The names of ``kernel``'s step regions before and after its compute, by position, where
        its rules name them (``EstimatorHooks.edge_regions``); None: "init" before, "finalise" after."""
        hooks = self._hooks_of(kernel)
        rule = hooks.edge_regions if hooks is not None else None
        return rule(kernel) if rule is not None else None

    def _hooks_of(self, kernel: str) -> EstimatorHooks | None:
        """The estimator hooks of the compiled kernel ``kernel`` (a vmapped one too): its backward's
        for one of its backward's kernels, else its own."""
        backward = self.backward.estimator if self.backward else None
        if backward and _unbatched(kernel).startswith(backward.kernel_names):
            return backward
        return self.estimator


def _unbatched(kernel: str) -> str:
    """A compiled kernel's name without the ``vmap_`` prefixes ``jax.vmap`` gives it."""
    while kernel.startswith("vmap_"):
        kernel = kernel.removeprefix("vmap_")
    return kernel


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
#: Any backend without a row of its own in ``AUTO_PICKS``.
ANY_BACKEND = "*"


class Situation(NamedTuple):
    """What ``impl="auto"`` tells apart: the JAX ``backend`` ("tpu", "gpu", "cpu"; ``ANY_BACKEND``:
    one without a row of its own) and whether the call has a mask (``masked``)."""

    backend: str
    masked: bool

    def __str__(self) -> str:
        backend = "any other backend" if self.backend == ANY_BACKEND else self.backend
        return f"{backend}, {'masked' if self.masked else 'dense'}"


#: What ``impl="auto"`` runs, the one table of it, keyed by (backend, masked): the roles in order,
#: the first whose holder accepts the mask (``choose``). A mask the best tile kernel refuses goes to
#: Splash on a TPU, then to XLA; on any other backend (CPU, GPU: no Pallas TPU kernel runs compiled)
#: XLA, then (a short sequence whose mask table XLA refuses) the reference. A kernel for another
#: backend adds its rows from its own module (``AUTO_PICKS[Situation("gpu", True)] = ...``).
AUTO_PICKS: dict[Situation, tuple[Role, ...]] = {
    Situation("tpu", True): (Role.BEST_TILE, Role.BASELINE, Role.XLA),
    Situation("tpu", False): (Role.BASELINE,),
    Situation(ANY_BACKEND, True): (Role.XLA, Role.REFERENCE),
    Situation(ANY_BACKEND, False): (Role.XLA, Role.REFERENCE),
}


def register(
    implementation: Implementation,
    *,
    estimator: EstimatorHooks | None = None,
    presentation: Presentation | None = None,
) -> Implementation:
    """Make ``implementation`` available as ``stlib.attention(..., impl=implementation.name)``, with
    its estimator hooks (a Pallas implementation) and its presentation; returns the registered
    entry. Raises ValueError if the name is taken or a role already held."""
    if not isinstance(implementation, Implementation):
        raise TypeError(f"register takes an Implementation, got {type(implementation).__name__}")
    for name, value, kind in (
        ("estimator", estimator, EstimatorHooks),
        ("presentation", presentation, Presentation),
    ):
        if value is not None and not isinstance(value, kind):
            raise TypeError(
                f"{name}= takes {'an' if kind.__name__[0] in 'AEIOU' else 'a'} {kind.__name__}, got {type(value).__name__}"
            )
    implementation = dataclasses.replace(
        implementation,
        estimator=estimator or implementation.estimator,
        presentation=presentation or implementation.presentation,
    )
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


def auto_situation(mask=None, backend: str | None = None) -> Situation:
    """The ``AUTO_PICKS`` key of a call with ``mask`` (None: dense) on ``backend`` (None: JAX's
    default backend): its own row where the backend has one, else ``ANY_BACKEND``'s."""
    if backend is None:
        import jax

        backend = jax.default_backend()
    situation = Situation(backend, mask is not None)
    return situation if situation in AUTO_PICKS else situation._replace(backend=ANY_BACKEND)


def choose(impl: str, mask=None, *, backend: str | None = None) -> Implementation:
    """The implementation a call with ``impl`` runs: the registered one of that name, or for
    ``impl="auto"`` the first holder of ``AUTO_PICKS``'s roles for the call's situation
    (``auto_situation``) that accepts ``mask``. Raises ValueError for an unknown name, or when no
    ranked implementation accepts the mask (saying why each refused)."""
    if impl != AUTO:
        return get(impl)
    situation = auto_situation(mask, backend)
    ranked = [holder.name for role in AUTO_PICKS[situation] if (holder := _holder(role)) is not None]
    refusals = []
    for name in ranked:
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


def auto_rank(implementation: Implementation, situation: Situation) -> int | None:
    """Where ``impl="auto"`` places ``implementation`` in ``situation`` (0 first; None: never)."""
    ranked = [role for role in AUTO_PICKS[situation] if role in implementation.roles]
    return AUTO_PICKS[situation].index(ranked[0]) if ranked else None


def tpu_kernels() -> list[Implementation]:
    """The implementations that compile to Pallas TPU kernels (Splash included)."""
    return [impl for impl in IMPLEMENTATIONS.values() if impl.is_pallas]


def owner_of_kernel(kernel: str) -> Implementation | None:
    """The implementation whose Pallas kernel is named ``kernel`` in a compiled program, if any."""
    return next((impl for impl in IMPLEMENTATIONS.values() if impl.owns_kernel(kernel)), None)


__all__ = [
    "ANY_BACKEND",
    "AUTO",
    "AUTO_PICKS",
    "DEFAULT_IMPL",
    "IMPLEMENTATIONS",
    "Implementation",
    "Role",
    "Situation",
    "auto_rank",
    "auto_situation",
    "baseline",
    "by_role",
    "choose",
    "get",
    "owner_of_kernel",
    "register",
    "tpu_kernels",
]
