"""`octavo-operator`: run the operator, or check that an installed one works.

octavo-operator [run] [--namespace NS ...] [--liveness-port 8080] [--metrics-port 8081]
                      [--log-format json|plain] [--default-image IMAGE] [--kubeconfig FILE]
                      [--leader-elect] [--leader-election-namespace NS]
                      [--leader-elect-lease-duration 15] [--leader-elect-renew-deadline 10]
                      [--leader-elect-retry-period 2]
octavo-operator selfcheck --operator-url http://octavo-operator:8080/healthz
"""

from __future__ import annotations

import argparse
import os
import sys

from octavo_operator import constants as c


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="octavo-operator", description=__doc__.splitlines()[0], allow_abbrev=False
    )
    sub = parser.add_subparsers(dest="command")
    run = sub.add_parser(
        "run", help="reconcile InferenceServices (the default)", allow_abbrev=False
    )
    add_run_options(run)
    add_run_options(parser)
    check = sub.add_parser(
        "selfcheck",
        help="exit 0 if the CRD is served and the operator is up",
        allow_abbrev=False,
    )
    check.add_argument("--operator-url", required=True, help="the operator's /healthz URL")
    check.add_argument("--kubeconfig", default=None, help="default: $KUBECONFIG, else in-cluster")
    check.add_argument("--timeout", type=float, default=60.0, help="seconds to keep trying")
    return parser


def add_run_options(parser: argparse.ArgumentParser) -> None:
    env = os.environ
    parser.add_argument(
        "--namespace",
        action="append",
        default=[],
        help="watch only this namespace (repeatable; default: all namespaces)",
    )
    parser.add_argument("--liveness-port", type=int, default=8080, help="/healthz port (0: off)")
    parser.add_argument("--metrics-port", type=int, default=8081, help="/metrics port (0: off)")
    parser.add_argument("--log-format", choices=("json", "plain"), default="json")
    parser.add_argument("--verbose", action="store_true", help="debug logging")
    parser.add_argument(
        "--default-image",
        default=env.get("OCTAVO_OPERATOR_DEFAULT_IMAGE", c.DEFAULT_SERVER_IMAGE),
        help="server image for InferenceServices without spec.image "
        "[env OCTAVO_OPERATOR_DEFAULT_IMAGE]",
    )
    parser.add_argument("--kubeconfig", default=None, help="default: $KUBECONFIG, else in-cluster")
    parser.add_argument(
        "--leader-elect",
        action=argparse.BooleanOptionalAction,
        default=env.get("OCTAVO_OPERATOR_LEADER_ELECT", "").lower() in ("1", "true", "yes"),
        help="run as one of several replicas: only the holder of the Lease reconciles "
        "[env OCTAVO_OPERATOR_LEADER_ELECT]",
    )
    parser.add_argument(
        "--leader-election-namespace",
        default=env.get("POD_NAMESPACE", "default"),
        help="where the Lease lives (default: $POD_NAMESPACE, else default)",
    )
    add_lease_timing_options(parser)
    add_activator_options(parser)


def add_lease_timing_options(parser: argparse.ArgumentParser) -> None:
    """client-go's leader-election timings (kube-controller-manager's flag names), seconds."""
    env = os.environ
    timings = (
        (
            "lease-duration",
            "LEASE_DURATION",
            "15",
            "how long a standby waits after the holder's last renewal before it takes the Lease",
        ),
        (
            "renew-deadline",
            "RENEW_DEADLINE",
            "10",
            "the leader stops reconciling when no renewal succeeded for this long (less than "
            "the lease duration)",
        ),
        ("retry-period", "RETRY_PERIOD", "2", "between tries to take or renew the Lease"),
    )
    for flag, var, default, text in timings:
        parser.add_argument(
            f"--leader-elect-{flag}",
            type=float,
            metavar="SECONDS",
            default=float(env.get(f"OCTAVO_OPERATOR_LEADER_ELECT_{var}", default)),
            help=f"{text} [env OCTAVO_OPERATOR_LEADER_ELECT_{var}]",
        )


def add_activator_options(parser: argparse.ArgumentParser) -> None:
    """Scale to zero: the activator that holds requests for services at zero replicas."""
    env = os.environ
    parser.add_argument(
        "--activator-port",
        type=int,
        default=int(env.get("OCTAVO_ACTIVATOR_PORT", "8082")),
        help="the activator's port (0: off, and no service scales to zero)",
    )
    parser.add_argument(
        "--activator-address",
        default=env.get("OCTAVO_ACTIVATOR_ADDRESS") or env.get("POD_IP"),
        help="the IP that services at zero send their traffic to: this pod's "
        "[env OCTAVO_ACTIVATOR_ADDRESS, else POD_IP]",
    )
    parser.add_argument(
        "--activation-timeout",
        type=float,
        default=600.0,
        help="seconds a request waits in the activator for a ready pod before a 503",
    )


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "selfcheck":
        from octavo_operator.selfcheck import selfcheck

        return selfcheck(args.operator_url, args.kubeconfig, args.timeout)
    if args.leader_elect:
        from octavo_operator.leader import lease_settings

        try:
            lease_settings(args)
        except ValueError as error:
            parser.error(str(error))
    from octavo_operator.runner import run

    return run(args)


if __name__ == "__main__":
    sys.exit(main())
