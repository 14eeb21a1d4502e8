"""The P/D data plane: leases, the side channel's frames and server, and moving blocks
between two engines' caches (``octavo.kv_transfer``)."""

from __future__ import annotations

import json
import socket
import struct
import threading
import time

import pytest
import torch

from octavo.config import EngineArgs
from octavo.engine.llm_engine import LLMEngine
from octavo.executor.executor import UniProcExecutor
from octavo.kv_transfer.block_io import (
    BlockPayload,
    KVLayout,
    KVShard,
    PackedTensor,
    gather_blocks,
    join_shards,
    kv_head_shard,
    scatter_blocks,
    shard_of,
)
from octavo.kv_transfer.heartbeats import LeaseHeartbeats
from octavo.kv_transfer.leases import LeaseExpired, LeaseTable
from octavo.kv_transfer.params import RemotePrefill
from octavo.kv_transfer.remote_peers import MISMATCH_RETRY_SECONDS, RemotePeers
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

LAYOUT = KVLayout(
    "abc123", block_size=4, num_layers=2, num_kv_heads=2, head_dim=3, dtype="float32", tp_size=1
)


class CacheSource:
    """A BlockSource over an in-test cache and lease table."""

    def __init__(self, caches: list[torch.Tensor], leases: LeaseTable) -> None:
        self.caches, self.leases = caches, leases
        self.freed: list[str] = []
        self.digests: list[str] = []
        self.answer_as_asked = True

    def metadata(self) -> dict:
        return {"engine_id": "prefill-0", "layout": LAYOUT.to_dict(), "version": 1}

    def read(
        self, request_id: str, generation: int, block_ids: list[int], digest: str
    ) -> BlockPayload:
        self.leases.check(request_id, generation)
        self.digests.append(digest)
        wanted = block_ids if self.answer_as_asked else list(range(6))  # (else: every block)
        return BlockPayload([cache[:, wanted].contiguous() for cache in self.caches])

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
    payload = client.read("req", lease.generation, [5, 0, 3], "digest")
    assert len(payload.layers) == 2
    for cache, layer in zip(source.caches, payload.layers, strict=True):
        assert layer.dtype == dtype
        assert torch.equal(layer, cache[:, [5, 0, 3]])
    client.heartbeat("req", lease.generation)  # the same connection, reused
    client.free("req", lease.generation)
    assert source.freed == ["req"]


def test_a_failing_source_is_an_internal_error_and_the_server_keeps_serving(served) -> None:
    source, _, client, _ = served
    lease = source.leases.grant("req", [1], 3)
    source.caches = [torch.zeros(2, 6, 4, 2, 3, dtype=torch.complex64)]  # no wire dtype
    with pytest.raises(TransferFailed, match="internal") as raised:
        client.read("req", lease.generation, [1], "digest")
    assert not isinstance(raised.value, BlocksGone)
    source.caches = None  # read raises TypeError
    with pytest.raises(TransferFailed, match="internal"):
        client.read("req", lease.generation, [1], "digest")
    assert client.metadata()["engine_id"] == "prefill-0"


def test_a_dropped_idle_connection_is_replaced(served) -> None:
    _, server, client, _ = served
    client.metadata()
    server._server.close_connections()  # as the server's idle timeout does
    assert client.metadata()["engine_id"] == "prefill-0"


def test_expired_lease_reads_blocks_gone(served) -> None:
    source, _, client, clock = served
    lease = source.leases.grant("req", [1], 3)
    clock.now += 31.0
    with pytest.raises(BlocksGone):
        client.read("req", lease.generation, [1], "digest")
    with pytest.raises(BlocksGone):
        client.heartbeat("req", lease.generation)
    with pytest.raises(BlocksGone):
        client.read("never-granted", 7, [1], "digest")
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


