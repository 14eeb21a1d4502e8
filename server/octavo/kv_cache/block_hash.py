"""Prefix-cache block hashes: a cryptographic hash chain, as vLLM's ``hash_block_tokens``.

A full block's hash is ``H((parent hash, the block's token ids, extra keys))``: the
parent is the hash of the block before it (a random seed, vLLM's ``NONE_HASH``, for a
sequence's first block), the extra keys are what else decides the block's keys/values
besides its tokens: the LoRA adapter (every block), the images whose placeholders the
block holds (their content hashes) and the request's ``cache_salt``
(the first block only: the chain carries it on). ``H`` is SHA-256 of the pickled tuple
(``sha256``, the default) or of its canonical CBOR encoding (``sha256_cbor``, a
serialisation other languages can reproduce). A hit therefore needs the whole prefix,
adapter and salt to match: unlike Python's ``hash`` (CVE-2025-25183), no crafted prompt
can make its blocks collide with another user's.

The seed is ``H(PYTHONHASHSEED)`` when that is set (reproducible hashes across
processes, as vLLM) and 32 random bytes otherwise.

Hashing is incremental: a sequence's ``HashChain`` keeps the hashes of its full blocks,
so each block is hashed once, when it fills (its tokens only grow).
"""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

BlockHash = bytes
HASH_ALGOS = ("sha256", "sha256_cbor")
DEFAULT_HASH_ALGO = "sha256"
SEED_BYTES = 32

logger = logging.getLogger(__name__)


def sha256_pickle(value: Any) -> bytes:
    """SHA-256 of ``value`` pickled (vLLM's ``sha256``)."""
    return hashlib.sha256(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def sha256_cbor(value: Any) -> bytes:
    """SHA-256 of ``value`` in canonical CBOR (vLLM's ``sha256_cbor``)."""
    import cbor2  # only this algorithm needs it

    return hashlib.sha256(cbor2.dumps(value, canonical=True)).digest()


HASH_FUNCTIONS: dict[str, Callable[[Any], bytes]] = {
    "sha256": sha256_pickle,
    "sha256_cbor": sha256_cbor,
}


@dataclass(frozen=True)
class BlockKeys:
    """What, besides its tokens, decides a sequence's blocks' keys and values."""

    lora_name: str | None = None  # the adapter (None: the base model)
    lora_path: str | None = None  # where it was loaded from: a reloaded name is another
    cache_salt: str | None = None  # the request's: only requests with the same salt share
    # (start, end, content hash) of each image's placeholder positions in the prompt
    image_spans: tuple[tuple[int, int, str], ...] = ()

    def extra_keys(
        self, block_index: int, block_size: int = 0
    ) -> tuple[tuple[str, ...], ...] | None:
        """The extra keys of block ``block_index`` (None when there are none): the hash of
        every image whose placeholders overlap the block (vLLM's ``mm_hashes``)."""
        keys: list[tuple[str, ...]] = []
        if self.lora_name is not None:
            keys.append(("lora", self.lora_name, self.lora_path or ""))
        if self.cache_salt is not None and block_index == 0:
            keys.append(("cache_salt", self.cache_salt))
        first, last = block_index * block_size, (block_index + 1) * block_size
        for start, end, content_hash in self.image_spans:
            if start < last and first < end:
                keys.append(("image", content_hash))
        return tuple(keys) or None


@dataclass
class HashChain:
    """The hashes of a sequence's full blocks so far, computed once each."""

    keys: BlockKeys = field(default_factory=BlockKeys)
    hashes: list[BlockHash] = field(default_factory=list)


@dataclass(frozen=True)
class BlockHasher:
    algo: str
    hash_fn: Callable[[Any], bytes]
    seed: BlockHash  # the parent of a sequence's first block (vLLM's NONE_HASH)

    @classmethod
    def create(cls, algo: str = DEFAULT_HASH_ALGO) -> BlockHasher:
        """The hasher of ``--prefix-caching-hash-algo``; ValueError for an unknown name."""
        hash_fn = HASH_FUNCTIONS.get(algo)
        if hash_fn is None:
            raise ValueError(
                f"prefix_caching_hash_algo {algo!r}: choose one of {', '.join(HASH_ALGOS)}"
            )
        if algo == "sha256_cbor":
            _require_cbor2()
        hash_seed = os.environ.get("PYTHONHASHSEED")
        if hash_seed is None and algo == "sha256_cbor":
            logger.warning(
                "PYTHONHASHSEED is not set: sha256_cbor block hashes start from a random "
                "seed and are not reproducible across processes"
            )
        seed = os.urandom(SEED_BYTES) if hash_seed is None else hash_fn(hash_seed)
        return cls(algo, hash_fn, seed)

    def hash_block(
        self, parent: BlockHash | None, token_ids: tuple[int, ...], extra_keys: Any = None
    ) -> BlockHash:
        """The hash of one full block after ``parent`` (None: a sequence's first block)."""
        return self.hash_fn((self.seed if parent is None else parent, token_ids, extra_keys))

    def extend(
        self, chain: HashChain, token_ids: list[int], block_size: int, num_blocks: int
    ) -> list[BlockHash]:
        """The hashes of the first ``num_blocks`` full blocks of ``token_ids``, hashing
        only those ``chain`` does not hold yet (the chain's own list, not a copy, when it
        holds no more: read it before the chain grows again)."""
        hashes, num_full = chain.hashes, len(token_ids) // block_size
        if len(hashes) > num_full:
            del hashes[num_full:]  # tokens cut after a stop string
        for index in range(len(hashes), min(num_blocks, num_full)):
            chunk = tuple(token_ids[index * block_size : (index + 1) * block_size])
            parent = hashes[-1] if hashes else None
            extra = chain.keys.extra_keys(index, block_size)
            hashes.append(self.hash_block(parent, chunk, extra))
        return hashes if len(hashes) <= num_blocks else hashes[:num_blocks]


def _require_cbor2() -> None:
    try:
        import cbor2  # noqa: F401
    except ImportError:
        raise ValueError(
            "prefix_caching_hash_algo sha256_cbor needs the cbor2 package (pip install cbor2)"
        ) from None
