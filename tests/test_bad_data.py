"""Bad data is never hidden: NaN or inf in q or k comes out of every implementation in exactly the
rows where the reference puts it; only rows that the mask leaves empty are zeros. A NaN in v
reaches every row that sees its key; rows that do not see it may turn NaN too (0 x NaN in the
p @ v matmul: the reference, which multiplies every key, turns its whole head NaN; a kernel only
the rows of the tiles it computes with that key)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from _kernels import assert_close, small_blocks

import stlib
from stlib import checks, masks, registry

LENGTH, HEADS = 300, 2
IMPLS = sorted(registry.IMPLEMENTATIONS)


def poisoned(where: str):
    q, k, v = (np.array(x) for x in stlib.random_qkv((HEADS, LENGTH, 128), jnp.float32, seed=11))
    if where == "nan in a query":
        q[0, 40, 5] = np.nan
    elif where == "inf in a key":
        k[1, 150, 7] = np.inf
    elif where == "nan in a value":
        v[0, 260, 3] = np.nan
    return tuple(jnp.asarray(x) for x in (q, k, v))


def band_with_empty_rows():
    allowed = np.abs(np.arange(LENGTH)[:, None] - np.arange(LENGTH)[None, :]) <= 30
    allowed[10:14] = False  # rows that see nothing
    return masks.from_array(allowed)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("where", ["nan in a query", "inf in a key", "nan in a value"])
@pytest.mark.parametrize("mask_kind", ["band", "band with empty rows"])
def test_nan_and_inf_reach_the_output_where_the_reference_puts_them(impl, where, mask_kind):
    q, k, v = poisoned(where)
    mask = masks.band(LENGTH, 30) if mask_kind == "band" else band_with_empty_rows()
    block_q, block_kv = small_blocks(impl, mask, LENGTH)
    ref = np.asarray(stlib.attention(q, k, v, mask, impl="reference"))
    out = np.asarray(stlib.attention(q, k, v, mask, impl=impl, block_q=block_q, block_kv=block_kv))
    bad_ref, bad_out = ~np.isfinite(ref).all(axis=2), ~np.isfinite(out).all(axis=2)  # [H, L] rows
    assert bad_ref.any(), "the poison must reach the reference"
    if where == "nan in a value":
        sees = np.zeros_like(bad_ref)
        sees[0] = mask.block(0, LENGTH, 260, 261)[:, 0]  # rows of head 0 that see key 260
        assert np.all(bad_out[sees]) and np.all(bad_ref[bad_out])
        fine = ~bad_out & ~bad_ref
    else:
        np.testing.assert_array_equal(bad_out, bad_ref)  # exactly the reference's rows
        fine = ~bad_ref
    # rows the mask leaves empty (band with empty rows: 10..13) are zeros, poisoned or not
    assert_close(out, ref, checks.tolerance(jnp.float32), rows=fine, mask=mask)
