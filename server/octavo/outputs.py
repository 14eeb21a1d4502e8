"""What the engine hands back for each request: texts, tokens, logprobs and timings."""

from __future__ import annotations

from dataclasses import dataclass, field

from octavo.sampling.token_logprobs import TokenLogprobs


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # "stop", "length", "abort", "error"; None while running
    stop_reason: int | str | None = None
    cumulative_logprob: float | None = None
    logprobs: list[TokenLogprobs] | None = None
    delta_text: str = ""  # text added since this request's previous output (streaming)
    delta_token_ids: list[int] = field(default_factory=list)
    num_tokens: int = 0  # tokens generated so far (also when ``token_ids`` is only a delta)
    delta_logprobs: list[TokenLogprobs] | None = None  # set by the server's accumulator

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class ModelRunnerOutput:
    """What one step of the model runner returns: the next token of each sampled sequence.

    A sequence that verified proposals appears once per kept token, in order.
    ``draft_token_ids`` are the next step's proposals for sequences that have some.
    """

    seq_ids: list[int] = field(default_factory=list)
    sampled_token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprobs | None] = field(default_factory=list)
    # seq_id -> (position of the first entry, one entry per prompt position scored)
    prompt_logprobs: dict[int, tuple[int, list[TokenLogprobs]]] = field(default_factory=dict)
    draft_token_ids: dict[int, list[int]] = field(default_factory=dict)
    pooled: dict[int, list[float]] = field(default_factory=dict)  # pooling sequences done

    def extend(self, other: ModelRunnerOutput) -> None:
        self.seq_ids += other.seq_ids
        self.sampled_token_ids += other.sampled_token_ids
        self.logprobs += other.logprobs
        self.prompt_logprobs.update(other.prompt_logprobs)
        self.draft_token_ids.update(other.draft_token_ids)
        self.pooled.update(other.pooled)


@dataclass
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None
    num_preemptions: int = 0


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int
    metrics: RequestMetrics
    error: str | None = None  # set when the engine failed this request (finish_reason "error")
    num_prompt_tokens: int = 0  # also when ``prompt_token_ids`` is left out of a delta
    # with ``prompt_logprobs``: None for the first prompt token, then one entry per token
    prompt_logprobs: list[TokenLogprobs | None] | None = None
    pooled: list[float] | None = None  # a pooling request's vector (embedding), when finished
    # a prefill for a remote decode: where its blocks wait (vLLM's NixlConnector answer)
    kv_transfer_params: dict | None = None


@dataclass
class EmbeddingOutput:
    embedding: list[float]


@dataclass
class EmbeddingRequestOutput:
    """What ``LLM.embed`` returns per prompt (vLLM's shape: ``outputs.embedding``)."""

    request_id: str
    prompt_token_ids: list[int]
    outputs: EmbeddingOutput
    finished: bool = True

    @classmethod
    def of(cls, output: RequestOutput) -> EmbeddingRequestOutput:
        if output.pooled is None:
            raise ValueError(f"request {output.request_id} produced no embedding")
        return cls(output.request_id, output.prompt_token_ids, EmbeddingOutput(output.pooled))


@dataclass
class ScoringOutput:
    score: float


@dataclass
class ScoringRequestOutput:
    """What ``LLM.score`` returns per pair (vLLM's shape: ``outputs.score``)."""

    request_id: str
    prompt_token_ids: list[int]  # the pair's prompt (a bi-encoder's: the second text's)
    outputs: ScoringOutput
    finished: bool = True


@dataclass
class ClassificationOutput:
    probs: list[float]

    @property
    def num_classes(self) -> int:
        return len(self.probs)


@dataclass
class ClassificationRequestOutput:
    """What ``LLM.classify`` returns per prompt (vLLM's shape: ``outputs.probs``)."""

    request_id: str
    prompt_token_ids: list[int]
    outputs: ClassificationOutput
    finished: bool = True
