"""Argument validation shared by every public function (clear ValueError / TypeError messages)."""

from __future__ import annotations

import numbers


def check_positive_int(name: str, value, *, allow_zero: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name}={value!r} must be an int")
    low = 0 if allow_zero else 1
    if value < low:
        raise ValueError(f"{name}={value} must be {'>= 0' if allow_zero else 'positive'}")
    return int(value)


def check_positive_triple(name: str, value, *, allow_zero: bool = False) -> tuple[int, int, int]:
    """An int (used on all three axes) or a 3-sequence of ints, each positive."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        value = (value, value, value)
    try:
        items = tuple(value)
    except TypeError:
        raise TypeError(f"{name}={value!r} must be an int or a (T, Y, X) triple of ints") from None
    if len(items) != 3:
        raise ValueError(f"{name}={value!r} must have 3 entries (T, Y, X), got {len(items)}")
    for axis, item in zip("TYX", items):
        check_positive_int(f"{name}[{axis}]", item, allow_zero=allow_zero)
    return tuple(int(i) for i in items)


def check_bool_triple(name: str, value) -> tuple[bool, bool, bool]:
    if isinstance(value, bool):
        return (value, value, value)
    items = tuple(value)
    if len(items) != 3 or not all(isinstance(i, bool) for i in items):
        raise TypeError(f"{name}={value!r} must be a bool or a (T, Y, X) triple of bools")
    return items


def check_fraction(name: str, value, *, open_low: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}={value!r} must be a number")
    if not (0 < value <= 1 if open_low else 0 <= value <= 1):
        raise ValueError(f"{name}={value} must be in {'(0, 1]' if open_low else '[0, 1]'}")
    return float(value)
