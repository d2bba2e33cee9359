"""The front door: a short README that reaches every docs/ page, links that resolve, and one place
for each generated table."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

import stlib

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]

MAX_LINES, MAX_WORDS = 170, 2000

_FENCE = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)
#: A commit hash as git abbreviates it: 7 to 40 hex digits, with a digit among them (so that words
#: such as "defaced" are not hashes).
_HASH = re.compile(r"\b(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")


def prose(text: str) -> str:
    """``text`` without its fenced code blocks and inline code spans."""
    return _CODE_SPAN.sub("", _FENCE.sub("", text))


def links(page: Path) -> list[str]:
    """The targets of the Markdown links and images of ``page``, code left out."""
    return _LINK.findall(prose(page.read_text()))


def relative(target: str) -> bool:
    return not re.match(r"^[a-z][a-z+.-]*:", target)  # http:, https:, mailto:


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors of ``page``'s headings, repeated ones numbered as GitHub numbers them."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for heading in _HEADING.findall(_FENCE.sub("", page.read_text())):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def commit_hashes(text: str) -> list[str]:
    return _HASH.findall(text)


def test_the_helpers_see_what_they_should():
    """The checks below rest on these helpers: they must find a hash, a link and an anchor."""
    assert commit_hashes("measured at 32f5cd1 (2026-12-07)") == ["32f5cd1"]
    assert commit_hashes("git rev a6edecc, then 4562c0f+edits") == ["a6edecc", "4562c0f"]
    assert commit_hashes("75,600 tokens, 201.6 ms, 1386 s, defaced, v5e, 2^16, 0.0.42.1") == []
    assert _LINK.findall(prose("[a](docs/x.md) `[b](no.md)` ![c](figures/y.png)")) == [
        "docs/x.md",
        "figures/y.png",
    ]
    assert slug("The notebooks' first cell") == "the-notebooks-first-cell"
    assert slug("Add a `kernel`") == "add-a-kernel"


def test_there_are_docs_pages():
    assert len(DOCS) >= 5, DOCS


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_every_docs_page_is_linked_from_the_readme(page):
    targets = {Path(os.path.normpath(ROOT / t.split("#")[0])) for t in links(README) if relative(t)}
    assert page in targets, f"README.md does not link {page.relative_to(ROOT)}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves(page):
    broken = []
    for target in filter(relative, links(page)):
        path, _, anchor = target.partition("#")
        file = Path(os.path.normpath(page.parent / path)) if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif not file.is_relative_to(ROOT):
            broken.append(f"{target}: outside the repository")
        elif anchor and anchor not in anchors(file):
            broken.append(f"{target}: no heading #{anchor} in {file.name}")
    assert broken == [], broken


def test_the_readme_is_short():
    text = README.read_text()
    assert len(text.splitlines()) < MAX_LINES, len(text.splitlines())
    assert len(text.split()) < MAX_WORDS, len(text.split())


def test_the_readme_names_no_commit():
    """Revisions belong to records and the measurement log, not to the front door."""
    assert commit_hashes(README.read_text()) == []


def test_the_support_table_is_in_one_place():
    from stlib.support import support_table

    header = support_table().splitlines()[0]
    assert README.read_text().count(header) == 1
    assert [page.name for page in DOCS if header in page.read_text()] == []


def test_help_stlib_lists_every_public_entry_point():
    missing = [name for name in stlib.__all__ if not re.search(rf"``{re.escape(name)}\b", stlib.__doc__)]
    assert missing == [], missing


def test_every_library_path_the_pages_name_exists():
    """The README and docs name modules and folders (`stlib/...`): a move or a rename updates them."""
    named = {path for page in PAGES for path in re.findall(r"`(stlib/[\w/.-]+?)/?`", page.read_text())}
    assert len(named) > 20
    templates = {path for path in named if "NAME" in path}  # "Add a kernel": stlib/kernels/NAME.py
    missing = sorted(path for path in named - templates if not (ROOT / path).exists())
    assert missing == [], missing
