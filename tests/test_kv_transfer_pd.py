"""Prefill/decode disaggregation end to end (``--kv-transfer-config``, vLLM's NixlConnector
contract): a prefill engine keeps a prompt's blocks under a lease and answers
``kv_transfer_params``; a decode engine pulls them over the TCP side channel and decodes
without computing the prompt again; greedy tokens equal one engine running the request.

Engines of one tiny random Llama (fp32, CPU) in this process; the prefill engine's idle
core-loop work (side channel reads and frees) runs on a thread (``serving``) while the test
steps the decode engine, as two servers' core loops would.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from octavo.config import EngineArgs
from octavo.engine.llm_engine import LLMEngine
from octavo.kv_cache.block_hash import BlockKeys, HashChain
from octavo.kv_transfer.block_io import MAX_READ_BYTES
from octavo.kv_transfer.config import KVTransferConfig
from octavo.kv_transfer.params import parse_kv_transfer_params
from octavo.kv_transfer.side_channel import BadRequest
from octavo.outputs import RequestOutput
from octavo.sampling_params import SamplingParams

from conftest import tiny_server
from server_harness import metric_value

BLOCK_BYTES = 4096  # llama3 tiny: 2 planes x 16 tokens x 1 head x 16 dims x 4 bytes x 2 layers
PROMPT = [100 + (7 * i) % 900 for i in range(40)]  # 3 blocks: 2 full, 8 tokens in the last
OTHER = [50 + (11 * i) % 900 for i in range(37)]
MAX_TOKENS = 6


def transfer_config(policy: str = "fail") -> dict:
    return {
        "kv_connector": "NixlConnector",
        "kv_role": "kv_both",
        "kv_load_failure_policy": policy,
        "kv_connector_extra_config": {"kv_lease_duration": 30},
    }


@contextmanager
def side_channel_on_loopback() -> Iterator[None]:
    """Side channels on 127.0.0.1, each on a free port (vLLM's environment variables)."""
    names = ("VLLM_NIXL_SIDE_CHANNEL_HOST", "VLLM_NIXL_SIDE_CHANNEL_PORT")
    saved = {name: os.environ.get(name) for name in names}
    os.environ.update(dict(zip(names, ("127.0.0.1", "0"), strict=True)))
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def engine(folder, policy: str = "fail") -> LLMEngine:
    return LLMEngine(
        EngineArgs(
            model=str(folder),
            device="cpu",
            dtype="float32",
            max_model_len=144,
            kv_cache_memory=64 * BLOCK_BYTES,
            kv_transfer_config=transfer_config(policy),
        )
    )


@pytest.fixture(scope="module")
def engines(tiny_folder) -> Iterator[tuple[LLMEngine, LLMEngine]]:
    folder = tiny_folder("llama3")
    with side_channel_on_loopback():
        prefill, decode = engine(folder), engine(folder)
    yield prefill, decode
    prefill.shutdown()
    decode.shutdown()


@contextmanager
def serving(engine: LLMEngine) -> Iterator[None]:
    """The engine's idle core-loop work (its side channel's reads and frees) on a thread."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            engine.serve_transfers()
            stop.wait(0.002)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def run_all(engine: LLMEngine, requests: dict[str, tuple]) -> dict[str, RequestOutput]:
    """Run ``{request id: (prompt, params)}`` together; their final outputs by id."""
    for request_id, (prompt, params) in requests.items():
        engine.add_request(request_id, prompt, params)
    finals: dict[str, RequestOutput] = {}
    deadline = time.monotonic() + 60
    while len(finals) < len(requests):
        assert time.monotonic() < deadline, f"unfinished: {set(requests) - set(finals)}"
        outputs = engine.step()  # (an earlier test's aborted request may report here too)
        finals.update({o.request_id: o for o in outputs if o.finished and o.request_id in requests})
    return finals


def run(engine: LLMEngine, request_id: str, prompt: list[int], params) -> RequestOutput:
    return run_all(engine, {request_id: (prompt, params)})[request_id]


def greedy(**fields) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, **fields)


def prefill(engine: LLMEngine, request_id: str, prompt: list[int], **fields) -> dict:
    """The prefill engine's answer (``fields``: more sampling params, e.g. the cache salt
    the decode request will send too, as the routing sidecar sends one body to both)."""
    params = SamplingParams(
        **{"temperature": 0, "max_tokens": 1, "ignore_eos": True, **fields},
        kv_transfer_params={"do_remote_decode": True},
    )
    answer = run(engine, request_id, prompt, params).kv_transfer_params
    assert answer is not None
    return answer


def reference(engine: LLMEngine, prompt: list[int], name: str) -> list[int]:
    """One engine running the whole request (its own salt: nothing cached is shared)."""
    output = run(engine, f"ref-{name}", prompt, greedy(cache_salt=f"reference {name}"))
    return output.outputs[0].token_ids


def record_scheduled(engine: LLMEngine) -> list[tuple[int, int, int]]:
    """Every scheduled sequence as (seq id, computed before, tokens computed)."""
    seen: list[tuple[int, int, int]] = []
    execute = engine.executor.execute_model

    def recording(step):
        for s in step.scheduled:
            seen.append((s.seq_id, s.num_computed_tokens, len(s.token_ids)))
        return execute(step)

    engine.executor.execute_model = recording
    return seen


def wait_until(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_the_decode_engine_continues_a_remote_prefill_with_the_same_tokens(engines):
    p, d = engines
    free_before = p.parts.pool.num_free_blocks
    answer = prefill(p, "p1", PROMPT, cache_salt="one")
    assert answer["do_remote_prefill"] is True and answer["do_remote_decode"] is False
    assert answer["remote_request_id"] == "p1" and answer["remote_host"] == "127.0.0.1"
    assert answer["remote_port"] == p.kv_transfer.server.port and answer["tp_size"] == 1
    assert answer["remote_engine_id"] == p.args.kv_transfer_config.engine_id
    assert len(answer["remote_block_ids"]) == 3 and answer["remote_num_tokens"] == len(PROMPT)
    assert p.parts.pool.num_free_blocks == free_before - 3, "the blocks are held"

    counters = d.kv_transfer.decode.counters
    received, bytes_before = counters.prompt_tokens_received, counters.bytes_received
    scheduled = record_scheduled(d)
    with serving(p):  # (its own cache salt: no local prefix hit on the decode engine)
        output = run(d, "d1", PROMPT, greedy(kv_transfer_params=answer, cache_salt="one"))
        wait_until(lambda: p.kv_transfer.prefill.num_held == 0)
    assert output.outputs[0].token_ids == reference(d, PROMPT, "one")
    assert scheduled[0][1:] == (len(PROMPT) - 1, 1), "only the last prompt token was computed"
    assert counters.prompt_tokens_received - received == len(PROMPT) - 1
    assert counters.bytes_received - bytes_before == 3 * BLOCK_BYTES
    assert p.parts.pool.num_free_blocks == free_before, "freed once the decode engine read them"


def test_blocks_the_decode_engine_holds_in_its_prefix_cache_are_not_fetched(engines):
    p, d = engines
    run(d, "warm", PROMPT, greedy(cache_salt="two"))  # the decode engine caches 2 full blocks
    answer = prefill(p, "p2", PROMPT, cache_salt="two")
    counters = d.kv_transfer.decode.counters
    received, bytes_before = counters.prompt_tokens_received, counters.bytes_received
    with serving(p):
        output = run(d, "d2", PROMPT, greedy(kv_transfer_params=answer, cache_salt="two"))
        wait_until(lambda: p.kv_transfer.prefill.num_held == 0)
    assert output.outputs[0].token_ids == reference(d, PROMPT, "cached")
    assert output.num_cached_tokens == 32, "two full blocks were local hits"
    assert counters.prompt_tokens_received - received == len(PROMPT) - 1 - 32
    assert counters.bytes_received - bytes_before == BLOCK_BYTES, "only the third block"


SAME_LENGTH = [300 + (13 * i) % 700 for i in range(len(PROMPT))]  # another prompt, as long


def test_a_lease_read_for_another_prompt_is_refused_and_recomputed(engines):
    p, d = engines
    answer = prefill(p, "p-mismatch", PROMPT, cache_salt="victim")
    counters = d.kv_transfer.decode.counters
    failures, bytes_before = counters.failures, counters.bytes_received
    d.kv_transfer.decode.recompute_on_failure = True  # kv_load_failure_policy: recompute
    try:
        with serving(p):  # the first prompt's params, sent with another prompt of its length
            forged = greedy(kv_transfer_params=answer, cache_salt="victim")
            output = run(d, "d-mismatch", SAME_LENGTH, forged)
            wait_until(lambda: p.kv_transfer.prefill.num_held == 0)
    finally:
        d.kv_transfer.decode.recompute_on_failure = False
    expected = reference(d, SAME_LENGTH, "mismatch")
    assert output.outputs[0].token_ids == expected
    assert counters.failures == failures + 1 and counters.bytes_received == bytes_before
    again = run(d, "d-mismatch-again", SAME_LENGTH, greedy(cache_salt="victim"))
    assert again.num_cached_tokens == 32, "its prefix cache holds the blocks it computed"
    assert again.outputs[0].token_ids == expected, "and they hold its own prompt's KV"


def test_a_stopped_prefill_is_held_and_read_in_several_chunks(engines):
    p, d = engines
    first_token = reference(d, PROMPT, "stop")[0]
    answer = prefill(
        p,
        "p-stop",
        PROMPT,
        max_tokens=4,
        ignore_eos=False,
        stop_token_ids=[first_token],
        cache_salt="chunks",
    )
    source = p.kv_transfer.server.source
    with pytest.raises(BadRequest, match="at most"):  # the prefill engine's own cap
        source.read("p-stop", answer["remote_lease_generation"], [0] * 10**6, "digest")
    reads: list[int] = []
    read = source.read
    source.read = lambda request_id, generation, block_ids, digest: (
        reads.append(len(block_ids)) or read(request_id, generation, block_ids, digest)
    )
    registered: list[bool] = []
    execute = d.executor.execute_model

    def registered_before_the_first_step(step):
        if step.scheduled and not registered:  # imported full blocks: cached at import
            chain = HashChain(BlockKeys(cache_salt="chunks"))
            found = d.scheduler.kv.lookup_prefix(PROMPT, chain).found
            registered.append(all(block is not None for block in found))
        return execute(step)

    d.executor.execute_model = registered_before_the_first_step
    d.kv_transfer.decode.read_bytes = BLOCK_BYTES  # one block a read
    try:
        with serving(p):
            output = run(
                d, "d-stop", PROMPT, greedy(kv_transfer_params=answer, cache_salt="chunks")
            )
            wait_until(lambda: p.kv_transfer.prefill.num_held == 0)
    finally:
        source.read, d.executor.execute_model = read, execute
        d.kv_transfer.decode.read_bytes = MAX_READ_BYTES
    assert reads == [1, 1, 1]
    assert registered == [True]
    assert output.outputs[0].token_ids == reference(d, PROMPT, "stop")


def expire_leases(engine: LLMEngine) -> None:
    """Run the engine's expiry check as if the lease duration had passed."""
    leases = engine.kv_transfer.prefill.leases
    clock = leases.clock
    leases.clock = lambda: clock() + 3600
    try:
        engine.serve_transfers()
    finally:
        leases.clock = clock


