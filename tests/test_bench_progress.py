"""stlib.bench.progress: tqdm bars with one line per item; off a terminal (pytest's capture, a log file)
every item's line and the bar's final state are written (no speed asserted)."""

from __future__ import annotations

import io
import re

import pytest

from stlib.bench.progress import Progress, in_notebook, progress

BAR = re.compile(r"^(?P<what>[\w ]+): +100%\|#+\| (?P<n>\d+)/(?P<total>\d+) \[")


def test_each_item_writes_its_line_with_the_count_label_and_times(capsys):
    tracker = Progress(3, "check")
    lines = [tracker.step(f"PASSED case {name}") for name in "abc"]
    out = capsys.readouterr().out.splitlines()
    assert out[:3] == lines  # written (to stdout) as returned, in order
    for n, line in enumerate(lines, 1):
        assert line.startswith(f"[check {n}/3] PASSED case {'abc'[n - 1]} (")
    assert " so far, about " in lines[0] and lines[0].endswith(" left)")  # tqdm's estimate
    assert re.search(r"\(done in \d\d:\d\d\)$", lines[-1])
    bar = BAR.match(out[3])  # the bar's final state, after the last item's line
    assert bar and bar["what"] == "check" and (bar["n"], bar["total"]) == ("3", "3"), out
    assert len(out) == 4 and "\r" not in capsys.readouterr().out  # no redrawing in a log


def test_progress_wraps_a_loop_and_yields_every_item():
    out = io.StringIO()
    items = list(progress((x * x for x in range(3)), "squares", stream=out))
    assert items == [0, 1, 4]
    lines = out.getvalue().splitlines()
    assert [re.match(r"\[squares (\d)/3\] \(", line).group(1) for line in lines[:3]] == ["1", "2", "3"]
    bar = BAR.match(lines[3])
    assert bar and bar["what"] == "squares" and bar["total"] == "3" and len(lines) == 4


def test_each_line_comes_after_its_item():
    out = io.StringIO()
    for n, _ in enumerate(progress(["a", "b"], "order", stream=out)):
        assert len(out.getvalue().splitlines()) == n  # the line of an item comes once it is done


def test_a_loop_that_stops_early_still_shows_where_it_stopped():
    out = io.StringIO()
    with Progress(5, "cases", stream=out) as tracker:
        tracker.step("first")
        tracker.write("a line of the loop's own")
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("[cases 1/5] first (") and lines[1] == "a line of the loop's own"
    assert re.match(r"cases: +20%\|#+ *\| 1/5 \[", lines[2]) and len(lines) == 3
    tracker.close()  # closing twice writes nothing more
    assert len(out.getvalue().splitlines()) == 3


def test_a_terminal_gets_a_live_bar_and_the_lines_above_it():
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    out = Terminal()
    tracker = Progress(2, "timing", stream=out)
    assert tracker.live
    assert tracker.step("case a") == "[timing 1/2] case a"  # the bar carries the times
    tracker.step()  # no line for an item without a message
    text = out.getvalue()
    assert text.count("[timing 1/2] case a\n") == 1 and "[timing 2/2]" not in text
    assert "\r" in text and re.search(r"timing: 100%\|.*\| 2/2 \[", text)


def test_not_a_notebook_here():
    assert not in_notebook()  # tqdm.auto picks its text bar outside a Jupyter kernel


def test_negative_total_is_refused():
    with pytest.raises(ValueError, match="total=-1"):
        Progress(-1, "nothing")
