"""Pooling in the model runner: which rows of a step each pooling sequence needs, and
its vector once its prompt is done.

A prompt may be computed over several steps (chunked prefill): mean pooling keeps a
running sum of the final hidden states, CLS keeps the first row, last-token pooling
needs only the final chunk's last row. Partial state changes only when the step has
succeeded (``commit``), so a step that is run again pools the same rows once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from octavo.pooling.params import PoolingParams, PoolingType
from octavo.scheduler.output import ScheduledSequence


@dataclass
class PoolingChunk:
    """One pooling sequence's rows in a step's pooled hidden states."""

    seq_id: int
    params: PoolingParams
    first: int  # its first row in the step's pooled rows
    count: int
    final: bool  # this chunk ends the prompt: the vector is complete


def plan_pooling(
    scheduled: list[ScheduledSequence],
    seq_starts: list[int],
    pooling_of: dict[int, PoolingParams],
) -> tuple[list[PoolingChunk], list[int]]:
    """The chunks of the step's pooling sequences and the flat token rows they read."""
    chunks, rows = [], []
    for first, seq in zip(seq_starts, scheduled, strict=True):
        params = pooling_of.get(seq.seq_id)
        if params is None:
            continue
        wanted = _rows_of(params.pooling_type, seq, first)
        chunks.append(PoolingChunk(seq.seq_id, params, len(rows), len(wanted), seq.sample))
        rows.extend(wanted)
    return chunks, rows


def _rows_of(kind: PoolingType, seq: ScheduledSequence, first: int) -> list[int]:
    last = first + seq.num_new_tokens - 1
    if kind is PoolingType.LAST:
        return [last] if seq.sample else []
    if kind is PoolingType.CLS:
        return [first] if seq.num_computed_tokens == 0 else []
    return list(range(first, last + 1))


@dataclass
class Partial:
    """A mean-pooled sequence's running sum, or a CLS sequence's first row."""

    total: torch.Tensor
    count: int


@dataclass
class PoolingAccumulator:
    partials: dict[int, Partial] = field(default_factory=dict)
    # the model's head on a pooled vector (a classifier's: its logits); None: the vector
    head: Callable[[torch.Tensor], torch.Tensor] | None = None

    def step(
        self, hidden: torch.Tensor | None, chunks: list[PoolingChunk]
    ) -> tuple[dict[int, list[float]], dict[int, Partial]]:
        """(vectors of the sequences this step finished, partials to ``commit``)."""
        vectors, pending = {}, {}
        for chunk in chunks:
            rows = hidden[chunk.first : chunk.first + chunk.count].float()
            partial = self._add(self.partials.get(chunk.seq_id), rows)
            if chunk.final:
                vectors[chunk.seq_id] = finish_vector(partial, chunk.params, self.head)
            elif partial is not None:
                pending[chunk.seq_id] = partial
        return vectors, pending

    @staticmethod
    def _add(partial: Partial | None, rows: torch.Tensor) -> Partial | None:
        if rows.shape[0] == 0:
            return partial
        total = rows.sum(dim=0)
        if partial is None:
            return Partial(total, rows.shape[0])
        return Partial(partial.total + total, partial.count + rows.shape[0])

    def commit(self, pending: dict[int, Partial], finished: list[int]) -> None:
        self.partials.update(pending)
        self.forget(finished)

    def forget(self, seq_ids: list[int]) -> None:
        """Finished or preempted sequences (a preempted prompt is computed again)."""
        for seq_id in seq_ids:
            self.partials.pop(seq_id, None)


def finish_vector(
    partial: Partial | None, params: PoolingParams, head: Callable | None = None
) -> list[float]:
    """Mean (or the one row), through the model's ``head`` if it has one, the first
    ``dimensions`` values, then L2-normalised (as the params say)."""
    assert partial is not None, "a finished pooling sequence has pooled rows"
    vector = partial.total / partial.count
    if head is not None:
        vector = head(vector[None])[0].float()
    if params.dimensions is not None:
        vector = vector[: params.dimensions]
    if params.normalize:
        vector = F.normalize(vector, p=2, dim=-1)
    return vector.tolist()
