"""Request tracing with OpenTelemetry (``--otlp-traces-endpoint``), as vLLM does it.

Each finished engine request becomes one span, ``llm_request``, exported over OTLP
(gRPC by default, ``http/protobuf`` when ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` says so)
with vLLM's ``gen_ai.*`` attributes: the request's id, model and sampling fields, its token
counts, and its latencies from the engine's timings (``RequestMetrics``: queue, time to
the first token, prefill, decode, end to end). A W3C ``traceparent``/``tracestate`` on the
HTTP request is continued: the span is a child of the caller's span.

How it fits together: ``TraceContextMiddleware`` reads the trace headers of each HTTP
request into a context variable; ``open_streams`` asks ``request_span_hook`` for a hook
per engine request, which the stream calls with the final output (the request logger's
``on_finish`` hook); the span is then built with the request's real start and end times.

The SDK and the exporters are the optional extra ``octavo[otel]``: nothing here imports
them unless tracing is on, and ``require_otel`` turns their absence into one clear line.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from importlib.util import find_spec
from typing import TYPE_CHECKING, Any

from starlette.types import ASGIApp, Receive, Scope, Send

from octavo.lora_request import LoRARequest
from octavo.outputs import RequestOutput
from octavo.sampling_params import SamplingParams

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Tracer

SPAN_NAME = "llm_request"  # vLLM's name for the span of one request
TRACE_HEADERS = ("traceparent", "tracestate")  # W3C Trace Context
PROTOCOL_ENV = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
PROTOCOLS = ("grpc", "http/protobuf")
DEFAULT_SERVICE_NAME = "octavo"  # unless OTEL_SERVICE_NAME names another
OTEL_MODULES = (  # what ``octavo[otel]`` installs, by the module each protocol needs
    "opentelemetry.sdk",
    "opentelemetry.exporter.otlp.proto.grpc",
    "opentelemetry.exporter.otlp.proto.http",
)
INSTALL_HINT = "install the extra: pip install 'octavo[otel]'"

logger = logging.getLogger(__name__)


class SpanAttributes:
    """vLLM's attribute names (the OpenTelemetry GenAI conventions, and its additions)."""

    GEN_AI_USAGE_COMPLETION_TOKENS = "gen_ai.usage.completion_tokens"
    GEN_AI_USAGE_PROMPT_TOKENS = "gen_ai.usage.prompt_tokens"
    GEN_AI_USAGE_NUM_SEQUENCES = "gen_ai.usage.num_sequences"
    GEN_AI_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
    GEN_AI_REQUEST_TOP_P = "gen_ai.request.top_p"
    GEN_AI_REQUEST_TEMPERATURE = "gen_ai.request.temperature"
    GEN_AI_REQUEST_ID = "gen_ai.request.id"
    GEN_AI_REQUEST_N = "gen_ai.request.n"
    GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
    GEN_AI_LATENCY_TIME_IN_QUEUE = "gen_ai.latency.time_in_queue"
    GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN = "gen_ai.latency.time_to_first_token"
    GEN_AI_LATENCY_E2E = "gen_ai.latency.e2e"
    GEN_AI_LATENCY_TIME_IN_MODEL_PREFILL = "gen_ai.latency.time_in_model_prefill"
    GEN_AI_LATENCY_TIME_IN_MODEL_DECODE = "gen_ai.latency.time_in_model_decode"
    GEN_AI_LATENCY_TIME_IN_MODEL_INFERENCE = "gen_ai.latency.time_in_model_inference"


def traces_protocol() -> str:
    """The OTLP protocol asked for in the environment (vLLM's default: grpc); ValueError
    for another."""
    protocol = os.environ.get(PROTOCOL_ENV, "grpc").strip() or "grpc"
    if protocol not in PROTOCOLS:
        raise ValueError(f"{PROTOCOL_ENV}={protocol!r} is not one of {', '.join(PROTOCOLS)}")
    return protocol


def require_otel() -> None:
    """ValueError (one line naming the extra) when the SDK or an exporter is missing."""
    missing = [name for name in OTEL_MODULES if not _importable(name)]
    if missing:
        raise ValueError(
            f"--otlp-traces-endpoint needs OpenTelemetry ({', '.join(missing)} missing): "
            f"{INSTALL_HINT}"
        )
    traces_protocol()


def _importable(module: str) -> bool:
    try:
        return find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


def span_exporter(endpoint: str, protocol: str) -> SpanExporter:
    """The OTLP exporter of PROTOCOL sending to ENDPOINT (for http/protobuf, the whole
    URL, e.g. http://collector:4318/v1/traces)."""
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[assignment]
            OTLPSpanExporter,
        )
    return OTLPSpanExporter(endpoint=endpoint)


@dataclass
class RequestTracer:
    """The server's tracer: its own provider (not the process-global one, so that tests
    may run several servers in a process), spans sent in batches off the event loop."""

    provider: TracerProvider
    tracer: Tracer
    model_name: str  # gen_ai.response.model of requests that name no adapter

    @classmethod
    def start(cls, endpoint: str, model_name: str) -> RequestTracer:
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        require_otel()
        service = os.environ.get("OTEL_SERVICE_NAME") or DEFAULT_SERVICE_NAME
        provider = TracerProvider(resource=Resource.create({SERVICE_NAME: service}))
        exporter = span_exporter(endpoint, traces_protocol())
        provider.add_span_processor(BatchSpanProcessor(exporter))
        return cls(provider, provider.get_tracer("octavo.entrypoints.openai"), model_name)

    def shutdown(self) -> None:
        """Send the spans still batched, then stop the exporter."""
        self.provider.shutdown()


