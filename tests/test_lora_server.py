"""LoRA adapters through the real server: ``--lora-modules`` at start, ``model`` picks
the adapter (output token-identical to HF transformers + PEFT), ``/v1/models`` lists
adapters under their base, load/unload at run time (``--allow-runtime-lora-updating``,
adapters under ``--lora-allowed-roots``) behind the API key, bad adapters
refused with a 4xx naming why while everything else keeps serving, the metric
``vllm:lora_requests_info``; the flags' and environment's spelling; removal drops an
adapter's weights from the workers once no request uses it."""

from __future__ import annotations

import argparse

import httpx
import pytest

from octavo import LLM, LoRARequest, SamplingParams
from octavo.config import EngineArgs
from octavo.entrypoints.openai import options
from octavo.entrypoints.openai.context import ServerConfig
from octavo.lora_request import LoRAModulePath, parse_lora_module

from conftest import assert_all_blocks_free, hf_greedy
from lora_adapters import hf_with_adapter, lora_test_app, make_adapter
from server_harness import ThreadedServer, metric_value, torch_threads

KEY = "sesame"
PROMPT = [(j * 11) % 900 + 5 for j in range(12)]


@pytest.fixture(scope="module")
def lora_root(tmp_path_factory):
    """The folder run-time loads may read (--lora-allowed-roots)."""
    return tmp_path_factory.mktemp("lora-root")


@pytest.fixture(scope="module")
def llama_adapters(tiny_folder, lora_root):
    """Three adapters of the tiny Llama-3: all modules, attention only, MLP only."""
    base = tiny_folder("llama3")
    targets = [None, ["q_proj", "v_proj"], ["gate_proj", "down_proj"]]
    return [
        make_adapter(
            base, lora_root / f"llama-lora{i}", seed=10 + i, rank=4 * (i + 1), targets=targets[i]
        )
        for i in range(3)
    ]


@pytest.fixture(scope="module")
def expected(tiny_folder, llama_adapters):
    base = tiny_folder("llama3")
    models = [hf_with_adapter(base, None), *(hf_with_adapter(base, a) for a in llama_adapters)]
    return [hf_greedy(model, PROMPT, 8) for model in models]


@pytest.fixture(scope="module")
def server(tiny_folder, llama_adapters, lora_root, tmp_path_factory):
    config = ServerConfig(
        served_model_names=["tiny"],
        model_root="tiny",
        api_key=KEY,
        allow_runtime_lora_updating=True,
        lora_allowed_roots=[str(lora_root)],
    )
    modules = [
        LoRAModulePath("first", str(llama_adapters[0])),
        LoRAModulePath("missing", str(tmp_path_factory.mktemp("empty"))),
    ]
    app = lora_test_app(tiny_folder("llama3"), config, modules)
    with torch_threads(1), ThreadedServer(app) as running:
        running.wait_ready()
        headers = {"Authorization": f"Bearer {KEY}"}
        with httpx.Client(base_url=running.url, timeout=60, headers=headers) as http:
            yield http


def complete(http: httpx.Client, model: str) -> httpx.Response:
    body = {
        "model": model,
        "prompt": PROMPT,
        "max_tokens": 8,
        "temperature": 0,
        "ignore_eos": True,
        "logprobs": 0,
    }
    return http.post("/v1/completions", json=body)


def tokens_of(reply: httpx.Response) -> list[str]:
    assert reply.status_code == 200, reply.text
    return reply.json()["choices"][0]["logprobs"]["tokens"]


def token_texts(tiny_folder, ids: list[int]) -> list[str]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_folder("llama3"))
    return [tokenizer.decode([token]) for token in ids]


def test_startup_adapters_are_listed_under_the_base_and_bad_ones_left_out(server):
    cards = {card["id"]: card for card in server.get("/v1/models").json()["data"]}
    assert set(cards) == {"tiny", "first"}, "the adapter that failed to load is not served"
    assert cards["first"]["parent"] == "tiny" and cards["tiny"]["parent"] is None


def test_the_model_field_picks_the_adapter_token_identical_to_hf_peft(
    server, tiny_folder, expected
):
    base, first = complete(server, "tiny"), complete(server, "first")
    assert tokens_of(base) == token_texts(tiny_folder, expected[0])
    assert tokens_of(first) == token_texts(tiny_folder, expected[1])
    assert first.json()["model"] == "first" and base.json()["model"] == "tiny"
    chat = server.post(
        "/v1/chat/completions",
        json={
            "model": "first",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 2,
        },
    )
    assert chat.status_code == 200 and chat.json()["model"] == "first"


def load(http: httpx.Client, name: str, path) -> httpx.Response:
    return http.post("/v1/load_lora_adapter", json={"lora_name": name, "lora_path": str(path)})


