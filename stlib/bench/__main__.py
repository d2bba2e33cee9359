"""``python -m stlib.bench``: see ``stlib.bench.cli``."""

from stlib.bench.cli import main

if __name__ == "__main__":
    main()
