"""Sparse ring attention over one mesh axis (``parallel_attention(..., strategy="ring")``).

q, k, v are split over the sequence: device i of N holds tokens [i * S, (i + 1) * S), S = L / N,
of every head. On hop ``offset`` device i attends its queries against the kv shard of device
(i - offset) mod N, which a ``ppermute`` brings over; the hops' partial outputs merge by their
log-sum-exp (``reference.merge_partials``). Each (q shard, kv shard) pair is a block of the
mask (``Mask.block_view``), and a sparse video mask leaves most of them empty: a hop whose block is
empty on every device and for every head is not issued at all (no transfer, no kernel), and a device
whose block is empty on an issued hop runs no kernel on it. Devices whose blocks allow the same
pairs share one compiled branch (``lax.switch`` on the axis index), as ``parallel`` does for heads.
A kernel with a ``stack_forward`` (the best tile kernel) runs every hop through one compiled body a
kernel call instead (``shared_kernel``), forward and backward: the ring's blocks stacked as heads of
one mask (``stlib.masks.StackedBlocks``) with one step plan, each device's rows of its tables and
its block's offsets selected by the axis index as the kernel's data; a compiled ring then holds one
forward body however many blocks it runs, where libtpu spent 80-185 s a body at Wan 14B's shape.
Each issued hop moves k and v by one collective-permute each, straight from the shard's owner by the
hop's offset, not a shard passed on device by device (a ring that skips hops has no one to pass it along): hop o and
hop N - o are equally far, one each way round, and the interconnect routes each. In the programs
compiled for a v6e 2x2 slice (the tests, notebook 11) every hop's transfer starts before the first
kernel runs (``stlib.bench.collectives.permutes_ahead``), so later hops move while earlier ones
compute; but no kernel runs before the first shard lands (``collectives.kernels_before_arrival``
is 0: the local hop, which waits for nothing, is scheduled after it), so that first transfer has no
kernel to hide behind. The same holds for the Ulysses x ring training step compiled at Wan 14B's
shape on v6e 4x4 (``stlib.bench.slice_compile``), not for the small Ulysses x ring forward, where
one kernel runs first. (Ordering hop 0 first with ``jax.lax.optimization_barrier`` made the compiler
start each transfer only after the kernel before it: every transfer exposed.)

The backward rides the same hops: it asks for the kv shard again (in a compiled training step the
compiler reuses the forward's transfer: k and v move once), the kernel's own backward gives the
hop's dq (kept) and dk, dv (sent back to their owner by the inverse ``ppermute`` and summed there), from the merged output and log-sum-exp the forward kept (a ``jax.custom_vjp``). A kernel
takes part when its ``Backward`` keeps (q, k, v, o, lse) (``Backward.lse_residuals``: every stlib
tile kernel); the plain-JAX implementations run each hop as materialised attention of the block.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from stlib.device import LANES
from stlib.geometry import SHARD_KINDS, shard_order
from stlib.layout import TileKind, block_layout
from stlib.masks import DENSE_LIMIT, Mask, StackedBlocks, full, per_head
from stlib.reference import merge_partials, reference_attention_lse, reference_gradients
from stlib.registry import Implementation


@dataclass(frozen=True)
class RingHop:
    """One issued hop: device i of a ring of N attends the kv shard of device (i - ``offset``) mod N
    with the block ``branches[branch_of_device[g * N + i]]`` of its group g's mask (None: that device
    has nothing to do); one group unless the ring runs beside Ulysses (a group per head slice)."""

    offset: int
    branches: tuple
    branch_of_device: tuple[int, ...]


def _block_signature(block: Mask) -> tuple[bool, str]:
    """(whether ``block`` allows no pair for any head, a digest equal for blocks that allow the same
    pairs): its key intervals per head, or its dense form where it has none."""
    heads = [None] if block.num_heads is None else range(block.num_heads)
    digest = hashlib.sha256()
    empty = True
    for h in heads:
        view = block if h is None else block.head(h)
        if block.has_intervals:
            starts, ends = view.key_intervals(np.arange(block.length))
            keep = ends > starts
            empty &= not keep.any()
            for array in (np.where(keep, starts, 0), np.where(keep, ends, 0)):
                digest.update(np.ascontiguousarray(array).tobytes())
        elif block.length > DENSE_LIMIT:  # a permuted mask's block: empty from its tile counts
            empty &= not block_layout(view, LANES, LANES).counts.any()
            digest.update(repr(hash(view)).encode())  # equal blocks by value share a branch
        else:
            dense = view.to_dense()
            empty &= not dense.any()
            digest.update(np.packbits(dense).tobytes())
    return empty, digest.hexdigest()


def ring_hops(mask, num_devices: int) -> list[RingHop]:
    """The hops a ring of ``num_devices`` issues for ``mask`` (``dense_mask`` for dense attention;
    a list of masks: one per group of rings, their devices numbered group by group), each with the
    distinct blocks its devices attend; hops empty on every device are left out.

    >>> import stlib
    >>> grid = stlib.VideoGrid(4, 8, 16)  # 4 frames of 128 tokens: one frame per device
    >>> [hop.offset for hop in ring_hops(stlib.masks.spatial(grid), 4)]  # same-frame keys only
    [0]
    >>> [hop.offset for hop in ring_hops(stlib.masks.frame_causal(grid), 4)]
    [0, 1, 2, 3]
    """
    if num_devices < 1:
        raise ValueError(f"num_devices={num_devices} must be at least 1")
    groups = list(mask) if isinstance(mask, (list, tuple)) else [mask]
    length = groups[0].length
    if length % num_devices:
        raise ValueError(f"L={length} tokens do not divide over the {num_devices} devices of the ring")
    size = length // num_devices
    hops = []
    for offset in range(num_devices):
        branches: dict = {}
        of_device = []
        for group, device in ((g, d) for g in groups for d in range(num_devices)):
            block = group.block_view(device * size, ((device - offset) % num_devices) * size, size)
            empty, signature = _block_signature(block)
            key = None if empty else signature
            branches.setdefault(key, None if empty else block)
            of_device.append(list(branches).index(key))
        if list(branches) != [None]:
            hops.append(RingHop(offset, tuple(branches.values()), tuple(of_device)))
    return hops


def device_steps(mask, num_devices: int, block_q: int = 512, block_kv: int = 512) -> np.ndarray:
    """int64 [N]: the kernel steps (non-empty ``block_q`` x ``block_kv`` tiles, summed over the heads
    of a per-head mask; one head's of a head-uniform one) each device of a ring of ``num_devices``
    runs over the hops it issues for ``mask`` (``dense_mask`` for dense attention): the ring's load
    balance, in hardware-independent work.

    >>> import stlib
    >>> grid = stlib.VideoGrid(4, 8, 16)  # a frame of 128 tokens per device
    >>> device_steps(stlib.masks.frame_causal(grid), 4, 128, 128).tolist()  # device d sees d + 1 frames
    [1, 2, 3, 4]
    """
    length = mask.length
    if length % num_devices:
        raise ValueError(f"L={length} tokens do not divide over the {num_devices} devices of the ring")
    size = length // num_devices
    steps = np.zeros(num_devices, np.int64)
    for device in range(num_devices):
        for source in range(num_devices):
            layout = block_layout(mask.block_view(device * size, source * size, size), block_q, block_kv)
            steps[device] += int((layout.kinds != TileKind.EMPTY).sum())
    return steps


def balanced_order(mask, num_devices: int, *, unit: int = 1, block_q: int = 512, block_kv: int = 512):
    """(the ``stlib.geometry.shard_order`` of ``SHARD_KINDS`` whose busiest device runs the fewest
    kernel steps for ``mask``, {kind: ``device_steps``} of each kind that fits): chunks of ``unit``
    tokens (a frame for frame-causal masks); "contiguous" on a tie (no reordering). A kind whose
    chunks do not divide over the devices is left out.

    >>> import stlib
    >>> grid = stlib.VideoGrid(8, 8, 16)
    >>> order, steps = balanced_order(stlib.masks.frame_causal(grid), 4, unit=128, block_q=128, block_kv=128)
    >>> order.name, {kind: s.tolist() for kind, s in steps.items()}["zigzag"]
    ('zigzag over 4 devices (unit 128)', [9, 9, 9, 9])
    """
    orders, steps = {}, {}
    for kind in SHARD_KINDS:
        try:
            orders[kind] = shard_order(mask.length, num_devices, kind, unit)
        except ValueError:
            continue
        view = mask if kind == "contiguous" else mask.permute(orders[kind])
        steps[kind] = device_steps(view, num_devices, block_q, block_kv)
    if not orders:
        raise ValueError(
            f"L={mask.length} does not split into chunks of {unit} tokens over {num_devices} devices"
        )
    best = min(steps, key=lambda kind: (int(steps[kind].max()), kind != "contiguous"))
    return orders[best], steps


def ring_blocks(hops: list[RingHop], num_devices: int) -> np.ndarray:
    """bool [N, N]: whether the queries of device d attend the kv shard of device j on some issued
    hop (the (q shard, kv shard) blocks the ring computes; the rest it skips).

    >>> import stlib
    >>> grid = stlib.VideoGrid(4, 8, 16)
    >>> ring_blocks(ring_hops(stlib.masks.frame_causal(grid), 4), 4).astype(int)
    array([[1, 0, 0, 0],
           [1, 1, 0, 0],
           [1, 1, 1, 0],
           [1, 1, 1, 1]])
    """
    attended = np.zeros((num_devices, num_devices), bool)
    for hop in hops:
        for flat, branch in enumerate(hop.branch_of_device):
            device = flat % num_devices  # any group's
            if hop.branches[branch] is not None:
                attended[device, (device - hop.offset) % num_devices] = True
    return attended


def hop_functions(implementation: Implementation, call: dict):
    """(forward, backward) of one hop of ``implementation``: ``forward(q, k, v, block) -> (o, lse
    [H, S, 1] f32)`` and ``backward(q, k, v, o, lse, do, block) -> (dq, dk, dv)`` from the merged o
    and lse; ``call``: the implementation's keywords (scale, blocks, options, interpret)."""
    training = implementation.backward
    if training is not None and training.lse_residuals:
        prepared = {}  # (block, length) -> the hop's keywords: its Config and plan, built once

        def hop_call(block, length):  # each hop's block resolves its own Config and plan, once
            if (block, length) not in prepared:  # masks compare and hash by value
                prepared[block, length] = implementation.kernel_call(block, length, **call)
            return prepared[block, length]

        def forward(q, k, v, block):
            o, (*_, lse) = training.forward(q, k, v, block, **hop_call(block, q.shape[1]))
            return o, lse.reshape(*lse.shape[:2], 1).astype(jnp.float32)

        def backward(q, k, v, o, lse, do, block):
            return training.backward((q, k, v, o, lse[..., 0]), do, block, **hop_call(block, q.shape[1]))

        return forward, backward
    if implementation.estimator is not None:  # a Pallas kernel without the tile backward (Splash)
        raise ValueError(
            f"strategy='ring' needs a kernel whose backward keeps (q, k, v, o, lse) to merge hops; "
            f"impl={implementation.name!r} has none: use a stlib tile kernel, 'xla' or 'reference'"
        )
    scale = call["scale"]

    def forward(q, k, v, block):
        return reference_attention_lse(q, k, v, _dense_block(block), scale)

    def backward(q, k, v, o, lse, do, block):
        return reference_gradients(q, k, v, o, lse, do, _dense_block(block), scale)

    return forward, backward


@dataclass(frozen=True)
class SharedKernel:
    """Every hop through one compiled kernel a direction (``Implementation.stack_forward``, its
    ``Backward.stack_backward``): ``stack`` holds the ring's blocks, ``positions[n][g * N + i]`` is
    device i's (of group g) block in it on issued hop n (-1: nothing to do), ``forward(q, k, v,
    block) -> (o, lse [H, S, 1] f32)`` and ``backward(q, k, v, o, lse, do, block) -> (dq, dk, dv)``
    (None: the backward runs a kernel a block)."""

    stack: StackedBlocks
    positions: tuple[tuple[int, ...], ...]
    forward: object
    backward: object = None


def shared_kernel(
    implementation: Implementation, call: dict, hops: list[RingHop], base: Mask, num_devices: int, heads: int
):
    """The ``SharedKernel`` of a ring of ``num_devices`` over ``base`` (the whole call's mask; group
    g runs its heads [g * heads, (g + 1) * heads)), or None where ``implementation`` compiles a
    kernel a block. One body for the ring's (hop, device) blocks, not one each: libtpu compiles a
    body once however often it is called (``stlib.bench.slice_compile`` ``reuse``: one band once
    7.5 s, six times 8.0 s, six widths 30.4 s on v6e), and a ring of 8 has up to 64 blocks. The
    blocks share one step plan a direction: in the forward at most ``MAX_PATTERNS`` patterns for all
    of them (rarer tiles run MASKED) and the widest row of any block as every block's grid extent;
    in the backward the widest row and the most worked rows of any block (the rest idle).

    >>> import stlib
    >>> from stlib.registry import Role, by_role
    >>> grid = stlib.VideoGrid(4, 8, 16)
    >>> hops = ring_hops(stlib.masks.frame_causal(grid), 4)
    >>> kernel = by_role(Role.BEST_TILE)  # pallas_tile_lane_dense
    >>> call = ring_call(kernel, 64, {"block_q": 128, "block_kv": 128, "interpret": True})
    >>> shared = shared_kernel(kernel, call, hops, stlib.masks.frame_causal(grid), 4, 1)
    >>> shared.stack.num_blocks, shared.positions[1]  # hop 1: device 0 would see a later frame
    (4, (-1, 1, 1, 1))
    """
    if implementation.stack_forward is None:
        return None
    size = base.length // num_devices
    starts, positions = [], []
    for hop in hops:
        of_branch = {}
        for flat, branch in enumerate(hop.branch_of_device):
            if hop.branches[branch] is not None and branch not in of_branch:
                group, device = divmod(flat, num_devices)
                first = 0 if base.num_heads is None else group * heads
                of_branch[branch] = len(starts)
                starts.append((first, device * size, (device - hop.offset) % num_devices * size))
        positions.append(tuple(of_branch.get(branch, -1) for branch in hop.branch_of_device))
    stack = StackedBlocks(base, starts, size, 1 if base.num_heads is None else heads)
    config = implementation.kernel_call(stack, size, **call)

    def forward(q, k, v, block):
        o, lse = implementation.stack_forward(q, k, v, stack, block, **config)
        return o, lse.reshape(*lse.shape[:2], 1).astype(jnp.float32)

    training = implementation.backward
    if training is None or training.stack_backward is None:
        return SharedKernel(stack, tuple(positions), forward)

    def backward(q, k, v, o, lse, do, block):
        return training.stack_backward((q, k, v, o, lse[..., 0]), do, stack, block, **config)

    return SharedKernel(stack, tuple(positions), forward, backward)


def _shared_hop(shared: SharedKernel, n: int, device, run, empty, *args):
    """Hop ``n`` of the ring through the shared kernel's ``run`` (its forward or backward): this
    device's block, or ``empty`` where it has nothing to do."""
    positions = shared.positions[n]
    position = jnp.asarray(np.asarray(positions, np.int32))[device()]
    if min(positions) >= 0:
        return run(*args, position)
    return jax.lax.cond(position >= 0, lambda: run(*args, jnp.maximum(position, 0)), lambda: empty(*args))


def _dense_block(block: Mask) -> np.ndarray:
    """bool [S, S] (or [H, S, S]) of ``block``, for materialised attention."""
    return block.to_dense()


def _empty_forward(q, k, v):
    return jnp.zeros(q.shape, q.dtype), jnp.full((*q.shape[:2], 1), -jnp.inf, jnp.float32)


def _empty_backward(q, k, v, o, lse, do):
    return jnp.zeros_like(q), jnp.zeros_like(k), jnp.zeros_like(v)


def _switch(hop: RingHop, functions: list, device, *args):
    """Run this device's branch of ``hop`` (``device``: its traced index; one branch: no switch)."""
    if len(functions) == 1:
        return functions[0](*args)
    index = jnp.asarray(np.asarray(hop.branch_of_device, np.int32))[device()]
    return jax.lax.switch(index, functions, *args)


def _shifted(x, offset: int, num_devices: int, axis_name: str):
    """``x`` of device (i - offset) mod N on device i (``offset`` 0: x itself)."""
    if offset % num_devices == 0:
        return x
    perm = [(j, (j + offset) % num_devices) for j in range(num_devices)]
    return jax.lax.ppermute(x, axis_name, perm)


def ring_local(
    hops: list[RingHop],
    forward,
    backward,
    *,
    axis_name: str,
    num_devices: int,
    group_axis=None,
    shared: SharedKernel | None = None,
):
    """The per-device body of the ring (inside ``shard_map``): (q, k, v) [H, S, D] shards -> o, a
    ``jax.custom_vjp`` whose backward rides the same hops (``forward`` / ``backward``:
    ``hop_functions``); the ring runs over ``axis_name``, one ring per index of ``group_axis``
    (None: one ring). ``shared``: every hop through one kernel a direction (``shared_kernel``)
    instead of ``forward``'s and ``backward``'s kernel a block."""

    def device():
        position = jax.lax.axis_index(axis_name)
        return position if group_axis is None else jax.lax.axis_index(group_axis) * num_devices + position

    def branches(hop, empty, run):
        return [empty if block is None else partial(run, block=block) for block in hop.branches]

    def merged(q, k, v):
        o = jnp.zeros(q.shape, jnp.float32)
        lse = jnp.full((*q.shape[:2], 1), -jnp.inf, jnp.float32)
        for n, hop in enumerate(hops):
            kh, vh = (_shifted(x, hop.offset, num_devices, axis_name) for x in (k, v))
            if shared is not None:
                o_h, lse_h = _shared_hop(shared, n, device, shared.forward, _empty_forward, q, kh, vh)
            else:
                fns = branches(hop, _empty_forward, lambda q, k, v, block: forward(q, k, v, block))
                o_h, lse_h = _switch(hop, fns, device, q, kh, vh)
            o, lse = merge_partials(o, lse, o_h, lse_h)
        return o.astype(q.dtype), lse

    @jax.custom_vjp
    def run(q, k, v):
        return merged(q, k, v)[0]

    def run_forward(q, k, v):
        o, lse = merged(q, k, v)
        return o, (q, k, v, o, lse)

    def run_backward(residuals, do):
        q, k, v, o, lse = residuals
        dq = jnp.zeros(q.shape, jnp.float32)
        dk = jnp.zeros(k.shape, jnp.float32)
        dv = jnp.zeros(v.shape, jnp.float32)
        for n, hop in enumerate(hops):
            kh, vh = (_shifted(x, hop.offset, num_devices, axis_name) for x in (k, v))
            args = (q, kh, vh, o, lse, do)
            if shared is not None and shared.backward is not None:
                dq_h, dk_h, dv_h = _shared_hop(shared, n, device, shared.backward, _empty_backward, *args)
            else:
                fns = branches(
                    hop,
                    _empty_backward,
                    lambda q, k, v, o, lse, do, block: backward(q, k, v, o, lse, do, block),
                )
                dq_h, dk_h, dv_h = _switch(hop, fns, device, *args)
            dq += dq_h.astype(jnp.float32)
            back = -hop.offset  # dk, dv of the kv shard go home
            dk += _shifted(dk_h.astype(jnp.float32), back, num_devices, axis_name)
            dv += _shifted(dv_h.astype(jnp.float32), back, num_devices, axis_name)
        return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)

    run.defvjp(run_forward, run_backward)
    return run


