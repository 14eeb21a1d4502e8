"""A request's output constraint, from any of the spellings vLLM accepts, checked off the
event loop and off the engine before the request is admitted.

Spellings: ``response_format`` (chat: ``json_object``, ``json_schema``), vLLM's
``structured_outputs`` object and its older ``guided_json`` / ``guided_regex`` /
``guided_choice`` / ``guided_grammar``. At most one may be given. The constraint is
compiled here, in a thread, with a deadline: an invalid one is a 400 naming the problem,
one that does not compile in ``COMPILE_TIMEOUT_SECONDS`` too, so a pathological schema
never reaches (or stalls) the engine, whose runner then finds it cached or compiles it
in the background.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from octavo.engine.engine_info import EngineInfo
from octavo.entrypoints.openai.errors import bad_request
from octavo.entrypoints.openai.metrics import ServerMetrics
from octavo.structured_output.compiler import GrammarCompileError, GrammarCompiler
from octavo.structured_output.params import StructuredOutputsParams

COMPILE_TIMEOUT_SECONDS = 10.0
COMPILE_THREADS = 2
_GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice",
           "guided_grammar": "grammar"}  # fmt: skip


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
    constraint, kind = requested_constraint(body), None
    if tool_constraint is not None:
        if constraint is not None:
            raise bad_request(
                "tool_choice 'required' or a named function constrains the output already; "
                "drop response_format / structured_outputs / guided_*",
                param="tool_choice",
            )
        constraint, kind = tool_constraint, "tool_calls"
    if constraint is not None:
        await context.grammars.check(constraint, info, context.metrics, kind)
    return constraint


class GrammarChecker:
    """Compiles constraints for the API process (validation, metrics), in a few threads."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(COMPILE_THREADS, thread_name_prefix="octavo-grammar")
        self._compiler: GrammarCompiler | None = None
        self._lock = threading.Lock()

    async def check(
        self,
        constraint: StructuredOutputsParams,
        info: EngineInfo,
        metrics: ServerMetrics,
        kind: str | None = None,
    ) -> None:
        """Compile ``constraint`` (400 if invalid or too slow); count it under ``kind``
        (default: the constraint's own kind)."""
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._pool, self._compile, constraint, info)
        try:
            _, seconds = await asyncio.wait_for(asyncio.shield(future), COMPILE_TIMEOUT_SECONDS)
        except TimeoutError:
            raise bad_request(
                f"the {constraint.kind} constraint did not compile within "
                f"{COMPILE_TIMEOUT_SECONDS:.0f} s; simplify it"
            ) from None
        except GrammarCompileError as error:
            raise bad_request(str(error)) from None
        metrics.record_constrained(kind or constraint.kind, seconds)

    def _compile(self, constraint: StructuredOutputsParams, info: EngineInfo):
        with self._lock:
            if self._compiler is None:
                self._compiler = GrammarCompiler(
                    info.tokenizer, info.vocab_size, info.eos_token_ids
                )
        return self._compiler.compile_timed(constraint)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
