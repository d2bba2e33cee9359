"""The first cell of every notebook: what we run on, and which sizes to use.

``setup(size)`` prints the JAX version, backend and device kind and returns a ``NotebookConfig``:
the case-study sizes on a TPU, small sizes elsewhere (Pallas interpret mode on a CPU). ``size``
("full" / "small" / None) comes from the notebook's tagged parameters cell; the environment
variable ``STLIB_SIZE`` overrides both. Nothing here asserts that a TPU is present.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import jax
import jax.numpy as jnp

from stlib.configs import CASE_STUDY, SMALL_CPU, Workload
from stlib.device import backend, device_kind, on_tpu

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class NotebookConfig:
    size: str  # "full" or "small"
    workload: Workload
    interpret: bool  # Pallas interpret mode (no TPU)
    block_q: int
    block_kv: int
    figures: Path
    data: Path

    @property
    def on_tpu(self) -> bool:
        return not self.interpret

    def figure(self, name: str) -> Path:
        """figures/NN_name.png"""
        return self.figures / f"{name}.png"

    @property
    def where(self) -> str:
        """Backend words for titles: 'TPU v6e lite' or 'CPU (Pallas interpret mode)'."""
        return device_kind() if self.on_tpu else f"{backend().upper()} (Pallas interpret mode: not TPU times)"


def setup(size: str | None = None) -> NotebookConfig:
    """Report the platform and pick the configuration (see the module docstring)."""
    size = os.environ.get("STLIB_SIZE") or size or ("full" if on_tpu() else "small")
    if size not in ("full", "small"):
        raise ValueError(f"size={size!r} must be 'full', 'small' or None (STLIB_SIZE={os.environ.get('STLIB_SIZE')!r})")
    workload = CASE_STUDY if size == "full" else SMALL_CPU
    config = NotebookConfig(
        size=size, workload=workload, interpret=not on_tpu(),
        block_q=512 if size == "full" else 128, block_kv=1024 if size == "full" else 128,
        figures=REPO / "figures", data=REPO / "data",
    )
    print(f"JAX {jax.__version__} | backend {backend()} | device {device_kind()}")
    print(f"configuration: {size} -> {workload.name}: grid {workload.grid.shape} = {workload.num_tokens:,} tokens, "
          f"{workload.num_heads} heads x {workload.head_dim}, {jnp.dtype(workload.dtype).name}; "
          f"tiles {config.block_q} x {config.block_kv}; "
          + ("compiled Pallas kernels" if config.on_tpu else "Pallas interpret mode (times are not TPU times)"))
    return config


def max_error(out, q, k, v, mask=None, rows: int = 384) -> float:
    """max |out - reference| for [H, L, D] attention output ``out``: over every row when L fits the
    materialising reference (``stlib.kernels.xla.REFERENCE_LIMIT``), else over ``rows`` query rows at the
    start, middle and end of the sequence (the reference on those rows only, never L x L)."""
    import numpy as np

    from stlib.api import attention
    from stlib.kernels.xla import REFERENCE_LIMIT
    from stlib.reference import reference_attention

    length, n = q.shape[1], rows // 3
    if length <= REFERENCE_LIMIT:
        ref = attention(q, k, v, mask)
        return float(jnp.max(jnp.abs(out.astype(jnp.float32) - ref.astype(jnp.float32))))
    err = 0.0
    heads = [0] if mask is None or mask.num_heads is None else range(mask.num_heads)
    for q0 in (0, (length - n) // 2, length - n):
        dense = None if mask is None else np.stack([mask.block(q0, q0 + n, 0, length, h) for h in heads])
        ref = reference_attention(q[:, q0:q0 + n], k, v, dense, q.shape[2] ** -0.5)
        err = max(err, float(jnp.max(jnp.abs(out[:, q0:q0 + n].astype(jnp.float32) - ref.astype(jnp.float32)))))
    return err


def tolerance(dtype) -> float:
    """Max error allowed against the float32 reference: bf16 inputs meet bf16 probabilities on the
    MXU; float32 is exact to rounding on a CPU, default-precision matmuls on a TPU."""
    return 2e-2 if dtype == jnp.bfloat16 else (1e-4 if jax.default_backend() == "cpu" else 1e-2)
