"""LoRA adapters as an attacker tries them (issue 26, B/C/D).

Run-time loading only with ``--allow-runtime-lora-updating`` (else the routes are 404s,
as in vLLM); a run-time load reads only real paths under the allowed roots, and every
"missing / not an adapter / not allowed" case gets the one same answer; hub adapters are
downloaded off the event loop and off the engine loop, with a timeout; an adapter whose
tensors do not match its config or the base, or whose files are malformed, is a 400
naming the problem (never a 500 with internal text), and serving goes on.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import httpx
import pytest
import torch
from fastapi.testclient import TestClient

from octavo.engine.adapters import EngineAdapters
from octavo.engine.core_thread import ThreadCore
from octavo.entrypoints.openai.app import build_app
from octavo.entrypoints.openai.context import ServerConfig
from octavo.lora import adapter_source
from octavo.lora_request import LoRAModulePath
from octavo.model_executor import hub
from octavo.model_executor.model_config import ModelConfig

from hub_cache import seed_snapshot
from lora_adapters import lora_test_app, make_adapter, variant
from server_harness import ThreadedServer, torch_threads

PROMPT = [(j * 7) % 900 + 5 for j in range(10)]
ROUTES = ("/v1/load_lora_adapter", "/v1/unload_lora_adapter")
INTERNAL = (
    "Traceback",
    'File "',
    "Error(",
    "safetensors_rust",
    "object has no attribute",
    "torch.",
    "not subscriptable",
    "tuple index",
)


@pytest.fixture(scope="module")
def places(tiny_folder, tmp_path_factory):
    """An allowed root with a good adapter in it, a --lora-modules folder elsewhere (with a
    sibling adapter beside it), and a good adapter outside every allowed folder."""
    base = tiny_folder("llama3")
    root = tmp_path_factory.mktemp("allowed")
    good = make_adapter(base, root / "good", seed=21, rank=4)
    modules = tmp_path_factory.mktemp("modules")
    startup = variant(good, modules / "startup")
    sibling = variant(good, modules / "sibling")
    outside = variant(good, tmp_path_factory.mktemp("outside") / "adapter")
    return {"root": root, "good": good, "startup": startup, "sibling": sibling, "outside": outside}


@pytest.fixture(scope="module")
def server(tiny_folder, places):
    config = ServerConfig(
        served_model_names=["tiny"],
        model_root="tiny",
        allow_runtime_lora_updating=True,
        lora_allowed_roots=[str(places["root"])],
    )
    modules = [LoRAModulePath("startup", str(places["startup"]))]
    app = lora_test_app(tiny_folder("llama3"), config, modules)
    with torch_threads(1), ThreadedServer(app) as running:
        running.wait_ready()
        with httpx.Client(base_url=running.url, timeout=60) as http:
            yield http


def load(http: httpx.Client, name: str, path) -> httpx.Response:
    return http.post(ROUTES[0], json={"lora_name": name, "lora_path": str(path)})


def complete(http: httpx.Client, model: str) -> list[int]:
    body = {
        "model": model,
        "prompt": PROMPT,
        "max_tokens": 6,
        "temperature": 0,
        "ignore_eos": True,
        "logprobs": 0,
    }
    reply = http.post("/v1/completions", json=body)
    assert reply.status_code == 200, reply.text
    return reply.json()["choices"][0]["logprobs"]["tokens"]


def error_of(reply: httpx.Response, status: int) -> str:
    """The OpenAI-style error message of ``reply``, checked free of internal text."""
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert not any(marker in error["message"] for marker in INTERNAL), error["message"]
    return error["message"]


def test_runtime_routes_are_404_without_the_opt_in():
    """As in vLLM (routes registered only with VLLM_ALLOW_RUNTIME_LORA_UPDATING): 404, in
    OpenAI's error shape. With the opt-in the routes exist (503 until the engine loads)."""
    body = {"lora_name": "x", "lora_path": "/tmp"}
    for opt_in, status in ((False, 404), (True, 503)):
        config = ServerConfig(
            served_model_names=["m"], model_root="m", allow_runtime_lora_updating=opt_in
        )
        app = build_app(config, ThreadCore(lambda: None))  # lifespan not run: no engine
        client = TestClient(app)
        for route in ROUTES:
            reply = client.post(route, json=body)
            error_of(reply, status)


