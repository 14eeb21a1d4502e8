"""LLaVA's projector from vision features to the decoder's width: ``linear_1 → act →
linear_2`` (LLaVA, LLaVA-NeXT, Pixtral-12B; Mistral 3's after its norm and patch merger)."""

from __future__ import annotations

import torch
from torch import nn

from octavo.model_executor.vision.activations import activation


class MultiModalProjector(nn.Module):
    def __init__(self, in_features: int, hidden: int, act: str, bias: bool) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(in_features, hidden, bias=bias)
        self.act = activation(act)
        self.linear_2 = nn.Linear(hidden, hidden, bias=bias)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.linear_2(self.act(self.linear_1(features)))
