"""What each registered implementation supports, generated from the registry (never typed): the
README's support table and the tail of ``help(stlib.attention)``."""

from __future__ import annotations

from stlib.registry import AUTO_PICKS, IMPLEMENTATIONS, auto_rank

#: Columns of the table, each read from the implementation's registry entry.
COLUMNS = (
    "impl",
    "runs as",
    "TPU chips it compiles for",
    "grouped kv heads",
    "v head dim of its own",
    "gradient",
    "impl='auto' picks it",
)


def _row(entry) -> tuple[str, ...]:
    caps = entry.capabilities
    if entry.backward is not None:
        gradient = "its own backward kernels (first order)"
    elif entry.is_pallas:
        gradient = "its own backward kernels (its custom_vjp)"
    else:
        gradient = "JAX autodiff (any order)"
    ranks = {situation: auto_rank(entry, situation) for situation in AUTO_PICKS}
    auto = "; ".join(f"{situation} (rank {rank})" for situation, rank in ranks.items() if rank is not None)
    return (
        f"`{entry.name}`",
        "Pallas (interpret mode off a TPU)" if entry.is_pallas else "plain JAX (XLA)",
        ", ".join(entry.chips) or "any backend",
        "native" if caps.shared_kv_heads else "kv heads repeated",
        "yes" if caps.head_dim_v else "no",
        gradient,
        auto or "no",
    )


def support_table() -> str:
    """A markdown table, one row per registered implementation (sorted by name): how it runs, the
    chips it compiles for, grouped kv heads (native, or repeated for their q heads by
    ``stlib.attention``), a v head dim other than q's (only through the static estimate's compile),
    its gradient and where ``impl="auto"`` picks it. Every implementation takes leading batch axes,
    f32 and bf16, ragged L and every stlib mask (the contract test runs them all).

    >>> print(support_table().splitlines()[0])
    | impl | runs as | TPU chips it compiles for | grouped kv heads | v head dim of its own | gradient | impl='auto' picks it |
    """
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for name in sorted(IMPLEMENTATIONS):
        lines.append("| " + " | ".join(_row(IMPLEMENTATIONS[name])) + " |")
    return "\n".join(lines)


__all__ = ["support_table"]
