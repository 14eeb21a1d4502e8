"""Image URLs beyond ``data:``: http(s) from ``--allowed-media-domains``, ``file://`` under
``--allowed-local-media-path``, and the Responses API's ``input_image``.

One tiny LLaVA (``test_vision_llava.build_llava``) is served once for the module, beside a
loopback HTTP server (``media_server.py``) with an image, a slow endpoint, huge bodies and
redirects. An image fetched by URL (or read from a file) must answer exactly as the same
bytes sent as a ``data:`` URL (which ``test_vision_llava`` holds to HF); every refused URL
is a 400 naming the problem; ``LLM.chat`` takes the same URLs under the same engine args.
"""

from __future__ import annotations

import io
from pathlib import Path

import httpx
import pytest

from media_server import MediaServer
from octavo.entrypoints.llm import LLM
from octavo.multimodal.media_limits import MAX_BYTES_ENV, TIMEOUT_ENV
from test_vision_llava import IMAGES, build_llava
from vision_testing import GREEDY, NEW_TOKENS, SMALL_KV, data_url

FETCH_TIMEOUT = 2.0  # seconds: room for a loaded CI machine (the slow endpoint takes 6)
MAX_BYTES = 64 * 1024  # the test image is a few KiB; the huge bodies are 1 MiB
QUESTION = "What is in this picture?"


def png_bytes() -> bytes:
    buffer = io.BytesIO()
    IMAGES[0].save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def media_dir(tmp_path_factory) -> Path:
    """``allowed/`` holds the image, a link to it, and a link escaping to ``secret/``."""
    root = tmp_path_factory.mktemp("media")
    allowed, secret = root / "allowed", root / "secret"
    (allowed / "sub").mkdir(parents=True)
    secret.mkdir()
    (allowed / "cat.png").write_bytes(png_bytes())
    (secret / "cat.png").write_bytes(png_bytes())
    (allowed / "inside.png").symlink_to(allowed / "cat.png")
    (allowed / "escape.png").symlink_to(secret / "cat.png")
    return allowed


@pytest.fixture(scope="module")
def media():
    with MediaServer(png_bytes()) as server:
        yield server


@pytest.fixture(scope="module")
def fetch_env():
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(TIMEOUT_ENV, str(FETCH_TIMEOUT))
        patch.setenv(MAX_BYTES_ENV, str(MAX_BYTES))
        yield


@pytest.fixture(scope="module")
def engine_args(media_dir, fetch_env) -> dict:
    return {
        "dtype": "float32",
        "max_model_len": 256,
        "kv_cache_memory": SMALL_KV,
        "allowed_media_domains": ["127.0.0.1"],
        "allowed_local_media_path": str(media_dir),
    }


@pytest.fixture(scope="module")
def llava_folder(tmp_path_factory, smol_folder) -> Path:
    return build_llava(tmp_path_factory.mktemp("llava"), smol_folder)


@pytest.fixture(scope="module")
def llava_url(llava_folder, engine_args):
    from octavo.entrypoints.openai.context import ServerConfig

    from server_harness import ThreadedServer, build_local_app, torch_threads

    config = ServerConfig(served_model_names=["llava"], model_root="llava")
    app = build_local_app(str(llava_folder), config, None, **engine_args)
    with torch_threads(1), ThreadedServer(app) as server:
        yield server.wait_ready().url


def user_turn(url: str) -> list[dict]:
    image = {"type": "image_url", "image_url": {"url": url}}
    return [{"role": "user", "content": [image, {"type": "text", "text": QUESTION}]}]


def post_chat(server: str, url: str, model: str = "llava") -> httpx.Response:
    body = {"model": model, "messages": user_turn(url), "max_tokens": NEW_TOKENS}
    return httpx.post(f"{server}/v1/chat/completions", json={**body, "temperature": 0}, timeout=60)


def post_response(server: str, image: dict, model: str = "llava") -> httpx.Response:
    content = [{"type": "input_image", **image}, {"type": "input_text", "text": QUESTION}]
    body = {"model": model, "input": [{"role": "user", "content": content}], "temperature": 0}
    body["max_output_tokens"] = NEW_TOKENS
    return httpx.post(f"{server}/v1/responses", json=body, timeout=60)


def chat_answer(response: httpx.Response) -> tuple[str, int]:
    assert response.status_code == 200, response.text
    body = response.json()
    return body["choices"][0]["message"]["content"], body["usage"]["prompt_tokens"]


def response_answer(response: httpx.Response) -> tuple[str, int]:
    assert response.status_code == 200, response.text
    body = response.json()
    messages = [item for item in body["output"] if item["type"] == "message"]
    text = "".join(part["text"] for item in messages for part in item["content"])
    return text, body["usage"]["input_tokens"]


def test_fetched_and_local_images_answer_as_the_same_bytes_inline(llava_url, media, media_dir):
    expected = chat_answer(post_chat(llava_url, data_url(IMAGES[0])))
    urls = [
        media.url("/cat.png"),
        media.url("/redirect-in"),  # a redirect within the allowed host is followed
        f"file://{media_dir}/cat.png",
        f"file://{media_dir}/sub/../inside.png",  # .. and a link, both staying inside
    ]
    for url in urls:
        assert chat_answer(post_chat(llava_url, url)) == expected, url
    assert media.credentials_seen == []  # the redirect's cookie was not sent back


