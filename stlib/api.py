"""``attention`` and ``video_attention``: one entry point over every implementation.

Implementations are ``stlib.registry.Implementation`` objects registered by name (importing
``stlib.kernels`` registers them all); each receives validated inputs: q, k, v [H, L, D] float
arrays of one dtype, ``mask`` (a stlib mask or None), ``scale``, ``block_q``, ``block_kv`` (None:
the implementation's default), its ``options`` and ``interpret`` (None: interpret unless on TPU).
"""

from __future__ import annotations

import math
import numbers

import jax
import jax.numpy as jnp

from stlib._checks import check_positive_int
from stlib.geometry import TokenOrder, VideoGrid, apply_orders, restore_orders
from stlib.masks import Mask, per_head
from stlib.registry import AUTO, DEFAULT_IMPL, IMPLEMENTATIONS, register
from stlib.registry import choose as _choose


def _check_block(name: str, value, multiple: int = 8) -> int | None:
    if value is None:
        return None
    check_positive_int(name, value)
    if value % multiple:
        raise ValueError(f"{name}={value} must be a positive multiple of {multiple}")
    return int(value)


def check_qkv(q, k, v, shared_kv: bool = False) -> None:
    """Raise TypeError / ValueError, naming the argument, unless q, k, v are [H, L, D] floating
    arrays of one dtype with H, L, D > 0, equal shapes (self-attention); ``shared_kv``: k and v may
    have fewer heads than q, a divisor of them."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not hasattr(x, "shape") or not hasattr(x, "dtype"):
            raise TypeError(f"{name} must be an array, got {type(x).__name__}")
        if x.ndim != 3:
            raise ValueError(f"{name} must be [H, L, D], got shape {tuple(x.shape)}")
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise TypeError(f"{name} must be a floating dtype, got {x.dtype}")
        for axis, letter in enumerate("HLD"):
            if x.shape[axis] == 0:
                raise ValueError(
                    f"{name} has {letter}=0 (shape {tuple(x.shape)}); every axis of [H, L, D] "
                    "must be at least 1"
                )
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k and v must share one dtype, got {q.dtype}, {k.dtype} and {v.dtype}")
    if k.shape != v.shape:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must have the same shape")
    if (q.shape[0] % k.shape[0]) if shared_kv else (q.shape[0] != k.shape[0]):
        raise ValueError(f"q has {q.shape[0]} heads but k has {k.shape[0]}")
    if q.shape[2] != k.shape[2]:
        raise ValueError(f"q head dim {q.shape[2]} differs from k head dim {k.shape[2]}")
    if q.shape[1] != k.shape[1]:
        raise ValueError(f"self-attention needs q and k of equal length, got {q.shape[1]} and {k.shape[1]}")


def check_mask(mask, num_heads: int, length: int) -> None:
    if mask is None:
        return
    if not isinstance(mask, Mask):
        raise TypeError(f"mask must be a stlib mask (stlib.masks.*) or None, got {type(mask).__name__}")
    if mask.shape != (length, length):
        raise ValueError(f"mask shape {mask.shape} does not match sequence length {length}")
    if mask.num_heads is not None and mask.num_heads != num_heads:
        raise ValueError(f"mask has {mask.num_heads} heads but q has {num_heads}")


#: Most query-key pairs (H x L^2) a Pallas kernel runs in interpret mode unless asked to: 2^32,
#: e.g. 4 heads x 32,768 tokens, about a minute or two on a 2-core CPU (the case study, 10 heads x
#: 75,600 tokens, is 13x more: hours).
INTERPRET_PAIR_LIMIT = 2**32


def check_interpret_size(implementation, shape, interpret, allow_slow: bool, batch: int = 1) -> None:
    """Refuse a Pallas kernel in interpret mode over more than ``INTERPRET_PAIR_LIMIT`` pairs in all
    (``batch`` elements of [H, L, D] ``shape``) unless ``allow_slow``."""
    from stlib.device import resolve_interpret

    if not isinstance(allow_slow, bool):
        raise TypeError(f"allow_slow_interpret={allow_slow!r} must be True or False")
    heads, length, _ = shape
    pairs = batch * heads * length * length
    if (
        implementation.is_pallas
        and resolve_interpret(interpret)
        and pairs > INTERPRET_PAIR_LIMIT
        and not allow_slow
    ):
        raise ValueError(
            f"impl={implementation.name!r} would run in Pallas interpret mode (no TPU here) over "
            f"{f'{batch:,} batch elements x ' if batch > 1 else ''}{heads} heads x "
            f"{length:,} tokens = {pairs:.2e} query-key pairs, more than stlib.api.INTERPRET_PAIR_LIMIT = "
            f"{INTERPRET_PAIR_LIMIT:.2e} (minutes to hours on a CPU): run it on a TPU, use fewer tokens "
            "or heads, impl='xla' (compiled for the CPU), or pass allow_slow_interpret=True"
        )


def attention(
    q,
    k,
    v,
    mask: Mask | None = None,
    *,
    impl: str = DEFAULT_IMPL,
    scale: float | None = None,
    block_q: int | None = None,
    block_kv: int | None = None,
    options=None,
    interpret: bool | None = None,
    allow_slow_interpret: bool = False,
):
    """Multi-head attention softmax(q k^T * scale, mask) v.

    q: [..., H, L, D], k and v: [..., H / G, L, D] (leading batch axes, each kv head shared by G
    consecutive q heads: grouped-query attention), floating arrays of one dtype (bf16 / f32; f16
    runs in interpret mode and on XLA, untested on a TPU); mask: a stlib mask of shape (L, L),
    head-uniform or with H heads, or None (dense). ``scale`` defaults to 1/sqrt(D). Returns [H, L, D]
    in q's dtype ([..., H, L, D]); query rows that see no key are zeros. Batch axes run the kernel
    under ``jax.vmap``; grouped kv heads go to a kernel natively where its capabilities say so
    (``shared_kv_heads``: Splash), else each kv head is repeated for its G q heads first (the
    gradient sums back over them). A [L, H, D] array (flax's layout) passed without a mask, with
    more heads than tokens, is refused: use ``stlib.attention_fn`` for [batch..., L, H, D]. ``impl`` names an entry of
    ``IMPLEMENTATIONS``, or "auto" (the default): the best one for the backend and mask
    (``stlib.choose(mask)`` says which: on a TPU the tile kernel, dense Splash without a mask;
    elsewhere ``xla``). ``options``: that implementation's options (its ``options_type``, or a dict
    of its fields; None: defaults). Raises TypeError / ValueError on bad input (shapes, dtypes,
    heads, unknown impl or option, block sizes). A Pallas kernel in interpret mode (off a TPU) over
    more than ``INTERPRET_PAIR_LIMIT`` query-key pairs (H x L^2: minutes to hours on a CPU) is
    refused in one sentence unless ``allow_slow_interpret=True``.

    >>> import stlib
    >>> q, k, v = stlib.random_qkv((2, 256, 64))
    >>> out = stlib.attention(q, k, v, stlib.masks.band(256, 32), impl="pallas_tile", block_q=128, block_kv=128)
    >>> out.shape, bool(abs(out - stlib.attention(q, k, v, stlib.masks.band(256, 32), impl="reference")).max() < 1e-4)
    ((2, 256, 64), True)
    """
    _check_layouts(q, k, v, mask)
    call = {
        "impl": impl,
        "scale": scale,
        "block_q": block_q,
        "block_kv": block_kv,
        "options": options,
        "interpret": interpret,
        "allow_slow_interpret": allow_slow_interpret,
        "batch_elements": math.prod(q.shape[:-3]),  # the interpret-mode limit counts them all
    }
    batch = q.shape[:-3]
    group = q.shape[-3] // max(k.shape[-3], 1)
    if group > 1 and not _choose(impl, mask).capabilities.shared_kv_heads:
        k, v = (jnp.repeat(x, group, axis=-3) for x in (k, v))  # [..., H, L, D]

    def one(q, k, v):  # [H, L, D], k and v with H or H / G heads
        return _attention_heads(q, k, v, mask, call)

    if not batch:
        return one(q, k, v)
    flat = [x.reshape(-1, *x.shape[-3:]) for x in (q, k, v)]
    return jax.vmap(one)(*flat).reshape(*batch, *q.shape[-3:-1], v.shape[-1])


def _check_layouts(q, k, v, mask) -> None:
    """[..., H, L, D] q and [..., H / G, L, D] k, v of one batch shape; a flax-layout [L, H, D]
    without a mask refused by name."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not hasattr(x, "shape") or not hasattr(x, "dtype"):
            raise TypeError(f"{name} must be an array, got {type(x).__name__}")
        if x.ndim < 3:
            raise ValueError(f"{name} must be [..., H, L, D], got shape {tuple(x.shape)}")
    if not (q.shape[:-3] == k.shape[:-3] == v.shape[:-3]):
        raise ValueError(f"q {q.shape}, k {k.shape} and v {v.shape} must share their batch axes [...]")
    if k.shape != v.shape:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must have the same shape")
    heads, kv_heads = q.shape[-3], k.shape[-3]
    if 0 in (*q.shape[-3:], *k.shape[-3:]):
        return  # check_qkv names the empty axis
    if heads % kv_heads:
        raise ValueError(
            f"k and v have {kv_heads} heads, which must divide the {heads} heads of q (each kv head shared "
            "by H / G consecutive q heads)"
        )
    if mask is None and heads > q.shape[-2]:
        raise ValueError(
            f"q {tuple(q.shape)} has more heads ({heads}) than tokens ({q.shape[-2]}): it looks like flax's "
            "[..., L, H, D]; stlib.attention takes [..., H, L, D] (transpose it), and stlib.attention_fn "
            "takes [batch..., L, H, D]"
        )


