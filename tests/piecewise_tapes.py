"""A ``SegmentRecorder`` for CPU tests of ``piecewise_graphs``: each piece a CPU tape.

The engine cuts steps into pieces on a GPU only (CUDA graphs); on CPU a mixed step's kernels
outweigh its host overhead. These tapes let the CPU suite run the same cutting, holes and
replays through the engine's real steps.
"""

from __future__ import annotations

import torch

from octavo.model_executor.cpu_graphs import TapeMode
from octavo.model_executor.piecewise_graphs import Segment


class TapeSegments:
    """Each piece a CPU tape (``cpu_graphs.TapeMode``): its op calls, replayed on the tensors
    they were recorded on (no shared arena: each size keeps its own activations)."""

    name = "piecewise CPU graphs"

    def __init__(self) -> None:
        self.mode: TapeMode | None = None

    def begin(self) -> None:
        self.mode = TapeMode()
        self.mode.__enter__()

    def end(self) -> Segment:
        mode, self.mode = self.mode, None
        assert mode is not None, "end() follows begin()"
        mode.__exit__(None, None, None)
        steps = tuple(mode.steps)

        def replay() -> None:
            for step in steps:
                step.run()

        return replay

    def recording(self):
        return torch.inference_mode()
