"""The decode engine keeps the leases of its waiting requests alive: heartbeats per peer.

Every ``period`` (a sixth of a lease) each prefill engine (host, port) that holds blocks
for a waiting request gets its leases extended by a daemon thread of its own, each call
bounded by ``period`` seconds. A peer that is slow or gone (no answer to a SYN, a frozen
process) costs only its own thread: the other peers' heartbeats go on on time, so their
leases never expire behind it. A peer whose thread from the last round is still stuck is
skipped this round, and the first timeout or connection failure ends its round (its
requests' reads find out and apply the failure policy).
"""

from __future__ import annotations

import logging
import threading

from octavo.kv_transfer.params import RemotePrefill
from octavo.kv_transfer.remote_peers import RemotePeers
from octavo.kv_transfer.side_channel import BlocksGone, TransferFailed

logger = logging.getLogger(__name__)

Peer = tuple[str, int]


class LeaseHeartbeats:
    def __init__(self, peers: RemotePeers, period: float) -> None:
        self.peers, self.period = peers, period
        self._leases: dict[int, RemotePrefill] = {}  # by the waiting sequence's id
        self._beating: dict[Peer, threading.Thread] = {}  # each peer's last round
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._loop: threading.Thread | None = None

    def track(self, seq_id: int, remote: RemotePrefill) -> None:
        """Heartbeat ``remote``'s lease until ``untrack(seq_id)``."""
        with self._lock:
            self._leases[seq_id] = remote
        if self._loop is None:
            self._loop = threading.Thread(target=self._run, name="kv-heartbeats", daemon=True)
            self._loop.start()

    def untrack(self, seq_id: int) -> None:
        with self._lock:
            self._leases.pop(seq_id, None)

    def close(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            self.beat()

    def beat(self) -> None:
        """One round: a thread per peer whose last round is over."""
        with self._lock:
            by_peer: dict[Peer, list[RemotePrefill]] = {}
            for remote in self._leases.values():
                by_peer.setdefault((remote.host, remote.port), []).append(remote)
        for peer, remotes in by_peer.items():
            last = self._beating.get(peer)
            if last is not None and last.is_alive():
                logger.debug("the KV side channel at %s:%d is still busy: skipped", *peer)
                continue
            thread = threading.Thread(
                target=self._beat_peer, args=(peer, remotes), name="kv-heartbeat", daemon=True
            )
            self._beating[peer] = thread
            thread.start()
        for peer in set(self._beating) - set(by_peer):
            if not self._beating[peer].is_alive():
                del self._beating[peer]

    def _beat_peer(self, peer: Peer, remotes: list[RemotePrefill]) -> None:
        client = self.peers.client(*peer)
        for remote in remotes:
            try:
                client.heartbeat(remote.request_id, remote.generation, timeout=self.period)
            except BlocksGone as error:  # this lease only: the read will find out
                logger.debug("heartbeat for %s: %s", remote.request_id, error)
            except TransferFailed as error:  # the peer: its other leases wait a round
                logger.debug("heartbeats to %s:%d failed: %s", *peer, error)
                return
