"""``--cudagraph-metrics``: the table of the steps' graphs, as vLLM's CUDAGraphLogging lays it
out (the engine's own observations are checked in ``test_decode_graphs.py``)."""

from __future__ import annotations

import logging

from octavo.model_executor.graph_metrics import GraphMetricsLog, captured_graphs


def test_the_table_counts_each_shape_most_frequent_first_and_logs_each_interval(caplog):
    caplog.set_level(logging.INFO, logger="octavo.model_executor.graph_metrics")
    metrics = GraphMetricsLog(captured_graphs([1, 2, 4], [8, 16]), interval=3600)
    for tokens, size, mode in [
        (3, 4, "FULL"),
        (3, 4, "FULL"),
        (12, 16, "PIECEWISE"),
        (40, None, "NONE"),
    ]:
        metrics.observe(tokens, size, mode)
    assert metrics.report().splitlines() == [
        "graph metrics: decode graphs (FULL) of 1, 2, 4 rows; graphs cut at attention "
        "(PIECEWISE) of 8, 16 tokens",
        "| Unpadded Tokens | Padded Tokens | Num Paddings | Runtime Mode | Count |",
        "|-----------------|---------------|--------------|--------------|-------|",
        "| 3               | 4             | 1            | FULL         | 2     |",
        "| 12              | 16            | 4            | PIECEWISE    | 1     |",
        "| 40              | 40            | 0            | NONE         | 1     |",
    ]
    assert caplog.text == "", "nothing before the interval is over"
    metrics.interval = 0
    metrics.observe(1, 1, "FULL")
    assert (
        "| 1               | 1             | 0            | FULL         | 1     |" in caplog.text
    )
    assert not metrics.counts, "each report starts afresh"
    assert captured_graphs(None, None) == "no graphs captured: every step eager (NONE)"
