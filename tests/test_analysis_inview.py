"""stlib.analysis.inview: the cache key of a kernel written outside stlib is the same in every
process, wherever the kernel's source file lies (a notebook cell's file is new in every kernel)."""

from __future__ import annotations

import importlib.util
import sys

import jax
import jax.numpy as jnp

from stlib.analysis.inview import exported_program

KERNEL_SOURCE = """
import jax
from jax.experimental import pallas as pl


def double(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2


def call(x):
    return pl.pallas_call(double, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), name="in_view_double")(x)
"""


def _module_at(folder, name):
    path = folder / f"{name}.py"
    path.write_text(KERNEL_SOURCE)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_the_same_kernel_from_two_files_exports_the_same_program(tmp_path):
    shape = jax.ShapeDtypeStruct((8, 128), jnp.float32)
    (tmp_path / "a").mkdir()
    (tmp_path / "b" / "deeper").mkdir(parents=True)
    first = _module_at(tmp_path / "a", "inview_kernel_a")
    second = _module_at(tmp_path / "b" / "deeper", "inview_kernel_b")
    _, program_a = exported_program(first.call, shape)
    _, program_b = exported_program(second.call, shape)
    assert "tpu_custom_call" in program_a
    assert program_a == program_b
    assert str(tmp_path) not in program_a


def test_the_export_leaves_the_location_limit_as_it_was():
    before = jax.config.jax_traceback_in_locations_limit
    exported_program(lambda x: x * 2, jax.ShapeDtypeStruct((8, 128), jnp.float32))
    assert jax.config.jax_traceback_in_locations_limit == before
