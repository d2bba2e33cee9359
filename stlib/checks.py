"""Exact checks: an output against the plain reference, within a tolerance set by its dtype and the
backend it ran on. One rule for every check in the notebooks, the exercises, the tests and
``python -m stlib.check``:

- the reference runs in float32 at ``Precision.HIGHEST`` (``stlib.reference``): exact to rounding;
- what is checked runs at the backend's default precision. On a CPU a float32 matmul is float32;
  on a TPU the MXU takes bfloat16 inputs at the default precision, so a float32 computation there
  is as exact as a bfloat16 one (measured on a v5e: the naive jnp attention of notebook 01 differs
  from the HIGHEST reference by 5.3e-3 at float32);
- errors are relative to the largest reference value (``scaled_error``), so one tolerance serves
  attention outputs (far below one at long L), gradients, accumulators and log-sum-exps.

No [H, L, L] array at long L: ``max_error`` samples query rows there (``reference_rows``).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

#: Max error (``scaled_error``) by what runs and the precision its matmuls effectively take.
#: "exact": float32 throughout on a CPU (the backend's rounding only);
#: "bf16": bfloat16 inputs, or float32 at a TPU's default precision (bf16 MXU passes), against the
#: float32 reference; probabilities rounded to bf16 before p @ v as on the MXU.
TOLERANCE = {"exact": 2e-5, "bf16": 3e-2}


class CheckFailed(AssertionError):
    """A check's error exceeded its tolerance; the message names the check, the error and the bound."""


def effective_precision(dtype, backend: str | None = None) -> str:
    """ "exact" or "bf16": what ``dtype`` inputs meet in a default-precision matmul on ``backend``
    (default: JAX's default backend).

    >>> effective_precision(jnp.bfloat16, "cpu"), effective_precision(jnp.float32, "tpu")
    ('bf16', 'bf16')
    >>> effective_precision(jnp.float32, "cpu")
    'exact'
    """
    backend = backend or jax.default_backend()
    if jnp.dtype(dtype) == jnp.bfloat16 or backend == "tpu":
        return "bf16"
    return "exact"


def tolerance(dtype, backend: str | None = None) -> float:
    """The max ``scaled_error`` allowed against the float32 HIGHEST reference for ``dtype`` inputs on
    ``backend`` (default: JAX's default backend): see ``TOLERANCE``.

    >>> tolerance(jnp.float32, "cpu"), tolerance(jnp.float32, "tpu")
    (2e-05, 0.03)
    """
    return TOLERANCE[effective_precision(dtype, backend)]


def scaled_error(got, want) -> float:
    """max |got - want| / max |want| in float32: the error relative to the largest finite reference
    value, however small (absolute where ``want`` is all zeros). Relative, because at the case study
    attention outputs average thousands of keys (random q, k, v at 75,600 tokens: the full mask's
    largest output is 0.027), so an absolute error would pass an all-zero output; and one rule then
    serves unnormalised accumulators and log-sum-exps too. NaN where ``got`` has a NaN the reference
    lacks (a NaN never passes a check). Shapes must match (ValueError).

    >>> float(round(scaled_error(jnp.array([0.0, 0.0]), jnp.array([0.02, -0.01])), 6))
    1.0
    """
    got, want = jnp.asarray(got), jnp.asarray(want)
    if got.shape != want.shape:
        raise ValueError(f"shape {got.shape} does not match the reference's {want.shape}")
    if not got.size:
        return 0.0
    got32, want32 = got.astype(jnp.float32), want.astype(jnp.float32)
    same_nan = jnp.isnan(got32) & jnp.isnan(want32)
    diff = jnp.where(same_nan, 0.0, jnp.abs(got32 - want32))
    diff = jnp.where(jnp.isnan(diff), jnp.inf, diff)  # one side NaN: fails
    largest = jnp.max(jnp.where(jnp.isfinite(want32), jnp.abs(want32), 0.0))
    return float(jnp.max(diff) / jnp.where(largest > 0, largest, 1.0))


def passed(name: str, error: float, tol: float, detail: str = "") -> str:
    """Print and return ``PASSED  name (max error e <= tol ...)``; raise CheckFailed if ``error``
    exceeds ``tol`` (or is NaN)."""
    where = f"{jax.default_backend()}"
    if not error <= tol:
        raise CheckFailed(f"{name}: max error {error:.2e} > tolerance {tol:.0e} on {where}{detail}")
    line = f"PASSED  {name} (max error {error:.1e} <= {tol:.0e} on {where}{detail})"
    print(line)
    return line


