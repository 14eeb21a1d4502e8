"""Real OTLP trace receivers for tests: a gRPC TraceService and an HTTP ``/v1/traces``
endpoint, each decoding the exporter's ``ExportTraceServiceRequest`` and keeping its spans.

Both listen on a free loopback port and hand over what they received through a queue, so a
test waits for the span it expects instead of sleeping.
"""

from __future__ import annotations

import gzip
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.trace.v1.trace_pb2 import Span

LOOPBACK = "127.0.0.1"


class SpanInbox:
    """The spans a receiver was sent, in arrival order."""

    def __init__(self) -> None:
        self._spans: queue.Queue[Span] = queue.Queue()
        self.seen: list[Span] = []

    def add(self, request: trace_service_pb2.ExportTraceServiceRequest) -> None:
        for resource_spans in request.resource_spans:
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    self._spans.put(span)

    def wait_for(self, matches: Callable[[Span], bool], timeout: float = 10.0) -> Span:
        """The first span (received before or within TIMEOUT s) that MATCHES."""
        deadline = time.monotonic() + timeout
        while True:
            found = next((span for span in self.seen if matches(span)), None)
            if found is not None:
                return found
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no matching span within {timeout} s; got {self.seen}")
            try:
                self.seen.append(self._spans.get(timeout=left))
            except queue.Empty:
                continue


class GrpcReceiver:
    """``with GrpcReceiver() as receiver``: an OTLP/gRPC collector at ``receiver.endpoint``."""

    def __init__(self) -> None:
        self.inbox = SpanInbox()
        self._server = grpc.server(ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(
            _TraceService(self.inbox), self._server
        )
        port = self._server.add_insecure_port(f"{LOOPBACK}:0")
        self.endpoint = f"http://{LOOPBACK}:{port}"

    def __enter__(self) -> GrpcReceiver:
        self._server.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.stop(grace=None)


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, inbox: SpanInbox) -> None:
        self.inbox = inbox

    def Export(self, request, context):
        self.inbox.add(request)
        return trace_service_pb2.ExportTraceServiceResponse()


class HttpReceiver:
    """``with HttpReceiver() as receiver``: an OTLP/HTTP (protobuf) collector; its
    ``endpoint`` is the whole ``/v1/traces`` URL, as the HTTP exporter takes it."""

    def __init__(self) -> None:
        self.inbox = SpanInbox()
        self._server = ThreadingHTTPServer((LOOPBACK, 0), _handler_for(self.inbox))
        self.endpoint = f"http://{LOOPBACK}:{self._server.server_port}/v1/traces"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> HttpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.shutdown()
        self._server.server_close()


def _handler_for(inbox: SpanInbox) -> type[BaseHTTPRequestHandler]:
    class TracesHandler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            if self.path != "/v1/traces":
                self.send_error(404)
                return
            inbox.add(trace_service_pb2.ExportTraceServiceRequest.FromString(body))
            reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

    return TracesHandler


def attributes_of(span: Span) -> dict[str, Any]:
    """A span's attributes as a plain dict (string, int, float or bool values)."""
    values: dict[str, Any] = {}
    for attribute in span.attributes:
        kind = attribute.value.WhichOneof("value")
        values[attribute.key] = getattr(attribute.value, kind)
    return values
