"""stlib.bench.cli: ``python -m stlib.bench`` parses its commands and writes the reference."""

from __future__ import annotations

import json
import sys

import pytest
from conftest import run

from stlib.bench.cli import main
from stlib.configs import PUBLISHED


def test_figures_command_writes_the_published_reference(tmp_path, capsys):
    main(["figures", "--out", str(tmp_path)])  # no records there: no figures either
    reference = json.loads((tmp_path / "case_study_reference.json").read_text())
    assert reference["dense_splash_ms"] == PUBLISHED["dense_splash_ms"]
    assert capsys.readouterr().out == ""


def test_unknown_command_is_refused():
    with pytest.raises(SystemExit):
        main(["bogus"])


def test_module_entry_point():
    proc = run([sys.executable, "-m", "stlib.bench", "--help"])
    assert "case-study" in proc.stdout and "cpu-scaling" in proc.stdout
