"""The decode engine's view of prefill engines: one side channel client per address, and
each remote engine's metadata checked once (its engine id, and a KV layout blocks can move
between: same model, block size, layers, heads, head size and dtype; the tensor-parallel
sizes may differ). Verdicts are kept per (engine id, host, port), so one address answering
for an engine id it is not never condemns the genuine engine elsewhere. A compatible
engine is remembered; a mismatch for ``MISMATCH_RETRY_SECONDS`` (requests naming it
meanwhile fail the same way without asking again; then it is asked again, as a restarted
pod may answer differently); a connection failure is not remembered (the next request
retries).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from octavo.kv_transfer.block_io import KVLayout
from octavo.kv_transfer.params import RemotePrefill
from octavo.kv_transfer.side_channel import SideChannelClient, TransferFailed

MISMATCH_RETRY_SECONDS = 30.0

PeerKey = tuple[str, str, int]  # engine id, host, port


class RemotePeers:
    def __init__(self, layout: KVLayout, clock: Callable[[], float] = time.monotonic) -> None:
        self.layout, self.clock = layout, clock
        self._clients: dict[tuple[str, int], SideChannelClient] = {}
        # why not (None: compatible), and until when that holds (a mismatch: a while)
        self._verdicts: dict[PeerKey, tuple[str | None, float]] = {}
        self._lock = threading.Lock()

    def client(self, host: str, port: int) -> SideChannelClient:
        with self._lock:
            client = self._clients.get((host, port))
            if client is None:
                client = self._clients[(host, port)] = SideChannelClient(host, port)
            return client

    def checked_client(self, remote: RemotePrefill) -> SideChannelClient:
        """The client of ``remote``'s engine, once its metadata was found compatible;
        ``TransferFailed`` naming the mismatch (or the connection's failure) otherwise."""
        client = self.client(remote.host, remote.port)
        key = (remote.engine_id, remote.host, remote.port)
        with self._lock:
            verdict, until = self._verdicts.get(key, (None, -1.0))
        if until <= self.clock():
            verdict = self._verdict(client.metadata(), remote)
            until = float("inf") if verdict is None else self.clock() + MISMATCH_RETRY_SECONDS
            with self._lock:
                self._verdicts[key] = (verdict, until)
        if verdict is not None:
            raise TransferFailed(f"prefill engine {remote.engine_id}: {verdict}")
        return client

    def _verdict(self, metadata: dict, remote: RemotePrefill) -> str | None:
        if metadata.get("engine_id") != remote.engine_id:
            return (
                f"{remote.host}:{remote.port} is engine {metadata.get('engine_id')!r}, not "
                f"{remote.engine_id!r} (restarted, or another engine on that address)"
            )
        try:
            theirs = KVLayout.from_dict(metadata.get("layout"))
        except ValueError as error:
            return f"its metadata is malformed: {error}"
        mismatch = self.layout.mismatch(theirs)
        return None if mismatch is None else f"KV layouts differ: {mismatch}"

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            client.close()
