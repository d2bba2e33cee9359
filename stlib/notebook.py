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
import math
import os
from dataclasses import dataclass
from pathlib import Path

from stlib import checks, exercises, paths
from stlib.device import host_has_tpu

SIZES = ("small", "full", "auto")

#: Off a TPU, libtpu (loaded for deviceless compilation) looks for the TPU VM's accelerator type and
#: worker hostnames in the cloud metadata, fails, and prints a screen of warnings and a source-location
#: trace to stderr. Naming them answers its question; it changes nothing in what is compiled (the
#: deviceless topology is named per compile). Never set on a host with a TPU.
QUIET_LIBTPU_ENV = {"TPU_ACCELERATOR_TYPE": "v6e-4", "TPU_WORKER_HOSTNAMES": "localhost"}

#: Most grid steps a Pallas kernel may run in interpret mode when "full" was asked for off a TPU
#: (the small configuration runs a few hundred; dense attention at the case study runs 109,520).
INTERPRET_STEP_LIMIT = 20_000
#: The notebooks' own measurements on a TPU (``NotebookConfig.record``), under ``data/``.
MEASUREMENTS = "notebook_measurements.jsonl"


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

    def timed_figure(self, name: str) -> Path:
        """Where a figure showing times measured in this run goes: ``figures/NN_name.png`` on a TPU at
        the case-study size (the committed figures that show times are the chip's), else a folder of
        its own beside them (``figures/cpu/``, or ``figures/tpu-small/`` for a small run on a TPU), so
        no other run draws over the chip's."""
        if self.on_tpu and self.size == "full":
            return self.figure(name)
        return self.figures / ("tpu-small" if self.on_tpu else "cpu") / f"{name}.png"

    def record(self, notebook: str, what: str, **fields) -> dict | None:
        """On a TPU, append one record of a notebook's measurement to ``data/notebook_measurements.jsonl``
        (device kind, versions, revision, date, configuration and who wrote the exercises, "fill" or
        "hide", in front of ``fields``) and return it;
        elsewhere (interpret-mode times say nothing about a TPU) record nothing and return None."""
        if not self.on_tpu:
            return None
        from stlib.bench.records import Recorder

        solutions = "hide" if exercises.hidden() else "fill"
        return Recorder(self.data / MEASUREMENTS).write(
            {
                "notebook": notebook,
                "what": what,
                "size": self.size,
                "workload": self.workload.name,
                "solutions": solutions,
                **fields,
            }
        )

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
    TPU that can serve it (``shortfall``: else one sentence and small), small elsewhere. Raises
    SetupError (a ValueError) for anything else."""
    env = os.environ.get("STLIB_SIZE")
    chosen = (env or size or "auto").strip().lower()
    if chosen not in SIZES:
        where = f"STLIB_SIZE={env!r}" if env else f"size={size!r}"
        raise SetupError(
            f"{where} is not a size: use 'small', 'full' or 'auto' (full on a TPU, small elsewhere), "
            f"e.g. STLIB_SIZE=small or python -m stlib.reproduce --size small."
        )
    if chosen != "auto":
        return chosen
    if not on_tpu():
        return "small"
    short = shortfall()
    if short:
        print(
            f"this TPU host cannot serve the case-study size ({short}): the notebook runs the small configuration"
        )
        return "small"
    return "full"


#: What a host needs for the case-study size: HBM on the first device (a training step at 10 x 75,600 x
#: 128 holds a few GB; a TPU v5e has 15.7 GiB) and host memory (a process holding a v5e keeps about
#: 14 GB resident; the notebooks stay under 20 GB there).
MIN_HBM_BYTES, MIN_HOST_BYTES = 8 * 2**30, 24 * 2**30


def shortfall(hbm_bytes: int | None = None, host_bytes: int | None = None) -> str | None:
    """Why this host cannot serve the case-study size (one phrase), or None where it can. Read from the
    first device's ``memory_stats()["bytes_limit"]`` and the host's physical memory unless given.

    >>> shortfall(hbm_bytes=16 * 2**30, host_bytes=40 * 2**30) is None
    True
    >>> shortfall(hbm_bytes=4 * 2**30, host_bytes=40 * 2**30)
    '4.0 GiB of HBM on its first device, under the 8 GiB it needs'
    """
    if hbm_bytes is None:
        stats = jax.devices()[0].memory_stats() or {}
        hbm_bytes = stats.get("bytes_limit")
    if host_bytes is None:
        host_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if hbm_bytes is not None and hbm_bytes < MIN_HBM_BYTES:
        return f"{hbm_bytes / 2**30:.1f} GiB of HBM on its first device, under the {MIN_HBM_BYTES / 2**30:.0f} GiB it needs"
    if host_bytes < MIN_HOST_BYTES:
        return f"{host_bytes / 2**30:.1f} GiB of host memory, under the {MIN_HOST_BYTES / 2**30:.0f} GiB it needs"
    return None


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


#: The notebooks' checks (``stlib.checks``): one tolerance rule for every backend.
max_error, tolerance, check_close, passed = (
    checks.max_error,
    checks.tolerance,
    checks.check_close,
    checks.passed,
)


def time_side_by_side(
    cfg: NotebookConfig,
    compiled: dict,
    *args,
    rounds: int,
    trials: int,
    title: str,
    figure: str,
    notebook: str,
    what: str,
    baseline: str | None = None,
    **fields,
) -> dict:
    """How a notebook ends a kernel lesson: time the ``compiled`` calls (``{name: bench.Compiled}``,
    each already checked) on ``args`` side by side (``bench.time_interleaved``), print a table (median,
    min, max, compile seconds, each median over ``baseline``'s, default the fastest), draw their bars
    (``title``, then where they were measured) to ``cfg.timed_figure(figure)`` and keep them with
    ``cfg.record(notebook, what, ...)`` (``fields`` added; a TPU only). Returns {name: Timing}."""
    import dataclasses

    from stlib import bench, plotting

    timings = bench.time_interleaved(compiled, *args, rounds=rounds, trials=trials)
    base = timings[baseline].median_ms if baseline else min(t.median_ms for t in timings.values())
    width = max(len(name) for name in timings) + 2
    print(f"measured on {cfg.where}; the last column: each median over {baseline or 'the fastest'}'s")
    print(f"{'':<{width}} {'median ms':>10} {'min':>9} {'max':>9} {'compile s':>10} {'ratio':>8}")
    for name, t in timings.items():
        print(
            f"{name:<{width}} {t.median_ms:>10.2f} {t.min_ms:>9.2f} {t.max_ms:>9.2f} {t.compile_ms / 1e3:>10.1f} "
            f"{t.median_ms / base:>8.2f}"
        )
    calls = min(t.trials for t in timings.values())
    records = [
        {**bench.environment(), "interpret": cfg.interpret, "label": name, **dataclasses.asdict(t)}
        for name, t in timings.items()
    ]
    fig = plotting.latency_bars(
        records, f"{title}\nmeasured on {cfg.where}; median of {calls} calls, whiskers min-max"
    )
    plotting.save(fig, cfg.timed_figure(figure))
    kept = cfg.record(
        notebook,
        what,
        rounds=rounds,
        trials=trials,
        **fields,
        cases=[{"label": name, **dataclasses.asdict(t)} for name, t in timings.items()],
    )
    if kept:
        print(f"recorded in data/{MEASUREMENTS} ({kept['device_kind']}, revision {kept.get('git_rev')})")
    return timings
