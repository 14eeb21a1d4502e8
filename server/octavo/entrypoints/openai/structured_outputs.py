"""A request's output constraint, from any of the spellings vLLM accepts, checked off the
event loop and off the engine before the request is admitted.

Spellings: ``response_format`` (chat: ``json_object``, ``json_schema``), vLLM's
``structured_outputs`` object and its older ``guided_json`` / ``guided_regex`` /
``guided_choice`` / ``guided_grammar``. At most one may be given. The constraint is
compiled here, in a compile process, with a deadline: an invalid one is a 400 naming the
problem, one larger than ``MAX_CONSTRAINT_CHARS`` or that does not compile in
``COMPILE_TIMEOUT_SECONDS`` of compile time too (its process is killed, so it stops using
the CPU; time queued does not count, and small constraints never queue behind large ones:
``compile_pool.py``), and a pathological schema never reaches (or stalls) the engine,
whose runner then compiles it in the background. Requests waiting for a compile count as
in flight while the server drains (``in_flight``).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections import OrderedDict
from typing import Any

from octavo.engine.engine_info import EngineInfo
from octavo.entrypoints.openai.errors import APIError, bad_request
from octavo.entrypoints.openai.metrics import ServerMetrics
from octavo.structured_output.compile_pool import (
    STARTUP_TIMEOUT_SECONDS,
    CompilePool,
    CompilerUnavailable,
    CompileTimeout,
)
from octavo.structured_output.compile_worker import Compiled, Invalid, Vocabulary
from octavo.structured_output.compiler import GrammarCompileError
from octavo.structured_output.limits import MAX_CONSTRAINT_CHARS, check_constraint_size
from octavo.structured_output.params import StructuredOutputsParams

logger = logging.getLogger(__name__)

COMPILE_TIMEOUT_SECONDS = 10.0
COMPILE_PROCESSES = 2  # fast lanes; as many slow lanes (compile_pool.py)
WARM_UP_CONSTRAINT = StructuredOutputsParams(choice=("warm", "up"))
ANSWERS_KEPT = 1024  # constraints whose answer (compiled or invalid) is remembered
_GUIDED = {
    "guided_json": "json",
    "guided_regex": "regex",
    "guided_choice": "choice",
    "guided_grammar": "grammar",
}


def requested_constraint(body: Any) -> StructuredOutputsParams | None:
    """The request's constraint, or ``None``; 400 when several or a malformed one is given."""
    given = {name: value for name, value in _spellings(body).items() if value is not None}
    if len(given) > 1:
        raise bad_request(
            f"only one of {', '.join(sorted(given))} may be set: each constrains the output"
        )
    if not given:
        return None
    ((param, value),) = given.items()
    try:
        return StructuredOutputsParams(**value)
    except ValueError as error:
        raise bad_request(str(error), param=param) from None


def _spellings(body: Any) -> dict[str, dict | None]:
    found: dict[str, dict | None] = {
        name: None if getattr(body, name) is None else {kind: getattr(body, name)}
        for name, kind in _GUIDED.items()
    }
    if body.structured_outputs is not None:
        found["structured_outputs"] = body.structured_outputs.model_dump(exclude_none=True)
    response_format = getattr(body, "response_format", None)
    if response_format is not None:
        found["response_format"] = response_format.constraint()
    return found


async def checked_constraint(
    body: Any,
    info: EngineInfo,
    context: Any,
    tool_constraint: StructuredOutputsParams | None = None,
) -> StructuredOutputsParams | None:
    """The request's constraint (or the one ``tool_choice`` implies), compiled once here
    (400 if invalid or too slow, or if both are given)."""
    constraint = chosen_constraint(body, tool_constraint)
    if constraint is not None:
        kind = "tool_calls" if tool_constraint is not None else None
        await context.grammars.check(constraint, info, context.metrics, kind)
    return constraint


def chosen_constraint(
    body: Any, tool_constraint: StructuredOutputsParams | None = None
) -> StructuredOutputsParams | None:
    """The request's constraint or the one ``tool_choice`` implies, not compiled (400 if
    both are given, or the request's is malformed)."""
    constraint = requested_constraint(body)
    if tool_constraint is None:
        return constraint
    if constraint is not None:
        raise bad_request(
            "tool_choice 'required' or a named function constrains the output already; "
            "drop response_format / structured_outputs / guided_*",
            param="tool_choice",
        )
    return tool_constraint


