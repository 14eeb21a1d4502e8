"""The decode engine's view of prefill engines: one side channel client per address, and
each remote engine's metadata checked once (its engine id, and a KV layout blocks can move
between: same model, block size, layers, heads, head size and dtype; the tensor-parallel
sizes may differ). A mismatch is remembered: every later request naming that engine fails
the same way without asking again; a connection failure is not (the next request retries).
"""

from __future__ import annotations

import threading

from octavo.kv_transfer.block_io import KVLayout
from octavo.kv_transfer.params import RemotePrefill
from octavo.kv_transfer.side_channel import SideChannelClient, TransferFailed


class RemotePeers:
    def __init__(self, layout: KVLayout) -> None:
        self.layout = layout
        self._clients: dict[tuple[str, int], SideChannelClient] = {}
        self._verdicts: dict[str, str | None] = {}  # engine id -> why not (None: compatible)
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
        with self._lock:
            known = remote.engine_id in self._verdicts
            verdict = self._verdicts.get(remote.engine_id)
        if not known:
            verdict = self._verdict(client.metadata(), remote)
            with self._lock:
                self._verdicts[remote.engine_id] = verdict
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
