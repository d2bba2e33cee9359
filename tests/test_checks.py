"""stlib.checks: the one tolerance rule and the exact comparisons every check uses."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import stlib
from stlib import checks


def test_tolerance_follows_dtype_and_backend():
    assert checks.tolerance(jnp.float32, "cpu") == checks.TOLERANCE["exact"]
    assert checks.tolerance(jnp.bfloat16, "cpu") == checks.TOLERANCE["bf16"]
    # a TPU's default precision feeds the MXU bf16 inputs, whatever the array dtype
    assert (
        checks.tolerance(jnp.float32, "tpu")
        == checks.tolerance(jnp.bfloat16, "tpu")
        == checks.TOLERANCE["bf16"]
    )
    assert checks.TOLERANCE["exact"] < checks.TOLERANCE["bf16"]


def test_scaled_error_is_relative_to_the_largest_reference_value():
    want = jnp.array([0.5, -0.25])
    assert checks.scaled_error(want + 0.01, want) == pytest.approx(0.02, rel=1e-5)
    big = jnp.array([100.0, 1.0])
    assert checks.scaled_error(big.at[0].add(1.0), big) == pytest.approx(0.01, rel=1e-5)
    assert checks.scaled_error(jnp.zeros(2), want) == 1.0  # an all-zero answer never passes
    assert (
        checks.scaled_error(jnp.array([0.0, 0.5]), jnp.zeros(2)) == 0.5
    )  # absolute where the reference is zero
    with pytest.raises(ValueError, match="shape"):
        checks.scaled_error(want, big[:1])


def test_scaled_error_never_passes_a_nan_the_reference_lacks():
    want = jnp.array([1.0, jnp.nan])
    assert checks.scaled_error(want, want) == 0.0  # NaN where the reference has it: in place
    assert not checks.scaled_error(jnp.array([jnp.nan, jnp.nan]), want) <= 1.0


def test_passed_prints_and_fails(capsys):
    line = checks.passed("demo", 1e-6, 1e-4)
    assert line.startswith("PASSED  demo") and "PASSED  demo" in capsys.readouterr().out
    with pytest.raises(checks.CheckFailed, match="demo: max error 1.00e-02 > tolerance"):
        checks.passed("demo", 1e-2, 1e-4)
    with pytest.raises(checks.CheckFailed):
        checks.passed("demo", float("nan"), 1e-4)


def test_check_close_uses_the_dtype_rule():
    q, k, v = stlib.random_qkv((2, 128, 32), jnp.float32, seed=3)
    out = stlib.attention(q, k, v, impl="reference")
    assert checks.check_close("same", out, out) == 0.0
    with pytest.raises(checks.CheckFailed):
        checks.check_close("off", out + 1e-3, out)  # float32 on a CPU: exact
    assert checks.check_close("bf16", out.astype(jnp.bfloat16), out) < checks.TOLERANCE["bf16"]


def test_reference_rows_cover_start_middle_end():
    rows = checks.reference_rows(10_000, 384)
    assert rows.size == 384 and rows[0] == 0 and rows[-1] == 9_999 and 5_000 in rows
    np.testing.assert_array_equal(checks.reference_rows(100), np.arange(100))
