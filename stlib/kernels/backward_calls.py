"""Which Pallas calls the backward of the tile kernels runs (``kernel_calls``): per pass of the
forward, the fused dk / dv / dq kernel once per dq window (``backward_vmem.dq_windows``), or the
split dq and dk / dv kernels; the lone call that is the whole backward ``finishes`` (writes dq, dk,
dv final). ``stlib.kernels.backward`` runs them."""

from __future__ import annotations

import dataclasses

import numpy as np

from stlib.kernels.backward_kernels import DKV_PREFIX, DQ_PREFIX, FUSED_PREFIX
from stlib.kernels.backward_steps import StepCodes, kernel_word
from stlib.kernels.backward_vmem import dq_windows
from stlib.passes import MaskPlan

#: How the backward runs: "fused" (one dk / dv / dq kernel per pass and dq window, 5 matmuls per
#: tile), "split" (a dq kernel and a dk / dv kernel per pass, 7 matmuls: the oracle) or "auto" (fused
#: where a dq window of at least one q tile fits in VMEM, else split).
BACKWARD_METHODS = ("auto", "fused", "split")


def _window_selected(selected: np.ndarray, window) -> np.ndarray:
    """``selected`` ([Hl, nq, nk]) with the q tiles outside ``window`` dropped."""
    keep = np.zeros(selected.shape[1], bool)
    keep[window[0] : window[1]] = True
    return selected & keep[None, :, None]


@dataclasses.dataclass(frozen=True)
class KernelCall:
    """One Pallas call of the backward: its kernel ``name``, ``kind`` ("fused", "dq" or "dkv"), the
    tiles it computes (``selected``, [Hl, nq, nk]), the pass's mask plan and, fused, its q-tile
    ``window`` and, for a step-coded pass (kind STEPS), its ``steps``."""

    name: str
    kind: str
    selected: np.ndarray
    plan: MaskPlan
    window: tuple[int, int] | None = None
    steps: StepCodes | None = None
    finishes: bool = False  # the backward's only call: it writes dq, dk, dv scaled, in the inputs' dtype


#: Rows a finishing call's last dq copy may end on: whole packed sublane tiles of a bf16 array.
FINISH_ROWS = 16


def _finishing(calls: list[KernelCall], num_q_tiles: int, length: int | None) -> list[KernelCall]:
    """``calls``, the only one marked ``finishes`` where it is the whole backward: one fused call over
    every q tile (one dq window) that visits every kv tile of every head, for arrays of ``length``
    rows, a multiple of ``FINISH_ROWS`` (None: unknown, nothing marked). Each of dq, dk and dv is
    then written once, by it, and needs no f32 buffer in HBM, no zeros and no scale-and-cast pass."""
    if length is None or length % FINISH_ROWS or len(calls) != 1:
        return calls
    if calls[0].kind != "fused" or calls[0].window != (0, num_q_tiles):
        return calls
    if not calls[0].selected.any(axis=1).all():  # a kv tile no query sees: its zeros come from HBM
        return calls
    return [dataclasses.replace(calls[0], finishes=True)]


def kernel_calls(
    passes, method: str, *, num_q_tiles, block_q, block_kv, head_dim, itemsize, chip, length=None
):
    """The backward's Pallas calls over the forward's ``passes``, in order: per pass, the fused
    kernel once per dq window with tiles in it (``dq_windows``), or the dq then the dk / dv kernel
    (``method`` "split", or "auto" where no window fits). A step-coded pass runs fused only. Raises
    ValueError for ``method`` "fused" (or a step-coded pass) where no window fits, and for an
    unknown method. ``length``: the arrays' rows, where a lone call may finish (``_finishing``)."""
    if method not in BACKWARD_METHODS:
        raise ValueError(f"method={method!r} must be one of {BACKWARD_METHODS}")
    calls = []
    for p in passes:
        steps = p.steps
        if steps is not None and method == "split":
            raise ValueError("a step-coded pass runs fused only (method='split')")
        windows = []
        if method != "split":
            score_rows = None if steps is None else steps.score_rows
            windows = dq_windows(num_q_tiles, block_q, block_kv, head_dim, itemsize, chip, score_rows)
            if not windows and (method == "fused" or steps is not None):
                raise ValueError(
                    f"the fused backward's dq scratch of one {block_q}-row q tile does not fit in VMEM "
                    f"beside {block_q}x{block_kv} tiles on {chip or 'the smallest chip'}; "
                    + ("use method='split'" if steps is None else "a step-coded pass runs fused only")
                )
        if not windows:
            calls += [
                KernelCall(f"{DQ_PREFIX}_{p.name}", "dq", p.selected, p.plan),
                KernelCall(f"{DKV_PREFIX}_{p.name}", "dkv", p.selected, p.plan),
            ]
            continue
        for i, window in enumerate(windows):
            selected = _window_selected(p.selected, window)
            if selected.any():
                word = p.name if steps is None else kernel_word(steps, selected)
                calls.append(
                    KernelCall(f"{FUSED_PREFIX}_{word}_w{i}", "fused", selected, p.plan, window, steps)
                )
    return _finishing(calls, num_q_tiles, length)


__all__ = ["BACKWARD_METHODS", "FINISH_ROWS", "KernelCall", "kernel_calls"]
