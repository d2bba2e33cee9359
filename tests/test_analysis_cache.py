"""The estimate cache key (stlib.analysis.cache): it follows every source that shapes the compiled
kernels, whether masks is a module or a package, and nothing else."""

from __future__ import annotations

from stlib.analysis import cache


def test_source_hash_follows_the_kernel_sources(monkeypatch, tmp_path):
    root = tmp_path / "stlib"
    for name in (
        "kernels/__init__.py",
        "kernels/tile.py",
        "masks.py",
        "layout.py",
        "geometry.py",
        "api.py",
        "plotting.py",
        "analysis/estimate.py",
    ):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(f"# {name}\n")
    monkeypatch.setattr(cache, "stlib_dir", lambda: root)
    hashes = [cache._source_hash()]
    for name in ("plotting.py", "analysis/estimate.py"):  # no part of the compiled kernels
        (root / name).write_text("# edited\n")
        assert cache._source_hash() == hashes[0], name
    for name in ("kernels/tile.py", "masks.py", "layout.py", "geometry.py", "api.py", "kernels/new/deep.py"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("# edited\n")
        hashes.append(cache._source_hash())
    (root / "masks.py").unlink()  # masks becomes a package
    (root / "masks").mkdir()
    (root / "masks/__init__.py").write_text("# masks\n")
    hashes.append(cache._source_hash())
    (root / "masks/video.py").write_text("# video masks\n")
    hashes.append(cache._source_hash())
    assert len(set(hashes)) == len(hashes)
