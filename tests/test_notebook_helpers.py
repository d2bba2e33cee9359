"""The notebooks' shared helpers: configuration and checks against the plain reference."""

from __future__ import annotations

import os
from pathlib import Path

import jax.numpy as jnp
import pytest

import stlib
from stlib import masks, notebook, paths
from stlib.kernels.xla import REFERENCE_LIMIT


def test_setup_small_and_bad_size(monkeypatch):
    monkeypatch.delenv("STLIB_SIZE", raising=False)
    cfg = notebook.setup("small")
    assert cfg.workload == stlib.SMALL_CPU and cfg.interpret and cfg.figure("00_x").name == "00_x.png"
    with pytest.raises(ValueError, match="size="):
        notebook.setup("medium")


def test_the_test_session_writes_under_its_own_home():
    """conftest's STLIB_HOME: a temporary folder outside the checkout, holding the committed records."""
    home = Path(os.environ["STLIB_HOME"])
    assert not home.is_relative_to(paths.REPO) and notebook.home() == home
    cfg = notebook.setup("small")
    assert (cfg.data, cfg.figures) == (home / "data", home / "figures")
    committed = {p.name for p in (paths.REPO / "data").iterdir()}
    assert committed <= {p.name for p in cfg.data.iterdir()}


def test_home_is_read_when_asked(tmp_path, monkeypatch):
    monkeypatch.setenv("STLIB_HOME", str(tmp_path))
    assert (
        notebook.home() == tmp_path
        and notebook.setup("small").figure("00_x") == tmp_path / "figures" / "00_x.png"
    )


def test_max_error_small_length_uses_every_row():
    q, k, v = stlib.random_qkv((2, 256, 32), jnp.float32, seed=1)
    mask = masks.band(256, 9)
    out = stlib.attention(q, k, v, mask, impl="reference")
    assert notebook.max_error(out, q, k, v, mask) == 0.0
    scale = float(jnp.abs(out).max())  # stlib.checks.scaled_error: relative to the largest reference value
    assert notebook.max_error(out.at[1, 200, 3].add(0.5), q, k, v, mask) == pytest.approx(
        0.5 / scale, abs=1e-6
    )


def test_max_error_large_length_samples_rows_without_materialising():
    length = REFERENCE_LIMIT + 64
    q, k, v = stlib.random_qkv((1, length, 8), jnp.float32, seed=2)
    mask = masks.band(length, 40)
    out = stlib.attention(q, k, v, mask, impl="xla", block_q=256, block_kv=256)
    assert notebook.max_error(out, q, k, v, mask) < notebook.tolerance(jnp.float32)
    assert notebook.max_error(out.at[0, length - 1, 0].add(1.0), q, k, v, mask) > 0.5  # last rows are sampled
    assert notebook.max_error(out.at[0, length // 2, 0].add(1.0), q, k, v, mask) > 0.5  # middle rows too


def test_a_tpu_host_too_small_for_the_case_study_says_so_and_runs_small(monkeypatch, capsys):
    monkeypatch.delenv("STLIB_SIZE", raising=False)
    monkeypatch.setattr(notebook, "on_tpu", lambda: True)
    monkeypatch.setattr(
        notebook, "shortfall", lambda: "4.0 GiB of HBM on its first device, under the 8 GiB it needs"
    )
    assert notebook.resolve_size(None) == "small"
    assert "cannot serve the case-study size (4.0 GiB of HBM" in capsys.readouterr().out
    monkeypatch.setattr(notebook, "shortfall", lambda: None)
    assert notebook.resolve_size(None) == "full"
    assert notebook.resolve_size("small") == "small"


def test_shortfall_reads_hbm_and_host_memory():
    assert notebook.shortfall(hbm_bytes=16 * 2**30, host_bytes=40 * 2**30) is None
    assert "host memory" in notebook.shortfall(hbm_bytes=None, host_bytes=8 * 2**30)
    assert "HBM" in notebook.shortfall(hbm_bytes=2**30, host_bytes=64 * 2**30)


def test_timed_figures_off_a_tpu_go_beside_the_chips():
    cfg = notebook.setup("small")
    assert cfg.timed_figure("01_x") == cfg.figures / "cpu" / "01_x.png"
    assert cfg.record("01_naive_masked_attention", "times", ms=1.0) is None  # nothing recorded off a TPU
    assert "interpret mode" in cfg.where


def test_compile_subprocesses_on_a_tpu_host_never_open_the_chip(monkeypatch):
    from stlib.analysis import dump

    monkeypatch.setattr(dump, "host_has_tpu", lambda: True)
    assert dump.subprocess_env()["JAX_PLATFORMS"] == "cpu"
    monkeypatch.setattr(dump, "host_has_tpu", lambda: False)
    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    assert "JAX_PLATFORMS" not in dump.subprocess_env()


def test_time_side_by_side_times_prints_and_draws_beside_the_chips(capsys):
    from stlib import bench

    cfg = notebook.setup("small")
    x = jnp.ones((64, 64))
    compiled = {
        name: bench.compile_function(fn, x)
        for name, fn in (("twice", lambda a: a * 2), ("matmul", lambda a: a @ a))
    }
    timings = notebook.time_side_by_side(
        cfg,
        compiled,
        x,
        rounds=1,
        trials=1,
        title="demo",
        figure="99_demo",
        notebook="99_demo",
        what="demo",
        baseline="twice",
    )
    assert set(timings) == {"twice", "matmul"}
    printed = capsys.readouterr().out
    assert "each median over twice's" in printed and "interpret mode" in printed
    assert (cfg.figures / "cpu" / "99_demo.png").is_file() and not cfg.figure("99_demo").exists()
