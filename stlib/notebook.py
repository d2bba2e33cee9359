"""The first cell of every notebook: what we run on, and which sizes to use.

``setup(size)`` prints the JAX version, backend and device kind and returns a ``NotebookConfig``.
One size switch for every notebook: ``size`` ("full" / "small" / "auto" or None) comes from the
notebook's tagged parameters cell; the environment variable ``STLIB_SIZE`` (``python -m
stlib.reproduce --size``) overrides it. Automatic: the case-study sizes on a TPU, small sizes
elsewhere. "full" off a TPU runs the analytic and compile-only cells at the case-study size and
refuses Pallas kernels in interpret mode at that size (hours on a CPU) with one sentence.
Nothing here asserts that a TPU is present.

Importing this module also quiets libtpu's initialisation chatter on hosts without a TPU
(``quiet_libtpu``): it must run before JAX initialises its backends.
"""

from __future__ import annotations

import functools
import glob
import math
import os
from dataclasses import dataclass
from pathlib import Path

from stlib import exercises, paths

SIZES = ("small", "full", "auto")

#: Off a TPU, libtpu (loaded for deviceless compilation) looks for the TPU VM's accelerator type and
#: worker hostnames in the cloud metadata, fails, and prints a screen of warnings and a source-location
#: trace to stderr. Naming them answers its question; it changes nothing in what is compiled (the
#: deviceless topology is named per compile). Never set on a host with a TPU.
QUIET_LIBTPU_ENV = {"TPU_ACCELERATOR_TYPE": "v6e-4", "TPU_WORKER_HOSTNAMES": "localhost"}

#: Most grid steps a Pallas kernel may run in interpret mode when "full" was asked for off a TPU
#: (the small configuration runs a few hundred; dense attention at the case study runs 109,520).
INTERPRET_STEP_LIMIT = 20_000


def host_has_tpu() -> bool:
    """Whether a TPU chip (a Google PCI device) is attached to this host; read from sysfs, without
    initialising JAX (the same test as JAX's own ``hardware_utils``)."""
    return any(Path(v).read_text().strip() == "0x1ae0" for v in glob.glob("/sys/bus/pci/devices/*/vendor"))


def quiet_libtpu(environ=os.environ) -> dict:
    """On a host without a TPU, set ``QUIET_LIBTPU_ENV`` in ``environ`` where not already set (the
    kernels and subprocesses that inherit it stay quiet too); return what was set."""
    if host_has_tpu():
        return {}
    added = {k: v for k, v in QUIET_LIBTPU_ENV.items() if k not in environ}
    environ.update(added)
    return added


quiet_libtpu()  # before JAX initialises its backends (the first jax.devices() call)

import jax
import jax.numpy as jnp

from stlib.configs import CASE_STUDY, SMALL_CPU, Workload
from stlib.device import backend, device_kind, on_tpu


class SetupError(ValueError):
    """A notebook asked for something it cannot do here; shown in a notebook as its one sentence
    (IPython prints ``_render_traceback_`` instead of a traceback)."""

    def _render_traceback_(self) -> list[str]:
        return [f"{type(self).__name__}: {self}"]


@dataclass(frozen=True)
class NotebookConfig:
    size: str  # "full" or "small"
    workload: Workload
    interpret: bool  # Pallas interpret mode (no TPU)
    block_q: int
    block_kv: int
    figures: Path
    data: Path

    @property
    def on_tpu(self) -> bool:
        return not self.interpret

    def figure(self, name: str) -> Path:
        """figures/NN_name.png"""
        return self.figures / f"{name}.png"

    @property
    def where(self) -> str:
        """Backend words for titles: 'TPU v6e lite' or 'CPU (Pallas interpret mode)'."""
        return device_kind() if self.on_tpu else f"{backend().upper()} (Pallas interpret mode: not TPU times)"


def home() -> Path:
    """Where figures/ and data/ go (``stlib.paths.home``, read at each call): ``STLIB_HOME`` if set,
    else the repository when stlib runs from a clone (editable install or sys.path), else the working
    directory (stlib pip-installed, as in Colab)."""
    return paths.home()


def resolve_size(size: str | None = None) -> str:
    """ "full" or "small": ``STLIB_SIZE`` if set, else ``size``; "auto" / None / "" mean full on a
    TPU, small elsewhere. Raises SetupError (a ValueError) for anything else."""
    env = os.environ.get("STLIB_SIZE")
    chosen = (env or size or "auto").strip().lower()
    if chosen not in SIZES:
        where = f"STLIB_SIZE={env!r}" if env else f"size={size!r}"
        raise SetupError(
            f"{where} is not a size: use 'small', 'full' or 'auto' (full on a TPU, small elsewhere), "
            f"e.g. STLIB_SIZE=small or python -m stlib.reproduce --size small."
        )
    return ("full" if on_tpu() else "small") if chosen == "auto" else chosen


class InterpretAtFullSize(SetupError):
    """A Pallas kernel in interpret mode at the full size, off a TPU."""


_interpret_step_limit: int | None = None  # set by setup("full") off a TPU


def _grid_steps(grid_spec, grid) -> int:
    grid = getattr(grid_spec, "grid", None) or grid or ()
    grid = (grid,) if isinstance(grid, int) else tuple(grid)
    return math.prod(g if isinstance(g, int) else 1 for g in grid)


