"""The notebooks' prose says what their cells print: every decimal number, and every integer written
with thousands commas, in a markdown cell of a committed executed notebook (``notebooks/executed/``,
the last main job's run) appears in that notebook's outputs (an integer with or without its commas),
unless it is on the short lists below of numbers that come from elsewhere (a publication, a version,
an input the prose names, an answer's arithmetic), each with its reason.

Small integers written without commas are not checked (block sizes, counts and shapes the prose
names); decimals are what a cell measures, estimates or computes, and what goes stale when a cell
changes; an integer with commas (tokens, bytes, bundles) is one the prose took from a cell or from
an input, and the lists say which inputs.
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

#: an integer written with thousands commas: 1,024 or 1,397,248; not part of a decimal or a longer token
INTEGER = re.compile(r"(?<![\w.,])\d{1,3}(?:,\d{3})+(?![\w.,]*\d)")

#: Shapes every notebook may name without printing them: inputs, not results.
INPUTS = {
    "75,600": "the case study's tokens, 21 x 45 x 80",
    "3,600": "tokens of one latent frame at 720p, 45 x 80",
    "8,192": "a sequence length a cell chooses",
    "4,096": "a sequence length a cell chooses",
}

#: Numbers a notebook's prose may state without printing them, by notebook, with the reason.
CITED: dict[str, dict[str, str]] = {
    "00": {
        "78.70": "dense Splash on v6e, the case study's published time (REFERENCE.md)",
        "2.2": "Wan 2.2, a model version",
        "2.18": "answer 1's arithmetic, (111,600 / 75,600)^2",
        "111,600": "answer 1's arithmetic, 31 x 45 x 80",
        "4.7": "answer 3's arithmetic, 920 / 197 from the hardware table",
        "29,700": "answer 2's arithmetic, (12 d + 4 f + 2048) / 4",
        "5,120": "Wan 14B's width, 40 heads of 128 (the model's published configuration)",
    },
    "01": {
        "0.18": "answer 2's arithmetic, 46 of 256 tiles",
        "0.121": "question 2's band at L = 4,096, which the timing cell prints at the small size only",
        "0.12": "answer 2's density, question 2's 0.121",
    },
    "03": {
        "10,800": "an answer's arithmetic, three frames of 3,600 keys",
        "3,712": "an answer's arithmetic, 3,600 rounded up to a multiple of 128",
    },
    "04": {
        "3.1": "answer 1's arithmetic, the sum of the four counts",
        "2.6": "answer 1's sum of the first three",
    },
    "05": {
        "0.25": "the band's density, an input the notebook chooses",
        "1,515,520": "answer 1's arithmetic, 592 x 640 words of 4 bytes",
        "349,281": "answer 1's arithmetic, 591 x 591 words",
        "1,397,248": "answer 1's arithmetic, 349,281 words padded to a multiple of 128, 4 bytes each",
        "77,824": "answer 1's arithmetic, a [1, 148, 74] table padded to 152 x 128 words",
    },
    "06": {"10,240": "an answer's arithmetic, the band's width at density 0.25"},
    "07": {
        "56,700": "the arithmetic of the prose, 75,600 x 0.75",
        "147,600": "a long video's tokens (41 x 45 x 80) where the library's fold_all met a VMEM overflow",
    },
    "08": {
        "2.35": "notebook 07's schedule table: its FULL region per 1,000 score pairs, scores ahead",
        "4.67": "Splash's mask info on the sliding tile at 1,024 x 2,048 (splash.MASK_INFO_LIMIT's comment)",
        "89,762": "frame causal's forward for the v5e without the budget, compiled without a TPU (steps.FORWARD_CODE)",
        "57,791": "the same under the forward's budget, compiled without a TPU (docs/on-chip.md)",
        "98,315": "frame causal's fused backward for the v5e before its budget (steps.BACKWARD_CODE, docs/on-chip.md)",
        "60,191": "the same under the backward's budget, compiled without a TPU (docs/on-chip.md)",
    },
    "09": {
        "3,328": "the public design's q tile (REFERENCE.md)",
        "2,816": "the public design's kv tile (REFERENCE.md)",
        "1,728": "a grid the prose names, 3 x 24 x 24",
    },
    "10": {"8,128": "the arithmetic of the prose, 8,192 - 64"},
    "11": {
        "1,200": "TPU7x's ICI bandwidth in GB/s, the chip table's",
        "18,900": "the arithmetic of the prose, 75,600 tokens over 4 devices",
    },
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
        integers = [m for m in INTEGER.finditer(cell.source) if m.group() not in INPUTS]
        for match in sorted([*DECIMAL.finditer(cell.source), *integers], key=lambda m: m.start()):
            number = match.group()
            shown = number in printed or ("." not in number and number.replace(",", "") in printed)
            if not shown and number not in cited:
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
    notebook.cells[1] = nbformat.v4.new_markdown_cell("It ran 1,160 steps of 75,600 tokens, not 1,216.")
    notebook.cells[0].outputs[0]["text"] = "steps 1160\n"
    found = unprinted_numbers(notebook, {})
    assert len(found) == 1 and found[0].startswith("'1,216'")  # 1,160 printed bare; 75,600 an input


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
