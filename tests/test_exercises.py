"""The notebooks' fill-in exercises (stlib.exercises): the library's solutions by default, the
reader's stubs with STLIB_SOLUTIONS=hide, NOT YET instead of a stop, and a solution only on request."""

from __future__ import annotations

import inspect
import os
import re
import resource
import sys

import jax.numpy as jnp
import nbformat
import numpy as np
import pytest

from stlib import exercises, notebook
from stlib.reproduce import NOTEBOOKS, execute, notebook_paths

FILL_IN = re.compile(r'^@exercises\.fill_in\("([^"]+)"\)', re.MULTILINE)
#: the notebooks that write kernels, each with at least two fill-ins
KERNEL_NOTEBOOKS = ("04", "05", "06", "07", "09", "10", "11")  # and the routing notebook


def fill_ins() -> dict[str, list[str]]:
    return {p.name[:2]: FILL_IN.findall(p.read_text()) for p in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.py"))}


@pytest.fixture
def mode():
    """Set the mode for one test and put the default back (the environment variable is unset here)."""
    saved = os.environ.pop(exercises.ENV, None)
    yield exercises.set_mode
    exercises.set_mode("fill")
    if saved is not None:
        os.environ[exercises.ENV] = saved


def test_every_fill_in_has_one_solution_and_every_solution_a_fill_in():
    found = fill_ins()
    named = [name for names in found.values() for name in names]
    assert sorted(named) == exercises.names(), (
        "an exercise without a solution, or a solution no notebook uses"
    )
    for number, names in found.items():
        assert all(name.startswith(f"{number}.") for name in names), (number, names)
    for number in KERNEL_NOTEBOOKS:
        assert len(found[number]) >= 2, f"notebook {number} has {len(found[number])} fill-in(s)"


def test_each_notebook_with_fill_ins_takes_the_solutions_switch():
    for path in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.py")):
        text = path.read_text()
        if FILL_IN.search(text):
            assert 'SOLUTIONS = "fill"' in text and "notebook.setup(SIZE, solutions=SOLUTIONS)" in text, (
                path.name
            )
            assert "<summary>Solution" not in text, f"{path.name} shows a solution nobody asked for"


def stub(m1, l1, acc1, m2, l2, acc2):
    raise NotImplementedError


def test_fill_in_hands_back_the_solution_or_the_readers_function(mode):
    mode("fill")
    assert exercises.fill_in("04.combine")(stub) is exercises.solution("04.combine")
    mode("hide")
    assert exercises.fill_in("04.combine")(stub) is stub
    with pytest.raises(TypeError, match=r"keep the stub's parameters \['m1', 'l1'"):
        exercises.fill_in("04.combine")(lambda m, l: None)
    with pytest.raises(KeyError, match="no exercise '04.nothing'"):
        exercises.fill_in("04.nothing")


def check_combine(combine):
    """A small check of the kind the notebooks run: two key halves of one row, combined."""
    s = jnp.array([[1.0, -2.0, 3.0, 0.5]])  # the max in the second half
    v = jnp.arange(8.0).reshape(4, 2)
    states = []
    for part in (slice(0, 2), slice(2, 4)):
        m = s[:, part].max(axis=1, keepdims=True)
        p = jnp.exp(s[:, part] - m)
        states.append((m, p.sum(axis=1, keepdims=True), p @ v[part]))
    m, l, acc = combine(*states[0], *states[1])
    want = jnp.exp(s - s.max()) / jnp.exp(s - s.max()).sum() @ v
    if not (jnp.allclose(acc / l, want, atol=1e-6) and jnp.allclose(m, s.max())):
        raise exercises.NotYet("wrong")
    return "combined"


def test_every_exercise_has_a_wrong_answer_with_the_stubs_parameters():
    from stlib.exercises.solutions import WRONG

    assert sorted(WRONG) == exercises.names()
    for name in exercises.names():
        assert exercises.wrong_answers(name), name
        for mistake, wrong in exercises.wrong_answers(name):
            assert mistake and wrong is not exercises.solution(name)
            assert (
                inspect.signature(wrong).parameters.keys()
                == inspect.signature(exercises.solution(name)).parameters.keys()
            )


def test_verify_passes_prints_not_yet_or_raises(mode, capsys):
    mode("fill")
    exercises.verify("04.combine", check_combine, exercises.solution("04.combine"))
    assert capsys.readouterr().out == (
        "PASSED  04.combine (library solution): combined\n"
        "        NOT YET for a wrong answer that adds the two states without rescaling them to the "
        "common max: wrong\n"
        "        NOT YET for a wrong answer that keeps the first state's max as the common one: wrong\n"
    )
    with pytest.raises(
        exercises.ExerciseFailed,
        match="04.combine: the check passes a wrong answer that adds the two states without rescaling",
    ):
        exercises.verify("04.combine", lambda combine: "anything goes", exercises.solution("04.combine"))
    wrong = lambda m1, l1, acc1, m2, l2, acc2: (m1, l1 + l2, acc1 + acc2)  # forgets the rescale
    with pytest.raises(
        exercises.ExerciseFailed, match="04.combine: the library's solution fails its check: wrong"
    ):
        exercises.verify("04.combine", check_combine, wrong)
    mode("hide")
    exercises.verify("04.combine", check_combine, exercises.solution("04.combine"))
    assert capsys.readouterr().out == "PASSED  04.combine: combined\n"  # the reader's own, passing
    exercises.verify("04.combine", check_combine, stub)
    assert capsys.readouterr().out.startswith("NOT YET 04.combine: not written yet")
    exercises.verify("04.combine", check_combine, wrong)
    assert (
        "NOT YET 04.combine: wrong (exercises.show('04.combine') prints a solution)"
        in capsys.readouterr().out
    )
    exercises.verify("04.combine", check_combine, lambda *a: 1 / 0)
    assert "it raises ZeroDivisionError: division by zero" in capsys.readouterr().out


def rows_at_once(length, width):
    """A band count row by row: right, but it asks for [L] arrays (notebook 09's wrong answer)."""
    rows = np.arange(length, dtype=np.int64)
    return int(np.sum(np.minimum(rows + width, length - 1) - np.maximum(rows - width, 0) + 1))


def check_huge(band_pairs):
    """A check like notebook 09's: one row more at L = 10^12 adds 2w + 1 pairs."""
    if band_pairs(10**12, 10**6) - band_pairs(10**12 - 1, 10**6) != 2 * 10**6 + 1:
        raise exercises.NotYet("one row more does not add 2w + 1 pairs")
    return "closed form"


def limits() -> tuple:
    """(soft, hard) of the two limits ``exercises.bounded_memory`` lowers."""
    return resource.getrlimit(resource.RLIMIT_DATA), resource.getrlimit(resource.RLIMIT_AS)


def resident_bytes() -> int:
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the bound reads /proc/self/status (Linux)")
def test_a_wrong_answer_that_allocates_10_to_the_12_is_not_yet_and_the_process_does_not_grow(
    mode, monkeypatch, capsys
):
    """Where memory is overcommitted, np.arange(10**12) is granted and filled until the host dies:
    a wrong answer (or the reader's function) runs under a bound on what the process may map, so
    the allocation raises MemoryError, a NOT YET; the bound is put back afterwards."""
    from stlib.exercises import solutions

    before, seen = limits(), []

    def watched(length, width):  # rows_at_once, noting the limit it runs under
        seen.append(limits())
        return rows_at_once(length, width)

    resident = resident_bytes()
    monkeypatch.setitem(solutions.WRONG, "09.band_pairs", [("counts row by row", watched)])
    mode("fill")
    exercises.verify("09.band_pairs", check_huge, exercises.solution("09.band_pairs"))
    out = capsys.readouterr().out
    assert "PASSED  09.band_pairs (library solution): closed form" in out
    assert (
        "NOT YET for a wrong answer that counts row by row: it asks for more memory than a check allows"
        in out
    )
    mode("hide")
    exercises.verify("09.band_pairs", check_huge, watched)
    assert "NOT YET 09.band_pairs: it asks for more memory" in capsys.readouterr().out
    bounded = [resource.RLIM_INFINITY not in (data[0], space[0]) for data, space in seen]
    assert len(seen) == 2 and all(bounded), seen  # both ran under the bound
    assert resident_bytes() - resident < 2**28, "the process grew"
    assert limits() == before, "the bound was not put back"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the bound reads /proc/self/status (Linux)")
def test_the_bound_refuses_what_the_host_would_grant_and_is_lifted_after():
    """An allocation past the headroom (never touched, so harmless even if granted) fails inside the
    bound and succeeds after it; both limits are lowered inside and put back after, also when the
    block raises."""
    before = limits()
    with exercises.bounded_memory(2**28) as headroom:
        assert headroom == 2**28
        assert all(soft != resource.RLIM_INFINITY for soft, _ in limits()), limits()
        with pytest.raises(MemoryError):
            np.empty(2**30, np.uint8)
        small = np.ones(2**20, np.uint8)  # what a check needs still fits
    assert small.sum() == 2**20 and limits() == before
    assert np.empty(2**30, np.uint8).nbytes == 2**30  # untouched: address space only
    with pytest.raises(ZeroDivisionError), exercises.bounded_memory(2**28):
        raise ZeroDivisionError
    assert limits() == before


def test_the_environment_wins_and_a_bad_mode_is_one_sentence(mode, monkeypatch, capsys):
    monkeypatch.setenv(exercises.ENV, "hide")
    assert mode("fill") == "hide" and exercises.hidden()
    monkeypatch.setenv(exercises.ENV, "later")
    with pytest.raises(ValueError, match=r"STLIB_SOLUTIONS='later' is not a mode: use 'fill'"):
        mode("fill")
    monkeypatch.delenv(exercises.ENV)
    with pytest.raises(notebook.SetupError, match=r"SOLUTIONS='shown' is not a mode"):
        notebook.setup("small", solutions="shown")
    notebook.setup("small", solutions="hide")
    assert "exercises: yours" in capsys.readouterr().out


def test_show_prints_the_solution_only_when_asked(capsys):
    exercises.show("05.kv_map")
    assert "return (steps_ref[i * nk + j] >> 2, 0)" in capsys.readouterr().out


def test_a_kernel_notebook_with_its_stubs_reaches_its_end(tmp_path, monkeypatch):
    """Notebook 09 (the quickest notebook with fill-ins) run with STLIB_SOLUTIONS=hide: every fill-in
    is a stub, each check prints NOT YET, and every cell after them still runs. (Every kernel notebook
    does the same; this test runs one, to keep the suite's time.)"""
    monkeypatch.setenv(exercises.ENV, "hide")
    monkeypatch.setenv("STLIB_SIZE", "small")
    (path,) = notebook_paths(["09"])
    execute(path, out_dir=tmp_path)
    cells = [c for c in nbformat.read(tmp_path / path.name, as_version=4).cells if c.cell_type == "code"]
    assert all(c.execution_count for c in cells if c.source.strip()), "a cell did not run"
    text = "".join(o.get("text", "") for c in cells for o in c.outputs)
    not_yet = re.findall(r"^NOT YET (\S+): not written yet", text, re.MULTILINE)
    assert sorted(not_yet) == sorted(fill_ins()["09"]), text[-3000:]
    assert "exercises: yours" in text and "PASSED  09." not in text
