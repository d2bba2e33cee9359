"""The estimate cache (stlib.analysis.cache): an entry is keyed by the program its call compiles
(an edit that leaves the program as it was keeps it); the sweep's source hash follows every source
that an implementation's compiled call imports inside stlib (its own module, the entry point, the
named masks, transitively, lazy imports included) and nothing else."""

from __future__ import annotations

import dataclasses

from stlib.analysis import cache


def test_implementation_module_is_where_its_forward_lives():
    assert cache.implementation_module("pallas_tile") == "kernels/tile"
    assert cache.implementation_module("splash") == "kernels/splash"
    assert cache.implementation_module("pallas_tile_lane_dense") == "kernels/tile_lane_dense"


def fake_tree(root):
    """A small stlib: two kernels sharing common plumbing, an entry point, masks, a plot."""
    files = {
        "__init__.py": "from stlib import api, kernels\n",
        "_intmath.py": "",
        "api.py": "from stlib.registry import get\n",
        "registry.py": "",
        "plotting.py": "from stlib import api\n",
        "kernels/__init__.py": "from stlib.kernels import splash, tile\n",
        "kernels/common.py": "def f():\n    from stlib._intmath import cdiv\n",  # a lazy import
        "kernels/tile.py": "from stlib.kernels import common\nfrom stlib.masks import Mask\n",
        "kernels/splash.py": "from . import common\n",
        "masks/__init__.py": "from stlib.masks.base import Mask\n",
        "masks/base.py": "",
        "masks/catalogue.py": "from stlib import configs\n",
        "configs.py": "",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_source_hash_follows_what_the_call_imports(monkeypatch, tmp_path):
    root = tmp_path / "stlib"
    fake_tree(root)
    monkeypatch.setattr(cache, "stlib_dir", lambda: root)
    monkeypatch.setattr(cache, "implementation_module", lambda impl: f"kernels/{impl}")
    files = {p.relative_to(root).as_posix() for p in cache.source_files("tile")}
    assert files == {
        "__init__.py",  # the package above every module: hashed, its own imports not followed
        "_intmath.py",  # through common's lazy import
        "api.py",
        "registry.py",
        "configs.py",
        "kernels/__init__.py",
        "kernels/common.py",
        "kernels/tile.py",
        "masks/__init__.py",
        "masks/base.py",
        "masks/catalogue.py",
    }
    tile, splash = cache.source_hash("tile"), cache.source_hash("splash")
    assert tile != splash
    for name in ("plotting.py", "kernels/splash.py"):  # not what pallas_tile's call imports
        (root / name).write_text("# edited\n")
        assert cache.source_hash("tile") == tile, name
    assert cache.source_hash("splash") != splash  # ... but splash's own module
    hashes = [tile]
    for name in ("_intmath.py", "kernels/common.py", "masks/base.py", "configs.py", "registry.py"):
        (root / name).write_text((root / name).read_text() + "# edited\n")
        hashes.append(cache.source_hash("tile"))
    assert len(set(hashes)) == len(hashes)


def test_the_real_kernels_keys_leave_out_the_other_kernels_and_the_plots():
    tile = {p.name for p in cache.source_files("pallas_tile")}
    assert {
        "tile.py",
        "online_softmax.py",
        "mask_info.py",
        "_intmath.py",
        "_checks.py",
        "registry.py",
        "configs.py",
    } <= tile
    assert not {"splash.py", "plotting.py", "routing.py", "block_sweep.py"} & tile


def test_the_seed_keeps_current_entries_and_drops_stale_ones(tmp_path, monkeypatch):
    """``export_seed`` writes the cache's entries of this libtpu, jax and attribution format;
    ``seed_cache`` copies a seed into an empty cache without overwriting."""
    import json

    from stlib.analysis import cache

    monkeypatch.setenv("STLIB_CACHE_DIR", str(tmp_path / "cache"))
    version = cache.check_libtpu()
    folder = cache.cache_dir() / version
    folder.mkdir(parents=True)
    key = {
        "format": cache.FORMAT_VERSION,
        "libtpu": version,
        "jax": __import__("importlib").metadata.version("jax"),
        "program": "0" * 24,
        "config": {"impl": "pallas_tile"},
    }
    (folder / "current.json").write_text(json.dumps({"key": key}))
    (folder / "stale.json").write_text(json.dumps({"key": {**key, "format": cache.FORMAT_VERSION - 1}}))
    seed = tmp_path / "seed"
    assert cache.export_seed(seed) == 1
    assert sorted(p.name for p in seed.glob("*/*.json")) == ["current.json"]
    monkeypatch.setenv("STLIB_CACHE_DIR", str(tmp_path / "fresh"))
    assert cache.seed_cache(seed) == 1 and cache.seed_cache(seed) == 0
    assert (cache.cache_dir() / version / "current.json").exists()


def test_the_seed_of_a_run_keeps_only_the_entries_the_run_read_or_wrote(tmp_path, monkeypatch):
    """``export_seed(used_since=usage_mark())``: an entry the run never touched (a kernel since
    rewritten, keyed by its old program) leaves the seed; one read or written stays."""
    import json

    from stlib.analysis import cache

    monkeypatch.setenv("STLIB_CACHE_DIR", str(tmp_path / "cache"))
    tools = cache.tool_key()
    keys = {name: {**tools, "inview": name, "chip": "v6e"} for name in ("unused", "read", "written")}
    for name in ("unused", "read"):
        cache.write_entry(keys[name], {"key": keys[name], "kernels": []})
    since = cache.usage_mark()
    assert cache.read_entry(keys["read"]) == {"key": keys["read"], "kernels": []}
    cache.write_entry(keys["written"], {"key": keys["written"], "kernels": []})
    seed = tmp_path / "seed"
    assert cache.export_seed(seed, used_since=since) == 2
    kept = {json.loads(p.read_text())["key"]["inview"] for p in seed.glob("*/*.json")}
    assert kept == {"read", "written"}
    assert cache.export_seed(seed) == 3  # without a mark: every current entry
    program = {**tools, "program": "0" * 24, "config": {"impl": "pallas_tile"}}
    cache.write_entry(program, {"key": program})
    assert cache.export_seed(seed, used_since=cache.usage_mark()) == 0  # untouched since the mark: dropped


def test_an_estimate_is_keyed_by_its_program_the_same_in_every_process():
    """``program_hash``: equal in this process and a fresh one, blind to where the code lives and
    what its docstrings say, and changed by anything the compiler sees (here a block size)."""
    import subprocess
    import sys

    from stlib.analysis.dump import KernelConfig, program_hash, subprocess_env

    config = KernelConfig(impl="pallas_tile", mask="band (width 256)", num_heads=2, length=2048, block_q=512)
    here = program_hash(config)
    script = (
        "from stlib.analysis.dump import KernelConfig, program_hash; "
        f"print(program_hash(KernelConfig(**{dataclasses.asdict(config)!r})))"
    )
    there = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=subprocess_env(), check=True
    ).stdout.split()[-1]
    assert here == there
    assert program_hash(dataclasses.replace(config, block_q=256)) != here
    assert program_hash(dataclasses.replace(config, backward=True)) not in (here, program_hash(config))


