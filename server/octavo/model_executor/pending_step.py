"""A launched step whose sampled tokens may still be on the device (async scheduling).

The plain rows' tokens (``PendingSample``) reach the host when ``output()`` is asked
for; what the runner learnt synchronously (verified proposals, prompt logprobs, pooled
vectors) waits beside them in ``known``. ``row_of`` finds a sequence's token on the
device, where the next step's inputs take it (``IN_FLIGHT_TOKEN``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from octavo.outputs import ModelRunnerOutput
from octavo.sampling.pending import PendingSample


@dataclass
class PendingStep:
    seq_ids: list[int] = field(default_factory=list)  # the plain rows' sequences, forks too
    sample: PendingSample | None = None  # their tokens, maybe still on the device
    known: ModelRunnerOutput = field(default_factory=ModelRunnerOutput)

    @property
    def row_of(self) -> dict[int, int]:
        return {seq_id: row for row, seq_id in enumerate(self.seq_ids)}

    @property
    def device_token_ids(self) -> torch.Tensor | None:
        return None if self.sample is None else self.sample.token_ids

    def output(self) -> ModelRunnerOutput:
        """The step's output on the host (waits for the sampled ids' transfer only)."""
        output = ModelRunnerOutput()
        if self.sample is not None:
            result = self.sample.result()
            output = ModelRunnerOutput(list(self.seq_ids), result.token_ids, result.logprobs)
        output.extend(self.known)
        return output
