"""KV cache events in vLLM's format (``--kv-events-config``), read as llm-d's router reads them.

A ZMQ subscriber in the test (pyzmq + msgpack) takes the engine's messages: three frames
``[topic, 8-byte big-endian sequence, msgpack batch]``; the replay ROUTER socket gives
back missed batches. Payloads are also read field by field as llm-d-kv-cache v0.9.0's
vLLM adapter (pkg/kvevents/engineadapter/vllm_adapter.go) reads them, so a drift of the
format breaks a test here. Sockets are on 127.0.0.1 with ports the OS picks.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from dataclasses import dataclass
from typing import Any

import msgpack
import pytest
import zmq

from octavo.config import EngineArgs
from octavo.engine.llm_engine import LLMEngine
from octavo.kv_cache.block_hash import HashChain
from octavo.kv_cache.block_pool import BlockPool
from octavo.kv_cache.kv_cache_manager import KVCacheManager
from octavo.kv_events import config as config_module
from octavo.kv_events import publisher as publisher_module
from octavo.kv_events.config import KVEventsConfig
from octavo.kv_events.events import BlockStored, KVEventBatch, wire_hash
from octavo.kv_events.pacing import ThrottledWarning, TokenBucket
from octavo.kv_events.publisher import NullEventPublisher, ZmqEventPublisher, start_publisher
from octavo.lora_request import LoRARequest
from octavo.sampling_params import SamplingParams
from octavo.scheduler.sequence import block_keys

from serve_args import clean_environment, parse  # noqa: F401 (an autouse fixture)

BLOCK = 16
TOPIC = "kv@pod-a@tiny"
END_SEQ = (-1).to_bytes(8, "big", signed=True)
RECEIVE_SECONDS = 10.0
# llm-d-kv-cache v0.9.0, vllm_adapter.go: a map-encoded event's fields in the positions
# its converters read (the tag is position 0).
LLMD_BLOCK_STORED_ORDER = (
    *("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id"),
    *("medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind"),
    "kv_cache_spec_sliding_window",
)
LLMD_BLOCK_REMOVED_ORDER = ("block_hashes", "medium", "group_idx")


# ----- a subscriber, as llm-d's ------------------------------------------------------------
@pytest.fixture
def context():
    return zmq.Context.instance()


def bound_subscriber(context, topic: str = "") -> tuple[zmq.Socket, str]:
    """A SUB socket bound to a free port; publishers given its address connect to it."""
    sub = context.socket(zmq.SUB)
    sub.setsockopt_string(zmq.SUBSCRIBE, topic)
    sub.bind("tcp://127.0.0.1:0")
    return sub, sub.getsockopt_string(zmq.LAST_ENDPOINT)


def receive(sub: zmq.Socket, timeout: float = RECEIVE_SECONDS) -> list[bytes] | None:
    if not sub.poll(int(timeout * 1000)):
        return None
    return sub.recv_multipart()


def replay(context, endpoint: str, start: int) -> list[list[bytes]]:
    """Ask the replay socket for batches from ``start`` on, as llm-d's DEALER does; the
    frames after the empty delimiter, up to and including the end marker."""
    dealer = context.socket(zmq.DEALER)
    dealer.connect(endpoint)
    try:
        dealer.send_multipart([b"", start.to_bytes(8, "big")])
        answers = []
        while dealer.poll(int(RECEIVE_SECONDS * 1000)):
            frames = dealer.recv_multipart()
            assert frames[0] == b"", "a ROUTER reply starts with the empty delimiter"
            answers.append(frames[1:])
            if frames[1:] == [b"", END_SEQ, b""]:
                return answers
        raise AssertionError(f"no end marker from the replay socket after {answers}")
    finally:
        dealer.close(linger=0)


def replay_until(context, endpoint: str, last_seq: int) -> list[list[bytes]]:
    """Replay from 0 once batch ``last_seq`` has been sent (the thread sends them)."""
    deadline = time.monotonic() + RECEIVE_SECONDS
    while True:
        frames = replay(context, endpoint, 0)[:-1]
        if (frames and seq_of(frames[-1]) >= last_seq) or time.monotonic() > deadline:
            return frames
        time.sleep(0.25)  # within the replay socket's pace (REPLAY_RATE a second)


def seq_of(message: list[bytes]) -> int:
    return int.from_bytes(message[1], "big")


def decode(message: list[bytes]) -> list[Any]:
    """A batch as llm-d decodes it: [ts, events, data_parallel_rank]."""
    return msgpack.unpackb(message[2])


def events_of(messages: list[list[bytes]]) -> list[dict[str, Any]]:
    return [event for message in messages for event in decode(message)[1]]


def llmd_fields(event: Any) -> list[Any]:
    """An event in the positional layout llm-d's converters read (its mapEventToFields)."""
    if isinstance(event, list):
        return event
    order = {"BlockStored": LLMD_BLOCK_STORED_ORDER, "BlockRemoved": LLMD_BLOCK_REMOVED_ORDER}
    return [event["type"], *(event.get(name) for name in order.get(event["type"], ()))]


