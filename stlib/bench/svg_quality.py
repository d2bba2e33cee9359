"""What a Sparse VideoGen plan loses against dense attention, and the work it executes: per head
error and recall (``attention_quality``), the executed flops of a plan (``plan_work``), and the
quality sweep over patterns, densities, anchors and boundary policies (``quality_sweep``), whose
records ``record_quality`` appends to ``data/svg_quality.jsonl`` (notebook 09 draws them).

    python -m stlib.bench.svg_quality [path]
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

import stlib.kernels  # noqa: F401 - registers the kernels the roles name
from stlib.geometry import VideoGrid
from stlib.registry import Role, by_role
from stlib.routing import Anchor, SvgPlan, route, svg_plan
from stlib.synthetic import HeadKind, head_kinds

#: The kernel routed plans run on, and the reference their quality is measured against.
ROUTED_KERNEL = by_role(Role.TILE).name
REFERENCE_NAME = by_role(Role.REFERENCE).name
#: The tile kernel's boundary policy (EXACT, BALANCED).
BoundaryPolicy = by_role(Role.TILE).option_enum("boundary")


def attention_quality(q, k, v, plan: SvgPlan, *, scale: float | None = None) -> dict[str, np.ndarray]:
    """Per head (arrays [H]): ``rel_l2`` = ||o - o_dense|| / ||o_dense|| of the plan's output (its
    rounded mask, reference attention) and ``recall`` = mean over queries of the dense attention
    probability the mask keeps. Materialises [H, L, L]: small L only (``DENSE_LIMIT``)."""
    from stlib.api import attention

    scale = 1.0 / math.sqrt(q.shape[2]) if scale is None else float(scale)
    dense = attention(q, k, v, None, scale=scale, impl=REFERENCE_NAME)
    sparse = attention(q, k, v, plan.mask, scale=scale, impl=REFERENCE_NAME)
    probs = jax.nn.softmax(
        jnp.einsum(
            "hqd,hkd->hqk", q.astype(jnp.float32), k.astype(jnp.float32), precision=jax.lax.Precision.HIGHEST
        )
        * scale,
        axis=-1,
    )
    kept = jnp.sum(jnp.where(jnp.asarray(plan.mask.to_dense()), probs, 0.0), axis=-1)  # [H, L]
    diff = jnp.linalg.norm((sparse - dense).astype(jnp.float32), axis=(1, 2))
    return {
        "rel_l2": np.asarray(diff / jnp.linalg.norm(dense.astype(jnp.float32), axis=(1, 2))),
        "recall": np.asarray(jnp.mean(kept, axis=-1)),
    }


def plan_work(plan: SvgPlan, head_dim: int) -> dict:
    """Executed flops of ``pallas_tile`` on the plan relative to dense attention (4 L^2 D H), the
    allowed-pair density, and every chip's roofline bound (``stlib.roofline.work_summary``)."""
    from stlib.roofline import work_summary

    summary = work_summary(ROUTED_KERNEL, plan.layout, plan.num_heads, head_dim, options=plan.options)
    dense_flops = 4.0 * plan.grid.num_tokens**2 * head_dim * plan.num_heads
    return {
        "executed_vs_dense": summary["executed_flops"] / dense_flops,
        "useful_vs_dense": summary["useful_flops"] / dense_flops,
        "computed_tiles": summary["computed_tiles"],
        "masked_tiles_work": summary["masked_tiles"],
        "roofline_v6e_ms": summary["roofline_v6e_ms"],
    }


PATTERNS = ("spatial", "temporal", "routed")


def _mean_over(values: np.ndarray, heads: np.ndarray) -> float | None:
    """The mean of ``values`` over the selected heads (None when none is selected)."""
    return float(np.mean(values[heads])) if heads.any() else None