def test_one_answer_for_every_path_a_caller_may_not_load(server, places, tmp_path):
    root, outside = places["root"], places["outside"]
    (root / "no-config").mkdir()
    (root / "a-file").write_text("{}")
    (root / "escape").symlink_to(outside, target_is_directory=True)
    sneaky = root / "sneaky"  # a config inside, its weights a symlink to outside
    sneaky.mkdir()
    (sneaky / "adapter_config.json").write_text((outside / "adapter_config.json").read_text())
    (sneaky / "adapter_model.safetensors").symlink_to(outside / "adapter_model.safetensors")
    refused = [
        outside,
        places["sibling"],
        root / "nowhere",
        tmp_path / "nowhere",
        root / "no-config",
        root / "a-file",
        root / "escape",
        sneaky,
        f"{root}/../{outside.parent.name}/adapter",
        "/etc",
        "/proc/self/cwd",
        f"file://{outside}",
        "relative/deeper/nowhere",
        "a\x00b",
    ]
    answers = set()
    for path in refused:
        message = error_of(load(server, "refused", path), 400)
        answers.add(message.replace(repr(str(path)), "PATH"))
    assert len(answers) == 1, answers
    assert "PATH is not an adapter this server can load" in answers.pop()
    assert "refused" not in {card["id"] for card in server.get("/v1/models").json()["data"]}


def test_loads_read_the_real_path_under_the_roots_and_the_module_folders(server, places):
    link = places["root"] / "link-to-good"
    link.symlink_to(places["good"], target_is_directory=True)
    assert load(server, "linked", link).status_code == 200
    assert load(server, "startup-again", places["startup"]).status_code == 200
    cards = {card["id"]: card for card in server.get("/v1/models").json()["data"]}
    assert cards["linked"]["root"] == str(places["good"].resolve())
    assert complete(server, "linked") == complete(server, "startup-again")
    for name in ("linked", "startup-again"):
        assert server.post(ROUTES[1], json={"lora_name": name}).status_code == 200


def rank_two(settings: dict) -> dict:
    return {**settings, "r": 2}


def as_1d(weights: dict) -> dict:
    name = next(n for n in weights if "lora_A" in n)
    return {**weights, name: weights[name].flatten()}


def with_key(old: str, new: str):
    def rename(weights: dict) -> dict:
        return {n.replace(old, new): t for n, t in weights.items()}

    return rename


def one_tensor(change):
    def edit(weights: dict) -> dict:
        name = next(n for n in weights if "lora_B" in n)
        return {**weights, name: change(weights[name])}

    return edit


def drop_b(weights: dict) -> dict:
    return {n: t for n, t in weights.items() if not n.endswith("q_proj.lora_B.weight")}


def nan(tensor: torch.Tensor) -> torch.Tensor:
    return torch.full_like(tensor, float("nan"))


def set_config(**fields):
    return lambda settings: {**settings, **fields}


