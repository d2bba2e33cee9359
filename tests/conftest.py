"""Test-session settings, applied before JAX initialises its backends."""

import os

# Several processes use libtpu's deviceless compiler during a run (pytest itself, and the Jupyter
# kernels that execute the notebooks): without this, the second one fails on libtpu's lockfile.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
# Notebooks executed by the tests always use the small configuration.
os.environ.setdefault("STLIB_SIZE", "small")

import jax.numpy as jnp

import stlib

#: The one tolerance table: max absolute error of an output against the reference, by what is
#: compared and the input dtype (outputs are O(1): v ~ N(0, 1)).
#: - "reference": impl="reference" / "xla" against float64 numpy on the same rounded inputs (float32
#:   accumulation; bf16 outputs are rounded to bf16, 2^-8 relative on values up to ~4);
#: - "splash": Splash in interpret mode against impl="reference";
#: - "kernel": stlib's Pallas kernels against impl="reference" (bf16: p is rounded to bf16 before
#:   the p @ v matmul, as on the MXU).
ATOL = {
    "reference": {jnp.float32: 2e-5, jnp.bfloat16: 2e-2},
    "splash": {jnp.float32: 2e-5, jnp.bfloat16: 1e-2},
    "kernel": {jnp.float32: 2e-5, jnp.bfloat16: 3e-2},
}


def qkv(seed, heads, length, dim, dtype=jnp.float32):
    """The tests' q, k, v: ``stlib.random_qkv`` [heads, length, dim], seeded."""
    return stlib.random_qkv((heads, length, dim), dtype, seed)
