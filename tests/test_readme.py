"""The README's library example runs as written (a newcomer copies it first), in seconds on a CPU."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

import stlib

README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_readme_example_runs_as_written_and_equals_the_reference(capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.DOTALL)
    assert len(blocks) == 1, "the README has one library example"
    scope: dict = {}
    exec(compile(blocks[0], "README.md", "exec"), scope)  # noqa: S102 - the README's own code
    printed = capsys.readouterr().out
    assert "BlockLayout(" in printed and "is what impl='auto' runs here" in printed
    q, k, v, mask, out = (scope[name] for name in ("q", "k", "v", "mask", "out"))
    ref = stlib.attention(q, k, v, mask, impl="reference")
    assert out.shape == q.shape and out.dtype == q.dtype
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(ref, np.float32), atol=2e-2)


def test_the_readme_support_table_is_the_generated_one():
    from stlib.support import support_table

    text = README.read_text()
    copy = text.split("<!-- support-table -->\n", 1)[1].split("\n<!-- /support-table -->", 1)[0]
    assert copy == support_table(), (
        "regenerate it: python -c 'import stlib.support as s; print(s.support_table())'"
    )
    assert support_table().splitlines()[2] in stlib.attention.__doc__.replace("    |", "|")


def test_the_readme_tpu_column_is_the_latest_tpu_run():
    """Each notebook's TPU time in the README is its latest run on the chip (``data/tpu_notebooks.jsonl``),
    and the sum the prose gives is theirs."""
    from stlib.bench import notebook_runs

    latest = notebook_runs.latest(notebook_runs.read(README.parent / "data" / notebook_runs.RECORDS), "fill")
    # a row: | NN | [name](notebooks/...): idea | CPU time | TPU time |
    rows = re.findall(r"^\| (\d\d) \| [^\n]* \| [^|\n]* \| ([^|\n]*) \|$", README.read_text(), re.MULTILINE)
    assert [number for number, _ in rows] == [f"{n:02d}" for n in range(12)]
    total = 0
    for number, cell in rows:
        record = next((r for name, r in latest.items() if name.startswith(number + "_")), None)
        if record is None:
            assert cell.strip() == "not yet run on the chip", (number, cell)
            continue
        assert record["status"] == "ok" and record["size"] == "full" and "TPU" in record["device_kind"], (
            record
        )
        assert cell.strip() == f"{round(record['seconds'])} s", (number, cell, record["seconds"])
        total += round(record["seconds"])
    assert f"{total} s together" in " ".join(README.read_text().split())
