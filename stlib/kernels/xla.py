"""``impl="reference"`` and ``impl="xla"``: the two plain-JAX implementations every kernel is
checked against. ``reference`` materialises the [H, L, L] scores (L <= REFERENCE_LIMIT);
``xla`` loops over the non-empty tiles of each row of a tile layout (no Pallas)."""

from __future__ import annotations

from types import SimpleNamespace

from stlib._intmath import round_up
from stlib.contract import Capabilities
from stlib.layout import call_layout
from stlib.masks import DENSE_LIMIT
from stlib.reference import reference_attention, xla_block_sparse_attention
from stlib.registry import Implementation, Role, register

REFERENCE_NAME, XLA_NAME = "reference", "xla"
#: Largest L the materialising reference accepts.
REFERENCE_LIMIT = DENSE_LIMIT
#: The xla implementation's default tile (capped to the sequence).
XLA_BLOCK = 128


def _too_long(length: int) -> str | None:
    if length > REFERENCE_LIMIT:
        return f"impl='reference' materialises [H, L, L] scores; L={length} > {REFERENCE_LIMIT}"
    return None


def _reference(q, k, v, mask, *, scale, config, interpret):
    length = q.shape[1]
    if _too_long(length):
        raise ValueError(_too_long(length))
    dense = None if mask is None else mask.to_dense()
    return reference_attention(q, k, v, dense, scale)


def _xla_blocks(mask, length: int, block_q, block_kv, options, interpret, chip=None):
    """(its blocks: the call's, else ``XLA_BLOCK`` capped to the sequence; options): xla's ``resolve``."""
    bq = block_q or min(XLA_BLOCK, round_up(length, 8))
    bkv = block_kv or min(XLA_BLOCK, round_up(length, 8))
    return SimpleNamespace(block_q=bq, block_kv=bkv, block_kv_compute=None), options


def _xla_layout(mask, length: int):
    sizes, _ = _xla_blocks(mask, length, None, None, None, None, None)
    return call_layout(mask, length, sizes.block_q, sizes.block_kv)


def _xla(q, k, v, mask, *, scale, config, interpret):
    layout = call_layout(mask, q.shape[1], config.block_q, config.block_kv)
    return xla_block_sparse_attention(q, k, v, layout, scale)


def _xla_mask_support(mask) -> str | None:
    """xla tabulates the mask of every tile that needs one: refused where that table is too big."""
    layout = _xla_layout(mask, mask.length)
    return layout.table_refusal(layout.masked_tiles)


def _dense_work(layout, num_heads, head_dim, options):
    from stlib.kernels.dense import dense_work

    return dense_work(layout, num_heads, head_dim)


def _block_sparse_work(layout, num_heads, head_dim, options):
    from stlib.kernels.block_sparse import block_sparse_work

    return block_sparse_work(layout, num_heads, head_dim)


REFERENCE = register(
    Implementation(
        name=REFERENCE_NAME,
        roles=frozenset({Role.REFERENCE}),
        forward=_reference,
        description="softmax(q k^T * scale, mask) v with the [H, L, L] scores materialised",
        work=_dense_work,
        capabilities=Capabilities(
            mask_support=lambda mask: _too_long(mask.length), max_length=REFERENCE_LIMIT
        ),
    ),
)
XLA = register(
    Implementation(
        name=XLA_NAME,
        roles=frozenset({Role.XLA}),
        forward=_xla,
        resolve=_xla_blocks,
        description="plain JAX over the non-empty tiles of each row (no Pallas)",
        work=_block_sparse_work,
        capabilities=Capabilities(mask_support=_xla_mask_support),
    ),
)
