"""Grouping a hybrid model's attention layers by KV layout (vLLM's hybrid KV cache groups).

Layers that attend alike (full attention; a sliding window ``w``; chunked local attention
of chunk ``c``) can share one block table per sequence: a sliding group frees the blocks
behind its window while a full group keeps them all. Every group has the same number of
layers (``group_size``, the last group of a kind padded), so the cache is ``group_size``
tensors over one block pool: tensor ``j`` holds layer ``j`` of every group, and a block
belongs to one group at a time. A freed sliding block thus really frees memory, which any
group reuses.

The group size is the layer count of the rarest kind (Gemma 3's 5 sliding : 1 full makes
six groups of one layer in each six), or of the commonest when no kind has over 1.25
times the rarest's layers (then padding wastes little and there are fewer tables).
"""

from __future__ import annotations

from dataclasses import dataclass

from octavo.kv_cache.sliding_window import max_blocks_per_sequence

FULL, SLIDING, CHUNKED = "full", "sliding", "chunked"
PAD_RATIO = 1.25  # pad the groups to the commonest kind's count below this ratio


@dataclass(frozen=True)
class KVLayerKind:
    """How a layer's queries see past keys: all of them, a window, or their chunk."""

    kind: str = FULL
    span: int | None = None  # the window (SLIDING) or the chunk (CHUNKED)

    @property
    def sliding_window(self) -> int | None:
        return self.span if self.kind == SLIDING else None

    @property
    def chunk_size(self) -> int | None:
        return self.span if self.kind == CHUNKED else None


@dataclass(frozen=True)
class CacheGroup:
    kind: KVLayerKind
    layers: tuple[int, ...]  # model layer indices; layer ``layers[j]`` uses tensor ``j``


@dataclass(frozen=True)
class KVCacheGroups:
    groups: tuple[CacheGroup, ...]
    group_size: int  # the cache tensors: tensor j serves layer j of every group

    @property
    def is_uniform(self) -> bool:
        """One group: today's single block table per sequence."""
        return len(self.groups) == 1

    def group_of(self, layer: int) -> int:
        return next(g for g, group in enumerate(self.groups) if layer in group.layers)

    def tensor_of(self, layer: int) -> int:
        return self.groups[self.group_of(layer)].layers.index(layer)

    def layer_tensors(self, tensors: list, num_layers: int) -> list:
        """Each layer's cache: tensor ``j`` of the ``group_size`` for layer ``j`` of its
        group (the groups share the tensors, a block belongs to one group)."""
        return [tensors[self.tensor_of(layer)] for layer in range(num_layers)]

    def layer_groups(self, num_layers: int) -> list[int | None]:
        """Each layer's group (None: a layer without KV blocks, a state layer)."""
        owner: list[int | None] = [None] * num_layers
        for index, group in enumerate(self.groups):
            for layer in group.layers:
                owner[layer] = index
        return owner


def group_layers(kinds: list[KVLayerKind | None]) -> KVCacheGroups:
    """Group layers by kind (None: no KV blocks); kinds in order of first appearance."""
    by_kind: dict[KVLayerKind, list[int]] = {}
    for layer, kind in enumerate(kinds):
        if kind is not None:
            by_kind.setdefault(kind, []).append(layer)
    if not by_kind:
        raise ValueError("a model without attention layers has no KV cache groups")
    counts = [len(layers) for layers in by_kind.values()]
    size = max(counts) if max(counts) < min(counts) * PAD_RATIO else min(counts)
    groups = tuple(
        CacheGroup(kind, tuple(layers[start : start + size]))
        for kind, layers in by_kind.items()
        for start in range(0, len(layers), size)
    )
    return KVCacheGroups(groups, size)


def blocks_per_sequence(
    groups: KVCacheGroups, max_model_len: int, block_size: int, max_step_tokens: int
) -> int:
    """The most blocks one sequence holds at once over every group (a chunked group:
    at most one chunk's keys and one step's)."""
    return sum(
        max_blocks_per_sequence(max_model_len, block_size, group.kind.span, max_step_tokens)
        for group in groups.groups
    )
