"""The backward compiled for TPUs without one: ``jax.grad`` of attention at the case-study shape
(10 heads x 75,600 tokens x 128, bf16) for every trainable TPU kernel, chip and mask of
``MASKS``, compiled deviceless (libtpu). A record per case: whether it compiled (else the
compiler's reason), the compile time, the program's memory (arguments, outputs, temporaries) and
the backward's Pallas kernels in it. ``--long-videos`` compiles the tile kernels on the per-head SVG mix
at the longer videos of ``LONG_VIDEOS`` instead, whose step tables (forward and transposed) are the
largest that must fit SMEM. Nothing here is a time on a TPU.

    python -m stlib.bench.backward_compile run [--chips v6e ...] [--impls ...]   # ~10-60 s a case
    python -m stlib.bench.backward_compile run --long-videos --chips v6e         # minutes a case
    python -m stlib.bench.backward_compile table
"""

from __future__ import annotations

import argparse
import json
import re
import time

from stlib import paths

RECORDS = "data/backward_compiles.jsonl"
#: The case-study masks the backward compiles with (names of ``stlib.masks.catalogue``).
MASKS = (
    "full",
    "band (density 0.25)",
    "sliding tile, 3-D tiled order",
    "per-head SVG (5 spatial, 5 temporal)",
)
#: Longer videos than the case study's 21 x 45 x 80 (frames, height, width in latent tokens), for
#: the per-head SVG mix: 720p at 161 frames (147,600 tokens) and 1080p (171,360 tokens).
LONG_VIDEOS = {"720p, 161 frames": (41, 45, 80), "1080p": (21, 68, 120)}
SVG_MIX = MASKS[-1]


def trainable_kernels() -> list[str]:
    """The TPU implementations of the compile matrix: the tile kernels (their ``Backward``) and the
    baseline (Splash's own custom_vjp). The teaching kernels (dense, block-sparse) run the same
    backward kernels; ``--impls`` adds them."""
    from stlib import registry

    return [impl.name for impl in registry.tpu_kernels() if impl.plan_runner is not None or impl.baseline]


def raster_mask_and_orders(mask_name: str, grid=None):
    """The raster-order mask of a ``MASKS`` entry and the token order(s) ``video_attention`` runs
    it in: the sliding tile in its 3-D tiled order, the SVG heads each in their own (spatial: raster,
    temporal: token-major), the rest as they are (None: no reordering)."""
    from stlib.configs import CASE_STUDY
    from stlib.geometry import raster_order, tiled_order, token_major_order
    from stlib.masks import sliding_tile
    from stlib.masks.catalogue import case_study_masks

    grid = grid or CASE_STUDY.grid
    if mask_name.startswith("sliding tile"):
        return sliding_tile(grid, CASE_STUDY.sta_tile, CASE_STUDY.sta_window), tiled_order(
            grid, CASE_STUDY.sta_tile
        )
    mask = case_study_masks(grid)[mask_name]
    if mask_name.startswith("per-head SVG"):
        half = CASE_STUDY.num_heads // 2
        return mask, [raster_order(grid)] * half + [token_major_order(grid)] * (CASE_STUDY.num_heads - half)
    return mask, None


def compile_backward(impl: str, mask_name: str, chip: str, options=None, video=None) -> dict:
    """Compile ``jax.grad`` of ``stlib.attention(impl=...)`` at the case-study shape for ``chip``
    (``video_attention`` with the mask's own token order where it has one); ``video``: a key of
    ``LONG_VIDEOS``, that grid instead of the case study's."""
    import jax
    import jax.numpy as jnp

    from stlib.api import attention, video_attention
    from stlib.configs import CASE_STUDY
    from stlib.device import compile_for_tpu
    from stlib.geometry import VideoGrid
    from stlib.registry import Role, by_role

    # the tile kernels' backward kernels: dq, dk / dv, and fused
    dq_prefix, dkv_prefix, fused_prefix = by_role(Role.TILE).backward.estimator.kernel_names

    grid = VideoGrid(*LONG_VIDEOS[video]) if video else CASE_STUDY.grid
    shape = jax.ShapeDtypeStruct((CASE_STUDY.num_heads, grid.num_tokens, CASE_STUDY.head_dim), jnp.bfloat16)
    mask, orders = raster_mask_and_orders(mask_name, grid)

    def loss(q, k, v):
        if orders is None:
            out = attention(q, k, v, mask, impl=impl, options=options, interpret=False)
        else:
            out = video_attention(
                q, k, v, grid, mask, impl=impl, orders=orders, options=options, interpret=False
            )
        return jnp.sum(out.astype(jnp.float32))

    record = {
        "impl": impl,
        "mask": mask_name,
        "chip": chip,
        "options": options or {},
        "shape": list(shape.shape),
        **({"video": video} if video else {}),
    }
    start = time.perf_counter()
    try:
        compiled = compile_for_tpu(jax.grad(loss, argnums=(0, 1, 2)), shape, shape, shape, chip=chip)
    except Exception as error:  # noqa: BLE001 - a case that does not compile is recorded with its reason
        return {**record, "compiled": False, "error": f"{type(error).__name__}: {str(error)[:400]}"}
    text = compiled.text()
    kernels = {
        prefix: len(set(re.findall(rf"%({prefix}[\w.]*) = ", text)))
        for prefix in (dq_prefix, dkv_prefix, fused_prefix)
    }
    return {
        **record,
        "compiled": True,
        "compile_s": round(time.perf_counter() - start, 1),
        **compiled.memory(),
        "dq_kernels": kernels[dq_prefix],
        "dkv_kernels": kernels[dkv_prefix],
        "fused_kernels": kernels[fused_prefix],
    }