def test_a_reply_over_the_blocks_asked_is_refused_before_it_is_allocated(served) -> None:
    source, _, client, _ = served
    lease = source.leases.grant("req", [5, 0, 3], 10)
    payload = client.read("req", lease.generation, [5, 0, 3], "digest-1", LAYOUT)
    assert payload.num_blocks == 3 and source.digests == ["digest-1"]
    source.answer_as_asked = False  # a peer answering 6 blocks for 1
    with pytest.raises(TransferFailed, match="over 384"):  # 1 block: 2 layers of 192 bytes
        client.read("req", lease.generation, [1], "digest-1", LAYOUT)


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _ipv6_loopback(), reason="this machine has no IPv6 loopback")
def test_the_side_channel_listens_on_an_ipv6_address() -> None:
    source = CacheSource(_caches(torch.float32), LeaseTable(30.0, FakeClock()))
    server = SideChannelServer("::1", 0, source)
    server.start()
    client = SideChannelClient("::1", server.port, timeout=5.0)
    try:
        assert client.metadata()["engine_id"] == "prefill-0"
    finally:
        client.close()
        server.close()


@pytest.fixture
def silent_peer():
    """A port whose connections are accepted by the kernel and never answered (a frozen
    process, as a node lost without a reset looks to a connection already open)."""
    listener = socket.create_server(("127.0.0.1", 0))
    yield listener.getsockname()[1]
    listener.close()


def test_closing_a_client_ends_its_calls_in_flight(silent_peer) -> None:
    client = SideChannelClient("127.0.0.1", silent_peer, timeout=60.0)
    failures: list[Exception] = []

    def call() -> None:
        try:
            client.metadata()
        except TransferFailed as error:
            failures.append(error)

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    deadline = time.monotonic() + 5
    while not client._in_use and time.monotonic() < deadline:
        time.sleep(0.01)
    client.close()
    thread.join(timeout=5)
    assert not thread.is_alive() and len(failures) == 1


def _remote(engine_id: str, port: int, request_id: str = "req", generation: int = 1):
    return RemotePrefill(engine_id, request_id, (0,), "127.0.0.1", port, 1, generation, 4)


def test_a_silent_peer_does_not_delay_another_peers_heartbeats(served, silent_peer) -> None:
    source, server, _, _ = served
    source.leases = LeaseTable(duration=1.0)  # the real clock: heartbeats must keep it
    lease = source.leases.grant("healthy", [1], 4)
    heartbeats = LeaseHeartbeats(RemotePeers(LAYOUT), period=0.1)
    try:
        for index in range(3):
            heartbeats.track(index, _remote("dead", silent_peer, f"stuck-{index}"))
        heartbeats.track(3, _remote("prefill-0", server.port, "healthy", lease.generation))
        time.sleep(2.0)  # two lease durations
        source.leases.check("healthy", lease.generation)  # still valid
    finally:
        heartbeats.close()
        heartbeats.peers.close()


class OtherEngineSource(CacheSource):
    def metadata(self) -> dict:
        return {**super().metadata(), "engine_id": "another engine"}


def test_peer_verdicts_are_kept_per_address_and_mismatches_asked_again(served) -> None:
    source, server, _, clock = served
    other = SideChannelServer("127.0.0.1", 0, OtherEngineSource([], LeaseTable()))
    other.start()
    asked: list[int] = []
    metadata = source.metadata
    source.metadata = lambda: asked.append(1) or metadata()
    peers = RemotePeers(LAYOUT, clock=clock)
    try:  # an address answering for prefill-0 falsely does not condemn the real one
        with pytest.raises(TransferFailed, match="another engine"):
            peers.checked_client(_remote("prefill-0", other.port))
        peers.checked_client(_remote("prefill-0", server.port))
        with pytest.raises(TransferFailed, match="is engine 'prefill-0'"):
            peers.checked_client(_remote("a restarted engine", server.port))
        with pytest.raises(TransferFailed):  # remembered: not asked again
            peers.checked_client(_remote("a restarted engine", server.port))
        assert len(asked) == 2
        clock.now += MISMATCH_RETRY_SECONDS
        with pytest.raises(TransferFailed):
            peers.checked_client(_remote("a restarted engine", server.port))
        assert len(asked) == 3, "a mismatch is asked again after a while"
    finally:
        peers.close()
        other.close()


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
        (_frame(b'{"op":"read","request_id":"r","generation":1,"block_ids":[]}'), "digest"),
        (_frame(b'{"op":"m","tensors":[{"shape":[0],"dtype":"int8","nbytes":0}]}'), "over 0"),
        (struct.pack(">I", 2**20 + 1), "over 1048576"),  # a request header over 1 MiB
        (_frame(b'{"op":"launch"}'), "unknown op"),
    ],
)
def test_malformed_frames_are_answered_and_the_server_keeps_serving(served, data, message) -> None:
    _, server, client, _ = served
    reply = _raw_exchange(server.port, data)
    assert reply["op"] == "error" and reply["error"] == "bad_request"
    assert message in reply["message"]
    assert client.metadata()["engine_id"] == "prefill-0"


