"""``attention_fn``: stlib's attention as a model calls it, with flax's ``attention_fn`` contract.

flax's ``nnx.MultiHeadAttention`` (and ``linen``'s) call ``attention_fn(query, key, value, mask=...,
dropout_rng=..., dropout_rate=..., broadcast_dropout=..., deterministic=..., dtype=...,
precision=..., module=..., is_causal=...)`` on [batch..., L, H, D] arrays. ``attention_fn(mask,
...)`` returns such a callable that runs ``stlib.attention`` (or ``video_attention`` with a grid or
plan, or ``parallel_attention`` over a mesh) on [H, L, D] per batch element.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from stlib.api import attention, video_attention
from stlib.masks import Mask
from stlib.registry import DEFAULT_IMPL


def _check_inputs(query, key, value) -> None:
    for name, x in (("query", query), ("key", key), ("value", value)):
        if not hasattr(x, "ndim") or x.ndim < 3:
            raise ValueError(f"{name} must be [batch..., L, H, D], got shape {getattr(x, 'shape', None)}")
    if key.shape != value.shape:
        raise ValueError(f"key {key.shape} and value {value.shape} must have one shape")
    if query.shape[:-3] != key.shape[:-3] or query.shape[-2:] != key.shape[-2:]:
        raise ValueError(
            f"query {query.shape} and key {key.shape} must share batch dims, heads and head dim "
            "([batch..., L, H, D])"
        )


#: The keywords of ``stlib.attention`` an ``attention_fn`` passes on (and ``orders`` of
#: ``video_attention`` with a grid or plan).
ATTENTION_KEYWORDS = ("scale", "block_q", "block_kv", "options", "interpret", "allow_slow_interpret")


def _check_build(impl: str, attention_kwargs: dict, video: bool) -> None:
    """Refuse, when the callable is built (not at its first forward), an unknown ``impl``, keyword or
    option, naming ``stlib.attention_fn``."""
    from stlib import registry

    allowed = ATTENTION_KEYWORDS + (("orders",) if video else ())
    unknown = sorted(set(attention_kwargs) - set(allowed))
    if unknown:
        raise TypeError(
            f"stlib.attention_fn() got unexpected keyword(s) {unknown}; besides mask, grid, plan, impl, "
            f"mesh, axis_name, strategy and batch_axis_name it takes those of stlib.attention: {list(allowed)}"
        )
    try:
        if impl != registry.AUTO:
            registry.get(impl).options(attention_kwargs.get("options"))
        for name in ("block_q", "block_kv"):
            value = attention_kwargs.get(name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
                raise ValueError(f"{name}={value!r} must be a positive int")
    except (TypeError, ValueError) as error:
        raise type(error)(f"stlib.attention_fn(): {error}") from None


def _refuse_flax_features(mask, bias, dropout_rate, deterministic, module, is_causal) -> None:
    if mask is not None:
        raise ValueError(
            "stlib.attention_fn got a flax mask array; give the mask to stlib.attention_fn(mask=...) as a "
            "stlib mask (stlib.masks.*; masks.from_array wraps a bool array), so the kernel can skip its tiles"
        )
    if bias is not None:
        raise ValueError("stlib.attention_fn takes no attention bias (got one): stlib kernels add none")
    if dropout_rate and not deterministic:
        raise ValueError(
            f"stlib.attention_fn has no attention dropout (dropout_rate={dropout_rate} in training mode); "
            "build the module with dropout_rate=0.0"
        )
    if is_causal:
        raise ValueError("stlib.attention_fn got is_causal=True; give stlib.masks.causal(L) as its mask")
    if module is not None:
        raise ValueError(
            "stlib.attention_fn cannot sow attention weights (sow_weights=True): it never forms them"
        )


def attention_fn(
    mask: Mask | None = None,
    *,
    grid=None,
    plan=None,
    impl: str = DEFAULT_IMPL,
    mesh=None,
    axis_name: str | None = None,
    strategy: str = "heads",
    batch_axis_name: str | None = None,
    **attention_kwargs,
):
    """A callable with flax's ``attention_fn`` contract that runs stlib attention under ``mask``.

    The callable takes query [batch..., Lq, H, D], key and value [batch..., Lkv, H, D] and the
    keywords flax passes (``mask``, ``bias``, ``dropout_rng``, ``dropout_rate``,
    ``broadcast_dropout``, ``deterministic``, ``dtype``, ``precision``, ``module``, ``is_causal``)
    and returns [batch..., Lq, H, D]. ``mask``: a stlib mask over the L tokens (raster order with
    ``grid``); ``grid`` / ``plan``: the token reordering of ``video_attention``; ``mesh`` and
    ``axis_name``: run ``stlib.parallel_attention`` over that mesh axis (``strategy``, and the
    batch over ``batch_axis_name``); ``attention_kwargs``: those of ``stlib.attention``
    (``options``, block sizes, ``scale``; default 1/sqrt(D)). Differentiable and jit-able.

    ``dtype`` casts the inputs (flax's computation dtype); ``precision`` is ignored (stlib
    accumulates in float32). Refused with a clear error: a flax mask array or bias (give a stlib
    mask instead), dropout in training mode, ``is_causal``, ``sow_weights``, and cross-attention
    (Lq != Lkv) with a mask, grid or plan; cross-attention without one runs dense
    (``jax.nn.dot_product_attention``). A query row the stlib mask leaves empty gets zeros, where
    flax's own attention gives it uniform weights over every key.

    >>> import jax, stlib
    >>> fn = stlib.attention_fn(stlib.masks.band(256, 32), impl="xla")  # for flax's MultiHeadAttention
    >>> x = jax.random.normal(jax.random.key(0), (1, 256, 2, 64))  # [batch, L, H, D]
    >>> fn(x, x, x).shape
    (1, 256, 2, 64)
    >>> stlib.attention_fn(impl="pallas-tile")
    Traceback (most recent call last):
    ValueError: stlib.attention_fn(): impl='pallas-tile' is unknown (did you mean 'pallas_tile'?); ...
    """
    if mask is not None and not isinstance(mask, Mask):
        raise TypeError(f"mask must be a stlib mask (stlib.masks.*) or None, got {type(mask).__name__}")
    _check_build(impl, attention_kwargs, video=grid is not None or plan is not None)
    if (mesh is None) != (axis_name is None):
        raise ValueError("give mesh and axis_name together (parallel attention), or neither")
    if mesh is not None:
        from stlib.parallel import check_strategy

        try:
            check_strategy(mesh, axis_name, strategy, batch_axis_name, reordered=grid is not None)
        except (TypeError, ValueError) as error:
            raise type(error)(f"stlib.attention_fn(): {error}") from None
    sparse = mask is not None or grid is not None or plan is not None
    stlib_mask = mask  # the callable's own ``mask`` keyword is flax's (refused unless None)

    def run(
        query,
        key,
        value,
        bias=None,
        mask=None,
        broadcast_dropout=True,
        dropout_rng=None,
        dropout_rate=0.0,
        deterministic=False,
        dtype=None,
        precision=None,
        module=None,
        is_causal=False,
    ):
        _refuse_flax_features(mask, bias, dropout_rate, deterministic, module, is_causal)
        _check_inputs(query, key, value)
        if dtype is not None:
            query, key, value = (x.astype(dtype) for x in (query, key, value))
        lq, lkv = query.shape[-3], key.shape[-3]
        if lq != lkv:
            if sparse:
                raise ValueError(
                    f"cross-attention (Lq={lq}, Lkv={lkv}) with a sparse mask, grid or plan: stlib's "
                    "masks are self-attention masks; build the cross-attention's attention_fn without one"
                )
            return _dense_cross_attention(query, key, value, attention_kwargs.get("scale"))
        return _self_attention(query, key, value)

    def _self_attention(query, key, value):
        batch, (length, heads, dim) = query.shape[:-3], query.shape[-3:]
        q, k, v = (x.reshape(-1, length, heads, dim).transpose(0, 2, 1, 3) for x in (query, key, value))
        if mesh is not None:
            from stlib.parallel import parallel_attention

            out = parallel_attention(
                q,
                k,
                v,
                stlib_mask,
                mesh=mesh,
                axis_name=axis_name,
                strategy=strategy,
                grid=grid,
                plan=plan,
                impl=impl,
                batch_axis_name=batch_axis_name,
                **attention_kwargs,
            )
        else:
            out = jax.vmap(one)(q, k, v)
        return out.transpose(0, 2, 1, 3).reshape(*batch, length, heads, dim)

    def one(q, k, v):  # [H, L, D]
        if grid is not None or plan is not None:
            the_grid = plan.grid if plan is not None else grid
            return video_attention(q, k, v, the_grid, stlib_mask, plan=plan, impl=impl, **attention_kwargs)
        return attention(q, k, v, stlib_mask, impl=impl, **attention_kwargs)

    return run


def _dense_cross_attention(query, key, value, scale):
    """Dense attention of [batch..., Lq, H, D] queries over [batch..., Lkv, H, D] keys (XLA)."""
    batch = query.shape[:-3]
    q, k, v = (x.reshape(-1, *x.shape[-3:]) for x in (query, key, value))
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)
    out = jax.nn.dot_product_attention(q, k, v, scale=scale)
    return jnp.reshape(out, (*batch, *out.shape[1:]))


__all__ = ["attention_fn"]
