"""The Grafana dashboard: generated, well-formed, and querying only what the server exports.

A tiny-model server is scraped for the metric names it really exports, and a real
Prometheus scraping it evaluates every panel's expression with the template variables
filled in, so a typo in a name, a suffix or a label shows up as an empty result.
"""

from __future__ import annotations

import importlib.util
import json
import re
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest

from conftest import running_tiny_server
from prometheus_runner import (
    Prometheus,
    ScrapeJob,
    running_prometheus,
)

ROOT = Path(__file__).resolve().parents[1]
MODEL = "tiny"
NAMESPACE = "octavo-test"  # what a Kubernetes scrape adds as the `namespace` target label
TARGET_LABELS = {"namespace", "pod", "instance", "job"}
PROMQL_KEYWORDS = {"by", "without", "on", "ignoring", "and", "or", "unless", "bool", "offset"}
REQUIRED_METRICS = {
    "vllm:request_success_total",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:time_to_first_token_seconds_bucket",
    "vllm:inter_token_latency_seconds_bucket",
    "vllm:e2e_request_latency_seconds_bucket",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_hits_total",
    "vllm:prefix_cache_queries_total",
    "vllm:num_preemptions_total",
}
PERCENTILE_HISTOGRAMS = (
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds",
)


def load_generator() -> ModuleType:
    path = ROOT / "scripts" / "grafana_dashboard.py"
    spec = importlib.util.spec_from_file_location("grafana_dashboard", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def generator() -> ModuleType:
    return load_generator()


@pytest.fixture(scope="module")
def dashboard(generator) -> dict[str, Any]:
    return json.loads(generator.OUTPUT.read_text())


def expressions(dashboard: dict[str, Any]) -> list[str]:
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


def metric_names(expr: str) -> set[str]:
    """Identifiers of a PromQL expression that are neither functions, keywords nor labels."""
    text = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", expr)
    text = re.sub(r"\b(?:by|without)\s*\([^)]*\)", " ", text)
    found = re.findall(r"(?<![\w:.])([A-Za-z_:][\w:]*)(?![\w:]|\s*\()", text)
    return set(found) - PROMQL_KEYWORDS


def label_names(expr: str) -> set[str]:
    matchers = re.findall(r"\{([^}]*)\}", expr)
    names = {m for group in matchers for m in re.findall(r"(\w+)\s*[=!]~?", group)}
    groups = re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr)
    return names | {n.strip() for group in groups for n in group.split(",") if n.strip()}


# ----- the file itself ---------------------------------------------------------------------
def test_committed_json_is_the_generators_output(generator):
    assert generator.OUTPUT == ROOT / "charts/octavo/dashboards/octavo-server.json"
    assert generator.OUTPUT.read_text() == generator.render()
    assert generator.main(["--check"]) == 0


def test_check_mode_reports_a_stale_file(generator, tmp_path):
    stale = tmp_path / "stale.json"
    stale.write_text("{}\n")
    assert generator.main(["--check", "--output", str(stale)]) == 1
    assert generator.main(["--output", str(stale)]) == 0
    assert generator.main(["--check", "--output", str(stale)]) == 0


def test_expression_parsing_helpers():
    expr = 'histogram_quantile(0.9, sum by (le) (rate(x_bucket{a="1", b=~"$v"}[5m]))) / y'
    assert metric_names(expr) == {"x_bucket", "y"}
    assert label_names(expr) == {"a", "b", "le"}