def check_close(name: str, got, want, *, dtype=None, tol: float | None = None) -> float:
    """Compare ``got`` with the reference values ``want`` (``scaled_error``) within ``tol`` (default:
    ``tolerance(dtype or got.dtype)`` on this backend); print PASSED or raise CheckFailed. Returns
    the error."""
    error = scaled_error(got, want)
    tol = tolerance(dtype if dtype is not None else jnp.asarray(got).dtype) if tol is None else tol
    passed(name, error, tol)
    return error


def reference_rows(length: int, rows: int = 384) -> np.ndarray:
    """The query rows a sampled check compares at long L: ``rows // 3`` each at the start, the
    middle and the end of the sequence (all rows when ``length <= rows``)."""
    if length <= rows:
        return np.arange(length)
    n = rows // 3
    return np.concatenate([np.arange(s, s + n) for s in (0, (length - n) // 2, length - n)])


#: Most query rows of one pass of ``reference_on_rows`` (its scores: [H, CHUNK, L] float32, 387 MB at
#: the case study).
CHUNK = 128


@functools.partial(jax.jit, static_argnames="scale")
def _reference_chunk(q, k, v, g, dense, scale):
    """(o, dq [H, n, D], dk, dv [H, L, D]) in float32 of rows ``q`` over every key (dq, dk, dv of
    sum(o * g); None where ``g`` is None)."""
    from stlib.reference import reference_attention_lse, reference_gradients

    q, k, v = (x.astype(jnp.float32) for x in (q, k, v))
    o, lse = reference_attention_lse(q, k, v, dense, scale)
    if g is None:
        return o, None, None, None
    return (o, *reference_gradients(q, k, v, o, lse, g.astype(jnp.float32), dense, scale))


def reference_on_rows(q, k, v, mask, rows: np.ndarray, g=None, chunk: int = CHUNK):
    """The float32 HIGHEST reference of attention [H, L, D] on the sorted query ``rows`` alone, over
    every key, ``chunk`` consecutive rows at a time (scores [H, chunk, L], never L x L): (o [H, n, D]
    on those rows, dq [H, n, D] on them, dk, dv [H, L, D]) where dq, dk, dv are the gradients of
    sum(o[:, rows] * g), ``g`` [H, n, D] (None: only o, the rest None). Exact from the rows alone: the
    other rows do not reach that loss. ``mask``: a stlib mask or None."""
    length, scale = q.shape[1], q.shape[2] ** -0.5
    heads = [0] if mask is None or mask.num_heads is None else range(mask.num_heads)
    runs = np.split(np.arange(rows.size), np.flatnonzero(np.diff(rows) != 1) + 1)  # consecutive rows
    outs, dqs, dk, dv = [], [], None, None
    for run in runs:
        for at in np.array_split(run, -(-run.size // chunk)):
            q0, q1 = int(rows[at[0]]), int(rows[at[-1]]) + 1
            dense = None if mask is None else np.stack([mask.block(q0, q1, 0, length, h) for h in heads])
            o, dq, dk_rows, dv_rows = _reference_chunk(
                q[:, q0:q1], k, v, None if g is None else g[:, at], dense, scale
            )
            outs.append(o)
            if g is not None:
                dqs.append(dq)
                dk, dv = (dk_rows, dv_rows) if dk is None else (dk + dk_rows, dv + dv_rows)
    o = jnp.concatenate(outs, axis=1)
    return o, (jnp.concatenate(dqs, axis=1) if dqs else None), dk, dv


def max_error(out, q, k, v, mask=None, rows: int = 384) -> float:
    """``scaled_error`` of [H, L, D] attention output ``out`` against the reference: over every row
    when L fits the materialising reference (``registry.by_role(Role.REFERENCE)``), else over
    ``reference_rows`` (``reference_on_rows``: never L x L)."""
    from stlib.api import attention
    from stlib.registry import Role, by_role

    reference = by_role(Role.REFERENCE)
    length = q.shape[1]
    if length <= reference.capabilities.max_length:  # one compiled program, not an op at a time
        want = jax.jit(lambda q, k, v: attention(q, k, v, mask, impl=reference.name))(q, k, v)
        return scaled_error(out, want)
    picked = reference_rows(length, rows)
    return scaled_error(out[:, picked], reference_on_rows(q, k, v, mask, picked)[0])


__all__ = [
    "TOLERANCE",
    "CheckFailed",
    "check_close",
    "effective_precision",
    "max_error",
    "passed",
    "reference_on_rows",
    "reference_rows",
    "scaled_error",
    "tolerance",
]