def of_type(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [event for event in events if event["type"] == kind]


def config(**values: Any) -> KVEventsConfig:
    return KVEventsConfig(enable_kv_cache_events=True, **values)


# ----- the flag ------------------------------------------------------------------------------
def configs(*argv: str) -> EngineArgs:
    from octavo.entrypoints.openai import options

    args = parse(*argv)
    return EngineArgs(
        model=args.model, **{o.dest: getattr(args, o.dest) for o in options.ENGINE_OPTIONS}
    )


def test_the_flag_takes_vllms_json_with_vllms_defaults():
    parsed = configs("--kv-events-config", '{"enable_kv_cache_events": true}').kv_events_config
    assert parsed == KVEventsConfig(
        enable_kv_cache_events=True,
        publisher="zmq",
        endpoint=None,  # port 5557 of the server's --host; vLLM's tcp://*:5557 without one
        replay_endpoint=None,
        buffer_steps=10_000,
        hwm=100_000,
        max_queue_size=100_000,
        topic="",
    )
    assert parsed.publishes
    assert (parsed.publish_endpoint, parsed.publish_binds) == ("tcp://*:5557", True)
    full = (
        '{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:6000", '
        '"replay_endpoint": "tcp://*:6001", "buffer_steps": 5, "hwm": 7, '
        '"max_queue_size": 9, "topic": "kv@p@m"}'
    )
    assert configs("--kv-events-config", full).kv_events_config == KVEventsConfig(
        True, "zmq", "tcp://*:6000", "tcp://*:6001", 5, 7, 9, "kv@p@m"
    )
    off = KVEventsConfig.parse('{"enable_kv_cache_events": false}')
    assert off.publisher == "null" and not off.publishes  # vLLM: null unless enabled
    assert not config(publisher="null").publishes
    offline = EngineArgs(kv_events_config={"enable_kv_cache_events": True, "topic": "t"})
    assert offline.kv_events_config == config(topic="t")  # LLM(kv_events_config={...})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"enable_kv_cache_events": true', "not JSON"),
        ('["zmq"]', "expected a JSON object"),
        ('{"enable_kv_cache_events": true, "publisher": "kafka"}', "unknown publisher 'kafka'"),
        ('{"enable_kv_cache_events": true, "port": 5557}', "unknown keys ['port']"),
        ('{"enable_kv_cache_events": "yes"}', "enable_kv_cache_events must be true or false"),
        ('{"enable_kv_cache_events": true, "endpoint": "*:5557"}', "endpoint must be a ZMQ"),
        ('{"enable_kv_cache_events": true, "buffer_steps": -1}', "buffer_steps must be"),
        ('{"enable_kv_cache_events": true, "hwm": 1.5}', "hwm must be a non-negative"),
        ('{"enable_kv_cache_events": true, "topic": 3}', "topic must be a string"),
    ],
)
def test_bad_config_is_refused_at_startup_saying_why(capsys, text, message):
    with pytest.raises(SystemExit):
        parse("--kv-events-config", text)
    assert f"--kv-events-config: kv_events_config: {message}" in capsys.readouterr().err
    with pytest.raises(ValueError, match="kv_events_config: "):
        EngineArgs(kv_events_config=text)


