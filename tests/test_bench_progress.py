"""stlib.bench.progress: counts, time so far and time left of long loops (no speed asserted)."""

from __future__ import annotations

import io
import re

import pytest

from stlib.bench.progress import Progress, format_seconds, progress


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_progress_lines_carry_counts_and_an_estimate_of_the_time_left():
    clock, out = FakeClock(), io.StringIO()
    tracker = Progress(4, "timing", stream=out, clock=clock)
    assert tracker.remaining() is None  # nothing known before the first item
    clock.now += 3.0
    line = tracker.step("case a")
    assert line.startswith("[timing 1/4] case a")
    assert "3.0 s so far" in line and "about 9.0 s left" in line  # mean 3 s per item x 3 items left
    clock.now += 5.0
    assert "about 8.0 s left" in tracker.step()  # mean 4 s x 2 left
    tracker.step()
    clock.now += 92.0
    last = tracker.step("case d")
    assert last == "[timing 4/4] case d  (done in 1 min 40 s)"
    assert out.getvalue().splitlines()[-1] == last


def test_progress_wraps_a_loop_and_yields_every_item():
    out = io.StringIO()
    items = list(progress((x * x for x in range(3)), "squares", stream=out))
    assert items == [0, 1, 4]
    lines = out.getvalue().splitlines()
    assert [re.match(r"\[squares (\d)/3\]", line).group(1) for line in lines] == ["1", "2", "3"]
    assert "left" in lines[0] and "done in" in lines[-1]


def test_progress_prints_each_line_after_its_item():
    out = io.StringIO()
    for n, _ in enumerate(progress(["a", "b"], "order", stream=out)):
        assert len(out.getvalue().splitlines()) == n  # the line of an item comes once it is done


def test_format_seconds():
    assert format_seconds(0.42) == "0.4 s"
    assert format_seconds(42.4) == "42 s"
    assert format_seconds(185) == "3 min 05 s"
    assert format_seconds(3720) == "1 h 02 min"


def test_negative_total_is_refused():
    with pytest.raises(ValueError, match="total=-1"):
        Progress(-1, "nothing")
