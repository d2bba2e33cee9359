"""The compiled kernels of a call, attributed and cached: compile in a subprocess with libtpu's dump
on (``stlib.analysis.dump``), parse and attribute each Pallas kernel's schedule, and keep the result
on disk keyed by libtpu, JAX, the program the call compiles (``dump.program_hash``) and the rules
that name its compute regions: an edit that leaves the program as it was keeps the entry."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import os
import tempfile
import time
from pathlib import Path

from stlib.analysis.attribution import Attribution, attribute
from stlib.analysis.dump import (
    KernelConfig,
    check_libtpu,
    compile_with_dump,
    dump_files,
    glue_bytes,
    kernel_layouts,
    program_hash,
    read_hlo,
    stlib_dir,
)
from stlib.analysis.mxu_input import parse_utilization
from stlib.analysis.schedule import ScheduleFormatError, parse_schedule
from stlib.device import chip_spec
from stlib.sources import module_sources

#: Bumped when the attribution format or rules change (invalidates the cache). 2: operand layouts,
#: laid-out glue bytes, per-chip branch forms. 3: TPU7x shadows with the folded empty delay bundle.
#: 4: entries keyed by the compiled program, not by the sources that shape it. 5: each path's MXU
#: input (``mxu_input``: multiplied + pushed rows at the compiler's MXU rate).
FORMAT_VERSION = 5
#: The modules whose sources shape every compiled call besides the implementation's own: the entry
#: point the compile subprocess calls, and the named masks it builds (``source_hash``).
CALL_MODULES = ("stlib.api", "stlib.masks.catalogue")


def cache_dir() -> Path:
    """Where estimates are cached: ``$STLIB_CACHE_DIR/estimate`` (default ``~/.cache/stlib/estimate``)."""
    return Path(os.environ.get("STLIB_CACHE_DIR", Path.home() / ".cache" / "stlib")) / "estimate"


#: The seed of the estimate cache, under ``stlib.paths.data_dir()``: the main job writes there the
#: estimates it used whose kernel sources are current (``export_seed``); the main job and the tests
#: start their caches from it (``seed_cache``). An entry is keyed by libtpu, jax, the kernel
#: sources and the call, so a seed entry that no longer matches is never read.
SEED_FOLDER = "estimate_cache"


def seed_cache(seed: Path) -> int:
    """Copy the seed's entries (``seed/<libtpu>/<key>.json``) into ``cache_dir()`` where missing;
    returns how many were copied."""
    copied = 0
    for entry in sorted(Path(seed).glob("*/*.json")):
        target = cache_dir() / entry.parent.name / entry.name
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_bytes(entry.read_bytes())
            tmp.replace(target)
            copied += 1
    return copied


def _is_current(record: dict) -> bool:
    """Whether a cache entry was computed with this libtpu, jax and attribution format (its program
    and rules are in its key: an entry of a program since changed is never looked up again)."""
    key = record.get("key", {})
    tools = tool_key()
    return {name: key.get(name) for name in tools} == tools


def usage_mark() -> float:
    """A time on the file system's clock (the cache folder's): an entry read or written after this
    call (``read_entry`` and ``write_entry`` touch it) has a later modification time, one written
    before it none later. For ``export_seed(used_since=...)``."""
    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    probe = folder / f".mark.{os.getpid()}"
    probe.touch()
    mark = probe.stat().st_mtime
    while probe.stat().st_mtime <= mark:  # file times come from a coarse clock: wait out its tick
        time.sleep(0.001)
        os.utime(probe)
    probe.unlink()
    return mark


def export_seed(seed: Path, used_since: float | None = None) -> int:
    """Replace the seed with the cache's current entries (``_is_current``); returns how many. An
    entry is keyed by its program, so nothing says when it is stale (a kernel since edited, a
    notebook kernel since rewritten): where ``used_since`` (a ``usage_mark``) is given, only the
    entries read or written after it are kept."""
    seed = Path(seed)

    def kept(path: Path) -> bool:
        entry = json.loads(path.read_text())
        unused = used_since is not None and path.stat().st_mtime <= used_since
        return _is_current(entry) and not unused

    current = [p for p in sorted(cache_dir().glob("*/*.json")) if kept(p)]
    keep = {(p.parent.name, p.name) for p in current}
    for old in seed.glob("*/*.json"):
        if (old.parent.name, old.name) not in keep:
            old.unlink(missing_ok=True)  # several main jobs (the tests' notebook runs) may export at once
    for entry in current:
        target = seed / entry.parent.name / entry.name
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(entry.read_bytes())
        tmp.replace(target)
    return len(current)


def implementation_module(impl: str) -> str:
    """The stlib module (path relative to the package, no suffix) that defines ``impl``'s forward."""
    from stlib.registry import get

    module = get(impl).forward.__module__
    if not module.startswith("stlib."):
        raise ValueError(f"{impl!r}: its forward lives outside stlib ({module})")
    return module.removeprefix("stlib.").replace(".", "/")