def quality_sweep(
    grid: VideoGrid,
    kinds,
    head_dim: int,
    densities,
    *,
    seed: int = 0,
    anchors=(Anchor.REORDERED, Anchor.FRAME0),
    boundaries=tuple(BoundaryPolicy),
    block_q: int = 128,
    block_kv: int = 128,
    full_grid: VideoGrid | None = None,
    full_blocks: tuple[int, int] = (3328, 2816),
    full_heads: int = 10,
):
    """Records (dicts) of quality and work for every pattern ("spatial": every head a spatial band,
    "temporal": every head a temporal band, "routed": ``route``'s choice), density, anchor and
    boundary policy, on the synthetic inputs ``video_qkv(grid, kinds, head_dim, seed=seed)``: the
    mean and per-kind rel_l2 / recall, routing recovery, the work at ``grid`` and, with
    ``full_grid``, the work of the same plan at that grid with ``full_blocks`` tiles."""
    from stlib.synthetic import video_qkv

    kinds = head_kinds(kinds)
    q, k, v = video_qkv(grid, kinds, head_dim, seed=seed)
    planted = np.array([kind == HeadKind.SPATIAL for kind in kinds])
    for density in densities:
        for anchor in anchors:
            routed = route(q, k, grid, density, seed=seed, anchor=anchor, block_q=block_q, block_kv=block_kv)
            for boundary in boundaries:
                for pattern in PATTERNS:
                    chosen = routed.kinds if pattern == "routed" else (HeadKind(pattern),) * len(kinds)
                    plan = svg_plan(
                        grid,
                        chosen,
                        density,
                        block_q=block_q,
                        block_kv=block_kv,
                        anchor=anchor,
                        boundary=boundary,
                    )
                    quality = attention_quality(q, k, v, plan)
                    record = {
                        "grid": list(grid.shape),
                        "heads": len(kinds),
                        "head_dim": head_dim,
                        "seed": seed,
                        "planted": [str(x) for x in kinds],
                        "pattern": pattern,
                        "kinds": [str(x) for x in chosen],
                        "density": density,
                        "anchor": str(Anchor(anchor)),
                        "boundary": str(BoundaryPolicy(boundary)),
                        "block_q": block_q,
                        "block_kv": block_kv,
                        "width": plan.width,
                        "rel_l2": float(np.sqrt(np.mean(quality["rel_l2"] ** 2))),
                        "rel_l2_spatial_heads": _mean_over(quality["rel_l2"], planted),
                        "rel_l2_temporal_heads": _mean_over(quality["rel_l2"], ~planted),
                        "recall": float(np.mean(quality["recall"])),
                        "recall_spatial_heads": _mean_over(quality["recall"], planted),
                        "recall_temporal_heads": _mean_over(quality["recall"], ~planted),
                        "routing_recovery": float(np.mean(np.array(routed.kinds) == np.array(kinds))),
                        "pair_ratio": float(plan.pairs.sum() / plan.exact_pairs.sum()),
                        **plan_work(plan, head_dim),
                    }
                    if full_grid is not None:
                        share = np.mean([kind == HeadKind.SPATIAL for kind in chosen])
                        n_spatial = round(share * full_heads)
                        full = svg_plan(
                            full_grid,
                            [HeadKind.SPATIAL] * n_spatial + [HeadKind.TEMPORAL] * (full_heads - n_spatial),
                            density,
                            block_q=full_blocks[0],
                            block_kv=full_blocks[1],
                            anchor=anchor,
                            boundary=boundary,
                        )
                        record.update(
                            {f"full_{key}": value for key, value in plan_work(full, head_dim).items()}
                        )
                        record.update(
                            {
                                "full_grid": list(full_grid.shape),
                                "full_blocks": list(full_blocks),
                                "full_main_tiles": full.main_tiles.tolist(),
                                "full_tail_tiles": full.tail_tiles.tolist(),
                                "full_masked_tiles": full.masked_tiles.tolist(),
                            }
                        )
                    yield record


#: The committed sweep (``data/svg_quality.jsonl``): six heads, spatial and temporal in turn, at
#: 9 x 12 x 16 (errors need the dense [H, L, L]), the same plans' work at the case-study grid.
QUALITY_GRID = VideoGrid(9, 12, 16)
QUALITY_KINDS = ("spatial", "temporal") * 3
QUALITY_HEAD_DIM = 64
QUALITY_DENSITIES = (0.1, 0.15, 0.25, 0.35, 0.5)
RECORDS = "svg_quality.jsonl"


def record_quality(path=None, densities=QUALITY_DENSITIES) -> list[dict]:
    """Run ``quality_sweep`` on the committed configuration (``QUALITY_*``, the work also at the
    case-study grid) and append its records to ``path`` (default ``stlib.paths.data_dir() /
    RECORDS``) with the environment and run; returns them. About a minute and a half on a CPU."""
    from stlib.bench.records import Recorder
    from stlib.configs import CASE_STUDY
    from stlib.paths import data_dir

    recorder = Recorder(data_dir() / RECORDS if path is None else path)
    sweep = quality_sweep(QUALITY_GRID, QUALITY_KINDS, QUALITY_HEAD_DIM, densities, full_grid=CASE_STUDY.grid)
    return [recorder.write({"inputs": "synthetic (stlib.synthetic.video_qkv)", **r}) for r in sweep]


def main(argv=None) -> None:
    """``python -m stlib.bench.svg_quality [path]``: record the quality sweep."""
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    records = record_quality(argv[0] if argv else None)
    print(f"{len(records)} records written")


if __name__ == "__main__":
    main()
