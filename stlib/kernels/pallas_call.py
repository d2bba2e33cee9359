"""``pl.pallas_call`` as every stlib kernel calls it (the interpret switch, the scoped-VMEM limit,
aliased outputs) and the padding of a sequence to whole blocks."""

from __future__ import annotations

import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from stlib._intmath import round_up
from stlib.device import CHIPS, chip_spec, resolve_interpret

#: Share of a chip's VMEM a call may ask for (the rest: Mosaic's internal scratch, headroom).
VMEM_SHARE = 0.75


def vmem_limit(chip: str | None) -> int:
    """Bytes of VMEM a call may ask for on ``chip`` (None: the smallest in the chip table, for a
    kernel traced off a TPU that may be compiled for any of them)."""
    chips = [chip_spec(chip)] if chip else [chip_spec(c) for c in CHIPS]
    return int(min(c.vmem_bytes for c in chips) * VMEM_SHARE)


def run_pallas(
    kernel,
    *,
    grid_spec,
    out_shape,
    interpret,
    dimension_semantics,
    name,
    operands,
    vmem_limit_bytes: int | None = None,
    input_output_aliases: dict[int, int] | None = None,
):
    """``pl.pallas_call`` with the interpret switch (None: interpret unless on a TPU) and, when given,
    the scoped-VMEM limit the compiled kernel may use (None: the compiler's default) and the
    operands whose buffers outputs reuse ({operand index: output index})."""
    use_interpret = resolve_interpret(interpret)
    call = pl.pallas_call(
        kernel,
        grid_spec=grid_spec,
        out_shape=out_shape,
        interpret=use_interpret,
        compiler_params=None
        if use_interpret
        else pltpu.CompilerParams(dimension_semantics=dimension_semantics, vmem_limit_bytes=vmem_limit_bytes),
        name=name,
        input_output_aliases=input_output_aliases or {},
    )
    return call(*operands)


def pad_sequence(x, multiple: int):
    """Pad axis 1 of [H, L, D] with zeros up to a multiple of ``multiple``."""
    length = x.shape[1]
    target = round_up(length, multiple)
    if target == length:
        return x
    return jnp.pad(x, ((0, 0), (0, target - length), (0, 0)))
