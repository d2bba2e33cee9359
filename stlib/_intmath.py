"""Integer helpers: host-side ``cdiv`` / ``round_up``, the is-this-a-jax-array test, and integer
division that works on numpy arrays and inside Pallas TPU kernels.

Inside a kernel, jnp's ``//`` and ``%`` lower through ``sign``, whose Mosaic rule asks the local
device for its TPU generation and so fails when compiling for a TPU from a CPU machine; lax.div /
lax.rem (truncating) do not. Mask predicates only divide non-negative indices, where truncating
and floor division agree; ``floordiv`` shifts possibly negative numerators first.
"""

from __future__ import annotations

import numpy as np

#: Numerators are shifted by a multiple of the divisor at least this large before dividing.
_SHIFT = 1 << 24


def is_jax_array(x) -> bool:
    """Whether ``x`` is a jax array or tracer (inside a kernel), not a numpy array or a number."""
    return type(x).__module__.startswith("jax")


def array_module(*arrays):
    """numpy for numpy inputs and numbers, jax.numpy when any input is a jax array (inside a kernel)."""
    if any(is_jax_array(a) for a in arrays):
        import jax.numpy as jnp

        return jnp
    return np


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for integers, b > 0."""
    return -(-a // b)


def round_up(a: int, b: int) -> int:
    """The smallest multiple of b >= a, b > 0."""
    return cdiv(a, b) * b


def div(a, b):
    """a // b for non-negative a, positive b."""
    if is_jax_array(a) or is_jax_array(b):
        import jax

        return jax.lax.div(a, b)
    return a // b


def mod(a, b):
    """a % b for non-negative a, positive b."""
    if is_jax_array(a) or is_jax_array(b):
        import jax

        return jax.lax.rem(a, b)
    return a % b


def floordiv(a, b: int):
    """floor(a / b) for any integer a with |a| < 2**24 and a positive constant b."""
    if is_jax_array(a):
        shift = (_SHIFT // b + 1) * b
        return div(a + shift, b) - shift // b
    return a // b
