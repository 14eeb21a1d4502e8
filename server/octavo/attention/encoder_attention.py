"""An encoder step's attention in one call: every chunk of the step is a whole prompt that
attends both ways (``AttentionMetadata.encoder_only``), so the chunks are padded into one
``[prompts, heads, longest, head_dim]`` batch and attend in one masked
``scaled_dot_product_attention`` instead of one call per prompt (a rerank step holds
hundreds of short pairs). Nothing is stored in the KV cache: no later step reads an
encoder's keys. ModernBERT's local layers (a window both ways) are masked here too."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from octavo.attention.options import AttentionOptions


def handles(options: AttentionOptions) -> bool:
    """The options this path applies (soft-caps, sinks and attention chunks take the loop)."""
    return options.soft_cap is None and options.sinks is None and options.chunk_size is None


def encoder_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    lengths: list[int],
    scale: float,
    options: AttentionOptions,
) -> torch.Tensor:
    """``query [T, heads, dim]`` of prompts of ``lengths`` laid end to end → ``[T, heads, dim]``."""
    device, longest = query.device, max(lengths)
    sizes = torch.tensor(lengths, device=device)
    starts = torch.cumsum(sizes, 0) - sizes
    offsets = torch.arange(longest, device=device)
    valid = offsets[None, :] < sizes[:, None]  # [prompts, longest]
    rows = (starts[:, None] + offsets[None, :]).clamp(max=query.shape[0] - 1)
    q, k, v = (x[rows].transpose(1, 2) for x in (query, key, value))  # [B, heads, L, dim]
    visible = valid[:, None, None, :]
    if options.sliding_window is not None:
        distance = (offsets[:, None] - offsets[None, :]).abs()
        visible = visible & (distance < options.sliding_window)[None, None]
    out = F.scaled_dot_product_attention(
        q, k.to(q.dtype), v.to(q.dtype), attn_mask=visible, scale=scale, enable_gqa=True
    )
    return out.transpose(1, 2)[valid]
