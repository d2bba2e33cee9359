"""The estimate cache key (stlib.analysis.cache): it follows every source that shapes an
implementation's compiled kernels (the shared modules and the implementation's own module), whether
masks is a module or a package, and nothing else: editing one kernel keeps the others' estimates."""

from __future__ import annotations

from stlib.analysis import cache


def test_implementation_module_is_where_its_forward_lives():
    assert cache.implementation_module("pallas_tile") == "kernels/tile"
    assert cache.implementation_module("splash") == "kernels/splash"
    assert cache.implementation_module("pallas_tile_lane_dense") == "kernels/tile_lane_dense"


def testsource_hash_follows_the_kernel_sources(monkeypatch, tmp_path):
    root = tmp_path / "stlib"
    for name in (
        "kernels/__init__.py",
        "kernels/common.py",
        "kernels/tile.py",
        "kernels/splash.py",
        "masks.py",
        "layout.py",
        "geometry.py",
        "api.py",
        "reference.py",
        "device.py",
        "plotting.py",
        "analysis/estimate.py",
    ):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(f"# {name}\n")
    monkeypatch.setattr(cache, "stlib_dir", lambda: root)
    hashes = [cache.source_hash("pallas_tile")]
    splash = cache.source_hash("splash")
    assert splash != hashes[0]
    for name in ("plotting.py", "analysis/estimate.py", "kernels/splash.py"):  # not pallas_tile's kernel
        (root / name).write_text("# edited\n")
        assert cache.source_hash("pallas_tile") == hashes[0], name
    assert cache.source_hash("splash") != splash  # ... but splash's
    for name in (
        "kernels/tile.py",
        "kernels/common.py",
        "masks.py",
        "layout.py",
        "geometry.py",
        "api.py",
        "reference.py",
        "device.py",
    ):
        (root / name).write_text("# edited\n")
        hashes.append(cache.source_hash("pallas_tile"))
    (root / "masks.py").unlink()  # masks becomes a package
    (root / "masks").mkdir()
    (root / "masks/__init__.py").write_text("# masks\n")
    hashes.append(cache.source_hash("pallas_tile"))
    (root / "masks/video.py").write_text("# video masks\n")
    hashes.append(cache.source_hash("pallas_tile"))
    assert len(set(hashes)) == len(hashes)
