"""The compiled schedule of a kernel written outside stlib (a notebook's kernel in view), read the
way the estimator reads the library's: so a reader can put its numbers beside the production
kernel's.

libtpu writes a kernel's scheduled bundles only where its dump flag was set when it loaded, so the
compile runs in a subprocess: the function is exported for TPU here (``jax.export``, shapes only,
no TPU needed), serialized, and compiled there for ``chip`` with the dump on. The Pallas kernels
whose names start with ``kernel_prefix`` are parsed (``stlib.analysis.schedule``) and attributed
to paths (``stlib.analysis.attribution``): per grid step, and per conditional compute region,
named by the caller in the order the kernel traces them. Results are cached beside the estimates
(``stlib.analysis.cache``), keyed by the exported program without its source locations, so the
main job's seed serves the tests too.

``python -m stlib.analysis.inview EXPORTED CHIP``: that subprocess.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from stlib.analysis.attribution import Attribution, attribute
from stlib.analysis.cache import FORMAT_VERSION, cache_dir
from stlib.analysis.dump import COMPILE_TIMEOUT, check_libtpu, dump_files, subprocess_env
from stlib.analysis.schedule import parse_schedule
from stlib.device import chip_spec

_LOCATION = re.compile(r"loc\(.*?\)\n?")


def kernel_schedules(
    fn, *shapes, chip: str = "v6e", kernel_prefix: str, compute_names: list[str], timeout: float | None = None
) -> list[Attribution]:
    """Compile ``fn`` at ``shapes`` (``jax.ShapeDtypeStruct``) for ``chip`` and attribute each Pallas
    kernel named ``kernel_prefix...``; ``compute_names`` names its conditional compute regions (the
    ``pl.when`` regions with MXU work), in order. Raises RuntimeError when the compile fails and
    ScheduleFormatError when the schedule is not of the grid-loop form the estimator reads."""
    import jax

    exported = jax.export.export(jax.jit(fn), platforms=["tpu"])(*shapes)
    program = _LOCATION.sub("", exported.mlir_module())  # where the cell was defined changes nothing
    key_data = {
        "format": FORMAT_VERSION,
        "libtpu": check_libtpu(),
        "jax": importlib.metadata.version("jax"),
        "inview": hashlib.sha256(program.encode()).hexdigest(),
        "chip": chip,
        "kernel_prefix": kernel_prefix,
        "compute_names": list(compute_names),
    }
    key = hashlib.sha256(json.dumps(key_data, sort_keys=True).encode()).hexdigest()[:24]
    path = cache_dir() / key_data["libtpu"] / f"{key}.json"
    if path.exists():
        return [_attribution(k) for k in json.loads(path.read_text())["kernels"]]
    kernels = _compile_and_attribute(exported, chip, kernel_prefix, compute_names, timeout)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(
        json.dumps({"key": key_data, "kernels": [dataclasses.asdict(k) for k in kernels]}, indent=1)
    )
    tmp.replace(path)
    return kernels


def _attribution(record: dict) -> Attribution:
    return Attribution(**{**record, "grid": None if record["grid"] is None else tuple(record["grid"])})


def _compile_and_attribute(exported, chip, kernel_prefix, compute_names, timeout) -> list[Attribution]:
    with tempfile.TemporaryDirectory(prefix="stlib-inview-") as work:
        blob, dump = Path(work, "exported.bin"), Path(work, "dump")
        blob.write_bytes(exported.serialize())
        env = subprocess_env()
        env["LIBTPU_INIT_ARGS"] = (env.get("LIBTPU_INIT_ARGS", "") + f" --xla_jf_dump_to={dump}").strip()
        proc = subprocess.run(
            [sys.executable, "-m", "stlib.analysis.inview", str(blob), chip],
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout or COMPILE_TIMEOUT,
            check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"compiling {kernel_prefix} for {chip} failed:\n{proc.stderr[-3000:]}")
        found = dump_files(str(dump), keep=lambda name: name.startswith(kernel_prefix))
    form = chip_spec(chip).schedule_form
    return [
        attribute(parse_schedule(text, analysis, form), None, name, compute_names=compute_names)
        for name, (text, analysis) in sorted(found.items())
    ]


def per_step(attribution: Attribution) -> dict[str, int]:
    """Bundles of each path that runs once per grid step or per computed step (the step itself and
    each compute region), the way a reader compares two kernels' inner loops."""
    return {name: n for name, n in attribution.paths.items() if name == "step" or name.startswith("compute")}


def _compile_exported(path: str, chip: str) -> None:
    import jax
    from jax.sharding import SingleDeviceSharding

    from stlib.device import tpu_device

    exported = jax.export.deserialize(bytearray(Path(path).read_bytes()))
    sharding = SingleDeviceSharding(tpu_device(chip))
    args = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding) for a in exported.in_avals]
    jax.jit(exported.call).lower(*args).compile()


if __name__ == "__main__":
    _compile_exported(sys.argv[1], sys.argv[2])
