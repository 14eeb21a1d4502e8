"""The engine: accepts requests, runs scheduled steps, and reports per-request outputs.

One step is the scheduler/executor protocol: ``Scheduler.schedule()`` → plain-data
``SchedulerOutput`` → ``Executor.execute_model()`` (forward pass and sampling) →
``Scheduler.update_from_output()`` (advance, cache blocks, append, finish). The engine
adds what only it knows: requests and their ``n`` completions, text (detokenizing and
stop strings), timing and totals, and outputs for the caller.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from octavo.config import EngineArgs
from octavo.engine.adapters import EngineAdapters
from octavo.engine.builder import build_engine_parts
from octavo.engine.detokenizer import IncrementalDetokenizer
from octavo.engine.isolation import CANARY_SEQ_ID, canary_step, describe, retry_alone
from octavo.engine.request import Request, SequenceText
from octavo.engine.stats import EngineStats
from octavo.engine.stats_log import StatsLog
from octavo.engine.token_deltas import TokenDelta, sends_token_deltas
from octavo.inputs.token_range import check_prompt_token_ids, prompt_token_limit
from octavo.kv_events.events import KVEventBatch
from octavo.kv_events.publisher import start_publisher
from octavo.kv_transfer.connector import build_connector
from octavo.kv_transfer.params import wants_transfer
from octavo.lora_request import LoRARequest, StartupAdapters
from octavo.model_executor.models.registry import takes_images
from octavo.multimodal.media_fetch import media_connector
from octavo.multimodal.processor import ProcessedPrompt, image_list, processor_for
from octavo.outputs import ModelRunnerOutput, RequestOutput
from octavo.pooling.params import PoolingParams
from octavo.sampling_params import SamplingParams
from octavo.scheduler.output import SchedulerOutput
from octavo.scheduler.scheduler import SequenceUpdate
from octavo.scheduler.sequence import Sequence, SequenceStatus
from octavo.scheduler.spec_decode_counters import SpecDecodeCounters, SpecDecodeLog
from octavo.scheduler.stop_checker import apply_stop_string
from octavo.structured_output.manager import shared_compiler

logger = logging.getLogger(__name__)

TRANSFER_WAIT_SECONDS = 0.01  # a step with only KV fetches in flight waits this long for one


class LLMEngine:
    def __init__(self, args: EngineArgs) -> None:
        self.kv_events = start_publisher(args.kv_events_config)  # its sockets first: fail fast
        try:
            parts = build_engine_parts(args)
        except BaseException:
            self.kv_events.shutdown()
            raise
        self.args, self.parts = args, parts
        self.tokenizer = parts.tokenizer
        self.scheduler, self.executor = parts.scheduler, parts.executor
        self.kv = parts.scheduler.kv
        self.max_model_len = parts.max_model_len
        self.model_name = parts.model_name
        self.vocab_size = parts.config.vocab_size
        self.prompt_token_limit = prompt_token_limit(self.vocab_size, len(self.tokenizer))
        self.requests: dict[str, Request] = {}
        # The server's core loop sets it: outputs its requests allow go as ``TokenDelta``
        # tuples (``token_deltas.py``: the API process rebuilds them)
        self.token_deltas = False
        self._pending_outputs: list[RequestOutput] = []
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.spec_log = SpecDecodeLog()
        self.stats_log = StatsLog("GPU" if parts.device.type == "cuda" else "CPU")
        self._launched: tuple[SchedulerOutput, float] | None = None  # async: the step in flight
        self.adapters = EngineAdapters(
            args.enable_lora, parts.config, args.max_lora_rank, self.scheduler
        )
        self.startup_adapters: StartupAdapters = self.adapters.load_modules(args.lora_modules or [])
        architecture = parts.config.architecture
        self.mm_processor = processor_for(
            parts.folder,
            architecture,
            takes_images(architecture),
            args.limit_mm_per_prompt,
            args.mm_processor_kwargs,
        )
        self.media = media_connector(args)  # where image URLs may lead (http(s), file)
        try:
            self.kv_transfer = build_connector(args, parts)  # P/D disaggregation, or None
        except BaseException:  # a cache that cannot be moved, a side channel port taken
            self.shutdown()
            raise

    # ----- requests in -------------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt: str | list[int] | ProcessedPrompt,
        params: SamplingParams | PoolingParams,
        arrival_time: float | None = None,
        lora_request: LoRARequest | None = None,
    ) -> None:
        """Queue a request: ``SamplingParams`` generate, ``PoolingParams`` (or sampling
        params made by ``SamplingParams.for_pooling``) return one vector of the prompt. A
        prompt with images comes from ``process_multimodal``."""
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        params = self.parts.runner.check_params(params)
        if isinstance(prompt, ProcessedPrompt):
            text, token_ids, images = prompt.text, prompt.token_ids, prompt.images
        else:
            text = prompt if isinstance(prompt, str) else None
            token_ids, images = self._tokenize(prompt), []
            self._check_no_placeholders(token_ids)
        self._validate_prompt(token_ids, params.pooling is not None)
        self.scheduler.check_images(images)
        self._validate_params(params)
        self._check_transfer(params, len(token_ids))
        self._check_adapter(lora_request)
        request = Request(
            request_id,
            text,
            token_ids,
            params,
            lora_request=lora_request,
            images=images,
            token_deltas=self.token_deltas and sends_token_deltas(params),
        )
        first = self._new_sequence(request, 0, token_ids)
        if self.kv_transfer is not None:
            self.kv_transfer.track(first)
        if arrival_time is not None:
            first.arrival_time = arrival_time
        self.requests[request_id] = request
        self.scheduler.add(first)

    def process_multimodal(
        self, prompt: str | list[int], multi_modal_data: Any, add_special_tokens: bool = True
    ) -> ProcessedPrompt:
        """A prompt and its ``multi_modal_data`` (``{"image": image | [images]}``) through
        the model's HF processor: expanded token ids and each image's placeholders.
        ValueError for a text-only model, a token-id prompt, too many images or an image
        that does not decode."""
        if self.mm_processor is None:
            raise ValueError(
                f"{self.parts.config.architecture} is a text-only model: it takes no "
                "multi_modal_data (images)"
            )
        if not isinstance(prompt, str):
            raise ValueError(
                "a prompt with images must be text (the processor places each image's tokens)"
            )
        images = image_list(multi_modal_data)
        return self.mm_processor.process(prompt, images, add_special_tokens)

    def _check_no_placeholders(self, token_ids: list[int]) -> None:
        """A prompt without images may not hold the image placeholder token."""
        if self.mm_processor is not None and self.mm_processor.image_token_id in token_ids:
            raise ValueError(
                f"the prompt holds the image placeholder {self.mm_processor.image_token} "
                "but no image: send the images in multi_modal_data"
            )

    def _tokenize(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("prompt must not be empty")
            return self.tokenizer.encode(prompt)
        if not prompt:
            raise ValueError("prompt must not be empty")
        return list(prompt)

    def _validate_prompt(self, token_ids: list[int], pooling: bool = False) -> None:
        check_prompt_token_ids(token_ids, self.prompt_token_limit)
        if pooling and len(token_ids) > self.max_model_len:
            raise ValueError(
                f"input has {len(token_ids)} tokens but max_model_len is {self.max_model_len}"
            )
        if not pooling and len(token_ids) >= self.max_model_len:
            raise ValueError(
                f"prompt has {len(token_ids)} tokens but max_model_len is {self.max_model_len}, "
                "leaving no room to generate"
            )

    def _validate_params(self, params: SamplingParams) -> None:
        """Check what ``SamplingParams`` cannot know alone: token ids against the vocabulary,
        ``n`` against ``max_num_seqs``, logprobs against ``--max-logprobs``."""
        self.scheduler.check_fits(params)
        params.check_max_logprobs(self.args.max_logprobs)
        outside = [token for token in params.stop_token_ids if token >= self.vocab_size]
        if outside:
            raise ValueError(
                f"stop_token_ids must be in [0, {self.vocab_size}) for this model, got {outside}"
            )

    def _check_transfer(self, params: SamplingParams, num_prompt_tokens: int) -> None:
        """``kv_transfer_params`` need ``--kv-transfer-config`` and a request it can serve."""
        if self.kv_transfer is not None:
            self.kv_transfer.check_request(params, num_prompt_tokens)
        elif wants_transfer(params):
            raise ValueError(
                "kv_transfer_params ask for a KV transfer, but this server was started "
                "without --kv-transfer-config"
            )

    def _check_adapter(self, lora_request: LoRARequest | None) -> None:
        if lora_request is not None:
            self.adapters.add(lora_request)

    # ----- LoRA adapters (vLLM's names) ----------------------------------------------------
    def add_lora(self, lora_request: LoRARequest) -> bool:
        """Check and register an adapter; ValueError naming what is wrong with it."""
        self.adapters.add(lora_request)
        return True

    def remove_lora(self, lora_int_id: int) -> bool:
        """Forget an adapter (running requests finish with it); False if unknown."""
        return self.adapters.remove(lora_int_id)

    def list_loras(self) -> set[int]:
        return set(self.adapters.known)

    def _new_sequence(self, request: Request, index: int, token_ids: list[int]) -> Sequence:
        seq = Sequence(
            seq_id=self.scheduler.next_seq_id(),
            request_id=request.request_id,
            index=index,
            token_ids=list(token_ids),
            num_prompt_tokens=len(request.prompt_token_ids),
            params=request.params,
            lora_request=request.lora_request,
            images=request.images,
        )
        self._track(request, seq)
        return seq

    def _track(self, request: Request, seq: Sequence) -> None:
        """Give a request's new completion its text stream."""
        detokenizer = IncrementalDetokenizer(self.tokenizer, request.prompt_token_ids, seq.params)
        request.seqs.append(seq)
        request.texts[seq.index] = SequenceText(detokenizer)

    def abort_request(self, request_id: str) -> None:
        """Stop a request wherever it is; its blocks are freed at once (also those still
        held for a remote decode)."""
        self._end_request(request_id, "abort")
        if self.kv_transfer is not None:
            self.kv_transfer.release(request_id)

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
        while request.awaiting_fork:  # completions never forked: report them ended too
            child = self._new_sequence(request, len(request.seqs), request.prompt_token_ids)
            child.finish_reason, child.status = reason, SequenceStatus.FINISHED
        output = request.make_output()
        output.error = error
        self._pending_outputs.append(output)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    # ----- one step ----------------------------------------------------------------------
    def step(self) -> list[RequestOutput | TokenDelta]:
        """Run one scheduled step. A request whose data makes the step fail is failed alone
        (with ``--async-scheduling``, the requests of the steps in flight). Outputs are
        ``RequestOutput``s; with ``token_deltas`` set, some are ``TokenDelta`` tuples."""
        if self.kv_transfer is not None:
            self._transfer_work()
        if self.scheduler.overlapped:
            return self._step_overlapped()
        scheduled = self.scheduler.schedule()
        now = time.monotonic()
        scheduled, result = self._execute(scheduled)
        return self._finish_step(scheduled, result, now)

    def _transfer_work(self) -> None:
        """P/D disaggregation's work between steps (``KVConnector.on_step``); a step with
        nothing else to run waits briefly for a fetch instead of spinning."""
        connector, scheduler = self.kv_transfer, self.scheduler
        if scheduler.waiting_for_remote and not (scheduler.running or scheduler.waiting):
            connector.wait_for_work(TRANSFER_WAIT_SECONDS)
        for request_id, error in connector.on_step():
            self._fail_request(request_id, error)

    def transfers_busy(self) -> bool:
        """Does an idle engine still serve KV transfers (the core loop then polls)?"""
        return self.kv_transfer is not None and self.kv_transfer.busy

    def serve_transfers(self) -> tuple[list[RequestOutput], bool]:
        """An idle engine's KV transfer work (side channel reads and frees, expiries): the
        outputs it left, and whether held leases changed (fresh stats to report)."""
        before = self.kv_transfer.progress()
        self._transfer_work()
        outputs, self._pending_outputs = self._pending_outputs, []
        return outputs, self.kv_transfer.progress() != before

    def _step_overlapped(self) -> list[RequestOutput | TokenDelta]:
        """Launch the next step, then finish the previous one (its tokens, text and
        outputs) while the device runs the one just launched."""
        scheduled = self.scheduler.schedule()
        launched, self._launched = self._launched, None
        nothing = (SchedulerOutput(), ModelRunnerOutput(), time.monotonic())
        try:
            result = self.executor.execute_model_overlapped(scheduled)
        except Exception as error:  # which of the two steps failed is not known
            in_flight = [scheduled] if launched is None else [launched[0], scheduled]
            self._fail_in_flight(in_flight, error)
            return self._finish_step(*nothing)
        if not scheduled.is_empty:
            self._launched = (scheduled, time.monotonic())
        if launched is None:
            return self._finish_step(*nothing)
        return self._finish_step(launched[0], result, launched[1])

    def _fail_in_flight(self, steps: list[SchedulerOutput], error: Exception) -> None:
        """A failed overlapped step: every request with a sequence in flight fails."""
        logger.exception("an overlapped step failed: its requests fail")
        self._launched = None
        self.executor.discard_in_flight()
        for step in steps:
            for seq_id in {s.seq_id for s in step.scheduled}:
                seq = self.scheduler.seqs.get(seq_id)
                if seq is not None:
                    self._fail_request(seq.request_id, describe(error))

    def _finish_step(
        self, scheduled: SchedulerOutput, result: ModelRunnerOutput, now: float
    ) -> list[RequestOutput | TokenDelta]:
        """A step's tokens into the scheduler, text and outputs."""
        pooled = self._record_pooled(result)
        updates = self.scheduler.update_from_output(scheduled, result, now)
        touched = pooled + self._record_all(updates)
        if not self.args.disable_log_stats:
            if self.args.speculative_config is not None:
                self.spec_log.maybe_log(self.scheduler.spec_counters)
            self.stats_log.maybe_log(self.stats)
        self._publish_kv_events()
        outputs, self._pending_outputs = self._pending_outputs, []
        interval, requests = self.args.stream_interval, self.requests
        live = [r for r in touched if r.request_id in requests and r.wants_output_now(interval)]
        return outputs + [self._output_for(request) for request in live]

    def _publish_kv_events(self) -> None:
        """The KV cache events of this step (blocks stored and removed), as one batch."""
        events = self.parts.pool.take_events()
        if events:
            self.kv_events.publish(KVEventBatch(time.time(), events))

    def _execute(self, step: SchedulerOutput) -> tuple[SchedulerOutput, ModelRunnerOutput]:
        """The executor runs the step; on failure each request runs alone and culprits fail."""
        try:
            return step, self.executor.execute_model(step)
        except Exception as error:  # isolated below, or raised again
            return self._execute_alone(step, error)

    def _execute_alone(
        self, step: SchedulerOutput, error: Exception
    ) -> tuple[SchedulerOutput, ModelRunnerOutput]:
        owners = _owners(step, self.scheduler.seqs)

        def run_alone(request_id: str) -> ModelRunnerOutput:
            return self.executor.execute_model(_only_requests(step, owners, {request_id}))

        outcome = retry_alone(error, owners.values(), run_alone, self._canary_passes)
        for request_id, message in outcome.failures.items():
            self._fail_request(request_id, message)
        result = ModelRunnerOutput()
        for part in outcome.results.values():
            result.extend(part)
        return _only_requests(step, owners, set(outcome.results)), result

    def _canary_passes(self) -> bool:
        """Can the executor still run a step at all? One token, greedy, in the null block."""
        try:
            self.executor.execute_model(canary_step())
        except Exception:  # the engine itself is broken
            logger.exception("the canary step failed too: the engine is broken")
            return False
        finally:
            with contextlib.suppress(Exception):
                self.executor.execute_model(SchedulerOutput(finished_seq_ids=[CANARY_SEQ_ID]))
        return True

    def _record_all(self, updates: list[SequenceUpdate]) -> list[Request]:
        """Text, timing and totals for each new token; a failure here fails that request."""
        touched: dict[str, Request] = {}
        requests, now = self.requests, time.monotonic()  # one time for the step's tokens
        for update in updates:
            request = requests.get(update.seq.request_id)
            if request is None or update.num_tokens > len(update.seq.token_ids):
                continue  # failed earlier in this step, or a token after its stop string
            try:
                self._record(request, update, now)
            except Exception as error:  # detokenizing one request's tokens
                self._fail_request(request.request_id, describe(error))
                continue
            touched[request.request_id] = request
        return list(touched.values())

    def _record_pooled(self, result: ModelRunnerOutput) -> list[Request]:
        """Each pooling request's vector (read before the scheduler drops its sequence)."""
        done = []
        for seq_id, vector in result.pooled.items():
            seq = self.scheduler.seqs.get(seq_id)
            request = None if seq is None else self.requests.get(seq.request_id)
            if request is None:
                continue
            request.pooled = vector
            seq.first_token_time = seq.last_token_time = time.monotonic()
            self.prompt_tokens_total += seq.num_prompt_tokens
            done.append(request)
        return done

    def _record(self, request: Request, update: SequenceUpdate, now: float) -> None:
        seq = update.seq
        text = request.texts.get(seq.index)
        if text is None:  # a completion forked in this step
            self._track(request, seq)
            text = request.texts[seq.index]
        if seq.num_output_tokens == 1:
            seq.first_token_time = now
            self.prompt_tokens_total += seq.num_prompt_tokens if seq.index == 0 else 0
        seq.last_token_time = now
        self.generation_tokens_total += 1
        if update.logprobs is not None:
            text.add_logprobs(update.logprobs)
        if not text.detokenizer.every_step:  # deferred to its output (catch_up), or no text
            return
        stop_string = text.detokenizer.update(update.token_id)
        if stop_string is None:  # the common case: apply_stop_string would change nothing
            return
        if apply_stop_string(seq, stop_string, update.num_tokens) and not seq.is_finished:
            self.scheduler.finish(seq)

    def _output_for(self, request: Request) -> RequestOutput | TokenDelta:
        if request.wants_token_delta:
            return request.token_delta()
        output = request.make_output()
        if output.finished:
            self.requests.pop(request.request_id, None)
            if self.kv_transfer is not None:
                output.kv_transfer_params = self.kv_transfer.answer_for(request.request_id)
        return output

    def check_constraint(self, params: SamplingParams) -> None:
        """Compile ``params``' structured-output constraint now (``ValueError`` if invalid).
        The offline API calls this; the server compiles in its own process instead, and
        the runner finds the grammar cached or compiles it in the background."""
        if params.structured_outputs is None:
            return
        compiler = shared_compiler(
            self.parts.folder,
            lambda: self.tokenizer,
            self.vocab_size,
            self.scheduler.limits.eos_token_ids,
        )
        compiler.compile(params.structured_outputs)

    # ----- lifecycle -----------------------------------------------------------------------
    def check_health(self) -> None:
        """Raise if the executor lost a worker (the engine core then stops)."""
        self.executor.check_health()

    def on_worker_death(self, listener: Callable[[str], None]) -> None:
        """Call ``listener`` (on another thread) the moment a worker process dies."""
        self.executor.on_worker_death(listener)

    def shutdown(self) -> None:
        """Stop the executor's workers and the KV event publisher; no more steps."""
        try:
            if getattr(self, "kv_transfer", None) is not None:
                self.kv_transfer.close()
            self.executor.shutdown()
        finally:
            self.kv_events.shutdown()

    # ----- statistics --------------------------------------------------------------------
    def stats(self) -> EngineStats:
        pool, counters = self.parts.pool, self.scheduler.counters
        used_blocks = pool.num_usable_blocks - pool.num_free_blocks
        return EngineStats(
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting) + len(self.scheduler.waiting_for_remote),
            kv_cache_usage=pool.usage(),
            kv_cache_tokens_held=sum(
                self.kv.num_tokens_held(s.seq_id, s.num_computed_tokens)
                for s in self.scheduler.running
            ),
            kv_cache_slots_allocated=used_blocks * self.kv.block_size,
            num_blocks=len(pool.blocks),
            prefix_cache_queries=counters.queries,
            prefix_cache_hits=counters.hits,
            num_preemptions=counters.preemptions,
            prompt_tokens=self.prompt_tokens_total,
            generation_tokens=self.generation_tokens_total,
            spec_decode=self._spec_counters(),
            max_loras=self.args.max_loras if self.args.enable_lora else 0,
            running_loras=_adapter_names(self.scheduler.running),
            waiting_loras=_adapter_names(self.scheduler.waiting),
            kv_offload=None if pool.offload is None else pool.offload.counters.copy(),
            kv_transfer=None if self.kv_transfer is None else self.kv_transfer.stats(),
        )

    def _spec_counters(self) -> SpecDecodeCounters | None:
        if self.args.speculative_config is None:
            return None
        return self.scheduler.spec_counters.copy()  # the engine goes on counting


def _adapter_names(seqs: Iterable[Sequence]) -> tuple[str, ...]:
    return tuple(sorted({s.lora_request.lora_name for s in seqs if s.lora_request is not None}))


def _owners(step: SchedulerOutput, seqs: dict[int, Sequence]) -> dict[int, str]:
    """The request id of every sequence in a step, including the forks it plans."""
    owners = {}
    for scheduled in step.scheduled:
        request_id = seqs[scheduled.seq_id].request_id
        for seq_id in [scheduled.seq_id, *scheduled.fork_seq_ids]:
            owners[seq_id] = request_id
    return owners


def _only_requests(
    step: SchedulerOutput, owners: dict[int, str], wanted: set[str]
) -> SchedulerOutput:
    """The part of a step that belongs to ``wanted`` requests (copies are repeated: harmless)."""

    def keep(seq_id: int) -> bool:
        return owners.get(seq_id) in wanted

    return SchedulerOutput(
        prefills=[s for s in step.prefills if keep(s.seq_id)],
        decodes=[s for s in step.decodes if keep(s.seq_id)],
        new_sequences=[d for d in step.new_sequences if keep(d.seq_id)],
        block_copies=step.block_copies,
        unloaded_lora_ids=step.unloaded_lora_ids,
    )
