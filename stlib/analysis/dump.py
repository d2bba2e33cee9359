"""What the TPU compiler made of a kernel: compile in a subprocess with libtpu's dump on, then read
the dump back: the VMEM / SMEM allocations of every Pallas kernel (``compile_report``), the
scheduled bundles of each kernel (for ``stlib.analysis.schedule``) and the HBM bytes of the XLA
glue around the kernels (``glue_bytes``).

libtpu reads ``LIBTPU_INIT_ARGS`` once, when it initialises, hence the subprocess. The dump is an
internal format of the pinned libtpu (0.0.42.1); if it changes, the readers raise rather than guess.

Usage: python -m stlib.compile_report '{"impl": "pallas_tile", "mask": "band (density 0.25)"}'
"""

from __future__ import annotations

import importlib.metadata
import json
import math
import os
import pickle
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from stlib import sources
from stlib.analysis.schedule import PINNED_LIBTPU, ScheduleFormatError
from stlib.device import host_has_tpu

#: Seconds a compile subprocess may take before it counts as failed (``STLIB_COMPILE_TIMEOUT``): a
#: TPU7x compile takes 4-8 min on an idle 2-core machine, several times that on a loaded one.
COMPILE_TIMEOUT = float(os.environ.get("STLIB_COMPILE_TIMEOUT", "1800"))
_ALLOCATION = re.compile(r"#allocation(\d+) \[shape = '[^']*', space=(\w+), size = (0x[0-9a-f]+)")
_STEP = re.compile(r"^\d+-(?P<kernel>.+?)-(?P<step>\d+)-(?P<what>.+)\.txt$")
_BAND = re.compile(r"^band \((density|width) ([0-9.]+)\)$")


@dataclass(frozen=True)
class KernelConfig:
    """A kernel call at a named workload: ``mask`` names an entry of
    ``stlib.masks.case_study_masks()``, or is "none" (dense attention), "full", "causal",
    "band (density X)" or "band (width W)" on ``length`` tokens (default: the case study's);
    ``mask_file``: a pickled stlib mask used instead of ``mask``. ``num_kv_heads`` (q heads sharing
    k / v heads) and ``head_dim_v`` (v / output head dim) are compiled where the implementation
    ``supports`` them. ``backward``: the program compiled is the call's backward alone (``jax.vjp``'s
    gradient function, from the forward's residuals as inputs)."""

    impl: str
    mask: str = "none"
    num_heads: int = 10
    head_dim: int = 128
    dtype: str = "bfloat16"
    block_q: int | None = None
    block_kv: int | None = None
    chip: str = "v6e"
    options: dict = field(default_factory=dict)  # fields of the implementation's options type
    length: int | None = None
    mask_file: str | None = None
    num_kv_heads: int | None = None  # None: num_heads (multi-head attention)
    head_dim_v: int | None = None  # None: head_dim
    backward: bool = False  # compile the backward alone: the gradient from the forward's residuals


def resolve_mask(config: KernelConfig):
    """The stlib mask of ``config`` (None for "none"). Raises KeyError for an unknown name."""
    from stlib import masks
    from stlib.configs import CASE_STUDY
    from stlib.masks import case_study_masks

    if config.mask_file is not None:
        with open(config.mask_file, "rb") as handle:
            return pickle.load(handle)
    length = config.length or CASE_STUDY.num_tokens
    if config.mask == "none":
        return None
    if config.mask == "full":
        return masks.full(length)
    if config.mask == "causal":
        from stlib.masks import causal

        return causal(length)
    band = _BAND.match(config.mask)
    if band:
        if band[1] == "density":
            return masks.band(length, masks.band_width_for_density(length, float(band[2])))
        if not band[2].isdigit():
            raise KeyError(f"band width {band[2]!r} must be an integer")
        return masks.band(length, int(band[2]))
    if config.length not in (None, CASE_STUDY.num_tokens):
        raise KeyError(f"mask {config.mask!r} is a case-study mask; it has no form at length={config.length}")
    catalog = case_study_masks()
    if config.mask not in catalog:
        raise KeyError(
            f"unknown mask {config.mask!r}: use 'none', 'full', 'band (density X)', "
            f"'band (width W)' or one of {sorted(catalog)}"
        )
    return catalog[config.mask]


