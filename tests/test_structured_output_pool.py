"""The compile pool's lifecycle without a server: shutting it down while its zygote is
still starting returns at once, equal vocabularies share a zygote, and the engine's
compile thread is a daemon (a compile in flight never keeps a process from exiting)."""

from __future__ import annotations

import time

import pytest
from transformers import AutoTokenizer

from octavo.structured_output.compile_pool import CompilePool, CompilerUnavailable
from octavo.structured_output.compile_worker import Vocabulary
from octavo.structured_output.manager import StructuredOutputManager
from octavo.structured_output.params import StructuredOutputsParams


def test_shutdown_while_starting_returns_at_once(smol_tokenizer):
    """The pool's threads may be starting the zygote (seconds): shutting down does not wait
    for them, and a job submitted afterwards is refused."""
    tokenizer = smol_tokenizer
    pool = CompilePool(Vocabulary(tokenizer, len(tokenizer), (tokenizer.eos_token_id,)), 2)
    started = time.monotonic()
    pool.shutdown()
    assert time.monotonic() - started < 1
    with pytest.raises(CompilerUnavailable):
        pool.submit(StructuredOutputsParams(choice=("a", "b"))).future.result(timeout=1)


def test_equal_vocabularies_share_a_key(smol_folder, smol_tokenizer):
    """Servers of one process (tests) share a zygote per vocabulary, not per tokenizer."""
    other = AutoTokenizer.from_pretrained(smol_folder)
    first = Vocabulary(smol_tokenizer, len(smol_tokenizer), (smol_tokenizer.eos_token_id,))
    assert Vocabulary(other, len(other), (other.eos_token_id,)).key == first.key
    assert Vocabulary(other, len(other), (0,)).key != first.key


def test_the_engine_compile_thread_is_a_daemon():
    manager = StructuredOutputManager(lambda: None)
    assert manager._thread.daemon and manager._thread.is_alive()
