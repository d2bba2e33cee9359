"""Benchmark records and timing: the provenance and environment of a run, JSON-lines records,
``time_function``. Records go to ``stlib.paths.data_dir()`` unless a writer is given a folder."""

from __future__ import annotations

import datetime
import functools
import json
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import jax
import numpy as np

from stlib.device import backend, device_kind
from stlib.provenance import PROVENANCE_ALIASES, provenance


@functools.cache
def environment() -> dict:
    """Backend, device kind, jax / jaxlib / libtpu versions and git revision of this process."""
    versions = {k: v for k, v in provenance().items() if k != "date"}
    return {"backend": backend(), "device_kind": device_kind(), **versions}


#: Identifies the records of one benchmark process (figures draw the latest run of each file).
RUN_ID = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S") + f"-{os.getpid()}"


class Recorder:
    """Appends one JSON object per line to ``path``; each record is flushed and synced at once."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, record: dict) -> dict:
        """Write ``record`` with the environment, ``run`` and provenance (``provenance``) fields in
        front; return it."""
        full = {**environment(), "run": RUN_ID, **provenance(), **record}
        append_line(self.path, full)
        return full


def failure_reason(error: str) -> str:
    """One readable line for a failed compile's captured error (a record's ``error``): a compile stopped by SIGTERM (its
    time limit, or a run interrupted) says so; otherwise the error's last line, cut to 160 characters.

    >>> failure_reason("RuntimeError: (unknown)\\nE1206 process_state.cc:708] RAW: Raising signal 15 with default behavior")
    'the compile was stopped (SIGTERM: its time limit, or the run interrupted) before it finished'
    >>> failure_reason("ValueError: blocks do not fit VMEM\\n")
    'ValueError: blocks do not fit VMEM'
    """
    if "SIGTERM" in error or "signal 15" in error:
        return "the compile was stopped (SIGTERM: its time limit, or the run interrupted) before it finished"
    lines = [line.strip() for line in error.splitlines() if line.strip()]
    return (lines or ["?"])[-1][-160:]


def append_line(path: Path, record: dict) -> None:
    """Append ``record`` to the .jsonl file ``path`` as one line, flushed and synced at once."""
    with open(path, "a") as handle:
        handle.write(json.dumps(record, default=_jsonable) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def record_each(items, make_record, path: Path, what: str, report=None) -> list[dict]:
    """``make_record(item)`` for each of ``items`` under a progress bar (``what``): each record gets the
    run's provenance (``provenance``, taken once) and is appended to ``path`` as soon as it is made, so
    a long run that stops keeps what it finished. ``report(record)``, if given, returns a line to
    print for it. Returns the records."""
    from stlib.bench.progress import Progress

    items = list(items)
    origin, records = provenance(), []
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with Progress(len(items), what) as bar:
        for item in items:
            record = {**make_record(item), **origin}
            append_line(path, record)
            records.append(record)
            bar.step(report(record) if report else "")
    return records


def latest_per_key(path: Path, key) -> dict:
    """The latest record of each ``key(record)`` in the .jsonl file ``path`` (a later line replaces an
    earlier one with the same key); {} where the file does not exist."""
    return {key(record): record for record in read_records(path)}


def _jsonable(value):
    if isinstance(value, (np.integer, np.floating)):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)


def with_provenance_names(record: dict) -> dict:
    """``record`` with each older provenance name (``PROVENANCE_ALIASES``) also under its current name
    (the older one stays)."""
    missing = {
        new: record[old] for old, new in PROVENANCE_ALIASES.items() if old in record and new not in record
    }
    return {**record, **missing} if missing else record


def read_records(path: Path, latest_run: bool = False, where=None) -> list[dict]:
    """The records of a .jsonl file (only those of its most recent run with ``latest_run``); with
    ``where`` (record -> bool), only the records it accepts, and the latest run among those (e.g.
    the latest TPU run of a file that CPU runs appended to since). Older provenance names are read
    under the current ones too (``with_provenance_names``)."""
    path = Path(path)
    if not path.exists():
        return []
    records = [
        with_provenance_names(json.loads(line)) for line in path.read_text().splitlines() if line.strip()
    ]
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


#: Environment variable: at most this many timed calls per case and call of ``time_function``, and
#: at most this many rounds of ``time_interleaved``. The tests' runs of the notebooks set 1 (``tests/conftest.py``): they check that every
#: cell runs, not what its times say; the main job leaves it unset and times as asked.
TRIALS_CAP_ENV = "STLIB_TIMING_TRIALS"


def capped(trials: int) -> int:
    """``trials``, or fewer where ``TRIALS_CAP_ENV`` caps them (never fewer than 1).

    >>> before = os.environ.pop(TRIALS_CAP_ENV, None)
    >>> capped(5)
    5
    >>> os.environ[TRIALS_CAP_ENV] = "1"
    >>> capped(5)
    1
    >>> if before is None:
    ...     del os.environ[TRIALS_CAP_ENV]
    ... else:
    ...     os.environ[TRIALS_CAP_ENV] = before
    """
    cap = os.environ.get(TRIALS_CAP_ENV)
    return trials if not cap else max(1, min(trials, int(cap)))


def time_function(fn, *args, trials: int = 5, warmup: int = 1) -> Timing:
    """Compile ``fn`` (excluded, reported separately; a ``Compiled`` is reused as it is, never
    compiled again), warm up, then time ``trials`` calls with block_until_ready."""
    compiled = fn if isinstance(fn, Compiled) else compile_function(fn, *args)
    return _timing(_timed_calls(compiled, args, trials, warmup), compiled.compile_ms)


def _timing(times: list[float], compile_ms: float) -> Timing:
    return Timing(statistics.median(times), min(times), max(times), compile_ms, len(times))


def _timed_calls(compiled: Compiled, args, trials: int, warmup: int) -> list[float]:
    """Milliseconds of each of ``trials`` calls (``capped``), after ``warmup`` untimed ones."""
    trials = capped(trials)
    for _ in range(warmup):
        jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(trials):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append((time.perf_counter() - start) * 1e3)
    return times


def time_interleaved(
    cases: dict, *args, rounds: int = 3, trials: int = 3, seed: int = 0, progress=None
) -> dict:
    """Time several functions of the same ``args`` fairly on a shared, noisy machine: each is compiled
    once, then ``rounds`` rounds each time every case ``trials`` times, in an order shuffled anew per
    round (a slow spell of the machine falls on different cases). Returns {name: Timing} over all
    ``rounds * trials`` calls of each (median, min, max); both ``capped`` where ``TRIALS_CAP_ENV``
    caps them (the tests). ``progress``: called with each case's name once its last round is timed."""
    import random

    compiled = {
        name: fn if isinstance(fn, Compiled) else compile_function(fn, *args) for name, fn in cases.items()
    }
    times = {name: [] for name in cases}
    order = list(cases)
    rounds, trials = capped(rounds), capped(trials)
    shuffle = random.Random(seed).shuffle
    for round_ in range(rounds):
        shuffle(order)
        for name in order:
            times[name].extend(_timed_calls(compiled[name], args, trials, warmup=1 if round_ == 0 else 0))
            if progress is not None and round_ == rounds - 1:
                progress(name)
    return {name: _timing(t, compiled[name].compile_ms) for name, t in times.items()}
