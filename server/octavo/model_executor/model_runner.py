"""Runs one scheduled step: flat model inputs, the forward pass, and sampling.

The runner sees only the scheduler's plain data (``SchedulerOutput``): token ids, block
ids and positions. Between steps it keeps, per sequence, what sampling needs (the token
history for penalties, the sampling settings, the seeded random generator) and forgets
it when the scheduler reports the sequence finished. Only sequences whose chunk reaches
their last token are projected through the LM head and sampled; a sequence that forks
(``n > 1``) lends its logits row to its new siblings. A prompt chunk that covers image
placeholders takes those images' features in place of their embeddings: computed once
per image by the vision tower and kept in the encoder cache (``image_embeds.py``).

A step is all or nothing for the runner's own state: sampled tokens are added to the
histories only after the whole batch was sampled, so a failed step can be run again.

Under tensor parallelism only the driver (tensor rank 0 of the last stage) keeps
sampling state and samples; the other ranks compute their shards and return nothing.
Under pipeline parallelism the step runs as micro-batches (``micro_batches.py``): a
stage receives each one's activations from the previous stage and sends its own on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from octavo.distributed.parallel_state import PipelineStage
from octavo.distributed.pipeline_comm import (
    IntermediateTensors,
    receive_from_previous_stage,
    send_to_next_stage,
)
from octavo.kv_cache.cache_tensors import copy_blocks
from octavo.kv_cache.offload_tensors import HostTier
from octavo.kv_cache.state_tensors import copy_states, has_state_caches
from octavo.lora_request import LoRARequest
from octavo.model_executor.block_table_rows import BlockTableRows
from octavo.model_executor.decode_graphs import DecodeGraphs
from octavo.model_executor.encoder_inputs import token_types, whole_prompt_spans
from octavo.model_executor.graph_metrics import FULL, NONE, PIECEWISE, GraphMetricsLog
from octavo.model_executor.group_tables import add_group_tables
from octavo.model_executor.image_embeds import EncoderCache, needed_slices, step_image_embeds
from octavo.model_executor.image_spans import bidirectional_spans
from octavo.model_executor.layers.lora import LoRABatch, LoRAState
from octavo.model_executor.micro_batches import split_micro_batches
from octavo.model_executor.models.causal_lm import StepResult
from octavo.model_executor.mrope_positions import MRopePositions, supports_mrope
from octavo.model_executor.paged_model import PagedModel
from octavo.model_executor.pending_step import PendingStep
from octavo.model_executor.piecewise_graphs import PiecewiseGraphs
from octavo.model_executor.pooling_rows import Partial, PoolingAccumulator, plan_pooling
from octavo.model_executor.proposer import Proposer
from octavo.model_executor.step_inputs import (
    StepInputs,
    StepLayout,
    add_state_slots,
    lay_out,
    step_inputs,
)
from octavo.model_executor.vision.batching import on_device
from octavo.multimodal.inputs import ImageInput
from octavo.outputs import ModelRunnerOutput
from octavo.pooling.params import PoolingParams
from octavo.sampling.host_lists import device_tensor
from octavo.sampling.logprobs import logprob_entries
from octavo.sampling.random_draws import generator_for
from octavo.sampling.sampler import Sampler, SamplingRow
from octavo.sampling.spec_verifier import Proposal, verify_proposals
from octavo.sampling.token_logprobs import TokenLogprobs
from octavo.scheduler.output import (
    IN_FLIGHT_TOKEN,
    NewSequenceData,
    ScheduledSequence,
    SchedulerOutput,
)
from octavo.structured_output.manager import PendingGrammar, StructuredOutputManager

CPU = torch.device("cpu")


@dataclass
class SequenceState:
    """What the runner remembers of one sequence between steps."""

    row: SamplingRow  # prompt ids, generated ids, settings and generator
    grammar: PendingGrammar | None = None  # structured output, compiled in the background

    @classmethod
    def create(
        cls,
        data: NewSequenceData,
        eos_token_ids: frozenset[int],
        structured: StructuredOutputManager | None = None,
        device: torch.device = CPU,
    ) -> SequenceState:
        """The sequence's state; its seeded generator lives where its logits will."""
        generator = None
        if data.seed is not None:
            generator = generator_for(data.seed, device)
        row = SamplingRow(
            params=data.params,
            prompt_token_ids=list(data.prompt_token_ids),
            output_token_ids=list(data.output_token_ids),
            generator=generator,
            eos_token_ids=eos_token_ids,
        )
        constraint = data.params.structured_outputs
        if constraint is None or structured is None:
            return cls(row)
        return cls(row, structured.start(constraint, data.output_token_ids))


