"""``kill -USR1 PID`` on any Octavo process (the API server, the engine core, a worker, a
worker host) prints every thread's Python stack to its standard error, which is the log:
what a stuck server waits for, without a debugger in the pod. ``faulthandler`` writes it
from the signal handler itself, so it answers even while the process holds the GIL in a
native call."""

from __future__ import annotations

import faulthandler
import signal

STACK_DUMP_SIGNAL = signal.SIGUSR1
STANDARD_ERROR_FD = 2


def dump_stacks_on_signal() -> None:
    """Print every thread's stack to standard error on ``STACK_DUMP_SIGNAL``: the file
    descriptor, never ``sys.stderr`` (a host program may have swapped it for an object
    without one, as pytest's capture does)."""
    faulthandler.register(STACK_DUMP_SIGNAL, file=STANDARD_ERROR_FD, all_threads=True)
