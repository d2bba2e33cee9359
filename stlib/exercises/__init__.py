"""The notebooks' fill-in exercises: the reader's stub, the library's solution, and a check's verdict.

An exercise is a function the reader writes in a notebook cell, marked ``@exercises.fill_in(name)``,
and a check that the notebook runs on it with ``exercises.verify(name, check, function)``.

- **By default** (CI, the main job, a first read) ``fill_in`` hands back the library's solution
  (``stlib.exercises.solutions``), so the notebook runs end to end and every check prints PASSED. A
  check that fails then raises :class:`ExerciseFailed`, as any broken cell would. The check is also
  fed the exercise's known wrong answers (``solutions.WRONG``: plausible mistakes, such as a merge
  that forgets to rescale) and must answer NOT YET to each, so a check that passes a wrong answer
  fails the run.
- **With** ``STLIB_SOLUTIONS=hide`` (or ``SOLUTIONS = "hide"`` in a notebook's parameters cell; the
  environment wins), ``fill_in`` hands back the reader's own function. A stub raises
  ``NotImplementedError``; its check prints ``NOT YET`` and what is wrong, and the notebook goes on.

A check of a function that may be wrong (a known wrong answer, the reader's own) runs under a bound
on the memory it may take (``bounded_memory``): a loop over 10^12 rows that asks for an array of
10^12 elements raises MemoryError, a NOT YET, instead of filling the host (where memory is
overcommitted, such an array is granted and the machine dies as it fills it).

Nothing prints a solution unless asked: ``exercises.show(name)``.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path

ENV = "STLIB_SOLUTIONS"
#: "fill": the library's solutions run; "hide": the reader's functions run, failures print NOT YET
MODES = ("fill", "hide")

_mode = "fill"

#: Bytes a check of a function that may be wrong may allocate beyond what the process holds when it
#: starts (``bounded_memory``): ample for a check's arrays and a kernel's compile, far below a host's
#: memory.
MEMORY_HEADROOM = 4 * 2**30


class ExerciseFailed(AssertionError):
    """A check failed on the library's own solution: a bug, never the reader's."""


class NotYet(Exception):
    """Raised by a check: the function under test is not right yet (the message says why)."""


def set_mode(mode: str | None = None) -> str:
    """Choose the mode: ``$STLIB_SOLUTIONS`` wins over ``mode``; neither: "fill". Returns it."""
    global _mode
    chosen = os.environ.get(ENV) or mode or "fill"
    if chosen not in MODES:
        source = f"{ENV}={chosen!r}" if os.environ.get(ENV) else f"SOLUTIONS={chosen!r}"
        raise ValueError(f"{source} is not a mode: use 'fill' (the library's solutions) or 'hide' (yours)")
    _mode = chosen
    return _mode


def hidden() -> bool:
    """True where the reader's own functions run (mode "hide")."""
    return _mode == "hide"


def describe() -> str:
    """One line for a notebook's setup output: which functions the exercises run."""
    if hidden():
        return "exercises: yours (SOLUTIONS='hide'); a check that fails prints NOT YET; exercises.show(name) prints a solution"
    return "exercises: the library's solutions fill them in (SOLUTIONS='hide' or STLIB_SOLUTIONS=hide: write your own)"


def _solutions() -> dict[str, Callable]:
    from stlib.exercises import solutions

    return solutions.SOLUTIONS


def names() -> list[str]:
    """Every exercise the library has a solution for, as "<notebook>.<name>"."""
    return sorted(_solutions())


def solution(name: str) -> Callable:
    """The library's solution of exercise ``name``."""
    table = _solutions()
    if name not in table:
        raise KeyError(f"no exercise {name!r}; the exercises are {', '.join(sorted(table))}")
    return table[name]


def wrong_answers(name: str) -> list[tuple[str, Callable]]:
    """Exercise ``name``'s known wrong answers: (the mistake in a few words, the function) each.

    >>> mistake, combine = wrong_answers("04.combine")[0]
    >>> mistake
    'adds the two states without rescaling them to the common max'
    """
    from stlib.exercises import solutions

    solution(name)  # an unknown name: the same KeyError as solution()
    return list(solutions.WRONG[name])


def fill_in(name: str) -> Callable[[Callable], Callable]:
    """Decorator for the reader's function: returns it in mode "hide", the library's solution otherwise."""
    answer = solution(name)  # an unknown name fails at the cell, in every mode

    def choose(mine: Callable) -> Callable:
        if inspect.signature(mine).parameters.keys() != inspect.signature(answer).parameters.keys():
            raise TypeError(
                f"exercise {name!r}: keep the stub's parameters {list(inspect.signature(answer).parameters)}"
            )
        return mine if hidden() else answer

    return choose


def show(name: str) -> None:
    """Print the library's solution of exercise ``name``."""
    print(inspect.getsource(solution(name)))


