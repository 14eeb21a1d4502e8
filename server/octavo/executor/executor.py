"""The seam between the engine core and the workers that run the model.

The engine core talks to an ``Executor`` only: it hands over each step's
``SchedulerOutput`` and gets the sampled tokens back. ``UniProcExecutor`` runs the one
worker in this process; a multi-process executor (one worker per tensor-parallel rank,
the driver sampling) plugs in here without changes above it.
"""

from __future__ import annotations

from typing import Protocol

from octavo.outputs import ModelRunnerOutput
from octavo.scheduler.output import SchedulerOutput
from octavo.worker.worker import Worker


class Executor(Protocol):
    def execute_model(self, step: SchedulerOutput) -> ModelRunnerOutput: ...

    def shutdown(self) -> None: ...


class UniProcExecutor:
    """One worker, called directly."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    def execute_model(self, step: SchedulerOutput) -> ModelRunnerOutput:
        return self.worker.execute_model(step)

    def shutdown(self) -> None:
        self.worker.runner = None
