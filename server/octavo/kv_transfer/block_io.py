"""A prompt's KV blocks copied out of one engine's cache and into another's.

Both engines must agree on a ``KVLayout`` (sent in the side channel's metadata) before
any bytes move. A ``BlockPayload`` always carries every layer and every KV head, so the
two engines' tensor- and pipeline-parallel sizes may differ: exporting joins the ranks'
shards (``join_shards``: layers by pipeline stage, heads by tensor rank), importing gives
each rank its own slice (``shard_of``). A ``KVShard`` says which part one rank holds.

Only plain paged attention caches move: a model with state layers, several KV cache
groups or an MLA latent cache is refused (the worker's ``kv_layout`` says why), as is
a draft model's second cache (speculative decoding with a draft model).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch

KV_PLANES = 2  # keys and values
MAX_READ_BYTES = 64 * 2**20  # one side channel read's blocks at most (a long prompt: several)


@dataclass
class KVLayout:
    """What both engines must agree on before blocks move between them."""

    model_fingerprint: str  # a hash of the model's shape, the cache dtype and block size
    block_size: int
    num_layers: int  # attention layers with a paged cache (every stage's)
    num_kv_heads: int  # over every tensor rank
    head_dim: int
    dtype: str  # the cache's element type: "float32", "bfloat16", ...
    tp_size: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: Any) -> KVLayout:
        """A layout from its dict (a peer's metadata); ValueError naming a bad field."""
        if not isinstance(raw, dict):
            raise ValueError(f"a KV layout is an object, got {type(raw).__name__}")
        values = {}
        for spec in fields(cls):
            value = raw.get(spec.name)
            kind = str if spec.name in ("model_fingerprint", "dtype") else int
            if not isinstance(value, kind) or isinstance(value, bool):
                raise ValueError(
                    f"the KV layout's {spec.name!r} is {value!r}, not a {kind.__name__}"
                )
            values[spec.name] = value
        return cls(**values)

    @property
    def block_bytes(self) -> int:
        """Bytes one block takes in a payload: keys and values of every layer and head."""
        element = torch.empty((), dtype=getattr(torch, self.dtype)).element_size()
        per_layer = KV_PLANES * self.block_size * self.num_kv_heads * self.head_dim
        return self.num_layers * per_layer * element

    def mismatch(self, other: KVLayout) -> str | None:
        """Why blocks cannot move between this layout and ``other`` (None: they can; the
        tensor-parallel sizes may differ)."""
        names = (
            "model_fingerprint",
            "block_size",
            "num_layers",
            "num_kv_heads",
            "head_dim",
            "dtype",
        )
        for name in names:
            if getattr(self, name) != getattr(other, name):
                return (
                    f"{name} differs: {getattr(self, name)!r} here, {getattr(other, name)!r} there"
                )
        return None


def blocks_per_read(layout: KVLayout, max_bytes: int = MAX_READ_BYTES) -> int:
    """How many blocks one read moves: as many as fit in ``max_bytes``, at least one."""
    return max(1, max_bytes // layout.block_bytes)


@dataclass
class BlockPayload:
    """Blocks of every layer: ``[planes, n_blocks, block_size, num_kv_heads, head_dim]``
    per layer, on CPU, contiguous, every rank's heads joined."""

    layers: list[torch.Tensor]

    @property
    def num_blocks(self) -> int:
        return self.layers[0].shape[1] if self.layers else 0

    def check(self, layout: KVLayout, num_blocks: int) -> None:
        """ValueError unless this payload holds ``num_blocks`` blocks shaped as ``layout``."""
        shape = (KV_PLANES, num_blocks, layout.block_size, layout.num_kv_heads, layout.head_dim)
        if len(self.layers) != layout.num_layers:
            raise ValueError(f"the payload has {len(self.layers)} layers, not {layout.num_layers}")
        for index, layer in enumerate(self.layers):
            if tuple(layer.shape) != shape or str(layer.dtype) != f"torch.{layout.dtype}":
                raise ValueError(
                    f"the payload's layer {index} is {layer.dtype} {tuple(layer.shape)}, "
                    f"not {layout.dtype} {shape}"
                )


@dataclass(frozen=True)
class KVShard:
    """The part of the whole cache one rank holds: its stage's layers, its KV heads."""

    first_layer: int
    num_layers: int
    first_head: int
    num_heads: int


@dataclass
class PackedTensor:
    """A tensor as plain bytes, for the pipe to a worker process (a pickled torch tensor
    would travel as a shared-memory handle, which a worker on another host cannot open)."""

    data: bytes
    shape: tuple[int, ...]
    dtype: str

    @classmethod
    def pack(cls, tensor: torch.Tensor) -> PackedTensor:
        raw = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
        return cls(raw.numpy().tobytes(), tuple(tensor.shape), str(tensor.dtype))

    def unpack(self) -> torch.Tensor:
        dtype = getattr(torch, self.dtype.removeprefix("torch."))
        if not self.data:
            return torch.empty(self.shape, dtype=dtype)
        raw = torch.frombuffer(bytearray(self.data), dtype=torch.uint8)
        return raw.view(dtype).reshape(self.shape)


def model_fingerprint(config: Any, cache_dtype: torch.dtype, block_size: int) -> str:
    """A hash of what makes two engines' blocks interchangeable: the architecture and
    shape of the model (a ``ModelConfig``), the cache's element type and the block size."""
    described = {
        "architecture": config.architecture,
        "hidden_size": config.hidden_size,
        "num_layers": config.num_layers,
        "num_heads": config.num_heads,
        "num_kv_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "vocab_size": config.vocab_size,
        "cache_dtype": str(cache_dtype),
        "block_size": block_size,
    }
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()[:32]


def kv_head_shard(num_kv_heads: int, tp_size: int, tp_rank: int) -> tuple[int, int]:
    """``(first, count)`` of the KV heads a tensor rank holds, as ``QKVParallelLinear``
    spreads them: an equal share each, or, with fewer heads than ranks, the one head its
    query heads use (several ranks hold the same head)."""
    if num_kv_heads >= tp_size:
        per_rank = num_kv_heads // tp_size
        return tp_rank * per_rank, per_rank
    return tp_rank * num_kv_heads // tp_size, 1


def gather_blocks(caches: list[torch.Tensor], block_ids: list[int]) -> list[torch.Tensor]:
    """Copies of ``block_ids`` of every layer's cache, on CPU, contiguous (a CUDA cache:
    one gather on the device, then one copy to the host a layer)."""
    if not caches:
        return []
    index = _block_index(caches[0], block_ids)
    return [cache.index_select(1, index).cpu().contiguous() for cache in caches]


def scatter_blocks(
    caches: list[torch.Tensor], block_ids: list[int], layers: list[torch.Tensor]
) -> None:
    """Write ``layers`` (this rank's slice, ``[planes, n, block_size, heads, dim]``) into
    ``block_ids`` of every layer's cache, as bytes (an fp8 cache's values stay as stored)."""
    if len(layers) != len(caches):
        raise ValueError(f"{len(layers)} layers of blocks for {len(caches)} cache layers")
    if not caches:
        return
    index = _block_index(caches[0], block_ids)
    for cache, layer in zip(caches, layers, strict=True):
        expected = (cache.shape[0], len(block_ids), *cache.shape[2:])
        if tuple(layer.shape) != expected or layer.dtype != cache.dtype:
            raise ValueError(
                f"blocks of {layer.dtype} {tuple(layer.shape)} for a {cache.dtype} cache "
                f"that takes {expected}"
            )
        _raw(cache).index_copy_(1, index, _raw(layer.to(cache.device, non_blocking=True)))


def join_shards(
    shards: list[tuple[KVShard, list[torch.Tensor]]], layout: KVLayout, num_blocks: int
) -> BlockPayload:
    """One payload of every layer and head from the ranks' exported slices of
    ``num_blocks`` blocks (a head held by several ranks is taken from any: they hold the
    same values)."""
    whole = KVShard(0, layout.num_layers, 0, layout.num_kv_heads)
    if len(shards) == 1 and shards[0][0] == whole:  # one rank holds everything
        return BlockPayload(list(shards[0][1]))
    shape = (KV_PLANES, num_blocks, layout.block_size, layout.num_kv_heads, layout.head_dim)
    dtype = getattr(torch, layout.dtype)
    layers = [torch.empty(shape, dtype=dtype) for _ in range(layout.num_layers)]
    for shard, tensors in shards:
        if len(tensors) != shard.num_layers:
            raise ValueError(f"a rank sent {len(tensors)} layers, not its {shard.num_layers}")
        heads = slice(shard.first_head, shard.first_head + shard.num_heads)
        for offset, tensor in enumerate(tensors):
            _raw(layers[shard.first_layer + offset])[:, :, :, heads] = _raw(tensor)
    return BlockPayload(layers)


def shard_of(payload: BlockPayload, shard: KVShard) -> list[torch.Tensor]:
    """The slice of ``payload`` one rank writes: its layers, its heads (contiguous)."""
    heads = slice(shard.first_head, shard.first_head + shard.num_heads)
    chosen = payload.layers[shard.first_layer : shard.first_layer + shard.num_layers]
    return [layer[:, :, :, heads].contiguous() for layer in chosen]


def _block_index(cache: torch.Tensor, block_ids: list[int]) -> torch.Tensor:
    """``block_ids`` as an index on the cache's device; ValueError for an id out of range
    (on CUDA a bad index would be a device-side assert, fatal to the process)."""
    num_blocks = cache.shape[1]
    bad = [block for block in block_ids if not 0 <= block < num_blocks]
    if bad:
        raise ValueError(f"block ids {bad[:5]} are outside the cache's {num_blocks} blocks")
    return torch.tensor(block_ids, dtype=torch.long, device=cache.device)


def _raw(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.view(torch.uint8) if tensor.element_size() == 1 else tensor