def test_an_expired_lease_fails_the_request_or_recomputes_by_the_policy(engines):
    p, d = engines
    answer = prefill(p, "p3", OTHER)
    free_before = p.parts.pool.num_free_blocks
    expire_leases(p)
    assert p.parts.pool.num_free_blocks == free_before + 3, "expired: freed"
    with serving(p):
        failed = run(d, "d3-fail", OTHER, greedy(kv_transfer_params=answer))
        assert failed.outputs[0].finish_reason == "error"
        assert "gone" in failed.error or "lease" in failed.error
        d.kv_transfer.decode.recompute_on_failure = True  # kv_load_failure_policy: recompute
        try:
            recomputed = run(d, "d3-recompute", OTHER, greedy(kv_transfer_params=answer))
        finally:
            d.kv_transfer.decode.recompute_on_failure = False
    assert recomputed.outputs[0].token_ids == reference(d, OTHER, "expired")
    assert d.kv_transfer.decode.counters.failures >= 2


def test_a_decode_request_aborted_while_waiting_frees_the_prefill_blocks(engines):
    p, d = engines
    answer = prefill(p, "p4", OTHER)
    with serving(p):
        d.add_request("d4", OTHER, greedy(kv_transfer_params=answer))
        d.abort_request("d4")
        wait_until(lambda: p.kv_transfer.prefill.num_held == 0)
    assert not d.scheduler.waiting_for_remote


