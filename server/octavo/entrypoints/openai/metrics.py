"""Prometheus metrics with vLLM's names, fed by the engine thread after every step.

The engine's totals and levels (tokens, preemptions, running requests, KV usage) are
read from its newest stats at scrape time (``EngineStatsCollector``). What only a
finished request tells — its latencies, its sizes, why it finished — is observed here
as each request's outputs arrive.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from octavo.engine.stats import EngineStats
from octavo.entrypoints.openai.engine_stats_collector import EngineStatsCollector
from octavo.outputs import RequestOutput

# The server's own requests (the structured-output warm-up): not counted as requests.
UNCOUNTED_REQUEST_PREFIX = "octavo-warm-up-"
LATENCY_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000)
COMPILE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass
class _Histograms:
    """The per-request histograms, each as its one series (the model's label set once:
    ``labels()`` per output took a sixth of the event loop's time at 256 streams)."""

    ttft: Histogram
    itl: Histogram
    e2e: Histogram
    queue: Histogram
    prompt_tokens: Histogram
    generation_tokens: Histogram


class ServerMetrics:
    """All metrics of one server, in their own registry, labelled with the model name."""

    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        self.model_name = model_name
        self.engine_stats = EngineStatsCollector(model_name)
        self.registry.register(self.engine_stats)
        # request id -> its last token's time and tokens so far, for ITL
        self._last_token: dict[str, tuple[float, int]] = {}
        self._success = Counter(
            "vllm:request_success",
            "Finished requests, by finish reason.",
            ["model_name", "finished_reason"],
            registry=self.registry,
        )
        self._hist = self._make_histograms()
        self._structured = Counter(
            "octavo:structured_output_requests",
            "Requests whose output is constrained (JSON schema, JSON object, regex, choice, "
            "grammar, tool calls), by kind.",
            ["model_name", "kind"],
            registry=self.registry,
        )
        self._compile_seconds = Histogram(
            "octavo:grammar_compile_seconds",
            "Time to compile a structured-output constraint (cache misses only).",
            buckets=COMPILE_BUCKETS,
            **self._labels(),
        )
        self._create_children()

    def _labels(self) -> dict:
        return {"labelnames": ["model_name"], "registry": self.registry}

    def _make_histograms(self) -> _Histograms:
        def latency(name: str, doc: str) -> Histogram:
            histogram = Histogram(name, doc, buckets=LATENCY_BUCKETS, **self._labels())
            return histogram.labels(self.model_name)

        def tokens(name: str, doc: str) -> Histogram:
            histogram = Histogram(name, doc, buckets=TOKEN_BUCKETS, **self._labels())
            return histogram.labels(self.model_name)

        return _Histograms(
            ttft=latency("vllm:time_to_first_token_seconds", "Time to first token."),
            itl=latency("vllm:inter_token_latency_seconds", "Time between output tokens."),
            e2e=latency("vllm:e2e_request_latency_seconds", "Arrival to finish."),
            queue=latency("vllm:request_queue_time_seconds", "Arrival to first scheduled."),
            prompt_tokens=tokens("vllm:request_prompt_tokens", "Prompt tokens per request."),
            generation_tokens=tokens(
                "vllm:request_generation_tokens", "Generated tokens per request."
            ),
        )

    def _create_children(self) -> None:
        """Create the labelled series up front so a scrape shows them before any request
        (the request histograms' are made with them)."""
        self._compile_seconds.labels(self.model_name)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def watch_compiling(self, count: Callable[[], int]) -> None:
        """``octavo:grammar_requests_compiling``: requests waiting for their constraint's
        compile, read at scrape time (they are in flight before the engine sees them)."""
        gauge = Gauge(
            "octavo:grammar_requests_compiling",
            "Requests waiting for their structured-output constraint to compile.",
            **self._labels(),
        )
        gauge.labels(self.model_name).set_function(count)

    def record_constrained(self, kind: str, compile_seconds: float | None) -> None:
        """A constrained request was admitted; its grammar took ``compile_seconds`` to
        compile (``None``: it came from the cache)."""
        self._structured.labels(self.model_name, kind).inc()
        if compile_seconds is not None:
            self._compile_seconds.labels(self.model_name).observe(compile_seconds)

    # ----- called on the event loop, each step ---------------------------------------------
    def on_step(self, outputs: list[RequestOutput], stats: EngineStats) -> None:
        self.engine_stats.update(stats)
        for output in outputs:
            self.record_output(output)

    def record_output(self, output: RequestOutput) -> None:
        if output.request_id.startswith(UNCOUNTED_REQUEST_PREFIX):
            if output.finished:
                generated = sum(completion.num_tokens for completion in output.outputs)
                self.engine_stats.leave_out(
                    prompt_tokens=output.num_prompt_tokens,
                    generation_tokens=generated,
                    prefix_cache_queries=output.num_prompt_tokens,
                    prefix_cache_hits=output.num_cached_tokens,
                )
            return
        last = output.metrics.last_token_time
        if last is not None:
            self._observe_itl(output.request_id, last, output.outputs)
        if output.finished:
            self._last_token.pop(output.request_id, None)
            self.record_finished(output)

    def _observe_itl(self, request_id: str, last: float, outputs: list) -> None:
        """The gaps between a request's tokens: an output that brings ``k`` tokens at once
        (--stream-interval chunks, speculative steps) counts ``k`` gaps of its mean."""
        tokens = max((completion.num_tokens for completion in outputs), default=0)
        previous = self._last_token.get(request_id)
        self._last_token[request_id] = (last, tokens)
        if previous is None or last <= previous[0]:
            return
        new = max(1, tokens - previous[1])
        for _ in range(new):
            self._hist.itl.observe((last - previous[0]) / new)

    def record_finished(self, output: RequestOutput) -> None:
        times, hist = output.metrics, self._hist
        self._success.labels(self.model_name, finished_reason(output)).inc()
        hist.prompt_tokens.observe(output.num_prompt_tokens)
        generated = sum(completion.num_tokens for completion in output.outputs)
        hist.generation_tokens.observe(generated)
        if times.first_token_time is not None:
            hist.ttft.observe(times.first_token_time - times.arrival_time)
        if times.first_scheduled_time is not None:
            hist.queue.observe(times.first_scheduled_time - times.arrival_time)
        finished = times.finished_time or times.last_token_time
        if finished is not None:
            hist.e2e.observe(finished - times.arrival_time)


def finished_reason(output: RequestOutput) -> str:
    """The ``finished_reason`` label: stop, length, abort, or error (the engine failed it).

    As in vLLM, whose ``FinishReason`` has the same four values, a failed request is
    counted in ``vllm:request_success_total`` under ``error``.
    """
    if output.error is not None:
        return "error"
    reason = output.outputs[0].finish_reason if output.outputs else None
    return reason or "abort"
