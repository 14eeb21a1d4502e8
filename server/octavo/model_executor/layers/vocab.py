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
from octavo.model_executor.layers.quantization.blocks import dequantize
from octavo.model_executor.layers.quantization.quantized_tensor import (
    QuantizedTensor,
    QuantizedWeight,
)


class VocabParallelEmbedding(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__()
        self.tp = tensor_parallel_group()
        self.vocab_start, vocab_end = self.tp.shard(vocab_size, "vocabulary size")
        self.weight = self._create_weight(vocab_end - self.vocab_start, hidden_size)

    def _create_weight(self, rows: int, hidden_size: int):
        return nn.Parameter(torch.empty(rows, hidden_size), requires_grad=False)

    def lookup(self, token_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(token_ids, self.weight)

    def weight_loader(self, param: torch.Tensor, loaded: torch.Tensor, name: str) -> None:
        copy_checked(param, loaded.narrow(0, self.vocab_start, param.shape[0]), name)

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return self.lookup(token_ids)
        local = token_ids - self.vocab_start
        outside = (local < 0) | (local >= self.weight.shape[0])
        embedded = self.lookup(local.masked_fill(outside, 0))
        return self.tp.all_reduce(embedded.masked_fill_(outside.unsqueeze(-1), 0))


class QuantizedVocabEmbedding(VocabParallelEmbedding):
    """The embedding of a GGUF file kept in its blocks (e.g. Q8_0): a lookup dequantizes
    only the rows it reads. The quantized LM head loads the same checkpoint matrix, so
    both hold one storage. A float (F32/F16/BF16) embedding is looked up as it is."""

    def _create_weight(self, rows: int, hidden_size: int):
        self.register_buffer("device_anchor", torch.empty(0), persistent=False)  # follows .to()
        self.blocks: QuantizedTensor | None = None
        return QuantizedWeight(rows, hidden_size)

    def process_weights_after_loading(self) -> None:
        (segment,) = self.weight.finish(self.device_anchor.device)
        if isinstance(segment.weight, QuantizedTensor):
            self.blocks = segment.weight
            self.register_buffer("embedding_blocks", self.blocks.blocks, persistent=False)
        else:
            self.register_buffer("embedding_rows", segment.weight, persistent=False)
        self.weight = QuantizedWeight(*self.weight.shape)  # only its shape is read from now on

    def lookup(self, token_ids: torch.Tensor) -> torch.Tensor:
        if self.blocks is None:
            return F.embedding(token_ids, self.embedding_rows).to(self.device_anchor.dtype)
        rows = self.embedding_blocks.index_select(0, token_ids.reshape(-1))
        values = dequantize(rows, self.blocks.kind).to(self.device_anchor.dtype)
        return values.reshape(*token_ids.shape, -1)


class ParallelLMHead(ColumnParallelLinear):
    """Hidden states → logits over the whole vocabulary (this rank's slice, gathered)."""

    def __init__(self, vocab_size: int, hidden_size: int, method=None) -> None:
        super().__init__(hidden_size, vocab_size, bias=False, method=method)

    def tie_to(self, embedding: VocabParallelEmbedding) -> None:
        self.weight = embedding.weight  # same rows: both are split by vocabulary

    def forward(self, x: torch.Tensor) -> torch.Tensor | None:
        return self.tp.gather_last_dim(super().forward(x))
