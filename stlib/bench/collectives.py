"""What a compiled program's collectives move: the all-to-alls and collective-permutes of its HLO
text with their bytes per device (``all_to_all_bytes``, ``permute_bytes``), how many of a ring's
transfers start before its first kernel (``permutes_ahead``) and how many kernels run before the
first of them lands (``kernels_before_arrival``), how many distinct kernel bodies its Mosaic calls
hold (``kernel_bodies``: libtpu compiles a body once however many calls run it), and the share of each collective's
bytes bound for another chip, from the devices' chip coordinates (``chip_groups``: a TPU7x chip holds
two devices). Read by ``stlib.bench.slice_compile``, ``stlib.bench.slice_traffic`` and notebook 11."""

from __future__ import annotations

import re

import numpy as np

_ALL_TO_ALL = re.compile(r"= (\w+)\[([\d,]*)\][^ ]* all-to-all\(")
#: A collective-permute's result: its array, or the (operand, result, contexts) tuple of the async
#: "-start" form, whose first array is the one sent.
_PERMUTE = re.compile(r"= \(?(\w+)\[([\d,]*)\][^=\n]*? collective-permute(?:-start)?\(")
_ITEMSIZE = {"bf16": 2, "f16": 2, "f32": 4, "s32": 4, "u32": 4, "s8": 1, "u8": 1, "pred": 1}


def _collective_bytes(pattern: re.Pattern, hlo_text: str) -> list[int]:
    return [
        int(np.prod([int(d) for d in dims.split(",") if d])) * _ITEMSIZE[dtype]
        for dtype, dims in pattern.findall(hlo_text)
    ]


def all_to_all_bytes(hlo_text: str) -> list[int]:
    """The bytes per device of every all-to-all in a compiled program's HLO text."""
    return _collective_bytes(_ALL_TO_ALL, hlo_text)


def permute_bytes(hlo_text: str) -> list[int]:
    """The bytes per device each collective-permute of a compiled program's HLO text sends."""
    return _collective_bytes(_PERMUTE, hlo_text)


_ENTRY_OP = re.compile(
    r"= [^=\n]*? (collective-permute-start|collective-permute-done|conditional|custom-call)\("
)
_KERNEL_OPS = ("conditional", "custom-call")


def _entry_ops(hlo_text: str) -> list[str]:
    """The permute starts and dones, branches and kernels of a compiled program's entry computation,
    in the order it runs them."""
    return _ENTRY_OP.findall(hlo_text[hlo_text.index("ENTRY") :])


def permutes_ahead(hlo_text: str) -> tuple[int, int]:
    """(the collective-permutes of a compiled program's entry computation that start before its first
    kernel or branch runs, all of them): how far a ring's transfers run ahead of its compute.

    >>> ops = ["collective-permute-start(%x)", "conditional(%i)", "collective-permute-start(%y)"]
    >>> permutes_ahead("ENTRY %main {" + "".join(f" %{n} = bf16[2] {op}" + chr(10) for n, op in enumerate(ops)))
    (1, 2)
    """
    ops = _entry_ops(hlo_text)
    starts = [n for n, op in enumerate(ops) if op == "collective-permute-start"]
    first = next((n for n, op in enumerate(ops) if op in _KERNEL_OPS), len(ops))
    return sum(n < first for n in starts), len(starts)


def kernels_before_arrival(hlo_text: str) -> int:
    """The kernels or branches a compiled program's entry computation runs before its first
    collective-permute completes: a ring's local hop computing while the first kv shard travels
    (0: each device waits for that shard with nothing to do).

    >>> ops = ["conditional(%i)", "collective-permute-done(%s)", "conditional(%j)"]
    >>> kernels_before_arrival("ENTRY %main {" + "".join(f" %{n} = bf16[2] {op}" + chr(10) for n, op in enumerate(ops)))
    1
    """
    ops = _entry_ops(hlo_text)
    arrival = ops.index("collective-permute-done") if "collective-permute-done" in ops else len(ops)
    return sum(op in _KERNEL_OPS for op in ops[:arrival])


def chip_groups(mesh, axis: str) -> np.ndarray:
    """int [groups, n]: the chip of each device of ``mesh`` (numbered by its chip coordinates: a
    TPU7x chip holds two devices), the groups of the collective over ``axis`` (of n devices) as rows."""
    devices = np.moveaxis(np.asarray(mesh.devices), mesh.axis_names.index(axis), -1)
    coords = [tuple(d.coords) for d in devices.reshape(-1)]
    numbers = {c: n for n, c in enumerate(dict.fromkeys(coords))}
    return np.array([numbers[c] for c in coords]).reshape(-1, mesh.shape[axis])


def all_to_all_offchip(chips: np.ndarray) -> float:
    """The share of an all-to-all's bytes bound for another chip, for ``chip_groups``' rows: each
    device sends 1 / n of its operand to each device of its row (itself included).

    >>> all_to_all_offchip(np.array([[0, 0, 1, 1]])), all_to_all_offchip(np.array([[0, 1, 2, 3]]))
    (0.5, 0.75)
    """
    return float((chips[:, :, None] != chips[:, None, :]).mean())


def permute_offchip(chips: np.ndarray, offsets) -> float:
    """The share of a ring's permute bytes bound for another chip, for ``chip_groups``' rows (each a
    ring): over the hop ``offsets`` past 0 and the devices j, how often (j + offset) mod n sits on
    another chip than j; 0.0 where no hop moves anything.

    >>> chips = np.array([[0, 0, 1, 1]])  # a ring of 4 over two TPU7x chips
    >>> permute_offchip(chips, [0, 1]), permute_offchip(chips, [2]), permute_offchip(chips, [0])
    (0.5, 1.0, 0.0)
    """
    n = chips.shape[1]
    moving = [o % n for o in offsets if o % n]
    if not moving:
        return 0.0
    return float(np.mean([chips != np.roll(chips, -o, axis=1) for o in moving]))


__all__ = [
    "all_to_all_bytes",
    "all_to_all_offchip",
    "chip_groups",
    "kernels_before_arrival",
    "permute_bytes",
    "permute_offchip",
    "permutes_ahead",
]


_KERNEL_BODY = re.compile(r'"custom_call_config":\{"body":"([^"]+)"')


def kernel_bodies(hlo_text: str) -> tuple[int, int]:
    """(Mosaic kernel calls, distinct kernel bodies among them) in a compiled program's HLO text.

    A program compiles one Mosaic kernel per distinct body: ``python -m stlib.bench.slice_compile
    reuse`` compiles six calls of one band kernel in about the time of one call, and six bands of
    different widths (six bodies) in about four times that. So a ring whose hops share one body
    (their tables as data: ``stlib.ring.shared_kernel``) compiles its forward in the time of one hop.

    >>> call = 'custom_call_target="tpu_custom_call", backend_config={"custom_call_config":{"body":"%s"}}'
    >>> kernel_bodies("\\n".join([call % "QUJD", call % "QUJD", call % "REVG"]))
    (3, 2)
    """
    bodies = _KERNEL_BODY.findall(hlo_text)
    return len(bodies), len(set(bodies))
