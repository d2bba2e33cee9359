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
import sys
import tempfile
from pathlib import Path

from stlib.analysis.attribution import Attribution
from stlib.analysis.cache import attribute_dump, read_entry, tool_key, write_entry
from stlib.analysis.dump import exported_program, run_with_dump


def kernel_schedules(
    fn, *shapes, chip: str = "v6e", kernel_prefix: str, compute_names: list[str], timeout: float | None = None
) -> list[Attribution]:
    """Compile ``fn`` at ``shapes`` (``jax.ShapeDtypeStruct``) for ``chip`` and attribute each Pallas
    kernel named ``kernel_prefix...``; ``compute_names`` names its conditional compute regions (the
    ``pl.when`` regions with MXU work), in order. Raises RuntimeError when the compile fails and
    ScheduleFormatError when the schedule is not of the grid-loop form the estimator reads."""
    exported, program = exported_program(fn, *shapes)
    key_data = {
        **tool_key(),
        "inview": hashlib.sha256(program.encode()).hexdigest(),
        "chip": chip,
        "kernel_prefix": kernel_prefix,
        "compute_names": list(compute_names),
    }
    cached = read_entry(key_data)
    if cached is not None:
        return [_attribution(k) for k in cached["kernels"]]
    with tempfile.TemporaryDirectory(prefix="stlib-inview-") as work:
        blob, dump = Path(work, "exported.bin"), str(Path(work, "dump"))
        blob.write_bytes(exported.serialize())
        proc = run_with_dump("stlib.analysis.inview", [str(blob), chip], dump, timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"compiling {kernel_prefix} for {chip} failed:\n{proc.stderr[-3000:]}")
        kernels = attribute_dump(dump, chip, None, lambda name: name.startswith(kernel_prefix), compute_names)
    write_entry(key_data, {"key": key_data, "kernels": [dataclasses.asdict(k) for k in kernels]})
    return kernels


def _attribution(record: dict) -> Attribution:
    return Attribution(**{**record, "grid": None if record["grid"] is None else tuple(record["grid"])})


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
