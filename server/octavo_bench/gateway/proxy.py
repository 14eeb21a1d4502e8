"""A minimal inference gateway: an HTTP front that asks an endpoint picker where each request
goes (as Envoy with the GIE ext_proc filter does) or spreads requests round-robin (as a
plain Service does), then streams the chosen model server's answer back.

It exists for tests and benchmarks, to compare routings with the same proxy in the path;
in a cluster, Istio, kgateway or agentgateway play this part. Each answer carries
`x-gateway-destination-endpoint-served` (the endpoint that served it) so a client can
see where its requests went.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from octavo_bench.gateway.picker_client import Pick, PickerError, PickerStream

SERVED_HEADER = "x-gateway-destination-endpoint-served"
FORWARDED_HEADERS = ("authorization", "x-request-id", "x-gateway-inference-objective")


@dataclass
class Router:
    """Where requests go: the picker at ``picker`` (host:port), else ``endpoints`` in turn."""

    picker: str | None = None
    endpoints: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.picker and not self.endpoints:
            raise ValueError("a gateway needs an endpoint picker or a list of endpoints")
        self._turns = itertools.cycle(self.endpoints) if self.endpoints else None
        self._channel: grpc.aio.Channel | None = None  # opened in the serving event loop

    async def choose(self, path: str, body: bytes, headers: dict[str, str]):
        """(pick, stream to finish or None) for one request."""
        if not self.picker:
            return Pick([next(self._turns)]), None
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(self.picker)
        stream = PickerStream(self._channel)
        return await stream.pick(path, body, headers), stream


def upstream_headers(pick: Pick) -> dict[str, str]:
    """The picker's header mutations that belong on the upstream request (it echoes the
    request's own headers, pseudo-headers and length included, beside its own)."""
    skipped = {"content-length", "host", "content-type"}
    return {k: v for k, v in pick.headers.items() if not k.startswith(":") and k not in skipped}


def error(status: int, message: str) -> JSONResponse:
    kind = "service_unavailable" if status >= 500 else "too_many_requests"
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status)


def build_app(router: Router, timeout_s: float = 600.0) -> Starlette:
    client = httpx.AsyncClient(timeout=timeout_s)

    async def forward(request: Request) -> Response:
        body = await request.body()
        headers = {k: v for k, v in request.headers.items() if k in FORWARDED_HEADERS}
        try:
            pick, stream = await router.choose(request.url.path, body, headers)
        except (PickerError, grpc.aio.AioRpcError) as exc:
            return error(503, f"the endpoint picker failed: {exc}")
        if pick.endpoint is None:
            return error(pick.status or 503, f"the endpoint picker refused ({pick.status})")
        upstream = client.build_request(
            "POST",
            f"http://{pick.endpoint}{request.url.path}",
            content=pick.body or body,
            headers={**headers, **upstream_headers(pick), "content-type": "application/json"},
        )
        answer = await client.send(upstream, stream=True)
        return StreamingResponse(
            relay(answer, stream),
            status_code=answer.status_code,
            media_type=answer.headers.get("content-type"),
            headers={SERVED_HEADER: pick.endpoint},
        )

    async def relay(answer: httpx.Response, stream: PickerStream | None) -> AsyncIterator[bytes]:
        chunks = []
        try:
            async for chunk in answer.aiter_raw():
                chunks.append(chunk)
                yield chunk
        finally:
            await answer.aclose()
            if stream is not None:
                kind = answer.headers.get("content-type", "application/json")
                await stream.finish(answer.status_code, b"".join(chunks), kind)

    async def health(_: Request) -> Response:
        return Response(status_code=200)

    routes = [Route("/v1/{rest:path}", forward, methods=["POST"]), Route("/health", health)]
    return Starlette(routes=routes)
