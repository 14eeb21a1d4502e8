"""Publishing KV event batches on ZMQ, as vLLM's ``ZmqEventPublisher`` does.

Each batch goes out on a PUB socket as three frames: the topic, an 8-byte big-endian
sequence number (0 for the first batch of this engine, then +1 each) and the msgpack
batch. The last ``buffer_steps`` batches are kept; a subscriber that missed some sends
``[b"", <8-byte start seq>]`` from a DEALER (or ``<start seq>`` from a REQ) to the replay
ROUTER socket and gets back ``[b"", topic, seq, payload]`` for each kept batch from that
sequence number on, then the end marker ``[b"", b"", seq -1, b""]``. Replay requests
are paced (``REPLAY_RATE`` a second, bursts of ``REPLAY_BURST``, for the whole socket):
past that they are dropped unanswered, and dropped or malformed requests are logged at
most once per ``WARNING_INTERVAL`` seconds, with their count.

The engine only queues batches (``publish``); encoding and sending happen on a
background thread, which also answers replay requests. A started publisher first sends
``AllBlocksCleared``, so a consumer drops what it held for this endpoint from an earlier
engine (the sequence numbers start again at 0 too). Octavo has no data parallelism, so
the ports are not offset by a data-parallel rank as vLLM's are.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections import deque
from itertools import count
from typing import Protocol

from octavo.kv_events.config import KVEventsConfig
from octavo.kv_events.events import AllBlocksCleared, KVEventBatch
from octavo.kv_events.pacing import ThrottledWarning, TokenBucket

logger = logging.getLogger(__name__)

END_SEQ = (-1).to_bytes(8, "big", signed=True)
SHUTDOWN_TIMEOUT = 2.0  # seconds to send what is queued, then the sockets close
IDLE_POLL_SECONDS = 0.05  # how often an idle publisher looks for replay requests
PUB_LINGER_MS = 1000  # a closed PUB socket still sends its last messages this long
REPLAY_RATE = 5.0  # replay requests answered a second (each may resend buffer_steps batches)
REPLAY_BURST = 10.0
WARNING_INTERVAL = 60.0  # seconds between two warnings about replay requests


class EventPublisher(Protocol):
    def publish(self, batch: KVEventBatch) -> None: ...

    def shutdown(self) -> None: ...


class NullEventPublisher:
    """Events off (the default), or ``"publisher": "null"``: nothing is sent."""

    def publish(self, batch: KVEventBatch) -> None:
        return

    def shutdown(self) -> None:
        return


def start_publisher(config: KVEventsConfig | None) -> EventPublisher:
    """The engine's publisher; a ZMQ one opens its sockets now (a clear ValueError if it
    cannot) and announces an empty cache."""
    if config is None or not config.publishes:
        return NullEventPublisher()
    publisher = ZmqEventPublisher(config)
    publisher.publish(KVEventBatch(time.time(), [AllBlocksCleared()]))
    return publisher


class ZmqEventPublisher:
    def __init__(self, config: KVEventsConfig) -> None:
        import zmq

        self._queue: queue.Queue[KVEventBatch | None] = queue.Queue(config.max_queue_size)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._topic = config.topic.encode("utf-8")
        self._sequence = count()
        context = zmq.Context.instance()
        self._pub = context.socket(zmq.PUB)
        self._replay = None
        self._replay_budget = TokenBucket(REPLAY_RATE, REPLAY_BURST)
        self._malformed = ThrottledWarning(
            logger, "KV events: ignored %d malformed replay request(s)", WARNING_INTERVAL
        )
        self._dropped = ThrottledWarning(
            logger,
            f"KV events: dropped %d replay request(s) over {REPLAY_RATE:g} a second",
            WARNING_INTERVAL,
        )
        try:
            self._pub.set_hwm(config.hwm)
            self.endpoint = _open(
                self._pub, config.publish_endpoint, "endpoint", config.publish_binds
            )
            if config.replay_endpoint is not None:
                self._replay = context.socket(zmq.ROUTER)
                self.replay_endpoint = _open(
                    self._replay, config.replay_endpoint, "replay_endpoint", True
                )
        except BaseException:
            self._close_sockets()
            raise
        self._running = True
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
        self._thread.start()
        logger.info("KV events: publishing on %s (topic %r)", self.endpoint, config.topic)

    def publish(self, batch: KVEventBatch) -> None:
        """Queue one batch; waits while ``max_queue_size`` batches are already queued."""
        if not self._running:
            raise RuntimeError("the KV event publisher is shut down")
        self._queue.put(batch)

    def shutdown(self) -> None:
        """Send what is queued (up to ``SHUTDOWN_TIMEOUT``), stop the thread, close."""
        if not self._running:
            return
        self._running = False
        with contextlib.suppress(queue.Full):
            self._queue.put(None, timeout=SHUTDOWN_TIMEOUT)
        self._thread.join(SHUTDOWN_TIMEOUT)
        if self._thread.is_alive():  # its sockets are its own until it ends
            logger.warning("KV events: the publisher thread did not stop in time")
            return
        self._close_sockets()

    def _close_sockets(self) -> None:
        self._pub.close(linger=PUB_LINGER_MS)
        if self._replay is not None:
            self._replay.close(linger=0)

    # ----- the publisher thread ------------------------------------------------------------
    def _run(self) -> None:
        while True:
            self._answer_replays()
            try:
                batch = self._queue.get(timeout=IDLE_POLL_SECONDS)
            except queue.Empty:
                continue
            if batch is None:
                return
            try:
                self._send(batch)
            except Exception:  # one bad batch must not stop the events
                logger.exception("KV events: a batch could not be sent")

    def _send(self, batch: KVEventBatch) -> None:
        seq, payload = next(self._sequence), batch.encode()
        self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
        self._buffer.append((seq, payload))

    def _answer_replays(self) -> None:
        while self._replay is not None and self._replay.poll(0):
            try:
                frames = self._replay.recv_multipart()
                if not self._replay_budget.take():
                    self._dropped.note()
                    continue
                self._answer_replay(frames)
            except Exception:  # a broken request must not stop the events
                logger.exception("KV events: a replay request failed")

    def _answer_replay(self, frames: list[bytes]) -> None:
        """``[client, b"", start]`` -> every kept batch from ``start`` on, then the end."""
        if len(frames) != 3 or len(frames[2]) != 8:
            self._malformed.note()
            return
        client, _, start_bytes = frames
        start = int.from_bytes(start_bytes, "big")
        assert self._replay is not None
        for seq, payload in list(self._buffer):
            if seq >= start:
                self._replay.send_multipart(
                    (client, b"", self._topic, seq.to_bytes(8, "big"), payload)
                )
        self._replay.send_multipart((client, b"", b"", END_SEQ, b""))


def _open(socket, endpoint: str, name: str, binds: bool) -> str:
    """Bind or connect (``KVEventsConfig.publish_binds``; the replay socket is always
    bound); the address actually bound (a port 0 becomes the one chosen)."""
    import zmq

    if "[" in endpoint:  # an IPv6 address
        socket.setsockopt(zmq.IPV6, 1)
    try:
        if not binds:
            socket.connect(endpoint)
            return endpoint
        socket.bind(endpoint)
    except zmq.ZMQError as error:
        verb = "bind" if binds else "connect to"
        raise ValueError(f"kv_events_config: cannot {verb} {name} {endpoint!r}: {error}") from None
    return socket.getsockopt_string(zmq.LAST_ENDPOINT)