def ring_call(implementation: Implementation, head_dim: int, kwargs: dict) -> dict:
    """The keywords a hop's kernel runs with: scale (default 1/sqrt(D)), blocks, validated options,
    interpret."""
    unknown = sorted(set(kwargs) - {"scale", "block_q", "block_kv", "options", "interpret"})
    if unknown:
        raise TypeError(f"strategy='ring' takes no keyword(s) {unknown}")
    scale = kwargs.get("scale")
    return {
        "scale": float(1.0 / math.sqrt(head_dim) if scale is None else scale),
        "block_q": kwargs.get("block_q"),
        "block_kv": kwargs.get("block_kv"),
        "options": implementation.options(kwargs.get("options")),
        "interpret": kwargs.get("interpret"),
    }


def plan_mask(plan) -> Mask:
    """The mask a ring runs for a routed ``plan`` (``stlib.routing.SvgPlan``): its heads' exact masks
    in raster order, each with its head. The plan's rounded tiles belong to its per-head token orders,
    which a sequence split over devices cannot keep (every head's kv shard is the same stretch of
    tokens), so a ring computes the exact masks: the plan's pairs where ``plan.boundary`` is EXACT,
    without the pairs its rounding adds where it is BALANCED.

    >>> import stlib
    >>> from stlib.routing import svg_plan
    >>> plan = svg_plan(stlib.VideoGrid(4, 8, 16), ["spatial", "temporal"], 0.25, block_q=128, block_kv=128)
    >>> mask = plan_mask(plan)
    >>> mask.num_heads, mask.head(1) == plan.exact_masks[1]
    (2, True)
    """
    return per_head(list(plan.exact_masks))


def dense_mask(mask: Mask | None, length: int) -> Mask:
    """``mask``, or the full mask where None (the ring's blocks are views of a mask)."""
    return full(length) if mask is None else mask


__all__ = [
    "RingHop",
    "SharedKernel",
    "balanced_order",
    "dense_mask",
    "device_steps",
    "hop_functions",
    "plan_mask",
    "ring_blocks",
    "ring_call",
    "ring_hops",
    "ring_local",
    "shared_kernel",
]
