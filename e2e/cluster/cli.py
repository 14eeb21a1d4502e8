"""Test Kubernetes control plane for Octavo: built from Go modules, run on 127.0.0.1.

  python -m e2e.cluster up        build what is missing (cached), start, print `export ...`
  python -m e2e.cluster down      stop every component; nothing is left running
  python -m e2e.cluster env       print `export KUBECONFIG=... PATH=...` for the running cluster
  python -m e2e.cluster status    health of each component (exit 0 up, 3 down)

Use `eval "$(python -m e2e.cluster up)"` to point kubectl/helm at it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import build, control_plane, versions
from .pki import PKIError
from .rest import ApiError
from .service_account import service_account_kubeconfig


def _running_or_exit() -> control_plane.Cluster:
    cluster = control_plane.status()
    if cluster is None:
        print("error: the test cluster is not running: `python -m e2e.cluster up`", file=sys.stderr)
        raise SystemExit(3)
    return cluster


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m e2e.cluster",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_up = sub.add_parser(
        "up", help="start the cluster (idempotent); prints export lines", allow_abbrev=False
    )
    p_up.add_argument("--timeout", type=float, default=None, help="seconds (default 180)")
    sub.add_parser("down", help="stop the cluster (idempotent)")
    sub.add_parser("env", help="print export lines for the running cluster")
    sub.add_parser("status", help="print the state of each component as JSON")
    sub.add_parser("build", help="build (or find in the cache) every binary; print their paths")
    sub.add_parser("gomod", help="regenerate the wrapper go.mod/go.sum from versions.py")
    sub.add_parser("versions", help="print the pinned versions")
    p_logs = sub.add_parser(
        "logs", help="print the tail of each component's log", allow_abbrev=False
    )
    p_logs.add_argument("component", nargs="?", choices=control_plane.COMPONENTS)
    p_logs.add_argument("-n", "--lines", type=int, default=40)
    p_sa = sub.add_parser(
        "sa-kubeconfig", help="write a kubeconfig for a ServiceAccount", allow_abbrev=False
    )
    p_sa.add_argument("namespace")
    p_sa.add_argument("name")
    p_sa.add_argument("-o", "--output", type=Path, default=None)
    p_sa.add_argument("--duration", type=int, default=3600, help="token lifetime, seconds")
    p_sa.add_argument("--create", action="store_true", help="create the ServiceAccount if missing")
    args = parser.parse_args(argv)

    try:
        if args.command == "up":
            cluster = control_plane.up(timeout=args.timeout)
            sys.stdout.write(cluster.export_lines())
        elif args.command == "down":
            if not control_plane.down():
                print("[e2e.cluster] nothing was running", file=sys.stderr)
        elif args.command == "env":
            sys.stdout.write(_running_or_exit().export_lines())
        elif args.command == "status":
            info = control_plane.describe()
            print(json.dumps(info, indent=2))
            return 0 if info["healthy"] else 3
        elif args.command == "build":
            for name, path in build.ensure_built().items():
                print(f"{name}\t{path}")
        elif args.command == "gomod":
            build.generate_gomod()
        elif args.command == "versions":
            print(json.dumps(versions.summary(), indent=2))
        elif args.command == "logs":
            logs = control_plane.state_dir() / "logs"
            for name in [args.component] if args.component else control_plane.COMPONENTS:
                print(f"==> {logs / (name + '.log')} <==")
                print(control_plane.tail_log(logs / f"{name}.log", args.lines))
        elif args.command == "sa-kubeconfig":
            cluster = _running_or_exit()
            path = service_account_kubeconfig(
                cluster,
                args.namespace,
                args.name,
                args.output,
                duration_seconds=args.duration,
                create=args.create,
            )
            print(path)
    except (
        build.BuildError,
        control_plane.ClusterError,
        PKIError,
        ApiError,
        TimeoutError,
    ) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0
