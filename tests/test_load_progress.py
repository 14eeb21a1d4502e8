"""/health while the model loads names the phase and its percent; a model the Hub cannot
serve is one clear line and exit code 1, before the server opens its port."""

from __future__ import annotations

import os
import socket
import threading
import time

import httpx
import pytest

from octavo.cli import main
from octavo.entrypoints.openai.context import ServerConfig
from octavo.model_executor import weights
from octavo.model_executor.hub import HubModel
from octavo.model_executor.hub_reach import ModelFetchError, ensure_fetchable

from hub_cache import seed_snapshot
from server_harness import ThreadedServer, build_local_app

ENGINE = {"max_model_len": 256, "kv_cache_memory": 4 << 20}


def test_health_names_the_loading_phase_and_its_percent(tiny_folder, monkeypatch):
    folder = tiny_folder("llama3")
    total = weights.count_checkpoint_tensors(folder)
    half, copied, gate = total // 2, [], threading.Event()
    copy_into = weights._copy_into

    def slow_copy(model, name, tensor):  # half the tensors, a report, then wait for the test
        if len(copied) == half:
            assert gate.wait(30), "the test never released the load"
        copied.append(name)
        if len(copied) == half:
            time.sleep(0.6)  # past the reporter's half-second limit: this update is sent
        return copy_into(model, name, tensor)

    monkeypatch.setattr(weights, "_copy_into", slow_copy)
    config = ServerConfig(served_model_names=["tiny"], model_root="tiny")
    app = build_local_app(str(folder), config, **ENGINE)
    with ThreadedServer(app) as server, httpx.Client(base_url=server.url, timeout=10) as client:
        body = wait_for_phase(client, "loading weights")
        assert body["percent"] == round(100 * half / total, 1)
        assert body["status"] == "loading" and body["error"]["code"] == "loading"
        gate.set()
        server.wait_ready()
        assert client.get("/health").json() == {"status": "ok"}


def wait_for_phase(client: httpx.Client, phase: str) -> dict:
    deadline = time.monotonic() + 20
    while True:
        answer = client.get("/health")
        assert answer.status_code == 503
        if answer.json()["phase"] == phase and answer.json()["percent"]:
            return answer.json()
        assert time.monotonic() < deadline, f"no {phase!r} in /health: {answer.json()}"
        time.sleep(0.05)


@pytest.fixture
def unreachable_hub(monkeypatch, tmp_path) -> str:
    """HF_ENDPOINT at a local port nobody listens on, an empty cache, online mode."""
    from huggingface_hub import constants

    with socket.socket() as probe:  # a free port, closed again
        probe.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{probe.getsockname()[1]}"
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # set, so that the test's end restores it
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    return endpoint


@pytest.mark.parametrize("generation_config", ["auto", "vllm"])
def test_serve_with_an_unreachable_hub_is_one_line_and_exit_1(
    unreachable_hub, capsys, generation_config
):
    argv = ["serve", "hf://org/name", "--port", "1", "--generation-config", generation_config]
    assert main(argv) == 1
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err
    line = lines[0]
    assert line.startswith("octavo: error: cannot fetch model 'hf://org/name': ")
    assert f"the Hugging Face Hub at {unreachable_hub} could not be reached" in line
    assert "HF_HUB_OFFLINE=1" in line and "local folder" in line and "PVC" in line


def test_an_unreachable_hub_serves_a_cached_copy_offline(unreachable_hub, tmp_path, monkeypatch):
    source = tmp_path / "src"
    source.mkdir()
    (source / "config.json").write_text("{}")
    seed_snapshot(tmp_path / "hub", "org/name", source, ("main",))
    ensure_fetchable(HubModel("org/name"))
    assert os.environ["HF_HUB_OFFLINE"] == "1"  # the engine core inherits it
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    with pytest.raises(ModelFetchError, match="could not be reached"):
        ensure_fetchable(HubModel("org/other"))  # not cached: no way to serve it
