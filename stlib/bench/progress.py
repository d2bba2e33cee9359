"""Progress of long loops (benchmark runs, notebook loops, the main job): a tqdm bar with tqdm's
estimate of the time left, and one line per item for its result.

``Progress(total, what)``: ``step(message)`` after each item advances the bar and writes
``[what n/total] message`` above it (``tqdm.write``, so the bar is not broken); ``write(line)`` writes
any other line. ``progress(items, what)`` wraps a loop whose items need no line of their own. The bar
comes from ``tqdm.auto``, which picks it for where the code runs:

- Jupyter / Colab (a kernel with ipywidgets): a widget bar; its text form is brought up to date when
  the bar closes, so an executed notebook (nbclient) shows the final state, not 0 %;
- a terminal: tqdm's text bar on stderr, redrawn in place;
- anything else (a log file, a pipe, CI, pytest's capture): no bar redrawn with carriage returns, but
  every item's line ends with tqdm's time so far and time left, and the bar's final state is written
  as one last line when it closes (after the last item, or on ``close``).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import Self, TypeVar

import tqdm.auto
import tqdm.std

T = TypeVar("T")


def in_notebook() -> bool:
    """True where ``tqdm.auto`` draws widget bars (a Jupyter kernel with ipywidgets installed)."""
    module = sys.modules.get("tqdm.notebook")  # imported by tqdm.auto in a Jupyter kernel only
    return module is not None and module.IProgress is not None and issubclass(tqdm.auto.tqdm, module.tqdm)


class _LogBar(tqdm.std.tqdm):
    """A bar for a stream that is not a terminal: it draws nothing while it runs (a log would fill
    with carriage returns) and writes its final state as one line when it closes."""

    def display(self, msg=None, pos=None):
        return False

    def clear(self, nolock=False):
        pass

    def close(self):
        if not self.disable:  # the first close only
            self._ema_dt = lambda: None  # the overall rate, as tqdm's own final display
            self.leave = False  # written here: tqdm's close writes nothing more
            try:
                self.fp.write(f"{self}\n")
                getattr(self.fp, "flush", lambda: None)()
            except ValueError:  # a stream closed already (a bar collected at exit)
                pass
        super().close()


class Progress:
    """A progress bar over ``total`` items named ``what`` (its label) with one line per item.

    ``stream``: where the lines and, off a terminal, the bar go (default: lines on stdout, the bar
    on stderr or in a widget). ``step(message)`` after each item writes ``[what n/total] message``
    (nothing for an empty message where a bar is drawn) and closes the bar after the last item; use
    it as a context manager, or call ``close``, when a loop may stop early. Raises ValueError for a
    negative ``total``."""

    def __init__(self, total: int, what: str, stream=None):
        if total < 0:
            raise ValueError(f"{total=} must be >= 0")
        self.total, self.what, self.done = total, what, 0
        self._stream, self._handle = stream, None
        fp = stream or sys.stderr
        if stream is None and in_notebook():
            from IPython.display import display

            self.bar = tqdm.auto.tqdm(total=total, desc=what, leave=True, display=False)
            self._handle = display(self.bar.container, display_id=True)  # updated on close
            self.live = True
        elif getattr(fp, "isatty", lambda: False)():
            self.bar = tqdm.std.tqdm(total=total, desc=what, file=fp, leave=True, dynamic_ncols=True)
            self.live = True
        else:
            self.bar = _LogBar(total=total, desc=what, file=stream or sys.stdout, leave=True, ascii=True)
            self.live = False

    @property
    def lines(self):
        return self._stream or sys.stdout

    def times(self) -> str:
        """tqdm's '00:12 so far, about 00:40 left' ('done in 00:52' after the last item)."""
        meter = self.bar.format_dict
        if self.done >= self.total:
            return "done in " + tqdm.std.tqdm.format_interval(meter["elapsed"])
        return self.bar.format_meter(**{**meter, "bar_format": "{elapsed} so far, about {remaining} left"})

    def write(self, line: str) -> None:
        """Write ``line`` (and flush) without breaking the bar."""
        self.bar.write(line, file=self.lines)
        getattr(self.lines, "flush", lambda: None)()

    def step(self, message: str = "") -> str:
        """One more item done: advance the bar, write its line and return it (see the class)."""
        self.done += 1
        self.bar.update(1)
        line = " ".join(
            part
            for part in (
                f"[{self.what} {self.done}/{self.total}]",
                message,
                "" if self.live else f"({self.times()})",  # no bar to read the times from: the line has them
            )
            if part
        )
        if message or not self.live:
            self.write(line)
        if self.done >= self.total:
            self.close()
        return line

    def close(self) -> None:
        """Close the bar, leaving its final state (a widget's text form brought up to date)."""
        if self.bar.disable:  # closed already
            return
        self.bar.close()
        if self._handle is not None:
            self._handle.update(self.bar.container)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def progress(items: Iterable[T], what: str, total: int | None = None, stream=None) -> Iterator[T]:
    """Yield ``items`` with a ``Progress`` bar advanced after each one is done (``total`` defaults
    to ``len(items)``; an iterable without a length is read into a list first). Off a terminal
    each item gets a line with the count and the times."""
    items = list(items) if total is None and not hasattr(items, "__len__") else items
    with Progress(len(items) if total is None else total, what, stream=stream) as tracker:
        for item in items:
            yield item
            tracker.step()


__all__ = ["Progress", "in_notebook", "progress"]
