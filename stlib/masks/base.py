"""The mask protocol and what every mask shares: ``Mask`` (evaluation, value identity, children),
the ``&`` / ``|`` combinator, head views, permuted views and the interval helpers they use.

A mask answers "may query i see key j" lazily, never as L x L, in three forms: ``allowed(q, k,
head)``, a vectorised predicate on broadcastable integer index arrays (numpy, and inside a kernel
``mask_function(q, k, head)`` on traced jax arrays when ``mask.traceable``); ``block(q0, q1, k0, k1, head)``, one bool block; and
``key_intervals(rows, head)``, the allowed keys of each query row as disjoint half-open intervals
``[start, end)`` of shape [n, K] each, from which layouts count allowed pairs per tile (layout.py).
Masks compare and hash by value (``_key``: their parameters, and their children for composites),
so caches key on them, and ``children()`` lists the sub-masks a mask is built from.
"""

from __future__ import annotations

import enum

import jax
import numpy as np

from stlib._intmath import array_module as _xp
from stlib.geometry import TokenOrder

#: Largest L for which ``to_dense`` / brute-force fallbacks materialise L x L.
DENSE_LIMIT = 16_384
#: A per-head mask is evaluated in-kernel only with at most this many distinct head masks.
MAX_TRACED_HEAD_MASKS = 4


class CombineOp(enum.Enum):
    """How ``CombinedMask`` joins its two masks: ``a & b`` or ``a | b``."""

    AND = "&"
    OR = "|"


