"""Run every notebook in order, headlessly, and regenerate figures/ and data/.

    python -m stlib.reproduce                 # automatic configuration (full on a TPU, small elsewhere)
    python -m stlib.reproduce --size small    # force the small configuration
    python -m stlib.reproduce --only 03 05    # some notebooks

The committed .ipynb files are executed in memory and never rewritten (they stay output-free).
Ends with a table: notebook, status, seconds, figures written. Exits 1 if any notebook failed.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = REPO / "notebooks"
FIGURES = REPO / "figures"


def notebook_paths(only=None) -> list[Path]:
    paths = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    if only:
        paths = [p for p in paths if p.name[:2] in set(only)]
    return paths


def execute(path: Path, timeout: int = 1800) -> None:
    """Execute one notebook in memory with the python3 kernel, working directory notebooks/."""
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(notebook, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    client.execute()


def _figure_times() -> dict[Path, float]:
    return {p: p.stat().st_mtime for p in FIGURES.glob("*.png")} if FIGURES.exists() else {}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stlib.reproduce", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=["full", "small"], help="override the automatic configuration")
    parser.add_argument("--only", nargs="*", help="notebook numbers to run, e.g. 00 03")
    args = parser.parse_args(argv)
    if args.size:
        os.environ["STLIB_SIZE"] = args.size
    paths = notebook_paths(args.only)
    if not paths:
        print(f"no notebooks found in {NOTEBOOKS}", file=sys.stderr)
        return 1
    rows = []
    for n, path in enumerate(paths, 1):
        print(f"[{n}/{len(paths)}] running {path.name} ...", flush=True)
        before = _figure_times()
        start = time.perf_counter()
        try:
            execute(path)
            status = "ok"
        except Exception as error:  # noqa: BLE001 - report every notebook, then fail at the end
            status = "FAILED"
            message = re.sub(r"\x1b\[[0-9;]*m", "", str(error)).strip().splitlines()
            print(f"    {type(error).__name__}: {message[-1] if message else ''}", flush=True)
        seconds = time.perf_counter() - start
        written = sorted(p.name for p, t in _figure_times().items() if before.get(p) != t)
        rows.append((path.name, status, seconds, written))
        print(f"    {status} in {seconds:.1f} s, figures: {', '.join(written) or '-'}", flush=True)
    width = max(len(r[0]) for r in rows)
    print(f"\n{'notebook':<{width}}  {'status':<7}{'seconds':>9}  figures written")
    for name, status, seconds, written in rows:
        print(f"{name:<{width}}  {status:<7}{seconds:>9.1f}  {', '.join(written) or '-'}")
    failed = [r for r in rows if r[1] != "ok"]
    print(f"\n{len(rows) - len(failed)} of {len(rows)} notebooks ran; total {sum(r[2] for r in rows):.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
