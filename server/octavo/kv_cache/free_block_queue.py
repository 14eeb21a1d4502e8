"""An intrusive doubly linked list of free blocks: O(1) pop, append and remove-from-middle.

The front holds the blocks to reuse first (least recently used); a block revived by a
prefix-cache hit is unlinked from wherever it sits without a scan.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field


@dataclass(eq=False)
class KVBlock:
    block_id: int
    ref_count: int = 0
    block_hash: bytes | None = None  # its prefix-cache hash (see block_hash.py)
    token_ids: tuple[int, ...] | None = None  # the full block's tokens, checked on a cache hit
    parent_hash: bytes | None = None  # the hash of the block before it (the offload tier's)
    prev: KVBlock | None = field(default=None, repr=False)
    next: KVBlock | None = field(default=None, repr=False)


class FreeBlockQueue:
    def __init__(self, blocks: list[KVBlock]) -> None:
        self._head = KVBlock(block_id=-1)  # sentinels keep every operation branch-free
        self._tail = KVBlock(block_id=-1)
        self._head.next, self._tail.prev = self._tail, self._head
        self.size = 0
        for block in blocks:
            self.append(block)

    def popleft(self) -> KVBlock:
        block = self._head.next
        if block is self._tail or block is None:
            raise IndexError("no free blocks")
        self.remove(block)
        return block

    def remove(self, block: KVBlock) -> None:
        assert block.prev is not None and block.next is not None, "block is not in the queue"
        block.prev.next, block.next.prev = block.next, block.prev
        block.prev = block.next = None
        self.size -= 1

    def append(self, block: KVBlock) -> None:
        self._insert_between(block, self._tail.prev, self._tail)

    def appendleft(self, block: KVBlock) -> None:
        self._insert_between(block, self._head, self._head.next)

    def _insert_between(
        self, block: KVBlock, before: KVBlock | None, after: KVBlock | None
    ) -> None:
        assert before is not None and after is not None
        block.prev, block.next = before, after
        before.next = after.prev = block
        self.size += 1

    def __iter__(self) -> Iterator[KVBlock]:
        block = self._head.next
        while block is not None and block is not self._tail:
            yield block
            block = block.next
