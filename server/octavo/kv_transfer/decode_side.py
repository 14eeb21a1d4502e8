"""The decode engine's side: pull a prompt's blocks from a remote prefill, then decode.

A request whose ``kv_transfer_params`` carry a prefill engine's answer is admitted by the
scheduler with blocks for its whole prompt (local prefix-cache hits taken as usual) and
waits, unscheduled, while a fetch thread checks the remote engine once (``RemotePeers``),
reads the blocks the local cache lacks (``SideChannelClient.read``) and tells the prefill
engine to free them. Back on the core thread (``finish_loads``), the payload is written
into the request's blocks (``import_kv_blocks``) and the request runs with every prompt
token but the last computed: that one is computed here, as vLLM does, so the first
sampled token has its logits. A failed transfer (blocks gone, connection, mismatch)
recomputes the prompt here under ``kv_load_failure_policy: recompute``, or fails the
request under ``fail``. While a request waits (queued or fetching) its lease is
heartbeated every sixth of a lease duration.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from octavo.kv_transfer.block_io import BlockPayload
from octavo.kv_transfer.params import RemotePrefill
from octavo.kv_transfer.remote_peers import RemotePeers
from octavo.kv_transfer.side_channel import TransferFailed
from octavo.scheduler.scheduler import Scheduler
from octavo.scheduler.sequence import Sequence

logger = logging.getLogger(__name__)

FETCH_THREADS = 4


@dataclass
class DecodeCounters:
    prompt_tokens_received: int = 0  # prompt tokens whose KV came from a remote prefill
    bytes_received: int = 0
    transfer_seconds: float = 0.0  # summed over transfers (metadata check, read, free)
    transfers: int = 0  # completed
    failures: int = 0  # failed (then recomputed or failed, by the policy)


@dataclass
class LoadJob:
    seq: Sequence
    remote: RemotePrefill
    first_block: int  # the first prompt block not already held as a local prefix hit
    num_blocks: int  # blocks to read from there on
    dest_block_ids: list[int]  # this engine's blocks they go into


@dataclass
class LoadResult:
    job: LoadJob
    payload: BlockPayload | None
    error: str | None
    seconds: float


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
        self._pool = ThreadPoolExecutor(FETCH_THREADS, thread_name_prefix="kv-fetch")
        self._done: queue.SimpleQueue[LoadResult] = queue.SimpleQueue()
        self.finished = threading.Event()  # set when a fetch ends (wakes an idle step)
        self._in_flight: set[int] = set()  # seq ids being fetched
        self._tracked: dict[int, Sequence] = {}  # waiting for their KV: heartbeated
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._heartbeat_seconds = heartbeat_seconds
        self._heartbeats: threading.Thread | None = None
        self.counters = DecodeCounters()

    # ----- on the core thread ---------------------------------------------------------------
    def track(self, seq: Sequence) -> None:
        """A request was added with a remote prefill: heartbeat its lease until it loads."""
        with self._lock:
            self._tracked[seq.seq_id] = seq
        if self._heartbeats is None:
            self._heartbeats = threading.Thread(
                target=self._heartbeat_loop, name="kv-heartbeats", daemon=True
            )
            self._heartbeats.start()

    def start(self, seq: Sequence) -> None:
        """The scheduler admitted ``seq`` (its blocks allocated): fetch what it lacks."""
        remote = seq.remote_kv
        assert isinstance(remote, RemotePrefill)
        size = self.scheduler.kv.block_size
        needed = -(-(seq.num_prompt_tokens - 1) // size)  # blocks of all but the last token
        first = seq.num_computed_tokens // size
        dest = list(self.scheduler.kv.block_ids(seq.seq_id)[first:needed])
        job = LoadJob(seq, remote, first, max(0, needed - first), dest)
        self._in_flight.add(seq.seq_id)
        self._pool.submit(self._fetch, job)

    def ended(self, seq: Sequence) -> None:
        """``seq`` finished (aborted, failed) before its KV arrived: stop heartbeating it,
        and free the prefill engine's blocks unless a fetch in flight will."""
        with self._lock:
            self._tracked.pop(seq.seq_id, None)
        if seq.seq_id not in self._in_flight and isinstance(seq.remote_kv, RemotePrefill):
            remote = seq.remote_kv
            client = self.peers.client(remote.host, remote.port)
            self._pool.submit(client.free, remote.request_id, remote.generation)

    def finish_loads(self) -> list[tuple[str, str]]:
        """Import every fetched payload and start its request; returns the requests to
        fail (``kv_load_failure_policy: fail``) as (request id, error)."""
        failures = []
        while True:
            try:
                result = self._done.get_nowait()
            except queue.Empty:
                self.finished.clear()
                return failures
            failure = self._finish(result)
            if failure is not None:
                failures.append(failure)

    def _finish(self, result: LoadResult) -> tuple[str, str] | None:
        seq, job = result.job.seq, result.job
        self._in_flight.discard(seq.seq_id)
        with self._lock:
            self._tracked.pop(seq.seq_id, None)
        if self.scheduler.waiting_for_remote.get(seq.seq_id) is not seq:
            return None  # aborted meanwhile (the prefill engine was told to free already)
        error = result.error
        if error is None and job.num_blocks:
            error = self._import_payload(job, result.payload)
        if error is None:
            self._count_transfer(job, result)
            self.scheduler.start_after_remote(seq, seq.num_prompt_tokens - 1)
            return None
        self.counters.failures += 1
        logger.warning("KV transfer for request %s failed: %s", seq.request_id, error)
        if self.recompute_on_failure:
            self.scheduler.start_after_remote(seq, seq.num_computed_tokens)  # local hits
            return None
        return seq.request_id, f"the KV transfer from the prefill engine failed: {error}"

    def _import_payload(self, job: LoadJob, payload: BlockPayload | None) -> str | None:
        try:
            assert payload is not None
            self._import(job.dest_block_ids, payload)
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
        if result.payload is not None:
            counters.bytes_received += sum(
                layer.numel() * layer.element_size() for layer in result.payload.layers
            )

    # ----- on the fetch threads -------------------------------------------------------------
    def _fetch(self, job: LoadJob) -> None:
        started, payload, error = time.monotonic(), None, None
        remote = job.remote
        try:
            payload = self._read(job)
        except TransferFailed as failure:
            error = str(failure)
        except Exception as failure:  # a malformed payload: this request only
            error = f"{type(failure).__name__}: {failure}"
        finally:
            self.peers.client(remote.host, remote.port).free(remote.request_id, remote.generation)
        self._done.put(LoadResult(job, payload, error, time.monotonic() - started))
        self.finished.set()

    def _read(self, job: LoadJob) -> BlockPayload | None:
        remote = job.remote
        client = self.peers.checked_client(remote)
        if not job.num_blocks:
            return None  # the whole prompt (but its last token) was a local prefix hit
        end = job.first_block + job.num_blocks
        if len(remote.block_ids) < end:
            raise TransferFailed(
                f"the prefill engine holds {len(remote.block_ids)} blocks; the prompt needs {end}"
            )
        block_ids = list(remote.block_ids[job.first_block : end])
        payload = client.read(remote.request_id, remote.generation, block_ids)
        payload.check(self.peers.layout, job.num_blocks)
        return payload

    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(self._heartbeat_seconds):
            with self._lock:
                waiting = [seq.remote_kv for seq in self._tracked.values()]
            for remote in waiting:
                if not isinstance(remote, RemotePrefill):
                    continue
                try:
                    self.peers.client(remote.host, remote.port).heartbeat(
                        remote.request_id, remote.generation
                    )
                except TransferFailed as error:  # the read will find out and apply the policy
                    logger.debug("heartbeat for %s failed: %s", remote.request_id, error)

    def close(self) -> None:
        self._stop.set()
        self._pool.shutdown(wait=False, cancel_futures=True)
