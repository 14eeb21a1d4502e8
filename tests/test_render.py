"""The render endpoints (``/v1/completions/render``, ``/v1/chat/completions/render``) and
the render-only server (``octavo launch render``) an endpoint picker's token producer
calls: the token ids are those the engine runs for the same request (recorded at the
engine's ``add_request``) and those the tokenizer and chat template give directly; the
answer has vLLM's shape (a list for completions, an object for chat, ``token_ids`` in
each); bad requests are OpenAI-style 400/404 JSON; the render-only server, started as
the real command on a model folder without its weights file, answers exactly as the
full server does.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from octavo.entrypoints.openai.context import ServerConfig

from conftest import wait_healthy
from server_harness import ThreadedServer, build_local_app, torch_threads

MODEL = "tiny"
MAX_MODEL_LEN = 256
MAX_SEQUENCES = 8  # --max-sequences-per-request: prompts × n of one request
# A template that shows tools and a template kwarg, so both reach the rendered text.
TEMPLATE = (
    "{% if greeting %}{{ greeting }}\n{% endif %}"
    "{% if tools %}<tools>{{ tools | tojson }}</tools>\n{% endif %}"
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
DEFAULT_KWARGS = {"greeting": "Welcome"}
MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Name three colours."},
]
TOOL = {
    "type": "function",
    "function": {
        "name": "paint",
        "description": "Paint a wall.",
        "parameters": {"type": "object", "properties": {"colour": {"type": "string"}}},
    },
}
COMPLETION_BODIES = [
    {"prompt": "Hello there, general"},
    {"prompt": ["The sky is", "Roses are red,"], "max_tokens": 5},
    {"prompt": [[5, 6, 7, 8], [9, 10]], "n": 2, "temperature": 0.5},
]
CHAT_BODIES = [
    {"messages": MESSAGES},
    {"messages": MESSAGES, "chat_template_kwargs": {"greeting": "Hi!"}},
    {
        "messages": [*MESSAGES, {"role": "assistant", "content": "Red,"}],
        "add_generation_prompt": False,
        "continue_final_message": True,
    },
    {"messages": MESSAGES, "tools": [TOOL], "tool_choice": "required"},
]


class PromptRecorder:
    """``on_engine`` hook: records the prompt token ids of every request the engine adds."""

    def __init__(self) -> None:
        self.prompts: list[list[int]] = []

    def attach(self, engine: Any) -> None:
        add_request = engine.add_request

        def recording_add(request_id, prompt, params, arrival_time=None, **adapter):
            self.prompts.append(list(prompt))
            return add_request(request_id, prompt, params, arrival_time, **adapter)

        engine.add_request = recording_add


def server_config() -> ServerConfig:
    return ServerConfig(
        served_model_names=[MODEL],
        model_root=MODEL,
        chat_template=TEMPLATE,
        default_chat_template_kwargs=DEFAULT_KWARGS,
        max_sequences_per_request=MAX_SEQUENCES,
    )


@pytest.fixture(scope="module")
def full(tiny_folder) -> Iterator[tuple[httpx.Client, PromptRecorder]]:
    """The full server (engine and all) of the tiny model; its engine's prompts recorded."""
    recorder = PromptRecorder()
    app = build_local_app(
        str(tiny_folder("llama3")),
        server_config(),
        recorder.attach,
        max_model_len=MAX_MODEL_LEN,
        kv_cache_memory=8 << 20,
    )
    with torch_threads(1), ThreadedServer(app) as server:
        server.wait_ready()
        with httpx.Client(base_url=server.url, timeout=60) as http:
            yield http, recorder


@pytest.fixture(scope="module")
def weightless_folder(tiny_folder, tmp_path_factory) -> Path:
    """The tiny model's folder without its weights: config.json and the tokenizer only."""
    folder = tmp_path_factory.mktemp("weightless") / "tiny"
    shutil.copytree(tiny_folder("llama3"), folder)
    for weights in folder.glob("*.safetensors"):
        weights.unlink()
    return folder


