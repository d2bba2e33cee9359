"""How much VMEM the backward's fused dk / dv / dq kernel needs (``fused_vmem_bytes``), and so in how
many q-tile windows its per-head dq scratch is split (``dq_windows``; none: the backward runs split)."""

from __future__ import annotations

from stlib.kernels import pallas_call


def fused_vmem_bytes(block_q: int, block_kv: int, head_dim: int, itemsize: int, score_rows=None) -> int:
    """VMEM the fused kernel needs besides its dq scratch (upper estimate): double-buffered q, dO, k,
    v blocks and lse / di rows, double-buffered f32 dk / dv blocks in and out, the dk / dv
    accumulators, and about five [score_rows, block_q] f32 intermediates (S^T, P^T, dP^T, dS^T,
    mask; ``score_rows``: the keys an update computes, a step-coded pass's grain; None: block_kv)."""
    blocks = 2 * itemsize * head_dim * (2 * block_q + 2 * block_kv) + 2 * 2 * block_q * 4
    accumulators = 2 * 2 * 2 * block_kv * head_dim * 4 + 2 * block_kv * head_dim * 4
    return blocks + accumulators + 5 * (score_rows or block_kv) * block_q * 4


def dq_windows(
    num_q_tiles: int, block_q: int, block_kv: int, head_dim: int, itemsize: int, chip=None, score_rows=None
):  # fmt: skip
    """The q-tile windows (first, end) of the fused kernel: as few as let a window's f32 dq scratch
    ([tiles x block_q, D]) fit beside ``fused_vmem_bytes`` in ``pallas_call.vmem_limit(chip)``; empty
    when not even one q tile fits (then the backward runs split).

    >>> dq_windows(40, 1920, 1920, 128, 2, "v6e")  # whole [1920, 1920] scores beside the dq scratch
    [(0, 10), (10, 20), (20, 30), (30, 40)]
    >>> dq_windows(40, 1920, 1920, 128, 2, "tpu7x", score_rows=384)  # a step-coded pass's updates
    [(0, 20), (20, 40)]
    """
    room = pallas_call.vmem_limit(chip) - fused_vmem_bytes(block_q, block_kv, head_dim, itemsize, score_rows)
    per_window = room // (block_q * head_dim * 4)
    if per_window < 1:
        return []
    count = -(-num_q_tiles // per_window)
    size = -(-num_q_tiles // count)  # windows of near-equal size
    return [(w, min(w + size, num_q_tiles)) for w in range(0, num_q_tiles, size)]


__all__ = ["dq_windows", "fused_vmem_bytes"]
