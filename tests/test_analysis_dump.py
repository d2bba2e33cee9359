"""The compile subprocess (stlib.analysis.dump): it imports the same stlib as its parent, from any
working directory, also where stlib is importable only through sys.path."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import stlib
from stlib.analysis import dump


def test_compile_subprocess_puts_this_stlib_first_on_its_path(monkeypatch, tmp_path):
    seen = {}

    def run(command, **kwargs):
        seen.update(command=command, env=kwargs["env"])
        return subprocess.CompletedProcess(
            command, 0, stdout='log line\n{"compile_seconds": 1.5}\n', stderr=""
        )

    monkeypatch.setattr(subprocess, "run", run)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["/elsewhere", "/more"]))
    assert dump.compile_with_dump(dump.KernelConfig("pallas_dense"), str(tmp_path)) == 1.5
    root = Path(stlib.__file__).resolve().parent.parent
    assert seen["env"]["PYTHONPATH"].split(os.pathsep) == [str(root), "/elsewhere", "/more"]
    assert seen["command"][1:3] == ["-m", "stlib.compile_report"]
    assert f"--xla_jf_dump_to={tmp_path}" in seen["env"]["LIBTPU_INIT_ARGS"]

    monkeypatch.delenv("PYTHONPATH")
    dump.compile_with_dump(dump.KernelConfig("pallas_dense"), str(tmp_path))
    assert seen["env"]["PYTHONPATH"] == str(root)
