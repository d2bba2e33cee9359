"""A regular (non-editable) install carries what the library reads at run time: the tuned blocks
(package data written by the block sweeps) are found from the installed package, not the clone."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

from conftest import run

from stlib import paths, tuned
from stlib.kernels import tile_lane_dense


def test_a_regular_install_finds_the_tuned_blocks(tmp_path):
    source = tmp_path / "source"  # a copy of the tracked tree: the build writes nothing into the checkout
    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=paths.REPO, capture_output=True, text=True, check=True
    ).stdout.split("\0")
    for name in filter(None, tracked):
        if (paths.REPO / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(paths.REPO / name, source / name)
    target = tmp_path / "site"
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(target),
            str(source),
        ]
    )
    code = (
        "import json, stlib; from stlib import tuned; from stlib.kernels import tile_lane_dense as ld; "
        "print(json.dumps({'file': stlib.__file__, 'chips': tuned.load(ld.NAME)['chips'], "
        "'v6e': list(ld.DEFAULT_BLOCKS['v6e'].__dict__.values())}))"
    )
    env = {
        "PYTHONPATH": str(target),
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
    }
    out = run([sys.executable, "-c", code], cwd=tmp_path, env=env)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["file"].startswith(str(target))  # the installed copy, not the clone
    assert got["chips"] == tuned.load(tile_lane_dense.NAME)["chips"]
    blocks = tile_lane_dense.DEFAULT_BLOCKS["v6e"]
    assert got["v6e"] == [blocks.block_q, blocks.block_kv, blocks.block_kv_compute]
