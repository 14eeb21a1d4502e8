"""A gateway's side of the endpoint picker protocol (GIE proposal 004) over Envoy's ext_proc.

Per HTTP request the gateway opens one `Process` stream and sends the request's headers
and body as Envoy does in FULL_DUPLEX_STREAMED mode; the picker answers with the chosen
`ip:port` in the `x-gateway-destination-endpoint` header mutation (and the same under the
`envoy.lb` dynamic-metadata namespace), then the body (possibly rewritten) — or with an
immediate response (503: no ready endpoint, 429: shed). After the model server answered,
the gateway sends the response's headers and body on the same stream, so the picker's
response-phase plugins (in-flight counts, prefix-cache bookkeeping) see the request end.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import grpc

from octavo_bench.gateway.ext_proc_schema import PROCESS_METHOD, core, ext_proc

DESTINATION_HEADER = "x-gateway-destination-endpoint"
LB_NAMESPACE = "envoy.lb"


class PickerError(RuntimeError):
    pass


@dataclass
class Pick:
    endpoints: list[str]  # ip:port, first choice first (empty when the picker refused)
    status: int | None = None  # the picker's immediate-response code, when it refused
    headers: dict[str, str] = field(default_factory=dict)  # header mutations it asked for
    body: bytes | None = None  # the body as the picker passed it on (None: unchanged)

    @property
    def endpoint(self) -> str | None:
        return self.endpoints[0] if self.endpoints else None


def header_map(headers: dict[str, str]):
    message = core("HeaderMap")()
    for key, value in headers.items():
        message.headers.add(key=key.lower(), raw_value=value.encode())
    return message


def request_messages(path: str, body: bytes, headers: dict[str, str]) -> list:
    """What Envoy sends for a request: its headers, then its whole body."""
    pseudo = {":method": "POST", ":path": path, ":scheme": "http", ":authority": "gateway"}
    plain = {"content-type": "application/json", "content-length": str(len(body))}
    message = ext_proc("ProcessingRequest")
    first = message(request_headers={"headers": header_map({**pseudo, **plain, **headers})})
    return [first, message(request_body={"body": body, "end_of_stream": True})]


def response_messages(status: int, body: bytes, content_type: str) -> list:
    """What Envoy sends for the model server's answer: its headers, then its body."""
    headers = {":status": str(status), "content-type": content_type}
    message = ext_proc("ProcessingRequest")
    first = message(response_headers={"headers": header_map(headers)})
    return [first, message(response_body={"body": body, "end_of_stream": True})]


def mutated_headers(common) -> dict[str, str]:
    options = common.header_mutation.set_headers
    return {o.header.key: o.header.raw_value.decode() or o.header.value for o in options}


def destination(pick_headers: dict[str, str], metadata) -> list[str]:
    """The picked endpoints, from the header or else from the envoy.lb metadata."""
    value = pick_headers.get(DESTINATION_HEADER, "")
    if not value and LB_NAMESPACE in metadata.fields:
        namespace = metadata.fields[LB_NAMESPACE].struct_value
        if DESTINATION_HEADER in namespace.fields:
            value = namespace.fields[DESTINATION_HEADER].string_value
    return [endpoint.strip() for endpoint in value.split(",") if endpoint.strip()]


class PickerStream:
    """One request's ext_proc stream: `pick` first, then `finish` with the answer."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        process = channel.stream_stream(
            PROCESS_METHOD,
            request_serializer=lambda message: message.SerializeToString(),
            response_deserializer=ext_proc("ProcessingResponse").FromString,
        )
        self.call = process()

    async def _next(self):
        response = await self.call.read()
        if response is grpc.aio.EOF:
            raise PickerError("the endpoint picker closed the stream without an answer")
        return response

    async def pick(self, path: str, body: bytes, headers: dict[str, str]) -> Pick:
        for message in request_messages(path, body, headers):
            await self.call.write(message)
        pick = await self._headers_answer()
        if pick.status is None:
            pick.body = await self._body_answer()
        return pick

    async def _headers_answer(self) -> Pick:
        response = await self._next()
        if response.HasField("immediate_response"):
            await self.close()
            return Pick([], status=response.immediate_response.status.code)
        if not response.HasField("request_headers"):
            raise PickerError(f"expected the request-headers answer, got {response}")
        headers = mutated_headers(response.request_headers.response)
        return Pick(destination(headers, response.dynamic_metadata), headers=headers)

    async def _body_answer(self) -> bytes | None:
        """The body the picker passes on: streamed chunks up to end_of_stream, or whole."""
        chunks: list[bytes] = []
        while True:
            response = await self._next()
            mutation = response.request_body.response.body_mutation
            if not mutation.HasField("streamed_response"):
                return mutation.body or None
            chunks.append(mutation.streamed_response.body)
            if mutation.streamed_response.end_of_stream:
                return b"".join(chunks)

    async def finish(self, status: int, body: bytes, content_type: str) -> None:
        """Tell the picker how the model server answered, then end the stream."""
        try:
            for message in response_messages(status, body, content_type):
                await self.call.write(message)
            await self.call.done_writing()
            while await self.call.read() is not grpc.aio.EOF:
                pass
        except grpc.aio.AioRpcError:
            pass  # the picker may end its side first; the request already succeeded

    async def close(self) -> None:
        self.call.cancel()
