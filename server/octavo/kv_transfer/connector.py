"""The engine's KV connector for prefill/decode disaggregation (``--kv-transfer-config``).

One object per engine, living on its core thread, that is both sides of vLLM's
NixlConnector contract (as vLLM's, whatever ``kv_role`` says): it keeps finished prompts'
blocks for remote decodes and serves them on the side channel (``prefill_side``), and pulls
remote prompts' blocks for its own decodes (``decode_side``). The engine calls:

- ``check_request`` when a request is added (ValueError for one it cannot serve),
- ``track`` for a sequence whose prompt comes from a remote prefill,
- ``on_step`` at the start of every step: side channel work waiting for the core thread,
  expired leases, fetched payloads (it returns the requests the ``fail`` policy ends),
- ``answer_for`` when a request finishes (its ``kv_transfer_params``),
- ``release`` when a request id is aborted, and ``close`` at shutdown.

The scheduler calls ``on_finish`` (hold the blocks?) and ``start`` (fetch) through its hooks.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from octavo.kv_transfer.block_io import KVLayout
from octavo.kv_transfer.config import KVTransferConfig, side_channel_address
from octavo.kv_transfer.core_tasks import CoreTasks
from octavo.kv_transfer.counters import DecodeCounters, PrefillCounters, TransferStats
from octavo.kv_transfer.decode_side import RemoteLoads
from octavo.kv_transfer.params import parse_kv_transfer_params
from octavo.kv_transfer.prefill_side import PrefillBlockSource, PrefillLeases
from octavo.kv_transfer.remote_peers import RemotePeers
from octavo.kv_transfer.side_channel import SideChannelServer
from octavo.sampling_params import SamplingParams
from octavo.scheduler.scheduler import Scheduler
from octavo.scheduler.sequence import Sequence

logger = logging.getLogger(__name__)

POLL_SECONDS = 0.002  # how often an idle engine looks for side channel work


class KVConnector:
    def __init__(
        self, config: KVTransferConfig, scheduler: Scheduler, executor: Any, tp_size: int
    ) -> None:
        self.config, self.scheduler = config, scheduler
        self.layout: KVLayout = executor.kv_layout()  # ValueError: a cache we cannot move
        address = side_channel_address()
        self.tasks = CoreTasks()
        kv = scheduler.kv
        self.prefill = PrefillLeases(
            config, address.host, address.port, tp_size, kv.block_size, kv.block_ids, kv.free
        )
        source = PrefillBlockSource(
            self.prefill, self.tasks, self.layout, executor.export_kv_blocks
        )
        try:
            self.server = SideChannelServer(address.host, address.port, source)
        except OSError as error:
            raise ValueError(
                f"the KV side channel cannot listen on {address.host}:{address.port} (set "
                f"VLLM_NIXL_SIDE_CHANNEL_HOST/VLLM_NIXL_SIDE_CHANNEL_PORT): {error}"
            ) from None
        self.prefill.port = self.server.port  # port 0: the one picked
        self.decode = RemoteLoads(
            RemotePeers(self.layout),
            scheduler,
            executor.import_kv_blocks,
            config.recomputes_on_failure,
            config.lease_seconds / 6,
        )
        scheduler.holds_blocks = self.on_finish
        scheduler.on_remote_admit = self.decode.start
        self.server.start()
        logger.info(
            "KV transfer: engine %s serves its blocks on %s:%d (lease %.0f s, on failure: %s)",
            config.engine_id,
            address.host,
            self.server.port,
            config.lease_seconds,
            config.kv_load_failure_policy,
        )

    def check_request(self, params: SamplingParams, num_prompt_tokens: int) -> None:
        """ValueError for ``kv_transfer_params`` this engine cannot serve."""
        wanted = parse_kv_transfer_params(params.kv_transfer_params)
        if wanted is None:
            return
        if params.n != 1:
            raise ValueError("kv_transfer_params: a transferred prompt serves one completion (n=1)")
        if wanted.remote is None:
            return
        if params.prompt_logprobs is not None:
            raise ValueError(
                "kv_transfer_params: prompt_logprobs cannot be computed for a prompt "
                "prefilled remotely"
            )
        if wanted.remote.num_tokens != num_prompt_tokens:
            raise ValueError(
                f"kv_transfer_params: the prefill engine computed {wanted.remote.num_tokens} "
                f"prompt tokens, but this prompt has {num_prompt_tokens} (send the same prompt)"
            )

    def track(self, seq: Sequence) -> None:
        """Mark a new sequence whose prompt's KV a remote prefill holds."""
        wanted = parse_kv_transfer_params(seq.params.kv_transfer_params)
        if wanted is not None and wanted.remote is not None:
            seq.remote_kv = wanted.remote
            self.decode.track(seq)

    def on_finish(self, seq: Sequence) -> bool:
        """The scheduler is finishing ``seq``: True if its blocks are kept (leased)."""
        if seq.remote_kv is not None:
            self.decode.ended(seq)
        return self.prefill.hold(seq)

    def on_step(self) -> list[tuple[str, str]]:
        """Between steps: the side channel's waiting work, expired leases, fetched blocks."""
        self.tasks.run_pending()
        self.prefill.free_expired()
        return self.decode.finish_loads()

    @property
    def busy(self) -> bool:
        """Could work arrive for the core thread (held leases, fetches, side channel calls)?"""
        return bool(
            self.prefill.num_held or self.scheduler.waiting_for_remote or self.tasks.pending
        )

    def wait_for_work(self, timeout: float) -> None:
        """An engine with nothing to schedule waits here (not spinning) for a fetch to end
        or the side channel to post work, at most ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not (self.tasks.posted.is_set() or self.decode.finished.is_set()):
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self.decode.finished.wait(min(left, POLL_SECONDS))

    def progress(self) -> tuple[int, int, int]:
        """Changes when a lease ends (read, expired, aborted): time to report stats."""
        counters = self.prefill.counters
        return self.prefill.num_held, counters.freed_by_reader, counters.expired

    def answer_for(self, request_id: str) -> dict[str, Any] | None:
        return self.prefill.answer_for(request_id)

    def release(self, request_id: str) -> None:
        """A request id was aborted: blocks still held for it are freed now."""
        self.prefill.free(request_id)

    def stats(self) -> TransferStats:
        return TransferStats(
            DecodeCounters(**vars(self.decode.counters)),
            PrefillCounters(**vars(self.prefill.counters)),
            self.prefill.num_held,
        )

    def close(self) -> None:
        self.server.close()
        self.decode.close()
        self.decode.peers.close()
        self.prefill.free_all()


def build_connector(args: Any, parts: Any) -> KVConnector | None:
    """The engine's connector when ``--kv-transfer-config`` is set (its side channel
    listening), else None. ValueError for a model whose cache cannot be moved."""
    config = args.kv_transfer_config
    if config is None:
        return None
    return KVConnector(config, parts.scheduler, parts.executor, args.tensor_parallel_size)
