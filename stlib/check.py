"""``python -m stlib.check``: is every implementation right on this chip?

Every registered implementation on catalogue masks (``stlib.masks.case_study_masks``; ``DEFAULT_MASKS``
unless ``--mask``) at the case-study size (``stlib.CASE_STUDY``: 10 heads x 75,600 tokens x 128,
bfloat16) on a TPU, ``stlib.SMALL_CPU`` elsewhere (``--size``), forward and gradients, against the
float32 HIGHEST reference (``stlib.reference``) on sampled query rows (``checks.reference_rows``),
never an [H, L, L] array. The gradients are those of sum(o[:, rows] * g), g a fixed random cotangent
on the sampled rows only: dq is nonzero on those rows alone and dk, dv sum over them alone, so the
reference's are exact from the rows (``reference_gradients``); all of dq (zeros elsewhere), dk and
dv are compared.

Errors are ``checks.scaled_error`` against ``checks.tolerance(dtype)``: at the case study outputs
average thousands of keys and gradients are smaller still, where an absolute error passes a wrong
answer (an all-zero output of the full mask is 0.027 from the reference). Refused, not failed: a
mask or length an implementation does not take, a Pallas kernel in interpret mode at the full size
off a TPU (hours), a program beyond the device's free memory (``memory_shortfall``) and an autodiff
gradient whose residuals exceed ``GRADIENT_RESIDUAL_LIMIT`` (a gradient refused: the forward is still
checked). A case that raises is an error, and the run goes on. A line per case, a table at the end,
a record per case in ``data/check.jsonl`` (``Recorder``: backend, device kind, versions, revision);
exit status 1 if a case failed or raised.

    python -m stlib.check                       # full on a TPU, small elsewhere
    python -m stlib.check --size small --impl xla --mask full "band" --no-grad
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from stlib import checks, paths, registry
from stlib.configs import CASE_STUDY, SMALL_CPU, Workload
from stlib.masks import Mask, case_study_masks

#: The catalogue masks checked unless ``--mask`` names others ("all": every one): a band (partial
#: and full tiles; Splash takes it too) and the case study's sliding tile in its 3-D tiled order (a
#: padded permutation). Each mask compiles a forward and a backward per kernel, seconds to tens of
#: seconds each at the case-study size; the lane-dense backward of the per-head SVG mix took 250 to
#: 1,300 s to compile for a v5e (``data/backward_compiles.jsonl``).
DEFAULT_MASKS = ("band (density 0.25)", "sliding tile, 3-D tiled order")
#: Query rows the reference computes (``checks.reference_rows``: a third each at the start, middle, end).
ROWS = 384
#: Largest residuals (bytes) a gradient may keep between its forward and backward here: JAX's
#: autodiff of a plain-JAX forward keeps every step of its scan over tiles (terabytes at 75,600 tokens).
GRADIENT_RESIDUAL_LIMIT = 4 << 30
#: Free device memory left over by a program the check runs (an allocator's slack): at the case study
#: Splash's fused backward needs 15.64 GiB beside its inputs (dq partials in HBM), a v5e about 15.7.
MEMORY_MARGIN = 1 << 28
GRADIENTS = ("dq", "dk", "dv")
#: Where the records go, under ``stlib.paths.data_dir()``.
RECORDS = "check.jsonl"


@dataclass(frozen=True)
class CaseResult:
    """One implementation on one mask: ``status`` "PASSED", "FAILED", "refused" or "error";
    ``errors`` by what was compared ("fwd" the forward, "fwd (train)" the output of the gradient's
    forward, "dq", "dk", "dv"); ``reason`` why it was refused or what it raised; ``grad`` "" where
    the gradients were checked, else why not; ``seconds`` in all, ``times`` by part ("fwd", "grad":
    compiles included)."""

    impl: str
    mask: str
    status: str
    errors: dict = dataclasses.field(default_factory=dict)
    tolerance: float | None = None
    reason: str = ""
    grad: str = ""
    seconds: float = 0.0
    times: dict = dataclasses.field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status in ("PASSED", "refused")

    def line(self) -> str:
        """``PASSED pallas_tile (full) fwd 1.2e-03 dq ... (<= 3e-02)``, or why it was refused or failed."""
        head = f"{self.status} {self.impl} ({self.mask})"
        if self.status in ("refused", "error"):
            return f"{head}: {_cut(self.reason)}"
        shown = {"fwd": max(v for k, v in self.errors.items() if k.startswith("fwd"))}
        shown |= {k: v for k, v in self.errors.items() if k in GRADIENTS}
        text = " ".join(f"{k} {v:.1e}" for k, v in shown.items())
        grad = f"; gradients not checked: {_cut(self.grad)}" if self.grad else ""
        over = [k for k, v in self.errors.items() if not v <= self.tolerance]
        over = f" over the tolerance: {', '.join(over)}" if over else ""
        return f"{head} {text} (<= {self.tolerance:.0e}, {self.seconds:.0f} s){over}{grad}"


def _cut(text: str, width: int = 160) -> str:
    """``text`` cut to ``width`` characters (the record keeps it whole)."""
    return text if len(text) <= width else text[: width - 3] + "..."


# --------------------------------------------------------------------------------------------
# what is checked


def workload_of(size: str) -> Workload:
    """The workload of a size: "full" the case study, "small" ``SMALL_CPU``."""
    return CASE_STUDY if size == "full" else SMALL_CPU


def catalogue(workload: Workload) -> dict[str, Mask]:
    """The catalogue masks on ``workload``'s grid and heads, its sliding tile the workload's own
    (``sta_tile``, ``bench.cases.workload_sta_window``)."""
    from stlib.bench.cases import workload_sta_window

    return case_study_masks(
        workload.grid,
        workload.num_heads,
        sta_tile=workload.sta_tile,
        sta_window=workload_sta_window(workload),
    )


def pick(names: Sequence[str] | None, known: Sequence[str], what: str) -> list[str]:
    """The entries of ``known`` that ``names`` name: each exactly, or by a prefix (any case) that
    only one entry has; "all" every one. Raises ValueError naming the known ones."""
    if not names or list(names) == ["all"]:
        return list(known)
    picked = []
    for name in names:
        found = [k for k in known if k == name] or [k for k in known if k.lower().startswith(name.lower())]
        if len(found) != 1:
            problem = "is unknown" if not found else f"names {len(found)} of them"
            raise ValueError(f"{what} {name!r} {problem}; choose among {list(known)} or 'all'")
        picked += [f for f in found if f not in picked]
    return picked


def refusal(implementation, mask: Mask, num_heads: int) -> str | None:
    """Why ``implementation`` is not run on ``mask`` here (None: it is): what it says it cannot take
    (``unsupported``: the reference past its length among them), or what ``stlib.attention`` refuses
    of a Pallas kernel in interpret mode (``INTERPRET_PAIR_LIMIT``: hours on a CPU)."""
    from stlib.api import check_interpret_size

    reason = implementation.unsupported(mask=mask)
    if reason is not None:
        return reason
    try:
        check_interpret_size(implementation, (num_heads, mask.length, None), None, False)
    except ValueError as error:
        return str(error)
    return None


def _gradient_refusal(implementation, forward, q, k, v) -> str | None:
    """Why the gradient of ``forward`` is not checked (None: it is): none exists (an
    implementation without a backward whose forward JAX cannot differentiate), or its residuals
    exceed ``GRADIENT_RESIDUAL_LIMIT``. Traced only (``jax.eval_shape``): nothing runs."""
    try:
        residuals = jax.eval_shape(lambda q, k, v: jax.vjp(forward, q, k, v)[1], q, k, v)
    except Exception as error:
        if implementation.backward is not None:
            raise
        return f"impl={implementation.name!r} has no backward ({_one_line(error)})"
    size = sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(residuals))
    if size > GRADIENT_RESIDUAL_LIMIT:
        return (
            f"its gradient (JAX's autodiff of its forward) would keep {size / 2**30:.3g} GiB of residuals, "
            f"more than the {GRADIENT_RESIDUAL_LIMIT / 2**30:.3g} GiB this check allows"
        )
    return None


def memory_shortfall(compiled, args, stats: dict | None = None) -> str | None:
    """Why the compiled program ``compiled`` is not run on ``args`` (None: it is): the device's free
    memory (``stats``, default the device's ``memory_stats()``; a CPU has none: never refused) is less
    than what it needs beyond ``args``, resident already (``memory_analysis``: its arguments, outputs
    and temporaries), and ``MEMORY_MARGIN``."""
    if stats is None:
        stats = next(iter(args[0].devices())).memory_stats()
    analysis = compiled.memory_analysis()
    if not stats or "bytes_limit" not in stats or analysis is None:
        return None
    parts = ("argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes")
    need = sum(getattr(analysis, part, 0) for part in parts) - sum(x.nbytes for x in args)
    free = stats["bytes_limit"] - stats.get("bytes_in_use", 0)
    if need + MEMORY_MARGIN <= free:
        return None
    return f"needs {need / 2**30:.2f} GiB of the device's memory, {free / 2**30:.2f} GiB free"


def _compile_within_memory(function, args) -> tuple[object, str | None]:
    """(``function`` compiled for ``args``, None), or (None, why it is not run): its compile ran out
    of the device's memory (a TPU compile refuses a program past its HBM: RESOURCE_EXHAUSTED), or
    it needs more than is free (``memory_shortfall``). Any other error is raised."""
    try:
        compiled = jax.jit(function).lower(*args).compile()
    except Exception as error:
        if "RESOURCE_EXHAUSTED" not in str(error):
            raise
        return None, f"does not fit the device's memory ({_one_line(error)})"
    return compiled, memory_shortfall(compiled, args)


def _one_line(error: BaseException) -> str:
    """The first non-empty line of an exception, with its type, cut to 200 characters."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {(lines or ['?'])[0]}"[:200]


# --------------------------------------------------------------------------------------------
# the reference on sampled rows


@dataclass(frozen=True)
class Inputs:
    """q, k, v [H, L, D] of the workload's dtype, the sampled rows, the cotangent ``g`` [H, rows, D]
    on them (that dtype) and the full cotangent of the output (``g`` on the rows, zeros elsewhere)."""

    q: jax.Array
    k: jax.Array
    v: jax.Array
    rows: np.ndarray
    g: jax.Array
    cotangent: jax.Array


def inputs(shape: tuple[int, int, int], dtype, rows: int, seed: int) -> Inputs:
    """The seeded inputs of a check on [H, L, D] ``shape`` (``stlib.random_qkv``), ``rows`` rows."""
    from stlib.api import random_qkv

    q, k, v = random_qkv(shape, dtype, seed)
    picked = checks.reference_rows(shape[1], rows)
    g = jax.random.normal(jax.random.key(seed + 1), (shape[0], picked.size, shape[2])).astype(dtype)
    cotangent = jnp.zeros(shape, dtype).at[:, picked].set(g)
    return Inputs(q, k, v, picked, g, cotangent)


def reference(data: Inputs, mask: Mask) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """(o on the sampled rows, dq [H, L, D] zeros off them, dk, dv) of ``mask`` in float32, from the
    sampled rows alone (``checks.reference_on_rows``: never L x L)."""
    o, dq_rows, dk, dv = checks.reference_on_rows(data.q, data.k, data.v, mask, data.rows, data.g)
    return o, jnp.zeros(data.q.shape, jnp.float32).at[:, data.rows].set(dq_rows), dk, dv


# --------------------------------------------------------------------------------------------
# one case


def check_case(
    implementation,
    mask_name: str,
    mask: Mask,
    data: Inputs,
    want,
    *,
    grad: bool = True,
    refused: str | None = None,
) -> CaseResult:
    """``implementation`` on ``mask`` with ``data`` against the reference ``want`` (``reference``; a
    string: why the reference failed): the forward, then (``grad``) the output and gradients of
    sum(o[:, rows] * g); ``refused`` (``refusal``'s reason): not run. Refusals and errors are
    results, never raised."""
    from stlib.api import attention

    start = time.perf_counter()
    name = implementation.name
    tol = checks.tolerance(data.q.dtype)

    def result(status, **fields):
        return CaseResult(
            name, mask_name, status, tolerance=tol, seconds=time.perf_counter() - start, **fields
        )

    if refused is not None:
        return result("refused", reason=refused)
    if isinstance(want, str):
        return result("error", reason=want)

    def forward(q, k, v):
        return attention(q, k, v, mask, impl=name)

    def train(q, k, v, cotangent):
        o, vjp = jax.vjp(forward, q, k, v)
        return (o[:, rows], *vjp(cotangent))

    rows, qkv = data.rows, (data.q, data.k, data.v)
    errors, times = {}, {}
    try:
        compiled, short = _compile_within_memory(lambda q, k, v: forward(q, k, v)[:, rows], qkv)
        if short is not None:
            return result("refused", reason=f"its forward {short}")
        errors["fwd"] = checks.scaled_error(compiled(*qkv), want[0])
        times["fwd"] = time.perf_counter() - start
        why_not = _gradient_refusal(implementation, forward, *qkv) if grad else "--no-grad"
        if why_not is None:
            compiled, why_not = _compile_within_memory(train, (*qkv, data.cotangent))
            why_not = None if why_not is None else f"its gradient {why_not}"
        if why_not is None:
            o, *gradients = compiled(*qkv, data.cotangent)
            errors["fwd (train)"] = checks.scaled_error(o, want[0])
            errors |= {k: checks.scaled_error(got, w) for k, got, w in zip(GRADIENTS, gradients, want[1:])}
            del o, gradients
            times["grad"] = time.perf_counter() - start - times["fwd"]
    except Exception as error:  # noqa: BLE001 - a case that raises is reported and the run goes on
        return result("error", errors=errors, reason=_one_line(error), times=times)
    status = "PASSED" if all(e <= tol for e in errors.values()) else "FAILED"  # NaN fails
    return result(status, errors=errors, grad="" if why_not is None else why_not, times=times)


# --------------------------------------------------------------------------------------------
# the run


def run_check(
    size: str,
    impls: Sequence[str] | None = None,
    masks: Sequence[str] | None = None,
    *,
    grad: bool = True,
    out: Path | None = None,
    rows: int = ROWS,
    seed: int = 0,
    stream=None,
    workload: Workload | None = None,
) -> list[CaseResult]:
    """Check ``impls`` (names; None: every registered one) on ``masks`` (catalogue names or unique
    prefixes; None: ``DEFAULT_MASKS``; ["all"]: the catalogue) at ``size`` ("full" / "small"; or
    ``workload`` itself), a line per case on ``stream`` (stdout) and a record per case appended to
    ``out`` (default ``data/check.jsonl`` of ``stlib.paths``). Returns the results. Raises ValueError
    for an unknown implementation or mask."""
    import stlib.kernels  # noqa: F401  (registers the kernels)
    from stlib.bench.progress import Progress
    from stlib.bench.records import Recorder
    from stlib.device import resolve_interpret

    if rows < 3:
        raise ValueError(f"rows={rows} must be at least 3 (a third at the start, middle and end)")
    workload = workload or workload_of(size)
    implementations = [registry.get(name) for name in (impls or list(registry.IMPLEMENTATIONS))]
    known = catalogue(workload)
    names = pick(masks or list(_defaults(known)), list(known), "mask")
    recorder = Recorder(Path(out) if out is not None else paths.data_dir() / RECORDS)
    heads, dim, dtype = workload.num_heads, workload.head_dim, workload.dtype
    total = len(names) * len(implementations)
    results = []
    with Progress(total, "check", stream=stream) as bar:
        bar.write(
            f"checking {len(implementations)} implementations x {len(names)} masks = {total} cases at "
            f"{workload.name} ({heads} heads x {workload.num_tokens:,} tokens x {dim}, {jnp.dtype(dtype).name}) "
            f"on {_where()}, {'forward and gradients' if grad else 'forward only'}, {rows} sampled query rows"
        )
        if size == "full" and resolve_interpret(None):
            bar.write("no TPU here: the Pallas kernels are refused at the full size (interpret mode: hours)")
        by_length = {}  # the masks of one length share their inputs
        for mask_name in names:
            mask = known[mask_name]
            if mask.length not in by_length:
                by_length[mask.length] = inputs((heads, mask.length, dim), dtype, rows, seed)
            data = by_length[mask.length]
            want, took = None, None
            for implementation in implementations:
                refused = refusal(implementation, mask, heads)
                if refused is None and want is None:  # computed once a mask, where a case needs it
                    want, took = _reference_or_why(data, mask)
                result = check_case(implementation, mask_name, mask, data, want, grad=grad, refused=refused)
                results.append(result)
                recorder.write({**_record(result, workload, size, rows, grad), "reference_s": took})
                bar.step(result.line())
    return results


def _reference_or_why(data: Inputs, mask: Mask) -> tuple:
    """(``reference(data, mask)``, its seconds), or (the string saying what it raised, None)."""
    start = time.perf_counter()
    try:
        return reference(data, mask), time.perf_counter() - start
    except Exception as error:  # noqa: BLE001 - every case of the mask is an error
        return f"the reference raised {_one_line(error)}", None


def _defaults(known: dict) -> list[str]:
    return [name for name in known if any(name.startswith(d) for d in DEFAULT_MASKS)]


def _where() -> str:
    from stlib.device import backend, device_kind

    return f"{backend()} ({device_kind()})"


def _record(result: CaseResult, workload: Workload, size: str, rows: int, grad: bool) -> dict:
    return {
        "size": size,
        "workload": workload.name,
        "shape": list(workload.qkv_shape),
        "dtype": jnp.dtype(workload.dtype).name,
        "rows": rows,
        **dataclasses.asdict(result),
        "grad_asked": grad,
    }


def summary(results: Sequence[CaseResult]) -> str:
    """A table: a row per mask, a column per implementation, each cell its status and the worst error
    over what was compared ("fwd": the forward alone), then the count of each status."""
    impls = list(dict.fromkeys(r.impl for r in results))
    masks = list(dict.fromkeys(r.mask for r in results))
    cell = {(r.impl, r.mask): _cell(r) for r in results}
    first = max((len(m) for m in masks), default=0)
    widths = [max(len(i), 12) for i in impls]
    lines = [(" " * first + "  " + "  ".join(i.ljust(w) for i, w in zip(impls, widths))).rstrip()]
    for mask in masks:
        row = "  ".join(cell.get((i, mask), "").ljust(w) for i, w in zip(impls, widths))
        lines.append(f"{mask.ljust(first)}  {row}".rstrip())
    counts = {s: sum(r.status == s for r in results) for s in ("PASSED", "FAILED", "refused", "error")}
    lines.append(", ".join(f"{n} {s}" for s, n in counts.items()) + f" of {len(results)} cases")
    return "\n".join(lines)


def _cell(result: CaseResult) -> str:
    if result.status in ("refused", "error"):
        return result.status
    worst = max(result.errors.values())
    return f"{'ok' if result.status == 'PASSED' else 'FAILED'} {worst:.0e}" + (" fwd" if result.grad else "")


def main(argv=None) -> int:
    """The command line (see the module docstring); returns the exit status: 1 if a case failed."""
    from stlib.notebook import resolve_size  # quiets libtpu off a TPU before JAX starts

    parser = argparse.ArgumentParser(
        prog="python -m stlib.check",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--size",
        choices=["small", "full", "auto"],
        default=None,
        help="default: STLIB_SIZE if set, else full on a TPU and small elsewhere",
    )
    parser.add_argument("--impl", nargs="+", metavar="NAME", help="implementations (default: every one)")
    parser.add_argument(
        "--mask",
        nargs="+",
        metavar="NAME",
        help=f"catalogue masks or unique prefixes, or 'all' (default: {DEFAULT_MASKS})",
    )
    parser.add_argument("--no-grad", action="store_true", help="check the forward only")
    parser.add_argument("--rows", type=int, default=ROWS, help="query rows the reference computes")
    parser.add_argument(
        "--out", type=Path, default=None, help=f"records (default: data/{RECORDS} of stlib's home)"
    )
    args = parser.parse_args(argv)
    started = time.perf_counter()
    try:
        size = args.size if args.size in ("small", "full") else resolve_size(None)  # or STLIB_SIZE
        results = run_check(size, args.impl, args.mask, grad=not args.no_grad, out=args.out, rows=args.rows)
    except ValueError as error:
        parser.error(str(error))
    print(summary(results))
    print(f"{len(results)} cases in {time.perf_counter() - started:.0f} s on {_where()}")
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
