"""Every mask builder (stlib/masks/sequence.py, stlib/masks/video.py) against a brute-force per-pair
definition from the spec."""

from __future__ import annotations

import functools

import _brute as bf
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stlib import VideoGrid, masks, tiled_order, token_major_order

FEW = settings(max_examples=20, deadline=None)


def dense(mask):
    out = mask.to_dense()
    assert out.dtype == bool
    return out


# ------------------------------------------------------------------------------------------------
# a catalogue of (mask, brute-force dense) on small grids, shared by several tests below

G_SMALL = (3, 4, 5)  # 60 tokens
G_MED = (4, 6, 7)  # 168 tokens (> 128, so the SVG band widths are not the whole sequence)
G_BAND = (5, 8, 9)  # 360 tokens


def _catalogue():
    s, m = G_SMALL, G_MED
    return {
        "full": (lambda: masks.full(37), lambda: np.ones((37, 37), bool)),
        "band0": (lambda: masks.band(20, 0), lambda: np.eye(20, dtype=bool)),
        "band3": (lambda: masks.band(23, 3), lambda: bf.dense_from_pred(23, lambda q, k: abs(q - k) <= 3)),
        "band_wide": (lambda: masks.band(9, 50), lambda: np.ones((9, 9), bool)),
        "nbhd_333": (lambda: masks.neighborhood(VideoGrid(*m), 3), lambda: bf.neighborhood_dense(m, 3)),
        "nbhd_mixed": (
            lambda: masks.neighborhood(
                VideoGrid(*m), (2, 3, 4), stride=(1, 2, 3), dilation=(2, 1, 1), causal=(True, False, False)
            ),
            lambda: bf.neighborhood_dense(m, (2, 3, 4), (1, 2, 3), (2, 1, 1), (True, False, False)),
        ),
        "nbhd_dilx": (
            lambda: masks.neighborhood(
                VideoGrid(*m), (1, 2, 3), dilation=(1, 2, 2), causal=(False, False, True)
            ),
            lambda: bf.neighborhood_dense(m, (1, 2, 3), 1, (1, 2, 2), (False, False, True)),
        ),
        "sta_ragged": (
            lambda: masks.sliding_tile(VideoGrid(*m), (3, 4, 3), (1, 1, 3)),
            lambda: bf.sliding_tile_dense(m, (3, 4, 3), (1, 1, 3)),
        ),
        "sta_div": (
            lambda: masks.sliding_tile(VideoGrid(3, 6, 6), (1, 2, 2), (3, 1, 3)),
            lambda: bf.sliding_tile_dense((3, 6, 6), (1, 2, 2), (3, 1, 3)),
        ),
        "spatial0": (lambda: masks.spatial(VideoGrid(*s)), lambda: bf.spatial_dense(s, 0)),
        "spatial1_anchor": (
            lambda: masks.spatial(VideoGrid(*m), 1, anchor=True),
            lambda: bf.spatial_dense(m, 1, True),
        ),
        "temporal0": (lambda: masks.temporal(VideoGrid(*s)), lambda: bf.temporal_dense(s, 0)),
        "temporal3_anchor": (
            lambda: masks.temporal(VideoGrid(*m), 3, anchor=True),
            lambda: bf.temporal_dense(m, 3, True),
        ),
        "spatial_band": (
            lambda: masks.spatial_band(VideoGrid(*m), 0.1),
            lambda: bf.spatial_band_dense(m, 0.1),
        ),
        "spatial_band_anchor": (
            lambda: masks.spatial_band(VideoGrid(*G_BAND), 0.6, anchor=True),
            lambda: bf.spatial_band_dense(G_BAND, 0.6, True),
        ),
        "temporal_band": (
            lambda: masks.temporal_band(VideoGrid(*m), 0.2),
            lambda: bf.temporal_band_dense(m, 0.2),
        ),
        "temporal_band_anchor": (
            lambda: masks.temporal_band(VideoGrid(*G_BAND), 0.3, anchor=True),
            lambda: bf.temporal_band_dense(G_BAND, 0.3, True),
        ),
        "radial": (lambda: masks.radial(VideoGrid(8, 2, 5), 9), lambda: bf.radial_dense((8, 2, 5), 9)),
        "radial_nosink": (
            lambda: masks.radial(VideoGrid(*m), 20, sink=False),
            lambda: bf.radial_dense(m, 20, sink=False),
        ),
        "radial_w0": (lambda: masks.radial(VideoGrid(*s), 0), lambda: bf.radial_dense(s, 0)),
        "frame_causal": (lambda: masks.frame_causal(VideoGrid(*s)), lambda: bf.frame_causal_dense(s)),
        "global_on_nbhd": (
            lambda: masks.global_tokens(masks.neighborhood(VideoGrid(*s), (1, 3, 3)), 4),
            lambda: bf.global_tokens_dense(bf.neighborhood_dense(s, (1, 3, 3)), 4),
        ),
        "and": (
            lambda: masks.spatial(VideoGrid(*s), 1) & masks.temporal(VideoGrid(*s), 2),
            lambda: bf.spatial_dense(s, 1) & bf.temporal_dense(s, 2),
        ),
        "or": (
            lambda: masks.neighborhood(VideoGrid(*s), (1, 3, 3)) | masks.frame_causal(VideoGrid(*s)),
            lambda: bf.neighborhood_dense(s, (1, 3, 3)) | bf.frame_causal_dense(s),
        ),
        "or_and_nested": (
            lambda: (masks.band(60, 4) | masks.radial(VideoGrid(*s), 6)) & masks.frame_causal(VideoGrid(*s)),
            lambda: (
                (bf.dense_from_pred(60, lambda q, k: abs(q - k) <= 4) | bf.radial_dense(s, 6))
                & bf.frame_causal_dense(s)
            ),
        ),
    }