CONFIG_CASES = {  # name -> (variant arguments, what the 400 must name)
    "understated-rank": ({"config": rank_two}, "of rank 4, but adapter_config.json says r=2"),
    "rank-above-max": ({"config": set_config(r=16)}, "rank 16 is outside"),
    "config-a-list": ({"raw_config": "[1, 2]"}, "must hold a JSON object, not a list"),
    "r-1e400": ({"raw_config": '{"r": 1e400}'}, "r must be a whole number, got inf"),
    "r-a-string": ({"config": set_config(r="4")}, "r must be a whole number"),
    "r-missing": ({"raw_config": '{"peft_type": "LORA"}'}, "has no r"),
    "alpha-a-string": ({"config": set_config(lora_alpha="x")}, "lora_alpha must be a number"),
    "alpha-1e400": ({"raw_config": '{"r": 4, "lora_alpha": 1e400}'}, "scales the delta"),
    "targets-5": ({"config": set_config(target_modules=5)}, "target_modules must be"),
    "targets-numbers": ({"config": set_config(target_modules=[1])}, "target_modules must be"),
    "rslora-a-string": ({"config": set_config(use_rslora="yes")}, "use_rslora must be"),
    "peft-type-5": ({"config": set_config(peft_type=5)}, "peft_type 5 is not LORA"),
    "deep-json": ({"raw_config": "[" * 100_000}, "adapter_config.json is not JSON"),
    "not-utf8": ({"raw_config": b'{"r": "\xff"}'}, "not UTF-8"),
    "tensor-1d": ({"tensors": as_1d}, "a 1-D tensor"),
    "int-tensor": ({"tensors": one_tensor(lambda t: t.to(torch.int32))}, "is I32"),
    "nan-weights": ({"tensors": one_tensor(nan)}, "NaN or infinite"),
    "missing-b": ({"tensors": drop_b}, "lacks"),
    "unknown-tensor": ({"tensors": with_key("q_proj", "x_proj")}, "adapts no supported"),
    "layer-beyond": ({"tensors": with_key("layers.1.", "layers.7.")}, "layer 7 does not"),
}


def broken_files(folder: Path, good: Path) -> dict[str, tuple[Path, str]]:
    """Adapters whose safetensors file is corrupt, truncated, missing or too large."""
    for name in ("garbage", "truncated", "missing", "huge"):
        weights = variant(good, folder / name) / "adapter_model.safetensors"
        if name == "garbage":
            weights.write_bytes(b"\x00" * 64)
        elif name == "truncated":
            weights.write_bytes(weights.read_bytes()[:-100])
        elif name == "missing":
            weights.unlink()
        else:
            with weights.open("r+b") as file:
                file.truncate(1 << 32)  # sparse: no disk used
    whys = {
        "garbage": "not a valid safetensors file",
        "truncated": "not a valid safetensors",
        "missing": "no adapter_model.safetensors",
        "huge": "bytes, more than",
    }
    return {name: (folder / name, why) for name, why in whys.items()}


def test_malformed_adapters_are_400s_naming_the_problem(server, places):
    """Issue 26 C and D: each was a 200 that broke every request, or a 500 with the
    internal message; now a 400 naming the problem, and serving goes on."""
    root, good = places["root"], places["good"]
    cases = {
        name: (variant(good, root / name, **kwargs), why)
        for name, (kwargs, why) in CONFIG_CASES.items()
    }
    cases |= broken_files(root / "files", good)
    wrong = {}
    for name, (path, why) in cases.items():
        reply = load(server, name, path)
        if reply.status_code != 400 or why not in reply.text:
            wrong[name] = f"{reply.status_code} {reply.text[:300]}"
            continue
        error_of(reply, 400)
    assert not wrong, wrong
    served = {card["id"] for card in server.get("/v1/models").json()["data"]}
    assert not served & set(cases)
    assert len(complete(server, "startup")) == 6


def test_bad_lora_modules_at_start_are_one_line_each(tiny_folder, places, tmp_path, caplog):
    """The same checks for --lora-modules: each bad one logged in one line (no
    traceback) and left out; the good one served."""
    config = ModelConfig.from_folder(tiny_folder("llama3"))
    good = places["good"]
    bad = {
        name: variant(good, tmp_path / name, **kwargs) for name, (kwargs, _) in CONFIG_CASES.items()
    }
    modules = [LoRAModulePath(name, str(path)) for name, path in bad.items()]
    modules.append(LoRAModulePath("good", str(good)))
    scheduler = type("Scheduler", (), {"lora_unloads": set()})()
    with caplog.at_level(logging.ERROR):
        startup = EngineAdapters(True, config, 8, scheduler).load_modules(modules)
    assert list(startup.loaded) == ["good"]
    for name, (_, why) in CONFIG_CASES.items():
        assert why in startup.failed[name], (name, startup.failed[name])
    errors = [record for record in caplog.records if record.levelno >= logging.ERROR]
    assert len(errors) == len(bad)
    assert all(r.exc_info is None and "\n" not in r.getMessage() for r in errors)


