"""The compile processes' side: a zygote that forks compile processes, and their loop.

xgrammar compiles in C++ and a thread running it cannot be interrupted, so the server
compiles in processes of its own, which it kills when a compile passes its deadline
(``compile_pool.py``). Starting a Python process that imports xgrammar takes seconds
(xgrammar itself imports torch and transformers), so one process, the zygote, does that
once, with xgrammar's view of the vocabulary built, and forks each compile process on
request: a fork is ready in milliseconds and shares the zygote's memory. The zygote is
single-threaded when it forks, and ignores SIGCHLD, so the killed processes are reaped by
the kernel; a compile process is killed when the zygote dies.

The zygote is a plain ``python this_file.py FD`` (``start_zygote``): it imports this module
and the compiler under a bare ``octavo`` package, not ``octavo/__init__`` (the engine), nor
the server's main module as multiprocessing's spawn would. The server talks to it over the
socket ``FD``: the pickled ``Vocabulary`` first, then ``FORK`` requests.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import importlib
import os
import signal
import subprocess
import sys
import types
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.reduction import recv_handle
from pathlib import Path
from typing import Any

READY = "ready"
FORK = "fork"
_PR_SET_PDEATHSIG = 1  # prctl(2)


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


def start_zygote(conn: Connection) -> subprocess.Popen:
    """Start a zygote serving ``conn`` (the other end of a ``multiprocessing.Pipe()``,
    which the caller then closes and ``Vocabulary`` is sent over)."""
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false")  # no Rust threads: it forks
    command = [sys.executable, __file__, str(conn.fileno())]
    return subprocess.Popen(command, pass_fds=(conn.fileno(),), stdin=subprocess.DEVNULL, env=env)


def zygote_main(conn: Connection) -> None:
    """Load xgrammar and the vocabulary (the first message), say ``READY``; then for each
    ``FORK`` (followed by a pipe end, passed as a file descriptor) fork a compile process
    serving that pipe and answer its pid. Returns when the server's end of ``conn`` closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server decides when this stops
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # killed children are reaped at once
    from octavo.structured_output.compiler import tokenizer_info

    try:
        vocabulary: Vocabulary = conn.recv()
    except (EOFError, OSError):
        return
    info = tokenizer_info(vocabulary.tokenizer, vocabulary.vocab_size, vocabulary.stop_token_ids)
    conn.send(READY)
    while True:
        try:
            conn.recv()  # FORK
            fd = recv_handle(conn)
        except (EOFError, OSError):
            return
        zygote_pid = os.getpid()
        pid = os.fork()
        if pid == 0:
            conn.close()
            _child(Connection(fd), info, zygote_pid)
        os.close(fd)
        conn.send(pid)


def _child(conn: Connection, info, zygote_pid: int) -> None:
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    _die_with_parent(zygote_pid)
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


def _die_with_parent(parent_pid: int) -> None:
    """SIGKILL this process when its parent (the single-threaded zygote) exits: a compile
    in flight never outlives the server (Linux; elsewhere its pipe's EOF ends it later)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (AttributeError, OSError):
        return
    if os.getppid() != parent_pid:  # the zygote died before prctl
        os._exit(0)


def _import_without_the_engine() -> types.ModuleType:
    """This module, imported under a bare ``octavo`` package: ``octavo/__init__`` imports the
    whole engine, which a zygote does not need (its pickles name ``octavo.…`` modules)."""
    here = Path(__file__).resolve()
    if sys.path and Path(sys.path[0] or ".").resolve() == here.parent:
        del sys.path[0]  # the script's folder: its modules are not top-level modules
    package = types.ModuleType("octavo")
    package.__path__ = [str(here.parents[1])]
    sys.modules.setdefault("octavo", package)
    return importlib.import_module("octavo.structured_output.compile_worker")


if __name__ == "__main__":
    _import_without_the_engine().zygote_main(Connection(int(sys.argv[1])))