class Mask:
    """Base class. Subclasses set ``length`` and ``num_heads``, implement ``_allowed`` and define
    their value in ``_key`` (and ``children`` when they are built from other masks)."""

    length: int
    num_heads: int | None = None  # None: the same mask for every head
    traceable: bool = False  # _allowed works on jax arrays (so a kernel can evaluate it from iota)
    has_intervals: bool = True
    #: The token order this mask is a view in (a permuted view's ``TokenOrder``); None: its own.
    order = None
    #: Blocks of one mask stacked for one compiled kernel (``StackedBlocks``): a kernel reads a
    #: block's rows of its tables as data.
    stacked: bool = False

    def __init_subclass__(cls, **kwargs):
        # every mask is a static pytree (no leaves, hashed by value): jax.jit(stlib.attention)(q, k, v,
        # mask) traces once per distinct mask, with no static_argnums or closure
        super().__init_subclass__(**kwargs)
        jax.tree_util.register_static(cls)

    @property
    def shape(self) -> tuple[int, int]:
        return (self.length, self.length)

    # --- identity ---------------------------------------------------------------------------
    def _key(self) -> tuple:
        """The mask's value: its parameters (sub-masks included as masks), equal exactly for
        masks of the same type that allow the same pairs by construction."""
        raise NotImplementedError(f"{type(self).__name__} must define _key() to compare and hash by value")

    def children(self) -> tuple[Mask, ...]:
        """The masks this mask is built from, () for a leaf."""
        return ()

    def form(self) -> tuple | None:
        """What the mask is, as data, for a kernel with masks of its own built in (Splash's lazy
        masks): ``("full",)``, ``("causal",)`` (k <= q), ``("band", w)`` (|q - k| <= w), ``("&", a,
        b)`` or ``("|", a, b)``, ``("per_head", (m0, m1, ...))``; None for every other mask. Kernels
        read masks through this, their intervals, predicate, validity and ``order``, never their class.

        >>> from stlib import masks
        >>> masks.band(100, 5).form(), (masks.full(100) & masks.causal(100)).form()[0]
        (('band', 5), '&')
        """
        return None

    def __eq__(self, other):
        if self is other:
            return True
        if not isinstance(other, Mask):
            return NotImplemented
        return type(self) is type(other) and self._key() == other._key()

    def __hash__(self):
        return hash((type(self), self._key()))

    # --- evaluation -------------------------------------------------------------------------
    def allowed(self, q, k, head: int = 0):
        """bool array broadcast from integer index arrays ``q`` and ``k`` (each in [0, L)).
        Raises ValueError for an index out of range or a bad head."""
        self._check_head(head)
        if _xp(q, k) is np:
            q, k = np.asarray(q), np.asarray(k)
            for name, idx in (("q", q), ("k", k)):
                if not np.issubdtype(idx.dtype, np.integer):
                    raise TypeError(f"{name} indices must be integers, got {idx.dtype}")
                if idx.size and (idx.min() < 0 or idx.max() >= self.length):
                    raise ValueError(
                        f"{name} indices must lie in [0, {self.length}), got [{idx.min()}, {idx.max()}]"
                    )
        return self._allowed(q, k, head)

    def mask_function(self, q, k, head):
        """The predicate a kernel evaluates from indices (as Splash's ``mask_function``): bool array
        broadcast from traced int32 index arrays ``q`` and ``k`` and a traced ``head``, no range
        checks (indices past L are the kernel's to mask). Raises TypeError unless ``traceable``."""
        if not self.traceable:
            raise TypeError(f"{self!r} is not traceable: a kernel cannot evaluate it from indices")
        return self._allowed(q, k, head)

    def _allowed(self, q, k, head):
        raise NotImplementedError

    def block(self, q0: int, q1: int, k0: int, k1: int, head: int = 0) -> np.ndarray:
        """bool [q1-q0, k1-k0]: the mask on rows q0:q1 and columns k0:k1."""
        for name, lo, hi in (("q", q0, q1), ("k", k0, k1)):
            if not (0 <= lo <= hi <= self.length):
                raise ValueError(f"block {name} range [{lo}, {hi}) is outside [0, {self.length})")
        q = np.arange(q0, q1)[:, None]
        k = np.arange(k0, k1)[None, :]
        return np.broadcast_to(self.allowed(q, k, head), (q1 - q0, k1 - k0)).copy()

    def key_intervals(self, rows: np.ndarray, head: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Allowed keys of each query row as disjoint intervals: (start, end), int64 [n, K] each."""
        self._check_head(head)
        if not self.has_intervals:
            raise NotImplementedError(f"{type(self).__name__} has no interval form; build its layout densely")
        starts, ends = self._intervals(np.asarray(rows, dtype=np.int64), head)
        return starts, np.maximum(ends, starts)

    def _intervals(self, rows, head):
        raise NotImplementedError

    def interval_classes(self, rows: np.ndarray) -> np.ndarray | None:
        """int64 [n]: a class per query row such that rows of one class have the same key intervals
        (so a layout computes each class's intervals once), or None where the mask knows no such
        grouping. Head-uniform masks only: the class holds for every head."""
        return None

    def to_dense(self) -> np.ndarray:
        """bool [L, L], or [H, L, L] for per-head masks. Only for L <= DENSE_LIMIT."""
        if self.length > DENSE_LIMIT:
            raise ValueError(
                f"to_dense() would materialise {self.length}^2 = {self.length**2:.3g} pairs per head; "
                f"it is limited to L <= {DENSE_LIMIT}. Use block() or stlib.block_layout instead."
            )
        if self.num_heads is None:
            return self.block(0, self.length, 0, self.length)
        return np.stack([self.block(0, self.length, 0, self.length, h) for h in range(self.num_heads)])

    def token_validity(self) -> np.ndarray | None:
        """bool [L]: False at padding slots (of a permuted view inside this mask); None if every
        token is real."""
        return None

    def _check_head(self, head):
        if self.num_heads is not None and not (0 <= head < self.num_heads):
            raise ValueError(f"head={head} is out of range for a mask with {self.num_heads} heads")

    # --- combinators ------------------------------------------------------------------------
    def __and__(self, other: Mask) -> Mask:
        return CombinedMask(self, other, CombineOp.AND)

    def __or__(self, other: Mask) -> Mask:
        return CombinedMask(self, other, CombineOp.OR)

    def permute(self, order: TokenOrder) -> Mask:
        """This mask seen in another token order (padding slots see and are seen by nothing)."""
        return PermutedMask(self, order)

    def block_view(self, q_start: int, k_start: int, size: int) -> Mask:
        """The block on query rows [q_start, q_start + size) and keys [k_start, k_start + size) as a
        mask of ``size`` tokens (``BlockView``: a ring's (q shard, kv shard) pair).

        >>> import stlib
        >>> stlib.masks.causal(8).block_view(4, 0, 4).to_dense().all()  # rows 4..7 see keys 0..3
        np.True_
        """
        return BlockView(self, q_start, k_start, size)

    def head(self, index: int) -> Mask:
        """The single-head mask of head ``index`` (the mask itself when it is head-uniform)."""
        self._check_head(index)
        return self if self.num_heads is None else _HeadView(self, index)

    def __repr__(self):
        heads = "" if self.num_heads is None else f", heads={self.num_heads}"
        return f"{type(self).__name__}(L={self.length}{heads})"


# --------------------------------------------------------------------------------------------
# interval helpers (all vectorised over rows)


def _union_intervals(starts, ends):
    """Make [n, K] intervals disjoint: sort by start, keep only what earlier intervals left."""
    order = np.argsort(starts, axis=1, kind="stable")
    s = np.take_along_axis(starts, order, axis=1)
    e = np.take_along_axis(ends, order, axis=1)
    e = np.where(e > s, e, s)
    reach = np.maximum.accumulate(e, axis=1)
    prev = np.concatenate([np.full((s.shape[0], 1), np.iinfo(np.int64).min), reach[:, :-1]], axis=1)
    new_s = np.maximum(s, prev)
    return new_s, np.maximum(e, new_s)


def _intersect_intervals(s1, e1, s2, e2):
    s = np.maximum(s1[:, :, None], s2[:, None, :]).reshape(s1.shape[0], -1)
    e = np.minimum(e1[:, :, None], e2[:, None, :]).reshape(s1.shape[0], -1)
    return s, np.maximum(e, s)


def _and_validity(a, b):
    if a is None or b is None:
        return b if a is None else a
    return a & b


def _merge_heads(a: Mask, b: Mask) -> int | None:
    if a.num_heads is not None and b.num_heads is not None and a.num_heads != b.num_heads:
        raise ValueError(f"cannot combine masks with {a.num_heads} and {b.num_heads} heads")
    return a.num_heads if a.num_heads is not None else b.num_heads


# --------------------------------------------------------------------------------------------
# composites: combinations, head views, permuted views


class CombinedMask(Mask):
    """``a & b`` or ``a | b`` (``op``), pair by pair and head by head."""

    def __init__(self, a: Mask, b: Mask, op: CombineOp):
        if not isinstance(a, Mask) or not isinstance(b, Mask):
            raise TypeError(f"can only combine Mask objects, got {type(a).__name__} and {type(b).__name__}")
        if a.length != b.length:
            raise ValueError(f"cannot combine masks of lengths {a.length} and {b.length}")
        self.a, self.b, self.op = a, b, CombineOp(op)
        self.length = a.length
        self.num_heads = _merge_heads(a, b)
        self.traceable = a.traceable and b.traceable
        self.has_intervals = a.has_intervals and b.has_intervals

    def _key(self):
        return (self.a, self.b, self.op)

    def form(self):
        return (self.op.value, self.a, self.b)

    def children(self):
        return (self.a, self.b)

    def token_validity(self):
        return _and_validity(self.a.token_validity(), self.b.token_validity())

    def _allowed(self, q, k, head):
        x, y = self.a._allowed(q, k, head), self.b._allowed(q, k, head)
        return (x & y) if self.op is CombineOp.AND else (x | y)

    def _intervals(self, rows, head):
        s1, e1 = self.a.key_intervals(rows, head)
        s2, e2 = self.b.key_intervals(rows, head)
        if self.op is CombineOp.AND:
            return _intersect_intervals(s1, e1, s2, e2)
        return _union_intervals(np.concatenate([s1, s2], axis=1), np.concatenate([e1, e2], axis=1))

    def __repr__(self):
        return f"({self.a!r} {self.op.value} {self.b!r})"


class _HeadView(Mask):
    """Head ``index`` of a per-head ``mask``, as a head-uniform mask."""

    def __init__(self, mask: Mask, index: int):
        self.mask, self.index = mask, index
        self.length, self.traceable, self.has_intervals = mask.length, mask.traceable, mask.has_intervals

    def _key(self):
        return (self.mask, self.index)

    def children(self):
        return (self.mask,)

    def token_validity(self):
        return self.mask.token_validity()

    def _allowed(self, q, k, head):
        return self.mask._allowed(q, k, self.index)

    def _intervals(self, rows, head):
        return self.mask.key_intervals(rows, self.index)


class PermutedMask(Mask):
    """``base`` viewed in ``order``: position i holds raster token ``order.perm[i]``."""

    has_intervals = False  # layouts use base intervals + the permutation (layout.py)

    def __init__(self, base: Mask, order: TokenOrder):
        if not isinstance(order, TokenOrder):
            raise TypeError(f"order must be a TokenOrder, got {type(order).__name__}")
        if order.num_tokens != base.length:
            raise ValueError(
                f"order {order.name!r} permutes {order.num_tokens} tokens, the mask has {base.length}"
            )
        self.base, self.order = base, order
        self.length = order.length
        self.num_heads = base.num_heads
        # traceable when the order has an arithmetic form (raster, token-major, padded tiled)
        self.traceable = base.traceable and order.raster_of is not None

    def _key(self):
        return (self.base, self.order)

    def children(self):
        return (self.base,)

    def head(self, index):
        self._check_head(index)
        return self if self.num_heads is None else PermutedMask(self.base.head(index), self.order)

    def token_validity(self):
        return self.order.valid

    def _allowed(self, q, k, head):
        xp = _xp(q, k)
        if xp is np:
            pq, pk = self.order.perm[q], self.order.perm[k]
        else:
            pq, pk = self.order.raster_of(q), self.order.raster_of(k)
        ok = self.base._allowed(xp.maximum(pq, 0), xp.maximum(pk, 0), head)
        return ok & (pq >= 0) & (pk >= 0)

    def __repr__(self):
        return f"{self.base!r}.permute({self.order.name!r})"


class BlockView(Mask):
    """The block of ``base`` on query rows [q_start, q_start + size) and keys [k_start, k_start +
    size) as a mask of ``size`` tokens of its own: what one (q shard, kv shard) pair of a ring
    attends. Traceable and in interval form where ``base`` is; a pair ``base`` refuses (padding
    included) stays refused, so its token validity is left to the caller (rows and keys come from
    different shards)."""

    def __init__(self, base: Mask, q_start: int, k_start: int, size: int):
        if not isinstance(base, Mask):
            raise TypeError(f"BlockView needs a Mask, got {type(base).__name__}")
        for name, value in (("q_start", q_start), ("k_start", k_start)):
            if not (0 <= value and value + size <= base.length):
                raise ValueError(f"{name}={value} + size={size} lies outside the mask's {base.length} tokens")
        if size < 1:
            raise ValueError(f"size={size} must be at least 1")
        self.base, self.q_start, self.k_start, self.length = base, int(q_start), int(k_start), int(size)
        self.num_heads = base.num_heads
        self.traceable = base.traceable
        self.has_intervals = base.has_intervals

    def _key(self):
        return (self.base, self.q_start, self.k_start, self.length)

    def children(self):
        return (self.base,)

    def head(self, index):
        self._check_head(index)
        if self.num_heads is None:
            return self
        return BlockView(self.base.head(index), self.q_start, self.k_start, self.length)

    def _allowed(self, q, k, head):
        return self.base._allowed(q + self.q_start, k + self.k_start, head)

    def _intervals(self, rows, head):
        starts, ends = self.base.key_intervals(rows + self.q_start, head)
        return (
            np.clip(starts - self.k_start, 0, self.length),
            np.clip(ends - self.k_start, 0, self.length),
        )

    def __repr__(self):
        return f"{self.base!r}.block_view(q_start={self.q_start}, k_start={self.k_start}, size={self.length})"


class StackedBlocks(Mask):
    """Blocks of one mask ``base`` stacked as heads, for one compiled kernel that runs any of them:
    block b is the ``BlockView`` of ``size`` tokens at (q_start, k_start) = ``starts[b][1:]`` of
    ``base``'s heads from ``starts[b][0]`` on, ``heads`` of them (1 for a head-uniform ``base``), and
    head b * heads + h of the stack is head h of block b. A kernel reads a block's
    ``offsets`` as data and evaluates ``base`` itself at the offset indices, so every block shares
    one body (a ring's (q shard, kv shard) blocks: ``stlib.ring``). ``mask_function`` with a traced
    head is refused: the head alone does not say which block's offsets apply.

    >>> import stlib
    >>> stack = StackedBlocks(stlib.masks.causal(8), [(0, 4, 0), (0, 0, 4)], 4, 1)
    >>> stack.num_heads, stack.head(0).to_dense().all(), stack.head(1).to_dense().any()
    (2, np.True_, np.False_)
    """

    stacked = True

    def __init__(self, base: Mask, starts, size: int, heads: int):
        self.base, self.size, self.heads = base, int(size), int(heads)
        self.starts = tuple(tuple(int(x) for x in s) for s in starts)
        if not self.starts:
            raise ValueError("StackedBlocks needs at least one block")
        if base.num_heads is None and self.heads != 1:
            raise ValueError(f"a head-uniform base stacks one head a block, not heads={heads}")
        for head, q_start, k_start in self.starts:
            BlockView(base, q_start, k_start, size)  # refuses a block outside the mask
            if base.num_heads is not None and not 0 <= head <= head + self.heads <= base.num_heads:
                raise ValueError(
                    f"heads [{head}, {head + self.heads}) lie outside the {base.num_heads} of the base"
                )
        self.length = self.size
        self.num_heads = len(self.starts) * self.heads
        self.traceable, self.has_intervals = base.traceable, base.has_intervals

    @property
    def num_blocks(self) -> int:
        return len(self.starts)

    @property
    def offsets(self) -> np.ndarray:
        """int32 [blocks, 3]: each block's (first head, q_start, k_start) in ``base``."""
        return np.asarray(self.starts, np.int32).reshape(-1, 3)

    def _key(self):
        return (self.base, self.starts, self.size, self.heads)

    def children(self):
        return (self.base,)

    def head(self, index):
        self._check_head(index)
        block, h = divmod(index, self.heads)
        first, q_start, k_start = self.starts[block]
        base = self.base if self.base.num_heads is None else self.base.head(first + h)
        return BlockView(base, q_start, k_start, self.size)

    def _allowed(self, q, k, head):
        if not isinstance(head, (int, np.integer)):
            raise TypeError("a stack of blocks is evaluated from its base at each block's offsets")
        return self.head(int(head))._allowed(q, k, 0)

    def _intervals(self, rows, head):
        return self.head(head).key_intervals(rows)

    def __repr__(self):
        return f"StackedBlocks({self.base!r}, {self.num_blocks} blocks of {self.size} x {self.heads} heads)"
