"""``python -m stlib.check``: kernels pass at a tiny size, forward and gradients against the sampled
reference; a wrong gradient fails and a raising implementation is an error (the run goes on, the exit
status says so); refusals are listed, not failed; records go under STLIB_HOME, never the checkout."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from types import SimpleNamespace

import jax.numpy as jnp
import pytest

from stlib import check, checks, masks, paths, registry
from stlib.configs import Workload
from stlib.geometry import VideoGrid
from stlib.registry import Role

#: 2 heads x 512 tokens: two frames of 8 x 32, 3-D tiles of 1 x 8 x 16 (a tiled order of 4 tiles).
TINY = Workload(
    "tiny", VideoGrid(2, 8, 32), num_heads=2, head_dim=128, dtype=jnp.float32, sta_tile=(1, 8, 16)
)
ROWS = 48


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_kernel_and_the_reference_pass_and_the_records_go_under_stlib_home(capsys):
    checkout = paths.REPO / "data" / check.RECORDS
    before = checkout.read_bytes() if checkout.exists() else None
    written = Path(os.environ["STLIB_HOME"]) / "data" / check.RECORDS
    earlier = len(_records(written))
    impls = [registry.by_role(Role.BEST_TILE).name, registry.by_role(Role.REFERENCE).name]
    results = check.run_check("small", impls, ["sliding tile,"], workload=TINY, rows=ROWS)
    assert [(r.status, r.mask) for r in results] == [("PASSED", "sliding tile, 3-D tiled order")] * 2
    for result in results:
        assert set(result.errors) == {"fwd", "fwd (train)", "dq", "dk", "dv"} and not result.grad
    out = capsys.readouterr().out
    assert f"[check 2/2] PASSED {impls[1]} (sliding tile, 3-D tiled order) fwd" in out
    records = _records(written)[earlier:]
    assert [r["status"] for r in records] == ["PASSED", "PASSED"]
    assert {"backend", "device_kind", "jax", "run", "errors", "tolerance"} <= set(records[0])
    assert (checkout.read_bytes() if checkout.exists() else None) == before


def test_a_wrong_gradient_fails(monkeypatch, tmp_path):
    """The tile kernel with dk 10% too large: dk fails, the forward and the other gradients pass."""
    tile = registry.by_role(Role.TILE)

    def backward(residuals, do, mask, **call):
        dq, dk, dv = tile.backward.backward(residuals, do, mask, **call)
        return dq, dk * 1.1, dv

    wrong = dataclasses.replace(
        tile,
        name="wrong_dk",
        roles=frozenset(),
        backward=dataclasses.replace(tile.backward, backward=backward),
    )
    monkeypatch.setitem(registry.IMPLEMENTATIONS, wrong.name, wrong)
    (result,) = check.run_check(
        "small", [wrong.name], ["band"], workload=TINY, rows=ROWS, out=tmp_path / "check.jsonl"
    )
    assert result.status == "FAILED" and not result.ok
    assert result.errors["dk"] > 0.05
    assert max(v for k, v in result.errors.items() if k != "dk") <= result.tolerance
    assert check.summary([result]).splitlines()[1].split()[-2:] == ["FAILED", "1e-01"]


def test_a_case_that_raises_is_an_error_the_run_goes_on_and_the_exit_status_is_1(
    monkeypatch, tmp_path, capsys
):
    def forward(q, k, v, mask, **call):
        raise RuntimeError("broken on purpose\nsecond line")

    reference = registry.by_role(Role.REFERENCE)
    broken = dataclasses.replace(reference, name="broken", roles=frozenset(), forward=forward)
    monkeypatch.setitem(registry.IMPLEMENTATIONS, broken.name, broken)
    out = tmp_path / "check.jsonl"
    status = check.main(
        ["--size", "small", "--impl", "broken", reference.name, "--mask", "band", "--rows", "24"]
        + ["--out", str(out)]
    )
    assert status == 1
    printed = capsys.readouterr().out
    assert "error broken (band (density 0.25)): RuntimeError: broken on purpose" in printed
    assert f"PASSED {reference.name} (band (density 0.25))" in printed
    assert "1 PASSED, 0 FAILED, 0 refused, 1 error of 2 cases" in printed
    assert [r["status"] for r in _records(out)] == ["error", "PASSED"]


def test_refusals_are_listed_not_failed(monkeypatch, tmp_path):
    reference, tile = registry.by_role(Role.REFERENCE), registry.by_role(Role.TILE)
    length = reference.capabilities.max_length + 8
    assert "16384" in check.refusal(reference, masks.band(length, 64), 1)
    interpret = check.refusal(tile, masks.band(75_600, 64), 10)  # the CPU: interpret mode
    assert "interpret mode" in interpret and "75,600 tokens" in interpret
    monkeypatch.setattr(check, "GRADIENT_RESIDUAL_LIMIT", 1000)  # the reference's gradient keeps more
    (result,) = check.run_check(
        "small", [reference.name], ["full"], workload=TINY, rows=ROWS, out=tmp_path / "check.jsonl"
    )
    assert result.status == "PASSED" and set(result.errors) == {"fwd"} and "GiB of residuals" in result.grad


def test_masks_are_named_exactly_or_by_a_unique_prefix():
    known = ["full", "band (density 0.25)", "sliding tile 3x8x16, window 3", "sliding tile, 3-D tiled order"]
    assert check.pick(None, known, "mask") == known == check.pick(["all"], known, "mask")
    assert check.pick(["Band", "full"], known, "mask") == ["band (density 0.25)", "full"]
    with pytest.raises(ValueError, match="names 2 of them"):
        check.pick(["sliding"], known, "mask")
    with pytest.raises(ValueError, match="is unknown"):
        check.pick(["causal"], known, "mask")


def test_errors_are_relative_to_the_largest_reference_value():
    """Outputs and gradients at the case-study size are far below one: an all-zero answer is a 100%
    error, whatever the scale, where an absolute error would pass it."""
    want = jnp.array([0.02, -0.01, 0.0])
    assert checks.scaled_error(jnp.zeros(3), want) == pytest.approx(1.0)
    assert checks.scaled_error(want * 1.001, want) == pytest.approx(1e-3, rel=1e-2)
    assert checks.scaled_error(jnp.zeros(3), jnp.zeros(3)) == 0.0


def test_a_program_that_does_not_fit_the_device_is_not_run():
    """At the case study Splash's fused backward needs 15.64 GiB beside its inputs (compiled for a
    v5e): more than a v5e's 15.7 GiB less what is in use and the margin."""
    gib = 1 << 30
    analysis = SimpleNamespace(
        argument_size_in_bytes=int(0.72 * gib),
        output_size_in_bytes=int(0.54 * gib),
        temp_size_in_bytes=int(14.45 * gib),
    )
    compiled = SimpleNamespace(memory_analysis=lambda: analysis)
    args = [SimpleNamespace(nbytes=int(0.018 * gib))] * 4
    stats = {"bytes_limit": int(15.7 * gib), "bytes_in_use": int(0.2 * gib)}
    assert "needs 15.64 GiB of the device's memory, 15.50 GiB free" == check.memory_shortfall(
        compiled, args, stats
    )
    assert check.memory_shortfall(compiled, args, {**stats, "bytes_limit": 17 * gib}) is None
    assert check.memory_shortfall(compiled, args, {}) is None  # a CPU: no limit known


def test_a_compile_that_runs_out_of_device_memory_is_a_refusal_not_an_error():
    """A TPU refuses at compile time a program past its HBM (on a v5e, Splash's fused backward on the
    3-D tiled sliding tile at 384 x 384 asked for 41.92 GB): the check reports it as not run. Any
    other failure is raised, to be reported as an error."""
    x = jnp.ones(4)

    def too_big(x):
        raise RuntimeError(
            "RESOURCE_EXHAUSTED: Ran out of memory on HBM, (41.92G) exceeds available HBM (15.75G)."
        )

    def broken(x):
        raise RuntimeError("INTERNAL: something else")

    compiled, why_not = check._compile_within_memory(too_big, (x,))
    assert compiled is None and why_not.startswith(
        "does not fit the device's memory (RuntimeError: RESOURCE_EXHAUSTED"
    )
    with pytest.raises(RuntimeError, match="INTERNAL"):
        check._compile_within_memory(broken, (x,))
    compiled, why_not = check._compile_within_memory(lambda x: 2 * x, (x,))
    assert why_not is None and float(compiled(x)[0]) == 2.0