def source_files(impl: str) -> set[Path]:
    """The sources that shape ``impl``'s compiled kernels: what its forward's module and
    ``CALL_MODULES`` import inside stlib, transitively."""
    module = "stlib." + implementation_module(impl).replace("/", ".")
    return module_sources((module, *CALL_MODULES), stlib_dir())


def source_hash(impl: str) -> str:
    """Hash of the sources that shape ``impl``'s compiled kernels (``source_files``): what the block
    sweep's records are marked with (an edit to any of them starts a new sweep). The estimate cache
    is keyed by the program instead (``program_hash``)."""
    return _files_hash(sorted(source_files(impl)))


#: (path, modification time, size) of each file, in order -> ``_files_hash``: a lookup hashes a
#: kernel's sources, about 50 files, every time.
_HASHED: dict[tuple, str] = {}


def _files_hash(files) -> str:
    """16 hex digits over each file's path (relative to the package) and bytes, in the given order;
    remembered per process while no file is edited."""
    files = list(files)
    stamp = tuple((str(p), (st := p.stat()).st_mtime_ns, st.st_size) for p in files)
    if stamp not in _HASHED:
        root = stlib_dir()
        digest = hashlib.sha256()
        for path in files:
            digest.update(path.relative_to(root).as_posix().encode() + path.read_bytes())
        _HASHED[stamp] = digest.hexdigest()[:16]
    return _HASHED[stamp]


#: The estimator's own files (relative to the package): they turn a compiled schedule into an
#: estimate (paths, the MXU feed, the clock), so an edit to one changes estimates that no program
#: hash or cache key sees. Only these files, not what they import: a kernel edit is ``source_hash``'s.
ESTIMATOR_FILES = (
    "analysis/kernel_estimate.py",
    "analysis/mxu_input.py",
    "analysis/attribution.py",
    "analysis/schedule.py",
    "analysis/clock.py",
)


def estimator_hash() -> str:
    """Hash of the estimator's own sources (``ESTIMATOR_FILES``): what the block sweep's records are
    marked with besides the kernel's ``source_hash``, so that estimates made by an older estimator
    are never ranked beside newer ones.

    >>> len(estimator_hash())
    16
    """
    return _files_hash(stlib_dir() / name for name in ESTIMATOR_FILES)


#: The module whose ``traced_call`` every cached call is traced by (it imports every kernel): with
#: the implementation's own sources, what ``trace_hash`` covers.
TRACE_MODULES = ("stlib.analysis.dump",)


def trace_hash(impl: str) -> str:
    """Hash of every source a cached call of ``impl`` is traced from: its own (``source_files``) and
    the tracer's (``TRACE_MODULES``, transitively: every kernel). Keys ``traced_program``'s memo."""
    return _files_hash(sorted(source_files(impl) | module_sources(TRACE_MODULES, stlib_dir())))


def traced_program(config: KernelConfig, mask_digest: str | None) -> str:
    """``program_hash(config)``, remembered on disk beside the estimates (a cache entry keyed by
    ``tool_key``, ``trace_hash``, the config and the mask's digest): a cached estimate is then
    found without tracing its call again, which costs up to a second and a half a call (Splash
    building its mask tables for a 32,768-token causal mask; a chip's calibration traces 13
    calls). An edit to any source the trace reads misses the memo, never the estimate: the call
    is traced again and its program looked up as before."""
    key_data = {
        **tool_key(),
        "trace": trace_hash(config.impl),
        "config": dataclasses.asdict(dataclasses.replace(config, mask_file=None)),
        "mask": mask_digest,
    }
    memo = read_entry(key_data)
    if memo is not None:
        return memo["program"]
    program = program_hash(config)
    write_entry(key_data, {"key": key_data, "program": program})
    return program


def rules_hash(impl: str, backward: bool = False) -> str:
    """Hash of the source of the rules that name ``impl``'s compute regions (its and its backward's
    ``compute_regions``, and, for a ``backward`` call, its backward's ``edge_regions`` where it has
    them): they shape a cached attribution without changing the program."""
    import inspect

    from stlib.registry import get

    implementation = get(impl)
    hooks = [implementation.estimator]
    if implementation.backward is not None:
        hooks.append(implementation.backward.estimator)
    rules = [None if h is None else h.compute_regions for h in hooks]
    if backward and hooks[-1] is not None and hooks[-1].edge_regions is not None:
        rules.append(hooks[-1].edge_regions)
    digest = hashlib.sha256()
    for rule in rules:
        digest.update(b"-" if rule is None else inspect.getsource(rule).encode())
    return digest.hexdigest()[:16]


