"""The engine's stats line every 10 seconds (``engine/stats_log.py``), worded as vLLM's, and
``--disable-log-stats``."""

from __future__ import annotations

import logging
from dataclasses import replace

from octavo import LLM, SamplingParams
from octavo.engine.stats import EngineStats
from octavo.engine.stats_log import StatsLog

START = EngineStats(
    num_running=0,
    num_waiting=0,
    kv_cache_usage=0.0,
    kv_cache_tokens_held=0,
    kv_cache_slots_allocated=0,
    num_blocks=100,
    prefix_cache_queries=0,
    prefix_cache_hits=0,
    num_preemptions=0,
    prompt_tokens=0,
    generation_tokens=0,
)


def test_the_line_reports_the_interval_and_quiets_down_when_idle(caplog):
    caplog.set_level(logging.DEBUG, logger="octavo.engine.stats_log")
    log = StatsLog("CPU", interval=0)
    busy = replace(START, num_running=20, num_waiting=3, kv_cache_usage=0.412)
    busy = replace(busy, prompt_tokens=5120, generation_tokens=3014, num_preemptions=1)
    busy = replace(busy, prefix_cache_queries=5120, prefix_cache_hits=1920)
    text, args, _ = log.line(busy, 10.0)
    assert text % tuple(args) == (
        "Engine 000: Avg prompt throughput: 512.0 tokens/s, Avg generation throughput: "
        "301.4 tokens/s, Running: 20 reqs, Waiting: 3 reqs, Preemptions: 1, CPU KV cache "
        "usage: 41.2%, Prefix cache hit rate: 37.5%"
    )
    for stats in (busy, busy, busy):  # busy, then an idle interval after a busy one, then idle
        log.maybe_log(lambda stats=stats: stats)
    records = [r for r in caplog.records if r.name == "octavo.engine.stats_log"]
    assert [record.levelno for record in records] == [logging.INFO, logging.INFO, logging.DEBUG]
    assert "Preemptions" not in records[1].getMessage(), "none in that interval"
    assert "Prefix cache hit rate" not in records[1].getMessage()


def test_the_engine_logs_its_line_unless_told_not_to(tiny_folder, caplog):
    caplog.set_level(logging.INFO, logger="octavo.engine.stats_log")
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    folder = str(tiny_folder("llama3"))
    with LLM(folder, max_model_len=64, disable_log_stats=False) as llm:
        llm.engine.stats_log.interval = 0
        llm.generate([[11, 12, 13]], params, use_tqdm=False)
    lines = [r.getMessage() for r in caplog.records if r.name == "octavo.engine.stats_log"]
    assert lines and all("Avg generation throughput" in line for line in lines)
    caplog.clear()
    with LLM(folder, max_model_len=64) as quiet:  # the offline default, as vLLM's
        quiet.engine.stats_log.interval = 0
        quiet.generate([[11, 12, 13]], params, use_tqdm=False)
    assert not [r for r in caplog.records if r.name == "octavo.engine.stats_log"]