def _attention_heads(q, k, v, mask: Mask | None, call: dict):
    """``attention`` on one [H, L, D] call (validated here), ``call`` its keywords; k and v with
    H / G heads only for an implementation that shares kv heads natively."""
    check_qkv(q, k, v, shared_kv=k.shape[0] != q.shape[0])
    check_mask(mask, q.shape[0], q.shape[1])
    implementation = _choose(call["impl"], mask)
    options = implementation.options(call["options"])
    interpret = call["interpret"]
    check_interpret_size(
        implementation, q.shape, interpret, call["allow_slow_interpret"], call["batch_elements"]
    )
    scale = call["scale"]
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[2])
    elif not isinstance(scale, numbers.Real) or isinstance(scale, bool) or not math.isfinite(scale):
        raise TypeError(f"scale={scale!r} must be a finite number")
    kernel_call = implementation.kernel_call(  # the call's Config, resolved once
        mask,
        q.shape[1],
        scale=float(scale),
        block_q=_check_block("block_q", call["block_q"]),
        block_kv=_check_block("block_kv", call["block_kv"]),
        options=options,
        interpret=interpret,
    )
    out = implementation.trainable(mask, kernel_call)(q, k, v)
    valid = None if mask is None else mask.token_validity()
    if valid is not None and not valid.all():
        # padding slots of a permuted mask see nothing: zeros, whatever a kernel computed there
        out = jnp.where(jnp.asarray(valid)[None, :, None], out, jnp.zeros((), out.dtype))
    return out