@pytest.fixture
def hub_cache(monkeypatch, tmp_path, places) -> Path:
    """A hub cache holding the good adapter as org/adapter (HF_HUB_OFFLINE=1)."""
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    seed_snapshot(cache, "org/adapter", places["good"], ("main",))
    return cache


def test_hub_adapters_download_off_both_loops_and_the_engine_reads_the_cache(
    server, hub_cache, monkeypatch
):
    """The engine thread never calls the hub's download; the route's download runs in
    its own thread; the adapter then serves as the same adapter from a local folder."""
    callers: list[str] = []
    download = hub._snapshot_download

    def spy(*args, **kwargs):
        callers.append(threading.current_thread().name)
        return download(*args, **kwargs)

    monkeypatch.setattr(hub, "_snapshot_download", spy)
    assert load(server, "from-hub", "hf://org/adapter").status_code == 200
    assert load(server, "bare-name", "org/adapter").status_code == 200
    assert callers == ["lora-download", "lora-download"], callers
    models = {card["id"]: card for card in server.get("/v1/models").json()["data"]}
    assert models["from-hub"]["root"] == "hf://org/adapter"
    assert models["bare-name"]["root"] == "hf://org/adapter"
    assert complete(server, "from-hub") == complete(server, "startup")
    missing = error_of(load(server, "nope", "hf://org/missing"), 400)
    assert "not in the local Hugging Face cache" in missing and str(hub_cache) not in missing
    for name in ("from-hub", "bare-name"):
        assert server.post(ROUTES[1], json={"lora_name": name}).status_code == 200


def test_a_stuck_download_times_out_bounded_and_serving_goes_on(server, monkeypatch):
    from octavo.entrypoints.openai import adapter_downloads

    release = threading.Event()

    def stuck(hub_model):
        release.wait(30)
        raise ValueError("released")

    monkeypatch.setattr(adapter_source, "fetch_adapter", stuck)
    monkeypatch.setattr(adapter_downloads, "DOWNLOAD_TIMEOUT_S", 1.0)
    try:
        for attempt in range(adapter_downloads.MAX_DOWNLOADS):
            started = time.monotonic()
            message = error_of(load(server, f"slow{attempt}", "hf://org/slow"), 400)
            assert "did not download within 1 s" in message
            assert time.monotonic() - started < 10
            assert len(complete(server, "startup")) == 6  # served while it downloads
        error_of(load(server, "one-more", "hf://org/slow"), 429)
    finally:
        release.set()
    assert "released" in error_of(load_when_free(server, "after", "hf://org/slow"), 400)


def load_when_free(http: httpx.Client, name: str, path: str) -> httpx.Response:
    """Load once the stuck downloads have ended (429 until then)."""
    deadline = time.monotonic() + 10
    reply = load(http, name, path)
    while reply.status_code == 429 and time.monotonic() < deadline:
        time.sleep(0.1)
        reply = load(http, name, path)
    return reply


def test_hf_allowed_roots_limit_hub_adapters_to_their_organisations(tmp_path):
    from octavo.lora.allowed_roots import AllowedRoots

    limited = AllowedRoots.of([str(tmp_path), "hf://myorg/", "hf://other/one"], [])
    assert limited.folders == (tmp_path.resolve(),)
    for allowed in ("myorg/a", "myorg/b", "other/one"):
        limited.check_hub(hub.HubModel(allowed), f"hf://{allowed}")
    for refused in ("myorganisation/a", "other/two", "evil/myorg"):
        with pytest.raises(ValueError, match="is not an adapter this server can load"):
            limited.check_hub(hub.HubModel(refused), f"hf://{refused}")
    AllowedRoots.of([str(tmp_path)], []).check_hub(hub.HubModel("any/one"), "hf://any/one")