def cases(
    chips=None, impls=None, long_videos=False, videos=None
) -> list[tuple[str, str, str, dict | None, str | None]]:
    """(impl, mask, chip, options, video): every trainable kernel x ``MASKS`` x chip, Splash fused
    and split; with ``long_videos``, the tile kernels x the SVG mix x ``videos`` (names of
    ``LONG_VIDEOS``, default all of them) x chip.

    >>> cases(["v6e"], ["pallas_tile_lane_dense"], long_videos=True, videos=["1080p"])[0][-1]
    '1080p'
    """
    from stlib import registry
    from stlib.device import CHIPS

    unknown = sorted(set(videos or ()) - set(LONG_VIDEOS))
    if unknown:
        raise ValueError(f"videos {unknown} are not among LONG_VIDEOS {sorted(LONG_VIDEOS)}")
    out = []
    for chip in chips or CHIPS:
        for impl in impls or trainable_kernels():
            baseline = registry.get(impl).baseline
            if long_videos:
                out += (
                    []
                    if baseline
                    else [(impl, SVG_MIX, chip, None, video) for video in videos or LONG_VIDEOS]
                )
                continue
            variants = [{"fused_backward": True}, {"fused_backward": False}] if baseline else [None]
            out += [(impl, mask, chip, options, None) for mask in MASKS for options in variants]
    return out


def run(chips=None, impls=None, path=None, long_videos=False, videos=None) -> list[dict]:
    """Compile every case (``cases``), appending each record to ``path`` (default ``RECORDS`` under
    ``stlib.paths.home()``) with the run's provenance."""
    from stlib.bench.records import record_each

    path = path or paths.home() / RECORDS
    return record_each(
        cases(chips, impls, long_videos, videos), lambda c: compile_backward(*c), path, "backward compiles"
    )


def read(path=None) -> list[dict]:
    """The latest record of each (impl, mask, chip, options) in ``path``."""
    from stlib.bench.records import latest_per_key

    def key(r):
        return r["impl"], r["mask"], r["chip"], json.dumps(r["options"], sort_keys=True), r.get("video")

    return list(latest_per_key(path or paths.home() / RECORDS, key).values())


def format_table(records) -> str:
    """The records as a Markdown table (GB of temporaries per device; the error where one failed)."""
    lines = [
        "| chip | impl | options | mask | tokens | compiled | compile s | temp GB | dq / dk-dv / fused kernels |",
        "|" + "---|" * 9,
    ]
    order = lambda r: (r["chip"], r["impl"], json.dumps(r["options"]), r["mask"], r["shape"][1])
    for r in sorted(records, key=order):
        options = ", ".join(f"{k}={v}" for k, v in r["options"].items()) or "-"
        if r["compiled"]:
            cells = [
                "yes",
                f"{r['compile_s']:.0f}",
                f"{r.get('temp_size_in_bytes', 0) / 1e9:.2f}",
                f"{r['dq_kernels']} / {r['dkv_kernels']} / {r.get('fused_kernels', 0)}",
            ]
        else:
            cells = ["no: " + r["error"][:120].replace("|", "\\|"), "-", "-", "-"]  # a mask's repr holds "|"
        tokens = f"{r['shape'][1]:,}" + (f" ({r['video']})" if r.get("video") else "")
        lines.append("| " + " | ".join([r["chip"], r["impl"], options, r["mask"], tokens, *cells]) + " |")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m stlib.bench.backward_compile", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run_parser = sub.add_parser("run", help="compile every case (no TPU needed)")
    run_parser.add_argument("--chips", nargs="*")
    run_parser.add_argument("--impls", nargs="*")
    run_parser.add_argument(
        "--long-videos", action="store_true", help="the tile kernels on the SVG mix at LONG_VIDEOS"
    )
    run_parser.add_argument("--videos", nargs="*", help="with --long-videos: these of LONG_VIDEOS only")
    sub.add_parser("table", help="the records as a table")
    args = parser.parse_args(argv)
    if args.command == "run":
        run(args.chips, args.impls, long_videos=args.long_videos, videos=args.videos)
    print(format_table(read()))


if __name__ == "__main__":
    main()