@dataclass
class PromptScoring:
    """Prompt positions whose next (prompt) token a request wants the logprob of."""

    seq_id: int
    first_position: int
    next_tokens: list[int]  # the prompt token after each position
    num_top: int


class AdapterSlotSource(Protocol):
    """Where LoRA adapters live in the model (``lora.slots.AdapterSlots``)."""

    state: LoRAState

    def slot_of(self, request: LoRARequest, in_use: set[int]) -> int: ...
    def forget(self, lora_int_ids: list[int]) -> None: ...


class ModelRunner:
    def __init__(
        self,
        paged: PagedModel,
        eos_token_ids: frozenset[int] = frozenset(),
        stage: PipelineStage | None = None,
        is_driver: bool = True,
        structured: StructuredOutputManager | None = None,
        proposer: Proposer | None = None,
        loras: AdapterSlotSource | None = None,
    ) -> None:
        self.paged = paged
        self.model, self.kv_caches, self.block_size = paged.model, paged.kv_caches, paged.block_size
        self.attention, self.device = paged.attention, paged.device
        self.eos_token_ids = eos_token_ids
        self.stage, self.is_driver = stage or PipelineStage(), is_driver
        self.structured = structured
        self.proposer = proposer  # speculative decoding: next steps' proposed tokens
        self.loras = loras  # LoRA: which slot holds each adapter
        self.lora_of: dict[int, LoRARequest] = {}  # every rank: each sequence's adapter
        self.sampler = Sampler()
        self.states: dict[int, SequenceState] = {}
        self.block_tables = BlockTableRows()  # every rank: each sequence's table as a row
        self.scoring: dict[int, tuple[list[int], int]] = {}  # prompt_logprobs: (prompt, top)
        self.pooling_of: dict[int, PoolingParams] = {}  # every rank: pooling sequences
        # the driver's partial pooled states; a classifier's head turns each into logits
        self.pooling = PoolingAccumulator(head=getattr(self.model, "pooling_head", None))
        self.is_encoder = getattr(self.model, "is_encoder", False)
        self._pending_pool: dict[int, Partial] = {}
        self.graphs: DecodeGraphs | None = None  # captured decode steps (the worker's)
        self.piecewise: PiecewiseGraphs | None = None  # the other steps, cut at attention
        self.graph_metrics: GraphMetricsLog | None = None  # --cudagraph-metrics (the worker's)
        self.in_flight: PendingStep | None = None  # async scheduling: the launched step
        self.offload: HostTier | None = None  # the KV offload tier's host blocks (the worker's)
        self.images_of: dict[int, list[ImageInput]] = {}  # every rank: a prompt's images
        self.encoder_cache = EncoderCache()  # image features by content hash
        # Gemma 3: an image's placeholders attend to each other both ways
        self.bidirectional_images = getattr(self.model, "bidirectional_images", False)
        # M-RoPE models (Qwen-VL): each prompt's 3-D positions; None for every other model
        self.mrope = MRopePositions(self.model) if supports_mrope(self.model) else None
        self.has_state = has_state_caches(self.kv_caches)  # state layers: slots in the meta

    @torch.inference_mode()
    def execute_model(self, step: SchedulerOutput) -> ModelRunnerOutput:
        """Run one step; returns the next token of every sequence that samples."""
        self._update_states(step)
        if self.offload is not None:  # the KV offload tier's saves and loads
            self.offload.apply(self.kv_caches, step.tier_copies)
        copy_blocks(self.kv_caches, step.block_copies)
        copy_states(self.kv_caches, step.state_copies)
        if step.is_empty:
            return ModelRunnerOutput()
        self._pending_pool = {}
        if self.stage.size > 1:
            output = self._execute_pipelined(step)
        else:
            inputs = self.prepare(step.scheduled, len(step.prefills))
            output = self._outputs(self._forward(inputs), inputs).output()
        self._remember(output)
        output.draft_token_ids = self._propose(step, output)
        return output

    @torch.inference_mode()
    def execute_model_overlapped(self, step: SchedulerOutput) -> ModelRunnerOutput:
        """Async scheduling: launch ``step`` and return the output of the step launched
        before it (empty for the first). The scheduler planned ``step`` before that output
        was known, so a decode whose last token is still in flight carries
        ``IN_FLIGHT_TOKEN``: its input is taken from the previous step's sampled ids on the
        device. The previous tokens join the histories before this step samples, so
        penalties, ``min_tokens`` and grammars see them as in a sequential run."""
        self._update_states(step)
        if self.offload is not None:  # the KV offload tier's saves and loads
            self.offload.apply(self.kv_caches, step.tier_copies)
        copy_blocks(self.kv_caches, step.block_copies)
        copy_states(self.kv_caches, step.state_copies)
        launched = None
        if not step.is_empty:
            inputs = self.prepare(step.scheduled, len(step.prefills))
            self._take_in_flight_tokens(step, inputs)
            launched = self._forward(inputs)
        output = self.finish_in_flight()
        if launched is not None:
            self._pending_pool = {}
            self.in_flight = self._outputs(launched, inputs)
        return output

    def finish_in_flight(self) -> ModelRunnerOutput:
        """The launched step's output on the host, its tokens added to the histories."""
        pending, self.in_flight = self.in_flight, None
        if pending is None:
            return ModelRunnerOutput()
        output = pending.output()
        self._remember(output)
        return output

    def _take_in_flight_tokens(self, step: SchedulerOutput, inputs: StepInputs) -> None:
        """Each ``IN_FLIGHT_TOKEN`` input becomes the token the previous step sampled for
        its sequence, copied on the device (no round trip through the host)."""
        places, sources, offset = [], [], 0
        row_of = self.in_flight.row_of if self.in_flight is not None else {}
        for scheduled in step.scheduled:  # the order lay_out puts tokens in
            if scheduled.token_ids[:1] == [IN_FLIGHT_TOKEN]:
                if scheduled.seq_id not in row_of:
                    raise RuntimeError(f"sequence {scheduled.seq_id} has no token in flight")
                places.append(offset)
                sources.append(row_of[scheduled.seq_id])
            offset += len(scheduled.token_ids)
        if places:
            assert self.in_flight is not None and self.in_flight.device_token_ids is not None
            tokens = self.in_flight.device_token_ids
            source = device_tensor(sources, torch.long, tokens.device)
            inputs.input_ids[device_tensor(places, torch.long, tokens.device)] = tokens[source]

    def _forward(self, inputs: StepInputs, intermediate: IntermediateTensors | None = None):
        if self.loras is not None:
            self.loras.state.batch = inputs.lora
        mode, size = self._replay_for(inputs, intermediate)
        if self.graph_metrics is not None:
            self.graph_metrics.observe(inputs.input_ids.shape[0], size, mode)
        if mode == FULL:
            return self.graphs.run(inputs, size)
        if mode == PIECEWISE:
            return self.piecewise.run(inputs, size)
        return self.paged.run(inputs, intermediate)

    def _replay_for(
        self, inputs: StepInputs, intermediate: IntermediateTensors | None
    ) -> tuple[str, int | None]:
        """How a step runs (``graph_metrics``' modes) and the capture size it is padded to:
        a decode step replays the graph of its padded size (recorded now at its first
        use), any other step the pieces around eager attention, else it runs eagerly."""
        if intermediate is not None:
            return NONE, None
        if self.graphs is not None:
            size = self.graphs.size_for(inputs)
            if size is not None and self.graphs.ready(size):
                return FULL, size
        if self.piecewise is not None:
            size = self.piecewise.size_for(inputs)
            if size is not None:
                return PIECEWISE, size
        return NONE, None

    def _outputs(self, result: StepResult, inputs: StepInputs) -> PendingStep:
        """Sampled tokens, and the vectors of the pooling sequences this step finished."""
        step = self._sample(result.logits, inputs)
        if self.is_driver and inputs.pooling:
            vectors, pending = self.pooling.step(result.pooled_hidden, inputs.pooling)
            step.known.pooled = vectors
            self._pending_pool.update(pending)
        return step

    def _execute_pipelined(self, step: SchedulerOutput) -> ModelRunnerOutput:
        """Each micro-batch: take the previous stage's activations, run this stage's layers,
        send them on without waiting (or sample, on the last stage)."""
        output, sends = ModelRunnerOutput(), []
        batches = split_micro_batches(step.scheduled, len(step.prefills), self.stage.size)
        for index, batch in enumerate(batches):
            inputs = self.prepare(batch.scheduled, batch.num_prefills)
            received = None
            if not self.stage.is_first:
                received = receive_from_previous_stage(
                    inputs.input_ids.shape[0],
                    self.model.config.hidden_size,
                    self.paged.activation_dtype,
                    self.device,
                    self.stage,
                    index,
                )
            result = self._forward(inputs, received)
            if isinstance(result, IntermediateTensors):
                sends += send_to_next_stage(result, self.stage, index)
            else:
                output.extend(self._outputs(result, inputs).output())
        for work in sends:
            work.wait()
        return output

    def _update_states(self, step: SchedulerOutput) -> None:
        if self.loras is not None and step.unloaded_lora_ids:  # every rank, same step
            self.loras.forget(step.unloaded_lora_ids)
        for seq_id in step.finished_seq_ids:  # every rank: the LM head's rows must agree
            self.scoring.pop(seq_id, None)
            self.lora_of.pop(seq_id, None)
            self.pooling_of.pop(seq_id, None)
            self.images_of.pop(seq_id, None)
        if self.mrope is not None:
            self.mrope.forget(step.finished_seq_ids)
        self.pooling.forget(step.finished_seq_ids + step.preempted_seq_ids)
        self.block_tables.forget(step.finished_seq_ids + step.preempted_seq_ids)
        for data in step.new_sequences:
            if data.lora_request is not None:
                self.lora_of[data.seq_id] = data.lora_request
            if data.images:
                self.images_of[data.seq_id] = data.images
            if self.mrope is not None:
                self.mrope.add(data)
        for data in step.new_sequences:
            if data.params.pooling is not None:
                self.pooling_of[data.seq_id] = data.params.pooling
            if data.params.prompt_logprobs is not None:
                self.scoring[data.seq_id] = (
                    list(data.prompt_token_ids),
                    data.params.prompt_logprobs,
                )
        if not self.is_driver:
            return
        if self.proposer is not None:
            self.proposer.forget(step.finished_seq_ids + step.preempted_seq_ids)
        for seq_id in step.finished_seq_ids:
            self.states.pop(seq_id, None)
        for data in step.new_sequences:
            self.states[data.seq_id] = SequenceState.create(
                data, self.eos_token_ids, self.structured, self.device
            )

    def _sample(self, logits: torch.Tensor | None, inputs: StepInputs) -> PendingStep:
        if logits is None or not self.is_driver:  # a rank that does not sample
            return PendingStep()
        sampled = inputs.sampled
        num_rows = sum(1 + scheduled.num_spec_tokens for scheduled in sampled)
        scored_logits, logits = logits[num_rows:], logits[:num_rows]
        step = self._sample_rows(logits, sampled)
        step.known.prompt_logprobs = score_prompts(scored_logits, inputs.scored)
        return step

    def _sample_rows(self, logits: torch.Tensor, sampled: list[ScheduledSequence]) -> PendingStep:
        """One token per plain sequence (and its forks); 1..k+1 per speculating one."""
        plain_rows, proposals, first_row = [], [], 0
        for scheduled in sampled:
            if scheduled.is_speculative:
                tokens = scheduled.token_ids[-scheduled.num_spec_tokens :]
                row = self._sampling_row(scheduled.seq_id)
                proposals.append(Proposal(scheduled.seq_id, row, tokens, first_row))
            else:
                plain_rows.append((first_row, scheduled))
            first_row += 1 + scheduled.num_spec_tokens
        step = self._sample_plain(logits, plain_rows)
        for verified in verify_proposals(logits, proposals) if proposals else []:
            count = len(verified.token_ids)
            step.known.extend(
                ModelRunnerOutput([verified.seq_id] * count, verified.token_ids, verified.logprobs)
            )
        return step

    def _sample_plain(
        self, logits: torch.Tensor, plain_rows: list[tuple[int, ScheduledSequence]]
    ) -> PendingStep:
        if not plain_rows:
            return PendingStep()
        rows, seq_ids = [], []
        for row, scheduled in plain_rows:
            for seq_id in [scheduled.seq_id, *scheduled.fork_seq_ids]:
                rows.append(row)
                seq_ids.append(seq_id)
        if rows != list(range(logits.shape[0])):
            logits = logits[torch.tensor(rows, dtype=torch.long, device=logits.device)]
        pending = self.sampler.launch(logits, [self._sampling_row(i) for i in seq_ids])
        return PendingStep(seq_ids, pending)

    def _sampling_row(self, seq_id: int) -> SamplingRow:
        """The sequence's row, with its grammar state once its compile is done."""
        state = self.states[seq_id]
        if state.grammar is not None and state.row.grammar is None:
            state.row.grammar = state.grammar.state()  # waits for a compile still running
        return state.row

    def _propose(self, step: SchedulerOutput, output: ModelRunnerOutput) -> dict[int, list[int]]:
        """The next step's proposals for the sequences that got tokens (not constrained ones:
        their grammar would have to follow the proposals)."""
        if self.proposer is None:  # (a draft model also follows steps that sample nothing)
            return {}
        seq_ids = [i for i in dict.fromkeys(output.seq_ids) if self.states[i].grammar is None]
        return self.proposer.propose_step(step, seq_ids, self._history)

    def _history(self, seq_id: int) -> list[int]:
        row = self.states[seq_id].row
        return row.prompt_token_ids + row.output_token_ids

    def _remember(self, output: ModelRunnerOutput) -> None:
        """Add the sampled tokens to the histories (and grammars), once the whole step has
        succeeded."""
        self.pooling.commit(self._pending_pool, list(output.pooled))
        for seq_id, token in zip(output.seq_ids, output.sampled_token_ids, strict=True):
            state = self.states.get(seq_id)
            if state is None:  # finished (aborted, stopped) while its token was in flight
                continue
            row = state.row
            row.output_token_ids.append(token)
            if row.grammar is not None:
                row.grammar.accept(token)

    def prepare(self, scheduled: list[ScheduledSequence], num_prefills: int) -> StepInputs:
        layout = lay_out(scheduled, self.block_size, set(self.pooling_of))
        scored = self._prompt_scoring(scheduled, layout)
        tables = self.block_tables.gather(layout.table_seq_ids, layout.tables)
        inputs = step_inputs(layout, num_prefills, self.device, scored, tables)
        inputs.lora = self._lora_batch(scheduled, layout)
        if self.has_state:
            add_state_slots(inputs.meta, scheduled, self.device)
        if self.mrope is not None:
            flat = self.mrope.step_positions(scheduled, layout.seq_starts, layout.positions)
            inputs.positions = flat.to(self.device)
        if self.bidirectional_images and self.images_of:  # every stage's attention
            spans = bidirectional_spans(scheduled, num_prefills, self.images_of)
            inputs.meta.bidirectional_spans = spans
        if self.is_encoder:  # each prompt whole in its step, attending both ways
            inputs.meta.bidirectional_spans = whole_prompt_spans(scheduled[:num_prefills])
            inputs.meta.encoder_only = num_prefills == len(scheduled)
            inputs.token_type_ids = token_types(
                scheduled, layout.seq_starts, self.pooling_of, self.device
            )
        if self.images_of and self.stage.is_first:
            needed = needed_slices(scheduled, layout.seq_starts, self.images_of)
            inputs.image_embeds = step_image_embeds(
                needed, self.encoder_cache, self._encode_images, self.device
            )
        if self.is_driver and self.pooling_of:
            inputs.pooling, rows = plan_pooling(scheduled, layout.seq_starts, self.pooling_of)
            inputs.pooled_indices = torch.tensor(rows, dtype=torch.long, device=self.device)
        if self.paged.layer_groups is not None:  # KV cache groups: a table each
            groups = self.paged.layer_groups
            add_group_tables(inputs.meta, scheduled, groups, self.block_size, self.device)
        return inputs

    def _encode_images(self, images: list[ImageInput]) -> list[torch.Tensor]:
        """The vision tower and projector on images (``embed_images``): their features."""
        dtype = self.paged.activation_dtype
        return self.model.embed_images([on_device(i.data, self.device, dtype) for i in images])

    def _lora_batch(self, scheduled, layout: StepLayout) -> LoRABatch | None:
        """The rows of each adapter in the step (loading adapters into slots as needed)."""
        if self.loras is None:
            return None
        rows: dict[int, list[int]] = {}
        for first, seq in zip(layout.seq_starts, scheduled, strict=True):
            request = self.lora_of.get(seq.seq_id)
            if request is not None:
                slot = self.loras.slot_of(request, set(rows))
                rows.setdefault(slot, []).extend(range(first, first + seq.num_new_tokens))
        return LoRABatch(
            [(slot, torch.tensor(ids, device=self.device)) for slot, ids in rows.items()]
        )

    def _prompt_scoring(self, scheduled, layout: StepLayout) -> list[PromptScoring]:
        """Rows (appended to the layout's logits rows) of the prompt positions to score."""
        scored = []
        for first, seq in zip(layout.seq_starts, scheduled, strict=True):
            if seq.seq_id not in self.scoring:
                continue
            prompt, wanted = self.scoring[seq.seq_id]
            start = seq.num_computed_tokens
            end = min(start + seq.num_new_tokens, len(prompt) - 1)
            if end <= start:
                continue
            layout.logits_rows.extend(range(first, first + end - start))
            scored.append(PromptScoring(seq.seq_id, start, prompt[start + 1 : end + 1], wanted))
        return scored


def score_prompts(
    logits: torch.Tensor, scored: list[PromptScoring]
) -> dict[int, tuple[int, list[TokenLogprobs]]]:
    """Each scored sequence's prompt-token logprobs (raw logits, as for sampled tokens)."""
    if not scored:
        return {}
    chosen = [token for item in scored for token in item.next_tokens]
    num_top = [item.num_top for item in scored for _ in item.next_tokens]
    entries = logprob_entries(logits, chosen, num_top)
    result, offset = {}, 0
    for item in scored:
        count = len(item.next_tokens)
        result[item.seq_id] = (item.first_position, entries[offset : offset + count])
        offset += count
    return result
