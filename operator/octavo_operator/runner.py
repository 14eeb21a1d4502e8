"""Start kopf with the operator's handlers, JSON logs, liveness and metrics endpoints."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os

import kopf
from prometheus_client import start_http_server


def run(args: argparse.Namespace) -> int:
    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig
    os.environ["OCTAVO_OPERATOR_DEFAULT_IMAGE"] = args.default_image
    log_format = kopf.LogFormat.JSON if args.log_format == "json" else kopf.LogFormat.PLAIN
    kopf.configure(verbose=args.verbose, log_format=log_format)
    logging.getLogger("kubernetes").setLevel(logging.WARNING)
    if args.metrics_port:
        start_http_server(args.metrics_port)
    import octavo_operator.handlers  # noqa: F401  (registers the handlers)

    liveness = f"http://0.0.0.0:{args.liveness_port}/healthz" if args.liveness_port else None
    asyncio.run(
        kopf.operator(
            standalone=True,
            clusterwide=not args.namespace,
            namespaces=args.namespace,
            liveness_endpoint=liveness,
        )
    )
    return 0
