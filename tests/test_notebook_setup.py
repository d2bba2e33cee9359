"""Opening a notebook anywhere: the identical first cell that finds or installs stlib, the one size
switch, full size refused for interpret-mode kernels off a TPU, and a main-job log free of libtpu's
initialisation chatter."""

from __future__ import annotations

import os
import re
import shutil
import sys
import textwrap
import tomllib
from pathlib import Path

import jax
import jax.numpy as jnp
import jupytext
import pytest
from conftest import run

import stlib
import stlib.kernels  # registers the Pallas kernels
from stlib import configs, notebook
from stlib.reproduce import NOTEBOOKS, REPO

TWINS = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.py"))
#: libtpu's initialisation chatter on a host without a TPU (see stlib.notebook.QUIET_LIBTPU_ENV)
LIBTPU_NOISE = re.compile(
    r"could not determine TPU|unexpected worker hostname|Logging before InitGoogle|"
    r"Source Location Trace|libtpu_init_utils\.cc|Failed to find host bounds"
)


def first_code_cells(path, n=3):
    return [c.source for c in jupytext.read(path).cells if c.cell_type == "code"][:n]


def bootstrap_cell(path) -> str:
    """The cell that finds or installs stlib: the first code cell after the parameters cell."""
    parameters, bootstrap, _ = first_code_cells(path)
    assert parameters.startswith("SIZE = "), f"{path.name}: the first code cell is not the parameters cell"
    return bootstrap


def test_bootstrap_cell_identical_in_every_notebook():
    cells = {path.name: bootstrap_cell(path) for path in TWINS}
    first = next(iter(cells.values()))
    assert "STLIB_SOURCE" in first and 'find_spec("stlib")' in first
    assert len(first.splitlines()) <= 40, "keep the first cell short"
    different = [name for name, cell in cells.items() if cell != first]
    assert not different, f"the stlib-finding cell differs in {different}: copy it from {TWINS[0].name}"


def test_bootstrap_default_source_is_the_repository_url():
    urls = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["urls"]
    source = re.search(r'or "(git\+[^"]+)"', bootstrap_cell(TWINS[0])).group(1)
    assert source == "git+" + urls["Repository"]


def test_setup_cell_calls_notebook_setup():
    for path in TWINS:
        cell = first_code_cells(path)[2]
        assert re.search(r"cfg = notebook\.setup\(SIZE(, solutions=SOLUTIONS)?\)", cell), path.name


# --------------------------------------------------------------------------------------------
# a notebook opened alone, where stlib is not importable

# Hides this checkout's editable install (a meta-path finder) and the repository from sys.path, as on
# a machine that has jax but has never seen stlib.
HIDE_STLIB = """
import sys
sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "__module__", "").startswith("__editable__")]
sys.path[:] = [p for p in sys.path if p.rstrip("/") != {repo!r}]
"""

RUN_NOTEBOOK = """
import sys, nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError
nb = nbformat.read(sys.argv[1], as_version=4)
try:
    NotebookClient(nb, timeout=300, kernel_name="python3").execute()
except CellExecutionError:
    pass
nbformat.write(nb, sys.argv[1])
"""


def site_dirs() -> list[str]:
    """This interpreter's site-packages folders (a venv's own, the base ones it sees, the user's)."""
    import site

    found = [*site.getsitepackages(), *([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])]
    found += [p for p in sys.path if Path(p).name in ("site-packages", "dist-packages")]
    return [p for p in dict.fromkeys(found) if Path(p).is_dir()]


