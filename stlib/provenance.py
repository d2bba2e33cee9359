"""Where a record comes from: the date, git revision and jax / jaxlib / libtpu versions every
writer of ``data/`` stamps its records with (the benchmarks' ``stlib.bench.records``, the
estimator's tables). Below both: it imports nothing of stlib but ``paths``."""

from __future__ import annotations

import datetime
import functools
import importlib.metadata
import os
import subprocess

from stlib import paths


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.cache
def git_rev() -> str:
    """The short git revision of the clone stlib runs from ("unknown" outside a clone or without git);
    ``STLIB_GIT_REV`` wins (a copy of the tree without its .git, as on a remote TPU machine, names
    the revision it was copied from that way)."""
    if os.environ.get("STLIB_GIT_REV"):
        return os.environ["STLIB_GIT_REV"]
    if not paths.in_clone():
        return "unknown"
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=paths.REPO,
            timeout=10,
            check=False,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        rev = ""
    return rev or "unknown"


#: The provenance fields every record in ``data/`` carries, under these names (``provenance``).
PROVENANCE_FIELDS = ("date", "git_rev", "jax", "jaxlib", "libtpu")
#: Older names of provenance fields (the block sweep's first records): ``read_records`` adds the
#: current name beside them.
PROVENANCE_ALIASES = {"git": "git_rev", "time": "date"}


def provenance() -> dict:
    """The fields that say where a record comes from, for every writer of records in ``data/``: the
    UTC ``date`` (ISO 8601, seconds), ``git_rev`` and the ``jax`` / ``jaxlib`` / ``libtpu`` versions
    (None where not installed). Initialises no JAX backend."""
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "git_rev": git_rev(),
        **{name: _version(name) for name in ("jax", "jaxlib", "libtpu")},
    }
