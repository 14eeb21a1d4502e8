"""How long the executor waits on its ranks during a step (``--execute-model-timeout-seconds``).

A rank can wedge without exiting: stuck in a collective, its process stopped (SIGSTOP,
a debugger), its host frozen while the kernel still answers TCP keepalives. Nothing
then ever arrives on its connection, so the executor bounds each step's wait
(vLLM's ``VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS``, 300 s by default) and fails the engine
when a step overruns it. Sends to a rank are bounded as well (``SO_SNDTIMEO``): a rank
that stopped reading cannot block the engine on a full socket buffer.
"""

from __future__ import annotations

import os
import socket
import struct
from multiprocessing.connection import Connection

DEFAULT_EXECUTE_MODEL_TIMEOUT = 300.0  # seconds: vLLM's VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS
TIMEOUT_FLAG = "--execute-model-timeout-seconds"


def bound_sends(conn: Connection, seconds: float) -> None:
    """Make a send on ``conn`` that cannot progress for ``seconds`` raise ``OSError``."""
    whole = int(seconds)
    micro = int((seconds - whole) * 1_000_000)
    with socket.socket(fileno=os.dup(conn.fileno())) as sock:  # the option is the socket's
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", whole, micro))


def overdue_message(seconds: float, ranks: list[int]) -> str:
    """Why the engine stops when a step overran the bound."""
    return (
        f"a step did not finish within {seconds:g} s ({TIMEOUT_FLAG}): ranks {ranks} did not "
        "answer (stuck in a collective, or their process or host is stopped)"
    )
