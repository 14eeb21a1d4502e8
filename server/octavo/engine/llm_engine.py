"""The engine: accepts requests, runs scheduled steps, and reports per-request outputs."""

from __future__ import annotations

import time

import torch

from octavo.config import EngineArgs
from octavo.engine.builder import build_engine_parts
from octavo.engine.detokenizer import IncrementalDetokenizer
from octavo.engine.request import Request, SequenceText
from octavo.engine.stats import EngineStats
from octavo.engine.stop_checker import check_stop
from octavo.outputs import RequestOutput
from octavo.sampling.sampler import Sampler, SamplingRow, TokenLogprobs
from octavo.sampling_params import SamplingParams
from octavo.scheduler.scheduler import SchedulerOutput
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
        self.eos_token_ids = frozenset(self._eos_token_ids())
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
        vocab = self.parts.config.vocab_size
        if any(not 0 <= token < vocab for token in token_ids):
            raise ValueError(f"prompt token ids must be in [0, {vocab})")
        if len(token_ids) >= self.max_model_len:
            raise ValueError(
                f"prompt has {len(token_ids)} tokens but max_model_len is {self.max_model_len}, "
                "leaving no room to generate"
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
        request = self.requests.pop(request_id, None)
        if request is None:
            return
        for seq in request.seqs:
            if not seq.is_finished:
                seq.finish_reason = "abort"
                self.scheduler.finish(seq)
        while request.awaiting_fork:  # children never started: report them aborted too
            child = self._new_sequence(request, len(request.seqs), request.prompt_token_ids)
            child.finish_reason = "abort"
            self.scheduler.finish(child)
        self._pending_outputs.append(request.make_output())

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    # ----- one step ----------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        outputs, self._pending_outputs = self._pending_outputs, []
        scheduled = self.scheduler.schedule()
        if scheduled.is_empty:
            return outputs
        now = time.monotonic()
        logits, sampled = self.runner.execute(scheduled)
        self._advance(scheduled, now)
        touched = self._sample_and_append(logits, sampled)
        return outputs + [self._output_for(request) for request in touched]

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
            logits = logits[torch.tensor(rows)]
        result = self.sampler(logits, [self._sampling_row(seq) for seq in seqs])
        touched: dict[str, Request] = {}
        for seq, token, logprob in zip(seqs, result.token_ids, result.logprobs, strict=True):
            self._append_token(seq, token, logprob)
            touched[seq.request_id] = self.requests[seq.request_id]
        return list(touched.values())

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