def unused_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize("fault", ["prefill server gone", "another engine on that address"])
def test_a_failed_transfer_fails_only_the_request_it_held(engines, fault):
    p, d = engines
    answer = prefill(p, f"p5-{fault}", OTHER)
    if fault == "prefill server gone":
        held = {**answer, "remote_port": unused_port()}
    else:
        held = {**answer, "remote_engine_id": "an engine that restarted"}
    with serving(p):
        finals = run_all(
            d,
            {
                f"bystander {fault}": (PROMPT, greedy(cache_salt="bystander")),
                "d5": (OTHER, greedy(kv_transfer_params=held)),
            },
        )
    failed, bystander = finals["d5"], finals[f"bystander {fault}"]
    assert failed.outputs[0].finish_reason == "error" and "transfer" in failed.error
    assert bystander.outputs[0].token_ids == reference(d, PROMPT, "bystander")
    assert not d.scheduler.waiting_for_remote
    p.kv_transfer.release(f"p5-{fault}")


@pytest.mark.parametrize(
    "params",
    [
        "not an object",
        {"do_remote_decode": "yes"},
        {"do_remote_decode": True, "do_remote_prefill": True},
        {"do_remote_prefill": True},
        {
            "do_remote_prefill": True,
            "remote_engine_id": "e",
            "remote_request_id": "r",
            "remote_block_ids": [1, "2"],
            "remote_host": "h",
            "remote_port": 1,
            "remote_lease_generation": 1,
            "remote_num_tokens": 3,
        },
    ],
)
def test_malformed_kv_transfer_params_are_a_value_error(params):
    with pytest.raises(ValueError, match="kv_transfer_params"):
        SamplingParams(kv_transfer_params=params)


