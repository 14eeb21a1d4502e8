"""Ready means ready: before ``/health`` says 200, structured output is warm on both sides.

The API process's compile processes start (their zygote imports xgrammar: seconds) and
compile a trivial constraint (``GrammarChecker.warm_up``); and one constrained request of
one token goes through the engine, whose runner then builds its own compiler (xgrammar's
view of the vocabulary: about a second). The first constrained request from a client then
pays for neither. The warm-up request is left out of the request metrics (its id starts
with ``UNCOUNTED_REQUEST_PREFIX``).
"""

from __future__ import annotations

import logging
import uuid

from octavo.engine.async_engine import AsyncEngine
from octavo.engine.core_messages import NewRequest
from octavo.engine.engine_info import EngineInfo
from octavo.entrypoints.openai.metrics import UNCOUNTED_REQUEST_PREFIX
from octavo.entrypoints.openai.structured_outputs import WARM_UP_CONSTRAINT, GrammarChecker
from octavo.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


async def warm_up_structured_output(engine: AsyncEngine, grammars: GrammarChecker) -> None:
    """Warm both compilers (a failure is logged: generation works without them); nothing
    for a pooling model, which does not generate."""
    info = engine.info
    assert info is not None  # called once the engine is ready
    if info.runner is not None and not info.runner.generates:
        return
    await grammars.warm_up(info)
    try:
        await constrained_step(engine, info)
    except Exception as error:  # the engine died or is draining: /health says so
        logger.warning("the engine's grammar warm-up failed: %s", error or type(error).__name__)


async def constrained_step(engine: AsyncEngine, info: EngineInfo) -> None:
    """One token under ``WARM_UP_CONSTRAINT``, through the engine (its runner compiles)."""
    request_id = f"{UNCOUNTED_REQUEST_PREFIX}{uuid.uuid4().hex}"
    prompt = [min(info.eos_token_ids, default=0)]
    params = SamplingParams(max_tokens=1, temperature=0.0, structured_outputs=WARM_UP_CONSTRAINT)
    (stream,) = await engine.add_requests(request_id, [NewRequest(request_id, prompt, params)])
    try:
        async for _ in stream.outputs():
            pass
    finally:
        stream.release([stream])
