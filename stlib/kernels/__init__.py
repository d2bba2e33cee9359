"""Pallas TPU attention kernels; importing this package registers them with ``stlib.attention``."""

from stlib.kernels import (
    block_sparse,  # noqa: F401
    dense,  # noqa: F401
    splash,  # noqa: F401
    tile,  # noqa: F401
)