REFUSED = [  # (URL, with {http} the media server and {dir} the allowed folder; words)
    ("{http}/cat.png", "'localhost' is not in --allowed-media-domains"),
    ("{ip}/redirect-out", "'localhost' is not in --allowed-media-domains"),
    ("{ip}/slow.png", f"timed out after {FETCH_TIMEOUT:g} s"),
    ("{ip}/huge.png", f"larger than {MAX_BYTES} bytes"),
    ("{ip}/huge-declared.png", f"larger than {MAX_BYTES} bytes"),
    ("{ip}/missing", "answered HTTP 404"),
    ("http://127.0.0.1:1/cat.png", "fetching it from 127.0.0.1 failed"),
    ("http://user:pw@127.0.0.1/cat.png", "may not carry credentials"),
    ("ftp://127.0.0.1/cat.png", "got ftp:"),
    ("file:///etc/hostname", "is outside --allowed-local-media-path"),
    ("file://{dir}/../secret/cat.png", "is outside --allowed-local-media-path"),
    ("file://{dir}/escape.png", "is outside --allowed-local-media-path"),
    ("file://{dir}/absent.png", "is not an existing file"),
    ("file://otherhost/{dir}/cat.png", "names a file on this machine"),
]


def refused_url(template: str, media: MediaServer, media_dir: Path) -> str:
    http, ip = media.url("", "localhost"), media.url("")
    return template.format(http=http, ip=ip, dir=media_dir)


@pytest.mark.parametrize(("template", "words"), REFUSED)
def test_refused_urls_are_400s_naming_the_problem(llava_url, media, media_dir, template, words):
    response = post_chat(llava_url, refused_url(template, media, media_dir))
    assert response.status_code == 400, response.text
    assert words in response.json()["error"]["message"]


def test_responses_input_image_answers_as_chat(llava_url, media):
    expected = chat_answer(post_chat(llava_url, data_url(IMAGES[0])))
    inline = {"image_url": data_url(IMAGES[0]), "detail": "auto"}
    assert response_answer(post_response(llava_url, inline)) == expected
    fetched = {"image_url": media.url("/cat.png")}
    assert response_answer(post_response(llava_url, fetched)) == expected
    refused = post_response(llava_url, {"image_url": media.url("/cat.png", "localhost")})
    assert refused.status_code == 400, refused.text
    assert "'localhost' is not in --allowed-media-domains" in refused.json()["error"]["message"]
    no_url = post_response(llava_url, {"file_id": "file-1"})
    assert no_url.status_code == 400, no_url.text
    assert "file_id images are not supported" in no_url.json()["error"]["message"]


def test_offline_chat_takes_the_same_urls_under_the_same_engine_args(
    llava_folder, engine_args, media, media_dir
):
    urls = [data_url(IMAGES[0]), media.url("/cat.png"), f"file://{media_dir}/cat.png"]
    with LLM(str(llava_folder), **engine_args) as llm:
        outputs = llm.chat([user_turn(url) for url in urls], GREEDY, use_tqdm=False)
        assert len({tuple(output.outputs[0].token_ids) for output in outputs}) == 1
        with pytest.raises(ValueError, match="'localhost' is not in --allowed-media-domains"):
            llm.chat(user_turn(media.url("/cat.png", "localhost")), GREEDY, use_tqdm=False)
        with pytest.raises(ValueError, match="is outside --allowed-local-media-path"):
            llm.chat(user_turn(f"file://{media_dir}/escape.png"), GREEDY, use_tqdm=False)
        assert not llm.engine.has_unfinished_requests()


def test_a_text_only_model_refuses_input_image_as_chat_does(tiny_folder):
    from conftest import tiny_server

    with tiny_server(tiny_folder, "tiny") as server:
        chat = post_chat(server.url, data_url(IMAGES[0]), model="tiny")
        response = post_response(server.url, {"image_url": data_url(IMAGES[0])}, model="tiny")
    assert chat.status_code == response.status_code == 400, (chat.text, response.text)
    message = chat.json()["error"]["message"]
    assert "text-only" in message
    assert response.json()["error"]["message"] == message


def test_by_default_only_data_urls_are_taken(tmp_path, monkeypatch):
    from octavo.config import EngineArgs
    from octavo.multimodal.media_fetch import MediaConnector

    default = MediaConnector()
    with pytest.raises(ValueError, match="none are set: only data: URLs are accepted"):
        default.load("https://example.com/cat.png")
    with pytest.raises(ValueError, match="--allowed-local-media-path, which is not set"):
        default.load(f"file://{tmp_path}/cat.png")
    assert default.load("data:image/png;base64,AAAA") == "data:image/png;base64,AAAA"
    with pytest.raises(ValueError, match="got a bare path"):
        default.load("/etc/hostname")
    connector = MediaConnector.from_settings("A.example.com, b.example.com", None)
    assert connector.allowed_domains == {"a.example.com", "b.example.com"}
    with pytest.raises(ValueError, match="is not a folder"):
        EngineArgs(allowed_local_media_path=str(tmp_path / "absent"))
    monkeypatch.setenv(TIMEOUT_ENV, "soon")
    with pytest.raises(ValueError, match=f"{TIMEOUT_ENV} must be a number of seconds"):
        MediaConnector.from_settings(None, None)
