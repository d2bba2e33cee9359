"""The notebooks' prose says what their cells print: every decimal number in a markdown cell of a
committed executed notebook (``notebooks/executed/``, the last main job's run) appears in that
notebook's outputs, unless it is on the short list below of numbers that come from elsewhere (a
publication, a version, an input the prose names), each with its reason.

Integers are not checked (token counts, block sizes and shapes are inputs the prose names);
decimals are what a cell measures, estimates or computes, and what goes stale when a cell changes.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

from stlib import paths

EXECUTED = paths.REPO / "notebooks" / "executed"
#: a decimal number: digits (with thousands commas), a point, digits; not part of a longer token
DECIMAL = re.compile(r"(?<![\w.])\d[\d,]*\.\d+(?![\w.]*\d)")

#: Numbers a notebook's prose may state without printing them, by notebook, with the reason.
CITED: dict[str, dict[str, str]] = {
    "00": {
        "78.70": "dense Splash on v6e, the case study's published time (REFERENCE.md)",
        "2.2": "Wan 2.2, a model version",
        "2.18": "answer 1's arithmetic, (111,600 / 75,600)^2",
        "4.7": "answer 3's arithmetic, 920 / 197 from the hardware table",
    },
    "01": {"0.18": "answer 2's arithmetic, 46 of 256 tiles"},
    "04": {
        "3.1": "answer 1's arithmetic, the sum of the four counts",
        "2.6": "answer 1's sum of the first three",
    },
    "05": {"0.25": "the band's density, an input the notebook chooses"},
    "11": {"0.02": "a round bound above every crossing density the table prints"},
}


def executed_notebooks() -> list[Path]:
    return sorted(EXECUTED.glob("[0-9][0-9]_*.ipynb"))


def printed_text(notebook) -> str:
    """Everything the notebook's code cells printed or displayed, as one string."""
    parts = []
    for cell in notebook.cells:
        for output in cell.get("outputs", []) if cell.cell_type == "code" else []:
            parts.append(output.get("text", ""))
            data = output.get("data", {})
            parts += [str(data.get(kind, "")) for kind in ("text/plain", "text/markdown")]
    return "\n".join(parts)


def unprinted_numbers(notebook, cited: dict[str, str]) -> list[str]:
    """Each decimal number of the markdown cells that no output shows and ``cited`` does not list,
    with its context."""
    printed = printed_text(notebook)
    found = []
    for cell in notebook.cells:
        if cell.cell_type != "markdown":
            continue
        for match in DECIMAL.finditer(cell.source):
            number = match.group()
            if number not in printed and number not in cited:
                context = cell.source[max(0, match.start() - 60) : match.end() + 20].replace("\n", " ")
                found.append(f"{number!r} in '...{context}...'")
    return found


def test_a_stale_number_is_found():
    """The rule on a notebook made up here: a number the outputs show passes, one they do not fails."""
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_code_cell(outputs=[nbformat.v4.new_output("stream", text="dense 41.9 ms\n")]),
        nbformat.v4.new_markdown_cell("Dense takes 41.9 ms here, half the 78.7 ms of Splash; Wan 2.1 x 3."),
    ]
    found = unprinted_numbers(notebook, {"2.1": "a version"})
    assert len(found) == 1 and found[0].startswith("'78.7'")


@pytest.mark.parametrize("path", executed_notebooks(), ids=lambda p: p.name[:2])
def test_prose_numbers_are_printed_by_the_notebook(path):
    notebook = nbformat.read(path, as_version=4)
    found = unprinted_numbers(notebook, CITED.get(path.name[:2], {}))
    assert not found, (
        f"{path.name}: numbers in the prose that no cell of the executed notebook prints (print them, or "
        "list them in CITED with where they come from):\n" + "\n".join(found)
    )


def test_every_notebook_has_its_executed_copy():
    sources = sorted(p.stem for p in (paths.REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    assert [p.stem for p in executed_notebooks()] == sources
