"""Progress of long loops (benchmark runs, notebook timing loops): counts, time so far and an
estimate of the time left, printed as plain lines (they read the same in a terminal, a notebook
and the log of ``python -m stlib.reproduce``).

``Progress(total, what).step(message)`` after each item prints ``[what n/total] message (time so
far, about T left)``; ``progress(iterable, what)`` wraps a loop whose body prints nothing of its own
progress. The time left is the mean time per item so far times the items left: a guess that is
good when the items cost about the same (and says "about").
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")


def format_seconds(seconds: float) -> str:
    """'0.4 s', '42 s', '3 min 05 s', '1 h 02 min'."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


class Progress:
    """Counts the items of a loop of ``total`` items named ``what``; ``step`` after each item prints
    one line with the count, the time so far and the estimated time left to ``stream`` (stdout by
    default). Raises ValueError for a negative ``total``."""

    def __init__(self, total: int, what: str, stream=None, clock: Callable[[], float] = time.perf_counter):
        if total < 0:
            raise ValueError(f"{total=} must be >= 0")
        self.total, self.what, self.done = total, what, 0
        self._stream, self._clock = stream, clock
        self._start = clock()

    @property
    def elapsed(self) -> float:
        return self._clock() - self._start

    def remaining(self) -> float | None:
        """Seconds left: the mean time per item so far times the items left (None before the first)."""
        if self.done == 0:
            return None
        return self.elapsed / self.done * max(self.total - self.done, 0)

    def times(self) -> str:
        """'12 s so far, about 40 s left' (or 'done in 52 s' after the last item)."""
        if self.done >= self.total:
            return f"done in {format_seconds(self.elapsed)}"
        left = self.remaining()
        return f"{format_seconds(self.elapsed)} so far" + (
            "" if left is None else f", about {format_seconds(left)} left"
        )

    def status(self) -> str:
        """'[what n/total] 12 s so far, about 40 s left'."""
        return f"[{self.what} {self.done}/{self.total}] {self.times()}"

    def step(self, message: str = "", show: bool = True) -> str:
        """One more item done: print (unless not ``show``) and return its line, ``message`` after the count."""
        self.done += 1
        line = (
            f"[{self.what} {self.done}/{self.total}] {message}  ({self.times()})"
            if message
            else self.status()
        )
        if show:
            print(line, file=self._stream or sys.stdout, flush=True)
        return line


def progress(items: Iterable[T], what: str, total: int | None = None, stream=None) -> Iterator[T]:
    """Yield ``items``, printing a ``Progress`` line after each one is done (``total`` defaults to
    ``len(items)``; an iterable without a length is read into a list first)."""
    items = list(items) if total is None and not hasattr(items, "__len__") else items
    tracker = Progress(len(items) if total is None else total, what, stream=stream)
    for item in items:
        yield item
        tracker.step()