def video_attention(
    q,
    k,
    v,
    grid: VideoGrid,
    mask: Mask | None = None,
    *,
    impl: str = DEFAULT_IMPL,
    orders=None,
    plan=None,
    **kwargs,
):
    """Attention over the raster-order tokens of ``grid``: q, k, v [H, T*Y*X, D], ``mask`` in raster
    order. The tokens are reordered so the mask is tile-aligned (``choose_orders``: the candidate
    order with the fewest non-empty tiles, per head for per-head masks), the kernel runs, and the
    output is restored to raster order: equal to ``attention(..., impl="reference")`` on the
    raster-order mask. ``orders`` overrides the choice (one TokenOrder, or one per head).
    ``plan`` (a ``stlib.routing.SvgPlan``, instead of mask and orders) runs that plan: its orders
    and tile layout, nothing rebuilt (``plan.run``). Raises ValueError if the grid
    does not match L.

    >>> import stlib
    >>> grid = stlib.VideoGrid(2, 8, 16)  # 2 frames of 8 x 16 latent tokens
    >>> q, k, v = stlib.random_qkv((2, grid.num_tokens, 64))
    >>> mask = stlib.masks.spatial(grid)
    >>> out = stlib.video_attention(q, k, v, grid, mask, impl="xla")
    >>> out.shape, bool(abs(out - stlib.attention(q, k, v, mask, impl="reference")).max() < 1e-4)
    ((2, 256, 64), True)
    """
    from stlib.reorder import choose_orders

    if not isinstance(grid, VideoGrid):
        raise TypeError(f"grid must be a stlib.VideoGrid, got {type(grid).__name__}")
    check_qkv(q, k, v)
    grid.check_length(q.shape[1])
    check_mask(mask, q.shape[0], q.shape[1])
    if plan is not None:
        if not callable(getattr(plan, "run", None)) or not hasattr(plan, "grid"):
            raise TypeError(f"plan must be a stlib.routing.SvgPlan, got {type(plan).__name__}")
        if mask is not None or orders is not None:
            raise ValueError("give either plan or mask / orders, not both")
        if plan.grid != grid:
            raise ValueError(f"the plan is for grid {plan.grid.shape}, not {grid.shape}")
        return plan.run(q, k, v, impl=impl, **kwargs)
    if mask is None:
        return attention(q, k, v, None, impl=impl, **kwargs)
    if orders is None:
        orders = choose_orders(grid, mask, *_order_blocks(impl, mask, q.shape[1], kwargs))
    elif isinstance(orders, TokenOrder):
        orders = [orders]
    orders = list(orders)
    if len(orders) == 1:
        permuted = mask.permute(orders[0])
    else:
        views: dict[tuple, Mask] = {}  # one view per distinct (head mask, order): kernels select among few
        for h, order in enumerate(orders):
            views.setdefault((mask.head(h), order), mask.head(h).permute(order))
        permuted = per_head([views[(mask.head(h), o)] for h, o in enumerate(orders)])
    out = attention(
        apply_orders(q, orders),
        apply_orders(k, orders),
        apply_orders(v, orders),
        permuted,
        impl=impl,
        **kwargs,
    )
    return restore_orders(out, orders)