CATALOGUE = _catalogue()
NAMES = sorted(CATALOGUE)


@functools.cache
def expected(name):
    return CATALOGUE[name][1]()


def build(name):
    return CATALOGUE[name][0]()


@pytest.mark.parametrize("name", NAMES)
def test_builder_matches_brute_force(name):
    mask = build(name)
    want = expected(name)
    assert mask.shape == want.shape
    assert mask.num_heads is None
    got = dense(mask)
    if not np.array_equal(got, want):
        q, k = np.argwhere(got != want)[0]
        pytest.fail(f"{name}: first mismatch at (q={q}, k={k}): stlib {got[q, k]}, brute force {want[q, k]}")


@pytest.mark.parametrize("name", NAMES)
def test_block_equals_dense_slice(name):
    mask, want = build(name), expected(name)
    length = want.shape[0]
    rng = np.random.default_rng(len(name))
    for _ in range(6):
        q0, q1 = sorted(rng.integers(0, length + 1, 2))
        k0, k1 = sorted(rng.integers(0, length + 1, 2))
        blk = mask.block(int(q0), int(q1), int(k0), int(k1))
        assert blk.shape == (q1 - q0, k1 - k0) and blk.dtype == bool
        np.testing.assert_array_equal(blk, want[q0:q1, k0:k1])
    np.testing.assert_array_equal(mask.block(0, length, length - 1, length), want[:, -1:])


@pytest.mark.parametrize("name", NAMES)
def test_key_intervals_rebuild_rows(name):
    """Intervals are disjoint, inside [0, L), and their union is exactly the row of the mask."""
    mask, want = build(name), expected(name)
    length = want.shape[0]
    rows = np.arange(length)
    starts, ends = mask.key_intervals(rows)
    assert starts.shape == ends.shape and starts.shape[0] == length
    assert np.all(ends >= starts)
    assert np.all((starts >= 0) & (ends <= length))
    rebuilt = np.zeros((length, length), np.int64)
    for r in range(length):
        for s, e in zip(starts[r], ends[r]):
            rebuilt[r, s:e] += 1
    assert rebuilt.max() <= 1, "intervals of a row overlap"
    np.testing.assert_array_equal(rebuilt.astype(bool), want)
    # any subset of rows, in any order
    sub = rows[::-3]
    s2, e2 = mask.key_intervals(sub)
    for i, r in enumerate(sub):
        row = np.zeros(length, bool)
        for s, e in zip(s2[i], e2[i]):
            row[s:e] = True
        np.testing.assert_array_equal(row, want[r])


