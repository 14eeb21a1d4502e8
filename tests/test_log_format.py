"""``--log-format json``: one JSON object per line with the request fields a log call
attached, the choice handed to child processes through ``$OCTAVO_LOG_FORMAT``; the
request logger's received and finished lines carry those fields."""

from __future__ import annotations

import json
import logging

import pytest

from octavo.entrypoints.openai.request_log import log_finished, log_request
from octavo.logging_format import LOG_FORMAT_ENV, chosen_format, configure_logging
from octavo.outputs import CompletionOutput, RequestMetrics, RequestOutput
from octavo.sampling_params import SamplingParams


@pytest.fixture
def json_lines(monkeypatch, capsys):
    """Call it once to start JSON logging (in the test: capsys captures only then), then
    for the lines logged since."""
    monkeypatch.delenv(LOG_FORMAT_ENV, raising=False)
    started = []

    def lines() -> list[dict]:  # ours (other handlers of the test process may print too)
        if not started:
            started.append(configure_logging("info", kind="json", rank=3))
            return []
        err = capsys.readouterr().err.splitlines()
        return [json.loads(line) for line in err if line.startswith("{")]

    yield lines
    configure_logging("info", kind="text")  # ours removed; pytest's handlers stay


def test_a_request_arriving_and_finishing_is_two_json_lines(json_lines):
    import os

    json_lines()
    assert os.environ[LOG_FORMAT_ENV] == "json"  # what the engine core and workers read
    log_request("cmpl-7", [1, 2, 3], SamplingParams(max_tokens=5), None)
    choice = CompletionOutput(0, "hi", [4, 5], finish_reason="length")
    metrics = RequestMetrics(10.0, first_scheduled_time=10.5, first_token_time=10.75)
    metrics.finished_time = 12.0
    log_finished(RequestOutput("cmpl-7", None, [1, 2, 3], [choice], True, 1, metrics))
    received, finished = json_lines()
    assert received["request_id"] == "cmpl-7" and received["prompt_tokens"] == 3
    assert received["max_tokens"] == 5 and received["rank"] == 3
    assert received["logger"] == "octavo.requests" and received["level"] == "INFO"
    assert finished["completion_tokens"] == 2 and finished["finish_reason"] == "length"
    assert (finished["queue_s"], finished["ttft_s"], finished["e2e_s"]) == (0.5, 0.75, 2.0)
    assert finished["cached_tokens"] == 1 and finished["time"].endswith("+00:00")


def test_an_exception_is_one_line_with_its_traceback(json_lines):
    json_lines()
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("octavo.test").exception("failed")
    (line,) = json_lines()
    assert line["message"] == "failed" and "RuntimeError: boom" in line["exception"]


def test_the_format_is_checked(monkeypatch):
    monkeypatch.setenv(LOG_FORMAT_ENV, "json")
    assert chosen_format() == "json" and chosen_format("text") == "text"
    with pytest.raises(ValueError, match="--log-format must be one of text, json"):
        chosen_format("xml")
