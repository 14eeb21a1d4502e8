"""The compile pool's lifecycle without a server: shutting it down while its zygote is
still importing xgrammar returns at once and kills the zygote, and the engine's compile
thread is a daemon (a compile in flight never keeps a process from exiting)."""

from __future__ import annotations

import time

from octavo.structured_output.compile_pool import CompilePool
from octavo.structured_output.compile_worker import Vocabulary
from octavo.structured_output.manager import StructuredOutputManager


def test_shutdown_while_starting_kills_the_zygote_at_once(smol_tokenizer):
    tokenizer = smol_tokenizer
    pool = CompilePool(Vocabulary(tokenizer, len(tokenizer), (tokenizer.eos_token_id,)), 1)
    deadline = time.monotonic() + 30
    while pool._zygote is None:  # the pool thread starts it at once
        assert time.monotonic() < deadline
        time.sleep(0.01)
    started = time.monotonic()
    pool.shutdown()
    assert time.monotonic() - started < 6
    assert not pool._zygote.is_alive()


def test_the_engine_compile_thread_is_a_daemon():
    manager = StructuredOutputManager(lambda: None)
    assert manager._thread.daemon and manager._thread.is_alive()
