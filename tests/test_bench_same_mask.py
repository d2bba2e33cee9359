"""``stlib.bench.same_mask``: the tile kernel and Splash on the same masks. What runs on a CPU: the
cases, the masks and their allowed pairs, the floor, one call measured in interpret mode, failures
recorded, the table of the fastest blocks; ``run`` itself refuses off a TPU."""

from __future__ import annotations

import json

import pytest

from stlib import registry
from stlib.bench import same_mask
from stlib.configs import SMALL_CPU
from stlib.registry import Role, by_role

SPLIT = (("fused_backward", False),)


def test_cases_pair_the_tile_kernel_with_splash_at_every_block_size():
    cases = same_mask.cases(heads=(10, 40), mask_names=("frame causal",))
    tile, splash = by_role(Role.BEST_TILE).name, registry.baseline().name
    for heads in (10, 40):
        mine = [c for c in cases if c.heads == heads]
        assert [c.impl for c in mine] == [tile] + [splash] * len(same_mask.SPLASH_BLOCKS)
        assert mine[0].blocks is None and [c.blocks for c in mine[1:]] == list(same_mask.SPLASH_BLOCKS)
        assert all(c.options == SPLIT for c in mine[1:])  # Splash's fused backward exceeds a v5e's HBM


def test_the_per_head_mix_has_the_heads_asked_for_and_unknown_names_are_refused():
    assert same_mask.catalogue_mask("per-head SVG", 40).num_heads == 40
    assert same_mask.catalogue_mask("per-head SVG", 10).num_heads == 10
    with pytest.raises(KeyError, match="unknown mask 'nope'"):
        same_mask.catalogue_mask("nope", 10)


@pytest.mark.parametrize("name", same_mask.MASKS)
def test_allowed_pairs_count_every_head(name):
    mask = same_mask.catalogue_mask(name, 2, SMALL_CPU)
    dense = mask.to_dense()
    expected = int(dense.sum()) * (2 if dense.ndim == 2 else 1)
    assert same_mask.allowed_pairs(mask, 2) == expected > 0


def test_the_floor_of_a_training_step_is_its_flops_over_the_forward():
    forward = same_mask.floor_ms(1000, 128, 1e12, "forward")
    assert forward == pytest.approx(4 * 1000 * 128 / 1e12 * 1e3)
    assert same_mask.floor_ms(1000, 128, 1e12, "train") == pytest.approx(same_mask.TRAIN_FLOPS * forward)


def test_splash_on_the_sliding_tile_is_measured_in_interpret_mode():
    case = same_mask.Case(2, "sliding tile, 3-D tiled order", registry.baseline().name, (128, 128), SPLIT)
    (record,) = same_mask.measure_case(case, 1, ("forward",), workload=SMALL_CPU, interpret=True)
    mask = same_mask.catalogue_mask(case.mask, 2, SMALL_CPU)
    assert record["median_ms"] > 0 and "error" not in record
    assert record["blocks"] == {"block_q": 128, "block_kv": 128}
    assert record["pairs"] == same_mask.allowed_pairs(mask, 2) and record["length"] == mask.length
    assert record["chip"] is None and "floor_ms" not in record  # no chip: no floor


def test_a_call_that_cannot_run_is_recorded_with_its_error():
    case = same_mask.Case(2, "frame causal", registry.baseline().name, (100, 100), SPLIT)
    records = same_mask.measure_case(case, 1, workload=SMALL_CPU, interpret=True)
    assert [r["direction"] for r in records] == list(same_mask.DIRECTIONS)
    assert all("multiple of 128" in r["error"] and "median_ms" not in r for r in records)


def test_run_refuses_off_a_tpu(tmp_path):
    with pytest.raises(RuntimeError, match="on a TPU"):
        same_mask.run(out_dir=tmp_path)
    assert not list(tmp_path.iterdir())


def test_the_table_takes_splash_at_its_fastest_blocks_and_skips_failures():
    splash, tile = registry.baseline().name, by_role(Role.BEST_TILE).name
    base = {"chip": "v5e", "heads": 10, "mask": "frame causal", "direction": "train", "floor_ms": 40.0}
    records = [
        {**base, "impl": tile, "median_ms": 80.0, "blocks": {"block_q": 2048, "block_kv": 2048}},
        {**base, "impl": splash, "median_ms": 200.0, "blocks": {"block_q": 512, "block_kv": 1024}},
        {**base, "impl": splash, "median_ms": 160.0, "blocks": {"block_q": 1024, "block_kv": 2048}},
        {
            **base,
            "impl": splash,
            "error": "RESOURCE_EXHAUSTED: VMEM",
            "blocks": {"block_q": 768, "block_kv": 768},
        },
    ]
    (row,) = same_mask.best_rows(records)
    assert (row["splash_ms"], row["splash_blocks"]) == (160.0, (1024, 2048))
    assert row["tile / splash"] == pytest.approx(0.5) and row["tile share"] == pytest.approx(0.5)
    table = same_mask.format_table([row])
    assert (
        "| v5e | 10 | frame causal | train | 80.00 | 160.00 (1024 x 2048) | 0.50 | 40.00 | 50%, 25% |"
        in table
    )


def test_read_keeps_the_latest_record_of_each_call(tmp_path):
    path = tmp_path / same_mask.RECORDS
    old = {"chip": "v5e", "heads": 10, "mask": "m", "impl": "splash", "requested_blocks": [384, 384]}
    lines = [
        {**old, "direction": "forward", "median_ms": 9.0},
        {**old, "direction": "forward", "median_ms": 7.0},
    ]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    (record,) = same_mask.read(path)
    assert record["median_ms"] == 7.0


def test_the_routed_svg_mix_runs_its_plan_on_the_tile_kernel_and_its_mask_on_splash():
    """ "per-head SVG, routed": the tile kernel runs the plan's own layout (its blocks recorded), Splash
    the plan's mask in raster order; both count the plan's allowed pairs."""
    plan = same_mask.routed_plan(2, SMALL_CPU, interpret=True)
    tile = registry.by_role(registry.Role.BEST_TILE).name
    for case in (same_mask.Case(2, same_mask.ROUTED, tile),
                 same_mask.Case(2, same_mask.ROUTED, registry.baseline().name, (128, 128), SPLIT)):  # fmt: skip
        (record,) = same_mask.measure_case(case, 1, ("forward",), workload=SMALL_CPU, interpret=True)
        assert "error" not in record and record["median_ms"] > 0, record
        assert record["pairs"] == same_mask.allowed_pairs(plan.mask, 2) == int(plan.mask.to_dense().sum())
        if case.impl == tile:
            assert record["blocks"] == {"block_q": plan.block_q, "block_kv": plan.block_kv}
