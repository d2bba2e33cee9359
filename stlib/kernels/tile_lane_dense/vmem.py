"""The ``pallas_tile_lane_dense`` kernel's blocks and VMEM: what one call needs (``vmem_bytes``), the
blocks it refuses (``check_blocks``) and the default lookahead that fits (``fit_lookahead``)."""

from __future__ import annotations

from stlib.blocks import BlockSizes
from stlib.device import LANES, SUBLANES
from stlib.kernels.pallas_call import vmem_limit


def vmem_bytes(
    block_q: int,
    block_kv: int,
    chunk: int,
    register: int,
    head_dim: int,
    itemsize: int,
    table: bool = False,
    key_validity: bool = False,
    lookahead: int | None = None,
    fold_lanes: int | None = None,
) -> int:
    """VMEM one call needs (an estimate, not a bound: with the scores of every chunk ahead the
    compiler can allocate more, 56.3 MiB against 42.0 estimated for TPU7x, band 0.25, 2,560 x 2,560,
    chunk 256, which it then refuses with its own message): double-buffered q, k, v, o (and mask) blocks, the
    scratch (m, l [8, block_q] f32, o^T [D, block_q] f32, scaled q), and the temporaries: the scores
    live at once ([chunk, fold] f32 for the chunk folded and each issued ahead of it: every chunk
    of the kv block with ``lookahead`` None; ``fold_lanes`` queries a fold, None: the whole q tile),
    the probabilities of one register tile, one p.v product; with ``key_validity``, the int32 [block_kv, 1] key column, lane-padded to 128,
    double-buffered."""
    blocks = 2 * itemsize * head_dim * (2 * block_q + 2 * block_kv) + (2 * block_q * block_kv if table else 0)
    blocks += 2 * block_kv * LANES * 4 if key_validity else 0
    scratch = 2 * SUBLANES * block_q * 4 + head_dim * block_q * 4 + block_q * head_dim * itemsize
    chunks = block_kv // chunk
    live = chunks if lookahead is None else min(chunks, 1 + lookahead)
    fold = min(fold_lanes or block_q, block_q)
    temps = (
        live * chunk * fold * 4
        + (chunk * fold if table else 0)
        + 3 * register * fold * 4
        + 2 * head_dim * fold * 4
    )
    return blocks + scratch + temps


def check_blocks(
    sizes: tuple[int, int, int, int | None, int, int],
    chip: str | None,
    table: bool = False,
    compiled: bool = True,
    key_validity: bool = False,
    lookahead: int | None = None,
    fold_lanes: int | None = None,
) -> int:
    """Refuse blocks this kernel cannot tile or that overflow the VMEM limit, naming value and limit;
    returns the limit. block_q is the lane dimension of the scores here: a multiple of 128 when
    ``compiled`` for a TPU (interpret mode takes any multiple of 8). ``sizes``: (block_q, block_kv,
    chunk, register, head_dim, itemsize)."""
    block_q, block_kv, chunk, register, head_dim, itemsize = sizes
    BlockSizes(block_q, block_kv, chunk)  # (8, 128) rule, chunk divides block_kv
    if compiled and block_q % LANES:
        raise ValueError(f"{block_q=} must be a multiple of {LANES}: queries lie along lanes in this kernel")
    if table and block_kv % 32:
        raise ValueError(f"{block_kv=} must be a multiple of 32 for an int8 mask table")
    need, limit = (
        vmem_bytes(
            block_q,
            block_kv,
            chunk,
            register or chunk,
            head_dim,
            itemsize,
            table,
            key_validity,
            lookahead,
            fold_lanes,
        ),
        vmem_limit(chip),
    )
    if need > limit:
        raise ValueError(
            f"blocks {block_q}x{block_kv} (chunk {chunk}, register {register}, lookahead {lookahead}) "
            f"need about {need:,} "
            f"bytes of VMEM; the limit on {chip or 'the smallest chip'} is {limit:,}"
        )
    return limit


def fit_lookahead(
    *sizes: int,
    chip: str | None,
    table: bool = False,
    key_validity: bool = False,
    fold_lanes: int | None = None,
) -> int:
    """The default ``lookahead`` for blocks ``sizes`` (block_q, block_kv, chunk, register, head_dim,
    itemsize, as ``vmem_bytes`` takes them): every later chunk of the kv block, or as many as fit the
    VMEM limit of ``chip`` beside the rest of ``vmem_bytes`` (0 where none does: ``check_blocks``
    then says whether the blocks fit at all)."""
    limit = vmem_limit(chip)
    block_kv, chunk = sizes[1], sizes[2]
    ahead = block_kv // chunk - 1
    while ahead and vmem_bytes(*sizes, table, key_validity, ahead, fold_lanes) > limit:
        ahead -= 1
    return ahead
