"""Attention over a device mesh: ``parallel_attention`` shards heads ("heads") or the sequence
("ulysses", "ring") over one mesh axis with ``jax.shard_map``.

- "heads": q, k, v [H, L, D] are split over the heads; device d runs heads [d * H/N, (d + 1) * H/N)
  on the whole sequence. No communication.
- "ulysses": q, k, v are split over the sequence; an all-to-all turns [H, L/N, D] into
  [H/N, L, D] (heads <-> sequence), each device runs its heads on the whole sequence, and a second
  all-to-all turns the output back into [H, L/N, D]. Four all-to-alls per call (q, k, v, o).
- "ring": q, k, v stay split over the sequence; kv shards travel to the devices whose queries see
  them (``stlib.ring``: sparse ring attention, a hop no device needs is never issued). H need not
  divide over the devices.
- "ulysses-ring" over two axes, ``axis_name=(ulysses_axis, ring_axis)`` (maxdiffusion's 2-D meshes):
  the sequence split over both, an all-to-all over the first gathers each ring's stretch of the
  sequence for H / U heads, a ring over the second runs it, and the way back swaps again.

Either way a device runs attention on the whole sequence for H/N heads, so a per-head mask (or a
routed SVG plan) must follow its heads to their device. A ``shard_map`` body is one program for
every device; the mask is static (its tile tables are built on the host), so each *distinct*
per-device head slice gets its own branch, and ``lax.switch`` on the device's ``axis_index`` picks
it. A head-uniform mask, or heads laid out so that the devices' slices coincide, compiles once.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from stlib import ring
from stlib.api import attention, check_mask, video_attention
from stlib.geometry import TokenOrder, VideoGrid
from stlib.masks import Mask, per_head
from stlib.registry import DEFAULT_IMPL, choose, get

#: The ways of splitting attention over a mesh axis.
STRATEGIES = ("heads", "ulysses", "ring", "ulysses-ring")


@dataclass(frozen=True)
class DeviceBranches:
    """The distinct per-device programs of a head-sharded call: ``branches[i]`` is a mask (None:
    dense) or a plan for ``heads_per_device`` heads, and device d of the axis runs
    ``branches[branch_of_device[d]]``."""

    branches: tuple
    branch_of_device: tuple[int, ...]
    heads_per_device: int

    def heads_of(self, device: int) -> range:
        return range(device * self.heads_per_device, (device + 1) * self.heads_per_device)


def head_slice(mask: Mask | None, start: int, stop: int) -> Mask | None:
    """``mask`` for heads [start, stop) alone: the mask itself when head-uniform, one head-uniform
    mask when the slice's heads share it, else a per-head mask of the slice."""
    if mask is None or mask.num_heads is None:
        return mask
    heads = [mask.head(h) for h in range(start, stop)]
    return heads[0] if len(set(heads)) == 1 else per_head(heads)


def device_branches(mask, plan, num_heads: int, num_devices: int) -> DeviceBranches:
    """Group the devices of an axis of ``num_devices`` by the head slice they run (``mask`` or
    ``plan``, at most one of them not None), equal slices sharing one branch."""
    per = num_heads // num_devices
    branches: dict = {}
    of_device = []
    for d in range(num_devices):
        start, stop = d * per, (d + 1) * per
        if plan is not None:
            key = plan.kinds[start:stop]
            if key not in branches:
                branches[key] = plan.head_slice(start, stop)
        else:
            key = head_slice(mask, start, stop)
            branches.setdefault(key, key)
        of_device.append(list(branches).index(key))
    return DeviceBranches(tuple(branches.values()), tuple(of_device), per)


def _mesh_platform(mesh: Mesh) -> str:
    return mesh.devices.flat[0].platform