def test_a_port_in_use_is_a_clear_error_at_start():
    first = ZmqEventPublisher(
        config(endpoint="inproc://kv-taken", replay_endpoint="tcp://127.0.0.1:0")
    )
    try:
        with pytest.raises(ValueError, match=r"cannot bind replay_endpoint .* in use"):
            ZmqEventPublisher(
                config(endpoint="inproc://kv-other", replay_endpoint=first.replay_endpoint)
            )
    finally:
        first.shutdown()


# ----- the pool and the kv cache manager ---------------------------------------------------
def test_events_are_off_by_default():
    assert EngineArgs().kv_events_config is None
    pool = BlockPool(8)
    kv = KVCacheManager(pool, 4)
    assert kv.allocate_slots(1, 0, 8)
    kv.cache_full_blocks(1, list(range(8)), 8)
    pool.reset_prefix_cache()
    assert pool.events is None and pool.take_events() == []
    assert isinstance(start_publisher(None), NullEventPublisher)
    assert isinstance(start_publisher(KVEventsConfig()), NullEventPublisher)
    assert isinstance(start_publisher(config(publisher="null")), NullEventPublisher)


def recording(num_blocks: int = 8, block_size: int = 4) -> tuple[BlockPool, KVCacheManager]:
    pool = BlockPool(num_blocks, record_events=True)
    return pool, KVCacheManager(pool, block_size)


def test_registered_blocks_are_one_chained_block_stored():
    pool, kv = recording()
    tokens = list(range(100, 114))  # three full blocks of 4 and two tokens
    assert kv.allocate_slots(1, 0, len(tokens))
    kv.cache_full_blocks(1, tokens, 8)
    kv.cache_full_blocks(1, tokens, 14)
    first, second = pool.take_events()
    hashes = kv.tables[1].hashes
    assert first == BlockStored([wire_hash(h) for h in hashes[:2]], None, tokens[:8], 4)
    assert second == BlockStored([wire_hash(hashes[2])], wire_hash(hashes[1]), tokens[8:12], 4)
    assert hashes[1] == kv.hasher.hash_block(hashes[0], tuple(tokens[4:8]))
    assert pool.take_events() == []  # taken once


def test_blocks_cached_already_are_not_stored_again():
    pool, kv = recording(16)
    shared = list(range(8))
    assert kv.allocate_slots(1, 0, 12)
    kv.cache_full_blocks(1, [*shared, 1, 2, 3, 4], 12)
    pool.take_events()
    assert kv.allocate_slots(2, 0, 12)  # no prefix lookup: its own blocks, same hashes
    kv.cache_full_blocks(2, [*shared, 5, 6, 7, 8], 12)
    (stored,) = pool.take_events()
    hashes = kv.tables[2].hashes
    assert stored == BlockStored([wire_hash(hashes[2])], wire_hash(hashes[1]), [5, 6, 7, 8], 4)


def test_a_lora_chain_hashes_its_adapter_but_names_no_parent():
    pool, kv = recording()
    adapter = LoRARequest("sql", 3, "/adapters/sql")
    chain = HashChain(block_keys(adapter, None))
    assert kv.allocate_slots(1, 0, 8)
    kv.cache_full_blocks(1, list(range(8)), 8, chain, adapter)
    (stored,) = pool.take_events()
    first = kv.hasher.hash_block(None, (0, 1, 2, 3), (("lora", "sql", "/adapters/sql"),))
    assert stored.block_hashes[0] == wire_hash(first)
    assert first != kv.hasher.hash_block(None, (0, 1, 2, 3))  # the base model's block
    assert stored.parent_block_hash is None  # the seed is no block (as vLLM: lora in keys)
    assert (stored.lora_id, stored.lora_name) == (3, "sql")


def test_reused_cached_blocks_are_block_removed_with_exactly_their_hashes():
    pool, kv = recording(5)  # 4 usable blocks
    assert kv.allocate_slots(1, 0, 8)
    kv.cache_full_blocks(1, list(range(8)), 8)
    cached = kv.tables[1].hashes
    kv.free(1)
    pool.take_events()
    assert kv.allocate_slots(2, 0, 8)  # the 2 uncached blocks go first
    assert pool.take_events() == []  # nothing cached was reused yet
    assert kv.allocate_slots(2, 8, 4)  # then the cached ones, least recently freed first
    (removed,) = pool.take_events()
    assert removed.block_hashes == [wire_hash(cached[1])]  # the tail of a chain goes first
    assert removed.medium == "GPU"


