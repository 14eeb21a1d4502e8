"""Rebuilding cumulative outputs from the engine core's deltas, on the server's side.

The engine core sends each request's outputs as deltas (``RequestOutputKind.DELTA``):
only the new token ids, logprobs and text, the prompt ids once. The HTTP handlers want
the request so far plus what is new, so each request's stream keeps one accumulator. A
view is made per wake-up of the handler and may cover several deltas; it holds the
accumulated lists themselves (no copies), so a handler reads a view's lengths when it
gets it and uses ``delta_*`` for what is new.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from octavo.outputs import CompletionOutput, RequestOutput
from octavo.sampling.token_logprobs import TokenLogprobs


@dataclass
class _New:
    """What the deltas of one wake-up added to one completion."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprobs] | None = None

    def add(self, delta: CompletionOutput) -> None:
        self.text += delta.delta_text
        self.token_ids += delta.delta_token_ids
        if delta.logprobs is not None:
            self.logprobs = (self.logprobs or []) + delta.logprobs


@dataclass
class _Completion:
    """One completion so far."""

    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprobs] | None = None
    last: CompletionOutput | None = None  # the newest delta: finish and stop reasons, counts

    def add(self, delta: CompletionOutput) -> None:
        self.text += delta.delta_text
        self.token_ids += delta.delta_token_ids
        if delta.logprobs is not None:
            self.logprobs = self.logprobs if self.logprobs is not None else []
            self.logprobs += delta.logprobs
        self.last = delta

    def view(self, new: _New) -> CompletionOutput:
        assert self.last is not None
        return CompletionOutput(
            index=self.index,
            text=self.text,
            token_ids=self.token_ids,
            finish_reason=self.last.finish_reason,
            stop_reason=self.last.stop_reason,
            cumulative_logprob=self.last.cumulative_logprob,
            logprobs=self.logprobs,
            delta_text=new.text,
            delta_token_ids=new.token_ids,
            num_tokens=self.last.num_tokens,
            delta_logprobs=new.logprobs,
        )


class OutputAccumulator:
    """One request's outputs so far, from its delta outputs."""

    def __init__(self) -> None:
        self._prompt_token_ids: list[int] | None = None
        self._completions: dict[int, _Completion] = {}

    def merge(self, deltas: list[RequestOutput]) -> RequestOutput:
        """The request so far; its ``delta_*`` fields cover exactly ``deltas``."""
        new: dict[int, _New] = {}
        for delta in deltas:
            if self._prompt_token_ids is None:
                self._prompt_token_ids = delta.prompt_token_ids
            for completion in delta.outputs:
                index = completion.index
                self._completions.setdefault(index, _Completion(index)).add(completion)
                new.setdefault(index, _New()).add(completion)
        last = deltas[-1]
        completions = sorted(self._completions.values(), key=lambda c: c.index)
        return RequestOutput(
            request_id=last.request_id,
            prompt=last.prompt,
            prompt_token_ids=self._prompt_token_ids or [],
            outputs=[c.view(new.get(c.index, _New())) for c in completions],
            finished=last.finished,
            num_cached_tokens=last.num_cached_tokens,
            metrics=last.metrics,
            error=last.error,
            num_prompt_tokens=last.num_prompt_tokens,
            prompt_logprobs=last.prompt_logprobs,
            pooled=last.pooled,
            kv_transfer_params=last.kv_transfer_params,
        )
