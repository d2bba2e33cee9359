"""Pallas TPU attention kernels; importing this package registers them with ``stlib.attention``."""

from stlib.kernels import dense  # noqa: F401
from stlib.kernels import block_sparse  # noqa: F401
from stlib.kernels import tile  # noqa: F401
from stlib.kernels import splash  # noqa: F401