def test_resetting_the_prefix_cache_clears_all_or_removes_the_free_ones():
    pool, kv = recording()
    assert kv.allocate_slots(1, 0, 4) and kv.allocate_slots(2, 0, 4)
    kv.cache_full_blocks(1, [1, 2, 3, 4], 4)
    kv.cache_full_blocks(2, [5, 6, 7, 8], 4)
    kv.free(1)
    pool.take_events()
    pool.reset_prefix_cache()  # sequence 2 still holds its block: that hash stays
    (removed,) = pool.take_events()
    assert removed.block_hashes == [wire_hash(kv.hasher.hash_block(None, (1, 2, 3, 4)))]
    kv.free(2)
    pool.reset_prefix_cache()  # nothing in use: the whole cache (vLLM's AllBlocksCleared)
    assert [type(e).__name__ for e in pool.take_events()] == ["AllBlocksCleared"]
    assert not pool.cached


# ----- the publisher -------------------------------------------------------------------------
def synced(context, cfg: KVEventsConfig) -> tuple[ZmqEventPublisher, zmq.Socket, int]:
    """A publisher connected to a bound subscriber that surely receives: batches are sent
    until one arrives (a PUB drops what it sends before the subscription reaches it).
    Returns the next sequence number the subscriber will see."""
    sub, address = bound_subscriber(context, cfg.topic)
    publisher = ZmqEventPublisher(dataclasses.replace(cfg, endpoint=address))
    for _ in range(200):
        publisher.publish(KVEventBatch(time.time(), []))
        message = receive(sub, 0.05)
        if message is not None:
            while (more := receive(sub, 0.2)) is not None:
                message = more
            return publisher, sub, seq_of(message) + 1
    raise AssertionError("the subscriber never received a batch")


def test_frames_are_topic_then_8_byte_big_endian_sequence_then_the_batch(context):
    publisher, sub, next_seq = synced(context, config(topic=TOPIC))
    try:
        for index in range(3):
            publisher.publish(
                KVEventBatch(1000.0 + index, [BlockStored([2**63 + index], None, [1] * 16, 16)])
            )
        messages = [receive(sub) for _ in range(3)]
    finally:
        publisher.shutdown()
        sub.close(linger=0)
    for index, message in enumerate(messages):
        assert message is not None and len(message) == 3
        topic, seq, payload = message
        assert topic == TOPIC.encode() and len(seq) == 8
        assert int.from_bytes(seq, "big") == next_seq + index  # +1 a batch, no gap
        ts, events, rank = msgpack.unpackb(payload)
        assert (ts, rank) == (1000.0 + index, 0)
        assert events[0]["block_hashes"] == [2**63 + index]


def test_the_replay_socket_returns_the_kept_batches_from_a_sequence_number_on(context):
    publisher = ZmqEventPublisher(
        config(
            endpoint="inproc://kv-replay",
            replay_endpoint="tcp://127.0.0.1:0",
            buffer_steps=4,
            topic=TOPIC,
        )
    )
    try:
        for index in range(6):  # sequence numbers 0..5; the last 4 (2..5) are kept
            publisher.publish(KVEventBatch(float(index), []))
        kept = replay_until(context, publisher.replay_endpoint, 5)
        answer = replay(context, publisher.replay_endpoint, 3)
    finally:
        publisher.shutdown()
    assert [seq_of(m) for m in kept] == [2, 3, 4, 5]
    assert [seq_of(m) for m in answer[:-1]] == [3, 4, 5]
    assert all(m[0] == TOPIC.encode() and len(m) == 3 for m in answer[:-1])
    assert [decode(m)[0] for m in answer[:-1]] == [3.0, 4.0, 5.0]
    assert answer[-1] == [b"", END_SEQ, b""]  # vLLM's end marker: seq -1, empty payload