def traced_call(config: KernelConfig):
    """(fn, args): the function ``config`` compiles and its abstract arguments (``jax.ShapeDtypeStruct``
    pytrees); for ``backward``, the gradient function from the forward's residuals (their shapes)."""
    import jax

    fn, (q_shape, k_shape, v_shape) = forward_call(config)
    if not config.backward:
        return fn, (q_shape, k_shape, v_shape)
    # the residuals as the forward leaves them (shapes only), then the gradient from them
    gradient = jax.eval_shape(lambda q, k, v: jax.vjp(fn, q, k, v)[1], q_shape, k_shape, v_shape)
    do_shape = jax.ShapeDtypeStruct(q_shape.shape[:-1] + v_shape.shape[-1:], q_shape.dtype)
    return (lambda vjp, do: vjp(do)), (gradient, do_shape)


def forward_call(config: KernelConfig):
    """(fn, (q, k, v shapes)): the attention call ``config`` names, (q, k, v) -> o, whatever its
    ``backward``; what ``traced_call`` compiles, and what a TPU measurement runs
    (``stlib.bench.tpu_measure``)."""
    import jax
    import jax.numpy as jnp

    import stlib.kernels  # noqa: F401 - registers every implementation
    from stlib import registry
    from stlib.api import attention
    from stlib.configs import CASE_STUDY

    mask = resolve_mask(config)
    length = (config.length or CASE_STUDY.num_tokens) if mask is None else mask.length
    dtype = jnp.dtype(config.dtype)
    kv_heads = config.num_kv_heads or config.num_heads
    dv = config.head_dim_v or config.head_dim
    q_shape = jax.ShapeDtypeStruct((config.num_heads, length, config.head_dim), dtype)
    k_shape = jax.ShapeDtypeStruct((kv_heads, length, config.head_dim), dtype)
    v_shape = jax.ShapeDtypeStruct((kv_heads, length, dv), dtype)

    if (kv_heads, dv) != (config.num_heads, config.head_dim):
        implementation = registry.get(config.impl)
        implementation.check_supports(
            shared_kv_heads=kv_heads != config.num_heads, head_dim_v=dv != config.head_dim
        )
        call = implementation.kernel_call(
            mask, length, scale=config.head_dim**-0.5, block_q=config.block_q, block_kv=config.block_kv,
            options=config.options or None, interpret=False,
        )  # fmt: skip

        def fn(q, k, v):  # stlib.attention checks equal shapes: the kernel's own forward takes these
            return implementation.forward(q, k, v, mask, **call)
    else:

        def fn(q, k, v):
            return attention(
                q,
                k,
                v,
                mask,
                impl=config.impl,
                block_q=config.block_q,
                block_kv=config.block_kv,
                options=config.options or None,
                interpret=False,
            )

    return fn, (q_shape, k_shape, v_shape)


def _build_and_compile(config: KernelConfig) -> float:
    from stlib.device import compile_for_tpu

    start = time.perf_counter()
    fn, args = traced_call(config)
    compile_for_tpu(fn, *args, chip=config.chip)
    return time.perf_counter() - start


#: A source location in exported program text.
_LOCATION = re.compile(r"loc\(.*?\)\n?")


def exported_program(fn, *shapes):
    """``fn`` exported for TPU at ``shapes``, and its program text without source locations: the
    text, and so a cache key made of it, is the same in every process. Where a function was defined
    changes nothing: a notebook cell's file is ``/tmp/ipykernel_<pid>/<hash>.py``, a new one in every
    kernel, and a Pallas kernel's body carries its locations inside the serialized Mosaic module,
    where no text substitution reaches; so the export records no traceback frames at all."""
    import jax

    limit = jax.config.jax_traceback_in_locations_limit
    jax.config.update("jax_traceback_in_locations_limit", 0)
    try:
        exported = jax.export.export(jax.jit(fn), platforms=["tpu"])(*shapes)
    finally:
        jax.config.update("jax_traceback_in_locations_limit", limit)
    return exported, _LOCATION.sub("", exported.mlir_module())


