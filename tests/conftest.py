"""Test-session settings, applied before JAX initialises its backends, and what the tests share:

- the session's own ``STLIB_HOME`` (a temporary folder holding a copy of the committed ``data/``), so
  no test, notebook or benchmark writes into the checkout; ``pytest_sessionfinish`` fails the run if
  one did anyway (files under data/, figures/ or notebooks/ changed during the run);
- one estimate cache (``STLIB_CACHE_DIR``) for the whole run, every xdist worker included (an
  ``STLIB_CACHE_DIR`` set before the run is kept: point it at ``~/.cache/stlib`` to reuse a warm cache),
  seeded with the committed ``data/estimate_cache`` (the last main job's estimates; an entry whose
  kernel sources changed since is never read);
- each notebook executed once per run by the main job (``notebook_run``), whichever tests read it;
- hypothesis profiles ("ci", the default: few examples, no deadline; "dev": more; ``HYPOTHESIS_PROFILE``);
- ``run``: a subprocess whose stdout and stderr a failure shows;
- under xdist, the tests known to be long (or measured long by the previous run) start first.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

# Several processes use libtpu's deviceless compiler during a run (pytest itself, and the Jupyter
# kernels that execute the notebooks): without this, the second one fails on libtpu's lockfile.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
# Notebooks executed by the tests always use the small configuration, and time each case once
# (stlib.bench.records.TRIALS_CAP_ENV): the tests check that the cells run, not what they measure.
os.environ.setdefault("STLIB_SIZE", "small")
os.environ.setdefault("STLIB_TIMING_TRIALS", "1")
# Four CPU devices, so the mesh tests (stlib.parallel) shard over a real 4-device mesh.
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
    ).strip()

import jax.numpy as jnp
import pytest
from hypothesis import settings

import stlib
from stlib import paths

settings.register_profile("ci", max_examples=10, deadline=None)
settings.register_profile("dev", max_examples=50, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def qkv(seed, heads, length, dim, dtype=jnp.float32):
    """The tests' q, k, v: ``stlib.random_qkv`` [heads, length, dim], seeded."""
    return stlib.random_qkv((heads, length, dim), dtype, seed)


