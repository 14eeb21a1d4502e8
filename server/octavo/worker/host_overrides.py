"""What a worker host decides for itself in the ``WorkerConfig`` the leader sends.

The leader builds one ``WorkerConfig`` for every rank, but some of its fields only make
sense on the leader's host: where the model's files are (each host resolves, and if
need be downloads, the model itself), the tokenizer's folder, the device, and the CPU
threads per worker (this host's CPUs shared out among the ranks it runs). A worker host
replaces those with its own before building a worker. (A draft model never runs across
hosts: it needs tensor and pipeline parallel size 1.)
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from octavo.worker.worker import WorkerConfig


@dataclass(frozen=True)
class HostOverrides:
    folder: str  # this host's copy of the model
    device: str  # this host's device (each rank takes its local GPU)
    num_threads: int  # torch threads per worker on this host
    tokenizer: str | None = None  # --tokenizer as this host resolves it

    def apply(self, spec: WorkerConfig) -> WorkerConfig:
        return dataclasses.replace(
            spec,
            folder=Path(self.folder),
            device=torch.device(self.device),
            num_threads=self.num_threads,
            tokenizer=self.tokenizer,
        )

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> HostOverrides:
        return cls(**json.loads(text))
