"""Tuned blocks as package data: one JSON file per implementation, ``NAME.json``, written by its
block sweep (``python -m stlib.bench.block_sweep tune``) and read by the implementation's
``resolve``, so a regular ``pip install`` carries them and nothing copies them by hand."""

from __future__ import annotations

import functools
import json
from importlib import resources
from pathlib import Path


def source_path(name: str) -> Path:
    """Where the sweep writes ``name``'s tuned blocks: beside this module, in the source tree."""
    return Path(__file__).resolve().parent / f"{name}.json"


@functools.cache
def load(name: str) -> dict:
    """The tuned blocks of implementation ``name`` ({} when none were written), read from the
    installed package (works from a wheel as from a clone)."""
    entry = resources.files(__name__).joinpath(f"{name}.json")
    if not entry.is_file():
        return {}
    return json.loads(entry.read_text())


def write(name: str, tuned: dict) -> Path:
    """Write ``tuned`` as ``name``'s tuned blocks into the source tree; returns the path."""
    path = source_path(name)
    path.write_text(json.dumps(tuned, indent=1, sort_keys=True) + "\n")
    load.cache_clear()
    return path


__all__ = ["load", "source_path", "write"]