CLASSED = [name for name in NAMES if build(name).interval_classes(np.arange(1)) is not None]


def test_the_sliding_tiles_have_interval_classes():
    assert CLASSED and all(name.startswith("sta_") for name in CLASSED), CLASSED


@pytest.mark.parametrize("name", CLASSED)
def test_rows_of_one_interval_class_see_the_same_keys(name):
    """Where a mask groups rows into classes (layouts count each class once), every row of a class
    has the same row of the mask."""
    mask, want = build(name), expected(name)
    classes = mask.interval_classes(np.arange(want.shape[0]))
    assert classes.shape == (want.shape[0],) and np.issubdtype(classes.dtype, np.integer)
    assert len(np.unique(classes)) < want.shape[0], "a class of one row each groups nothing"
    for c in np.unique(classes):
        rows = want[classes == c]
        assert (rows == rows[0]).all(), f"class {c} holds rows that see different keys"


@pytest.mark.parametrize("name", NAMES)
def test_allowed_on_index_arrays(name):
    mask, want = build(name), expected(name)
    length = want.shape[0]
    rng = np.random.default_rng(7)
    q = rng.integers(0, length, 50)
    k = rng.integers(0, length, 50)
    np.testing.assert_array_equal(np.asarray(mask.allowed(q, k)), want[q, k])
    np.testing.assert_array_equal(
        np.asarray(mask.allowed(q[:, None], k[None, :])), want[q[:, None], k[None, :]]
    )
    if mask.traceable:  # a kernel evaluates it from jax iotas
        got = mask.allowed(jnp.asarray(q)[:, None], jnp.asarray(k)[None, :])
        np.testing.assert_array_equal(np.asarray(got), want[q[:, None], k[None, :]])


# ------------------------------------------------------------------------------------------------
# neighbourhood attention: the oracle, hand-worked examples, and a property test


