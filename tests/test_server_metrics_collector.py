"""The metrics registry without a server: engine totals read at scrape time, finish reasons.

``test_server_metrics.py`` checks the metrics against real traffic; this module checks
what traffic rarely shows: the values before the first step, a scrape reporting the
engine's totals as they are, and a request the engine failed.
"""

from __future__ import annotations

from octavo.entrypoints.openai.metrics import ServerMetrics
from octavo.outputs import CompletionOutput, RequestMetrics, RequestOutput

from server_harness import engine_stats, metric_value

MODEL = "tiny"


def finished_output(request_id: str, reason: str, error: str | None = None) -> RequestOutput:
    completion = CompletionOutput(index=0, text="", token_ids=[7], finish_reason=reason)
    times = RequestMetrics(arrival_time=1.0, first_token_time=1.5, last_token_time=1.5)
    return RequestOutput(request_id, None, [1, 2], [completion], True, 0, times, error=error)


def scrape(metrics: ServerMetrics) -> str:
    return metrics.render().decode()


def test_engine_series_read_zero_before_the_first_step():
    text = scrape(ServerMetrics(MODEL))
    for name in ("vllm:prompt_tokens_total", "vllm:num_requests_running"):
        assert metric_value(text, name, model_name=MODEL) == 0
    assert "# TYPE vllm:prompt_tokens_total counter" in text
    assert "# TYPE vllm:kv_cache_usage_perc gauge" in text


def test_a_scrape_reports_the_newest_engine_totals():
    metrics = ServerMetrics(MODEL)
    metrics.on_step([], engine_stats(prompt_tokens=10, generation_tokens=3, running=2))
    metrics.on_step([], engine_stats(prompt_tokens=25, generation_tokens=9, running=1))
    text = scrape(metrics)
    assert metric_value(text, "vllm:prompt_tokens_total") == 25
    assert metric_value(text, "vllm:generation_tokens_total") == 9
    assert metric_value(text, "vllm:prefix_cache_queries_total") == 25
    assert metric_value(text, "vllm:num_requests_running") == 1
    assert metric_value(text, "vllm:kv_cache_usage_perc") == 0.25


def test_requests_count_by_finish_reason_and_failures_as_error():
    metrics = ServerMetrics(MODEL)
    outputs = [
        finished_output("a", "length"),
        finished_output("b", "stop"),
        finished_output("c", "error", error="the step failed"),
        finished_output("d", "length", error="failed after its first choice ended"),
    ]
    metrics.on_step(outputs, engine_stats(prompt_tokens=8, generation_tokens=4, running=0))
    text = scrape(metrics)

    def finished(reason: str) -> float:
        return metric_value(text, "vllm:request_success_total", finished_reason=reason)

    assert (finished("length"), finished("stop"), finished("error")) == (1, 1, 2)
    assert metric_value(text, "vllm:e2e_request_latency_seconds_count") == 4
