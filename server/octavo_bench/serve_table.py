"""The serving table of ``python -m octavo_bench serve``: one column per server, per level.

Rows as vLLM's classic serving benchmark reports them (throughput, TTFT p50/p99, ITL p50)
plus what the server itself said during the level (largest batch run, peak KV cache use),
and, with ``--vllm-client``, the same rows as vLLM's own client measured them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from octavo_bench.report import LevelResult, ServerRun

Row = tuple[str, Callable[["LevelResult"], Any]]

OUR_ROWS: list[Row] = [
    ("output tok/s", lambda lv: lv.metrics.output_throughput),
    ("requests/s", lambda lv: lv.metrics.request_throughput),
    ("TTFT p50 ms", lambda lv: lv.metrics.ttft.median_ms),
    ("TTFT p99 ms", lambda lv: lv.metrics.ttft.p99_ms),
    ("ITL p50 ms", lambda lv: lv.metrics.itl.median_ms),
    ("max batch (running)", lambda lv: (lv.server or {}).get("max_running")),
    ("peak KV cache use %", lambda lv: _percent((lv.server or {}).get("max_kv_cache_usage"))),
]
VLLM_CLIENT_ROWS: list[Row] = [
    ("vllm client: output tok/s", lambda lv: (lv.vllm_client or {}).get("output_throughput")),
    ("vllm client: TTFT p50 ms", lambda lv: (lv.vllm_client or {}).get("median_ttft_ms")),
    ("vllm client: TTFT p99 ms", lambda lv: (lv.vllm_client or {}).get("p99_ttft_ms")),
    ("vllm client: ITL p50 ms", lambda lv: (lv.vllm_client or {}).get("median_itl_ms")),
    ("vllm client: error", lambda lv: (lv.vllm_client or {}).get("error")),
]


def _percent(fraction: float | None) -> float | None:
    return None if fraction is None else 100.0 * fraction


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)


def level_table(runs: Sequence[ServerRun], concurrency: int) -> str:
    """The rows of one level, a column per server that ran it."""
    from octavo_bench.report import table

    columns = [(run.label, run.level(concurrency)) for run in runs]
    columns = [(label, level) for label, level in columns if level is not None]
    rows_used = OUR_ROWS + [
        row for row in VLLM_CLIENT_ROWS if any(lv.vllm_client for _, lv in columns)
    ]
    rows = [[name] + [_cell(value(lv)) for _, lv in columns] for name, value in rows_used]
    headers = [f"concurrency {concurrency}"] + [label for label, _ in columns]
    return table(headers, rows)


def serving_table(runs: Sequence[ServerRun]) -> str:
    levels = sorted({level.concurrency for run in runs for level in run.levels})
    if not levels:
        return ""
    parts = ["== serving table: a column per server (our client, then vLLM's if run) =="]
    parts += [level_table(runs, concurrency) for concurrency in levels]
    return "\n".join(parts)
