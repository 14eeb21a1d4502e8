"""Turns a scheduled step into flat model inputs, runs the forward pass, returns logits.

Only sequences whose chunk reaches their last token need a next token, so only their
last positions are projected through the LM head.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from octavo.attention.backend import AttentionBackend
from octavo.attention.metadata import AttentionMetadata
from octavo.kv_cache.cache_tensors import copy_blocks
from octavo.kv_cache.kv_cache_manager import KVCacheManager
from octavo.model_executor.llama import LlamaForCausalLM
from octavo.scheduler.scheduler import ScheduledChunk, SchedulerOutput
from octavo.scheduler.sequence import Sequence


@dataclass
class StepInputs:
    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    logits_indices: torch.Tensor
    sampled_seqs: list[Sequence]  # one per logits row


class ModelRunner:
    def __init__(
        self,
        model: LlamaForCausalLM,
        kv_caches: list[torch.Tensor],
        kv: KVCacheManager,
        attention: AttentionBackend,
        device: torch.device,
    ) -> None:
        self.model, self.kv_caches, self.kv = model, kv_caches, kv
        self.attention, self.device = attention, device
        self.block_size = kv.block_size

    @torch.inference_mode()
    def execute(self, step: SchedulerOutput) -> tuple[torch.Tensor, list[Sequence]]:
        """Run one step; returns logits ``[num_sampled, vocab]`` (fp32) and their sequences."""
        copy_blocks(self.kv_caches, step.block_copies)
        inputs = self.prepare(step.chunks, len(step.prefills))
        logits = self.model(
            inputs.input_ids,
            inputs.positions,
            self.kv_caches,
            inputs.meta,
            self.attention,
            inputs.logits_indices,
        )
        return logits, inputs.sampled_seqs

    def prepare(self, chunks: list[ScheduledChunk], num_prefills: int) -> StepInputs:
        token_ids, positions, slots, starts = [], [], [], [0]
        tables, seq_lens, logits_rows, sampled = [], [], [], []
        for chunk in chunks:
            seq, start = chunk.seq, chunk.seq.num_computed_tokens
            end = start + chunk.num_new_tokens
            block_ids = self.kv.block_ids(seq.seq_id)
            token_ids.extend(seq.token_ids[start:end])
            positions.extend(range(start, end))
            slots.extend(self._slots(block_ids, start, end))
            starts.append(starts[-1] + chunk.num_new_tokens)
            tables.append(block_ids)
            seq_lens.append(end)
            if chunk.completes_sequence:
                logits_rows.append(starts[-1] - 1)
                sampled.append(seq)
        meta = self._metadata(slots, tables, seq_lens, starts, num_prefills)
        return StepInputs(
            input_ids=self._tensor(token_ids, torch.long),
            positions=self._tensor(positions, torch.long),
            meta=meta,
            logits_indices=self._tensor(logits_rows, torch.long),
            sampled_seqs=sampled,
        )

    def _slots(self, block_ids: list[int], start: int, end: int) -> list[int]:
        size = self.block_size
        return [block_ids[pos // size] * size + pos % size for pos in range(start, end)]

    def _metadata(self, slots, tables, seq_lens, starts, num_prefills) -> AttentionMetadata:
        width = max(len(table) for table in tables)
        padded = [table + [0] * (width - len(table)) for table in tables]
        query_lens = [b - a for a, b in itertools.pairwise(starts)]
        return AttentionMetadata(
            slot_mapping=self._tensor(slots, torch.long),
            block_tables=self._tensor(padded, torch.int32),
            seq_lens=self._tensor(seq_lens, torch.int32),
            query_start_loc=self._tensor(starts, torch.int32),
            num_prefills=num_prefills,
            num_prefill_tokens=starts[num_prefills],
            query_lens_list=query_lens,
            query_start_loc_list=starts[:-1],
            seq_lens_list=seq_lens,
            max_seq_len=max(seq_lens),
        )

    def _tensor(self, values: list, dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, device=self.device)