@pytest.fixture(scope="module")
def render_only(weightless_folder, tmp_path_factory) -> Iterator[httpx.Client]:
    """``octavo launch render`` as a real process, with the full server's flags."""
    from octavo_bench.serve_launch import free_port

    template = tmp_path_factory.mktemp("template") / "chat.jinja"
    template.write_text(TEMPLATE)
    port = free_port()
    flags = {
        "--host": "127.0.0.1",
        "--port": str(port),
        "--served-model-name": MODEL,
        "--max-model-len": str(MAX_MODEL_LEN),
        "--chat-template": str(template),
        "--default-chat-template-kwargs": json.dumps(DEFAULT_KWARGS),
        "--max-sequences-per-request": str(MAX_SEQUENCES),
    }
    command = [sys.executable, "-m", "octavo.cli", "launch", "render", str(weightless_folder)]
    command += [word for flag in flags.items() for word in flag]
    log = tmp_path_factory.mktemp("render-log") / "render.log"
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        started = time.monotonic()
        wait_healthy(process, url, 120, log)
        print(f"octavo launch render: /health 200 after {time.monotonic() - started:.1f} s")
        with httpx.Client(base_url=url, timeout=60) as http:
            yield http
    finally:
        process.terminate()
        process.wait(timeout=30)


def render(http: httpx.Client, kind: str, body: dict[str, Any]) -> httpx.Response:
    path = "/v1/completions/render" if kind == "completions" else "/v1/chat/completions/render"
    return http.post(path, json={"model": MODEL, **body})


def tokenizer_of(folder: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)


@pytest.mark.parametrize("body", COMPLETION_BODIES)
def test_completion_render_is_what_the_engine_runs(full, tiny_folder, body):
    http, recorder = full
    reply = render(http, "completions", body)
    assert reply.status_code == 200, reply.text
    rendered = [item["token_ids"] for item in reply.json()]
    recorder.prompts.clear()
    done = http.post("/v1/completions", json={"model": MODEL, "max_tokens": 1, **body})
    assert done.status_code == 200, done.text
    assert recorder.prompts == rendered
    assert done.json()["usage"]["prompt_tokens"] == sum(len(ids) for ids in rendered)
    tokenizer = tokenizer_of(tiny_folder("llama3"))
    prompts = body["prompt"] if isinstance(body["prompt"], list) else [body["prompt"]]
    direct = [p if isinstance(p, list) else tokenizer(p)["input_ids"] for p in prompts]
    assert rendered == direct


@pytest.mark.parametrize("body", CHAT_BODIES[:3])
def test_chat_render_is_what_the_engine_runs(full, body):
    http, recorder = full
    reply = render(http, "chat", body)
    assert reply.status_code == 200, reply.text
    recorder.prompts.clear()
    done = http.post("/v1/chat/completions", json={"model": MODEL, "max_tokens": 1, **body})
    assert done.status_code == 200, done.text
    assert recorder.prompts == [reply.json()["token_ids"]]
    assert done.json()["usage"]["prompt_tokens"] == len(reply.json()["token_ids"])


@pytest.mark.parametrize("body", CHAT_BODIES)
def test_chat_render_is_the_template_applied_directly(full, tiny_folder, body):
    http, _ = full
    reply = render(http, "chat", body)
    assert reply.status_code == 200, reply.text
    tokenizer = tokenizer_of(tiny_folder("llama3"))
    direct = tokenizer.apply_chat_template(
        body["messages"],
        tools=body.get("tools"),
        chat_template=TEMPLATE,
        add_generation_prompt=body.get("add_generation_prompt", True),
        continue_final_message=body.get("continue_final_message", False),
        tokenize=True,
        return_dict=False,
        **{**DEFAULT_KWARGS, **body.get("chat_template_kwargs", {})},
    )
    assert reply.json()["token_ids"] == list(direct)


def test_the_answers_have_vllms_shape(full):
    http, _ = full
    headers = {"X-Request-Id": "trace-7"}
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 3, "stream": True}
    chat = http.post("/v1/chat/completions/render", json=body, headers=headers).json()
    assert set(chat) == {
        "request_id",
        "token_ids",
        "features",
        "sampling_params",
        "model",
        "stream",
        "stream_options",
        "cache_salt",
        "priority",
        "kv_transfer_params",
    }
    assert chat["request_id"].startswith("chatcmpl-trace-7")
    assert (chat["model"], chat["stream"], chat["features"]) == (MODEL, True, None)
    params = chat["sampling_params"]
    assert (params["max_tokens"], params["n"], params["structured_outputs"]) == (3, 1, None)
    completions = render(http, "completions", {"prompt": ["a", "b"], "max_tokens": 2}).json()
    assert isinstance(completions, list) and len(completions) == 2
    assert all(item["sampling_params"]["max_tokens"] == 2 for item in completions)
    assert completions[0]["request_id"] != completions[1]["request_id"]
    required = render(http, "chat", CHAT_BODIES[3]).json()["sampling_params"]
    assert set(required["structured_outputs"]) == {"json"}, "tool_choice required constrains"


