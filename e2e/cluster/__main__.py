"""Command line: `python -m e2e.cluster {build,gomod,up,down,env,status,...}`."""

from __future__ import annotations

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
