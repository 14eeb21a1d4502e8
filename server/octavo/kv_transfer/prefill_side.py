"""The prefill engine's side: keep a finished prompt's blocks for a remote decode, serve them.

A request sent with ``kv_transfer_params: {"do_remote_decode": true}`` that finishes
length-capped (``max_tokens: 1``, as the routing sidecar sends it) or stopped (EOS or a
stop string as its one token, as newer vLLM) keeps its blocks: the scheduler asks ``hold``
before freeing them, and a lease is granted instead, naming the digest of the prompt they
hold (``prompt_digest``); the request's answer (``answer_for``) tells the decode engine
where they wait. The blocks are freed when the decode engine says it has read them
(``free``), when the lease expires (checked every step, ``free_expired``), or when the
request id is aborted. Any other ending (aborted, failed) frees them at once and answers
nothing, as vLLM does.

``PrefillBlockSource`` is what the side channel's threads call: reads and frees run on
the core thread (``CoreTasks``), between steps, so the cache is never read while a step
writes it; a read names the lease's generation, the digest of the reader's own prompt
(a mismatch is answered as gone) and only blocks of that lease, at most
``max_blocks_per_read`` of them, so one export holds the core thread briefly.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from octavo.kv_transfer.block_io import BlockPayload, KVLayout, blocks_per_read
from octavo.kv_transfer.config import KVTransferConfig
from octavo.kv_transfer.core_tasks import CoreTasks
from octavo.kv_transfer.counters import PrefillCounters
from octavo.kv_transfer.leases import Lease, LeaseExpired, LeaseTable, PromptMismatch
from octavo.kv_transfer.params import RemotePrefill, answer_params, parse_kv_transfer_params
from octavo.kv_transfer.prompt_digest import prompt_digest
from octavo.kv_transfer.side_channel import BadRequest
from octavo.scheduler.sequence import Sequence

logger = logging.getLogger(__name__)

METADATA_VERSION = 1
HELD_ENDINGS = ("length", "stop")  # as newer vLLM: a prefill that sampled EOS is held too


class PrefillLeases:
    """Held blocks by request id, their leases, and the answers not yet reported."""

    def __init__(
        self,
        config: KVTransferConfig,
        host: str,
        port: int,
        tp_size: int,
        block_size: int,
        block_ids: Callable[[int], list[int]],
        free_blocks: Callable[[int], None],
    ) -> None:
        self.config, self.host, self.port, self.tp_size = config, host, port, tp_size
        self.block_size = block_size
        self.leases = LeaseTable(config.lease_seconds)
        self._block_ids, self._free_blocks = block_ids, free_blocks
        self._seq_of: dict[str, int] = {}  # request id -> the sequence whose blocks are held
        self._answers: dict[str, dict[str, Any]] = {}
        self.counters = PrefillCounters()

    def hold(self, seq: Sequence) -> bool:
        """On the core thread, as the scheduler finishes ``seq``: keep its blocks (True)?"""
        wanted = parse_kv_transfer_params(seq.params.kv_transfer_params)
        if wanted is None or not wanted.do_remote_decode or seq.finish_reason not in HELD_ENDINGS:
            return False
        if seq.request_id in self._seq_of or seq.num_computed_tokens < seq.num_prompt_tokens:
            return False  # the id holds blocks already (reused while held); prompt not done
        num_tokens = seq.num_prompt_tokens
        block_ids = list(self._block_ids(seq.seq_id)[: -(-num_tokens // self.block_size)])
        lease = self.leases.grant(seq.request_id, block_ids, num_tokens, prompt_digest(seq))
        self._seq_of[seq.request_id] = seq.seq_id
        self._answers[seq.request_id] = answer_params(self._remote(lease))
        self.counters.held += 1
        return True

    def _remote(self, lease: Lease) -> RemotePrefill:
        return RemotePrefill(
            engine_id=str(self.config.engine_id),
            request_id=lease.request_id,
            block_ids=tuple(lease.block_ids),
            host=self.host,
            port=self.port,
            tp_size=self.tp_size,
            generation=lease.generation,
            num_tokens=lease.num_tokens,
        )

    def answer_for(self, request_id: str) -> dict[str, Any] | None:
        """The ``kv_transfer_params`` a finished request answers (once)."""
        return self._answers.pop(request_id, None)

    def free(self, request_id: str, generation: int | None = None) -> bool:
        """On the core thread: free a request's held blocks (a reader's ``free`` names the
        generation it read; an abort does not). False if nothing was held."""
        if generation is not None:
            try:
                self.leases.check(request_id, generation)
            except LeaseExpired:
                return False
        lease = self.leases.release(request_id)
        seq_id = self._seq_of.pop(request_id, None)
        self._answers.pop(request_id, None)
        if seq_id is not None:
            self._free_blocks(seq_id)
        return lease is not None

    def free_expired(self) -> None:
        """On the core thread, every step: free the blocks whose lease ran out unread."""
        for lease in self.leases.take_expired():
            logger.warning(
                "freeing the KV blocks of request %s: no decode engine read them within its "
                "lease (%.0f s)",
                lease.request_id,
                self.config.lease_seconds,
            )
            self.counters.expired += 1
            seq_id = self._seq_of.pop(lease.request_id, None)
            self._answers.pop(lease.request_id, None)
            if seq_id is not None:
                self._free_blocks(seq_id)

    def free_all(self) -> None:
        for request_id in list(self._seq_of):
            self.free(request_id)

    @property
    def num_held(self) -> int:
        return len(self._seq_of)


class PrefillBlockSource:
    """The side channel's ``BlockSource``: lease checks, then cache reads on the core thread."""

    def __init__(
        self,
        leases: PrefillLeases,
        tasks: CoreTasks,
        layout: KVLayout,
        export_blocks: Callable[[list[int]], BlockPayload],
    ) -> None:
        self._leases, self._tasks = leases, tasks
        self._layout, self._export = layout, export_blocks
        self.max_blocks_per_read = blocks_per_read(layout)  # one export holds the core thread

    def metadata(self) -> dict:
        engine_id = str(self._leases.config.engine_id)
        layout = self._layout.to_dict()
        return {"engine_id": engine_id, "layout": layout, "version": METADATA_VERSION}

    def read(
        self, request_id: str, generation: int, block_ids: list[int], digest: str
    ) -> BlockPayload:
        """Copies of ``block_ids`` of a live lease whose prompt digest is ``digest``."""
        if len(block_ids) > self.max_blocks_per_read:
            raise BadRequest(
                f"a read takes at most {self.max_blocks_per_read} blocks, not {len(block_ids)}"
            )

        def read_now() -> BlockPayload:
            lease = self._leases.leases.check(request_id, generation)  # LeaseExpired: "gone"
            if lease.prompt_digest != digest:
                raise PromptMismatch(
                    f"the blocks of request {request_id!r} hold another prompt (its token "
                    "ids, adapter, cache salt or images differ)"
                )
            outside = set(block_ids) - set(lease.block_ids)
            if outside:
                raise LeaseExpired(
                    f"blocks {sorted(outside)} are not leased to request {request_id!r}"
                )
            return self._export(list(block_ids))

        return self._tasks.call(read_now)

    def free(self, request_id: str, generation: int) -> None:
        def free_now() -> None:
            if self._leases.free(request_id, generation):
                self._leases.counters.freed_by_reader += 1  # on the core thread: never lost

        self._tasks.call(free_now)

    def heartbeat(self, request_id: str, generation: int) -> None:
        # The lease table is thread-safe and no tensor is touched: no core-thread hop.
        self._leases.leases.extend(request_id, generation)
