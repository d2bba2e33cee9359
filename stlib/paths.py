"""Where stlib writes: one home with ``figures/`` and ``data/`` in it.

``STLIB_HOME`` (an existing or new folder) wins; otherwise the repository when stlib runs from a
clone (editable install or sys.path), else the working directory (stlib pip-installed, as in Colab).
Tests set ``STLIB_HOME`` to a temporary folder, so a test run never writes into the checkout.
"""

from __future__ import annotations

import os
from pathlib import Path

#: The folder above the ``stlib`` package: the repository root when stlib runs from a clone.
REPO = Path(__file__).resolve().parent.parent


def in_clone() -> bool:
    """Whether stlib runs from a clone of the repository (not a regular pip install)."""
    return (REPO / "pyproject.toml").is_file()


def home() -> Path:
    """The folder that holds ``figures/`` and ``data/`` (see the module docstring)."""
    env = os.environ.get("STLIB_HOME")
    if env:
        return Path(env).expanduser().resolve()
    return REPO if in_clone() else Path.cwd()


def data_dir() -> Path:
    """``home() / "data"``: the measured records."""
    return home() / "data"


def figures_dir() -> Path:
    """``home() / "figures"``: the figures the notebooks and benchmarks draw."""
    return home() / "figures"


__all__ = ["REPO", "data_dir", "figures_dir", "home", "in_clone"]
