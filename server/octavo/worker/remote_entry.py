"""A worker process on a worker host: one rank, driven by the leader over TCP.

Started by the host's agent (``entrypoints/headless``) as ``python -m
octavo.worker.remote_entry FD OVERRIDES``: ``FD`` is its connection to the leader's
engine core, already authenticated and accepted, and ``OVERRIDES`` (JSON) this host's
own model folder, device and threads (``host_overrides``). From there on it is a worker
like any other (``worker_process.serve``): it dies with its agent, ignores SIGINT and
SIGTERM, and stops on the leader's stop or when the connection closes.
"""

from __future__ import annotations

import signal
import sys
from multiprocessing.connection import Connection

from octavo.worker.host_overrides import HostOverrides
from octavo.worker.worker_process import die_with_parent, serve


def main() -> None:
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    conn = Connection(int(sys.argv[1]))
    overrides = HostOverrides.from_json(sys.argv[2])
    try:
        serve(conn, overrides.apply)
    finally:
        from octavo.distributed.worker_group import leave_process_group

        leave_process_group()


if __name__ == "__main__":
    main()
