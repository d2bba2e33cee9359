"""Records of the notebooks run on a TPU: one line per notebook and mode in ``data/tpu_notebooks.jsonl``.

    python -m stlib.bench.notebook_runs record DIR --mode fill [--revision REV]   # append a run's records
    python -m stlib.bench.notebook_runs table                                     # the latest run, per notebook

``DIR`` holds what a notebook runner wrote for each notebook: the executed copy ``NAME.ipynb`` and
a report ``NAME.json`` (``status``, ``wall_seconds``, ``peak_host_gb``, seconds per cell: the format
of the TPU machine's ``run_notebooks.py``, which executes a notebook cell by cell in an in-process
IPython shell where no Jupyter kernel can start). Where the notebook ran, on what and at which size
is read from the executed copy's own setup output (``stlib.notebook.setup`` prints the JAX
version, backend, device kind and configuration), so a record says what the notebook itself saw.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
from pathlib import Path

from stlib import paths
from stlib.bench.records import append_line

#: The records' file under ``data/``.
RECORDS = "tpu_notebooks.jsonl"
MODES = ("fill", "hide")

_PLATFORM = re.compile(r"JAX (?P<jax>\S+) \| backend (?P<backend>\S+) \| device (?P<device_kind>.+)")
_CONFIG = re.compile(
    r"configuration: (?P<size>\w+) -> (?P<workload>[^:]+): grid \((?P<grid>[^)]*)\) = (?P<tokens>[\d,]+) tokens"
)


def setup_facts(executed: dict) -> dict:
    """jax, backend, device_kind, size, workload, grid and tokens as the notebook's setup cell
    printed them (empty where the notebook never printed them, e.g. it failed before).

    >>> cell = {"cell_type": "code", "outputs": [{"output_type": "stream", "text":
    ...     "JAX 0.10.2 | backend tpu | device TPU v5 lite\\nconfiguration: full -> case-study: "
    ...     "grid (21, 45, 80) = 75,600 tokens, 10 heads x 128, bfloat16; tiles 512 x 1024"}]}
    >>> facts = setup_facts({"cells": [cell]})
    >>> facts["device_kind"], facts["size"], facts["tokens"]
    ('TPU v5 lite', 'full', 75600)
    """
    facts: dict = {}
    for cell in executed.get("cells", []):
        for output in cell.get("outputs", []) if cell.get("cell_type") == "code" else []:
            text = output.get("text", "")
            text = "".join(text) if isinstance(text, list) else text
            for pattern in (_PLATFORM, _CONFIG):
                found = pattern.search(text)
                if found and not set(found.groupdict()) <= set(facts):
                    facts.update({k: v.strip() for k, v in found.groupdict().items()})
        if {"device_kind", "size"} <= set(facts):
            break
    if "tokens" in facts:
        facts["tokens"] = int(facts["tokens"].replace(",", ""))
    return facts


def make_record(
    name: str,
    mode: str,
    status: str,
    seconds: float | None,
    executed: dict,
    revision: str,
    date: str | None = None,
    **extra,
) -> dict:
    """One notebook's record: its name, mode, status, seconds and ``extra`` (peak host GB, slowest
    cells, the runner, an error), with the setup facts its executed copy printed, the revision and
    the date (now unless given)."""
    if mode not in MODES:
        raise ValueError(f"mode={mode!r} must be one of {MODES}")
    return {
        "notebook": name,
        "mode": mode,
        "status": status,
        "seconds": seconds,
        **extra,
        **setup_facts(executed),
        "git_rev": revision,
        "date": date or datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def record_if_on_tpu(
    name: str, mode: str, status: str, seconds: float, executed: dict, **extra
) -> dict | None:
    """Append ``make_record(...)`` to ``data/tpu_notebooks.jsonl`` where the executed copy says it
    ran on a TPU (its setup output), and return it; elsewhere record nothing and return None. The main
    job (``python -m stlib.reproduce``) calls it after each notebook."""
    from stlib.provenance import git_rev

    record = make_record(name, mode, status, seconds, executed, git_rev(), **extra)
    if record.get("backend") != "tpu":
        return None
    paths.data_dir().mkdir(parents=True, exist_ok=True)
    append_line(paths.data_dir() / RECORDS, record)
    return record


def run_records(folder: Path, mode: str, revision: str, date: str | None = None) -> list[dict]:
    """One record per ``NAME.json`` report in ``folder`` (sorted by name): notebook, mode, status,
    seconds, peak host GB, the slowest cells, and the setup facts of ``NAME.ipynb`` beside it.
    Raises ValueError for an unknown mode or a folder without reports."""
    if mode not in MODES:
        raise ValueError(f"mode={mode!r} must be one of {MODES}")
    reports = sorted(Path(folder).glob("[0-9][0-9]_*.json"))
    if not reports:
        raise ValueError(f"no notebook reports (NN_name.json) in {folder}")
    date = date or datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    records = []
    for report_path in reports:
        report = json.loads(report_path.read_text())
        executed_path = report_path.with_suffix(".ipynb")
        executed = json.loads(executed_path.read_text()) if executed_path.is_file() else {}
        slowest = sorted(report.get("cells", []), key=lambda c: -c["seconds"])[:3]
        error = {"error": report["error"].strip().splitlines()[-1][-200:]} if report.get("error") else {}
        seconds = report.get("wall_seconds", report.get("seconds"))
        records.append(
            make_record(
                report_path.stem,
                mode,
                report.get("status", "?"),
                seconds,
                executed,
                revision,
                date,
                peak_host_gb=report.get("peak_host_gb"),
                slowest_cells=[[c["cell"], c["seconds"]] for c in slowest],
                **error,
            )
        )
    return records


def read(path: Path | None = None) -> list[dict]:
    """Every record of ``data/tpu_notebooks.jsonl`` (or ``path``), oldest first."""
    path = Path(path) if path else paths.data_dir() / RECORDS
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def latest(records: list[dict], mode: str = "fill") -> dict[str, dict]:
    """The latest record of each notebook in ``mode`` (by date, then file order)."""
    chosen: dict[str, dict] = {}
    for record in sorted((r for r in records if r["mode"] == mode), key=lambda r: r["date"]):
        chosen[record["notebook"]] = record
    return dict(sorted(chosen.items()))


def _number(value) -> str:
    return "-" if value is None else f"{value:.1f}"


def table(records: list[dict]) -> str:
    """The latest record of each notebook and mode as a text table."""
    lines = [f"{'notebook':<34}{'mode':<6}{'status':<22}{'seconds':>8}{'host GB':>9}  device, size, date"]
    for mode in MODES:
        for name, r in latest(records, mode).items():
            lines.append(
                f"{name:<34}{mode:<6}{r['status'][:21]:<22}{_number(r['seconds']):>8}{_number(r['peak_host_gb']):>9}  "
                f"{r.get('device_kind', '?')}, {r.get('size', '?')}, {r['date'][:10]}"
            )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m stlib.bench.notebook_runs",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="append the records of one run's reports")
    rec.add_argument("folder", type=Path)
    rec.add_argument("--mode", choices=MODES, default="fill")
    rec.add_argument("--revision", default=None, help="the git revision the run's tree was copied from")
    sub.add_parser("table", help="the latest record of each notebook and mode")
    args = parser.parse_args(argv)
    if args.command == "record":
        from stlib.provenance import git_rev

        records = run_records(args.folder, args.mode, args.revision or git_rev())
        target = paths.data_dir() / RECORDS
        target.parent.mkdir(parents=True, exist_ok=True)
        for record in records:
            append_line(target, record)
        print(f"{len(records)} records appended to {target}")
        print(table(records))
        return 0
    print(table(read()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
