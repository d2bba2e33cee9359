"""The plotting helpers added for the notebooks draw and save without error (smoke tests)."""

import matplotlib
import pytest

from stlib import plotting

matplotlib.use("Agg")


@pytest.fixture(autouse=True)
def _close_figures():
    """Each test's figures closed after it (pyplot warns past 20 open figures)."""
    yield
    import matplotlib.pyplot as plt

    plt.close("all")


def test_relative_bars(tmp_path):
    rows = {
        "FULL": {"pairs": 10.0, "tiles": 4, "time": 2.0},
        "PARTIAL": {"pairs": 5.0, "tiles": 4, "time": 2.1},
    }
    fig = plotting.relative_bars(rows, "FULL", "t")
    assert plotting.save(fig, tmp_path / "r.png").stat().st_size > 0


def test_tile_size_tradeoff(tmp_path):
    panels = {
        "work": ("eff", {"a": [0.9, 0.8], "b": [0.5, 0.4]}, False),
        "steps": ("steps", {"a": [100, 10], "b": [200, 20]}, True),
    }
    fig = plotting.tile_size_tradeoff(
        ["128 x 128", "256 x 256"], panels, "t", limits={"steps": (50, "limit")}
    )
    assert len(fig.axes) == 2
    assert plotting.save(fig, tmp_path / "t.png").stat().st_size > 0


def test_estimate_speedups(tmp_path):
    fig = plotting.estimate_speedups([{"label": "a", "speedup": 2.0, "ideal": 2.5}], "t")
    assert plotting.save(fig, tmp_path / "e.png").stat().st_size > 0


def test_estimate_speedups_over_each_kernels_own_dense_estimate_too(tmp_path):
    rows = [
        {"label": "a", "speedup": 3.0, "own": 2.2, "ideal": 2.5},
        {"label": "b", "speedup": 1.5, "own": 1.4, "ideal": 2.5},
    ]
    fig = plotting.estimate_speedups(rows, "t")
    ax = fig.axes[0]
    widths = sorted(round(p.get_width(), 2) for p in ax.patches)
    assert widths == [1.4, 1.5, 2.2, 3.0]  # two bars per row
    assert {t.get_text() for t in ax.get_legend().get_texts()} == {
        "static v6e estimate over dense Splash",
        "static v6e estimate over the same kernel's own dense estimate",
        "ideal 1 / density",
    }


def test_timing_lines_draw_whiskers_from_low_to_high(tmp_path):
    fig = plotting.timing_lines({"a": [(0.5, 10.0, 8.0, 13.0), (1.0, 20.0, 19.0, 22.0)]}, "t", "x")
    (bars,) = [c for c in fig.axes[0].containers if hasattr(c, "lines") and c.lines[2]]
    segments = bars.lines[2][0].get_segments()
    assert [tuple(seg[:, 1]) for seg in segments] == [(8.0, 13.0), (19.0, 22.0)]


def test_work_bars_step_lines_and_legend_outside(tmp_path):
    work = [{"label": "a", "executed_flops": 2e12, "useful_flops": 1e12, "grid_steps": 10}]
    fig = plotting.work_bars(work, "t", step_lines={"full grid": 20})
    assert fig.axes[1].get_legend() is not None
    records = [{"label": "a", "density": d, "median_ms": 1 / d} for d in (0.2, 0.5)]
    fig = plotting.speedup_vs_density(records, 1.0, "t", legend_outside=True)
    assert plotting.save(fig, tmp_path / "s.png").stat().st_size > 0


