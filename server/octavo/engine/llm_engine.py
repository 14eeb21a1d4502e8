"""The engine: accepts requests, runs scheduled steps, and reports per-request outputs."""

from __future__ import annotations

import time

import torch

from octavo.config import EngineArgs
from octavo.engine.builder import build_engine_parts
from octavo.engine.detokenizer import IncrementalDetokenizer
from octavo.engine.isolation import describe, retry_alone
from octavo.engine.request import Request, SequenceText
from octavo.engine.stats import EngineStats
from octavo.engine.stop_checker import check_stop
from octavo.outputs import RequestOutput
from octavo.sampling.sampler import Sampler, SampleResult, SamplingRow, TokenLogprobs
from octavo.sampling_params import SamplingParams
from octavo.scheduler.scheduler import ScheduledChunk, SchedulerOutput
from octavo.scheduler.sequence import Sequence


class LLMEngine:
    def __init__(self, args: EngineArgs) -> None:
        parts = build_engine_parts(args)
        self.args, self.parts = args, parts
        self.tokenizer = parts.tokenizer
        self.scheduler, self.runner = parts.scheduler, parts.runner
        self.kv = parts.scheduler.kv
        self.max_model_len = parts.max_model_len
        self.model_name = parts.model_name
        self.sampler = Sampler()
        self.vocab_size = parts.config.vocab_size
        self.eos_token_ids = frozenset(i for i in self._eos_token_ids() if i < self.vocab_size)
        self.requests: dict[str, Request] = {}
        self._seq_ids = iter(range(1 << 62))
        self._pending_outputs: list[RequestOutput] = []
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0

    def _eos_token_ids(self) -> set[int]:
        ids = set(self.parts.config.eos_token_ids)
        if self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        return ids

    # ----- requests in -------------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams,
        arrival_time: float | None = None,
    ) -> None:
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        token_ids = self._tokenize(prompt)
        self._validate_prompt(token_ids)
        self._validate_params(params)
        text = prompt if isinstance(prompt, str) else None
        request = Request(request_id, text, token_ids, params)
        first = self._new_sequence(request, 0, token_ids)
        if arrival_time is not None:
            first.arrival_time = arrival_time
        self.requests[request_id] = request
        self.scheduler.add(first)

    def _tokenize(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("prompt must not be empty")
            return self.tokenizer.encode(prompt)
        if not prompt:
            raise ValueError("prompt must not be empty")
        return list(prompt)

    def _validate_prompt(self, token_ids: list[int]) -> None:
        vocab = self.vocab_size
        if any(not 0 <= token < vocab for token in token_ids):
            raise ValueError(f"prompt token ids must be in [0, {vocab})")
        if len(token_ids) >= self.max_model_len:
            raise ValueError(
                f"prompt has {len(token_ids)} tokens but max_model_len is {self.max_model_len}, "
                "leaving no room to generate"
            )

    def _validate_params(self, params: SamplingParams) -> None:
        """Check what ``SamplingParams`` cannot know alone: token ids against the vocabulary."""
        outside = [token for token in params.stop_token_ids if token >= self.vocab_size]
        if outside:
            raise ValueError(
                f"stop_token_ids must be in [0, {self.vocab_size}) for this model, got {outside}"
            )

    def _new_sequence(self, request: Request, index: int, token_ids: list[int]) -> Sequence:
        params = request.params
        generator = None
        if params.seed is not None:
            generator = torch.Generator().manual_seed((params.seed + index * 0x9E3779B1) % 2**63)
        seq = Sequence(
            seq_id=next(self._seq_ids),
            request_id=request.request_id,
            index=index,
            token_ids=list(token_ids),
            num_prompt_tokens=len(request.prompt_token_ids),
            params=params,
            generator=generator,
        )
        detokenizer = IncrementalDetokenizer(self.tokenizer, request.prompt_token_ids, params)
        request.seqs.append(seq)
        request.texts[index] = SequenceText(detokenizer)
        return seq

    def abort_request(self, request_id: str) -> None:
        """Stop a request wherever it is; its blocks are freed at once."""
        self._end_request(request_id, "abort")

    def _fail_request(self, request_id: str, error: str) -> None:
        """End a request that made its step fail; the engine goes on with the others."""
        self._end_request(request_id, "error", error)

    def _end_request(self, request_id: str, reason: str, error: str | None = None) -> None:
        request = self.requests.pop(request_id, None)
        if request is None:
            return
        for seq in request.seqs:
            if not seq.is_finished:
                seq.finish_reason = reason
                self.scheduler.finish(seq)
        while request.awaiting_fork:  # children never started: report them ended too
            child = self._new_sequence(request, len(request.seqs), request.prompt_token_ids)
            child.finish_reason = reason
            self.scheduler.finish(child)
        output = request.make_output()
        output.error = error
        self._pending_outputs.append(output)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    # ----- one step ----------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one scheduled step. A request whose data makes the step fail is failed alone."""
        scheduled = self.scheduler.schedule()
        touched: list[Request] = []
        if not scheduled.is_empty:
            now = time.monotonic()
            scheduled, logits, sampled = self._execute(scheduled)
            self._advance(scheduled, now)
            touched = self._sample_and_append(logits, sampled)
        outputs, self._pending_outputs = self._pending_outputs, []
        live = [request for request in touched if request.request_id in self.requests]
        return outputs + [self._output_for(request) for request in live]

    def _execute(
        self, scheduled: SchedulerOutput
    ) -> tuple[SchedulerOutput, torch.Tensor, list[Sequence]]:
        """The forward pass; on failure, each request runs alone and the culprits fail."""
        try:
            logits, sampled = self.runner.execute(scheduled)
        except Exception as error:  # isolated below, or raised again
            return self._execute_alone(scheduled, error)
        return scheduled, logits, sampled

    def _execute_alone(
        self, scheduled: SchedulerOutput, error: Exception
    ) -> tuple[SchedulerOutput, torch.Tensor, list[Sequence]]:
        def run_alone(request_id: str) -> tuple[torch.Tensor, list[Sequence]]:
            return self.runner.execute(_only_request(scheduled, request_id))

        ids = [chunk.seq.request_id for chunk in scheduled.chunks]
        outcome = retry_alone(error, ids, run_alone)
        for request_id, message in outcome.failures.items():
            self._fail_request(request_id, message)
        survivors = SchedulerOutput(
            prefills=[c for c in scheduled.prefills if c.seq.request_id in outcome.results],
            decodes=[c for c in scheduled.decodes if c.seq.request_id in outcome.results],
        )
        results = list(outcome.results.values())
        sampled = [seq for _, seqs in results for seq in seqs]
        width = self.vocab_size
        logits = torch.cat([logits for logits, _ in results]) if results else torch.empty(0, width)
        return survivors, logits, sampled

    def _advance(self, scheduled: SchedulerOutput, now: float) -> None:
        for chunk in scheduled.chunks:
            seq = chunk.seq
            if seq.first_scheduled_time is None:
                seq.first_scheduled_time = now
            seq.num_computed_tokens += chunk.num_new_tokens
            self.kv.cache_full_blocks(seq.seq_id, seq.token_ids, seq.num_computed_tokens)

    def _sample_and_append(self, logits: torch.Tensor, sampled: list[Sequence]) -> list[Request]:
        rows, seqs = self._expand_forks(sampled)
        if not seqs:
            return []
        if len(rows) != logits.shape[0] or rows != list(range(len(rows))):
            logits = logits[torch.tensor(rows, dtype=torch.long)]
        token_ids, logprobs = self._sample(logits, seqs)
        touched: dict[str, Request] = {}
        for seq, token, logprob in zip(seqs, token_ids, logprobs, strict=True):
            request = self.requests.get(seq.request_id)
            if request is None:  # failed while sampling
                continue
            try:
                self._append_token(seq, token, logprob)
            except Exception as error:  # detokenizing/stopping one request
                self._fail_request(seq.request_id, describe(error))
                continue
            touched[seq.request_id] = request
        return list(touched.values())

    def _sample(
        self, logits: torch.Tensor, seqs: list[Sequence]
    ) -> tuple[list[int], list[TokenLogprobs | None]]:
        """One token per sequence; on failure, each request samples alone and culprits fail."""
        rows = [self._sampling_row(seq) for seq in seqs]
        try:
            result = self.sampler(logits, rows)
        except Exception as error:  # isolated below, or raised again
            return self._sample_alone(logits, seqs, rows, error)
        return result.token_ids, result.logprobs

    def _sample_alone(
        self, logits: torch.Tensor, seqs: list[Sequence], rows: list[SamplingRow], error: Exception
    ) -> tuple[list[int], list[TokenLogprobs | None]]:
        by_request: dict[str, list[int]] = {}
        for i, seq in enumerate(seqs):
            by_request.setdefault(seq.request_id, []).append(i)

        def sample_alone(request_id: str) -> SampleResult:
            index = by_request[request_id]
            return self.sampler(logits[torch.tensor(index)], [rows[i] for i in index])

        outcome = retry_alone(error, by_request, sample_alone)
        for request_id, message in outcome.failures.items():
            self._fail_request(request_id, message)
        token_ids: list[int] = [-1] * len(seqs)  # -1: the row's request failed
        logprobs: list[TokenLogprobs | None] = [None] * len(seqs)
        for request_id, result in outcome.results.items():
            for i, token, logprob in zip(
                by_request[request_id], result.token_ids, result.logprobs, strict=True
            ):
                token_ids[i], logprobs[i] = token, logprob
        return token_ids, logprobs

    def _expand_forks(self, sampled: list[Sequence]) -> tuple[list[int], list[Sequence]]:
        """Sequences whose request asked for n > 1 fork here, once their prompt is computed."""
        rows, seqs = [], []
        for row, seq in enumerate(sampled):
            rows.append(row)
            seqs.append(seq)
            request = self.requests[seq.request_id]
            while request.awaiting_fork:
                child = self._new_sequence(request, len(request.seqs), seq.token_ids)
                child.num_computed_tokens = seq.num_computed_tokens
                child.arrival_time = seq.arrival_time
                child.first_scheduled_time = seq.first_scheduled_time
                self.kv.fork(seq.seq_id, child.seq_id)
                self.scheduler.add_running(child)
                rows.append(row)
                seqs.append(child)
        return rows, seqs

    def _sampling_row(self, seq: Sequence) -> SamplingRow:
        return SamplingRow(
            params=seq.params,
            prompt_token_ids=seq.prompt_token_ids,
            output_token_ids=seq.output_token_ids,
            generator=seq.generator,
            eos_token_ids=self.eos_token_ids,
        )

    def _append_token(self, seq: Sequence, token: int, logprob: TokenLogprobs | None) -> None:
        now = time.monotonic()
        if seq.num_output_tokens == 0:
            seq.first_token_time = now
            self.prompt_tokens_total += seq.num_prompt_tokens if seq.index == 0 else 0
        seq.last_token_time = now
        seq.token_ids.append(token)
        self.generation_tokens_total += 1
        text = self.requests[seq.request_id].texts[seq.index]
        if logprob is not None:
            text.logprobs.append(logprob)
        stop_string = text.detokenizer.update(token)
        check_stop(seq, token, stop_string, self.eos_token_ids, self.max_model_len)
        if seq.finish_reason is not None:
            self.scheduler.finish(seq)

    def _output_for(self, request: Request) -> RequestOutput:
        output = request.make_output()
        if output.finished:
            self.requests.pop(request.request_id, None)
        return output

    # ----- statistics --------------------------------------------------------------------
    def stats(self) -> EngineStats:
        pool, counters = self.parts.pool, self.scheduler.counters
        used_blocks = pool.num_usable_blocks - pool.num_free_blocks
        return EngineStats(
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            kv_cache_usage=pool.usage(),
            kv_cache_tokens_held=sum(s.num_computed_tokens for s in self.scheduler.running),
            kv_cache_slots_allocated=used_blocks * self.kv.block_size,
            num_blocks=len(pool.blocks),
            prefix_cache_queries=counters.queries,
            prefix_cache_hits=counters.hits,
            num_preemptions=counters.preemptions,
            prompt_tokens=self.prompt_tokens_total,
            generation_tokens=self.generation_tokens_total,
        )


def _only_request(scheduled: SchedulerOutput, request_id: str) -> SchedulerOutput:
    """The chunks of one request (block copies were already made by the failed step)."""

    def mine(chunks: list[ScheduledChunk]) -> list[ScheduledChunk]:
        return [chunk for chunk in chunks if chunk.seq.request_id == request_id]

    return SchedulerOutput(prefills=mine(scheduled.prefills), decodes=mine(scheduled.decodes))