def run(cmd, *, check: bool = True, timeout: float = 600, **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd)`` with text output captured; with ``check``, a non-zero exit fails the
    test with the command, its exit status, and the tail of its stdout and stderr."""
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False, **kwargs)
    if check and proc.returncode:
        pytest.fail(
            f"{' '.join(map(str, cmd))} exited with status {proc.returncode}\n"
            f"--- stdout (tail) ---\n{proc.stdout[-4000:]}\n--- stderr (tail) ---\n{proc.stderr[-8000:]}",
            pytrace=False,
        )
    return proc


# --------------------------------------------------------------------------------------------
# the session's home and cache: nothing written into the checkout or the user's cache


def _shared_root(tmp_path_factory) -> Path:
    """A folder of this run that every xdist worker sees (the basetemp's parent under xdist)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session", autouse=True)
def stlib_home(tmp_path_factory):
    """``STLIB_HOME`` for the session (exported: notebook kernels and subprocesses inherit it), with
    a copy of the committed data/ (the notebooks and tests read records from it) and an empty
    figures/; and the run's shared ``STLIB_CACHE_DIR`` unless one was set."""
    home = tmp_path_factory.mktemp("stlib-home")
    shutil.copytree(paths.REPO / "data", home / "data")
    (home / "figures").mkdir()
    saved = {k: os.environ.get(k) for k in ("STLIB_HOME", "STLIB_CACHE_DIR")}
    os.environ["STLIB_HOME"] = str(home)
    if not saved["STLIB_CACHE_DIR"]:
        os.environ["STLIB_CACHE_DIR"] = str(_shared_root(tmp_path_factory) / "stlib-cache")
    from stlib.analysis.cache import SEED_FOLDER, seed_cache

    seed_cache(home / "data" / SEED_FOLDER)  # the last main job's estimates where the sources still match
    yield home
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


# --------------------------------------------------------------------------------------------
# notebooks: each executed once per run, by the main job


@dataclass(frozen=True)
class NotebookRun:
    """``python -m stlib.reproduce --only NN --size small`` of one notebook, in the session's home,
    with libtpu's quieting variables unset (the main job sets them itself)."""

    name: str
    returncode: int
    log: str
    executed: Path  # the executed copy, outputs included

    def failure(self) -> str:
        """What went wrong, for an assertion message: the log and the error outputs of the executed copy."""
        import nbformat

        errors = []
        if self.executed.is_file():
            for cell in nbformat.read(self.executed, as_version=4).cells:
                for output in cell.get("outputs", []):
                    if output.get("output_type") == "error":
                        errors.append("\n".join(output.get("traceback", [])))
        return f"{self.name}: exit status {self.returncode}\n{self.log[-4000:]}\n" + "\n".join(errors)[-8000:]


@contextlib.contextmanager
def _locked(path: Path):
    """An exclusive lock on ``path`` across processes (no lock where fcntl is missing)."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def notebook_run(tmp_path_factory, stlib_home):
    """``notebook_run("00")``: the notebook's run by the main job (``NotebookRun``), executed once per
    test run however many tests (on however many xdist workers) ask for it."""
    from stlib.notebook import QUIET_LIBTPU_ENV
    from stlib.reproduce import executed_dir, notebook_paths

    root = _shared_root(tmp_path_factory) / "notebook-runs"
    root.mkdir(exist_ok=True)

    def get(number: str) -> NotebookRun:
        (path,) = notebook_paths([number])
        folder = root / number
        folder.mkdir(exist_ok=True)
        with _locked(folder / "lock"):
            result = folder / "result.json"
            if not result.exists():
                env = {k: v for k, v in os.environ.items() if k not in QUIET_LIBTPU_ENV}
                proc = subprocess.run(
                    [sys.executable, "-m", "stlib.reproduce", "--only", number, "--size", "small"],
                    cwd=paths.REPO,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=3600,
                    check=False,
                )
                record = {
                    "name": path.name,
                    "returncode": proc.returncode,
                    "log": proc.stdout + proc.stderr,
                    "executed": str(executed_dir() / path.name),
                }
                result.write_text(json.dumps(record))
            record = json.loads(result.read_text())
        return NotebookRun(record["name"], record["returncode"], record["log"], Path(record["executed"]))

    return get


# --------------------------------------------------------------------------------------------
# under xdist, long tests first: the longest-first order that balances the workers

#: About how many seconds a test takes on 2 busy cores, where the previous run's own measurement is
#: missing (a fresh clone): node-id prefixes, the first that matches counts.
KNOWN_LONG = {
    "tests/test_notebooks.py::test_runs_at_small_configuration[07_": 90,
    "tests/test_notebooks.py::test_runs_at_small_configuration[06_": 50,
    "tests/test_notebooks.py::test_runs_at_small_configuration[04_": 50,
    "tests/test_notebooks.py::test_runs_at_small_configuration[08_": 45,
    "tests/test_analysis_estimate.py::test_the_backward_estimate_reads_the_fused_and_splash_backward_kernels": 40,
    "tests/test_exercises.py::test_a_kernel_notebook_with_its_stubs_reaches_its_end": 30,
    "tests/test_ring.py::test_the_ring_equals_single_device_attention_gradients_included[pallas_tile_lane_dense-per": 20,
    "tests/test_model_attention.py::test_the_wan_block_runs_forward_and_backward_sharded_as_on_one_device": 12,
    "tests/test_gradients.py::test_video_attention_and_routed_plans_train_through_the_tile_kernels": 18,
    "tests/test_doctests.py::test_docstring_examples_run[stlib.analysis.static]": 16,
    "tests/test_notebooks.py::test_runs_at_small_configuration[0": 25,
    "tests/test_notebooks.py::test_runs_at_small_configuration[11_": 80,
    "tests/test_notebooks.py::test_runs_at_small_configuration[10_": 50,
    "tests/test_routing.py::test_plan_compiles_for_v6e_at_case_study_shape": 60,
    "tests/test_tpu_compile.py::test_the_backward_compiles_at_case_study_shape[pallas_tile_lane_dense-": 25,
    "tests/test_analysis_estimate.py::test_skipped_masked_and_full_steps": 40,
    "tests/test_kernels_tile_lane_dense.py::test_sliding_tile_rows_of_tiles_run_as_patterns": 35,
    "tests/test_notebook_setup.py::test_lone_notebook_installs_stlib_from_source": 25,
    "tests/test_tpu_compile.py::": 12,
    "tests/test_analysis_estimate.py::": 15,
}
#: A test at least this long (seconds) is scheduled by its length; shorter ones keep their order.
LONG = 5.0
DURATIONS_KEY = "stlib/durations"


def _known_seconds(nodeid: str, measured: dict) -> float:
    if nodeid in measured:
        return measured[nodeid]
    return next((s for prefix, s in KNOWN_LONG.items() if nodeid.startswith(prefix)), 0.0)


def pytest_collection_modifyitems(config, items):
    """Under xdist (in each worker, identically), move the long tests to the front, longest first, so
    that the workers (fed one test at a time: ``--maxschedchunk 1``) end together."""
    cache = getattr(config, "cache", None)  # None with -p no:cacheprovider
    if not hasattr(config, "workerinput") or cache is None:
        return
    measured = cache.get(DURATIONS_KEY, {})
    seconds = {item.nodeid: _known_seconds(item.nodeid, measured) for item in items}
    long = sorted((i for i in items if seconds[i.nodeid] >= LONG), key=lambda i: -seconds[i.nodeid])
    items[:] = long + [i for i in items if seconds[i.nodeid] < LONG]


_durations: dict[str, float] = {}


def pytest_runtest_logreport(report):
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        _durations[report.nodeid] = _durations.get(report.nodeid, 0.0) + report.duration


# --------------------------------------------------------------------------------------------
# the checkout as the run found it

WATCHED = ("data", "figures", "notebooks")


def _watched_files() -> dict[str, str] | None:
    """Hash of every file git tracks or would track under ``WATCHED`` (None outside a git checkout)."""
    if not (paths.REPO / ".git").exists() or shutil.which("git") is None:
        return None
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z", "--", *WATCHED],
        cwd=paths.REPO,
        capture_output=True,
        check=False,
    )
    if listed.returncode:
        return None
    files = {}
    for name in filter(None, listed.stdout.decode().split("\0")):
        path = paths.REPO / name
        files[name] = hashlib.sha1(path.read_bytes()).hexdigest() if path.is_file() else "missing"
    return files


def _is_controller(config) -> bool:
    return not hasattr(config, "workerinput")


_BEFORE = pytest.StashKey[dict]()


def pytest_sessionstart(session):
    if _is_controller(session.config):
        session.config.stash[_BEFORE] = _watched_files()


def pytest_sessionfinish(session, exitstatus):
    config = session.config
    if not _is_controller(config):
        return
    cache = getattr(config, "cache", None)
    if cache is not None and _durations:  # the next run's order (see pytest_collection_modifyitems)
        cache.set(DURATIONS_KEY, {**cache.get(DURATIONS_KEY, {}), **_durations})
    before = config.stash.get(_BEFORE, None)
    after = _watched_files() if before is not None else None
    if before is None or after is None:
        return
    changed = sorted(n for n in before.keys() | after.keys() if before.get(n) != after.get(n))
    if changed:
        config.stash[_CHANGED] = changed
        if session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


_CHANGED = pytest.StashKey[list]()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    changed = config.stash.get(_CHANGED, None)
    if changed:
        terminalreporter.write_sep("!", "the test run changed files in the checkout", red=True, bold=True)
        terminalreporter.write_line(
            "tests must write under STLIB_HOME or tmp_path; changed: " + ", ".join(changed)
        )