def test_replay_requests_are_paced_and_malformed_ones_logged_once_per_interval(
    context, monkeypatch, caplog
):
    """A replay answer may resend every kept batch: past the bucket's burst, requests go
    unanswered; 20 malformed requests make one warning line, not 20."""
    monkeypatch.setattr(publisher_module, "REPLAY_RATE", 0.001)
    monkeypatch.setattr(publisher_module, "REPLAY_BURST", 3)
    publisher = ZmqEventPublisher(
        config(endpoint="inproc://kv-paced", replay_endpoint="tcp://127.0.0.1:0")
    )
    dealer = context.socket(zmq.DEALER)
    dealer.connect(publisher.replay_endpoint)
    caplog.set_level(logging.WARNING, logger=publisher_module.logger.name)
    try:
        for _ in range(20):
            dealer.send_multipart([b"", b"short"])  # malformed: no 8-byte sequence number
        for _ in range(5):
            dealer.send_multipart([b"", (0).to_bytes(8, "big")])
        ends = 0
        while dealer.poll(1500):
            ends += dealer.recv_multipart()[1:] == [b"", END_SEQ, b""]
    finally:
        dealer.close(linger=0)
        publisher.shutdown()
    assert ends == 0, "the burst of 3 went to the first malformed requests"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "KV events: ignored 1 malformed replay request(s)",
        "KV events: dropped 1 replay request(s) over 0.001 a second",
    ]


def test_the_pacing_bucket_and_the_warning_count_with_a_clock():
    now = [0.0]
    bucket = TokenBucket(rate=2.0, burst=2.0, clock=lambda: now[0])
    assert [bucket.take() for _ in range(3)] == [True, True, False]
    now[0] = 0.5  # one token back
    assert [bucket.take(), bucket.take()] == [True, False]
    lines: list[str] = []

    class Recorder(logging.Logger):
        def warning(self, message, *args, **kwargs):
            lines.append(message % args)

    warning = ThrottledWarning(Recorder("x"), "%d bad", interval=60.0, clock=lambda: now[0])
    for moment in (0.0, 1.0, 2.0, 59.0, 61.0, 62.0):
        now[0] = moment
        warning.note()
    assert lines == ["1 bad", "4 bad"]


def test_an_unnamed_endpoint_binds_on_the_servers_host(monkeypatch):
    """vLLM binds tcp://*:5557 whatever --host says: every subscriber on the network reads
    every user's token ids. Octavo binds the server's host unless the endpoint is named."""
    on_host = config()
    on_host.server_host = "127.0.0.1"
    assert (on_host.publish_endpoint, on_host.publish_binds) == ("tcp://127.0.0.1:5557", True)
    for host, address in [("0.0.0.0", "*"), ("::1", "[::1]"), ("localhost", "localhost")]:
        on_host.server_host = host
        assert on_host.publish_endpoint == f"tcp://{address}:5557"
    named = config(endpoint="tcp://*:6000")
    named.server_host = "127.0.0.1"
    assert (named.publish_endpoint, named.publish_binds) == ("tcp://*:6000", True)
    assert not config(endpoint="tcp://10.0.0.1:6000").publish_binds  # vLLM: connect
    monkeypatch.setattr(config_module, "DEFAULT_PORT", 0)
    on_host.server_host = "127.0.0.1"
    publisher = ZmqEventPublisher(on_host)
    try:
        assert publisher.endpoint.startswith("tcp://127.0.0.1:")
    finally:
        publisher.shutdown()


def test_serve_hands_its_host_to_the_kv_events(monkeypatch, tiny_folder):
    from octavo.cli import main
    from octavo.entrypoints.openai import server

    seen = []

    def run_server(config, engine_args, listen) -> int:
        seen.append((engine_args.kv_events_config, listen.host))
        return 0

    monkeypatch.setattr(server, "run_server", run_server)
    events = '{"enable_kv_cache_events": true}'
    folder = str(tiny_folder("llama3"))
    assert main(["serve", folder, "--host", "127.0.0.2", "--kv-events-config", events]) == 0
    ((events_config, host),) = seen
    assert host == "127.0.0.2"
    assert events_config.publish_endpoint == "tcp://127.0.0.2:5557"


def test_a_started_publisher_first_announces_an_empty_cache(context):
    publisher = start_publisher(
        config(endpoint="inproc://kv-start", replay_endpoint="tcp://127.0.0.1:0")
    )
    try:
        (first,) = replay_until(context, publisher.replay_endpoint, 0)
    finally:
        publisher.shutdown()
    assert seq_of(first) == 0
    assert [llmd_fields(e) for e in decode(first)[1]] == [["AllBlocksCleared"]]