def program_hash(config: KernelConfig) -> str:
    """Hash of the program ``config`` compiles (``traced_call``, exported for TPU without source
    locations): what an estimate is keyed by, so an edit that leaves the program as it was (a
    docstring, a check, a refactor) keeps every cached estimate, and any edit that changes it
    misses. About a second at the case-study size (the host builds the kernel's tables)."""
    import hashlib

    fn, args = traced_call(config)
    _, program = exported_program(fn, *args)
    return hashlib.sha256(program.encode()).hexdigest()[:24]


def is_pallas_kernel(name: str) -> bool:
    """Whether a dumped program is the Pallas kernel of a registered implementation."""
    from stlib import registry

    return registry.owner_of_kernel(name) is not None


def parse_dump(directory: str) -> dict[str, dict[str, int]]:
    """Per Pallas kernel in a libtpu dump directory: bytes of scoped allocations by memory space
    (``vmem``, ``smem``, ...), read from the last compiler pass that lists them."""
    latest: dict[str, tuple[int, str]] = {}
    for name in os.listdir(directory):
        match = _STEP.match(name)
        if not match or not is_pallas_kernel(match["kernel"]):
            continue
        path = os.path.join(directory, name)
        with open(path, errors="replace") as handle:
            text = handle.read()
        if "space=vmem" not in text:
            continue
        step = int(match["step"])
        if step >= latest.get(match["kernel"], (-1, ""))[0]:
            latest[match["kernel"]] = (step, text)
    if not latest:
        raise RuntimeError(
            f"no Pallas kernel allocations found in the libtpu dump at {directory}; "
            "the dump format of this libtpu may differ from 0.0.42.1"
        )
    report = {}
    for kernel, (_, text) in sorted(latest.items()):
        spaces: dict[str, int] = {}
        for _, space, size in set(_ALLOCATION.findall(text)):
            spaces[space] = spaces.get(space, 0) + int(size, 16)
        report[kernel] = spaces
    return report


def stlib_dir() -> Path:
    """The directory of the ``stlib`` package (its parent is what puts ``stlib`` on sys.path)."""
    return sources.ROOT


#: On a host with a TPU, what a compile subprocess needs to compile deviceless while this process
#: holds the chip: no TPU backend of its own (a second process opening the chip fails with "open(/dev/vfio/N):
#: Device or resource busy"), only libtpu's deviceless topology (``stlib.device.tpu_device``).
DEVICELESS_ON_TPU_HOST = {"JAX_PLATFORMS": "cpu"}


def subprocess_env() -> dict:
    """This process's environment for a ``python -m stlib...`` subprocess: it imports this very
    stlib, also where stlib is importable only through sys.path, and may load libtpu beside us
    (on a host with a TPU without opening the chip: ``DEVICELESS_ON_TPU_HOST``)."""
    env = dict(os.environ)
    env.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    env.update(DEVICELESS_ON_TPU_HOST if host_has_tpu() else {})
    env["PYTHONPATH"] = os.pathsep.join([str(stlib_dir().parent), *filter(None, [env.get("PYTHONPATH")])])
    return env


def run_with_dump(module: str, args: list[str], directory: str, timeout: float | None = None):
    """``python -m module *args`` in a subprocess that imports this stlib, with libtpu's dump written
    to ``directory`` (libtpu reads its flags when it loads, so a dump needs a process of its own).
    Returns the finished process; its exit status is the caller's to judge."""
    env = subprocess_env()
    env["LIBTPU_INIT_ARGS"] = (env.get("LIBTPU_INIT_ARGS", "") + f" --xla_jf_dump_to={directory}").strip()
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout or COMPILE_TIMEOUT,
        check=False,
    )


