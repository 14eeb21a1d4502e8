"""The runner's side of structured output: compile in the background, match per sequence.

A constrained sequence's grammar is compiled on a thread of its own as soon as the
sequence reaches the runner, so the compile overlaps the prefill forward instead of
stalling the step; the first sampling of the sequence waits for it if it is not done.
Compilers are shared within a process (``shared_compiler``), so the offline engine's
validation and its runner compile each constraint once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import Future
from queue import Empty, SimpleQueue
from threading import Lock, Thread
from typing import Any

from octavo.structured_output.compiler import GrammarCompiler
from octavo.structured_output.matcher import GrammarState
from octavo.structured_output.params import StructuredOutputsParams

_COMPILERS: dict[tuple[Any, int], GrammarCompiler] = {}
_COMPILERS_LOCK = Lock()


def shared_compiler(
    key: Any, load_tokenizer: Callable[[], Any], vocab_size: int, stop_token_ids: Iterable[int]
) -> GrammarCompiler:
    """This process's compiler for the model ``key`` (its folder), made on first use."""
    with _COMPILERS_LOCK:
        compiler = _COMPILERS.get((key, vocab_size))
        if compiler is None:
            compiler = GrammarCompiler(load_tokenizer(), vocab_size, stop_token_ids)
            _COMPILERS[(key, vocab_size)] = compiler
        return compiler


class PendingGrammar:
    """A sequence's grammar state once its compile is done (waits for it on first use)."""

    def __init__(self, compiled: Future, output_token_ids: list[int]) -> None:
        self._compiled, self._replay = compiled, list(output_token_ids)
        self._state: GrammarState | None = None

    def state(self) -> GrammarState:
        if self._state is None:
            self._state = GrammarState(self._compiled.result(), self._replay)
        return self._state


class StructuredOutputManager:
    """Compiles on one daemon thread: a compile in flight (C++, not interruptible) never
    keeps the engine's process from exiting, as a ``ThreadPoolExecutor``'s thread would.
    The thread starts with the first compile and ends after ``IDLE_SECONDS`` without one,
    so an engine that is dropped (never shut down) is not kept alive by it."""

    IDLE_SECONDS = 5.0

    def __init__(self, compiler: Callable[[], GrammarCompiler]) -> None:
        self._compiler = compiler  # called on the compile thread: loading it is slow too
        self._jobs: SimpleQueue[tuple[Future, StructuredOutputsParams]] = SimpleQueue()
        self._lock = Lock()
        self._thread: Thread | None = None

    def start(self, params: StructuredOutputsParams, output_token_ids: list[int]) -> PendingGrammar:
        future: Future = Future()
        self._jobs.put((future, params))
        self._ensure_thread()
        return PendingGrammar(future, output_token_ids)

    def _ensure_thread(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = Thread(target=self._serve, name="octavo-grammar", daemon=True)
                self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                future, params = self._jobs.get(timeout=self.IDLE_SECONDS)
            except Empty:
                with self._lock:  # a job put before this check is served; after it, a new thread
                    if self._jobs.empty():
                        self._thread = None
                        return
                continue
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(self._compiler().compile(params))
            except Exception as error:  # raised by the sequence's first sampling step
                future.set_exception(error)