#: The limits ``bounded_memory`` lowers, each with the /proc/self/status field of what it bounds:
#: the data segment (private writable memory: what a Linux kernel holds an allocation to) and the
#: address space (what a gVisor sandbox, such as a TPU VM's, holds an mmap to; it ignores the first).
_BOUNDED = (("RLIMIT_DATA", "VmData"), ("RLIMIT_AS", "VmSize"))


def _status_bytes(field: str) -> int | None:
    """A ``/proc/self/status`` size field (``VmData``, ``VmSize``) in bytes; None where it is not
    there (not Linux)."""
    try:
        found = re.search(rf"^{field}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.MULTILINE)
    except OSError:
        return None
    return int(found.group(1)) * 1024 if found else None


@contextlib.contextmanager
def bounded_memory(headroom: int | None = None) -> Iterator[int | None]:
    """While the block runs, the process may map at most ``headroom`` bytes (default
    ``MEMORY_HEADROOM``) beyond what it holds now: an allocation past that raises MemoryError
    (numpy) instead of being granted. Lowers the soft ``RLIMIT_DATA`` and ``RLIMIT_AS`` only (to what
    the process uses now plus ``headroom``) and puts them back afterwards, whatever happens. Yields
    ``headroom``, or None where no limit could be set (not Linux, no ``resource`` module); a tighter
    limit already set stays as it is.

    Every thread of the process shares the bound while it holds (JAX's own allocations included):
    keep the block to a check, not to a computation that needs the host's memory."""
    try:
        import resource
    except ImportError:  # not POSIX: no bound
        yield None
        return
    headroom = MEMORY_HEADROOM if headroom is None else headroom
    lowered = []
    try:
        for name, field in _BOUNDED:
            limit, used = getattr(resource, name, None), _status_bytes(field)
            if limit is None or used is None:
                continue
            soft, hard = resource.getrlimit(limit)
            bound = used + headroom if hard == resource.RLIM_INFINITY else min(used + headroom, hard)
            if soft != resource.RLIM_INFINITY and soft <= bound:
                lowered.append(None)  # bounded already
                continue
            try:
                resource.setrlimit(limit, (bound, hard))
            except (ValueError, OSError):  # refused: leave this one as it is
                continue
            lowered.append((limit, soft, hard))
        yield headroom if lowered else None
    finally:
        for saved in reversed(lowered):
            if saved is not None:
                resource.setrlimit(saved[0], saved[1:])


def _run(check: Callable, function: Callable, bounded: bool = True) -> tuple[bool, str]:
    """``check(function)``: (True, its PASSED detail) or (False, why not). A stub's
    NotImplementedError, or any error of the function under test, is a NOT YET too. ``bounded``:
    under ``bounded_memory`` (a function that may be wrong), where a MemoryError says so."""
    try:
        with bounded_memory() if bounded else contextlib.nullcontext():
            return True, check(function)
    except NotImplementedError:
        return False, "not written yet: fill in the function above"
    except NotYet as error:
        return False, str(error)
    except MemoryError as error:
        first = (str(error).splitlines() or [""])[0][:200]
        if not bounded:
            return False, f"it raises MemoryError: {first}"
        return False, (
            f"it asks for more memory than a check allows ({MEMORY_HEADROOM / 2**30:.0f} GiB more than before "
            f"it): an array or a loop over every row? (MemoryError: {first})"
        )
    except Exception as error:  # noqa: BLE001 - the reader's code may raise anything; say what
        first = (str(error).splitlines() or [""])[0][:200]
        return False, f"it raises {type(error).__name__}: {first}"


def verify(name: str, check: Callable, function: Callable) -> None:
    """Run ``check(function)``: it returns a line for PASSED, or raises :class:`NotYet`; the verdict
    is printed (and nothing returned, so a notebook cell ending in the call shows the verdict alone).

    In mode "fill" (``function`` is the library's solution) a NOT YET raises :class:`ExerciseFailed`,
    and so does a check that passes one of the exercise's known wrong answers
    (:func:`wrong_answers`); the NOT YET each wrong answer gets is printed, so the reader sees what
    the check catches. A wrong answer, or the reader's function in mode "hide", runs under
    :func:`bounded_memory`: one that asks for more gets a NOT YET."""
    passed, detail = _run(check, function, bounded=hidden())  # the library's own runs unbounded
    if hidden():
        if passed:
            print(f"PASSED  {name}: {detail}")
        else:
            print(f"NOT YET {name}: {detail} (exercises.show({name!r}) prints a solution)")
        return
    if not passed:
        raise ExerciseFailed(f"{name}: the library's solution fails its check: {detail}")
    caught = []
    for mistake, wrong in wrong_answers(name):
        accepted, why = _run(check, wrong)
        if accepted:
            raise ExerciseFailed(f"{name}: the check passes a wrong answer that {mistake}")
        caught.append(f"        NOT YET for a wrong answer that {mistake}: {why}")
    print(f"PASSED  {name} (library solution): {detail}")
    print("\n".join(caught))