# ----- an engine -----------------------------------------------------------------------------
@dataclass
class Scenario:
    engine: LLMEngine
    sub: zmq.Socket
    events_config: dict[str, Any]
    live: list[list[bytes]]  # what the subscriber received from the requests on
    first_prompt: list[int]  # three full blocks
    first_hashes: list[int]  # their chain hashes, computed here


def run(engine: LLMEngine, request_id: str, prompt: list[int]) -> None:
    engine.add_request(request_id, prompt, SamplingParams(temperature=0.0, max_tokens=1))
    while engine.has_unfinished_requests():
        engine.step()


def random_prompt(rng: random.Random, length: int) -> list[int]:
    return [rng.randrange(10, 40_000) for _ in range(length)]


def tiny_engine(folder, events_config: dict[str, Any] | None, **engine: Any) -> LLMEngine:
    """8 usable blocks of 16 tokens (9 with the null block), fp32 whatever the CPU."""
    token_bytes = 2 * 2 * 1 * 16 * 4  # (k, v) × layers × kv heads × head dims × fp32
    args = EngineArgs(
        model=str(folder),
        dtype="float32",
        block_size=BLOCK,
        max_model_len=8 * BLOCK,
        kv_cache_memory=9 * BLOCK * token_bytes,
        max_num_seqs=4,
        kv_events_config=events_config,
        **engine,
    )
    engine = LLMEngine(args)
    assert engine.parts.pool.num_usable_blocks == 8
    return engine


@pytest.fixture(scope="module")
def scenario(tiny_folder):
    """One engine, a subscriber that surely receives, then: a prompt of three full blocks,
    and a prompt that takes every block (so the first prompt's cached blocks are reused)."""
    context, rng = zmq.Context.instance(), random.Random(29)
    sub, address = bound_subscriber(context, "kv@")
    events_config = {
        "enable_kv_cache_events": True,
        "endpoint": address,
        "replay_endpoint": "tcp://127.0.0.1:0",
        "topic": TOPIC,
    }
    engine = tiny_engine(tiny_folder("llama3"), events_config)
    for index in range(100):  # one block each, until the subscription has reached it
        run(engine, f"probe-{index}", random_prompt(rng, BLOCK + 1))
        if receive(sub, 0.1) is not None:
            break
    while receive(sub, 0.3) is not None:
        pass
    engine.parts.pool.reset_prefix_cache()  # the probes' blocks: only the test's are cached
    first = random_prompt(rng, 3 * BLOCK)
    run(engine, "first", first)
    run(engine, "fills-the-cache", random_prompt(rng, 8 * BLOCK - 1))
    live = []
    while (message := receive(sub, 0.5)) is not None:
        live.append(message)
    hashes = engine.kv.hasher.extend(HashChain(), first, BLOCK, 3)
    yield Scenario(engine, sub, events_config, live, first, hashes)
    engine.shutdown()
    sub.close(linger=0)


def test_a_prompt_of_three_blocks_publishes_them_chained_with_their_tokens(scenario):
    expected = [wire_hash(h) for h in scenario.first_hashes]
    stored = of_type(events_of(scenario.live), "BlockStored")
    first = [e for e in stored if set(e["block_hashes"]) & set(expected)]
    hashes = [h for e in first for h in e["block_hashes"]]
    assert hashes == expected  # 3 blocks, in order, each stored once
    assert [t for e in first for t in e["token_ids"]] == scenario.first_prompt
    parents = [e["parent_block_hash"] for e in first]
    assert parents[0] is None  # a first block
    for event in first[1:]:  # each event's parent: the block before its first one
        assert event["parent_block_hash"] == hashes[hashes.index(event["block_hashes"][0]) - 1]
    assert all(e["block_size"] == BLOCK and e["lora_id"] is None for e in first)


def test_reusing_the_cached_blocks_publishes_block_removed_of_exactly_their_hashes(scenario):
    removed = of_type(events_of(scenario.live), "BlockRemoved")
    hashes = [h for e in removed for h in e["block_hashes"]]
    assert sorted(hashes) == sorted(wire_hash(h) for h in scenario.first_hashes)


def test_live_sequence_numbers_count_up_by_one(scenario):
    seqs = [seq_of(m) for m in scenario.live]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))) and len(seqs) >= 2
    assert all(m[0] == TOPIC.encode() for m in scenario.live)


