"""``python -m stlib.compile_report '{"impl": "pallas_tile", "mask": "band (density 0.25)"}'``: what
the TPU compiler allocated (VMEM / SMEM) for each Pallas kernel of a call, from libtpu's dump. Also
the compile subprocess of ``stlib.analysis.dump.compile_with_dump``. The code lives in
``stlib.analysis.dump``; its public names are re-exported here.
"""

from stlib.analysis.dump import (  # noqa: F401 - re-exported
    KernelConfig,
    compile_report,
    compile_with_dump,
    is_pallas_kernel,
    main,
    parse_dump,
    resolve_mask,
)

if __name__ == "__main__":
    main()
