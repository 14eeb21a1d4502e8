"""What one layer's attention does beyond plain causal softmax attention.

Architectures differ per layer: a sliding window (Mistral, Gemma 2/3, gpt-oss, Phi-3),
logit soft-capping (Gemma 2), attention sinks (gpt-oss), chunked local attention (Llama 4).
Every backend (torch, native CPU, Triton) takes the same ``AttentionOptions``; the torch
path is the reference.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, eq=False)
class AttentionOptions:
    # Key ``j`` is visible to the query at position ``i`` iff ``i - sliding_window < j <= i``
    # (transformers' ``sliding_window_overlay``): the query sees itself and the
    # ``sliding_window - 1`` positions before it.
    sliding_window: int | None = None
    # Scores (after the softmax scale, before the mask) become ``cap * tanh(score / cap)``.
    soft_cap: float | None = None
    # ``[num_heads]`` float32, this rank's query heads: one extra logit per head that joins
    # the softmax's denominator and attends to nothing (gpt-oss's learned sinks).
    sinks: torch.Tensor | None = None
    # Chunked local attention (Llama 4's ``attention_chunk_size`` on its rope layers): the
    # query at position ``p`` sees only keys in ``[floor(p / chunk) * chunk, p]``. The KV
    # blocks before a sequence's current chunk are not freed yet (they stay allocated until
    # the sequence ends; a hybrid cache manager's chunked group will free them).
    chunk_size: int | None = None
    # A window both ways (ModernBERT's local attention, bidirectional spans only): the
    # window also bounds later keys, ``j < i + sliding_window``: ``|i - j| < sliding_window``.
    window_both_ways: bool = False

    @property
    def is_plain(self) -> bool:
        return self.sliding_window is None and self.is_causal_window_at_most

    @property
    def is_causal_window_at_most(self) -> bool:
        """Plain causal attention or a causal sliding window, nothing else (no soft-cap,
        sinks, chunks, nor a window both ways)."""
        return (
            self.soft_cap is None
            and self.sinks is None
            and self.chunk_size is None
            and not self.window_both_ways
        )


FULL_ATTENTION = AttentionOptions()
