"""Run every notebook in order, headlessly, and regenerate figures/ and data/.

    python -m stlib.reproduce                 # automatic configuration (full on a TPU, small elsewhere)
    python -m stlib.reproduce --size small    # force the small configuration
    python -m stlib.reproduce --only 03 05    # some notebooks

The committed .ipynb files are executed in memory and never rewritten (they stay output-free); each
executed copy, outputs included (also of a notebook that failed), is written to notebooks/executed/
(git-ignored) of stlib's home (``stlib.paths.home()``: the clone, or ``STLIB_HOME``; figures/ and
data/ go there too), with an HTML rendering beside it where nbconvert is installed. On a host without a TPU
the kernels and their subprocesses get ``stlib.notebook.QUIET_LIBTPU_ENV``, so libtpu's initialisation
chatter stays out of this log (its errors still print). On a TPU each notebook's run is recorded in
``data/tpu_notebooks.jsonl`` (``stlib.bench.notebook_runs``: status, seconds, device kind,
configuration, revision). Ends with a table: notebook, status, seconds, figures written. Exits 1 if
any notebook failed.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path

from stlib import paths

REPO = paths.REPO
#: The committed notebooks (read from the clone; what they write goes to ``stlib.paths.home()``).
NOTEBOOKS = REPO / "notebooks"


def executed_dir() -> Path:
    """Where the executed notebooks go: ``notebooks/executed/`` under ``stlib.paths.home()``."""
    return paths.home() / "notebooks" / "executed"


def notebook_paths(only=None) -> list[Path]:
    found = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    if only:
        found = [p for p in found if p.name[:2] in set(only)]
    return found


def execute(path: Path, timeout: int = 1800, out_dir: Path | None = None) -> None:
    """Execute one notebook in memory with the python3 kernel, working directory notebooks/ (the
    kernel inherits this process's environment). With ``out_dir``, write the executed copy there
    (also when a cell fails: then it shows the error) and an HTML rendering where nbconvert is
    installed. Raises what nbclient raises (CellExecutionError for a failing cell)."""
    import nbformat
    from nbclient import NotebookClient
    from traitlets.config import Config

    notebook = nbformat.read(path, as_version=4)
    # a busy machine may need more than 5 s to shut a kernel down; SIGTERM'd, libtpu prints a stack trace
    config = Config({"KernelManager": {"shutdown_wait_time": 60.0}})
    client = NotebookClient(
        notebook,
        timeout=timeout,
        kernel_name="python3",
        config=config,
        resources={"metadata": {"path": str(path.parent)}},
        extra_arguments=["--IPKernelApp.log_level=ERROR"],
    )  # no "running over TCP" warning
    try:
        client.execute()
    finally:
        if out_dir is not None:
            write_executed(notebook, Path(out_dir) / path.name)


def write_executed(notebook, target: Path) -> None:
    """Write an executed notebook to ``target`` (.ipynb) and, where nbconvert is installed, ``target``
    with the suffix .html beside it."""
    import nbformat

    target.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, target)
    try:
        from nbconvert import HTMLExporter
    except ImportError:
        return
    html, _ = HTMLExporter().from_notebook_node(notebook)
    target.with_suffix(".html").write_text(html, encoding="utf-8")


def _record_on_tpu(path: Path, executed_copy: Path, status: str, seconds: float) -> dict | None:
    """Where the notebook ran on a TPU (its executed copy's setup output says so), append its record to
    ``data/tpu_notebooks.jsonl`` (``stlib.bench.notebook_runs``); else None."""
    import json

    from stlib.bench.notebook_runs import record_if_on_tpu

    executed = json.loads(executed_copy.read_text()) if executed_copy.is_file() else {}
    mode = os.environ.get("STLIB_SOLUTIONS") or "fill"
    return record_if_on_tpu(
        path.stem, mode, status, round(seconds, 1), executed, runner="python -m stlib.reproduce"
    )


def _figure_times() -> dict[Path, float]:
    figures = paths.figures_dir()
    return {p: p.stat().st_mtime for p in figures.rglob("*.png")} if figures.exists() else {}  # cpu/ too


def _shown(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m stlib.reproduce",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--size", choices=["small", "full", "auto"], help="override the automatic configuration"
    )
    parser.add_argument("--only", nargs="*", help="notebook numbers to run, e.g. 00 03")
    args = parser.parse_args(argv)
    if args.size:
        os.environ["STLIB_SIZE"] = args.size
    from stlib.notebook import quiet_libtpu

    quiet_libtpu(os.environ)  # inherited by every notebook kernel and its subprocesses
    # kernels and their compile subprocesses may overlap with other users of libtpu's lockfile
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    chosen = notebook_paths(args.only)
    if not chosen:
        print(f"no notebooks found in {NOTEBOOKS}", file=sys.stderr)
        return 1
    from stlib.analysis.cache import SEED_FOLDER, export_seed, seed_cache, usage_mark
    from stlib.bench.notebook_runs import RECORDS
    from stlib.bench.progress import Progress

    seed = paths.data_dir() / SEED_FOLDER
    seed_cache(seed)  # the static estimates of the last main job, where the kernel sources still match
    since = usage_mark()  # the seed keeps the in-view estimates this run reads or writes, no others
    executed = executed_dir()
    rows = []
    tracker = Progress(len(chosen), "notebooks")  # in a log, each notebook's line has the time left
    for n, path in enumerate(chosen, 1):
        tracker.write(f"[{n}/{len(chosen)}] running {path.name} ...")
        before = _figure_times()
        start = time.perf_counter()
        try:
            execute(path, out_dir=executed)
            status = "ok"
        except Exception as error:  # noqa: BLE001 - report every notebook, then fail at the end
            status = "FAILED"
            message = re.sub(r"\x1b\[[0-9;]*m", "", str(error)).strip().splitlines()
            tracker.write(f"    {type(error).__name__}: {message[-1] if message else ''}")
        seconds = time.perf_counter() - start
        recorded = _record_on_tpu(path, executed / path.name, status, seconds)
        written = sorted(
            str(p.relative_to(paths.figures_dir())) for p, t in _figure_times().items() if before.get(p) != t
        )
        rows.append((path.name, status, seconds, written))
        tracker.step(
            f"{status} in {seconds:.1f} s, figures: {', '.join(written) or '-'}"
            + (f"; recorded in data/{RECORDS}" if recorded else "")
        )
    width = max(len(r[0]) for r in rows)
    print(f"\n{'notebook':<{width}}  {'status':<7}{'seconds':>9}  figures written")
    for name, status, seconds, written in rows:
        print(f"{name:<{width}}  {status:<7}{seconds:>9.1f}  {', '.join(written) or '-'}")
    failed = [r for r in rows if r[1] != "ok"]
    kept = export_seed(seed, used_since=since)  # for the next run, and for the tests (a copy of data/)
    print(
        f"\n{len(rows) - len(failed)} of {len(rows)} notebooks ran; total {sum(r[2] for r in rows):.0f} s; "
        f"executed notebooks (with their outputs) in {_shown(executed)}/; {kept} static estimates kept in "
        f"{_shown(seed)}/ for the next run"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
