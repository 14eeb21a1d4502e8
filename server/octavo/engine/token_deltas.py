"""Token deltas: the engine core's lean output for a served stream (vLLM v1's
``EngineCoreOutput``, which its API process turns into a ``RequestOutput``).

At high concurrency the core's step loop is the server's bottleneck, and most rows of a
step belong to streams of deltas with one completion, no logprobs and no text made in
the core (the server decodes it: ``stream_text``). Building each such row's
``RequestOutput`` (three dataclasses), packing and pickling it took 1.3-1.8 ms a step
at 256 streams, all of it on the core's loop. Such a row needs nothing from a step but
its new token ids, its token count, the time of its newest token and its preemptions:
after the request's first output (a full one: prompt ids, cached tokens, times) the core
sends each unfinished step of it as a plain tuple, a ``TokenDelta``. Its last output is
full again (finish and stop reasons, finished time). The server (``AsyncEngine``)
rebuilds the ``RequestOutput`` the core would have made from the tuple and the fields
its first output carried (``TokenDeltaExpander``), before anything else reads it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from octavo.outputs import CompletionOutput, RequestMetrics, RequestOutput
from octavo.sampling_params import RequestOutputKind, SamplingParams

logger = logging.getLogger(__name__)

# (request id, new token ids, tokens generated so far, newest token's time, preemptions)
TokenDelta = tuple[str, list[int], int, float | None, int]


def sends_token_deltas(params: SamplingParams) -> bool:
    """Can every unfinished output of this request travel as a ``TokenDelta``: one
    completion's deltas without logprobs, prompt logprobs or text made in the core?"""
    return (
        params.n == 1
        and params.output_kind is RequestOutputKind.DELTA
        and not params.detokenize
        and params.logprobs is None
        and params.prompt_logprobs is None
        and params.pooling is None
    )


@dataclass(frozen=True)
class _Fixed:
    """What a token-delta request's outputs repeat from its first one."""

    prompt: str | None
    num_cached_tokens: int
    num_prompt_tokens: int
    arrival_time: float
    first_scheduled_time: float | None
    first_token_time: float | None


class TokenDeltaExpander:
    """The server's side: each ``TokenDelta`` back into the ``RequestOutput`` the core
    would have sent, from what the request's first output carried."""

    def __init__(self) -> None:
        self._fixed: dict[str, _Fixed] = {}

    def expand(self, outputs: list[Any]) -> list[Any]:
        """A step's outputs with every ``TokenDelta`` rebuilt (the others as they are)."""
        expanded = []
        for output in outputs:
            if type(output) is tuple:
                output = self._rebuild(output)
                if output is None:
                    continue
            elif type(output) is RequestOutput:
                self._note(output)
            expanded.append(output)
        return expanded

    def forget_all(self) -> None:
        """The engine stopped: no request of it sends anything more."""
        self._fixed.clear()

    def _note(self, output: RequestOutput) -> None:
        """Keep a request's first output's fields until its last output."""
        request_id = output.request_id
        if output.finished:
            self._fixed.pop(request_id, None)
        elif request_id not in self._fixed and len(output.outputs) == 1:
            metrics = output.metrics
            self._fixed[request_id] = _Fixed(
                output.prompt,
                output.num_cached_tokens,
                output.num_prompt_tokens,
                metrics.arrival_time,
                metrics.first_scheduled_time,
                metrics.first_token_time,
            )

    def _rebuild(self, delta: TokenDelta) -> RequestOutput | None:
        request_id, token_ids, num_tokens, token_time, num_preemptions = delta
        fixed = self._fixed.get(request_id)
        if fixed is None:  # the core sends a full output first: never expected
            logger.error("a token delta of %s came before its first output: dropped", request_id)
            return None
        metrics = RequestMetrics(
            fixed.arrival_time,
            fixed.first_scheduled_time,
            fixed.first_token_time,
            token_time,
            None,
            num_preemptions,
        )
        completion = CompletionOutput(
            0, "", token_ids, delta_token_ids=token_ids, num_tokens=num_tokens
        )
        return RequestOutput(
            request_id,
            fixed.prompt,
            [],
            [completion],
            False,
            fixed.num_cached_tokens,
            metrics,
            num_prompt_tokens=fixed.num_prompt_tokens,
        )
