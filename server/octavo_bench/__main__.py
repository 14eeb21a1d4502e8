"""``python -m octavo_bench``: guarded, so that spawned workers (vLLM's) can re-import it."""

import sys

from octavo_bench.cli import main

if __name__ == "__main__":
    sys.exit(main())
