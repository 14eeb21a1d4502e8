"""--otlp-traces-endpoint: a real server exports vLLM's ``llm_request`` span of each request
to a real OTLP receiver (gRPC, and http/protobuf), continuing the caller's W3C trace
context; its fields and gen_ai attributes are checked one by one."""

from __future__ import annotations

import logging
import secrets

import httpx
import pytest

from octavo.cli import main
from octavo.entrypoints.openai.context import ServerConfig
from octavo.tracing import PROTOCOL_ENV, SPAN_NAME
from otlp_receivers import GrpcReceiver, HttpReceiver, attributes_of

from server_harness import ThreadedServer, build_local_app, torch_threads

SERVED = "tiny-traced"
RECEIVERS = {"grpc": GrpcReceiver, "http/protobuf": HttpReceiver}
SPAN_KIND_SERVER = 2  # opentelemetry.proto.trace.v1.Span.SPAN_KIND_SERVER


@pytest.fixture(scope="module", params=list(RECEIVERS))
def traced(request, tiny_folder):
    """(server URL, receiver) for one OTLP protocol; spans are sent every 50 ms."""
    protocol = request.param
    with pytest.MonkeyPatch.context() as env, RECEIVERS[protocol]() as receiver:
        env.setenv(PROTOCOL_ENV, protocol)
        env.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
        config = ServerConfig(
            served_model_names=[SERVED],
            model_root=SERVED,
            enable_log_requests=True,  # both on_finish hooks run
            otlp_traces_endpoint=receiver.endpoint,
        )
        app = build_local_app(
            str(tiny_folder("llama3")), config, max_model_len=256, kv_cache_memory=8 << 20
        )
        with torch_threads(1), ThreadedServer(app) as server:
            yield server.wait_ready().url, receiver


def complete(url: str, headers: dict[str, str]) -> dict:
    body = {
        "model": SERVED,
        "prompt": "The quick brown fox",
        "max_tokens": 5,
        "temperature": 0.5,
        "top_p": 0.9,
        "ignore_eos": True,
    }
    response = httpx.post(f"{url}/v1/completions", json=body, headers=headers, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def test_request_span_continues_the_callers_trace(traced, caplog):
    url, receiver = traced
    trace_id, parent_id = secrets.token_hex(16), secrets.token_hex(8)
    headers = {"traceparent": f"00-{trace_id}-{parent_id}-01", "tracestate": "vendor=abc"}
    with caplog.at_level(logging.INFO, logger="octavo.requests"):
        reply = complete(url, headers)

    span = receiver.inbox.wait_for(lambda s: s.trace_id.hex() == trace_id)
    assert span.name == SPAN_NAME
    assert span.kind == SPAN_KIND_SERVER
    assert span.parent_span_id.hex() == parent_id
    assert span.trace_state == "vendor=abc"
    assert len(span.span_id) == 8 and span.span_id.hex() != parent_id
    assert 0 < span.start_time_unix_nano < span.end_time_unix_nano
    attributes = attributes_of(span)
    assert attributes["gen_ai.request.id"] == reply["id"]
    assert attributes["gen_ai.response.model"] == SERVED
    assert attributes["gen_ai.request.max_tokens"] == 5
    assert attributes["gen_ai.request.temperature"] == pytest.approx(0.5)
    assert attributes["gen_ai.request.top_p"] == pytest.approx(0.9)
    assert attributes["gen_ai.request.n"] == 1
    assert attributes["gen_ai.usage.num_sequences"] == 1
    assert attributes["gen_ai.usage.prompt_tokens"] == reply["usage"]["prompt_tokens"]
    assert attributes["gen_ai.usage.completion_tokens"] == 5 == reply["usage"]["completion_tokens"]
    check_latencies(attributes, span)
    # the request logger's hook ran too
    assert any(r.getMessage().startswith(f"Finished request {reply['id']}") for r in caplog.records)


def check_latencies(attributes: dict, span) -> None:
    """Every latency present, non-negative, and consistent with the others and the span."""
    queue = attributes["gen_ai.latency.time_in_queue"]
    ttft = attributes["gen_ai.latency.time_to_first_token"]
    e2e = attributes["gen_ai.latency.e2e"]
    prefill = attributes["gen_ai.latency.time_in_model_prefill"]
    decode = attributes["gen_ai.latency.time_in_model_decode"]
    inference = attributes["gen_ai.latency.time_in_model_inference"]
    assert 0 <= queue <= ttft <= e2e
    assert min(prefill, decode) >= 0 and decode > 0  # 5 tokens: four decode steps
    assert queue + prefill == pytest.approx(ttft)
    assert prefill + decode == pytest.approx(inference)
    assert inference <= e2e
    duration = (span.end_time_unix_nano - span.start_time_unix_nano) / 1e9
    assert duration == pytest.approx(e2e, abs=1e-3)


def test_request_without_traceparent_starts_a_trace(traced):
    url, receiver = traced
    reply = complete(url, {})
    span = receiver.inbox.wait_for(
        lambda s: attributes_of(s).get("gen_ai.request.id") == reply["id"]
    )
    assert span.name == SPAN_NAME
    assert span.parent_span_id == b""
    assert len(span.trace_id) == 16 and any(span.trace_id)


def test_missing_extra_is_one_clear_line(tiny_folder, monkeypatch, capsys):
    monkeypatch.setattr("octavo.tracing._importable", lambda module: module != "opentelemetry.sdk")
    folder = str(tiny_folder("llama3"))
    assert main(["serve", folder, "--otlp-traces-endpoint", "http://127.0.0.1:4317"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0
    assert "opentelemetry.sdk missing" in error and "pip install 'octavo[otel]'" in error


def test_unknown_protocol_is_one_clear_line(tiny_folder, monkeypatch, capsys):
    monkeypatch.setenv(PROTOCOL_ENV, "http/json")
    folder = str(tiny_folder("llama3"))
    assert main(["serve", folder, "--otlp-traces-endpoint", "http://127.0.0.1:4317"]) == 2
    error = capsys.readouterr().err.strip()
    assert error == (f"octavo: error: {PROTOCOL_ENV}='http/json' is not one of grpc, http/protobuf")
