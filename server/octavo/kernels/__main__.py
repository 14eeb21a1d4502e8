"""``python -m octavo.kernels build``: compile the native CPU kernels ahead of first use.

``--isa all`` builds every CPU family (the image does this, so that any x86-64 node finds
its build); the default builds only this CPU's. ``--into`` sets the folder
(default ``$OCTAVO_KERNELS_DIR``, else ``$OCTAVO_CACHE/kernels``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from octavo.kernels import cpu_build
from octavo.progress import track


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m octavo.kernels", description=__doc__)
    parser.add_argument("command", choices=["build"])
    parser.add_argument(
        "--isa",
        choices=["native", "all", *cpu_build.ISA_FLAGS],
        default="native",
        help="which CPU family to build for (default: this CPU's)",
    )
    parser.add_argument("--into", help="folder to build into")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.into:
        os.environ[cpu_build.KERNELS_DIR_ENV] = args.into
    if args.isa == "all":  # one process per build: a process can load only one of them
        for isa in track(list(cpu_build.ISA_FLAGS), "building CPU kernels", unit="builds"):
            command = [sys.executable, "-m", "octavo.kernels", "build", "--isa", isa]
            subprocess.run(command, check=True)
        return 0
    isa = cpu_build.cpu_isa() if args.isa == "native" else args.isa
    print(f"{isa}: {cpu_build.build(cpu_build.plan_build(isa))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
