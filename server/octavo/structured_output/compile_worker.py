"""The compile processes' side: a zygote that forks compile processes, and their loop.

xgrammar compiles in C++ and a thread running it cannot be interrupted, so the server
compiles in processes of its own, which it kills when a compile passes its deadline
(``compile_pool.py``). Starting a Python process that imports xgrammar takes seconds
(it imports torch and transformers), so one process, the zygote, does that once, with
xgrammar's view of the vocabulary built, and forks each compile process on request: a fork is
ready in milliseconds and shares the zygote's memory. The zygote is single-threaded when
it forks, and ignores SIGCHLD, so the killed processes are reaped by the kernel.
"""

from __future__ import annotations

import functools
import hashlib
import os
import signal
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.reduction import recv_handle
from typing import Any

READY = "ready"
FORK = "fork"


@dataclass(frozen=True)
class Vocabulary:
    """What the zygote builds xgrammar's tokenizer info from (pickled to it)."""

    tokenizer: Any  # a Hugging Face tokenizer
    vocab_size: int
    stop_token_ids: tuple[int, ...]

    @functools.cached_property
    def key(self) -> str:
        """Equal for equal vocabularies (a fast tokenizer's whole definition, hashed)."""
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        source = backend.to_str() if backend is not None else repr(self.tokenizer)
        text = f"{source}\0{self.vocab_size}\0{self.stop_token_ids}"
        return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class Compiled:
    seconds: float | None  # None: the process had it cached


@dataclass(frozen=True)
class Invalid:
    message: str  # a 400's text: what is wrong with the constraint


def zygote_main(conn: Connection, vocabulary: Vocabulary) -> None:
    """Load xgrammar and the vocabulary, say ``READY``; then for each ``FORK`` (followed by
    a pipe end, passed as a file descriptor) fork a compile process serving that pipe and
    answer its pid. Returns when the server's end of ``conn`` closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server decides when this stops
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # killed children are reaped at once
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # no Rust thread pool: this process forks
    from octavo.structured_output.compiler import tokenizer_info

    info = tokenizer_info(vocabulary.tokenizer, vocabulary.vocab_size, vocabulary.stop_token_ids)
    conn.send(READY)
    while True:
        try:
            conn.recv()  # FORK
            fd = recv_handle(conn)
        except (EOFError, OSError):
            return
        pid = os.fork()
        if pid == 0:
            conn.close()
            _child(Connection(fd), info)
        os.close(fd)
        conn.send(pid)


def _child(conn: Connection, info) -> None:
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    try:
        serve_compiles(conn, info)
    finally:
        os._exit(0)  # never back into the zygote's loop


def serve_compiles(conn: Connection, info) -> None:
    """Answer each constraint on ``conn`` with ``Compiled`` or ``Invalid`` until it closes."""
    from octavo.structured_output.compiler import GrammarCompileError, GrammarCompiler

    compiler = GrammarCompiler.from_info(info)
    while True:
        try:
            params = conn.recv()
        except (EOFError, OSError):
            return
        try:
            conn.send(Compiled(compiler.compile_timed(params)[1]))
        except GrammarCompileError as error:
            conn.send(Invalid(str(error)))
