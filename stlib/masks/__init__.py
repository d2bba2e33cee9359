"""Attention masks for video tokens, evaluated lazily: "may query i see key j", never as L x L.

``base`` holds the mask protocol (``allowed``, ``block``, ``key_intervals``, value equality,
``children``), ``&`` / ``|`` and permuted views; ``sequence`` the plain sequence masks (full, band, causal,
explicit arrays, per-head); ``video`` the masks on a (T, Y, X) grid; ``svg`` the masks of a Sparse
VideoGen plan; ``catalogue`` the named case-study masks. Every name is re-exported here:
``from stlib.masks import X`` and ``stlib.masks.X`` are the import paths the rest of the library uses.
"""

from stlib.masks.base import (
    DENSE_LIMIT,
    MAX_TRACED_HEAD_MASKS,
    CombineOp,
    Mask,
    PermutedMask,
)
from stlib.masks.base import _Combined as _Combined  # private names that other stlib modules use
from stlib.masks.base import _HeadView as _HeadView
from stlib.masks.base import _xp as _xp
from stlib.masks.catalogue import case_study_masks
from stlib.masks.sequence import (
    ArrayMask,
    BandMask,
    CausalMask,
    FullMask,
    MultiHeadMask,
    band,
    band_width_for_density,
    causal,
    from_array,
    full,
    per_head,
)
from stlib.masks.svg import KeptTilesMask, TokenMajorPrefixMask
from stlib.masks.video import (
    FirstFrameMask,
    FrameCausalMask,
    FrameWindowMask,
    GlobalTokensMask,
    NeighborhoodMask,
    RadialMask,
    SlidingTileMask,
    SpatialNeighbourMask,
    TokenMajorBandMask,
    VideoMask,
    frame_causal,
    global_tokens,
    neighborhood,
    radial,
    sliding_tile,
    spatial,
    spatial_band,
    temporal,
    temporal_band,
)
from stlib.masks.video import _VideoBand as _VideoBand

__all__ = [
    "DENSE_LIMIT",
    "MAX_TRACED_HEAD_MASKS",
    "ArrayMask",
    "BandMask",
    "CausalMask",
    "CombineOp",
    "FirstFrameMask",
    "FrameCausalMask",
    "FrameWindowMask",
    "FullMask",
    "GlobalTokensMask",
    "KeptTilesMask",
    "Mask",
    "MultiHeadMask",
    "NeighborhoodMask",
    "PermutedMask",
    "RadialMask",
    "SlidingTileMask",
    "SpatialNeighbourMask",
    "TokenMajorBandMask",
    "TokenMajorPrefixMask",
    "VideoMask",
    "band",
    "band_width_for_density",
    "case_study_masks",
    "causal",
    "frame_causal",
    "from_array",
    "full",
    "global_tokens",
    "neighborhood",
    "per_head",
    "radial",
    "sliding_tile",
    "spatial",
    "spatial_band",
    "temporal",
    "temporal_band",
]
