"""``python -m octavo_bench``: guarded, so that spawned worker processes can re-import it."""

import sys

from octavo_bench.cli import main

if __name__ == "__main__":
    sys.exit(main())
