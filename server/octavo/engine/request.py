"""A request as the engine tracks it: its ``n`` sequences and their text streams."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from octavo.engine.detokenizer import IncrementalDetokenizer
from octavo.outputs import CompletionOutput, RequestMetrics, RequestOutput
from octavo.sampling.sampler import TokenLogprobs
from octavo.sampling_params import SamplingParams
from octavo.scheduler.sequence import Sequence


@dataclass
class SequenceText:
    """Per-completion state that the scheduler does not need: text and logprobs."""

    detokenizer: IncrementalDetokenizer
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    tokens_reported: int = 0


@dataclass
class Request:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    seqs: list[Sequence] = field(default_factory=list)  # children join when the prompt is done
    texts: dict[int, SequenceText] = field(default_factory=dict)  # by completion index
    finished_time: float | None = None

    @property
    def finished(self) -> bool:
        return len(self.seqs) == self.params.n and all(seq.is_finished for seq in self.seqs)

    @property
    def awaiting_fork(self) -> bool:
        return self.params.n > len(self.seqs)

    def make_output(self) -> RequestOutput:
        if self.finished and self.finished_time is None:
            self.finished_time = time.monotonic()
        first = self.seqs[0]
        return RequestOutput(
            request_id=self.request_id,
            prompt=self.prompt,
            prompt_token_ids=self.prompt_token_ids,
            outputs=[self._completion(seq) for seq in self.seqs],
            finished=self.finished,
            num_cached_tokens=first.num_cached_tokens,
            metrics=RequestMetrics(
                arrival_time=first.arrival_time,
                first_scheduled_time=first.first_scheduled_time,
                first_token_time=first.first_token_time,
                last_token_time=max((s.last_token_time or 0.0) for s in self.seqs) or None,
                finished_time=self.finished_time,
                num_preemptions=sum(seq.num_preemptions for seq in self.seqs),
            ),
        )

    def _completion(self, seq: Sequence) -> CompletionOutput:
        text = self.texts[seq.index]
        output_ids = seq.output_token_ids
        logprobs = list(text.logprobs) if self.params.logprobs is not None else None
        delta_ids = output_ids[text.tokens_reported :]
        text.tokens_reported = len(output_ids)
        return CompletionOutput(
            index=seq.index,
            text=text.detokenizer.output_text,
            token_ids=output_ids,
            finish_reason=seq.finish_reason,
            stop_reason=seq.stop_reason,
            cumulative_logprob=sum(lp.logprob for lp in logprobs) if logprobs else None,
            logprobs=logprobs,
            delta_text=text.detokenizer.get_delta(finished=seq.is_finished),
            delta_token_ids=delta_ids,
        )