def _check_mesh(mesh, axis_name, batch_axis_name) -> None:
    if not isinstance(mesh, Mesh):
        raise TypeError(f"mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}")
    named = (
        {"axis_name": axis_name}
        if batch_axis_name is None
        else {"axis_name": axis_name, "batch_axis_name": batch_axis_name}
    )
    for label, name in named.items():
        if name not in mesh.axis_names:
            raise ValueError(f"{label}={name!r} is not an axis of the mesh (its axes: {mesh.axis_names})")
    if batch_axis_name is not None and batch_axis_name == axis_name:
        raise ValueError(f"batch_axis_name={batch_axis_name!r} must differ from axis_name")


def _check_shapes(q, k, v, strategy, n, batch_size) -> None:
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not hasattr(x, "shape") or x.ndim not in (3, 4):
            shape = getattr(x, "shape", None)
            raise ValueError(f"{name} must be [H, L, D] or [B, H, L, D], got shape {shape}")
    if not (q.shape == k.shape == v.shape):
        raise ValueError(f"q {q.shape}, k {k.shape} and v {v.shape} must have one shape")
    heads, length = q.shape[-3], q.shape[-2]
    if heads % n and strategy in ("heads", "ulysses"):
        raise ValueError(
            f"H={heads} heads do not divide over the {n} devices of the axis (strategy={strategy!r})"
        )
    if strategy != "heads" and length % n:
        raise ValueError(
            f"L={length} tokens do not divide over the {n} devices of the axis (strategy={strategy!r})"
        )
    if batch_size is not None:
        if q.ndim != 4:
            raise ValueError(f"batch_axis_name needs q, k, v [B, H, L, D], got shape {q.shape}")
        if q.shape[0] % batch_size:
            raise ValueError(
                f"B={q.shape[0]} does not divide over the {batch_size} devices of the batch axis"
            )


