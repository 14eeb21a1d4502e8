"""The decode engine's side: pull a prompt's blocks from a remote prefill, then decode.

A request whose ``kv_transfer_params`` carry a prefill engine's answer is admitted by the
scheduler with blocks for its whole prompt (local prefix-cache hits taken as usual) and
waits, unscheduled, while a fetch thread (a daemon: exit never waits for it) checks the
remote engine once (``RemotePeers``), reads the blocks the local cache lacks
(``SideChannelClient.read``, at most ``read_bytes`` a read, so a long prompt takes
several reads and the prefill engine exports a bounded chunk at a time), naming the
digest of its own prompt (the prefill engine refuses blocks of another), and after the
last read tells the prefill engine to free them. Back on the core thread
(``finish_loads``), the payloads are written into the request's blocks
(``import_kv_blocks``) and the request runs with every prompt token but the last
computed (its imported full blocks registered in the prefix cache at once): the last one
is computed here, as vLLM does, so the first sampled token has its logits. A failed
transfer (blocks gone or of another prompt, connection, mismatch) recomputes the prompt
here under ``kv_load_failure_policy: recompute``, or fails the request under ``fail``
with a message that names no address (the log has the cause). While a request waits
(queued or fetching) its lease is heartbeated (``LeaseHeartbeats``).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from octavo.kv_transfer.block_io import MAX_READ_BYTES, BlockPayload, blocks_per_read
from octavo.kv_transfer.counters import DecodeCounters
from octavo.kv_transfer.daemon_pool import DaemonPool
from octavo.kv_transfer.heartbeats import LeaseHeartbeats
from octavo.kv_transfer.params import RemotePrefill
from octavo.kv_transfer.prompt_digest import prompt_digest
from octavo.kv_transfer.remote_peers import RemotePeers
from octavo.kv_transfer.side_channel import TransferFailed
from octavo.scheduler.scheduler import Scheduler
from octavo.scheduler.sequence import Sequence

logger = logging.getLogger(__name__)

FETCH_THREADS = 4
# what a client sees of a failed transfer (the cause, which may name addresses, is logged)
FAILED_TRANSFER = (
    "the KV transfer from the prefill engine failed (its blocks are gone, hold another "
    "prompt, or could not be read; the decode engine's log has the cause)"
)


@dataclass
class LoadJob:
    seq: Sequence
    remote: RemotePrefill
    first_block: int  # the first prompt block not already held as a local prefix hit
    num_blocks: int  # blocks to read from there on
    dest_block_ids: list[int]  # this engine's blocks they go into
    digest: str  # of this engine's prompt: the prefill engine refuses blocks of another
    blocks_per_read: int


@dataclass
class LoadResult:
    job: LoadJob
    payloads: list[BlockPayload] = field(default_factory=list)  # one a read, in order
    error: str | None = None
    seconds: float = 0.0


class RemoteLoads:
    def __init__(
        self,
        peers: RemotePeers,
        scheduler: Scheduler,
        import_blocks: Callable[[list[int], BlockPayload], None],
        recompute_on_failure: bool,
        heartbeat_seconds: float,
    ) -> None:
        self.peers, self.scheduler = peers, scheduler
        self._import, self.recompute_on_failure = import_blocks, recompute_on_failure
        self._pool = DaemonPool(FETCH_THREADS, "kv-fetch")
        self._done: queue.SimpleQueue[LoadResult] = queue.SimpleQueue()
        self.finished = threading.Event()  # set when a fetch ends (wakes an idle step)
        self._in_flight: set[int] = set()  # seq ids being fetched
        self.heartbeats = LeaseHeartbeats(peers, heartbeat_seconds)
        self.read_bytes = MAX_READ_BYTES  # one read's blocks at most (a long prompt: several)
        self.counters = DecodeCounters()

    # ----- on the core thread ---------------------------------------------------------------
    def track(self, seq: Sequence) -> None:
        """A request was added with a remote prefill: heartbeat its lease until it loads."""
        assert isinstance(seq.remote_kv, RemotePrefill)
        self.heartbeats.track(seq.seq_id, seq.remote_kv)

    def start(self, seq: Sequence) -> None:
        """The scheduler admitted ``seq`` (its blocks allocated): fetch what it lacks."""
        remote = seq.remote_kv
        assert isinstance(remote, RemotePrefill)
        size = self.scheduler.kv.block_size
        needed = -(-(seq.num_prompt_tokens - 1) // size)  # blocks of all but the last token
        first = seq.num_computed_tokens // size
        dest = list(self.scheduler.kv.block_ids(seq.seq_id)[first:needed])
        per_read = blocks_per_read(self.peers.layout, self.read_bytes)
        digest = prompt_digest(seq)
        job = LoadJob(seq, remote, first, max(0, needed - first), dest, digest, per_read)
        self._in_flight.add(seq.seq_id)
        self._pool.submit(self._fetch, job)

    def ended(self, seq: Sequence) -> None:
        """``seq`` finished (aborted, failed) before its KV arrived: stop heartbeating it,
        and free the prefill engine's blocks unless a fetch in flight will."""
        self.heartbeats.untrack(seq.seq_id)
        if seq.seq_id not in self._in_flight and isinstance(seq.remote_kv, RemotePrefill):
            remote = seq.remote_kv
            client = self.peers.client(remote.host, remote.port)
            self._pool.submit(client.free, remote.request_id, remote.generation)

    def finish_loads(self) -> list[tuple[str, str]]:
        """Import every fetched payload and start its request; returns the requests to
        fail (``kv_load_failure_policy: fail``) as (request id, error)."""
        failures = []
        self.finished.clear()  # before draining: a fetch ending meanwhile sets it again
        while True:
            try:
                result = self._done.get_nowait()
            except queue.Empty:
                return failures
            failure = self._finish(result)
            if failure is not None:
                failures.append(failure)

    def _finish(self, result: LoadResult) -> tuple[str, str] | None:
        seq, job = result.job.seq, result.job
        self._in_flight.discard(seq.seq_id)
        self.heartbeats.untrack(seq.seq_id)
        if self.scheduler.waiting_for_remote.get(seq.seq_id) is not seq:
            return None  # aborted meanwhile (the prefill engine was told to free already)
        error = result.error
        if error is None and job.num_blocks:
            error = self._import_payloads(job, result.payloads)
        if error is None:
            self._count_transfer(job, result)
            self.scheduler.start_after_remote(seq, seq.num_prompt_tokens - 1)
            return None
        self.counters.failures += 1
        logger.warning("KV transfer for request %s failed: %s", seq.request_id, error)
        if self.recompute_on_failure:
            self.scheduler.start_after_remote(seq, seq.num_computed_tokens)  # local hits
            return None
        return seq.request_id, FAILED_TRANSFER

    def _import_payloads(self, job: LoadJob, payloads: list[BlockPayload]) -> str | None:
        start = 0
        try:
            for payload in payloads:
                end = start + payload.num_blocks
                self._import(job.dest_block_ids[start:end], payload)
                start = end
            if start != job.num_blocks:
                raise ValueError(f"{start} blocks arrived, not {job.num_blocks}")
        except Exception as error:  # a bad payload fails this request only
            return f"importing the blocks failed: {type(error).__name__}: {error}"
        return None

    def _count_transfer(self, job: LoadJob, result: LoadResult) -> None:
        counters = self.counters
        counters.transfers += 1
        counters.transfer_seconds += result.seconds
        counters.prompt_tokens_received += (
            job.seq.num_prompt_tokens - 1 - (job.seq.num_computed_tokens)
        )
        counters.bytes_received += sum(
            layer.numel() * layer.element_size()
            for payload in result.payloads
            for layer in payload.layers
        )

    # ----- on the fetch threads -------------------------------------------------------------
    def _fetch(self, job: LoadJob) -> None:
        started, result = time.monotonic(), LoadResult(job)
        remote = job.remote
        try:
            result.payloads = self._read(job)
        except TransferFailed as failure:
            result.error = str(failure)
        except Exception as failure:  # a malformed payload: this request only
            result.error = f"{type(failure).__name__}: {failure}"
        finally:  # after the last read (or the first failure)
            self.peers.client(remote.host, remote.port).free(remote.request_id, remote.generation)
        result.seconds = time.monotonic() - started
        self._done.put(result)
        self.finished.set()

    def _read(self, job: LoadJob) -> list[BlockPayload]:
        """The blocks the prompt lacks, a read of at most ``blocks_per_read`` at a time."""
        remote, layout = job.remote, self.peers.layout
        client = self.peers.checked_client(remote)
        end = job.first_block + job.num_blocks
        if len(remote.block_ids) < end:
            raise TransferFailed(
                f"the prefill engine holds {len(remote.block_ids)} blocks; the prompt needs {end}"
            )
        payloads = []
        for start in range(job.first_block, end, job.blocks_per_read):
            block_ids = list(remote.block_ids[start : min(end, start + job.blocks_per_read)])
            payload = client.read(
                remote.request_id, remote.generation, block_ids, job.digest, layout
            )
            payload.check(layout, len(block_ids))
            payloads.append(payload)
        return payloads  # none when the prompt (but its last token) was a local prefix hit

    def close(self) -> None:
        self.heartbeats.close()
        self._pool.close()
