"""The ``>>>`` examples in stlib's docstrings run as written (doctest), at CPU sizes."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import stlib


def _modules_with_examples() -> list[str]:
    names = []
    for info in pkgutil.walk_packages(stlib.__path__, "stlib."):
        spec = importlib.util.find_spec(info.name)
        if spec and spec.origin and spec.origin.endswith(".py"):
            with open(spec.origin, encoding="utf-8") as handle:
                if ">>>" in handle.read():
                    names.append(info.name)
    return sorted(names)


MODULES = _modules_with_examples()


def test_some_module_has_examples():
    assert "stlib.analysis.static" in MODULES


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS, verbose=False)
    assert result.attempted > 0 and result.failed == 0, f"{name}: {result}"