def test_block_sweep_draws_the_sweeps_figure_rows(tmp_path):
    from stlib.bench import block_sweep

    name, base = block_sweep.NAME, block_sweep.BASELINE

    def record(chip, family, impl, blocks, cycles=None):
        bq, bkv, chunk = blocks
        r = {"chip": chip, "family": family, "impl": impl, "block_q": bq, "block_kv": bkv}
        return {**r, "block_kv_compute": chunk, **({} if cycles is None else {"cycles": cycles})}

    records = [
        record("v6e", "dense", name, (512, 1024, 512), 80),
        record("v6e", "band 0.25", name, (512, 1024, 512), 30),
        record("v6e", "band 0.25", name, (8192, 8192, 512)),  # refused: no estimate, left out
        record("v6e", "dense", base, (512, 1024, None), 120),
        record("v6e", "dense", base, (1024, 2048, None), 100),
        record("v5e", "dense", name, (512, 1024, 512), 50),  # no baseline on v5e: no ratio
    ]
    rows = block_sweep.figure_rows(records, block_sweep.TARGETS["v6e"])
    assert rows["chips"] == ["v6e"] and list(rows["panels"]) == ["dense", "band 0.25", "dense Splash"]
    assert rows["panels"]["band 0.25"] == [{"chip": "v6e", "blocks": "512x1024/512", "ratio": 0.3}]
    assert [r["blocks"] for r in rows["panels"]["dense Splash"]] == ["512x1024", "1024x2048"]
    assert rows["targets"]["dense"] == (0.69, "target 0.69 (v6e)") and "sliding tile" not in rows["targets"]
    fig = plotting.block_sweep(title="t", **rows)
    assert len(fig.axes) == 3
    assert plotting.save(fig, tmp_path / "b.png").stat().st_size > 0


def test_every_exported_figure_is_reachable_and_no_folder_is_fixed_at_import():
    assert all(callable(getattr(plotting, n)) for n in plotting.__all__ if n.islower())
    assert not hasattr(plotting, "FIGURES_DIR")  # stlib.paths.figures_dir() says where figures go


def test_ring_blocks_names_each_hop_and_each_skipped_block(tmp_path):
    import numpy as np

    attended = np.eye(4, dtype=bool) | np.eye(4, k=1, dtype=bool)
    fig = plotting.ring_blocks({"band": (attended, [0, 3])}, "t")
    (ax,) = fig.axes
    labels = [t.get_text() for t in ax.texts]
    assert labels.count("skip") == 16 - 7 and labels.count("hop 0") == 4 and labels.count("hop 3") == 3
    assert "issued [0, 3], skipped [1, 2]" in ax.get_title()
    assert plotting.save(fig, tmp_path / "ring.png").stat().st_size > 0


def test_a_tile_map_of_one_head_counts_and_titles_that_head_alone():
    import stlib
    from stlib import masks

    grid = stlib.VideoGrid(4, 8, 16)
    layout = stlib.block_layout(masks.per_head([masks.spatial(grid), masks.full(grid.num_tokens)]), 128, 128)
    fig = plotting.occupancy_heatmap(layout, "head 0", head=0)
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert legend == ["EMPTY (12)", "PARTIAL (0)", "FULL (4)"]  # head 0: four frames on the diagonal
    assert "density 0.250" in fig._suptitle.get_text()  # head 0's, not the two heads' mean (0.625)


def test_same_mask_bars_draw_each_direction_each_kernel_and_each_floor(tmp_path):
    """A panel per direction; per mask a bar per kernel measured (Splash's labelled with its blocks,
    a mask Splash lacks drawn with the tile kernel alone) and the floor as a tick."""

    def row(mask, direction, tile, splash, floor):
        return {"mask": mask, "direction": direction, "tile_ms": tile, "splash_ms": splash,
                "splash_blocks": (512, 1024) if splash else None, "floor_ms": floor}  # fmt: skip

    rows = [row("band", "forward", 48.7, 52.3, 37.5), row("svg", "forward", 1759.0, None, 43.1),
            row("band", "train", 160.6, 217.1, 131.3)]  # fmt: skip
    fig = plotting.same_mask_bars(rows, "t")
    forward, train = fig.axes
    assert (forward.get_title(), train.get_title()) == ("forward", "train")
    assert len(forward.patches) == 3 and len(train.patches) == 2  # svg: the tile kernel alone
    assert {t.get_text() for t in forward.texts} == {" 48.7", " 52.3 (512 x 1024)", " 1759.0"}
    assert len(forward.lines) == 2 and forward.get_xscale() == "log"
    assert plotting.save(fig, tmp_path / "same.png").stat().st_size > 0