def test_panels_have_titles_unique_ids_and_the_datasource_variable(dashboard):
    panels = dashboard["panels"]
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids)) and all(isinstance(i, int) for i in ids)
    for panel in panels:
        assert panel["title"].strip(), panel
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
        refs = [target["refId"] for target in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
            assert "$namespace" in target["expr"] and "$model_name" in target["expr"]


def test_panels_do_not_overlap(dashboard):
    cells: set[tuple[int, int]] = set()
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        mine = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not cells & mine, panel["title"]
        cells |= mine


def test_template_variables(dashboard):
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert set(variables) == {"datasource", "namespace", "model_name"}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("namespace", "model_name"):
        variable = variables[name]
        assert variable["type"] == "query" and variable["datasource"]["uid"] == "${datasource}"
        assert variable["includeAll"] and variable["allValue"] == ".*"
        assert f", {name})" in variable["definition"]


def test_required_panels_are_present(dashboard):
    used = set().union(*(metric_names(expr) for expr in expressions(dashboard)))
    assert used >= REQUIRED_METRICS, REQUIRED_METRICS - used
    exprs = expressions(dashboard)
    for histogram in PERCENTILE_HISTOGRAMS:
        for quantile in ("0.5", "0.9", "0.99"):
            wanted = f"histogram_quantile({quantile}, sum by (le) (rate({histogram}_bucket{{"
            assert any(expr.startswith(wanted) for expr in exprs), (histogram, quantile)
    success = next(e for e in exprs if "vllm:request_success_total" in e)
    assert "by (finished_reason)" in success
    hit_rate = next(e for e in exprs if "vllm:prefix_cache_hits_total" in e)
    assert "vllm:prefix_cache_queries_total" in hit_rate


# ----- against a live server ---------------------------------------------------------------
@pytest.fixture(scope="module")
def server_url(tiny_folder) -> Iterator[str]:
    with running_tiny_server(tiny_folder, MODEL) as url:
        for prompt in ("Once upon", "Once upon a time"):  # the second one hits the prefix cache
            body = {"model": MODEL, "prompt": prompt, "max_tokens": 6, "ignore_eos": True}
            response = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
            assert response.status_code == 200, response.text
        yield url


def scraped_series(url: str) -> dict[str, set[str]]:
    """Sample name -> its label names, from one scrape of /metrics."""
    series: dict[str, set[str]] = {}
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        match = re.match(r"([A-Za-z_:][\w:]*)(?:\{(.*)\})? ", line)
        if match and not line.startswith("#"):
            labels = set(re.findall(r'(\w+)="', match[2] or ""))
            series.setdefault(match[1], set()).update(labels)
    return series


def test_every_expression_uses_exported_metrics_and_labels(dashboard, server_url):
    series = scraped_series(server_url)
    exported = {name for name in series if not name.endswith("_created")}
    labels = set().union(*series.values()) | TARGET_LABELS
    for expr in expressions(dashboard):
        names = metric_names(expr)
        assert names and names <= exported, (expr, names - exported)
        assert label_names(expr) <= labels, (expr, label_names(expr) - labels)
    for variable in dashboard["templating"]["list"][1:]:
        match = re.fullmatch(r"label_values\((.*), (\w+)\)", variable["definition"])
        assert match, variable["definition"]
        assert metric_names(match[1]) <= exported and match[2] in labels


# ----- a real Prometheus evaluates every panel ---------------------------------------------
@pytest.fixture(scope="module")
def prometheus(server_url, prometheus_binary, tmp_path_factory) -> Iterator[Prometheus]:
    """Prometheus scraping the server, adding the `namespace` label a Kubernetes scrape adds."""
    job = ScrapeJob(
        "octavo", (server_url.removeprefix("http://"),), labels=(("namespace", NAMESPACE),)
    )
    with running_prometheus(prometheus_binary, [job], tmp_path_factory.mktemp("prom")) as p:
        yield p


def label_values(prometheus: Prometheus, label: str, match: str) -> list[str]:
    response = httpx.get(
        f"{prometheus.url}/api/v1/label/{label}/values", params={"match[]": match}, timeout=10
    )
    response.raise_for_status()
    return response.json()["data"]


def fill_variables(expr: str) -> str:
    return (
        expr.replace("$namespace", NAMESPACE)
        .replace("$model_name", MODEL)
        .replace("$__rate_interval", "1m")
    )


def test_prometheus_evaluates_every_panel(dashboard, prometheus):
    assert prometheus.wait_for('up{job="octavo"}', 1.0) == 1.0, "the server was never scraped"
    for expr in expressions(dashboard):
        # Any value, NaN included (a quantile of no observations): the series must exist.
        assert prometheus.wait_for(fill_variables(expr), None) is not None, f"no series: {expr}"
    success = next(e for e in expressions(dashboard) if "request_success" in e)
    reasons = prometheus.query(fill_variables(success))
    assert {series["metric"]["finished_reason"] for series in reasons} == {"length"}


def test_prometheus_answers_the_variable_queries(prometheus):
    assert prometheus.wait_for('up{job="octavo"}', 1.0) == 1.0, "the server was never scraped"
    match = "vllm:num_requests_running"
    assert label_values(prometheus, "namespace", match) == [NAMESPACE]
    models = label_values(prometheus, "model_name", f'{match}{{namespace=~"{NAMESPACE}"}}')
    assert models == [MODEL]