def test_load_and_unload_at_run_time(server, tiny_folder, llama_adapters, expected):
    reply = load(server, "second", llama_adapters[1])
    assert reply.status_code == 200 and "added" in reply.text
    assert tokens_of(complete(server, "second")) == token_texts(tiny_folder, expected[2])
    again = load(server, "second", llama_adapters[2])
    assert again.status_code == 400 and "already been loaded" in again.json()["error"]["message"]
    gone = server.post("/v1/unload_lora_adapter", json={"lora_name": "second"})
    assert gone.status_code == 200 and "removed" in gone.text
    missing = complete(server, "second")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    twice = server.post("/v1/unload_lora_adapter", json={"lora_name": "second"})
    assert twice.status_code == 404
    assert "second" not in {c["id"] for c in server.get("/v1/models").json()["data"]}
    back = load(server, "second", llama_adapters[1])
    assert back.status_code == 200
    assert tokens_of(complete(server, "second")) == token_texts(tiny_folder, expected[2])


def test_bad_adapters_get_a_4xx_naming_why_and_serving_goes_on(
    server, tiny_folder, lora_root, expected
):
    too_big = make_adapter(tiny_folder("llama3"), lora_root / "big", seed=3, rank=16)
    other_base = make_adapter(tiny_folder("qwen2"), lora_root / "qwen", seed=4, rank=4)
    broken = lora_root / "broken"
    broken.mkdir()
    (broken / "adapter_config.json").write_text("{not json")
    nowhere = str(lora_root / "nowhere")
    cases = {
        nowhere: "is not an adapter this server can load",
        str(too_big): "rank 16",
        str(other_base): "another base model",
        str(broken): "not JSON",
    }
    for path, why in cases.items():
        reply = load(server, "bad", path)
        assert reply.status_code == 400, reply.text
        assert why in reply.json()["error"]["message"], reply.text
    empty = load(server, "", "x")
    assert empty.status_code == 400
    assert tokens_of(complete(server, "first")) == token_texts(tiny_folder, expected[1])


def test_the_api_key_guards_loading(server, llama_adapters):
    body = {"lora_name": "sneaky", "lora_path": str(llama_adapters[2])}
    for route in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
        reply = httpx.post(str(server.base_url) + route, json=body, timeout=30)
        assert reply.status_code == 401
    assert "sneaky" not in {c["id"] for c in server.get("/v1/models").json()["data"]}


def test_lora_requests_info_metric(server):
    complete(server, "first")
    text = server.get("/metrics").text
    assert (
        metric_value(
            text,
            "vllm:lora_requests_info",
            max_lora="2",
            waiting_lora_adapters="",
            running_lora_adapters="",
        )
        > 0
    )


def test_removed_adapters_leave_the_workers_once_unused(tiny_folder, llama_adapters):
    llm = LLM(
        str(tiny_folder("llama3")),
        dtype="float32",
        max_model_len=128,
        enable_lora=True,
        max_loras=2,
        max_lora_rank=8,
    )
    engine, params = llm.engine, SamplingParams(max_tokens=4, temperature=0)
    adapter = LoRARequest("a", 7, str(llama_adapters[0]))
    engine.add_request("busy", PROMPT, params, lora_request=adapter)
    engine.step()
    slots = engine.executor.worker.adapters
    assert 7 in slots.slots and engine.remove_lora(7) and not engine.remove_lora(7)
    engine.step()
    assert 7 in slots.slots, "a running request still uses it"
    while engine.has_unfinished_requests():
        engine.step()
    llm.generate([PROMPT], params, use_tqdm=False)
    assert 7 not in slots.slots and 7 not in slots.cpu and engine.list_loras() == set()
    assert_all_blocks_free(engine)


def parse_serve(argv: list[str], environ: dict[str, str]) -> EngineArgs:
    parser = argparse.ArgumentParser()
    options.add_options(parser, environ)
    args = parser.parse_args(argv)
    options.finish(args)
    return EngineArgs(**{o.dest: getattr(args, o.dest) for o in options.ENGINE_OPTIONS})


def test_lora_modules_flag_environment_and_json_spellings():
    from_flags = parse_serve(["--lora-modules", "a=/x", '{"name": "b", "path": "hf://o/n"}'], {})
    assert from_flags.lora_modules == [LoRAModulePath("a", "/x"), LoRAModulePath("b", "hf://o/n")]
    assert from_flags.enable_lora, "--lora-modules implies --enable-lora"
    from_env = parse_serve([], {"OCTAVO_LORA_MODULES": "a=/x, b=/y"})
    assert [m.name for m in from_env.lora_modules] == ["a", "b"]
    for bad, why in (
        ("noequals", "expected NAME=PATH"),
        ("=path", "expected NAME=PATH"),
        ('{"name": "x"}', "expected NAME=PATH"),
        ("{oops", "not JSON"),
    ):
        with pytest.raises(ValueError, match=why):
            parse_lora_module(bad)
    with pytest.raises(ValueError, match="names repeat"):
        EngineArgs(lora_modules=["a=/x", "a=/y"])