def _order_blocks(impl: str, mask: Mask, length: int, kwargs: dict) -> tuple[int, int]:
    """(block_q, block_kv) at which ``video_attention`` compares token orders: the blocks the
    kernel resolves for the call (its ``Config`` on the raster-order mask), or 128 x 128 for an
    implementation without tiles (the reference)."""
    config = _choose(impl, mask).config(
        mask,
        length,
        _check_block("block_q", kwargs.get("block_q")),
        _check_block("block_kv", kwargs.get("block_kv")),
        kwargs.get("options"),
        interpret=kwargs.get("interpret"),
    )
    return config.block_q or 128, config.block_kv or 128


def choose(mask: Mask | None = None, *, backend: str | None = None):
    """The implementation ``impl="auto"`` runs for ``mask`` (None: dense attention) on ``backend``
    (None: JAX's default backend): on a TPU the tile kernel for a mask it takes, dense Splash without
    a mask (or for a mask the tile kernel refuses); elsewhere ``xla``. Raises ValueError when no
    ranked implementation takes the mask, saying why each refused.

    >>> import stlib
    >>> stlib.choose(stlib.masks.band(1024, 64), backend="cpu").name
    'xla'
    >>> stlib.choose(backend="tpu").name
    'splash'
    >>> stlib.choose(stlib.masks.band(1024, 64), backend="tpu").name
    'pallas_tile_lane_dense'
    """
    return _choose(AUTO, mask, backend=backend)


def random_qkv(shape, dtype=jnp.float32, seed: int = 0):
    """Three seeded standard-normal [H, L, D] arrays (q, k, v) for tests, notebooks and benchmarks."""
    import jax

    keys = jax.random.split(jax.random.key(seed), 3)
    return tuple(jax.random.normal(key, shape, jnp.float32).astype(dtype) for key in keys)


__all__ = ["IMPLEMENTATIONS", "attention", "check_qkv", "choose", "random_qkv", "register", "video_attention"]
