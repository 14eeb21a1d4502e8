"""What one forward step tells attention about where every token's keys and values live.

Tokens of a step are laid out flat: first the tokens of every prefill chunk (one
sequence after another), then one token for each decoding sequence.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] int64: cache slot of each new token, -1 = skip
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32, padded with 0 (null block)
    seq_lens: torch.Tensor  # [num_seqs] int32: context length including this step's tokens
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32: cumulative query lengths
    num_prefills: int  # sequences [0, num_prefills) are prefill chunks
    num_prefill_tokens: int
    query_lens_list: list[int]  # host copies for the torch path's per-sequence loop
    query_start_loc_list: list[int]
    seq_lens_list: list[int]
    max_seq_len: int
    backend_cache: dict = field(default_factory=dict)  # per-step values a backend derives once
    # Gemma 3's images: per prefill chunk, the position ranges [first, end) whose queries
    # also see the later keys of the same range (an image's placeholders attend both ways);
    # None for a step without any (every other model): plain causal attention.
    bidirectional_spans: list[list[tuple[int, int]]] | None = None
    # State layers (kv_cache/state_slots.py): each sequence's state slot, in this step's
    # sequence order, and whether it computed tokens before this step (its slot holds
    # their state; False: start from zeros). None for models without state layers.
    state_slots: torch.Tensor | None = None  # [num_seqs] int64
    state_has_initial: torch.Tensor | None = None  # [num_seqs] bool
    # KV cache groups (kv_cache/kv_cache_groups.py, a hybrid model's sliding and full
    # layers with a block table each): per layer, the metadata with its group's block
    # tables and slot mapping; None (one group): every layer reads this one.
    layer_metas: list[AttentionMetadata] | None = None
    # An encoder's step: every chunk a whole prompt attending both ways, nothing cached
    # (``encoder_attention``); False for everything else.
    encoder_only: bool = False

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_list)

    @property
    def num_decodes(self) -> int:
        return self.num_seqs - self.num_prefills