def test_a_cached_call_is_found_without_tracing_it_again(tmp_path, monkeypatch):
    """``traced_program``: a call's program hash is remembered by the sources its trace reads
    (``trace_hash``), the config and the mask; a different call, or an edit to those sources, traces
    again, and an unchanged program comes out unchanged."""
    from stlib.analysis.dump import KernelConfig

    monkeypatch.setenv("STLIB_CACHE_DIR", str(tmp_path))
    traced = []
    real = cache.program_hash
    monkeypatch.setattr(cache, "program_hash", lambda config: traced.append(config) or real(config))
    config = KernelConfig(impl="pallas_dense", num_heads=1, length=1024, block_q=512)
    first = cache.traced_program(config, None)
    assert cache.traced_program(config, None) == first and len(traced) == 1
    assert cache.traced_program(dataclasses.replace(config, block_q=256), None) != first
    assert cache.traced_program(config, "a mask digest") == first and len(traced) == 3
    monkeypatch.setattr(cache, "trace_hash", lambda impl: "an edited source")
    assert cache.traced_program(config, None) == first and len(traced) == 4
    assert cache.traced_program(config, None) == first and len(traced) == 4


def test_the_trace_hash_covers_the_tracer_and_every_kernel():
    """What ``traced_call`` imports (every registered kernel) is in the memo's key, beside the
    implementation's own sources."""
    from stlib.sources import module_sources

    files = module_sources(cache.TRACE_MODULES, cache.stlib_dir())
    names = {p.relative_to(cache.stlib_dir()).as_posix() for p in files}
    assert {"analysis/dump.py", "api.py", "kernels/splash.py", "kernels/tile_lane_dense/kernel.py"} <= names
    assert not {"plotting.py", "routing.py", "bench/block_sweep.py"} & names