@dataclass(frozen=True)
class RequestTrace:
    """The tracer and the caller's trace context of the HTTP request being handled."""

    tracer: RequestTracer
    parent: Context


_current_trace: ContextVar[RequestTrace | None] = ContextVar("request_trace", default=None)


class TraceContextMiddleware:
    """Keep each HTTP request's W3C trace context (and the tracer) for its engine requests.

    Plain ASGI, like the server's other middleware: the context variable set here is seen
    by the route handler, which runs in this call's context.
    """

    def __init__(self, app: ASGIApp, tracer: RequestTracer) -> None:
        self.app = app
        self.tracer = tracer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            _current_trace.set(RequestTrace(self.tracer, extract_trace_context(scope)))
        await self.app(scope, receive, send)


def extract_trace_context(scope: Scope) -> Context:
    """The caller's span context from the ``traceparent``/``tracestate`` headers (an empty
    context when there are none, or they are malformed: the span then starts a trace)."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier = {}
    for key, value in scope.get("headers", []):
        name = key.decode("latin-1").lower()
        if name in TRACE_HEADERS:
            carrier[name] = value.decode("latin-1")
    return TraceContextTextMapPropagator().extract(carrier)


def request_span_hook(
    params: SamplingParams, lora_request: LoRARequest | None
) -> Callable[[RequestOutput], None] | None:
    """The ``on_finish`` hook that exports the span of one engine request of the HTTP
    request being handled; None when tracing is off."""
    trace = _current_trace.get()
    if trace is None:
        return None
    model = trace.tracer.model_name if lora_request is None else lora_request.lora_name

    def export_span(output: RequestOutput) -> None:
        try:
            record_request_span(trace, output, params, model)
        except Exception:  # a tracing fault must not fail the request it traces
            logger.exception("could not record the span of request %s", output.request_id)

    return export_span


def record_request_span(
    trace: RequestTrace, output: RequestOutput, params: SamplingParams, model: str
) -> None:
    """One ``llm_request`` span from the request's arrival to its end, child of the
    caller's span."""
    from opentelemetry.trace import SpanKind

    metrics = output.metrics
    end = metrics.finished_time or metrics.last_token_time or time.monotonic()
    span = trace.tracer.tracer.start_span(
        SPAN_NAME,
        context=trace.parent,
        kind=SpanKind.SERVER,
        start_time=epoch_ns(metrics.arrival_time),
        attributes=span_attributes(output, params, model),
    )
    span.end(end_time=epoch_ns(end))


def span_attributes(output: RequestOutput, params: SamplingParams, model: str) -> dict[str, Any]:
    """vLLM's attributes of a finished request; a latency the engine did not time (a
    pooling request has no decode) is left out rather than made up."""
    attributes: dict[str, Any] = {
        SpanAttributes.GEN_AI_RESPONSE_MODEL: model,
        SpanAttributes.GEN_AI_REQUEST_ID: output.request_id,
        SpanAttributes.GEN_AI_REQUEST_N: params.n,
        SpanAttributes.GEN_AI_USAGE_NUM_SEQUENCES: len(output.outputs),
        SpanAttributes.GEN_AI_USAGE_PROMPT_TOKENS: output.num_prompt_tokens
        or len(output.prompt_token_ids),
        SpanAttributes.GEN_AI_USAGE_COMPLETION_TOKENS: sum(
            len(choice.token_ids) for choice in output.outputs
        ),
        SpanAttributes.GEN_AI_REQUEST_TEMPERATURE: params.temperature,
        SpanAttributes.GEN_AI_REQUEST_TOP_P: params.top_p,
    }
    if params.max_tokens is not None:
        attributes[SpanAttributes.GEN_AI_REQUEST_MAX_TOKENS] = params.max_tokens
    for name, seconds in latencies(output).items():
        if seconds is not None:
            attributes[name] = seconds
    return attributes


def latencies(output: RequestOutput) -> dict[str, float | None]:
    """The request's latencies in seconds (vLLM's definitions), None where a time is
    missing."""
    m = output.metrics
    end = m.finished_time or m.last_token_time
    return {
        SpanAttributes.GEN_AI_LATENCY_TIME_IN_QUEUE: _between(
            m.arrival_time, m.first_scheduled_time
        ),
        SpanAttributes.GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN: _between(
            m.arrival_time, m.first_token_time
        ),
        SpanAttributes.GEN_AI_LATENCY_E2E: _between(m.arrival_time, end),
        SpanAttributes.GEN_AI_LATENCY_TIME_IN_MODEL_PREFILL: _between(
            m.first_scheduled_time, m.first_token_time
        ),
        SpanAttributes.GEN_AI_LATENCY_TIME_IN_MODEL_DECODE: _between(
            m.first_token_time, m.last_token_time
        ),
        SpanAttributes.GEN_AI_LATENCY_TIME_IN_MODEL_INFERENCE: _between(
            m.first_scheduled_time, m.last_token_time
        ),
    }


def _between(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else end - start


def epoch_ns(monotonic_seconds: float) -> int:
    """A ``time.monotonic()`` reading (the engine's clock, shared by its processes on one
    host) as nanoseconds since the epoch, which spans carry."""
    return time.time_ns() - int((time.monotonic() - monotonic_seconds) * 1e9)
