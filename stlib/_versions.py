"""The oldest jax stlib runs with, and the check ``import stlib`` makes before it imports jax.

``JAX_FLOOR`` is the one place the floor is written; ``pyproject.toml`` declares the same number
(``tests/test_versions.py`` holds the two together). How it was found: stlib's newest jax API is the
TPU hardware table. ``pltpu.get_tpu_info_for_chip`` (``stlib.device.Chip``) is first in jax 0.9.2 and
its ``TpuInfo.num_mxus`` field (``Chip.num_mxus``, read by ``stlib.analysis.clock``) first in 0.10.1
(read in jax's git tags: absent at the tag before). Everything else stlib calls
(``pltpu.CompilerParams``, ``PrefetchScalarGridSpec``, ``BlockSpec(block_shape, index_map)``, Splash's
``make_splash_mha``, ``jax.random.key``) is older. Tried once on a CPU (jaxlib of the same version,
no matching libtpu, so no TPU compile checks): with jax 0.10.0 ``Chip.num_mxus`` raises
AttributeError; with 0.10.1 the device, kernel, Splash and version tests pass. CI runs only the 0.10.2
that requirements.txt pins.
"""

from __future__ import annotations

import re

JAX_FLOOR = "0.10.1"


def _release(version: str) -> tuple[int, ...]:
    """(0, 10, 1) from '0.10.1', '0.10.1rc2', '0.10.1.dev20260601'; the leading numbers only."""
    match = re.match(r"\d+(?:\.\d+)*", version.strip())
    if match is None:
        raise ValueError(f"{version=} is not a version number")
    return tuple(int(n) for n in match.group().split("."))


def check_jax(version: str | None) -> None:
    """Raise ImportError, one sentence naming what to install, unless jax ``version`` (None: not
    installed) is at least ``JAX_FLOOR``. A pre-release of the floor itself passes."""
    if version is not None and _release(version) >= _release(JAX_FLOOR):
        return
    found = f"jax {version} is installed" if version else "jax is not installed"
    raise ImportError(
        f'stlib needs jax >= {JAX_FLOOR} ({found}): pip install -U "jax[tpu]>={JAX_FLOOR}" on Linux '
        f'("jax>={JAX_FLOOR}" elsewhere), then restart the Python process or the notebook\'s runtime.'
    )


def installed_jax() -> str | None:
    """The installed jax's version, from its package metadata without importing jax; from
    ``jax.__version__`` for a jax without metadata (a source tree on the path); None if absent."""
    import importlib.util
    from importlib import metadata

    try:
        return metadata.version("jax")
    except metadata.PackageNotFoundError:
        if importlib.util.find_spec("jax") is None:
            return None
        import jax

        return jax.__version__
