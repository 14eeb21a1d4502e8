"""The engine core in a process of its own, as vLLM v1's ``EngineCore``.

The server's process keeps HTTP, tokenizing and streaming; the engine core process
loads the model and runs the steps, with its own interpreter lock, so neither waits for
the other. They talk over a pipe: commands one way, events (step outputs, statistics,
admissions) the other, read by a thread of the server. The core ignores SIGINT/SIGTERM
(the server drains and then tells it to stop) and exits when the server's end of the
pipe closes, so it never outlives the server. If it dies, the reader reports it and the
server turns unhealthy and exits.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import signal
import threading
from multiprocessing.connection import Connection
from typing import Any

from octavo.config import EngineArgs
from octavo.engine.core_loop import Emit, run_engine_core
from octavo.engine.core_messages import STOP, CoreStopped, LoadFailed, LoadProgress
from octavo.logging_format import configure_logging
from octavo.progress import add_listener
from octavo.stack_dumps import dump_stacks_on_signal

logger = logging.getLogger(__name__)

LOG_FORMAT = "%(levelname)s:     [engine core] %(name)s: %(message)s"


class PipeInbox:
    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    def get(self, block: bool, timeout: float | None = None) -> list[Any]:
        try:
            if block and not self._conn.poll(timeout):
                return []
            commands = [self._conn.recv()] if block else []
            while self._conn.poll():
                commands.append(self._conn.recv())
        except (EOFError, OSError):  # the server is gone: stop
            return [STOP]
        return commands


def engine_core_main(args: EngineArgs, conn: Connection) -> None:
    """The engine core process's entry point."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    configure_logging(logging.INFO, LOG_FORMAT)
    dump_stacks_on_signal()
    from octavo.engine.llm_engine import LLMEngine

    sending = threading.Lock()  # the loop and the executor's watch thread both emit

    def emit(event: Any) -> None:
        with sending, contextlib.suppress(OSError):  # the server is gone: the inbox sees it
            conn.send(event)

    add_listener(lambda progress: emit(LoadProgress(progress)))  # for /health while loading
    run_engine_core(lambda: LLMEngine(args), PipeInbox(conn), emit)


class ProcessCore:
    """Starts the engine core process and a thread that reads its events."""

    def __init__(self, args: EngineArgs) -> None:
        self._args = args
        self._conn: Connection | None = None
        self._process: multiprocessing.process.BaseProcess | None = None
        self._send_lock = threading.Lock()

    def start(self, emit: Emit) -> None:
        context = multiprocessing.get_context("spawn")
        ours, theirs = context.Pipe()
        self._process = context.Process(
            target=engine_core_main, args=(self._args, theirs), name="octavo-engine-core"
        )
        self._process.daemon = True
        self._process.start()
        theirs.close()
        self._conn = ours
        threading.Thread(
            target=self._read, args=(emit,), name="octavo-engine-reader", daemon=True
        ).start()

    def send(self, command: Any) -> None:
        assert self._conn is not None
        with self._send_lock, contextlib.suppress(OSError):  # gone: the reader reports it
            self._conn.send(command)

    def is_alive(self) -> bool:
        """Whether the core process still runs, read from its sentinel (readable once it has
        exited). ``Process.is_alive()`` would call ``waitpid`` and race the reader thread's
        ``join``: the loser gets ECHILD, which multiprocessing reports as "still alive"."""
        if self._process is None:
            return False
        return not multiprocessing.connection.wait([self._process.sentinel], timeout=0)

    def join(self, timeout: float) -> None:
        if self._process is None:
            return
        self._process.join(timeout)
        if self._process.is_alive():
            logger.warning("the engine core did not stop in %.0f s; terminating it", timeout)
            self._process.terminate()
            self._process.join(timeout)

    def _read(self, emit: Emit) -> None:
        assert self._conn is not None
        try:
            while True:
                event = self._conn.recv()
                emit(event)
                if isinstance(event, CoreStopped | LoadFailed):
                    return
        except (EOFError, OSError):
            assert self._process is not None
            self._process.join(1.0)
            message = f"the engine core process exited (exit code {self._process.exitcode})"
            logger.error(message)
            emit(CoreStopped(message, dead=True))
