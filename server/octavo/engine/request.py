"""A request as the engine tracks it: its ``n`` sequences and their text streams.

Outputs come in the request's ``output_kind``: cumulative (everything so far), delta
(only what is new since the previous output; the prompt ids only in the first) or one
final output. A delta costs what is new, not what was generated before it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from octavo.engine.detokenizer import IncrementalDetokenizer
from octavo.engine.token_deltas import TokenDelta
from octavo.lora_request import LoRARequest
from octavo.multimodal.inputs import ImageInput
from octavo.outputs import CompletionOutput, RequestMetrics, RequestOutput
from octavo.sampling.token_logprobs import TokenLogprobs
from octavo.sampling_params import RequestOutputKind, SamplingParams
from octavo.scheduler.sequence import Sequence, SequenceStatus


@dataclass
class SequenceText:
    """Per-completion state that the scheduler does not need: text and logprobs."""

    detokenizer: IncrementalDetokenizer
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    cumulative_logprob: float = 0.0
    tokens_reported: int = 0

    def add_logprobs(self, entry: TokenLogprobs) -> None:
        self.logprobs.append(entry)
        self.cumulative_logprob += entry.logprob


@dataclass
class Request:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    seqs: list[Sequence] = field(default_factory=list)  # children join when the prompt is done
    texts: dict[int, SequenceText] = field(default_factory=dict)  # by completion index
    finished_time: float | None = None
    prompt_reported: bool = False
    lora_request: LoRARequest | None = None  # the adapter its completions run with
    pooled: list[float] | None = None  # a pooling request's vector, once computed
    images: list[ImageInput] = field(default_factory=list)  # its prompt's images
    # its unfinished outputs after the first travel as ``TokenDelta`` tuples (the server's
    # core loop asks for them: ``token_deltas.py``)
    token_deltas: bool = False

    @property
    def finished(self) -> bool:
        """All ``n`` completions have finished (asked of every request each step it
        outputs: one completion, the common case, without a generator)."""
        seqs = self.seqs
        if len(seqs) != self.params.n:
            return False
        if len(seqs) == 1:
            return seqs[0].status is SequenceStatus.FINISHED
        return all(seq.status is SequenceStatus.FINISHED for seq in seqs)

    @property
    def awaiting_fork(self) -> bool:
        return self.params.n > len(self.seqs)

    def wants_output_now(self, stream_interval: int = 1) -> bool:
        """Does this step make an output: the last one; else, streaming, the first and
        then one each ``stream_interval`` tokens (the request's own interval when it is
        longer: vLLM's ``--stream-interval``) or when one of its completions ends; the
        tokens between wait for it."""
        if self.finished:
            return True
        params = self.params
        if params.output_kind is RequestOutputKind.FINAL_ONLY:
            return False
        interval = max(stream_interval, params.stream_interval or 1)
        if interval == 1 or not self.prompt_reported:
            return True
        return any(self._due(seq, interval) for seq in self.seqs)

    def _due(self, seq: Sequence, interval: int) -> bool:
        """``interval`` tokens waiting, or a completion's last ones (n > 1: it ended)."""
        unreported = self._unreported(seq)
        return unreported >= interval or (unreported > 0 and seq.is_finished)

    def _unreported(self, seq: Sequence) -> int:
        """Tokens of ``seq`` no output has carried yet (all of a completion just forked)."""
        text = self.texts.get(seq.index)
        reported = 0 if text is None else text.tokens_reported
        return seq.num_output_tokens - reported

    @property
    def wants_token_delta(self) -> bool:
        """Is this step's output a ``TokenDelta``: after the first, before the last?"""
        return self.token_deltas and self.prompt_reported and not self.finished

    def token_delta(self) -> TokenDelta:
        """The step's output as a ``TokenDelta`` (``wants_token_delta``)."""
        seq, text = self.seqs[0], self.texts[0]
        reported = text.tokens_reported
        text.tokens_reported = count = seq.num_output_tokens
        new_ids = seq.token_ids[seq.num_prompt_tokens + reported :]
        return self.request_id, new_ids, count, seq.last_token_time, seq.num_preemptions

    def make_output(self) -> RequestOutput:
        finished = self.finished
        if finished and self.finished_time is None:
            self.finished_time = time.monotonic()
        delta = self.params.output_kind is RequestOutputKind.DELTA
        first = self.seqs[0]
        output = RequestOutput(
            request_id=self.request_id,
            prompt=self.prompt,
            prompt_token_ids=[] if delta and self.prompt_reported else self.prompt_token_ids,
            outputs=[self._completion(seq, delta) for seq in self.seqs],
            finished=finished,
            num_cached_tokens=first.num_cached_tokens,
            metrics=self._metrics(),
            num_prompt_tokens=len(self.prompt_token_ids),
            prompt_logprobs=self._prompt_logprobs(),
            pooled=self.pooled,
        )
        self.prompt_reported = True
        return output

    def _prompt_logprobs(self) -> list | None:
        if self.params.prompt_logprobs is None or not self.seqs:
            return None
        return [None, *self.seqs[0].prompt_logprobs]

    def _metrics(self) -> RequestMetrics:
        seqs = self.seqs
        first = seqs[0]
        last_token_time, num_preemptions = first.last_token_time, first.num_preemptions
        if len(seqs) > 1:  # n > 1: the latest token of any completion, every preemption
            last_token_time = max((s.last_token_time or 0.0) for s in seqs)
            num_preemptions = sum(seq.num_preemptions for seq in seqs)
        return RequestMetrics(
            arrival_time=first.arrival_time,
            first_scheduled_time=first.first_scheduled_time,
            first_token_time=first.first_token_time,
            last_token_time=last_token_time or None,
            finished_time=self.finished_time,
            num_preemptions=num_preemptions,
        )

    def _completion(self, seq: Sequence, delta: bool) -> CompletionOutput:
        text = self.texts[seq.index]
        reported, count = text.tokens_reported, seq.num_output_tokens
        delta_ids = seq.token_ids[seq.num_prompt_tokens + reported :]
        text.tokens_reported = count
        wants = self.params.logprobs is not None
        logprobs = (text.logprobs[reported:] if delta else list(text.logprobs)) if wants else None
        detokenizer = text.detokenizer
        if detokenizer.deferred:
            detokenizer.catch_up(seq.output_token_ids)
        delta_text = detokenizer.get_delta(finished=seq.is_finished)
        return CompletionOutput(
            index=seq.index,
            text=delta_text if delta else detokenizer.output_text,
            token_ids=delta_ids if delta else seq.output_token_ids,
            finish_reason=seq.finish_reason,
            stop_reason=seq.stop_reason,
            cumulative_logprob=text.cumulative_logprob if wants and count else None,
            logprobs=logprobs,
            delta_text=delta_text,
            delta_token_ids=delta_ids,
            num_tokens=count,
        )