def test_kv_transfer_config_takes_vllms_fields_and_refuses_others():
    config = KVTransferConfig.parse(transfer_config("recompute"))
    assert config.recomputes_on_failure and config.lease_seconds == 30 and config.engine_id
    plain = KVTransferConfig.parse('{"kv_connector": "NixlConnector", "kv_role": "kv_both"}')
    assert plain.recomputes_on_failure  # the issue: gone blocks are recomputed, not an error
    for bad, named in [
        ({"kv_connector": "P2pNcclConnector", "kv_role": "kv_both"}, "kv_connector"),
        ({"kv_connector": "NixlConnector"}, "kv_role"),
        ({**transfer_config(), "kv_load_failure_policy": "retry"}, "kv_load_failure_policy"),
        ({**transfer_config(), "nonsense": 1}, "unknown keys"),
    ]:
        with pytest.raises(ValueError, match=named):
            KVTransferConfig.parse(bad)
    assert parse_kv_transfer_params({"do_remote_decode": False}) is None


def test_two_servers_hand_a_prompt_over_with_kv_transfer_params(tiny_folder):
    body = {"model": "tiny", "prompt": PROMPT, "temperature": 0, "ignore_eos": True}
    config = {"kv_transfer_config": transfer_config(), "max_model_len": 144, "dtype": "float32"}
    with (
        side_channel_on_loopback(),
        tiny_server(tiny_folder, "tiny", **config) as p_server,
        tiny_server(tiny_folder, "tiny", **config) as d_server,
        httpx.Client(base_url=p_server.url, timeout=60) as p_http,
        httpx.Client(base_url=d_server.url, timeout=60) as d_http,
    ):
        wanted = {"do_remote_decode": True, "do_remote_prefill": False}
        answer = p_http.post(
            "/v1/completions", json={**body, "max_tokens": 1, "kv_transfer_params": wanted}
        ).json()
        params = answer["kv_transfer_params"]
        assert params["do_remote_prefill"] is True and params["remote_block_ids"]
        decoded = d_http.post(
            "/v1/completions", json={**body, "max_tokens": 6, "kv_transfer_params": params}
        )
        alone = d_http.post("/v1/completions", json={**body, "max_tokens": 6, "cache_salt": "a"})
        assert decoded.status_code == 200, decoded.text
        assert decoded.json()["choices"][0]["text"] == alone.json()["choices"][0]["text"]
        assert "kv_transfer_params" not in alone.json()
        chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "temperature": 0}
        chat_answer = p_http.post(
            "/v1/chat/completions", json={**chat, "max_tokens": 1, "kv_transfer_params": wanted}
        ).json()["kv_transfer_params"]
        chat_decoded = d_http.post(
            "/v1/chat/completions",
            json={**chat, "max_tokens": 4, "kv_transfer_params": chat_answer, "ignore_eos": True},
        )
        chat_alone = d_http.post(
            "/v1/chat/completions",
            json={**chat, "max_tokens": 4, "cache_salt": "a", "ignore_eos": True},
        )
        assert chat_decoded.json()["choices"][0] == chat_alone.json()["choices"][0]
        reply = p_http.post(
            "/v1/responses",
            json={
                "model": "tiny",
                "input": "hi",
                "max_output_tokens": 1,
                "kv_transfer_params": wanted,
            },
        ).json()
        assert reply["kv_transfer_params"]["do_remote_prefill"] is True

        def leases(**labels: str) -> float:
            scrape = p_http.get("/metrics").text
            if labels:
                return metric_value(scrape, "vllm:kv_transfer_leases_total", **labels)
            return metric_value(scrape, "vllm:kv_transfer_leases_held")

        wait_until(lambda: leases(outcome="read") == 2)  # the prefill server's fresh stats
        assert leases() == 1, "the responses prefill's blocks wait for a decode"
        metrics = d_http.get("/metrics").text
        received = metric_value(
            metrics, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer"
        )
        assert received == len(PROMPT) - 1 + chat_answer["remote_num_tokens"] - 1
        assert metric_value(metrics, "vllm:kv_transfer_received_bytes_total") > 3 * BLOCK_BYTES
        malformed = d_http.post(
            "/v1/completions", json={**body, "kv_transfer_params": {"do_remote_prefill": 1}}
        )
        assert malformed.status_code == 400
        assert malformed.json()["error"]["param"] == "kv_transfer_params"
