"""The compile pool without a server: shutting it down while its zygote is still starting
returns at once, equal vocabularies share a zygote, the zygote imports only what compiling
needs, its warm-up compiles before it returns, small constraints never queue behind slow
ones, and the engine's compile thread is a daemon (a compile in flight never keeps a
process from exiting). The served warm-up (/health 200 only once it is done) is tested on
``octavo serve`` itself, in test_server_sigterm.py."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from unittest.mock import Mock

import pytest
from transformers import AutoTokenizer

from octavo.entrypoints.openai.app import warm_when_ready
from octavo.entrypoints.openai.metrics import UNCOUNTED_REQUEST_PREFIX, ServerMetrics
from octavo.entrypoints.openai.structured_outputs import GrammarChecker
from octavo.outputs import CompletionOutput, RequestMetrics, RequestOutput
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

from server_harness import engine_stats, metric_value

SLOW_ENTRIES = 20_000  # a choice of 20,000 compiles for 20-50 s: stopped at the deadline
TRIVIAL = StructuredOutputsParams(choice=("yes", "no"))


def test_shutdown_while_starting_returns_at_once(smol_tokenizer):
    """The pool's threads may be starting the zygote (seconds): shutting down does not wait
    for them, and a job submitted afterwards is refused."""
    tokenizer = smol_tokenizer
    pool = CompilePool(Vocabulary(tokenizer, len(tokenizer), (tokenizer.eos_token_id,)), 2)
    started = time.monotonic()
    pool.shutdown()
    assert time.monotonic() - started < 1
    with pytest.raises(CompilerUnavailable):
        pool.submit(StructuredOutputsParams(choice=("a", "b")), 1.0).future.result(timeout=1)


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


def engine_info(tokenizer) -> SimpleNamespace:
    """The few ``EngineInfo`` fields the grammar checker reads."""
    return SimpleNamespace(
        tokenizer=tokenizer, vocab_size=len(tokenizer), eos_token_ids=[tokenizer.eos_token_id]
    )


def test_the_warm_up_compiles_a_constraint_before_it_ends(smol_tokenizer):
    """The server's warm-up starts the compile processes and compiles a trivial constraint
    before it returns."""
    info, checker = engine_info(smol_tokenizer), GrammarChecker()
    asyncio.run(checker.warm_up(info))
    try:
        assert checker._pool.ready.done()
        metrics = SimpleNamespace(record_constrained=lambda kind, seconds: None)
        started = time.monotonic()
        asyncio.run(checker.check(StructuredOutputsParams(choice=("on", "off")), info, metrics))
        assert time.monotonic() - started < 2
    finally:
        checker.shutdown()


def test_no_warm_up_when_the_engine_fails_to_load():
    async def warm_up(info) -> None:
        pytest.fail("warmed a failed engine")

    checker = SimpleNamespace(warm_up=warm_up, warming=True)
    asyncio.run(warm_when_ready(SimpleNamespace(status="failed", info=None), checker))
    assert not checker.warming


def test_the_warm_up_request_is_not_counted_as_a_request():
    """The server's own constrained request (before /health 200) is not a client's: not in
    the request metrics, and its tokens are not in the engine's token counters."""
    metrics = ServerMetrics("tiny")
    completion = CompletionOutput(0, "", [7], finish_reason="length", num_tokens=1)
    times = RequestMetrics(arrival_time=1.0, first_token_time=1.5, last_token_time=1.5)
    for request_id in (f"{UNCOUNTED_REQUEST_PREFIX}1", "cmpl-1"):
        output = RequestOutput(request_id, None, [1], [completion], True, 0, times)
        output.num_prompt_tokens = 1
        metrics.record_output(output)
    metrics.engine_stats.update(engine_stats(prompt_tokens=2, generation_tokens=2, running=0))
    text = metrics.render().decode()
    assert metric_value(text, "vllm:request_success_total") == 1
    for name in ("prompt_tokens", "generation_tokens", "prefix_cache_queries"):
        assert metric_value(text, f"vllm:{name}_total") == 1, name


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


def slow_constraint(index: int) -> StructuredOutputsParams:
    return StructuredOutputsParams(choice=tuple(f"s{index}-{i}" for i in range(SLOW_ENTRIES)))


async def timed_check(checker: GrammarChecker, info, constraint) -> float:
    """Seconds ``constraint``'s check took (raises its 400 or 503)."""
    started = time.monotonic()
    await checker.check(constraint, info, Mock())
    return time.monotonic() - started


async def stop(tasks: list[asyncio.Task]) -> list:
    """Cancel ``tasks`` (their compiles are killed); their outcomes."""
    for task in tasks:
        task.cancel()
    return await asyncio.gather(*tasks, return_exceptions=True)


def test_a_small_constraint_does_not_wait_behind_slow_ones(smol_tokenizer):
    """Five slow constraints, then a trivial one: it took 9.4 s (two compile processes, and
    a deadline that counted the time queued); now it never waits for a slow compile. The
    slow ones are 400s at their deadline, counted from their own compile's start."""
    info, checker = engine_info(smol_tokenizer), GrammarChecker(timeout=1.0)

    async def scenario() -> float:
        await checker.warm_up(info)
        constraints = [slow_constraint(index) for index in range(5)]
        slow = [asyncio.create_task(timed_check(checker, info, c)) for c in constraints]
        await asyncio.sleep(0.05)  # they are queued or compiling now
        trivial = await timed_check(checker, info, TRIVIAL)
        for outcome in await asyncio.gather(*slow[:2], return_exceptions=True):
            assert getattr(outcome, "status", None) == 400, outcome
            assert "did not compile within 1 s" in outcome.message
        await stop(slow[2:])
        return trivial

    try:
        assert asyncio.run(scenario()) < 2
    finally:
        checker.shutdown()


def test_trivial_constraints_between_slow_ones_all_compile(smol_tokenizer):
    """A slow constraint every 0.3 s and a trivial one after each: 2 of 6 trivial ones
    failed "simplify it" (their deadline ran out in the queue); now each compiles at once."""
    info, checker = engine_info(smol_tokenizer), GrammarChecker(timeout=1.0)

    async def scenario() -> list[float]:
        await checker.warm_up(info)
        slow, trivial = [], []
        for index in range(6):
            slow.append(asyncio.create_task(timed_check(checker, info, slow_constraint(index))))
            await asyncio.sleep(0.3)
            fresh = StructuredOutputsParams(choice=(f"yes {index}", "no"))  # not remembered
            trivial.append(await timed_check(checker, info, fresh))
        await stop(slow)
        return trivial

    try:
        assert max(asyncio.run(scenario())) < 2
    finally:
        checker.shutdown()