def run_alone(tmp_path, source: str):
    """Copy notebook 00 into an empty folder and run it with a fresh venv's python, STLIB_SOURCE=
    ``source``; return the text of each code cell's outputs. The venv sees this interpreter's packages
    (a .pth file adds its site-packages, so this works inside a venv too, where ``--system-site-packages``
    would see the base interpreter's instead) but not stlib: a sitecustomize hides the checkout."""
    import nbformat

    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    venv_python = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    venv_site = run([str(venv_python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"])
    dirs = site_dirs()
    (Path(venv_site.stdout.strip()) / "outer_site.pth").write_text(
        f"import site; list(map(site.addsitedir, {dirs!r}))\n"
    )
    shim, work = tmp_path / "shim", tmp_path / "work"
    shim.mkdir(), work.mkdir()
    (shim / "sitecustomize.py").write_text(HIDE_STLIB.format(repo=str(REPO)))
    (tmp_path / "run.py").write_text(RUN_NOTEBOOK)
    target = work / "00_problem_and_hardware.ipynb"
    shutil.copy(NOTEBOOKS / target.name, target)
    env = {k: v for k, v in os.environ.items() if k not in ("STLIB_HOME", "PYTHONHOME")}  # a new user's
    env |= {
        "PATH": f"{venv_python.parent}{os.pathsep}{os.environ['PATH']}",
        "VIRTUAL_ENV": str(venv),
        "PYTHONPATH": str(shim),
        "STLIB_SOURCE": source,
        "STLIB_SIZE": "small",
    }
    run([str(venv_python), str(tmp_path / "run.py"), str(target)], cwd=work, env=env, timeout=900)
    outputs = []
    for cell in nbformat.read(target, as_version=4).cells:
        if cell.cell_type == "code":
            outputs.append(
                "".join(o.get("text", "") + "\n".join(o.get("traceback", [])) for o in cell.outputs)
            )
    return outputs


def test_lone_notebook_installs_stlib_from_source(tmp_path):
    outputs = run_alone(tmp_path, str(REPO))
    assert f"installing stlib from {REPO}" in outputs[1]
    assert f"stlib from {tmp_path / 'venv'}" in outputs[1] and "jax 0.10.2" in outputs[1]
    assert "configuration: small" in outputs[2]
    assert "Error" not in "".join(outputs), outputs
    assert (tmp_path / "work" / "figures" / "00_roofline.png").is_file()  # beside the notebook


def test_lone_notebook_unreachable_source_is_one_sentence(tmp_path):
    missing = tmp_path / "no-such-checkout"
    outputs = run_alone(tmp_path, str(missing))
    assert outputs[1].splitlines()[-1] == (
        f"StlibSetupError: could not pip install stlib from {str(missing)!r}: set STLIB_SOURCE to a reachable "
        "clone, archive or git URL of the repository, or open the notebook inside a clone"
    )
    assert "Traceback" not in outputs[1] and not any(outputs[2:])


# --------------------------------------------------------------------------------------------
# one size switch

SIZE_WORDS = re.compile(
    r"CASE_STUDY|CPU_CASE|SMALL_CPU|DENSITIES|densities|workload|num_tokens|block_q|\bH\b|\bL\b"
)


@pytest.mark.parametrize("path", TWINS, ids=[p.stem for p in TWINS])
def test_no_size_decision_bypasses_setup(path):
    """Sizes follow cfg.size (STLIB_SIZE / SIZE via notebook.setup), never the backend."""
    lines = path.read_text().splitlines()
    for n, line in enumerate(lines):
        assert not ("STLIB_SIZE" in line and "environ" in line), (
            f"{path.name}:{n + 1}: read by notebook.setup only"
        )
        assert not re.search(r"\bon_tpu\(\)", line), f"{path.name}:{n + 1}: use cfg.size"
        for a, b in re.findall(r"(\S+) if (?:not )?cfg\.on_tpu else (\S+)", line):
            assert not SIZE_WORDS.search(a + b), (
                f"{path.name}:{n + 1}: a size chosen by cfg.on_tpu: {line.strip()}"
            )
        if re.match(r"\s*if (not )?cfg\.on_tpu:", line):
            assert not SIZE_WORDS.search(lines[n + 1]), f"{path.name}:{n + 2}: sizes chosen by cfg.on_tpu"


def test_size_switch_wins_over_the_backend(monkeypatch):
    monkeypatch.setattr(notebook, "on_tpu", lambda: True)
    monkeypatch.setattr(notebook, "shortfall", lambda: None)  # a TPU host that can serve the case study
    monkeypatch.setenv("STLIB_SIZE", "small")
    assert notebook.resolve_size("full") == "small"
    monkeypatch.setenv("STLIB_SIZE", "auto")
    assert notebook.resolve_size(None) == "full"
    monkeypatch.delenv("STLIB_SIZE")
    assert notebook.resolve_size("small") == "small" and notebook.resolve_size(None) == "full"


def test_unknown_size_is_one_sentence(monkeypatch):
    monkeypatch.setenv("STLIB_SIZE", "medium")
    with pytest.raises(notebook.SetupError) as info:
        notebook.setup(None)
    assert info.value._render_traceback_() == [f"SetupError: {info.value}"]
    assert "STLIB_SIZE='medium' is not a size: use 'small', 'full' or 'auto'" in str(info.value)


def test_full_off_a_tpu_refuses_interpret_mode_kernels_only(monkeypatch):
    monkeypatch.setenv("STLIB_SIZE", "full")
    cfg = notebook.setup(None)
    try:
        assert cfg.size == "full" and cfg.workload == configs.CASE_STUDY and cfg.interpret
        big = jax.ShapeDtypeStruct(configs.CASE_STUDY.qkv_shape, jnp.bfloat16)
        with pytest.raises(ValueError, match=r"INTERPRET_PAIR_LIMIT .* allow_slow_interpret=True"):
            jax.eval_shape(
                lambda q, k, v: stlib.attention(q, k, v, impl="pallas_dense", block_q=512, block_kv=1024),
                big,
                big,
                big,
            )
        # the notebooks' refusal holds even where the library's is lifted
        with pytest.raises(notebook.InterpretAtFullSize, match=r"109,520 grid steps .* STLIB_SIZE=small"):
            jax.eval_shape(
                lambda q, k, v: stlib.attention(
                    q, k, v, impl="pallas_dense", block_q=512, block_kv=1024, allow_slow_interpret=True
                ),
                big,
                big,
                big,
            )
        q, k, v = stlib.random_qkv((1, 256, 64), jnp.float32, seed=0)  # small calls still run
        stlib.attention(q, k, v, impl="pallas_dense", block_q=128, block_kv=128).block_until_ready()
    finally:
        monkeypatch.setenv("STLIB_SIZE", "small")
        notebook.setup(None)  # lifts the refusal for the rest of the session


# --------------------------------------------------------------------------------------------
# the main job's log


def test_quiet_libtpu_only_fills_in_and_never_on_a_tpu(monkeypatch):
    monkeypatch.setattr(notebook, "host_has_tpu", lambda: False)
    env = {"TPU_WORKER_HOSTNAMES": "w0"}
    assert (
        notebook.quiet_libtpu(env) == {"TPU_ACCELERATOR_TYPE": "v6e-4"}
        and env["TPU_WORKER_HOSTNAMES"] == "w0"
    )
    monkeypatch.setattr(notebook, "host_has_tpu", lambda: True)
    assert notebook.quiet_libtpu({}) == {}


def test_reproduce_log_has_no_libtpu_chatter(notebook_run):
    """The main job on notebook 00 without the quieting variables set (conftest's ``notebook_run``,
    shared with test_notebooks): every line of its log is its own progress or its table, and the
    executed notebook is kept."""
    result = notebook_run("00")
    log = result.log
    assert result.returncode == 0, result.failure()
    noise = [line for line in log.splitlines() if LIBTPU_NOISE.search(line)]
    assert not noise, "\n".join(noise)
    unexpected = [
        line
        for line in log.splitlines()
        if line.strip()
        and not re.match(
            r"\[\d+/\d+\] running|\[notebooks \d+/\d+\] ok in|notebooks: +100%|notebook |\d\d_\w+\.ipynb "
            r"|\d+ of \d+ notebooks ran",
            line,
        )
    ]
    assert not unexpected, textwrap.indent("\n".join(unexpected), "  ")
    assert "1 of 1 notebooks ran" in log and "notebooks/executed/" in log
    assert result.executed.is_file() and result.executed.name == "00_problem_and_hardware.ipynb"
    # kept in the home of the run that executed it (a temporary STLIB_HOME; under xdist maybe another
    # worker's, which ran the notebook once for the whole session), never in the checkout
    executed = result.executed.parent
    assert (executed.parent.name, executed.name) == ("notebooks", "executed")
    assert not executed.is_relative_to(REPO)
