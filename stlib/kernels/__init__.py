"""Every attention implementation, one module each; importing this package registers them with
``stlib.registry`` (adding a kernel: its own module plus one line here)."""

from stlib.kernels import (
    block_sparse,  # noqa: F401
    dense,  # noqa: F401
    splash,  # noqa: F401
    tile,  # noqa: F401
    tile_lane_dense,  # noqa: F401
    xla,  # noqa: F401
)