def test_the_replay_socket_returns_the_batches_the_subscriber_missed(scenario):
    endpoint = scenario.engine.kv_events.replay_endpoint
    missed_from = seq_of(scenario.live[0])
    answer = replay(zmq.Context.instance(), endpoint, missed_from)
    assert [m[1:] for m in answer[:-1]] == [m[1:] for m in scenario.live]
    everything = replay(zmq.Context.instance(), endpoint, 0)
    assert seq_of(everything[0]) == 0
    assert [llmd_fields(e) for e in decode(everything[0])[1]] == [["AllBlocksCleared"]]


def test_payloads_read_field_by_field_as_llm_ds_vllm_adapter_reads_them(scenario):
    stored = removed = None
    for message in scenario.live:
        ts, events, rank = decode(message)  # msgpackVLLMEventBatch: ts, events, rank
        assert isinstance(ts, float) and rank == 0
        for event in events:
            fields = llmd_fields(event)
            stored = fields if fields[0] == "BlockStored" else stored
            removed = fields if fields[0] == "BlockRemoved" else removed
    assert stored is not None and removed is not None
    _, hashes, parent, tokens, size, lora_id, medium, lora_name, *extra = stored
    assert all(2**63 <= h < 2**64 for h in hashes)  # full 8-byte uint64s, never 0
    assert parent is None or 2**63 <= parent < 2**64
    assert len(tokens) == size * len(hashes) and size == BLOCK
    assert (lora_id, medium, lora_name) == (None, "GPU", None)
    assert extra == [None] * 4  # no extra keys (llm-d reads strings there as MM hashes)
    assert removed[2] == "GPU" and all(2**63 <= h < 2**64 for h in removed[1])


def test_a_restarted_engine_publishes_all_blocks_cleared_from_sequence_0(scenario, tiny_folder):
    restarted = tiny_engine(tiny_folder("llama3"), scenario.events_config)
    try:
        (first,) = replay_until(zmq.Context.instance(), restarted.kv_events.replay_endpoint, 0)
    finally:
        restarted.shutdown()
    assert seq_of(first) == 0
    assert [llmd_fields(e) for e in decode(first)[1]] == [["AllBlocksCleared"]]


def test_an_engine_without_the_flag_opens_no_socket(tiny_folder, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a ZMQ publisher was started")

    monkeypatch.setattr(publisher_module, "ZmqEventPublisher", refuse)
    engine = tiny_engine(tiny_folder("llama3"), None)
    try:
        run(engine, "plain", list(range(100, 100 + 3 * BLOCK)))
        assert isinstance(engine.kv_events, NullEventPublisher)
        assert engine.parts.pool.events is None
    finally:
        engine.shutdown()


def test_an_adapters_blocks_name_it_and_hash_it(tiny_folder, tmp_path):
    from lora_adapters import make_adapter

    base = tiny_folder("llama3")
    adapter = LoRARequest("sql", 1, str(make_adapter(base, tmp_path / "sql", seed=1, rank=4)))
    events_config = {
        "enable_kv_cache_events": True,
        "endpoint": "inproc://kv-lora",
        "replay_endpoint": "tcp://127.0.0.1:0",
    }
    engine = tiny_engine(base, events_config, enable_lora=True, max_lora_rank=4)
    prompt = list(range(200, 200 + 2 * BLOCK + 1))
    try:
        engine.add_request("lora", prompt, SamplingParams(max_tokens=1), lora_request=adapter)
        while engine.has_unfinished_requests():
            engine.step()
        batches = replay_until(zmq.Context.instance(), engine.kv_events.replay_endpoint, 1)
    finally:
        engine.shutdown()
    (stored,) = of_type(events_of(batches), "BlockStored")
    chain = HashChain(block_keys(adapter, None))
    hashes = engine.kv.hasher.extend(chain, prompt, BLOCK, 2)
    assert stored["block_hashes"] == [wire_hash(h) for h in hashes]
    assert stored["parent_block_hash"] is None  # the seed is no block llm-d could know
    assert (stored["lora_id"], stored["lora_name"]) == (1, "sql")
    assert stored["token_ids"] == prompt[: 2 * BLOCK]