def tool_key() -> dict:
    """What every cache entry is keyed by besides its call: the attribution format, libtpu and jax."""
    return {"format": FORMAT_VERSION, "libtpu": check_libtpu(), "jax": importlib.metadata.version("jax")}


def _entry_path(key_data: dict) -> Path:
    key = hashlib.sha256(json.dumps(key_data, sort_keys=True).encode()).hexdigest()[:24]
    return cache_dir() / key_data["libtpu"] / f"{key}.json"


def read_entry(key_data: dict) -> dict | None:
    """The cached entry of ``key_data`` (``tool_key()`` and the call), or None."""
    path = _entry_path(key_data)
    if not path.exists():
        return None
    entry = json.loads(path.read_text())
    try:
        os.utime(path)  # used now (``usage_mark``)
    except OSError:  # a read-only cache is still read
        pass
    return entry


def write_entry(key_data: dict, entry: dict) -> None:
    """Store ``entry`` (which holds ``key_data`` under "key") atomically: concurrent writers are safe."""
    path = _entry_path(key_data)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(entry, indent=1))
    tmp.replace(path)


def attribute_dump(
    dump: str, chip: str, impl: str | None, keep=None, compute_names: list[str] | None = None
) -> list[Attribution]:
    """Every Pallas kernel of a libtpu dump (those ``keep`` keeps, ``dump_files``), its schedule parsed in
    ``chip``'s form and attributed (``impl``'s rules, or ``compute_names`` for a kernel of no impl)."""
    form = chip_spec(chip).schedule_form
    out = []
    for name, (text, analysis, utilization) in sorted(dump_files(dump, keep).items()):
        schedule = parse_schedule(text, analysis, form)
        occupancy = parse_utilization(utilization, len(schedule.bundles))
        out.append(attribute(schedule, impl, name, compute_names=compute_names, occupancy=occupancy))
    return out


class NotCached(LookupError):
    """An estimate's compiled kernels are not in the cache, and compiling is off (``cached_only``)."""


_cached_only = False


def cached_only(on: bool = True) -> bool:
    """``on``: estimates come from the cache alone, a call not in it raises ``NotCached`` instead of
    compiling in a subprocess (a notebook on a TPU host, where that compile costs tens of seconds a
    kernel, reads the committed seed only). Returns the previous setting."""
    global _cached_only
    previous, _cached_only = _cached_only, bool(on)
    return previous


def compiled_attributions(
    impl: str, config: KernelConfig, mask_bytes: bytes | None = None, use_cache: bool = True
) -> dict:
    """{"kernels": [Attribution as dict], "layouts": {kernel: [operand layouts]}, "glue_bytes": int,
    "compile_seconds": float} of ``config``, compiled in a subprocess and attributed; cached on disk
    by libtpu, jax, the program (``program_hash``), the region rules and the config. Raises
    ``NotCached`` for a call not in the cache while ``cached_only`` is on."""
    with tempfile.TemporaryDirectory(prefix="stlib-estimate-") as dump:
        if mask_bytes is not None:
            config = dataclasses.replace(config, mask_file=os.path.join(dump, "mask.pkl"))
            Path(config.mask_file).write_bytes(mask_bytes)
        mask_digest = hashlib.sha256(mask_bytes).hexdigest() if mask_bytes else None
        key_data = {
            **tool_key(),
            "program": traced_program(config, mask_digest) if use_cache else program_hash(config),
            "rules": rules_hash(impl, config.backward),
            "config": dataclasses.asdict(dataclasses.replace(config, mask_file=None)),
            "mask": mask_digest,
        }
        cached = read_entry(key_data) if use_cache else None
        if cached is not None:
            return cached
        if _cached_only:
            raise NotCached(
                f"{config.impl} on {config.mask} for {config.chip} is not in the estimate cache {cache_dir()}"
            )
        seconds = compile_with_dump(config, dump)
        kernels = [dataclasses.asdict(a) for a in attribute_dump(dump, config.chip, impl)]
        hlo = read_hlo(dump)
        glue = glue_bytes(hlo)
        layouts = kernel_layouts(hlo)
    missing = sorted({k["kernel"] for k in kernels} - set(layouts))
    if missing:
        raise ScheduleFormatError(
            f"kernels {missing} have no custom-call in the scheduled HLO to read layouts from"
        )
    result = {
        "key": key_data,
        "kernels": kernels,
        "layouts": {k["kernel"]: layouts[k["kernel"]] for k in kernels},
        "glue_bytes": glue,
        "compile_seconds": seconds,
    }
    if use_cache:
        write_entry(key_data, result)
    return result
