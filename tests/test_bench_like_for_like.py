"""stlib.bench.like_for_like: it refuses to time off a TPU, and the committed records measure every
row once, Splash at its default and its best blocks."""

from __future__ import annotations

import pytest

from stlib.bench import like_for_like


def test_timing_off_a_tpu_is_refused_in_one_sentence():
    with pytest.raises(RuntimeError, match="on a TPU of the chip table; this process sees 'cpu'"):
        like_for_like.run()


def test_the_records_measure_each_row_once_at_its_blocks():
    records = like_for_like.read()
    assert [r["label"] for r in records] == [label for label, *_ in like_for_like.ROWS]
    assert all(r["backend"] == "tpu" and not r["interpret"] and r["mask"] == "full" for r in records)
    best = {"block_q": like_for_like.SPLASH_BEST[0], "block_kv": like_for_like.SPLASH_BEST[1]}
    blocks = [{name: r["blocks"][name] for name in best} for r in records]  # (a record may add its chunk)
    assert blocks[1] == best and blocks[0] != best  # Splash at its best, then at its default
    table = like_for_like.format_table(records).splitlines()
    assert table[0].startswith("measured on v5e") and len(table) == 2 + len(records)
    assert table[3].endswith("x")  # each row after the first: its speed-up over the row before
