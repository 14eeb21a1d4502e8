"""The token embedding and the LM head, split across tensor-parallel ranks by vocabulary
rows: each rank embeds the ids it holds (zeros elsewhere, then an all-reduce) and
projects onto its slice of the vocabulary (the logits gathered side by side on tensor
rank 0, the one that samples)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from octavo.distributed.parallel_state import tensor_parallel_group
from octavo.model_executor.layers.linear import ColumnParallelLinear, copy_checked


class VocabParallelEmbedding(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__()
        self.tp = tensor_parallel_group()
        self.vocab_start, vocab_end = self.tp.shard(vocab_size, "vocabulary size")
        self.weight = nn.Parameter(
            torch.empty(vocab_end - self.vocab_start, hidden_size), requires_grad=False
        )

    def weight_loader(self, param: torch.Tensor, loaded: torch.Tensor, name: str) -> None:
        copy_checked(param, loaded.narrow(0, self.vocab_start, param.shape[0]), name)

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return F.embedding(token_ids, self.weight)
        local = token_ids - self.vocab_start
        outside = (local < 0) | (local >= self.weight.shape[0])
        embedded = F.embedding(local.masked_fill(outside, 0), self.weight)
        return self.tp.all_reduce(embedded.masked_fill_(outside.unsqueeze(-1), 0))


class ParallelLMHead(ColumnParallelLinear):
    """Hidden states → logits over the whole vocabulary (this rank's slice, gathered)."""

    def __init__(self, vocab_size: int, hidden_size: int, method=None) -> None:
        super().__init__(hidden_size, vocab_size, bias=False, method=method)

    def tie_to(self, embedding: VocabParallelEmbedding) -> None:
        self.weight = embedding.weight  # same rows: both are split by vocabulary

    def forward(self, x: torch.Tensor) -> torch.Tensor | None:
        return self.tp.gather_last_dim(super().forward(x))