def parallel_attention(
    q,
    k,
    v,
    mask: Mask | None = None,
    *,
    mesh: Mesh,
    axis_name: str,
    strategy: str = "heads",
    grid: VideoGrid | None = None,
    plan=None,
    impl: str = DEFAULT_IMPL,
    batch_axis_name: str | None = None,
    shard_order: TokenOrder | None = None,
    shared_kernel: bool = True,
    **kwargs,
):
    """Attention of global q, k, v [H, L, D] (or [B, H, L, D]) sharded over ``mesh``'s axis
    ``axis_name`` by ``strategy`` ("heads", "ulysses", "ring", or "ulysses-ring" over
    ``axis_name=(ulysses_axis, ring_axis)``; see the module docstring); returns the output sharded
    like the input (heads: over H; the others: over L). Equal to
    ``attention`` (or, with ``grid`` / ``plan``, ``video_attention``) on one device, gradients
    included. "ring" and "ulysses-ring" take the mask in the tokens' own order (no ``grid``) and a
    stlib tile kernel or a plain-JAX ``impl``; "ring" takes any number of heads. A ``plan`` rides a
    ring as its exact per-head masks in raster order (``stlib.ring.plan_mask``: its rounded tiles
    belong to the per-head token orders, which a sequence split cannot keep), each head's mask with
    its head.

    ``mask``: a stlib mask [H heads or head-uniform] in raster order; ``grid``: reorder the tokens
    per device as ``video_attention`` does; ``plan``: a routed ``stlib.routing.SvgPlan`` (instead of
    mask and grid). ``impl="auto"`` resolves for the mesh's platform (a TPU mesh compiles the TPU
    choice even from a CPU host; Pallas kernels are then compiled, not interpreted). A leading
    batch axis B is split over ``batch_axis_name`` when given (else replicated). ``kwargs``: those of
    ``stlib.attention`` (``block_q``, ``options``, ...). ``shard_order`` (rings only): the token
    order in which the ring splits the sequence (``stlib.ring.balanced_order``, or
    ``stlib.geometry.shard_order``: a zig-zag evens out a frame-causal mask's work); the inputs,
    the mask and the output stay in the caller's order. ``shared_kernel`` (rings only): every hop
    through one kernel body a direction (``stlib.ring.shared_kernel``, for a kernel that has one), or
    with False a body a (hop, device) block, each on its own step plan: faster kernels (at Wan 14B's
    shape on a v5e two blocks' forwards took 532 and 604 ms alone, 812 and 793 ms shared), but a
    body each to compile (80-185 s a body there; a ring of 8 has up to 64 blocks). Raises TypeError / ValueError naming the
    value: a mesh without ``axis_name``, H (or for "ulysses" and "ring" L) not divisible by the axis size, a
    mask or plan whose heads differ from q's, an unknown strategy.

    >>> import jax, stlib
    >>> mesh = jax.make_mesh((1,), ("heads",))  # on a TPU slice: (n,) over its n chips
    >>> q, k, v = stlib.random_qkv((2, 256, 64))
    >>> mask = stlib.masks.band(256, 32)
    >>> out = stlib.parallel_attention(q, k, v, mask, mesh=mesh, axis_name="heads", impl="xla")
    >>> out.shape, bool(abs(out - stlib.attention(q, k, v, mask, impl="reference")).max() < 1e-4)
    ((2, 256, 64), True)
    """
    axes = check_strategy(mesh, axis_name, strategy, batch_axis_name, reordered=grid is not None)
    if shard_order is not None and strategy not in ("ring", "ulysses-ring"):
        raise ValueError(f"shard_order is for the ring strategies, not strategy={strategy!r}")
    if not isinstance(shared_kernel, bool):
        raise TypeError(f"shared_kernel={shared_kernel!r} must be True or False")
    if not shared_kernel and strategy not in ("ring", "ulysses-ring"):
        raise ValueError(f"shared_kernel is for the ring strategies, not strategy={strategy!r}")
    n = int(np.prod([mesh.shape[name] for name in axes]))
    batch_size = None if batch_axis_name is None else mesh.shape[batch_axis_name]
    _check_shapes(q, k, v, strategy, n, batch_size)
    if strategy == "ulysses-ring" and q.shape[-3] % mesh.shape[axes[0]]:
        raise ValueError(
            f"H={q.shape[-3]} heads do not divide over the {mesh.shape[axes[0]]} devices of the Ulysses "
            f"axis {axes[0]!r} (strategy='ulysses-ring')"
        )
    heads, length = q.shape[-3], q.shape[-2]
    if plan is not None:
        if mask is not None or grid is not None:
            raise ValueError("give either plan or mask / grid, not both")
        if plan.num_heads != heads:
            raise ValueError(f"the plan has {plan.num_heads} heads but q has {heads}")
        plan.grid.check_length(length)
        if strategy in ("ring", "ulysses-ring"):  # the plan's heads ride the ring as exact masks
            mask, plan = ring.plan_mask(plan), None
        else:
            grid = plan.grid
    check_mask(mask, heads, length)
    if grid is not None:
        grid.check_length(length)
    platform = _mesh_platform(mesh)
    chosen = choose(impl, mask if plan is None else plan.mask, backend=platform).name
    if platform == "tpu" and kwargs.get("interpret") is None:
        kwargs["interpret"] = False
    if strategy in ("ring", "ulysses-ring"):
        if shard_order is None:
            return _ring(q, k, v, mask, mesh, axes, batch_axis_name, get(chosen), kwargs, shared_kernel)
        _check_shard_order(shard_order, length)
        q, k, v = (_gather_tokens(x, shard_order.perm) for x in (q, k, v))
        mask = ring.dense_mask(mask, length).permute(shard_order)
        out = _ring(q, k, v, mask, mesh, axes, batch_axis_name, get(chosen), kwargs, shared_kernel)
        return _gather_tokens(out, shard_order.inverse)
    branches = device_branches(mask, plan, heads, n)
    run = partial(_run_branch, grid=grid, with_plan=plan is not None, impl=chosen, kwargs=kwargs)
    fns = [partial(run, branch) for branch in branches.branches]
    table = np.asarray(branches.branch_of_device, np.int32)
    batched = q.ndim == 4
    lead = (batch_axis_name,) if batched else ()
    spec = P(*lead, axis_name, None, None) if strategy == "heads" else P(*lead, None, axis_name, None)

    def local(q, k, v):
        head_axis = 1 if batched else 0
        if strategy == "ulysses":  # [.., H, L/N, D] -> [.., H/N, L, D]
            q, k, v = (_all_to_all(x, axis_name, head_axis, head_axis + 1) for x in (q, k, v))
        if len(fns) == 1:
            body = fns[0]
        else:
            index = jax.numpy.asarray(table)[jax.lax.axis_index(axis_name)]
            body = partial(jax.lax.switch, index, fns)
        out = jax.vmap(body)(q, k, v) if batched else body(q, k, v)
        if strategy == "ulysses":  # [.., H/N, L, D] -> [.., H, L/N, D]
            out = _all_to_all(out, axis_name, head_axis + 1, head_axis)
        return out

    sharded = jax.shard_map(local, mesh=mesh, in_specs=(spec, spec, spec), out_specs=spec, check_vma=False)
    return jax.jit(sharded)(*(_placed(x, mesh, spec) for x in (q, k, v)))  # eager shard_map: op by op


