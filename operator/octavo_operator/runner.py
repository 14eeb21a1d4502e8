"""Start kopf with the operator's handlers, JSON logs, liveness and metrics endpoints;
with --leader-elect, only once this replica holds the Lease (a standby answers /healthz
meanwhile), and stop when the Lease is lost."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable

import kopf
from prometheus_client import start_http_server

from octavo_operator import metrics
from octavo_operator.leader import (
    LEASE_LOST_EXIT_CODE,
    LeaderLease,
    Leadership,
    lease_settings,
    wait_to_lead,
)
from octavo_operator.standby import StandbyHealth

logger = logging.getLogger(__name__)


def run(args: argparse.Namespace) -> int:
    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig
    os.environ["OCTAVO_OPERATOR_DEFAULT_IMAGE"] = args.default_image
    log_format = kopf.LogFormat.JSON if args.log_format == "json" else kopf.LogFormat.PLAIN
    kopf.configure(verbose=args.verbose, log_format=log_format)
    logging.getLogger("kubernetes").setLevel(logging.WARNING)
    if args.metrics_port:
        start_http_server(args.metrics_port)
    start_activator(args)
    import octavo_operator.handlers  # noqa: F401  (registers the handlers)

    if not args.leader_elect:
        metrics.LEADER.set(1)
        return _operate(args)
    return _run_as_replica(args)


def start_activator(args: argparse.Namespace) -> None:
    """Every replica serves the activator; the leader's address goes into the EndpointSlices
    of services at zero (handlers.configure reads it from the environment)."""
    if not args.activator_port:
        os.environ.pop("OCTAVO_ACTIVATOR_ADDRESS", None)
        return
    from octavo_operator.activator import Activator, ActivatorSettings, serve_in_thread
    from octavo_operator.activator_waker import ServiceWaker
    from octavo_operator.kube import Kube, load_api_client

    waker = ServiceWaker(Kube(load_api_client(args.kubeconfig)))
    settings = ActivatorSettings(timeout_seconds=args.activation_timeout)
    serve_in_thread(Activator(waker, settings), args.activator_port)
    os.environ["OCTAVO_ACTIVATOR_PORT"] = str(args.activator_port)
    if args.activator_address:
        os.environ["OCTAVO_ACTIVATOR_ADDRESS"] = args.activator_address


def _operate(
    args: argparse.Namespace,
    stop_flag: threading.Event | None = None,
    may_write: Callable[[], bool] | None = None,
) -> int:
    """kopf until a signal, or until ``stop_flag`` is set (the Lease was lost); the
    handlers' writes are refused as soon as ``may_write`` says no (handlers.configure)."""
    liveness = f"http://0.0.0.0:{args.liveness_port}/healthz" if args.liveness_port else None
    memo = kopf.Memo(may_write=may_write) if may_write else None

    async def operate() -> None:
        await kopf.operator(
            standalone=True,
            clusterwide=not args.namespace,
            namespaces=args.namespace,
            liveness_endpoint=liveness,
            stop_flag=None if stop_flag is None else asyncio_flag(stop_flag),
            memo=memo,
        )

    asyncio.run(operate())
    return 0


def asyncio_flag(flag: threading.Event) -> asyncio.Event:
    """An ``asyncio.Event`` of the running loop, set once ``flag`` is, by a daemon thread.

    Given the ``threading.Event`` itself, kopf waits for it in the loop's default executor;
    after a SIGTERM (which never sets it) ``asyncio.run`` then waits forever for that
    executor thread at exit: the elected leader never exited, nor gave the Lease up."""
    loop, event = asyncio.get_running_loop(), asyncio.Event()

    def wait_and_set() -> None:
        flag.wait()
        with contextlib.suppress(RuntimeError):  # the loop has closed: nothing to stop
            loop.call_soon_threadsafe(event.set)

    threading.Thread(target=wait_and_set, name="lease-lost-flag", daemon=True).start()
    return event


def _run_as_replica(args: argparse.Namespace) -> int:
    from octavo_operator.kube import Kube, load_api_client

    lease = LeaderLease(Kube(load_api_client(args.kubeconfig)), lease_settings(args))
    quit_waiting = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: quit_waiting.set())
    with StandbyHealth(args.liveness_port):
        if not wait_to_lead(lease, quit_waiting):
            return 0
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)  # kopf installs its own handlers
    metrics.LEADER.set(1)
    leadership = Leadership(lease, on_lost=lambda: metrics.LEADER.set(0))
    leadership.start()
    try:
        _operate(args, stop_flag=leadership.lost, may_write=leadership.leads)
    finally:
        leadership.stop()
        metrics.LEADER.set(0)
    return LEASE_LOST_EXIT_CODE if leadership.lost.is_set() else 0
