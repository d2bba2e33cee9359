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

Nothing prints a solution unless asked: ``exercises.show(name)``.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable

ENV = "STLIB_SOLUTIONS"
#: "fill": the library's solutions run; "hide": the reader's functions run, failures print NOT YET
MODES = ("fill", "hide")

_mode = "fill"


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


def _run(check: Callable, function: Callable) -> tuple[bool, str]:
    """``check(function)``: (True, its PASSED detail) or (False, why not). A stub's
    NotImplementedError, or any error of the function under test, is a NOT YET too."""
    try:
        return True, check(function)
    except NotImplementedError:
        return False, "not written yet: fill in the function above"
    except NotYet as error:
        return False, str(error)
    except Exception as error:  # noqa: BLE001 - the reader's code may raise anything; say what
        first = (str(error).splitlines() or [""])[0][:200]
        return False, f"it raises {type(error).__name__}: {first}"


def verify(name: str, check: Callable, function: Callable) -> None:
    """Run ``check(function)``: it returns a line for PASSED, or raises :class:`NotYet`; the verdict
    is printed (and nothing returned, so a notebook cell ending in the call shows the verdict alone).

    In mode "fill" (``function`` is the library's solution) a NOT YET raises :class:`ExerciseFailed`,
    and so does a check that passes one of the exercise's known wrong answers
    (:func:`wrong_answers`); the NOT YET each wrong answer gets is printed, so the reader sees what
    the check catches."""
    passed, detail = _run(check, function)
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
