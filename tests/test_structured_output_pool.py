"""The compile pool's lifecycle without a server: shutting it down while its zygote is
still starting returns at once, equal vocabularies share a zygote, the zygote imports only
what compiling needs, the server starts it in the background once the engine is ready,
and the engine's compile thread is a daemon (a compile in flight never keeps a process
from exiting)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from transformers import AutoTokenizer

from octavo.entrypoints.openai.app import warm_when_ready
from octavo.entrypoints.openai.structured_outputs import GrammarChecker
from octavo.structured_output import compile_worker
from octavo.structured_output.compile_pool import (
    STARTUP_TIMEOUT_SECONDS,
    CompilePool,
    CompilerUnavailable,
    shared_zygote,
)
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


def test_the_engine_compile_thread_is_a_daemon_that_ends_when_idle(monkeypatch):
    """A daemon (never blocks exit), started by the first compile and gone when idle, so a
    dropped engine is not kept alive (with its KV cache) by its compile thread."""
    monkeypatch.setattr(StructuredOutputManager, "IDLE_SECONDS", 0.1)
    manager = StructuredOutputManager(lambda: None)
    assert manager._thread is None
    pending = manager.start(StructuredOutputsParams(choice=["a", "b"]), [])
    thread = manager._thread
    assert thread is not None and thread.daemon
    with pytest.raises(AttributeError):  # the stand-in compiler has no compile()
        pending.state()
    thread.join(timeout=5)
    assert not thread.is_alive() and manager._thread is None
    second = manager.start(StructuredOutputsParams(choice=["a", "b"]), [])
    with pytest.raises(AttributeError):  # served by a new thread
        second.state()


def test_the_zygote_imports_what_compiling_needs_not_the_engine():
    """The zygote is a plain ``python compile_worker.py FD`` process: it imports the compiler
    under a bare ``octavo`` package, never ``octavo/__init__`` (the engine) nor the server
    (multiprocessing's spawn re-imported the server's main module: 78 s at load 18)."""
    worker = Path(compile_worker.__file__)
    code = (
        "import json, runpy, sys\n"
        f"sys.path.insert(0, {str(worker.parent)!r})\n"  # as when run as a script
        f"module = runpy.run_path({str(worker)!r})['_import_without_the_engine']()\n"
        "import octavo.structured_output.compiler\n"
        "print(json.dumps([module.__name__, sorted(sys.modules)]))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    name, modules = json.loads(result.stdout)
    assert name == "octavo.structured_output.compile_worker"  # its pickles name this module
    octavo_modules = {module for module in modules if module.startswith("octavo")}
    assert octavo_modules == {
        "octavo",
        "octavo.structured_output",
        "octavo.structured_output.compile_worker",
        "octavo.structured_output.compiler",
        "octavo.structured_output.params",
    }
    assert not {"fastapi", "uvicorn", "starlette"} & set(modules)


def test_warm_starts_the_compile_processes_in_the_background(smol_tokenizer):
    """Once the engine is ready the server starts the compile processes without waiting
    for them; the first constrained request then finds them ready."""
    tokenizer = smol_tokenizer
    info = SimpleNamespace(
        tokenizer=tokenizer, vocab_size=len(tokenizer), eos_token_ids=[tokenizer.eos_token_id]
    )
    engine, checker = SimpleNamespace(status="ready", info=info), GrammarChecker()
    started = time.monotonic()
    asyncio.run(warm_when_ready(engine, checker))
    assert time.monotonic() - started < 1  # the zygote's start is not awaited
    try:
        assert checker._pool is not None
        checker._pool.ready.result(timeout=STARTUP_TIMEOUT_SECONDS)
        metrics = SimpleNamespace(record_constrained=lambda kind, seconds: None)
        started = time.monotonic()
        asyncio.run(checker.check(StructuredOutputsParams(choice=("on", "off")), info, metrics))
        assert time.monotonic() - started < 2
    finally:
        checker.shutdown()


def test_no_warm_up_when_the_engine_fails_to_load():
    checker = SimpleNamespace(warm=lambda info: pytest.fail("warmed a failed engine"))
    asyncio.run(warm_when_ready(SimpleNamespace(status="failed", info=None), checker))


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG and /proc are Linux's")
def test_compile_processes_die_with_their_zygote(smol_tokenizer):
    """A compile in flight never outlives the zygote (killed at the server's exit)."""
    tokenizer = smol_tokenizer
    vocabulary = Vocabulary(tokenizer, len(tokenizer), (tokenizer.eos_token_id,))
    pool = CompilePool(vocabulary, 1)
    try:
        pool.ready.result(timeout=STARTUP_TIMEOUT_SECONDS)
        (process,) = pool._processes
        shared_zygote(vocabulary).kill()
        deadline = time.monotonic() + 5
        while _is_running(process.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _is_running(process.pid)
    finally:
        pool.shutdown()


def _is_running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
