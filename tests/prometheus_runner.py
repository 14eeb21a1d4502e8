"""A real Prometheus server as a subprocess, scraping given targets (tests only).

The binary comes from the Debian package `prometheus` (`scripts/install-test-tools.sh`).
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from octavo_bench.serve_launch import LOOPBACK, free_port

CANDIDATES = ("/usr/bin/prometheus",)


def find_prometheus() -> str | None:
    return shutil.which("prometheus") or next((p for p in CANDIDATES if Path(p).is_file()), None)


@dataclass(frozen=True)
class ScrapeJob:
    name: str
    targets: tuple[str, ...]  # host:port
    metrics_path: str = "/metrics"
    labels: tuple[tuple[str, str], ...] = ()  # added to every series, as Kubernetes SD would


@dataclass
class Prometheus:
    url: str
    process: subprocess.Popen
    log: Path

    def query(self, promql: str) -> list[dict[str, Any]]:
        response = httpx.get(f"{self.url}/api/v1/query", params={"query": promql}, timeout=10)
        response.raise_for_status()
        body = response.json()
        assert body["status"] == "success", body
        return body["data"]["result"]

    def wait_for(self, promql: str, expected: float | None, timeout: float = 40.0) -> float | None:
        """Poll an instant query until it returns EXPECTED (None: any value); the last value."""
        deadline, value = time.monotonic() + timeout, None
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"prometheus exited:\n{self.log.read_text()}"
            try:
                result = self.query(promql)
            except httpx.TransportError:  # not listening yet
                result = []
            except httpx.HTTPStatusError as error:  # 503 until its storage is ready
                if error.response.status_code != 503:
                    raise
                result = []
            value = float(result[0]["value"][1]) if result else None
            if value is not None and (expected is None or value == expected):
                return value
            time.sleep(0.25)
        return value


def config_text(jobs: list[ScrapeJob]) -> str:
    lines = ["global:", "  scrape_interval: 1s", "  scrape_timeout: 1s", "scrape_configs:"]
    for job in jobs:
        targets = ", ".join(f"'{t}'" for t in job.targets)
        lines += [
            f"  - job_name: {job.name}",
            f"    metrics_path: {job.metrics_path}",
            "    static_configs:",
            f"      - targets: [{targets}]",
        ]
        if job.labels:
            pairs = ", ".join(f"{k}: {v}" for k, v in job.labels)
            lines.append(f"        labels: {{{pairs}}}")
    return "\n".join(lines) + "\n"


@contextmanager
def running_prometheus(binary: str, jobs: list[ScrapeJob], workdir: Path) -> Iterator[Prometheus]:
    config = workdir / "prometheus.yml"
    config.write_text(config_text(jobs))
    address = f"{LOOPBACK}:{free_port()}"
    log = workdir / "prometheus.log"
    command = [
        binary,
        f"--config.file={config}",
        f"--storage.tsdb.path={workdir / 'data'}",
        f"--web.listen-address={address}",
        "--log.level=warn",
    ]
    with log.open("w") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
    try:
        yield Prometheus(f"http://{address}", process, log)
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)