# ----- block contents: export, import, shards ---------------------------------------------


def _full_payload(layout: KVLayout, num_blocks: int) -> BlockPayload:
    shape = (2, num_blocks, layout.block_size, layout.num_kv_heads, layout.head_dim)
    return BlockPayload([torch.randn(shape) for _ in range(layout.num_layers)])


def _shards(layout: KVLayout, tp: int, pp: int) -> list[KVShard]:
    """Each rank's part, in rank order (rank = stage * tp + tensor rank)."""
    per_stage = layout.num_layers // pp
    return [
        KVShard(stage * per_stage, per_stage, *kv_head_shard(layout.num_kv_heads, tp, rank))
        for stage in range(pp)
        for rank in range(tp)
    ]


@pytest.mark.parametrize(("kv_heads", "tp", "pp"), [(4, 2, 1), (1, 2, 1), (2, 2, 2), (4, 1, 1)])
def test_split_then_join_gives_every_layer_and_head_back(kv_heads: int, tp: int, pp: int) -> None:
    layout = KVLayout("f", 4, 4, kv_heads, 3, "float32", tp)
    payload = _full_payload(layout, num_blocks=3)
    shards = _shards(layout, tp, pp)
    slices = [shard_of(payload, shard) for shard in shards]
    for shard, rank_layers in zip(shards, slices, strict=True):
        assert len(rank_layers) == layout.num_layers // pp
        assert rank_layers[0].shape == (2, 3, 4, max(1, kv_heads // tp), 3)
        assert rank_layers[0].is_contiguous()
        first = payload.layers[shard.first_layer][:, :, :, shard.first_head]
        assert torch.equal(rank_layers[0][:, :, :, 0], first)
    joined = join_shards(list(zip(shards, slices, strict=True)), layout, num_blocks=3)
    for original, back in zip(payload.layers, joined.layers, strict=True):
        assert torch.equal(original, back)


def test_kv_head_shard_matches_the_qkv_split() -> None:
    assert [kv_head_shard(8, 4, rank) for rank in range(4)] == [(0, 2), (2, 2), (4, 2), (6, 2)]
    assert [kv_head_shard(2, 4, rank) for rank in range(4)] == [(0, 1), (0, 1), (1, 1), (1, 1)]


def test_gather_and_scatter_blocks_bf16_and_out_of_range() -> None:
    source = [torch.randn(2, 6, 4, 2, 3).to(torch.bfloat16) for _ in range(2)]
    target = [torch.zeros_like(cache) for cache in source]
    layers = gather_blocks(source, [4, 1])
    scatter_blocks(target, [0, 5], layers)
    for src, dst in zip(source, target, strict=True):
        assert torch.equal(dst[:, [0, 5]], src[:, [4, 1]])
        assert not dst[:, 1:5].any()
    with pytest.raises(ValueError, match="outside"):
        gather_blocks(source, [6])
    with pytest.raises(ValueError, match="outside"):
        scatter_blocks(target, [-1, 0], layers)
    with pytest.raises(ValueError, match="cache that takes"):
        scatter_blocks(target, [0], layers)


def test_payload_check_and_layout_mismatch() -> None:
    payload = _full_payload(LAYOUT, num_blocks=2)
    payload.check(LAYOUT, 2)
    with pytest.raises(ValueError, match="layer 0"):
        payload.check(LAYOUT, 3)
    assert LAYOUT.mismatch(KVLayout(**{**LAYOUT.to_dict(), "tp_size": 4})) is None
    other = KVLayout(**{**LAYOUT.to_dict(), "block_size": 16})
    assert "block_size" in LAYOUT.mismatch(other)
    with pytest.raises(ValueError, match="'head_dim'"):
        KVLayout.from_dict({**LAYOUT.to_dict(), "head_dim": "3"})


def test_packed_tensor_round_trip() -> None:
    for tensor in (torch.randn(2, 3).to(torch.bfloat16), torch.empty(0, 4)):
        back = PackedTensor.pack(tensor).unpack()
        assert back.dtype == tensor.dtype and torch.equal(back, tensor)


def _tiny_executor(folder) -> UniProcExecutor:
    args = EngineArgs(
        model=str(folder),
        dtype="float32",
        block_size=8,
        max_model_len=64,
        kv_cache_memory=1 << 20,
        max_num_seqs=2,
    )
    return LLMEngine(args).executor


def test_blocks_move_between_two_uniproc_executors(tiny_folder) -> None:
    folder = tiny_folder("llama3")
    prefill, decode = _tiny_executor(folder), _tiny_executor(folder)
    layout = prefill.kv_layout()
    assert decode.kv_layout() == layout and layout.mismatch(decode.kv_layout()) is None
    source = prefill.worker._kv_tensors()
    assert len(source) == layout.num_layers and layout.tp_size == 1
    for cache in source:
        cache.copy_(torch.randn_like(cache))
    payload = prefill.export_kv_blocks([3, 1, 2])
    payload.check(layout, 3)
    decode.import_kv_blocks([7, 8, 9], payload)
    for src, dst in zip(source, decode.worker._kv_tensors(), strict=True):
        assert torch.equal(dst[:, [7, 8, 9]], src[:, [3, 1, 2]])
    with pytest.raises(ValueError, match="layers"):
        decode.import_kv_blocks([7], BlockPayload(payload.layers[:1]))
    decode.worker.state_specs = (None, object())  # as a hybrid model's state layer
    with pytest.raises(ValueError, match="state layers"):
        decode.kv_layout()


class FakeRank:
    """One worker process's KV side, in-process: its shard of a whole cache."""

    def __init__(self, layout: KVLayout, shard: KVShard, whole: list[torch.Tensor]) -> None:
        self.layout, self.shard = layout, shard
        heads = slice(shard.first_head, shard.first_head + shard.num_heads)
        chosen = whole[shard.first_layer : shard.first_layer + shard.num_layers]
        self.caches = [cache[:, :, :, heads].clone() for cache in chosen]

    def kv_layout(self) -> KVLayout:
        return self.layout

    def kv_shard(self) -> KVShard:
        return self.shard

    def export_kv_blocks_packed(self, block_ids: list[int]) -> list[PackedTensor]:
        return [PackedTensor.pack(layer) for layer in gather_blocks(self.caches, block_ids)]

    def import_kv_blocks_packed(self, block_ids: list[int], layers: list[PackedTensor]) -> None:
        scatter_blocks(self.caches, block_ids, [layer.unpack() for layer in layers])


def _fake_multiproc(layout: KVLayout, tp: int, pp: int, whole: list[torch.Tensor]):
    """A MultiprocExecutor whose calls reach ``FakeRank``s instead of worker processes."""
    from octavo.executor.multiproc_executor import MultiprocExecutor

    ranks = [FakeRank(layout, shard, whole) for shard in _shards(layout, tp, pp)]
    executor = object.__new__(MultiprocExecutor)
    executor.driver = (pp - 1) * tp
    executor.call = lambda method, *args: [getattr(r, method)(*args) for r in ranks]
    executor._call_each = lambda method, per_rank: [
        getattr(rank, method)(*args) for rank, args in zip(ranks, per_rank, strict=True)
    ]
    return executor, ranks


def test_multiproc_executor_joins_and_splits_tp2_pp2() -> None:
    layout = KVLayout("f", 4, 4, 4, 3, "float32", 2)
    whole = [torch.randn(2, 6, 4, 4, 3) for _ in range(4)]
    prefill, _ = _fake_multiproc(layout, 2, 2, whole)
    assert prefill.kv_layout() == layout
    payload = prefill.export_kv_blocks([5, 2])
    for cache, layer in zip(whole, payload.layers, strict=True):
        assert torch.equal(layer, cache[:, [5, 2]])
    decode_layout = KVLayout(**{**layout.to_dict(), "tp_size": 4})  # another TP size
    decode, ranks = _fake_multiproc(decode_layout, 4, 1, [torch.zeros(2, 6, 4, 4, 3)] * 4)
    decode.import_kv_blocks([0, 1], payload)
    for rank in ranks:
        head = rank.shard.first_head
        for index, cache in enumerate(rank.caches):
            assert torch.equal(cache[:, [0, 1], :, 0], whole[index][:, [5, 2], :, head])