def compile_with_dump(config: KernelConfig, directory: str, timeout: float | None = None) -> float:
    """Compile ``config`` for its chip in a subprocess with libtpu's dump written to ``directory``;
    return the compile seconds. Raises RuntimeError if compilation fails."""
    proc = run_with_dump("stlib.compile_report", [json.dumps(asdict(config))], directory, timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"compiling {config} failed:\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1])["compile_seconds"]


def compile_report(config: KernelConfig, timeout: float | None = None) -> dict:
    """Compile ``config`` for its chip in a subprocess; return {"compile_seconds", "kernels":
    {kernel name: {"vmem": bytes, "smem": bytes, ...}}}. Raises RuntimeError if compilation fails."""
    with tempfile.TemporaryDirectory(prefix="stlib-dump-") as dump:
        seconds = compile_with_dump(config, dump, timeout)
        return {"compile_seconds": seconds, "kernels": parse_dump(dump)}


def libtpu_version() -> str:
    """The installed libtpu version."""
    return importlib.metadata.version("libtpu")


def check_libtpu() -> str:
    """The installed libtpu version; raises ScheduleFormatError unless it is the pinned one."""
    version = libtpu_version()
    if version != PINNED_LIBTPU:
        raise ScheduleFormatError(
            f"libtpu {version} is installed; the dump parser knows libtpu {PINNED_LIBTPU} only"
        )
    return version


#: The dumps of one kernel the estimate reads: its scheduled bundles, the schedule analysis (their
#: count) and the compiler's per-bundle unit utilization (its MXU occupancy).
DUMPED = ("final_bundles", "schedule-analysis_final_bundles", "final_hlo-static-per-bundle-utilization")


def dump_files(directory: str, keep=None) -> dict[str, tuple[str, str, str]]:
    """{kernel: (final bundles, schedule analysis, per-bundle utilization)} of each Pallas kernel in a
    libtpu dump that ``keep`` (a predicate on its name; default: a registered implementation's
    kernel) keeps."""
    keep = keep or is_pallas_kernel
    files: dict[str, dict[str, str]] = {}
    for name in os.listdir(directory):
        match = _STEP.match(name)
        if match and keep(match["kernel"]) and match["what"] in DUMPED:
            entry = files.setdefault(match["kernel"], {})
            if match["what"] in entry:
                raise ScheduleFormatError(f"two {match['what']} dumps for kernel {match['kernel']}")
            entry[match["what"]] = Path(directory, name).read_text(errors="replace")
    if not files or any(len(v) != len(DUMPED) for v in files.values()):
        raise ScheduleFormatError(
            f"no {' + '.join(DUMPED)} dumps per Pallas kernel in {directory}: "
            f"{ {k: sorted(v) for k, v in files.items()} }"
        )
    return {k: tuple(v[what] for what in DUMPED) for k, v in files.items()}


def read_hlo(directory: str) -> str:
    names = [n for n in os.listdir(directory) if n.endswith("-TLP-hlo.txt")]
    if len(names) != 1:
        raise ScheduleFormatError(f"expected one ...-TLP-hlo.txt in the dump, found {names}")
    return Path(directory, names[0]).read_text(errors="replace")


_TILE = re.compile(r"T\((\d+)(?:,(\d+))?\)(?:\((\d+),(\d+)\))?")


def padded_bytes(dtype: str, dims: list[int], layout: str) -> int:
    """HBM bytes of an array as XLA lays it out: the minor dimensions padded to the layout's tile
    (``{2,1,0:T(8,128)}``: an f32[H, L, 1] takes 128 lanes per row, 128x its logical bytes; a
    ``(2,1)`` sub-tile packs two bf16 rows per sublane). Minor-to-major order from the layout."""
    size = list(dims)
    order_text, _, tiling = layout.partition(":")
    order = [int(x) for x in order_text.split(",") if x.strip().isdigit()] or list(range(len(size)))[::-1]
    tile = _TILE.search(tiling)
    if tile and size:
        sizes = [int(tile[1])] if tile[2] is None else [int(tile[1]), int(tile[2])]
        if tile[3] is not None and len(sizes) == 2:
            sizes[0] *= int(tile[3])  # sub-tile packing: rows per sublane
        for axis, t in zip(order, reversed(sizes)):  # the tile's last size pads the most-minor axis
            size[axis] = -(-size[axis] // t) * t
    return _ITEMSIZE[dtype] * math.prod(size)


def laid_out_minor(n: int, layout: str) -> int:
    """The length of a most-minor dimension of ``n`` elements under ``layout``: padded to the tile's
    lane count (``T(8,128)``: 128)."""
    tile = _TILE.search(layout)
    lanes = 1 if tile is None else int(tile[2] or tile[1])
    return -(-n // lanes) * lanes


def kernel_layouts(hlo: str) -> dict[str, list[str]]:
    """Per Pallas kernel call in the scheduled HLO: the layouts (``{2,1,0:T(8,128)}``) of its operands
    then its results, in operand-index order (as the kernel dump numbers them)."""
    entry = hlo[hlo.index("\nENTRY") :] if "\nENTRY" in hlo else ""
    shapes: dict[str, list[str]] = {}
    out: dict[str, list[str]] = {}
    for line in entry.split("\n")[1:]:
        match = _INSTR.match(line)
        if not match:
            continue
        name, shape, opcode, operands = match.groups()
        layouts = [f"{{{layout}}}" for _, _, layout in _ARRAY.findall(shape)]
        shapes[name] = layouts
        if opcode == "custom-call" and is_pallas_kernel(name.lstrip("%")):
            args = [a for op in re.findall(r"%[\w.\-]+", operands) for a in shapes.get(op, ["{}"])[:1]]
            out[name.lstrip("%")] = args + layouts
    return out


_ITEMSIZE = {
    "pred": 1,
    "s8": 1,
    "u8": 1,
    "bf16": 2,
    "f16": 2,
    "s16": 2,
    "u16": 2,
    "f32": 4,
    "s32": 4,
    "u32": 4,
    "f64": 8,
    "s64": 8,
    "u64": 8,
}
_ARRAY = re.compile(r"\b(pred|[fsu]\d+|bf16)\[([\d,]*)\]\{([^}]*)\}")
_INSTR = re.compile(r"^\s*(?:ROOT )?(%[\w.\-]+) = (\(.*?\)|\S+) ([\w\-]+)\(([^)]*)\)")
_NOT_GLUE = {
    "parameter",
    "constant",
    "get-tuple-element",
    "tuple",
    "bitcast",
    "custom-call",
    "copy-done",
    "after-all",
    "partition-id",
    "replica-id",
}


def glue_bytes(hlo: str) -> int:
    """HBM bytes read and written by the XLA ops around the kernels (padding, scaling, merging,
    slicing) in the entry computation of the scheduled HLO: outputs plus operands of every op that
    is not a kernel call or a no-op, each at its laid-out size (``padded_bytes``). Arrays placed in
    other memory spaces (layout ``S(n)``) are left out."""
    entry = hlo[hlo.index("\nENTRY") :] if "\nENTRY" in hlo else ""
    if not entry:
        raise ScheduleFormatError("no ENTRY computation in the scheduled HLO")
    sizes: dict[str, int] = {}
    total = 0
    for line in entry.split("\n")[1:]:
        match = _INSTR.match(line)
        if not match:
            continue
        name, shape, opcode, operands = match.groups()
        size = sum(
            padded_bytes(t, [int(d) for d in dims.split(",") if d], layout)
            for t, dims, layout in _ARRAY.findall(shape)
            if "S(" not in layout
        )
        sizes[name] = size
        if opcode not in _NOT_GLUE:
            total += size + sum(sizes.get(op, 0) for op in re.findall(r"%[\w.\-]+", operands))
    return total


def main() -> None:
    """``python -m stlib.compile_report CONFIG_JSON``: print the compile report of a KernelConfig;
    in the compile subprocess (libtpu's dump on), compile and print the seconds only."""
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    config = KernelConfig(**json.loads(sys.argv[1]))
    if "--xla_jf_dump_to" in os.environ.get("LIBTPU_INIT_ARGS", ""):
        print(json.dumps({"compile_seconds": _build_and_compile(config)}))
    else:
        print(json.dumps(compile_report(config), indent=2))
