"""The official `openai` client against the embedded SmolLM2 on a real uvicorn server."""

from __future__ import annotations

import openai
import pytest

from octavo.entrypoints.openai.context import ServerConfig
from octavo.entrypoints.openai.testing import ThreadedServer, build_local_app

pytestmark = pytest.mark.slow  # loads the embedded SmolLM2

MODEL = "SmolLM2-135M-Instruct"
QUESTION = [{"role": "user", "content": "What is 2+2?"}]


@pytest.fixture(scope="module")
def client(smol_folder):
    config = ServerConfig(served_model_names=[MODEL], model_root=MODEL)
    app = build_local_app(str(smol_folder), config, max_model_len=512, kv_cache_memory=32 << 20)
    with ThreadedServer(app, startup_timeout=120) as server:
        server.wait_ready()
        yield openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", timeout=120)


def test_chat_completion_streaming_and_not(client):
    full = client.chat.completions.create(
        model=MODEL, messages=QUESTION, max_tokens=12, temperature=0
    )
    answer = full.choices[0].message.content
    assert full.choices[0].message.role == "assistant"
    assert "4" in answer
    assert full.usage.completion_tokens <= 12
    assert full.usage.total_tokens == full.usage.prompt_tokens + full.usage.completion_tokens
    stream = client.chat.completions.create(
        model=MODEL,
        messages=QUESTION,
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == answer
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens


def test_client_sees_openai_errors(client):
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4o", messages=QUESTION, max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="tools"):
        client.chat.completions.create(
            model=MODEL,
            messages=QUESTION,
            tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}],
        )
    models = client.models.list()
    assert [model.id for model in models.data] == [MODEL]