def test_oracle_matches_natten_legacy_formula():
    """The group formulation equals NATTEN's original window-start formula (odd kernels, stride 1)."""
    for n in range(1, 14):
        for k in range(1, n + 1, 2):
            for d in range(1, n // k + 1):
                for i in range(n):
                    start = bf.natten_legacy_window_start(i, n, k, d)
                    assert bf.natten_axis_keys(i, n, k, 1, d) == {start + m * d for m in range(k)}, (
                        n,
                        k,
                        d,
                        i,
                    )


def axis_rows(n, **kw):
    """Rows of a 1-D neighbourhood mask on a (1, 1, n) grid, as sorted key lists."""
    ks = kw.pop("kernel_size")
    d = dense(
        masks.neighborhood(
            VideoGrid(1, 1, n),
            (1, 1, ks),
            **{key: (1, 1, v) if not isinstance(v, bool) else (False, False, v) for key, v in kw.items()},
        )
    )
    return [np.flatnonzero(row).tolist() for row in d]


def test_neighborhood_hand_examples():
    rows = axis_rows(7, kernel_size=3)
    assert rows[0] == [0, 1, 2] and rows[3] == [2, 3, 4] and rows[6] == [4, 5, 6]  # shifted, not clipped
    assert all(len(r) == 3 for r in rows)
    rows = axis_rows(7, kernel_size=4)  # even kernel: start = i - 2
    assert rows[3] == [1, 2, 3, 4] and rows[0] == [0, 1, 2, 3] and rows[6] == [3, 4, 5, 6]
    rows = axis_rows(7, kernel_size=3, causal=True)
    assert rows[0] == [0] and rows[1] == [0, 1] and rows[4] == [2, 3, 4]
    rows = axis_rows(7, kernel_size=2, dilation=2)  # groups {0,2,4,6} and {1,3,5}
    assert rows[5] == [3, 5] and rows[0] == [0, 2] and rows[4] == [2, 4] and rows[6] == [4, 6]
    rows = axis_rows(7, kernel_size=3, stride=2)  # blocks {0,1}->leader 1, {2,3}->3, {4,5}->5, {6}->6
    assert rows[0] == rows[1] == [0, 1, 2]
    assert rows[2] == rows[3] == [2, 3, 4]
    assert rows[4] == rows[5] == [4, 5, 6] and rows[6] == [4, 5, 6]
    rows = axis_rows(6, kernel_size=3, stride=3)  # non-overlapping blocks
    assert rows[:3] == [[0, 1, 2]] * 3 and rows[3:] == [[3, 4, 5]] * 3
    rows = axis_rows(7, kernel_size=3, stride=2, causal=True)  # leader 1, 3, 5, 6
    assert rows[0] == rows[1] == [0, 1] and rows[2] == rows[3] == [1, 2, 3] and rows[6] == [4, 5, 6]


@st.composite
def neighborhood_params(draw):
    shape = (draw(st.integers(1, 4)), draw(st.integers(1, 6)), draw(st.integers(1, 7)))
    ks, ss, ds, cs = [], [], [], []
    for n in shape:
        d = draw(st.integers(1, n))
        k = draw(st.integers(1, n // d))
        ks.append(k)
        ds.append(d)
        ss.append(draw(st.integers(1, k)))
        cs.append(draw(st.booleans()))
    return shape, tuple(ks), tuple(ss), tuple(ds), tuple(cs)


@settings(max_examples=25, deadline=None)
@given(neighborhood_params())
def test_neighborhood_property(params):
    shape, ks, ss, ds, cs = params
    mask = masks.neighborhood(VideoGrid(*shape), ks, stride=ss, dilation=ds, causal=cs)
    want = bf.neighborhood_dense(shape, ks, ss, ds, cs)
    np.testing.assert_array_equal(dense(mask), want)
    if not any(cs):  # non-causal windows hold exactly prod(kernel) keys
        assert np.all(want.sum(axis=1) == ks[0] * ks[1] * ks[2])
    rows = np.arange(want.shape[0])
    s, e = mask.key_intervals(rows)
    rebuilt = np.zeros_like(want, dtype=np.int64)
    for r in rows:
        for a, b in zip(s[r], e[r]):
            rebuilt[r, a:b] += 1
    assert rebuilt.max() <= 1
    np.testing.assert_array_equal(rebuilt.astype(bool), want)


def test_neighborhood_int_and_triple_agree():
    g = VideoGrid(3, 5, 5)
    np.testing.assert_array_equal(
        dense(masks.neighborhood(g, 3, 1, 1, False)),
        dense(masks.neighborhood(g, (3, 3, 3), (1, 1, 1), (1, 1, 1), (False,) * 3)),
    )


# ------------------------------------------------------------------------------------------------
# sliding tile


@pytest.mark.parametrize(
    "shape,tile,window",
    [
        ((4, 6, 7), (2, 2, 2), (1, 3, 3)),
        ((4, 6, 7), (3, 4, 5), (1, 1, 1)),
        ((5, 5, 7), (2, 2, 3), (3, 3, 3)),
        ((3, 6, 7), 2, (1, 3, 1)),
        ((2, 3, 3), 1, (1, 3, 3)),
    ],
    ids=str,
)
def test_sliding_tile_ragged(shape, tile, window):
    np.testing.assert_array_equal(
        dense(masks.sliding_tile(VideoGrid(*shape), tile, window)), bf.sliding_tile_dense(shape, tile, window)
    )


@st.composite
def sta_divisible(draw):
    tile = tuple(draw(st.integers(1, 3)) for _ in range(3))
    counts = tuple(draw(st.integers(1, max(1, lim // t))) for t, lim in zip(tile, (4, 6, 7)))
    window = tuple(draw(st.sampled_from([w for w in (1, 3, 5) if w <= c])) for c in counts)
    return tuple(t * c for t, c in zip(tile, counts)), tile, window


@FEW
@given(sta_divisible())
def test_sliding_tile_equals_strided_neighborhood(params):
    shape, tile, window = params
    g = VideoGrid(*shape)
    sta = dense(masks.sliding_tile(g, tile, window))
    kernel = tuple(w * t for w, t in zip(window, tile))
    np.testing.assert_array_equal(sta, dense(masks.neighborhood(g, kernel, stride=tile)))
    np.testing.assert_array_equal(sta, bf.sliding_tile_dense(shape, tile, window))


# ------------------------------------------------------------------------------------------------
# SVG bands


@pytest.mark.parametrize(
    "length,density",
    [(168, 0.1), (360, 0.3), (360, 0.6), (1000, 0.25), (100, 0.5), (75600, 0.25), (500, 1.0)],
)
def test_band_width_for_density(length, density):
    w = masks.band_width_for_density(length, density)
    assert w == bf.band_width(length, density)
    assert w % 128 == 0 or w == length


@pytest.mark.parametrize("shape,density", [(G_MED, 0.2), (G_BAND, 0.3), (G_BAND, 0.6)], ids=str)
def test_temporal_band_is_a_plain_band_in_token_major_order(shape, density):
    g = VideoGrid(*shape)
    w = bf.band_width(g.num_tokens, density)
    permuted = dense(masks.temporal_band(g, density).permute(token_major_order(g)))
    np.testing.assert_array_equal(permuted, bf.dense_from_pred(g.num_tokens, lambda q, k: abs(q - k) <= w))
    # and the same band seen in raster order is the spatial band
    np.testing.assert_array_equal(dense(masks.spatial_band(g, density)), permuted)


def test_band_widths_of_band_builders():
    g = VideoGrid(*G_BAND)
    w = bf.band_width(g.num_tokens, 0.3)
    assert w == 128
    rows = dense(masks.spatial_band(g, 0.3)).sum(axis=1)
    assert rows[180] == 2 * w + 1


# ------------------------------------------------------------------------------------------------
# per-head, from_array, global tokens, composition, permutation


def test_from_array_round_trip():
    rng = np.random.default_rng(0)
    a2 = rng.random((11, 11)) < 0.4
    a3 = rng.random((3, 11, 11)) < 0.4
    m2, m3 = masks.from_array(a2), masks.from_array(a3)
    assert m2.num_heads is None and m3.num_heads == 3 and m3.shape == (11, 11)
    np.testing.assert_array_equal(dense(m2), a2)
    np.testing.assert_array_equal(dense(m3), a3)
    for h in range(3):
        np.testing.assert_array_equal(m3.block(2, 9, 1, 10, head=h), a3[h, 2:9, 1:10])
        np.testing.assert_array_equal(dense(m3.head(h)), a3[h])
        s, e = m3.key_intervals(np.arange(11), head=h)
        rebuilt = np.zeros((11, 11), bool)
        for r in range(11):
            for x, y in zip(s[r], e[r]):
                rebuilt[r, x:y] = True
        np.testing.assert_array_equal(rebuilt, a3[h])


def test_per_head():
    g = VideoGrid(*G_SMALL)
    parts = [masks.spatial(g), masks.temporal(g, 1), masks.frame_causal(g)]
    wants = [bf.spatial_dense(G_SMALL, 0), bf.temporal_dense(G_SMALL, 1), bf.frame_causal_dense(G_SMALL)]
    m = masks.per_head(parts)
    assert m.num_heads == 3 and m.shape == (60, 60)
    np.testing.assert_array_equal(dense(m), np.stack(wants))
    for h in range(3):
        np.testing.assert_array_equal(m.block(5, 40, 0, 60, head=h), wants[h][5:40])
        np.testing.assert_array_equal(
            np.asarray(m.allowed(np.arange(60)[:, None], np.arange(60)[None], h)), wants[h]
        )
    # per-head composed with a head-uniform mask keeps its heads
    causal_band = m & masks.band(60, 10)
    assert causal_band.num_heads == 3
    np.testing.assert_array_equal(
        dense(causal_band), np.stack(wants) & (np.abs(np.subtract.outer(range(60), range(60))) <= 10)
    )
    both = m | masks.per_head([masks.band(60, 0)] * 3)
    np.testing.assert_array_equal(dense(both), np.stack(wants) | np.eye(60, dtype=bool))


def test_global_tokens_on_per_head():
    rng = np.random.default_rng(1)
    arr = rng.random((2, 9, 9)) < 0.3
    arr[1] = False  # an all-empty head
    m = masks.global_tokens(masks.from_array(arr), 3)
    assert m.shape == (12, 12) and m.num_heads == 2
    np.testing.assert_array_equal(dense(m), bf.global_tokens_dense(arr, 3))


@pytest.mark.parametrize(
    "name,order_of",
    [
        ("sta_ragged", lambda g: tiled_order(g, (3, 4, 3))),
        ("nbhd_333", lambda g: token_major_order(g)),
        ("temporal3_anchor", lambda g: tiled_order(g, (2, 4, 4))),
        ("nbhd_mixed", lambda g: tiled_order(g, (3, 4, 3), pad=False)),
    ],
    ids=["sta-tiled", "nbhd-token-major", "temporal-tiled", "nbhd-tiled-unpadded"],
)
def test_permute(name, order_of):
    order = order_of(VideoGrid(*G_MED))
    base = build(name)
    m = base.permute(order)
    assert m.shape == (order.length, order.length)
    want = bf.permuted_dense(expected(name), np.asarray(order.perm))
    got = dense(m)
    np.testing.assert_array_equal(got, want)
    pad = ~np.asarray(order.valid)
    assert not got[pad].any() and not got[:, pad].any(), "padding slots see and are seen by nothing"
    np.testing.assert_array_equal(m.block(10, 70, 30, 100), want[10:70, 30:100])
    if m.traceable:  # evaluated from jax iotas through the order's arithmetic form
        pos = jnp.arange(order.length, dtype=jnp.int32)
        np.testing.assert_array_equal(np.asarray(m.allowed(pos[:, None], pos[None, :])), want)


def test_permute_per_head():
    rng = np.random.default_rng(2)
    g = VideoGrid(2, 3, 3)
    arr = rng.random((2, 18, 18)) < 0.5
    order = tiled_order(g, (2, 2, 2))
    m = masks.from_array(arr).permute(order)
    assert m.num_heads == 2
    np.testing.assert_array_equal(dense(m), bf.permuted_dense(arr, np.asarray(order.perm)))


# ------------------------------------------------------------------------------------------------
# limits and bad input


def test_to_dense_refuses_large_masks():
    big = masks.DENSE_LIMIT + 1
    for m in (masks.full(big), masks.band(big, 3), masks.frame_causal(VideoGrid(1, 1, big))):
        with pytest.raises(ValueError):
            m.to_dense()
    # block() stays available at any length
    m = masks.neighborhood(VideoGrid(21, 45, 80), (3, 5, 5))
    blk = m.block(40010, 40026, 39900, 40100)  # t=11, y=5, x=10..25: interior
    assert blk.shape == (16, 200)
    q, k = np.arange(40010, 40026)[:, None], np.arange(39900, 40100)[None, :]
    tq, yq, xq = bf.coords((21, 45, 80), q)
    tk, yk, xk = bf.coords((21, 45, 80), k)
    # interior queries: the plain centred window
    np.testing.assert_array_equal(blk, (abs(tq - tk) <= 1) & (abs(yq - yk) <= 2) & (abs(xq - xk) <= 2))


def test_block_rejects_bad_ranges():
    m = masks.band(10, 2)
    for args in ((-1, 3, 0, 3), (0, 11, 0, 3), (5, 4, 0, 3), (0, 3, 0, 12)):
        with pytest.raises(ValueError):
            m.block(*args)


def test_bad_head_index():
    m = masks.from_array(np.ones((2, 4, 4), bool))
    for bad in (2, -1, 5):
        with pytest.raises(ValueError):
            m.block(0, 4, 0, 4, head=bad)
        with pytest.raises(ValueError):
            m.allowed(np.arange(4), np.arange(4), bad)
        with pytest.raises(ValueError):
            m.head(bad)
        with pytest.raises(ValueError):
            m.key_intervals(np.arange(4), head=bad)
    p = masks.per_head([masks.full(4)] * 3)
    with pytest.raises(ValueError):
        p.block(0, 4, 0, 4, head=3)


G = VideoGrid(3, 4, 5)

BAD = [
    ("kernel > T", lambda: masks.neighborhood(G, (4, 1, 1)), ValueError),
    ("kernel > X", lambda: masks.neighborhood(G, 6), ValueError),
    ("kernel*dilation > Y", lambda: masks.neighborhood(G, (1, 3, 1), dilation=(1, 2, 1)), ValueError),
    ("zero kernel", lambda: masks.neighborhood(G, 0), ValueError),
    ("negative kernel", lambda: masks.neighborhood(G, (1, -1, 1)), ValueError),
    ("float kernel", lambda: masks.neighborhood(G, 1.5), TypeError),
    ("kernel of 2 axes", lambda: masks.neighborhood(G, (1, 1)), ValueError),
    ("zero stride", lambda: masks.neighborhood(G, 3, stride=0), ValueError),
    ("stride > kernel", lambda: masks.neighborhood(G, 2, stride=3), ValueError),
    ("zero dilation", lambda: masks.neighborhood(G, 1, dilation=0), ValueError),
    ("non-bool causal", lambda: masks.neighborhood(G, 1, causal=(1, 0, 0)), TypeError),
    ("grid not a VideoGrid", lambda: masks.neighborhood((3, 4, 5), 1), TypeError),
    ("even STA window", lambda: masks.sliding_tile(G, 1, (1, 2, 1)), ValueError),
    ("STA window > tiles", lambda: masks.sliding_tile(G, (1, 2, 2), (1, 3, 1)), ValueError),
    ("zero STA tile", lambda: masks.sliding_tile(G, 0, 1), ValueError),
    ("zero STA window", lambda: masks.sliding_tile(G, 1, 0), ValueError),
    ("STA grid not a VideoGrid", lambda: masks.sliding_tile(None, 1, 1), TypeError),
    ("full(0)", lambda: masks.full(0), ValueError),
    ("full(2.0)", lambda: masks.full(2.0), TypeError),
    ("band negative width", lambda: masks.band(5, -1), ValueError),
    ("band zero length", lambda: masks.band(0, 1), ValueError),
    ("from_array int", lambda: masks.from_array(np.ones((3, 3), int)), TypeError),
    ("from_array float", lambda: masks.from_array(np.ones((3, 3))), TypeError),
    ("from_array not square", lambda: masks.from_array(np.ones((3, 4), bool)), ValueError),
    ("from_array 1-D", lambda: masks.from_array(np.ones(3, bool)), ValueError),
    ("from_array 4-D", lambda: masks.from_array(np.ones((1, 2, 3, 3), bool)), ValueError),
    ("& lengths", lambda: masks.full(4) & masks.full(5), ValueError),
    ("| lengths", lambda: masks.band(4, 1) | masks.full(5), ValueError),
    (
        "& heads",
        lambda: masks.per_head([masks.full(4)] * 2) & masks.per_head([masks.full(4)] * 3),
        ValueError,
    ),
    ("& non-mask", lambda: masks.full(4) & np.ones((4, 4), bool), TypeError),
    ("per_head lengths", lambda: masks.per_head([masks.full(4), masks.full(5)]), ValueError),
    ("per_head empty", lambda: masks.per_head([]), ValueError),
    ("per_head non-mask", lambda: masks.per_head([masks.full(4), "full"]), TypeError),
    ("per_head nested", lambda: masks.per_head([masks.per_head([masks.full(4)] * 2)]), ValueError),
    ("spatial negative window", lambda: masks.spatial(G, -1), ValueError),
    ("temporal negative window", lambda: masks.temporal(G, -1), ValueError),
    ("radial negative window", lambda: masks.radial(G, -2), ValueError),
    ("spatial_band density 0", lambda: masks.spatial_band(G, 0.0), ValueError),
    ("temporal_band density > 1", lambda: masks.temporal_band(G, 1.5), ValueError),
    ("band density str", lambda: masks.spatial_band(G, "0.5"), TypeError),
    ("global count 0", lambda: masks.global_tokens(masks.full(4), 0), ValueError),
    ("global non-mask", lambda: masks.global_tokens(np.ones((4, 4), bool), 2), TypeError),
    ("frame_causal non-grid", lambda: masks.frame_causal(60), TypeError),
    ("permute mismatched order", lambda: masks.full(5).permute(tiled_order(G, 2)), ValueError),
    ("permute non-order", lambda: masks.full(5).permute(np.arange(5)), TypeError),
]


@pytest.mark.parametrize("what,call,exc", BAD, ids=[b[0] for b in BAD])
def test_bad_input(what, call, exc):
    with pytest.raises(exc):
        call()