def check_strategy(mesh, axis_name, strategy: str, batch_axis_name=None, *, reordered: bool = False) -> tuple:
    """The mesh axes of a ``parallel_attention`` call ((ulysses axis, ring axis) for "ulysses-ring",
    else (axis_name,)), after checking what needs no input: ``strategy`` one of ``STRATEGIES``, the
    axis names of the strategy on ``mesh``, and no token reordering (``reordered``: a grid) for the
    ring strategies. Raises TypeError / ValueError naming the value.

    >>> import jax
    >>> check_strategy(jax.make_mesh((1,), ("x",)), "x", "rign")
    Traceback (most recent call last):
    ValueError: strategy='rign' must be one of ('heads', 'ulysses', 'ring', 'ulysses-ring')
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy={strategy!r} must be one of {STRATEGIES}")
    axes = _check_axes(axis_name, strategy)
    for name in axes:
        _check_mesh(mesh, name, batch_axis_name)
    if reordered and strategy in ("ring", "ulysses-ring"):
        raise ValueError(
            f"strategy={strategy!r} takes the mask in the order the tokens are sharded in: reorder q, "
            "k, v and the mask (mask.permute(order)) first, or give shard_order; grid is for 'heads' and "
            "'ulysses'"
        )
    return axes


def _gather_tokens(x, index):
    """``x[..., index, :]``, keeping the sharding ``x`` has (an explicit mesh's names it)."""
    return x.at[..., np.asarray(index), :].get(out_sharding=jax.typeof(x).sharding)


def _check_shard_order(order, length: int) -> None:
    if not isinstance(order, TokenOrder):
        raise TypeError(
            f"shard_order must be a stlib TokenOrder (stlib.ring.balanced_order), got {type(order).__name__}"
        )
    if order.length != length or order.num_tokens != length:
        raise ValueError(
            f"shard_order {order.name!r} orders {order.num_tokens} tokens in {order.length} slots; "
            f"the ring needs an order of the call's L={length} tokens without padding"
        )


def _check_axes(axis_name, strategy: str) -> tuple:
    """The mesh axes of ``strategy``: (ulysses axis, ring axis) for "ulysses-ring", else (axis,)."""
    if strategy == "ulysses-ring":
        if not (
            isinstance(axis_name, (tuple, list)) and len(axis_name) == 2 and axis_name[0] != axis_name[1]
        ):
            raise ValueError(
                f"strategy='ulysses-ring' takes axis_name=(ulysses_axis, ring_axis), two axes of the mesh; "
                f"got axis_name={axis_name!r}"
            )
        return tuple(axis_name)
    if isinstance(axis_name, (tuple, list)):
        raise TypeError(f"axis_name={axis_name!r}: a pair of axes only for strategy='ulysses-ring'")
    return (axis_name,)


def _ring(q, k, v, mask, mesh, axes, batch_axis_name, implementation, kwargs, shared: bool = True):
    """``strategy="ring"`` over ``axes = (ring,)``, or "ulysses-ring" over ``axes = (ulysses, ring)``:
    the sequence split over the axes, the hops of ``ring.ring_hops`` (one ring per head slice of the
    Ulysses axis); ``shared``: through ``ring.shared_kernel`` where the kernel has one."""
    ulysses_axis, ring_axis = axes if len(axes) == 2 else (None, axes[0])
    groups = 1 if ulysses_axis is None else mesh.shape[ulysses_axis]
    size = mesh.shape[ring_axis]
    heads, length = q.shape[-3], q.shape[-2]
    whole = ring.dense_mask(mask, length)
    per = heads // groups
    slices = [head_slice(whole, g * per, (g + 1) * per) for g in range(groups)]
    hops, call = ring.ring_hops(slices, size), ring.ring_call(implementation, q.shape[-1], kwargs)
    local_ring = ring.ring_local(
        hops,
        *ring.hop_functions(implementation, call),
        axis_name=ring_axis,
        num_devices=size,
        group_axis=ulysses_axis,
        shared=ring.shared_kernel(implementation, call, hops, whole, size, per) if shared else None,
    )
    batched = q.ndim == 4
    head_axis = 1 if batched else 0
    body = jax.vmap(local_ring) if batched else local_ring

    def local(q, k, v):
        if ulysses_axis is not None:  # [.., H, L/(U R), D] -> [.., H/U, L/R, D]: the ring's stretch
            q, k, v = (_all_to_all(x, ulysses_axis, head_axis, head_axis + 1) for x in (q, k, v))
        out = body(q, k, v)
        if ulysses_axis is not None:
            out = _all_to_all(out, ulysses_axis, head_axis + 1, head_axis)
        return out

    lead = (batch_axis_name,) if batched else ()
    spec = P(*lead, None, ring_axis if ulysses_axis is None else (ring_axis, ulysses_axis), None)
    sharded = jax.shard_map(local, mesh=mesh, in_specs=(spec, spec, spec), out_specs=spec, check_vma=False)
    out = jax.jit(sharded)(*(_placed(x, mesh, spec) for x in (q, k, v)))  # one program, not op by op
    valid = None if mask is None else mask.token_validity()
    if valid is not None and not valid.all():  # padding slots of a permuted mask: zeros
        out = jax.numpy.where(jax.numpy.asarray(valid)[:, None], out, jax.numpy.zeros((), out.dtype))
    return out


def _placed(x, mesh: Mesh, spec: P):
    """``x`` sharded as ``spec`` where the spec names an explicit mesh axis (``jax.make_mesh``'s
    default), whose ``shard_map`` takes only inputs already sharded so; as it is on an auto mesh."""
    kinds = dict(zip(mesh.axis_names, mesh.axis_types))
    names = [
        n for entry in spec if entry is not None for n in (entry if isinstance(entry, tuple) else (entry,))
    ]
    if any(kinds.get(name) == AxisType.Explicit for name in names):
        return jax.reshard(x, NamedSharding(mesh, spec))
    return x


def _all_to_all(x, axis_name: str, split_axis: int, concat_axis: int):
    return jax.lax.all_to_all(x, axis_name, split_axis, concat_axis, tiled=True)


def _run_branch(branch, q, k, v, *, grid, with_plan, impl, kwargs):
    """One device's attention for its heads: ``branch`` is its mask (or plan)."""
    if with_plan:
        return video_attention(q, k, v, grid, plan=branch, impl=impl, **kwargs)
    if grid is not None:
        return video_attention(q, k, v, grid, branch, impl=impl, **kwargs)
    return attention(q, k, v, branch, impl=impl, **kwargs)


__all__ = [
    "STRATEGIES",
    "DeviceBranches",
    "check_strategy",
    "device_branches",
    "head_slice",
    "parallel_attention",
]
