"""The benchmark gateway's side of the endpoint picker protocol (Envoy ext_proc), against a
picker served here by grpcio with the same wire messages (the real llm-d EPP is exercised
by e2e/test_router.py), and the routed benchmark's workload and verdicts."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import grpc
import pytest

from octavo_bench.gateway.ext_proc_schema import PROCESS_METHOD, core, ext_proc
from octavo_bench.gateway.picker_client import DESTINATION_HEADER, PickerStream
from octavo_bench.gateway.proxy import Router, upstream_headers
from octavo_bench.routed import PICKER, ROUND_ROBIN, SINGLE, RoutedReport, RoutedRun
from octavo_bench.routed_workload import TenantWorkload, tenant_prompts


def header_option(key: str, value: str):
    return core("HeaderValueOption")(header={"key": key, "raw_value": value.encode()})


def headers_answer(endpoint: str, in_metadata: bool):
    answer = ext_proc("ProcessingResponse")()
    mutation = answer.request_headers.response.header_mutation
    if in_metadata:
        answer.dynamic_metadata.update({"envoy.lb": {DESTINATION_HEADER: endpoint}})
    else:
        mutation.set_headers.append(header_option(DESTINATION_HEADER, endpoint))
    mutation.set_headers.append(header_option(":path", "/v1/completions"))
    return answer


def body_answers(body: bytes) -> list:
    """The body passed on in two streamed chunks, as the EPP does in FULL_DUPLEX_STREAMED."""
    out = []
    for chunk, last in ((body[:5], False), (body[5:], True)):
        answer = ext_proc("ProcessingResponse")()
        streamed = answer.request_body.response.body_mutation.streamed_response
        streamed.body, streamed.end_of_stream = chunk, last
        out.append(answer)
    return out


class FakePicker:
    """Picks `endpoint` for model "tiny", refuses (503) any other model; records what the
    gateway sent, response phase included."""

    def __init__(self, endpoint: str, in_metadata: bool = False) -> None:
        self.endpoint, self.in_metadata = endpoint, in_metadata
        self.seen: list[str] = []

    async def process(self, requests: AsyncIterator, context) -> AsyncIterator:
        body = b""
        async for request in requests:
            kind = self.kind(request)
            self.seen.append(kind)
            if kind == "request_body":
                body += request.request_body.body
                if not request.request_body.end_of_stream:
                    continue
                if json.loads(body)["model"] != "tiny":
                    refusal = ext_proc("ProcessingResponse")()
                    refusal.immediate_response.status.code = 503
                    yield refusal
                    return
                yield headers_answer(self.endpoint, self.in_metadata)
                for answer in body_answers(body):
                    yield answer
            elif kind == "response_body" and request.response_body.end_of_stream:
                done = ext_proc("ProcessingResponse")()
                done.response_body.response.SetInParent()
                yield done

    @staticmethod
    def kind(request) -> str:
        for name in ("request_headers", "request_body", "response_headers", "response_body"):
            if request.HasField(name):
                return name
        return "unknown"


async def serving(picker: FakePicker) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    handler = grpc.stream_stream_rpc_method_handler(
        picker.process,
        request_deserializer=ext_proc("ProcessingRequest").FromString,
        response_serializer=lambda message: message.SerializeToString(),
    )
    service, method = PROCESS_METHOD.strip("/").split("/")
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service, {method: handler}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


async def exchange(picker: FakePicker, body: dict, answer: bytes = b"{}"):
    server, address = await serving(picker)
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            stream = PickerStream(channel)
            pick = await stream.pick("/v1/completions", json.dumps(body).encode(), {"x-a": "1"})
            if pick.endpoint:
                await stream.finish(200, answer, "application/json")
            return pick
    finally:
        await server.stop(None)


BODY = {"model": "tiny", "prompt": "hello", "max_tokens": 2}


@pytest.mark.parametrize("in_metadata", [False, True], ids=["header", "envoy.lb metadata"])
def test_the_pick_and_the_passed_on_body_are_read_from_the_pickers_answers(in_metadata):
    picker = FakePicker("10.0.0.7:8000", in_metadata)
    pick = asyncio.run(exchange(picker, BODY))
    assert pick.endpoints == ["10.0.0.7:8000"] and pick.status is None
    assert json.loads(pick.body) == BODY
    assert picker.seen == ["request_headers", "request_body", "response_headers", "response_body"]


def test_a_refusal_carries_the_pickers_status_and_no_endpoint():
    pick = asyncio.run(exchange(FakePicker("10.0.0.7:8000"), {**BODY, "model": "other"}))
    assert pick.endpoint is None and pick.status == 503


def test_the_upstream_request_gets_the_pickers_headers_but_not_pseudo_headers_or_length():
    pick = asyncio.run(exchange(FakePicker("10.0.0.7:8000"), BODY))
    assert pick.headers[":path"] == "/v1/completions"
    assert upstream_headers(pick) == {DESTINATION_HEADER: "10.0.0.7:8000"}


def test_without_a_picker_requests_go_round_robin():
    router = Router(endpoints=("10.0.0.1:8000", "10.0.0.2:8000"))
    picks = [asyncio.run(router.choose("/v1/completions", b"{}", {}))[0].endpoint for _ in range(3)]
    assert picks == ["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.1:8000"]
    with pytest.raises(ValueError, match="picker or a list"):
        Router()


def test_each_tenant_shares_one_system_prompt_and_tenants_interleave():
    workload = TenantWorkload(tenants=3, users_per_tenant=4, system_words=50, seed=1)
    requests = tenant_prompts(workload)
    assert len(requests) == 12 and requests == tenant_prompts(workload)  # seeded
    for tenant in range(3):
        texts = [p.text for t, p in requests if t == tenant]
        system = texts[0].split("\n\nUser")[0]
        assert len(texts) == 4 and all(text.startswith(system) for text in texts)
        assert len(set(texts)) == 4  # each user asks something else
    first_tenants = [tenant for tenant, _ in requests[:6]]
    assert len(set(first_tenants)) > 1, "arrivals must interleave the tenants"


def run(name: str, hit_rate: float, ttft_p50: float) -> RoutedRun:
    return RoutedRun(name, 3, hit_rate, [4, 4, 4], 10.0, ttft_p50, ttft_p50 * 2, 0)


def test_the_verdicts_compare_the_picker_with_one_replica_and_round_robin():
    report = RoutedReport(settings={})
    report.runs = [run(SINGLE, 0.80, 100), run(ROUND_ROBIN, 0.30, 900), run(PICKER, 0.76, 300)]
    targets = report.targets()
    assert targets["hit_rate_vs_single"] == pytest.approx(0.95)
    assert targets["hit_rate_target_met"] and targets["ttft_target_met"]
    assert targets["ttft_p50_gain_vs_round_robin"] == pytest.approx(3.0)
    report.runs[2] = run(PICKER, 0.5, 600)
    assert not report.targets()["hit_rate_target_met"] and not report.targets()["ttft_target_met"]
    assert "hit_rate_vs_single" in report.text()
