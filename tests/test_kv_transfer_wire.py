"""The P/D data plane: leases, the side channel's frames and server, and moving blocks
between two engines' caches (``octavo.kv_transfer``)."""

from __future__ import annotations

import json
import socket
import struct
import threading

import pytest
import torch

from octavo.kv_transfer.block_io import BlockPayload, KVLayout
from octavo.kv_transfer.leases import LeaseExpired, LeaseTable
from octavo.kv_transfer.side_channel import (
    BlocksGone,
    SideChannelClient,
    SideChannelServer,
    TransferFailed,
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# ----- leases ------------------------------------------------------------------------------


def test_lease_grant_check_release() -> None:
    table = LeaseTable(duration=30.0, clock=FakeClock())
    lease = table.grant("req-1", [4, 5, 6], num_tokens=40)
    assert (lease.block_ids, lease.num_tokens, lease.expires_at) == ([4, 5, 6], 40, 130.0)
    assert table.check("req-1", lease.generation) is lease
    with pytest.raises(LeaseExpired):
        table.check("req-1", lease.generation + 1)  # another grant's generation
    with pytest.raises(LeaseExpired):
        table.check("req-2", lease.generation)
    with pytest.raises(ValueError, match="already holds"):
        table.grant("req-1", [7], 1)
    assert table.release("req-1") is lease
    assert table.release("req-1") is None
    with pytest.raises(LeaseExpired):
        table.check("req-1", lease.generation)


def test_lease_expires_and_extends() -> None:
    clock = FakeClock()
    table = LeaseTable(duration=30.0, clock=clock)
    first = table.grant("a", [1], 16)
    second = table.grant("b", [2], 16)
    clock.now = 125.0
    table.extend("a", first.generation)  # max(130, 125 + 20)
    assert first.expires_at == 145.0
    table.extend("a", first.generation)  # never shortened
    assert first.expires_at == 145.0
    clock.now = 130.0
    with pytest.raises(LeaseExpired, match="expired"):
        table.check("b", second.generation)
    with pytest.raises(LeaseExpired):
        table.extend("b", second.generation)
    assert table.take_expired() == [second]
    assert table.take_expired() == []
    clock.now = 145.0
    assert table.take_expired() == [first]
    assert len(table) == 0


def test_regranted_request_id_never_matches_the_old_generation() -> None:
    table = LeaseTable(duration=30.0, clock=FakeClock())
    old = table.grant("same-id", [1], 16)
    table.release("same-id")
    new = table.grant("same-id", [9], 16)
    assert new.generation != old.generation
    with pytest.raises(LeaseExpired):
        table.check("same-id", old.generation)


# ----- the side channel --------------------------------------------------------------------

LAYOUT = KVLayout("abc123", block_size=4, num_layers=2, num_kv_heads=2, head_dim=3,
                  dtype="float32", tp_size=1)  # fmt: skip


class CacheSource:
    """A BlockSource over an in-test cache and lease table."""

    def __init__(self, caches: list[torch.Tensor], leases: LeaseTable) -> None:
        self.caches, self.leases = caches, leases
        self.freed: list[str] = []

    def metadata(self) -> dict:
        return {"engine_id": "prefill-0", "layout": LAYOUT.to_dict(), "version": 1}

    def read(self, request_id: str, generation: int, block_ids: list[int]) -> BlockPayload:
        self.leases.check(request_id, generation)
        return BlockPayload([cache[:, block_ids].contiguous() for cache in self.caches])

    def free(self, request_id: str, generation: int) -> None:
        self.freed.append(request_id)
        self.leases.release(request_id)

    def heartbeat(self, request_id: str, generation: int) -> None:
        self.leases.extend(request_id, generation)


def _caches(dtype: torch.dtype) -> list[torch.Tensor]:
    return [torch.randn(2, 6, 4, 2, 3).to(dtype) for _ in range(2)]


@pytest.fixture
def served():
    clock = FakeClock()
    source = CacheSource(_caches(torch.float32), LeaseTable(30.0, clock))
    server = SideChannelServer("127.0.0.1", 0, source)
    server.start()
    client = SideChannelClient("127.0.0.1", server.port, timeout=5.0)
    yield source, server, client, clock
    client.close()
    server.close()


def test_metadata_round_trip(served) -> None:
    _, _, client, _ = served
    metadata = client.metadata()
    assert metadata["engine_id"] == "prefill-0"
    assert KVLayout.from_dict(metadata["layout"]) == LAYOUT


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_read_round_trip_is_exact(served, dtype: torch.dtype) -> None:
    source, _, client, _ = served
    source.caches = _caches(dtype)
    lease = source.leases.grant("req", [5, 0, 3], 10)
    payload = client.read("req", lease.generation, [5, 0, 3])
    assert len(payload.layers) == 2
    for cache, layer in zip(source.caches, payload.layers, strict=True):
        assert layer.dtype == dtype
        assert torch.equal(layer, cache[:, [5, 0, 3]])
    client.heartbeat("req", lease.generation)  # the same connection, reused
    client.free("req", lease.generation)
    assert source.freed == ["req"]


def test_expired_lease_reads_blocks_gone(served) -> None:
    source, _, client, clock = served
    lease = source.leases.grant("req", [1], 3)
    clock.now += 31.0
    with pytest.raises(BlocksGone):
        client.read("req", lease.generation, [1])
    with pytest.raises(BlocksGone):
        client.heartbeat("req", lease.generation)
    with pytest.raises(BlocksGone):
        client.read("never-granted", 7, [1])
    client.free("never-granted", 7)  # best effort: never raises


def test_closed_port_is_transfer_failed() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(TransferFailed, match="cannot connect"):
        SideChannelClient("127.0.0.1", port, timeout=2.0).metadata()


def test_server_answering_garbage_is_transfer_failed() -> None:
    listener = socket.create_server(("127.0.0.1", 0))

    def answer_garbage() -> None:
        conn, _ = listener.accept()
        conn.recv(1024)
        conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
        conn.close()

    thread = threading.Thread(target=answer_garbage)
    thread.start()
    with pytest.raises(TransferFailed):
        SideChannelClient("127.0.0.1", listener.getsockname()[1], timeout=2.0).metadata()
    thread.join()
    listener.close()


def _raw_exchange(port: int, data: bytes) -> dict:
    with socket.create_connection(("127.0.0.1", port), timeout=5.0) as sock:
        sock.sendall(data)
        (length,) = struct.unpack(">I", _recv(sock, 4))
        return json.loads(_recv(sock, length))


def _recv(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        assert chunk, "the server closed the connection without an answer"
        data += chunk
    return data


def _frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (_frame(b"{not json"), "not JSON"),
        (_frame(b"[1, 2]"), "string 'op'"),
        (struct.pack(">I", 2**31), "over"),  # a header too big to take
        (_frame(b'{"op":"read","tensors":[{"shape":[2],"dtype":"float32","nbytes":8}]}'), "over"),
        (_frame(b'{"op":"read","request_id":"r"}'), "'generation'"),
        (_frame(b'{"op":"launch"}'), "unknown op"),
    ],
)
def test_malformed_frames_are_answered_and_the_server_keeps_serving(served, data, message) -> None:
    _, server, client, _ = served
    reply = _raw_exchange(server.port, data)
    assert reply["op"] == "error" and reply["error"] == "bad_request"
    assert message in reply["message"]
    assert client.metadata()["engine_id"] == "prefill-0"
