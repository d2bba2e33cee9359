"""The static TPU time estimate (stlib.analysis.kernel_estimate): the libtpu pin, then self-consistency of
estimates from real deviceless compilations for v6e at small shapes (libtpu's dump, no TPU
needed)."""

from __future__ import annotations

import pytest

from stlib.analysis import PINNED_LIBTPU, ScheduleFormatError, cache_dir, dump, estimate


def test_libtpu_version_is_pinned(monkeypatch):
    monkeypatch.setattr(dump, "libtpu_version", lambda: "0.0.99")
    with pytest.raises(ScheduleFormatError, match="0.0.99"):
        estimate("pallas_dense", "none", "v6e", length=1024, num_heads=1, clock=1e9)


# --------------------------------------------------------------------------------------------
# real compilations (deviceless, v6e) at small shapes: 2 heads x 8,192 tokens x 128, bf16

SMALL = {"length": 8192, "clock": 1e9}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    import os

    old = os.environ.get("STLIB_CACHE_DIR")
    os.environ["STLIB_CACHE_DIR"] = str(tmp_path_factory.mktemp("estimate-cache"))
    yield
    if old is None:
        del os.environ["STLIB_CACHE_DIR"]
    else:
        os.environ["STLIB_CACHE_DIR"] = old


@pytest.mark.tpu_compile
def test_estimate_scales_with_grid_steps(cache):
    small = estimate("pallas_dense", "none", "v6e", num_heads=2, **SMALL)
    large = estimate("pallas_dense", "none", "v6e", num_heads=8, **SMALL)
    assert large.kernels[0].grid_steps == 4 * small.kernels[0].grid_steps
    assert large.cycles / small.cycles == pytest.approx(4.0, rel=0.05)
    assert large.seconds / small.seconds == pytest.approx(4.0, rel=0.05)


@pytest.mark.tpu_compile
def test_skipped_masked_and_full_steps(cache):
    est = estimate("pallas_block_sparse", "band (width 1500)", "v6e", num_heads=2, **SMALL)
    paths = est.path_bundles()
    # a skipped step pays only the grid-loop overhead: measured 0.12 of a FULL tile with the
    # lane-replicated softmax statistics (0.06 when the tile itself was twice as expensive)
    assert paths["skipped step"] < 0.2 * paths["FULL tile"]
    assert paths["masked tile"] > paths["FULL tile"]
    counts = {p: v["count"] for p, v in est.kernels[0].breakdown.items()}
    assert counts["compute_full"] + counts["compute_masked"] < counts["step"]  # some steps skipped
    assert est.kernels[0].dma_bytes > 0 or est.kernels[0].memory_seconds == 0
    tile = estimate("pallas_tile", "band (width 1500)", "v6e", num_heads=2, **SMALL)
    by_pass = {k.kernel.split(".")[0].removeprefix("stlib_tile_"): k.breakdown for k in tile.kernels}
    assert by_pass["masked"]["compute_masked"]["bundles"] > by_pass["full"]["compute_full"]["bundles"]


@pytest.mark.tpu_compile
def test_estimate_is_deterministic_and_cached(cache):
    first = estimate("pallas_tile", "band (width 1500)", "v6e", num_heads=2, options={"form": "flat"},
                       use_cache=False, **SMALL)
    second = estimate("pallas_tile", "band (width 1500)", "v6e", num_heads=2, options={"form": "flat"}, **SMALL)
    assert first.cycles == second.cycles and first.kernels == second.kernels
    assert any(cache_dir().rglob("*.json"))
    record = second.as_record()
    assert record["estimate_static"] and record["estimate_libtpu"] == PINNED_LIBTPU
    assert "static estimate" in record["estimate_method"] and "STATIC ESTIMATE" in str(second)


def test_chips_without_a_schedule_reader_are_refused_by_name():
    """TPU7x compiles (tests/test_tpu_compile.py) but its dump writes branches in another form:
    the estimate refuses it before compiling instead of guessing."""
    with pytest.raises(ValueError, match="chip='tpu7x'.*covers"):
        estimate("pallas_dense", "none", "tpu7x")


def test_options_are_checked_against_the_implementation():
    with pytest.raises(TypeError, match="no options"):
        estimate("pallas_dense", "none", "v6e", options={"form": "flat"})
