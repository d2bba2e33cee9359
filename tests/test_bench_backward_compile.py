"""The backward's compile matrix (stlib/bench/backward_compile.py): which cases it compiles, the
masks it builds for them, and its table. The compiles themselves run in the script, not here
(tests/test_tpu_compile.py compiles one case-study backward per chip)."""

from __future__ import annotations

from stlib import registry
from stlib.bench import backward_compile as bc
from stlib.configs import CASE_STUDY
from stlib.device import CHIPS
from stlib.geometry import VideoGrid


def test_the_case_study_matrix_is_every_kernel_mask_and_chip_with_splash_fused_and_split():
    cases = bc.cases()
    kernels = bc.trainable_kernels()
    assert {c[0] for c in cases} == set(kernels) and {c[2] for c in cases} == set(CHIPS)
    assert all(video is None for *_, video in cases)
    for impl in kernels:
        variants = 2 if registry.get(impl).baseline else 1
        assert sum(c[0] == impl for c in cases) == variants * len(bc.MASKS) * len(CHIPS)


def test_long_videos_are_the_tile_kernels_on_the_svg_mix():
    cases = bc.cases(chips=["v6e"], long_videos=True)
    tile_kernels = [k for k in bc.trainable_kernels() if not registry.get(k).baseline]
    assert sorted(cases) == sorted(
        (k, bc.SVG_MIX, "v6e", None, v) for k in tile_kernels for v in bc.LONG_VIDEOS
    )


def test_the_svg_mix_is_built_on_the_long_video_grid():
    grid = VideoGrid(*bc.LONG_VIDEOS["1080p"])
    mask, orders = bc.raster_mask_and_orders(bc.SVG_MIX, grid)
    assert grid.num_tokens == 171_360 and mask.length == grid.num_tokens
    assert mask.num_heads == len(orders) == CASE_STUDY.num_heads
    assert {o.length for o in orders} == {grid.num_tokens}


def test_the_table_names_the_video_and_the_reason_a_case_failed():
    records = [
        {
            "impl": "pallas_tile",
            "mask": bc.SVG_MIX,
            "chip": "v6e",
            "options": {},
            "shape": [10, 171360, 128],
            "video": "1080p",
            "compiled": True,
            "compile_s": 412.0,
            "temp_size_in_bytes": 3e9,
            "dq_kernels": 0,
            "dkv_kernels": 0,
            "fused_kernels": 2,
        },
        {
            "impl": "splash",
            "mask": "full",
            "chip": "v5e",
            "options": {"fused_backward": True},
            "shape": [10, 75600, 128],
            "compiled": False,
            "error": "ValueError: a | b",
        },
    ]
    lines = bc.format_table(records).splitlines()
    assert lines[2].startswith(
        "| v5e | splash | fused_backward=True | full | 75,600 | no: ValueError: a \\| b"
    )
    assert "| 171,360 (1080p) | yes | 412 | 3.00 | 0 / 0 / 2 |" in lines[3]
