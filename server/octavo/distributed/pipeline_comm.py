"""Handing activations from one pipeline stage to the next (point-to-point, same tensor rank).

A stage sends the hidden states and the residual stream of each micro-batch without
waiting (``isend``), so it can start the next micro-batch while the transfer runs; the
next stage receives into tensors of the shape it already knows from the step's plan.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from octavo.distributed.comm_timer import timed
from octavo.distributed.parallel_state import PipelineStage


@dataclass
class IntermediateTensors:
    """What crosses a stage boundary: the hidden states and the residual, ``[T, hidden]``."""

    hidden: torch.Tensor
    residual: torch.Tensor


def send_to_next_stage(
    tensors: IntermediateTensors, stage: PipelineStage, micro_batch: int
) -> list[dist.Work]:
    peer = stage.peer(stage.stage + 1)
    return [
        dist.isend(tensor.contiguous(), peer, tag=2 * micro_batch + i)
        for i, tensor in enumerate((tensors.hidden, tensors.residual))
    ]


def receive_from_previous_stage(
    num_tokens: int, hidden_size: int, dtype, device, stage: PipelineStage, micro_batch: int
) -> IntermediateTensors:
    peer = stage.peer(stage.stage - 1)
    pieces = [torch.empty(num_tokens, hidden_size, dtype=dtype, device=device) for _ in range(2)]
    with timed("pipeline_receive"):  # includes waiting for the previous stage's compute
        for i, tensor in enumerate(pieces):
            dist.recv(tensor, peer, tag=2 * micro_batch + i)
    return IntermediateTensors(*pieces)
