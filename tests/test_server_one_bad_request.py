"""Regression: the request that used to kill the engine for everyone is now a 400.

`{"prompt": "Hi", "max_tokens": 5, "min_tokens": 2, "stop_token_ids": [49152]}` names a
token id past the vocabulary. It used to raise inside the engine step, after which every
request got 503 and /health stayed 503. Now it is refused at admission, on completions
and chat, streaming or not, and the server keeps answering.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from conftest import running_tiny_server

MODEL = "tiny"
VOCAB = 49152  # the tiny model uses SmolLM2's tokenizer
BAD = {"max_tokens": 5, "min_tokens": 2, "stop_token_ids": [VOCAB]}


@pytest.fixture(scope="module")
def url(tiny_folder) -> Iterator[str]:
    with running_tiny_server(tiny_folder, MODEL) as server_url:
        yield server_url


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("route", ["completions", "chat"])
def test_a_stop_token_past_the_vocabulary_is_a_400_and_the_server_lives(url, route, stream):
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError, match=r"stop_token_ids must be in \[0, 49152\)"):
        send(client, route, stream, extra_body=BAD)
    assert httpx.get(f"{url}/health", timeout=5).status_code == 200
    text = send(client, route, stream=False, max_tokens=4, temperature=0)
    assert isinstance(text, str)


def send(client: openai.OpenAI, route: str, stream: bool, **kwargs) -> str:
    if route == "completions":
        result = client.completions.create(model=MODEL, prompt="Hi", stream=stream, **kwargs)
        return "".join(c.choices[0].text for c in result) if stream else result.choices[0].text
    messages = [{"role": "user", "content": "Hi"}]
    result = client.chat.completions.create(model=MODEL, messages=messages, stream=stream, **kwargs)
    if stream:
        return "".join(c.choices[0].delta.content or "" for c in result if c.choices)
    return result.choices[0].message.content
