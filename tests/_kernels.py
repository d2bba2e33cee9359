"""What the kernel tests share: the one comparison of an output with its reference
(``assert_close``), the one family of seeded random masks (``random_dense`` / ``random_mask``),
and the blocks a test runs an implementation with (``small_blocks``).

Tolerances and errors come from ``stlib.checks`` (the rule the notebooks and ``python -m stlib.check``
use): ``checks.tolerance`` of the inputs' dtype bounds ``checks.scaled_error``, the max error
relative to the largest reference value; nothing here picks its own.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

import stlib
from stlib import checks, masks

#: ``assert_close``'s default: the output has the reference's dtype.
SAME_DTYPE = object()
#: The blocks tests try, smallest first: 32 x 128 tiles where an implementation takes them, else
#: 128 x 128 (Splash tiles are multiples of 128 on both axes).
SMALL_BLOCKS = ((32, 128), (128, 128))


def as64(x) -> np.ndarray:
    """float64 numpy copy of an array of any float dtype (exact: bf16, float32 and float64 widen)."""
    return np.asarray(x).astype(np.float64)


def _empty_rows(mask, num_heads: int) -> np.ndarray:
    """bool [H, L]: the query rows of ``mask`` (a stlib mask or a bool [L, L] / [Hm, L, L] array)
    that see no key."""
    dense = mask.to_dense() if isinstance(mask, masks.Mask) else np.asarray(mask, bool)
    dense = dense.reshape(-1, *dense.shape[-2:])
    return np.broadcast_to(~dense.any(axis=2), (num_heads, dense.shape[1]))


def assert_close(out, ref, bound: float, *, dtype=SAME_DTYPE, rows=None, mask=None) -> float:
    """Assert that ``out`` equals ``ref`` within ``bound`` (``checks.scaled_error``: the max error
    relative to the largest reference value, as every check of the project measures it; pass
    ``checks.tolerance`` of the inputs' dtype) and return that error.

    ``out`` must have ``ref``'s shape and the dtype ``dtype`` (default: ``ref``'s; None: any), and be
    finite wherever it is compared. ``rows``: bool [H, L] selecting the query rows compared (None:
    all). ``mask`` (a stlib mask or a bool [L, L] / [H, L, L] array): the rows it leaves empty must
    be exactly zero in ``out``, compared or not.
    """
    assert out.shape == ref.shape, f"shape {out.shape} != reference shape {ref.shape}"
    if dtype is SAME_DTYPE:
        dtype = ref.dtype
    if dtype is not None:
        assert out.dtype == dtype, f"dtype {out.dtype} != {jnp.dtype(dtype)}"
    got, want = as64(out), as64(ref)
    if rows is not None:
        got, want = got[rows], want[rows]
    assert np.all(np.isfinite(got)), "the output has NaN / inf where it is compared"
    err = checks.scaled_error(got, want)
    assert err <= bound, f"max error {err:.2e} of the largest reference value > {bound}"
    if mask is not None:
        empty = _empty_rows(mask, out.shape[0])
        assert np.all(as64(out)[empty] == 0.0), "rows that see no key must be exactly zero"
    return err


# --------------------------------------------------------------------------------------------
# random masks


def random_dense(
    rng,
    heads: int | None,
    length: int,
    density: float,
    *,
    tiles: tuple[int, int] | None = None,
    empty_fraction: float = 0.0,
    empty_rows=(),
    empty_heads=(),
) -> np.ndarray:
    """A seeded random bool mask: [heads, L, L], or [L, L] when ``heads`` is None (head-uniform).

    Without ``tiles``, each pair is allowed with probability ``density``. With ``tiles=(block_q,
    block_kv)``, a coin per tile makes it EMPTY, FULL or PARTIAL (pairs allowed with probability
    ``density``), so a layout of those tiles mixes all three kinds. Then, in this order:
    ``empty_fraction``: each query row sees nothing with that probability (the same rows in every
    head); ``empty_rows``: (head, rows) pairs (an index or slice) that see nothing; ``empty_heads``:
    heads that see nothing. Random draws are taken in exactly this order from ``rng``.
    """
    num = 1 if heads is None else heads
    if tiles is None:
        dense = rng.random((num, length, length)) < density
    else:
        block_q, block_kv = tiles
        nq, nk = -(-length // block_q), -(-length // block_kv)
        kind = rng.integers(0, 3, size=(num, nq, nk))  # 0 EMPTY, 1 PARTIAL, 2 FULL
        dense = np.zeros((num, nq * block_q, nk * block_kv), bool)
        for h, qi, ki in np.argwhere(kind > 0):
            tile = (
                np.ones((block_q, block_kv), bool)
                if kind[h, qi, ki] == 2
                else rng.random((block_q, block_kv)) < density
            )
            dense[h, qi * block_q : (qi + 1) * block_q, ki * block_kv : (ki + 1) * block_kv] = tile
        dense = np.ascontiguousarray(dense[:, :length, :length])
    if empty_fraction:
        dense[:, rng.random(length) < empty_fraction] = False
    for h, rows in empty_rows:
        dense[h, rows] = False
    for h in empty_heads:
        dense[h] = False
    return dense[0] if heads is None else dense


def random_mask(rng, heads: int | None, length: int, density: float, **kwargs) -> masks.Mask:
    """``random_dense`` (same arguments) as a stlib mask."""
    return masks.from_array(random_dense(rng, heads, length, density, **kwargs))


def mixed_tile_mask(rng, heads: int, length: int, block_q: int, block_kv: int) -> masks.Mask:
    """The kernel tests' per-head mask: tiles of block_q x block_kv EMPTY / FULL / PARTIAL (density
    0.3) by a coin each, the last head entirely empty and rows 3..6 of head 0 seeing nothing."""
    return random_mask(
        rng,
        heads,
        length,
        0.3,
        tiles=(block_q, block_kv),
        empty_rows=((0, slice(3, 7)),),
        empty_heads=(-1,),
    )


# --------------------------------------------------------------------------------------------
# blocks


def small_blocks(impl: str, mask, length: int, interpret=None) -> tuple[int, int]:
    """The first of ``SMALL_BLOCKS`` whose blocks ``impl``'s ``config`` accepts (an implementation
    without blocks accepts any)."""
    implementation = stlib.registry.get(impl)
    for block_q, block_kv in SMALL_BLOCKS:
        try:
            implementation.config(mask, length, block_q, block_kv, interpret=interpret)
        except ValueError:
            continue
        return block_q, block_kv
    raise AssertionError(f"impl={impl!r} takes none of the blocks {SMALL_BLOCKS}")
