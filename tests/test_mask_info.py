"""The mask-info tables and their packed words: what every stlib kernel reads about its mask."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from stlib.kernels import mask_info
from stlib.kernels.mask_info import Word
from stlib.layout import flat_steps
from stlib.passes import MaskPlan, MaskPlanMode

WORDS = {
    "block-sparse step": mask_info.BLOCK_SPARSE_STEP,
    "lane-dense step": mask_info.LANE_DENSE_STEP,
    "flat head and q": mask_info.FLAT_HEAD_Q,
    "flat kv and flags": mask_info.FLAT_KV_FLAGS,
}


def _values(word: Word, rng, size: int = 64) -> dict[str, np.ndarray]:
    # top fields kept below 2**20 (kv tiles, heads): a word's top bits hold tile indices
    return {f.name: rng.integers(0, min(f.limit, 1 << 20), size) for f in word.fields}


@pytest.mark.parametrize("name", WORDS)
def test_every_field_reads_back_what_was_packed_on_the_host_and_in_a_trace(name):
    word, rng = WORDS[name], np.random.default_rng(0)
    values = _values(word, rng)
    packed = word.pack(**values)
    assert packed.dtype == np.int32
    traced = jax.jit(lambda w: [f.read(w) for f in word.fields])(jnp.asarray(packed))
    for f, got in zip(word.fields, traced, strict=True):
        np.testing.assert_array_equal(f.read(packed), values[f.name], err_msg=f.name)
        np.testing.assert_array_equal(np.asarray(got), values[f.name], err_msg=f.name)


def test_flags_are_tested_bit_by_bit():
    word = mask_info.FLAT_KV_FLAGS
    packed = word.pack(first=np.array([1, 0, 0]), last=np.array([0, 1, 0]), active=np.array([0, 1, 1]), kv=7)
    assert word.first.is_set(packed).tolist() == [True, False, False]
    assert word.last.is_set(packed).tolist() == [False, True, False]
    assert word.active.is_set(packed).tolist() == [False, True, True]
    assert word.kv.read(packed).tolist() == [7, 7, 7]
    with pytest.raises(ValueError, match="'kv' is None bits wide, not a flag"):
        word.kv.is_set(packed)


def test_bad_words_and_values_are_refused_by_name():
    with pytest.raises(ValueError, match="'kv' takes the rest of the word, so it must come last"):
        Word(kv=None, code=8)
    with pytest.raises(ValueError, match="fields of 32 bits do not fit an int32"):
        Word(a=16, b=16)
    with pytest.raises(ValueError, match=r"q ranges over 0\.\.65536, outside the 65,536 values"):
        mask_info.FLAT_HEAD_Q.pack(q=np.array([0, 65536]), head=0)
    with pytest.raises(ValueError, match="code ranges over -1..3"):
        mask_info.LANE_DENSE_STEP.pack(code=np.array([-1, 3]), kv=0)
    with pytest.raises(ValueError, match=r"packs \['code', 'kv'\], got \['code'\]"):
        mask_info.LANE_DENSE_STEP.pack(code=1)
    with pytest.raises(AttributeError):
        mask_info.LANE_DENSE_STEP.fetch_kv  # noqa: B018 - the block-sparse word's field


def _selected(seed: int, heads: int = 2, rows: int = 5, cols: int = 7) -> np.ndarray:
    selected = np.random.default_rng(seed).random((heads, rows, cols)) < 0.4
    selected[0, 1] = False  # a row with no tile
    return selected


def test_flat_tables_decode_to_the_layouts_steps():
    selected = _selected(1)
    plan = MaskPlan(MaskPlanMode.PREFIX, None, 7 * 128, kv_valid=np.full(7, 128))
    (head_q, kv_flags, kv_valid), steps = mask_info.flat_step_tables(selected, plan)
    expected = flat_steps(selected)
    assert steps == expected["step_q"].size
    hq, kf = mask_info.FLAT_HEAD_Q, mask_info.FLAT_KV_FLAGS
    np.testing.assert_array_equal(hq.head.read(head_q), expected["step_head"])
    np.testing.assert_array_equal(hq.q.read(head_q), expected["step_q"])
    np.testing.assert_array_equal(kf.kv.read(kv_flags), expected["step_kv"])
    for flag in ("first", "last", "active"):
        np.testing.assert_array_equal(getattr(kf, flag).is_set(kv_flags), expected[f"step_{flag}"] > 0)
    np.testing.assert_array_equal(kv_valid, 128)


@pytest.mark.parametrize("transposed", [False, True])
def test_grid_tables_list_every_worked_rows_tiles(transposed):
    """Decoding the tables (the forward's rows, or transposed: per kv tile its q tiles) gives back
    exactly the selected tiles, with the int8 mask-table index carried along."""
    selected = _selected(2)
    index = np.where(selected, np.arange(selected.size).reshape(selected.shape) % 5, -1).astype(np.int32)
    plan = MaskPlan(MaskPlanMode.TABLE, None, 0, table=np.zeros((5, 32, 128), np.int8), index=index)
    tables, extent, n_rows = mask_info.grid_tables(selected, plan, num_heads=2, transposed=transposed)
    head, row, slot, tiles, counts, mask_index = tables
    want = selected.transpose(0, 2, 1) if transposed else selected
    want_index = index.transpose(0, 2, 1) if transposed else index
    assert n_rows == int((want.sum(axis=2) > 0).sum()) and extent == want.sum(axis=2).max()
    seen = np.zeros_like(want)
    for h, r, s in zip(head, row, slot, strict=True):
        assert s == h * want.shape[1] + r
        listed = tiles[s * extent : s * extent + counts[s]]
        seen[h, r, listed] = True
        np.testing.assert_array_equal(
            mask_index[s * extent : s * extent + counts[s]], want_index[h, r, listed]
        )
    np.testing.assert_array_equal(seen, want)


def test_a_head_uniform_layout_works_every_head_on_shared_rows():
    selected = _selected(3, heads=1)
    head, row, slot = mask_info.worked_rows(selected.sum(axis=2), num_heads=3)
    active = np.flatnonzero(selected[0].any(axis=1))
    assert head.tolist() == [h for h in range(3) for _ in active]
    assert row.tolist() == slot.tolist() == active.tolist() * 3
