"""Benchmark records and timing: the environment of a run, JSON-lines records, ``time_function``."""

from __future__ import annotations

import datetime
import functools
import importlib.metadata
import json
import os
import statistics
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import jax
import numpy as np

from stlib.device import backend, device_kind

#: Where the benchmarks write their records by default: ``data/`` at the repository root.
DATA_DIR = Path(__file__).resolve().parents[2] / "data"


@functools.cache
def environment() -> dict:
    """Backend, device kind, jax / jaxlib / libtpu versions and git revision of this process."""

    def version(name):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None

    try:
        rev = (
            subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"],
                capture_output=True,
                text=True,
                cwd=Path(__file__).parent,
                timeout=10,
                check=False,
            ).stdout.strip()
            or "unknown"
        )
    except (OSError, subprocess.SubprocessError):
        rev = "unknown"
    return {
        "backend": backend(),
        "device_kind": device_kind(),
        "jax": version("jax"),
        "jaxlib": version("jaxlib"),
        "libtpu": version("libtpu"),
        "git_rev": rev,
    }


#: Identifies the records of one benchmark process (figures draw the latest run of each file).
RUN_ID = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S") + f"-{os.getpid()}"


class Recorder:
    """Appends one JSON object per line to ``path``; each record is flushed and synced at once."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, record: dict) -> dict:
        """Write ``record`` with the environment, ``run`` and ``date`` fields in front; return it."""
        full = {
            **environment(),
            "run": RUN_ID,
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            **record,
        }
        with open(self.path, "a") as handle:
            handle.write(json.dumps(full, default=_jsonable) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        return full


def _jsonable(value):
    if isinstance(value, (np.integer, np.floating)):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)


def read_records(path: Path, latest_run: bool = False, where=None) -> list[dict]:
    """The records of a .jsonl file (only those of its most recent run with ``latest_run``); with
    ``where`` (record -> bool), only the records it accepts, and the latest run among those (e.g.
    the latest TPU run of a file that CPU runs appended to since)."""
    path = Path(path)
    if not path.exists():
        return []
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if where is not None:
        records = [r for r in records if where(r)]
    if latest_run and records:
        last = records[-1].get("run")
        records = [r for r in records if r.get("run") == last]
    return records


@dataclass(frozen=True)
class Timing:
    """Milliseconds per call over ``trials`` timed calls, and the compile time (not in the trials)."""

    median_ms: float
    min_ms: float
    max_ms: float
    compile_ms: float
    trials: int


@dataclass(frozen=True)
class Compiled:
    """``fn`` jit-compiled once for the arguments it was lowered with, and how long that took; call
    it like ``fn``. Check a result with it, then time the same executable (``time_function``)."""

    executable: object
    compile_ms: float

    def __call__(self, *args):
        return self.executable(*args)


def compile_function(fn, *args) -> Compiled:
    """``jax.jit(fn)`` lowered and compiled for ``args`` (arrays or ShapeDtypeStructs), timed."""
    start = time.perf_counter()
    executable = jax.jit(fn).lower(*args).compile()
    return Compiled(executable, (time.perf_counter() - start) * 1e3)


def time_function(fn, *args, trials: int = 5, warmup: int = 1) -> Timing:
    """Compile ``fn`` (excluded, reported separately; a ``Compiled`` is reused as it is, never
    compiled again), warm up, then time ``trials`` calls with block_until_ready."""
    compiled = fn if isinstance(fn, Compiled) else compile_function(fn, *args)
    for _ in range(warmup):
        jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(trials):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append((time.perf_counter() - start) * 1e3)
    return Timing(statistics.median(times), min(times), max(times), compiled.compile_ms, trials)