class GrammarChecker:
    """Compiles constraints for the API process (validation, metrics) in compile processes
    that are killed at the deadline (``compile_pool.py``); remembers each constraint's
    answer, so a repeated one costs a dictionary lookup."""

    def __init__(
        self,
        timeout: float = COMPILE_TIMEOUT_SECONDS,
        num_processes: int = COMPILE_PROCESSES,
        max_chars: int = MAX_CONSTRAINT_CHARS,
    ) -> None:
        self.timeout, self.max_chars = timeout, max_chars
        self._num_processes = num_processes
        self._pool: CompilePool | None = None
        self._answers: OrderedDict[bytes, Compiled | Invalid] = OrderedDict()
        self._closed = False
        self.in_flight = 0  # requests in ``check`` now: a drain waits for them
        self.warming = False  # the server's warm-up is not done: /health is not 200 yet

    async def check(
        self,
        constraint: StructuredOutputsParams,
        info: EngineInfo,
        metrics: ServerMetrics,
        kind: str | None = None,
    ) -> None:
        """Compile ``constraint`` (400 if invalid, too large or too slow); count it under
        ``kind`` (default: the constraint's own kind)."""
        try:
            check_constraint_size(constraint, self.max_chars)
        except GrammarCompileError as error:
            raise bad_request(str(error)) from None
        self.in_flight += 1
        try:
            answer = await self._answer(constraint, info)
        finally:
            self.in_flight -= 1
        if isinstance(answer, Invalid):
            raise bad_request(answer.message)
        metrics.record_constrained(kind or constraint.kind, answer.seconds)

    async def _answer(
        self, constraint: StructuredOutputsParams, info: EngineInfo
    ) -> Compiled | Invalid:
        """The remembered answer (``Compiled(None)``: no compile now), or a compile's."""
        key = _digest(constraint)
        answer = self._answers.get(key)
        if answer is None:
            answer = await self._compile(constraint, info)
            self._remember(key, answer)
            return answer
        self._answers.move_to_end(key)
        return Compiled(None) if isinstance(answer, Compiled) else answer

    async def _compile(
        self, constraint: StructuredOutputsParams, info: EngineInfo
    ) -> Compiled | Invalid:
        pool = self._pool_for(info)
        try:  # the first start imports xgrammar (seconds): not part of the deadline
            await asyncio.wait_for(asyncio.wrap_future(pool.ready), STARTUP_TIMEOUT_SECONDS)
        except (TimeoutError, CompilerUnavailable) as error:
            raise _unavailable(error) from None
        job = pool.submit(constraint, self.timeout)
        try:
            return await asyncio.wrap_future(job.future)  # the pool enforces the deadline
        except CompileTimeout:
            raise bad_request(
                f"the {constraint.kind} constraint did not compile within "
                f"{self.timeout:g} s; simplify it"
            ) from None
        except CompilerUnavailable as error:
            raise _unavailable(error) from None
        finally:
            job.abandoned.set()  # still queued: dropped; compiling: its process is killed

    async def warm_up(self, info: EngineInfo) -> None:
        """Start the compile processes (the zygote imports xgrammar: seconds) and compile a
        trivial constraint, so that the first constrained request does not wait for them.
        A failure is logged (the constrained requests are then 503s saying why)."""
        try:
            if not self._closed:
                pool = self._pool_for(info)
                await asyncio.wait_for(asyncio.wrap_future(pool.ready), STARTUP_TIMEOUT_SECONDS)
                job = pool.submit(WARM_UP_CONSTRAINT, STARTUP_TIMEOUT_SECONDS)
                await asyncio.wrap_future(job.future)
        except Exception as error:  # reported, never fatal: generation works without it
            logger.error("the grammar compiler did not start: %s", error or type(error).__name__)

    def _pool_for(self, info: EngineInfo) -> CompilePool:
        if self._closed:
            raise _unavailable(CompilerUnavailable("the server is shutting down"))
        if self._pool is None:
            vocabulary = Vocabulary(
                info.tokenizer, info.vocab_size, tuple(sorted(info.eos_token_ids))
            )
            self._pool = CompilePool(vocabulary, self._num_processes)
        return self._pool

    def _remember(self, key: bytes, answer: Compiled | Invalid) -> None:
        self._answers[key] = answer
        while len(self._answers) > ANSWERS_KEPT:
            self._answers.popitem(last=False)

    def shutdown(self) -> None:
        self._closed = True
        if self._pool is not None:
            self._pool.shutdown()


def _digest(constraint: StructuredOutputsParams) -> bytes:
    kind, spec = constraint.cache_key()
    return hashlib.sha256(f"{kind}\0{spec}".encode()).digest()


def _unavailable(error: Exception) -> APIError:
    message = str(error) or "it did not start in time"
    return APIError(
        503, f"structured output is unavailable: {message}", code="grammar_compiler_unavailable"
    )