BAD_REQUESTS = [
    ("completions", {"prompt": 5}, 400, "prompt"),
    ("completions", {"prompt": "x", "max_tokens": MAX_MODEL_LEN + 1}, 400, "max_tokens"),
    ("completions", {"prompt": [[1, 2], [10**9]]}, 400, "prompt"),
    ("completions", {"prompt": "x", "unknown_field": 1}, 400, "unknown_field"),
    ("chat", {"messages": []}, 400, "messages"),
    ("chat", {"messages": MESSAGES, "chat_template_kwargs": {"tools": 1}}, 400, None),
    ("chat", {"messages": MESSAGES, "tools": [TOOL], "tool_choice": "auto"}, 400, None),
    ("chat", {"messages": MESSAGES, "model": "nope"}, 404, "model"),
    ("completions", {"prompt": "x", "model": "nope"}, 404, "model"),
    # The per-request limits of /v1/completions and /v1/chat/completions hold for renders.
    ("completions", {"prompt": ["x"] * (MAX_SEQUENCES + 1)}, 400, "prompt"),
    ("completions", {"prompt": [[1], [2], [3]], "n": 3}, 400, "prompt"),
    ("chat", {"messages": MESSAGES, "n": MAX_SEQUENCES + 1}, 400, "n"),
]


@pytest.mark.parametrize(("kind", "body", "status", "param"), BAD_REQUESTS)
def test_bad_requests_are_openai_errors(full, kind, body, status, param):
    http, _ = full
    reply = render(http, kind, body)
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert error["message"] and error["type"] == "invalid_request_error"
    if param is not None:
        assert param in (error["param"] or "")


def test_a_flood_of_prompts_is_refused_before_it_is_tokenized(full):
    """1.5 million prompts once took 50 s and a 957 MB answer: now a 400 at once."""
    http, _ = full
    started = time.monotonic()
    reply = render(http, "completions", {"prompt": ["Hello"] * 200_000})
    assert reply.status_code == 400, reply.text[:200]
    assert "--max-sequences-per-request" in reply.json()["error"]["message"]
    assert time.monotonic() - started < 5, "the count is checked before tokenizing"


def test_a_body_that_is_not_json_is_a_400(full):
    http, _ = full
    reply = http.post(
        "/v1/completions/render", content=b"{not json", headers={"Content-Type": "application/json"}
    )
    assert reply.status_code == 400 and "error" in reply.json()


def test_the_render_only_server_answers_as_the_full_server(full, render_only):
    http, _ = full
    bodies = [("completions", b) for b in COMPLETION_BODIES] + [("chat", b) for b in CHAT_BODIES]
    for kind, body in bodies:
        mine, theirs = render(render_only, kind, body), render(http, kind, body)
        assert mine.status_code == theirs.status_code == 200, (mine.text, theirs.text)
        assert _without_ids(mine.json()) == _without_ids(theirs.json()), body
    for kind, body, status, _ in BAD_REQUESTS:
        mine, theirs = render(render_only, kind, body), render(http, kind, body)
        assert mine.status_code == theirs.status_code == status
        assert mine.json() == theirs.json()


def _without_ids(answer: Any) -> Any:
    if isinstance(answer, list):
        return [_without_ids(item) for item in answer]
    return {key: value for key, value in answer.items() if key != "request_id"}


def test_the_render_only_server_serves_no_model(render_only, weightless_folder):
    assert not list(weightless_folder.glob("*.safetensors")), "it runs without weights"
    assert render_only.get("/health").status_code == 200
    models = render_only.get("/v1/models").json()["data"]
    assert [card["id"] for card in models] == [MODEL]
    assert models[0]["max_model_len"] == MAX_MODEL_LEN
    generate = render_only.post("/v1/completions", json={"model": MODEL, "prompt": "x"})
    assert generate.status_code == 404 and "error" in generate.json()
    tokens = render_only.post("/tokenize", json={"model": MODEL, "prompt": "Hello there"})
    assert (
        tokens.json()["tokens"]
        == render(render_only, "completions", {"prompt": "Hello there"}).json()[0]["token_ids"]
    )
