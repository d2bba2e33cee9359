"""Test-session settings, applied before JAX initialises its backends."""

import os

# Several processes use libtpu's deviceless compiler during a run (pytest itself, and the Jupyter
# kernels that execute the notebooks): without this, the second one fails on libtpu's lockfile.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
# Notebooks executed by the tests always use the small configuration.
os.environ.setdefault("STLIB_SIZE", "small")
