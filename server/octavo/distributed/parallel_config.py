"""The parallel layout of one engine (tensor × pipeline ranks) and its checks against the
model and the machine, made before any worker starts so a bad layout fails with a clear
message instead of deep inside a worker."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from octavo.distributed.node_layout import RankGrid

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ParallelConfig(RankGrid):
    """The rank grid (hosts as ``node_layout`` spreads them) checked against a model."""

    def check(self, model, device: torch.device) -> None:
        """Raise ``ValueError`` naming what does not fit ``model`` (a ``ModelConfig``)."""
        problems = self.problems(model, device)
        if problems:
            raise ValueError(problems[0])

    def problems(self, model, device: torch.device) -> list[str]:
        tp, pp = self.tensor_parallel_size, self.pipeline_parallel_size
        found = [
            f"the model's {what} ({total}) cannot be split evenly over tensor_parallel_size {tp}"
            for what, total in (
                ("attention heads", model.num_heads),
                ("intermediate size", model.intermediate_size),
                ("vocabulary size", model.vocab_size),
            )
            if total % tp
        ]
        kv = model.num_kv_heads
        if kv % tp and tp % kv:
            found.append(
                f"the model's {kv} KV heads can be neither split over nor replicated on "
                f"tensor_parallel_size {tp}"
            )
        if model.num_layers < pp:
            found.append(
                f"the model's {model.num_layers} layers cannot be split over "
                f"pipeline_parallel_size {pp}"
            )
        found += self._device_problems(device)
        return found

    def _device_problems(self, device: torch.device) -> list[str]:
        """This host's GPUs against the ranks it runs (each host checks its own)."""
        local = self.local_world_size
        if device.type != "cuda" or self.world_size == 1:
            return []
        if device.index not in (None, 0):
            return [
                f"tensor/pipeline parallelism uses cuda:0..{local - 1}; choose the GPUs with "
                f"CUDA_VISIBLE_DEVICES instead of --device {device}"
            ]
        count = torch.cuda.device_count()
        if local <= count:
            return []
        ranks = f"tensor_parallel_size × pipeline_parallel_size = {self.world_size}"
        if self.nnodes == 1:
            return [f"{ranks} needs {local} GPUs, but {count} are visible"]
        return [
            f"{ranks} over {self.nnodes} nodes needs {local} GPUs on each node, but "
            f"{count} are visible here"
        ]