def _install_interpret_guard() -> None:
    """Wrap ``jax.experimental.pallas.pallas_call`` (looked up as ``pl.pallas_call`` by stlib's
    kernels, Splash and the notebooks' own kernels) so that, once ``setup("full")`` ran off a TPU, an
    interpret-mode call over more than ``INTERPRET_STEP_LIMIT`` grid steps raises InterpretAtFullSize.
    Compiled calls (deviceless compilation for TPU) and small interpret-mode calls pass through."""
    from jax.experimental import pallas as pl

    if getattr(pl.pallas_call, "_stlib_guard", False):
        return
    original = pl.pallas_call

    @functools.wraps(original)
    def pallas_call(kernel, *args, interpret=False, grid_spec=None, grid=(), **kwargs):
        limit = _interpret_step_limit
        if interpret and limit is not None and (steps := _grid_steps(grid_spec, grid)) > limit:
            raise InterpretAtFullSize(
                f"size 'full' on {backend().upper()} would run this Pallas kernel in interpret mode over "
                f"{steps:,} grid steps (hours; only a TPU runs it at the case-study size): rerun with "
                f"STLIB_SIZE=small (or auto), or on a TPU."
            )
        return original(kernel, *args, interpret=interpret, grid_spec=grid_spec, grid=grid, **kwargs)

    pallas_call._stlib_guard = True
    pl.pallas_call = pallas_call


def setup(size: str | None = None, *, solutions: str | None = None) -> NotebookConfig:
    """Report the platform and pick the configuration (see the module docstring). Raises SetupError
    for an unknown size. ``solutions`` ("fill" or "hide", ``$STLIB_SOLUTIONS`` wins): who writes the
    notebook's fill-in exercises (``stlib.exercises``); None: a notebook without any."""
    global _interpret_step_limit
    size = resolve_size(size)
    if solutions is not None:
        try:
            exercises.set_mode(solutions)
        except ValueError as error:
            raise SetupError(str(error)) from None
    workload = CASE_STUDY if size == "full" else SMALL_CPU
    config = NotebookConfig(
        size=size,
        workload=workload,
        interpret=not on_tpu(),
        block_q=512 if size == "full" else 128,
        block_kv=1024 if size == "full" else 128,
        figures=paths.figures_dir(),
        data=paths.data_dir(),
    )
    refuse = size == "full" and config.interpret
    _interpret_step_limit = INTERPRET_STEP_LIMIT if refuse else None
    if refuse:
        _install_interpret_guard()
    print(f"JAX {jax.__version__} | backend {backend()} | device {device_kind()}")
    print(
        f"configuration: {size} -> {workload.name}: grid {workload.grid.shape} = {workload.num_tokens:,} tokens, "
        f"{workload.num_heads} heads x {workload.head_dim}, {jnp.dtype(workload.dtype).name}; "
        f"tiles {config.block_q} x {config.block_kv}; "
        + ("compiled Pallas kernels" if config.on_tpu else "Pallas interpret mode (times are not TPU times)")
    )
    print(auto_choice())
    if solutions is not None:
        print(exercises.describe())
    if refuse:
        print(
            "full size off a TPU: analytic and compile-only cells run at the case-study size; Pallas kernels "
            f"in interpret mode over more than {INTERPRET_STEP_LIMIT:,} grid steps are refused (STLIB_SIZE=small "
            "runs them all)"
        )
    return config


def auto_choice() -> str:
    """What ``impl="auto"`` runs on this backend, with a mask and without one (one line)."""
    from stlib import masks
    from stlib.registry import AUTO, choose

    masked = choose(AUTO, masks.full(8)).name
    dense = choose(AUTO, None).name
    return f"impl={AUTO!r} (the default) runs {masked!r} with a mask, {dense!r} without one, on {backend()}"


def max_error(out, q, k, v, mask=None, rows: int = 384) -> float:
    """max |out - reference| for [H, L, D] attention output ``out``: over every row when L fits the
    materialising reference (``registry.by_role(Role.REFERENCE).capabilities.max_length``), else over ``rows`` query rows at the
    start, middle and end of the sequence (the reference on those rows only, never L x L)."""
    import numpy as np

    from stlib.api import attention
    from stlib.reference import reference_attention
    from stlib.registry import Role, by_role

    reference = by_role(Role.REFERENCE)

    length, n = q.shape[1], rows // 3
    if length <= reference.capabilities.max_length:  # one compiled program, not an op at a time

        def gap(out, q, k, v):
            ref = attention(q, k, v, mask, impl=reference.name)
            return jnp.max(jnp.abs(out.astype(jnp.float32) - ref.astype(jnp.float32)))

        return float(jax.jit(gap)(out, q, k, v))
    err = 0.0
    heads = [0] if mask is None or mask.num_heads is None else range(mask.num_heads)
    for q0 in (0, (length - n) // 2, length - n):
        dense = None if mask is None else np.stack([mask.block(q0, q0 + n, 0, length, h) for h in heads])
        ref = reference_attention(q[:, q0 : q0 + n], k, v, dense, q.shape[2] ** -0.5)
        err = max(
            err, float(jnp.max(jnp.abs(out[:, q0 : q0 + n].astype(jnp.float32) - ref.astype(jnp.float32))))
        )
    return err


def tolerance(dtype) -> float:
    """Max error allowed against the float32 reference: bf16 inputs meet bf16 probabilities on the
    MXU; float32 is exact to rounding on a CPU, default-precision matmuls on a TPU."""
    return 2e-2 if dtype == jnp.bfloat16 else (1e-4 if jax.default_backend() == "cpu" else 1e-2)
