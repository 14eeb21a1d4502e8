"""``kill -USR1 PID`` on any Octavo process (the API server, the engine core, a worker, a
worker host) prints every thread's Python stack to its standard error, which is the log:
what a stuck server waits for, without a debugger in the pod. ``faulthandler`` writes it
from the signal handler itself, so it answers even while the process holds the GIL in a
native call."""

from __future__ import annotations

import faulthandler
import signal
import sys

STACK_DUMP_SIGNAL = signal.SIGUSR1


def dump_stacks_on_signal() -> None:
    """Print every thread's stack to standard error on ``STACK_DUMP_SIGNAL``."""
    faulthandler.register(STACK_DUMP_SIGNAL, file=sys.stderr, all_threads=True)
