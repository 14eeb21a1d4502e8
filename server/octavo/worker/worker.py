"""A worker owns one device's share of the model: the weights, the KV cache, the runner.

Today there is one worker, in the engine's process. With tensor parallelism there is
one per rank, each in its own process, built from the same ``WorkerConfig``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from octavo.attention.backend import select_backend
from octavo.kv_cache.cache_tensors import allocate_kv_caches
from octavo.model_executor.loader import load_model
from octavo.model_executor.model_config import ModelConfig
from octavo.model_executor.model_runner import ModelRunner
from octavo.outputs import ModelRunnerOutput
from octavo.scheduler.output import SchedulerOutput


@dataclass
class WorkerConfig:
    """Everything a worker needs to load its model; plain values, so it can be sent."""

    folder: Path
    config: ModelConfig
    dtype: torch.dtype
    device: torch.device
    max_positions: int  # rotary tables are built for this many positions
    block_size: int
    eos_token_ids: frozenset[int]
    seed: int = 0  # the global RNG's seed: requests without their own seed draw from it
    num_threads: int | None = None  # torch's intra-op threads; None leaves torch's default


class Worker:
    def __init__(self, spec: WorkerConfig) -> None:
        self.spec = spec
        torch.manual_seed(spec.seed)
        if spec.num_threads is not None:
            torch.set_num_threads(spec.num_threads)
        self.model = load_model(
            spec.folder, spec.config, spec.max_positions, spec.dtype, spec.device
        )
        self.runner: ModelRunner | None = None

    def initialize_cache(self, num_blocks: int) -> None:
        """Allocate the paged KV cache and get the runner ready to take steps."""
        spec = self.spec
        caches = allocate_kv_caches(
            spec.config, num_blocks, spec.block_size, spec.dtype, spec.device
        )
        self.runner = ModelRunner(
            self.model,
            caches,
            spec.block_size,
            select_backend(spec.device, spec.dtype),
            spec.device,
            spec.eos_token_ids,
        )

    def execute_model(self, step: SchedulerOutput) -> ModelRunnerOutput:
        assert self.runner is not None, "initialize_cache() comes before the first step"
        return self.runner.execute_model(step)
