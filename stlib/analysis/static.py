"""``stlib.static_estimate``: the pinned entry point of the static TPU estimate, for any kernel of the
registry and any configuration it supports (shared kv heads, causal, head dims qk != v, long
sequences), with ``block_sizes="tuned"``: the best of the implementation's ``tuned_candidates``, as a
practitioner who tunes would. Composes the clock-free per-kernel estimate
(``kernel_estimate``) with a clock (``clock``): ``estimate``."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

from stlib import registry
from stlib.analysis.clock import resolve_clock
from stlib.analysis.kernel_estimate import Estimate, check_chip, estimate_at_clock, make_config
from stlib.analysis.schedule import ScheduleFormatError

#: libtpu 0.0.42.1's refusal of a program whose HBM does not fit (sizes in GiB, "G" in its words)
_HBM_REFUSAL = re.compile(
    r"total memory required for HLO temporaries \(([0-9.]+)G\) exceeds available HBM \(([0-9.]+)G\)"
)


@dataclasses.dataclass(frozen=True)
class TunedEstimate(Estimate):
    """An estimate at the best of the implementation's ``tuned_candidates``; ``sweep``: (block_q,
    block_kv, total ms, or the reason the blocks failed) for every candidate."""

    sweep: tuple = ()


def estimate(
    impl: str,
    mask="none",
    chip: str = "v6e",
    *,
    clock="calibrated",
    use_cache: bool = True,
    **call,
) -> Estimate:
    """Static estimate of ``impl`` on ``mask`` for ``chip`` (the keywords of
    ``kernel_estimate.estimate_at_clock``: blocks, options, heads, head dims, dtype, length) at
    ``clock``: "calibrated" (default, ``clock.calibration``), "peak", or Hz. Raises ValueError for
    an unknown chip or clock, ScheduleFormatError for a libtpu or dump this parser does not know,
    RuntimeError when the kernel does not compile."""
    check_chip(chip)
    make_config(impl, mask, chip, **call)  # bad input raises before the clock's calibration compiles
    hz, assumption = resolve_clock(clock, chip, use_cache)
    return estimate_at_clock(
        impl, mask, chip, clock_hz=hz, clock_assumption=assumption, use_cache=use_cache, **call
    )


def static_estimate(
    impl: str,
    mask="none",
    chip: str = "v6e",
    *,
    num_heads: int,
    num_kv_heads: int | None = None,
    head_dim: int,
    head_dim_v: int | None = None,
    length: int,
    dtype: str = "bfloat16",
    block_sizes=None,
    options=None,
    backward: bool = False,
    clock="calibrated",
    use_cache: bool = True,
) -> Estimate:
    """Static TPU time estimate of one attention call (never a measurement): q [num_heads, length,
    head_dim], k [num_kv_heads, length, head_dim], v [num_kv_heads, length, head_dim_v] of ``dtype``.

    ``impl``: a registered Pallas implementation (``stlib.registry.tpu_kernels()``); ``mask``: "none",
    "full", "causal", "band (density X)", "band (width W)", a case-study catalogue name, or an stlib
    mask; ``chip``: one of ``ESTIMATE_CHIPS`` ("v6e", "v5e", "tpu7x"). ``block_sizes``: None (the
    kernel's defaults), {"block_q": .., "block_kv": ..}, or "tuned" (the best total of a small sweep;
    the result's ``sweep`` lists every candidate; the backward sweeps the same candidates, its
    tiles being the forward's). ``backward``: the estimate of the call's backward alone
    (its Pallas kernels from the forward's residuals, and their XLA glue), with the forward's
    calibrated clock: nothing is fitted to backward timings. Shared kv heads and head_dim_v != head_dim:
    where the implementation ``supports`` them. Returns an ``Estimate``: ``seconds`` (kernels), ``glue_seconds``,
    ``total_seconds``, ``blocks`` and the per-path breakdown in ``kernels``.

    Raises ValueError for an unknown chip, impl, option or an unsupported configuration,
    ScheduleFormatError for a libtpu or dump this estimator does not know, RuntimeError when the
    kernel does not compile.

    >>> import stlib
    >>> est = stlib.static_estimate("splash", "full", "v6e", num_heads=10, head_dim=128, length=75_600)
    >>> est.blocks["block_q"], est.blocks["block_kv"], round(est.seconds * 1e3, 2)  # the case study's dense Splash
    (512, 1024, 78.7)
    """
    common = {
        "num_heads": num_heads,
        "num_kv_heads": num_kv_heads,
        "head_dim": head_dim,
        "head_dim_v": head_dim_v,
        "length": length,
        "dtype": dtype,
        "options": dict(options) if options else None,
        "backward": backward,
        "clock": clock,
        "use_cache": use_cache,
    }
    if block_sizes is None:
        return estimate(impl, mask, chip, **common)
    if isinstance(block_sizes, Mapping):
        unknown = sorted(set(block_sizes) - {"block_q", "block_kv"})
        if unknown:
            raise ValueError(f"block_sizes has unknown keys {unknown}; use 'block_q' and 'block_kv'")
        return estimate(
            impl,
            mask,
            chip,
            block_q=block_sizes.get("block_q"),
            block_kv=block_sizes.get("block_kv"),
            **common,
        )
    if block_sizes != "tuned":
        raise ValueError(f"block_sizes={block_sizes!r} must be None, 'tuned' or a dict of block_q / block_kv")
    best, sweep = None, []
    for bq, bkv in registry.get(impl).estimator.tuned_candidates:
        try:
            est = estimate(impl, mask, chip, block_q=bq, block_kv=bkv, **common)
        except ScheduleFormatError:  # a schedule this reader does not know: never skipped silently
            raise
        except RuntimeError as error:  # a block that does not compile (VMEM, SMEM) is no candidate
            sweep.append((bq, bkv, f"does not compile: {str(error).strip().splitlines()[-1][:160]}"))
            continue
        sweep.append((bq, bkv, est.total_seconds * 1e3))
        if best is None or est.total_seconds < best.total_seconds:
            best = est
    if best is None:
        raise RuntimeError(_no_candidate_fits(impl, chip, common, sweep))
    fields = {f.name: getattr(best, f.name) for f in dataclasses.fields(Estimate)}
    return TunedEstimate(**fields, sweep=tuple(sweep))


def hbm_shortfall(message: str) -> tuple[float, float] | None:
    """(GiB of HLO temporaries the program needs, GiB of HBM the device has) from a compile error's
    text when it ran out of HBM (libtpu's ``RESOURCE_EXHAUSTED ... exceeds available HBM``), else None.

    >>> hbm_shortfall("Ran out of memory on HBM, the total memory required for HLO temporaries "
    ...               "(138.15G) exceeds available HBM (94.75G).")
    (138.15, 94.75)
    >>> hbm_shortfall("exceeds scoped vmem") is None
    True
    """
    found = _HBM_REFUSAL.search(message)
    return None if found is None else (float(found[1]), float(found[2]))


def _no_candidate_fits(impl: str, chip: str, call: dict, sweep: list) -> str:
    """The one sentence a tuned estimate raises when no candidate compiles: when every candidate ran
    out of HBM, how much the smallest program needs against the device's HBM, else the sweep."""
    needs = [(hbm_shortfall(reason), bq, bkv) for bq, bkv, reason in sweep]
    if not needs or any(n is None for n, _, _ in needs):
        return f"no block size of the sweep compiles: {sweep}"
    (need, have), bq, bkv = min(needs)
    direction = "backward" if call.get("backward") else "forward"
    kv = call.get("num_kv_heads") or call["num_heads"]
    shape = f"{call['num_heads']}:{kv} heads x {call['length']:,} x {call['head_dim']}"
    return (
        f"no block size of the sweep fits the {direction} of {impl} ({shape}) in one {chip} device's HBM: "
        f"the smallest program, at blocks {bq}/{bkv}, needs {need:.2f} GiB of HLO temporaries against "
        f"{have:.2f} GiB ({need - have:.2f} GiB over; every candidate: "
        + ", ".join(f"{b}/{k} {n[0]:.2f} GiB" for n, b, k in needs)
        + ")"
    )
